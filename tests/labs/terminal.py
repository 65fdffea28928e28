"""The real `cloudtrain` on a pseudo-terminal: what a user at a terminal sees (questions,
colours, the live progress display), and answers typed to it."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout: `python -m cloudtrain` runs here


def run_in_terminal(args: list[str], *, env: dict | None = None, answer: str | None = None,
                    when: bytes = b"Proceed?", timeout: float = 60, columns: int = 100,
                    cwd=REPO, interrupt_after: float | None = None) -> tuple[int, str]:
    """Run `python -m cloudtrain ARGS` with stdin, stdout and stderr on a new pseudo-terminal
    (`columns` wide); type `answer` and Enter once `when` is shown. Returns the exit code and
    everything it wrote. `env` adds to this process's environment; a None value removes.
    `interrupt_after`: seconds after which Ctrl-C is typed (a view that runs until then)."""
    full = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns)}
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], stdin=slave,
                            stdout=slave, stderr=slave, cwd=cwd, env=full,
                            start_new_session=True)
    os.close(slave)
    out, answered = bytearray(), answer is None
    deadline = time.monotonic() + timeout
    interrupt_at = None if interrupt_after is None else time.monotonic() + interrupt_after
    try:
        while time.monotonic() < deadline:
            if interrupt_at is not None and time.monotonic() > interrupt_at:
                # Ctrl-C as a terminal gives it: SIGINT to the foreground group (the pty here
                # is not the child's controlling terminal, so typing ^C would not)
                os.killpg(proc.pid, signal.SIGINT)
                interrupt_at = None
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child side closed
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                out += chunk
                if not answered and when in out:
                    os.write(master, answer.encode() + b"\r")
                    answered = True
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise AssertionError(f"still running after {timeout} s:\n{out.decode()}")
    finally:
        os.close(master)
    return proc.wait(), out.decode("utf-8", "replace")
