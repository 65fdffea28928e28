"""host/job_queue.py: the jobs queued on a kept instance, with real agents in real tmux (the
test session's own tmux server). A queued job is started by the agent of the job before it,
with nothing of the CLI running (the laptop closed)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.host import job_queue
from cloudtrain.hosts import write_host_files
from labs.polling import wait_for
from labs.shipped_host import command

SOCKET = os.environ.get("CLOUDTRAIN_TMUX_SOCKET", "cloudtrain")


@pytest.fixture
def ids() -> tuple[str, str, str]:
    """Job ids of the test's own: the tmux server (and its session names) is the session's."""
    import secrets

    return tuple(secrets.token_hex(4) for _ in range(3))


@pytest.fixture
def root(tmp_path) -> Path:
    """<root> as an instance has it: the agent's folder (its version's) and jobs/."""
    root = tmp_path / "root"
    agent = root / "agent-0123abcd"
    agent.mkdir(parents=True)
    write_host_files(agent)
    (root / "jobs").mkdir()
    return root


def _job(root: Path, job: str, script: str) -> Path:
    jobdir = root / "jobs" / job
    jobdir.mkdir()
    (jobdir / "run.sh").write_text(script)
    # No shutdown command: a kept host (the agent re-arms nothing without `rearm`).
    (jobdir / "job.json").write_text(json.dumps({"job_id": job, "heartbeat_s": 0.1}))
    return jobdir


def _agent(root: Path) -> str:
    return str(root / "agent-0123abcd" / "agent.py")


def _start(root: Path, job: str) -> None:
    """The job's agent in tmux, as Host.start_command starts it."""
    jobdir = root / "jobs" / job
    line = f"exec {shlex.join([sys.executable, _agent(root), 'run', str(jobdir)])}"
    subprocess.run(["tmux", "-L", SOCKET, "new-session", "-d", "-s", f"ct-{job}", line],
                   check=True)


def _cli(*args: str) -> tuple[int, dict | str]:
    """job_queue.py run as the CLI runs it over SSH: a script, one JSON line out."""
    proc = subprocess.run([sys.executable, command("job_queue"), *args], capture_output=True,
                          text=True, timeout=60)
    out = proc.stdout.strip()
    return proc.returncode, (json.loads(out) if out.startswith("{") else out)


def _add(root: Path, job: str, ahead: str, order: int = 1) -> tuple[int, dict | str]:
    return _cli("add", str(root), job, str(order), sys.executable, _agent(root), SOCKET, ahead)


def _ended(jobdir: Path) -> dict | None:
    try:
        status = json.loads((jobdir / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return status if status.get("state") in ("succeeded", "failed", "cancelled") else None


def test_a_job_queued_behind_a_running_one_starts_there_when_it_ends(root, ids):
    """The queue of a kept instance (issue 34, SkyPilot's `exec`): the next job's start is left
    on the instance, and the running job's agent starts it after its own job."""
    AHEAD, NEXT, THIRD = ids
    ahead = _job(root, AHEAD, "sleep 1.5; echo first\n")
    nxt = _job(root, NEXT, "echo second\n")
    _start(root, AHEAD)
    assert _add(root, NEXT, AHEAD) == (0, {"queued": True})
    assert _cli("state", str(root), NEXT) == (0, {"state": "queued"})
    wait_for(lambda: _ended(nxt), timeout=60, what="the queued job to run")
    assert _ended(ahead)["state"] == "succeeded" and _ended(nxt)["state"] == "succeeded"
    assert json.loads((nxt / "status.json").read_text())["started_at"] >= \
        json.loads((ahead / "status.json").read_text())["ended_at"]  # one at a time
    assert "second" in (nxt / "output.log").read_text()
    assert f"started job {NEXT}" in (ahead / "output.log").read_text()
    assert _cli("state", str(root), NEXT) == (0, {"state": "started"})
    assert job_queue._entries(str(root)) == []


def test_jobs_start_in_the_order_they_were_queued(root, ids):
    AHEAD, NEXT, THIRD = ids
    ahead = _job(root, AHEAD, "sleep 1.5\n")
    second, third = _job(root, NEXT, "date +%s.%N\n"), _job(root, THIRD, "date +%s.%N\n")
    _start(root, AHEAD)
    assert _add(root, THIRD, NEXT, order=20)[1] == {"queued": True}  # queued later ...
    assert _add(root, NEXT, AHEAD, order=10)[1] == {"queued": True}  # ... but created first
    wait_for(lambda: _ended(third), timeout=40, what="both queued jobs to run")
    assert _ended(ahead) and _ended(second)
    assert float((second / "output.log").read_text().split()[0]) < \
        float((third / "output.log").read_text().split()[0])


def test_a_job_queued_after_the_one_ahead_looked_starts_at_once(root, ids):
    """The race: the agent ahead looked at the queue (found nothing) just before the CLI
    queued the next job. Under the queue's lock the CLI sees it looked, and starts the job
    itself rather than leave it for an agent that is gone."""
    AHEAD, NEXT, THIRD = ids
    ahead = _job(root, AHEAD, "true\n")
    nxt = _job(root, NEXT, "echo late\n")
    (root / "queue").mkdir()
    _start(root, AHEAD)
    wait_for(lambda: (ahead / job_queue.CHECKED).exists(), timeout=60, what="the agent to look")
    assert _add(root, NEXT, AHEAD) == (0, {"started": True})
    wait_for(lambda: _ended(nxt), timeout=60, what="the job started at once")
    assert "late" in (nxt / "output.log").read_text()


def test_removed_from_the_queue_it_never_runs(root, ids):
    AHEAD, NEXT, THIRD = ids
    ahead = _job(root, AHEAD, "sleep 1\n")
    nxt = _job(root, NEXT, "echo should-not-run\n")
    _start(root, AHEAD)
    assert _add(root, NEXT, AHEAD)[1] == {"queued": True}
    assert _cli("remove", str(root), NEXT) == (0, {"removed": True})
    assert _cli("remove", str(root), NEXT) == (0, {"removed": False})
    wait_for(lambda: _ended(ahead), timeout=60, what="the job ahead to end")
    wait_for(lambda: (ahead / job_queue.CHECKED).exists(), timeout=60, what="its agent to look")
    time.sleep(0.5)
    assert not (nxt / "status.json").exists() and not (nxt / "output.log").exists()
    assert _cli("state", str(root), NEXT) == (0, {"state": "unknown"})


def test_an_entry_that_cloudtrain_did_not_write_is_never_started(root, tmp_path, ids):
    """A job runs as the instance's user and can write into the queue: an entry whose agent
    or job directory is not where cloudtrain puts them is dropped, not run."""
    AHEAD, NEXT, THIRD = ids
    ahead = _job(root, AHEAD, "true\n")
    outside = tmp_path / "elsewhere" / "jobs" / NEXT
    outside.mkdir(parents=True)
    (outside / "run.sh").write_text("touch ran\n")
    (root / "queue").mkdir()
    planted = {"job": NEXT, "jobdir": str(outside), "socket": SOCKET,
               "argv": [sys.executable, _agent(root), "run", str(outside)]}
    (root / "queue" / f"{1:020d}-{NEXT}.json").write_text(json.dumps(planted))
    _start(root, AHEAD)
    wait_for(lambda: (ahead / job_queue.CHECKED).exists(), timeout=60, what="the agent to look")
    time.sleep(0.5)
    assert not (outside / "ran").exists() and not (outside / "status.json").exists()
    assert job_queue._entries(str(root)) == []  # dropped
    # and the CLI's own arguments are checked the same way
    code, answer = _cli("add", str(root), NEXT, "1", sys.executable,
                        str(tmp_path / "agent-0123abcd" / "agent.py"), SOCKET, AHEAD)
    assert code == 1 and "agent" in answer["error"]
    code, answer = _cli("add", str(root), "../../x", "1", sys.executable, _agent(root), SOCKET,
                        AHEAD)
    assert code == 1 and "not a job id" in answer["error"]
    code, answer = _cli("add", str(root), NEXT, "1", sys.executable, _agent(root), "a b; c",
                        AHEAD)
    assert code == 1 and "socket" in answer["error"]


def test_a_start_that_fails_is_said_in_the_job_and_the_next_one_starts(root, ids):
    AHEAD, NEXT, THIRD = ids
    ahead = _job(root, AHEAD, "sleep 1\n")
    broken = _job(root, NEXT, "true\n")
    third = _job(root, THIRD, "echo third\n")
    _start(root, AHEAD)
    assert _add(root, NEXT, AHEAD, order=1)[1] == {"queued": True}
    assert _add(root, THIRD, NEXT, order=2)[1] == {"queued": True}
    # A session of that name exists already: tmux refuses the start.
    subprocess.run(["tmux", "-L", SOCKET, "new-session", "-d", "-s", f"ct-{NEXT}", "sleep 30"],
                   check=True)
    try:
        wait_for(lambda: _ended(third), timeout=60, what="the third job to run")
        code, answer = _cli("state", str(root), NEXT)
        assert answer["state"] == "failed" and "duplicate session" in answer["error"]
        assert not (broken / "status.json").exists()
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-session", "-t", f"ct-{NEXT}"],
                       capture_output=True)


def test_a_host_where_nothing_was_queued_gets_no_queue(root, ids):
    """Every agent looks after its job (this machine's local jobs too): where nothing was
    ever queued it leaves only its own marker."""
    AHEAD, NEXT, THIRD = ids
    jobdir = _job(root, AHEAD, "true\n")
    assert job_queue.next_job(str(jobdir)) is None
    assert (jobdir / job_queue.CHECKED).exists() and not (root / "queue").exists()


def test_usage():
    assert _cli("add", "x")[0] == 2
    assert _cli("frobnicate")[0] == 2
