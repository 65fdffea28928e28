"""Audit findings about the lifecycle on the local backend (F1, F11, F13): the command is data,
and read-only commands never change a healthy job."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from cloudtrain import config, state
from cloudtrain.lifecycle import watch
from conftest import REPO, wait_for_job_state


def test_F1_a_newline_in_an_argument_is_data_not_shell_code(cli, ct_home, tmp_path):
    pwned = tmp_path / "pwned-argv"
    job_id = cli.launch("--", "echo", f"x\ntouch {pwned} #")
    assert cli.wait(job_id)["state"] == "succeeded"
    assert cli.ok("logs", job_id).stdout == f"x\ntouch {pwned} #\n"
    assert not pwned.exists()
    run_sh = (ct_home / "jobs" / job_id / "run.sh").read_text()
    assert run_sh.splitlines()[1] == "set -e"  # before anything derived from input


def test_F1_multi_line_python_and_one_string_scripts_run_once_in_the_workdir(cli, ct_home):
    job_id = cli.launch("--", sys.executable, "-c", 'import sys\nprint("hello from python")')
    assert cli.wait(job_id)["state"] == "succeeded"
    assert cli.ok("logs", job_id).stdout == "hello from python\n"

    job_id = cli.launch("--", "echo LINE1 in $PWD\necho LINE2 in $PWD")
    assert cli.wait(job_id)["state"] == "succeeded"
    work = ct_home / "jobs" / job_id / "work"
    assert cli.ok("logs", job_id).stdout == f"LINE1 in {work}\nLINE2 in {work}\n"


def test_F11_a_status_acting_on_an_old_snapshot_never_fails_a_job_that_moved_on(ct_home):
    """`status` lists the active jobs, then checks each one's launcher. If the launcher
    finished the launch (RUNNING) and exited in between, the stale snapshot must not fail the
    job: the check is a compare-and-set on the state it saw."""
    settings = config.Settings.load()
    with state.open_store(config.home()) as store:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
        job = store.create_job(name=None, kind="command", recipe=None, command="true",
                               backend="local", spec={}, launcher=f"{socket.gethostname()}:{dead}")
        store.set_state(job.id, state.SYNCING)
        snapshot = store.job(job.id)  # what status listed
        store.set_state(job.id, state.SETTING_UP)
        store.set_state(job.id, state.RUNNING)  # the launcher finished, then exited
        after = watch._check_launcher(store, snapshot)
        assert after.state == state.RUNNING
        assert store.job(job.id).state == state.RUNNING
        # The same check on a current snapshot does fail an abandoned launch.
        other = store.create_job(name=None, kind="command", recipe=None, command="true",
                                 backend="local", spec={},
                                 launcher=f"{socket.gethostname()}:{dead}")
        store.set_state(other.id, state.SYNCING)
        assert watch.refresh(store, settings, store.job(other.id)).state == state.FAILED


def test_F13_sigterm_and_sighup_during_a_local_launch_cancel_it_cleanly(cli, ct_home,
                                                                        big_workdir):
    for sig in (signal.SIGTERM, signal.SIGHUP):
        proc = subprocess.Popen(
            [sys.executable, "-m", "cloudtrain", "launch", "--workdir", str(big_workdir), "--",
             "sleep", "60"], cwd=REPO, env=os.environ, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        job_id = wait_for_job_state(ct_home, "syncing")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        job = cli.job(job_id)
        assert job["state"] == "cancelled"
        assert job["reason"] == f"interrupted during launch ({signal.Signals(sig).name})"
        assert subprocess.run(["tmux", "-L", os.environ["CLOUDTRAIN_TMUX_SOCKET"],
                               "has-session", "-t", f"ct-{job_id}"],
                              capture_output=True).returncode != 0
