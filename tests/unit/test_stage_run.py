"""The dataset download's extraction processes (cloudtrain/host/stage_run.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import REPO

# A stager's process: its SIGTERM handler only notes the signal (as Stager.on_signal does);
# each forked process takes 0.3 s before its initializer runs (the window where a
# terminate() reached one on a loaded machine, made wide); the pool is stopped at once.
STOPPED_AT_ONCE = textwrap.dedent("""
    import os, signal, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from cloudtrain.host import stage_run

    noted = []
    signal.signal(signal.SIGTERM, lambda signum, frame: noted.append(signum))
    os.register_at_fork(after_in_child=lambda: time.sleep(0.3))
    pool = stage_run.extraction_pool(2)
    stopper = threading.Thread(target=lambda: (pool.terminate(), pool.join()), daemon=True)
    stopper.start()
    stopper.join(20)
    print("hung" if stopper.is_alive() else "joined", flush=True)
    if stopper.is_alive():
        for process in pool._pool:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except OSError:
                pass
    os._exit(0)  # not the exit's own join of a pool that may hang
""")


def test_a_pool_stopped_before_its_processes_started_is_joined():
    """A dataset stage stopped or failed at its very start (a refused read, a signal) ended
    the extraction pool with terminate() while its forked processes still had the stager's
    SIGTERM handler, which only notes the signal: the process lived on, waiting on a queue
    lock terminate() held, and the stager waited to join it for ever (the suite hung 11
    minutes in test_stager's refused-read test; on an instance, the job's staging would).
    The processes are now born with the stop signals blocked until theirs are set."""
    proc = subprocess.run([sys.executable, "-c", STOPPED_AT_ONCE, str(REPO)],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "joined", proc.stdout + proc.stderr
