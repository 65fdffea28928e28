"""Stage: while a job is being launched (or relaunched): the lease that says its launcher is
alive, and the signals that must end a launch the way Ctrl-C does. It calls nothing of the
lifecycle; state only (the bottom of the package).

A launch creates things that bill (an instance) before it has a host to hand the job to, so
two questions need answers that do not depend on which machine asks:

- Is the launcher still working? It renews `jobs.lease_until` every RENEW_S from a thread.
  Any `cloudtrain` process, on any machine or container sharing the store, may fail a job
  still being launched whose lease ran out, and release what it holds (the old check, the
  launcher's hostname and pid, only worked on the launching machine itself).
- What does SIGTERM or SIGHUP mean? The same as Ctrl-C: `timeout`, CI cancellation, `docker
  stop` and a closed terminal send those, and the default action would kill the process with
  an instance running. While the launch is cleaned up, further signals are noted and said,
  not obeyed: a second Ctrl-C must not stop the termination half-way.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from pathlib import Path

LEASE_S = 120.0  # a launcher silent for this long is taken for dead
RENEW_S = 15.0
RENEW_JOIN_S = 35.0  # a renewal waits at most the store's busy timeout (30 s)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class LaunchInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a launch: handled exactly like Ctrl-C (KeyboardInterrupt)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signame = signal.Signals(signum).name


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def renewing(db_path: Path, job_id: str):
    """Hold the job's launch lease for the duration of the block (renewed from a thread with
    its own database connection; SQLite connections are not shared between threads)."""
    from ..state import Store

    stop = threading.Event()
    with Store(db_path) as store:
        store.update_job(job_id, lease_until=time.time() + LEASE_S)

    def renew():
        own = None
        while not stop.wait(RENEW_S):
            try:
                own = own or Store(db_path)
                own.update_job(job_id, lease_until=time.time() + LEASE_S)
            except Exception:  # a busy or vanished database: the next renewal tries again
                pass
        if own is not None:
            own.close()

    thread = threading.Thread(target=renew, name=f"lease-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(RENEW_JOIN_S)  # no renewal may land after the launch cleared the lease


# The stop signals the running signals_interrupt block received (the main thread's only).
_fired: list[int] = []


def _raised(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else LaunchInterrupted(signum)


def interruption(exc: BaseException) -> BaseException:
    """What ended the launch: `exc`, or the stop signal it stands for. A signal raises its
    KeyboardInterrupt inside whatever code runs at that moment, and some code turns it into
    another error (CPython's import machinery, interrupted mid-import, raises TypeError
    "expected a message argument"); once the block got a signal, the signal is the end."""
    if _fired and not isinstance(exc, KeyboardInterrupt):
        interrupted = _raised(_fired[0])
        interrupted.__cause__ = exc
        return interrupted
    return exc


@contextlib.contextmanager
def signals_interrupt():
    """SIGTERM and SIGHUP raise LaunchInterrupted (a KeyboardInterrupt) in the block, as
    Ctrl-C raises KeyboardInterrupt; any signal after the first is only noted (and
    `interruption` says the first ended the launch, whatever error it became)."""
    if not _in_main_thread():
        yield
        return

    fired = _fired
    fired.clear()

    def handler(signum, frame):
        # The first signal interrupts; later ones (before the cleanup takes them over) are
        # noted only, so that nothing can cut the cleanup itself short.
        fired.append(signum)
        if len(fired) == 1:
            raise _raised(signum)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        fired.clear()


@contextlib.contextmanager
def uninterruptible(what: str):
    """Ctrl-C, SIGTERM and SIGHUP are noted, not obeyed, inside the block (cleanup that must
    finish: terminating an instance). Yields a list that collects the signals' names."""
    received: list[str] = []
    if not _in_main_thread():
        yield received
        return

    def handler(signum, frame):
        received.append(signal.Signals(signum).name)
        try:
            sys.stderr.write(f"\nstill {what}; it cannot be interrupted (it stops the billing)\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield received
    finally:
        for s, h in old.items():
            signal.signal(s, h)
