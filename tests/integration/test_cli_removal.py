"""cloudtrain/cli/removal.py: `down`, `rm` and `prune` as a user sees them, what they say
while they work included. The real CLI and real tmux jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from conftest import REPO
from labs.polling import wait_for


def test_u43_down_says_at_once_that_sigterm_went_and_when_sigkill_follows(cli):
    """U43: `down slowstop --grace 45` printed nothing for 45 s, then `cancelled`: a user
    may think it hung and press Ctrl-C. The stop is said as it begins (from the library,
    through a callback), on stderr; the outcome stays on stdout."""
    job = cli.launch("--name", "slowstop", "--", "bash", "-c",
                     "trap '' TERM; echo up; sleep 120")
    wait_for(lambda: "up" in cli.ok("logs", job).stdout, timeout=30, what="the job to start")
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "down", "slowstop",
                             "--grace", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env=os.environ)
    first = proc.stderr.readline()
    said_after = time.monotonic() - started
    out, err = proc.communicate(timeout=90)
    took = time.monotonic() - started
    assert proc.returncode == 0, (first, out, err)
    assert first == f"stopping {job}: SIGTERM sent, SIGKILL in 8 s\n", (first, err)
    assert took >= 8 and said_after < took - 6, (said_after, took)  # long before the end
    assert out == f"{job}: cancelled\n", out
