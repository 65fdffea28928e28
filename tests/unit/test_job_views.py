"""cloudtrain/job_views.py: what the commands about jobs print."""

from __future__ import annotations

from cloudtrain import job_views


def test_u35_supervisor_not_running_is_alarming_only_when_a_job_needs_it():
    """U35: `supervisor status` printed `NOT running` in capitals with nothing to watch."""
    idle = {"running": False, "session": "ct-supervisor"}
    assert job_views.supervisor_line(idle, needed=False) == \
        "supervisor: not running (no recovering spot job needs it)"
    assert job_views.supervisor_line(idle, needed=True).startswith("supervisor: NOT running")
    busy = {"running": True, "pid": 42, "watching": 1, "session": "ct-supervisor"}
    assert job_views.supervisor_line(busy, needed=False).startswith("supervisor: running (pid 42")


def test_u35_supervisor_status_with_nothing_to_watch(cli):
    out = cli.ok("supervisor", "status").stdout.strip()
    assert out == "supervisor: not running (no recovering spot job needs it)"
