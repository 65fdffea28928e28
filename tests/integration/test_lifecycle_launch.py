"""The launch stage (cloudtrain/lifecycle/launch.py) through the real CLI on the local backend:
the phases it says (D3), and interrupting a launch at any phase leaves nothing running and
nothing unexplained.

The launch is slowed down for real (a work directory of many files takes a while to sync),
and the real CLI process is interrupted while the store says it is syncing.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys


from conftest import REPO, TMUX_SOCKET, wait_for_job_state


def _start_launch(big_workdir, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "cloudtrain", "launch", "--workdir", str(big_workdir), *extra,
         "--", "sleep", "60"],
        cwd=REPO, env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _no_session(job_id):
    proc = subprocess.run(["tmux", "-L", TMUX_SOCKET, "has-session", "-t", f"ct-{job_id}"],
                          capture_output=True)
    return proc.returncode != 0


def test_ctrl_c_during_sync_cancels_the_job(cli, ct_home, big_workdir):
    proc = _start_launch(big_workdir)
    job_id = wait_for_job_state(ct_home, "syncing")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    job = cli.job(job_id)
    assert job["state"] == "cancelled" and job["reason"] == "interrupted during launch"
    assert _no_session(job_id)
    db = sqlite3.connect(ct_home / "state.db")
    assert db.execute("SELECT state FROM instances WHERE job_id = ?", (job_id,)).fetchone()[0] \
        == "terminated"


def test_a_launcher_killed_mid_launch_shows_as_failed(cli, ct_home, big_workdir):
    proc = _start_launch(big_workdir)
    job_id = wait_for_job_state(ct_home, "syncing")
    proc.kill()
    proc.wait()
    job = cli.job(job_id)
    assert job["state"] == "failed"
    assert job["reason"] == "the launching process died during syncing"
    assert _no_session(job_id)


def test_down_during_launch_stops_the_launch(cli, ct_home, big_workdir):
    proc = _start_launch(big_workdir)
    job_id = wait_for_job_state(ct_home, "syncing")
    assert f"{job_id}: cancelled" in cli.ok("down", job_id).stdout
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"Error: job {job_id} was stopped during launch" in err
    assert cli.job(job_id)["state"] == "cancelled"
    assert _no_session(job_id)


def test_ctrl_c_while_following_detaches_and_the_job_keeps_running(cli, ct_home):
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloudtrain", "launch", "--follow", "--", "bash", "-c",
         "echo started; sleep 60"],
        cwd=REPO, env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_id = wait_for_job_state(ct_home, "running")
    assert proc.stdout.readline() == "started\n"  # streamed through the follow
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert out == ""
    assert f"detached; job {job_id} keeps running" in err and "Traceback" not in err
    assert cli.job(job_id)["state"] == "running"
    cli.ok("down", job_id)
    status = json.loads((ct_home / "jobs" / job_id / "status.json").read_text())
    assert status["state"] == "cancelled"


# -- the phases a local launch says (D3) -------------------------------------------------------

def test_d3_local_launch_says_its_phases_in_order_as_plain_lines(cli, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('trained')\n")
    (work / "data.bin").write_bytes(b"x" * 2_500_000)
    proc = cli.ok("launch", "--workdir", str(work), "--", "python", "train.py")
    job_id = proc.stdout.split("launched job ")[1][:8]
    assert proc.stderr.splitlines() == [
        f"launching job {job_id}: waiting until it starts (Ctrl-C cancels the launch)",
        "running on this machine (local backend)",
        "syncing 2 files, 2.5 MB",
        "setting up the host",
        "starting the job in tmux",
        f"started job {job_id}",
    ]
    assert cli.wait(job_id)["state"] == "succeeded"


def test_d3_quiet_local_launch_prints_only_the_id(cli, tmp_path):
    proc = cli.ok("launch", "-q", "--", "true")
    assert len(proc.stdout.strip()) == 8 and proc.stderr == ""
