"""Stop requests for training loops: SIGTERM (cloudtrain `down`, the agent's max runtime, a
spot interruption notice) and SIGUSR1 (a checkpoint-and-stop request) set a flag that the loop
reads at step boundaries; the recipe then checkpoints and exits with 143.

In a multi-process run every rank must stop at the *same* step, or the survivors hang in the
next collective. `StopRequest.agreed(dist)` all-reduces the flag (max over ranks), so if any
rank was signalled, all of them see it at the same step. Stdlib only, apart from that call.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys

EXIT_STOPPED = 143  # 128 + SIGTERM, what a shell reports for a job stopped by SIGTERM
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Install with `with StopRequest(name) as stop:`; read `stop.requested` (the signal
    number, or None) or `stop.agreed(dist)` in multi-process runs."""

    def __init__(self, name: str, signals=SIGNALS):
        self.name, self.signals = name, tuple(signals)
        self.signum: int | None = None
        self._previous: dict = {}

    def _handler(self, signum, frame) -> None:
        first = self.signum is None
        self.signum = signum
        if first:
            # os.write, not print: a signal handler must not re-enter buffered IO.
            msg = (f"{self.name}: {signal.Signals(signum).name} received; checkpointing at the "
                   f"next step boundary\n")
            try:
                os.write(2, msg.encode())
            except OSError:  # stderr's reader is gone: the stop goes on without the line
                pass

    def install(self) -> "StopRequest":
        self.signum = None
        _end_workers_at_exit()
        for sig in self.signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: no handlers, nothing to restore
                pass
        return self

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def __enter__(self) -> "StopRequest":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()

    @property
    def requested(self) -> int | None:
        return self.signum

    def agreed(self, dist=None, extra: bool = False) -> bool:
        """True on every rank if any rank was signalled (or passed extra=True, e.g. a
        --stop_at_step testing aid). One all-reduce of a scalar when world_size > 1."""
        local = bool(self.signum is not None or extra)
        if dist is None or dist.world_size == 1:
            return local
        return dist.any(local)


def ignore_stop_signals(worker_id: int = 0) -> None:
    """A DataLoader `worker_init_fn`: the worker ignores the stop signals, so a SIGTERM or
    SIGUSR1 sent to the whole process group reaches the training loop's handler (which
    checkpoints at a step boundary) instead of killing a worker under it."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


_registered = False


def _end_workers_at_exit() -> None:
    """At the interpreter's exit, SIGKILL what is left of this process's multiprocessing
    children (DataLoader workers). They ignore SIGTERM (ignore_stop_signals), and SIGTERM is
    what multiprocessing's own exit handler sends them before it waits for them: a recipe
    leaving through an exception with its loader still running (its output pipe gone, as
    when the benchmark or agent reading it was killed: U37) waited for them for ever.
    Registered once, after multiprocessing's handler, so it runs before it."""
    global _registered
    if _registered:
        return
    _registered = True
    import multiprocessing.util  # noqa: F401  (registers its exit handler: ours runs first)

    atexit.register(_kill_children)


def _kill_children() -> None:
    mp = sys.modules.get("multiprocessing")
    for child in mp.active_children() if mp is not None else ():
        try:
            child.kill()
        except (OSError, ValueError, AttributeError):
            pass
