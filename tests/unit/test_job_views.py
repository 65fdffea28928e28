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


def test_the_startup_line_says_torchs_threads_and_why():
    """issue 28: the startup row's thread choice, from the host (untrusted: only whole
    counts are shown, text in their place is left out)."""
    base = {"import": 1.0, "to_first_step": 2.0}
    assert job_views.startup_text({**base, "threads": 1, "threads_from": "cores", "cores": 96,
                                   "procs": 8, "loader_workers": 11}).endswith(
        "; torch threads 1 (96 cores / 8 processes, less 11 loader workers)")
    assert job_views.startup_text({**base, "threads": 3, "threads_from": "job"}).endswith(
        "; torch threads 3 (the job's OMP_NUM_THREADS)")
    assert job_views.startup_text({**base, "threads": 2, "threads_from": "cores",
                                   "cores": "\x1b[2J", "procs": 1}).endswith("; torch threads 2")
    assert "threads" not in job_views.startup_text({**base, "threads": "\x1b[2J"})
    assert "threads" not in job_views.startup_text({**base, "threads": True})
