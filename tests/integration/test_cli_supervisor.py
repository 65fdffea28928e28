"""cloudtrain/cli/supervisor.py: `cloudtrain supervisor status|start|stop` through the CLI."""

from __future__ import annotations


def test_U35_start_with_nothing_to_watch_says_nothing_needs_it(cli):
    """U35: `supervisor start` with no recovering job printed `supervisor: NOT running (any
    cloudtrain command restarts it ...)`, as if something were wrong, with rc 0. It says
    that no job needs it (and starts nothing)."""
    proc = cli.ok("supervisor", "start")
    assert proc.stdout.strip() == "supervisor: not running (no recovering spot job needs it)"
    assert cli.ok("supervisor", "status").stdout.strip() == proc.stdout.strip()
