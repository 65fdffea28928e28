"""Aborting a launch (cloudtrain/lifecycle/abort.py) on the local backend: a signal during a
launch cancels the job cleanly and leaves nothing running (F13)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from conftest import REPO, wait_for_job_state


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
