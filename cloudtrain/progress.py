"""What a launch says while it works: each phase as it starts (requesting spot g5.xlarge
in us-east-1b, instance i-... running, waiting for SSH, syncing N files, setting up, started).

Piped, each phase is one plain line on stderr, with no carriage returns. In a terminal the
same lines are printed, and below them a live line shows the current phase with a spinner,
its elapsed seconds, and a bar while files are sent. stdout stays for the result.

The lifecycle and the providers call a Reporter; the base class is silent about phases and
hands notes to a plain `say` callback, which is what the supervisor and `launch -q` get.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Callable, TextIO

RETRY_EVERY_S = 10.0  # a retried wait (SSH not up yet) is said at most this often


def megabytes(size: int) -> str:
    """A byte count for a phase line: '4.2 MB', '1.2 GB', '0.3 kB'."""
    if size >= 1e9:
        return f"{size / 1e9:.1f} GB"
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.1f} kB"


class Reporter:
    """Silent about phases; notes (warnings, one-off remarks) go to `say` when there is one.
    The reporter is itself a `say` callback: reporter("line") is a note."""

    def __init__(self, say: Callable[[str], None] | None = None):
        self._say = say

    def phase(self, text: str) -> None:
        """A new phase of the launch begins."""

    def retry(self, text: str) -> None:
        """A wait goes on after a transient failure (SSH not up yet): said the first time,
        then at most every RETRY_EVERY_S, with the seconds the phase has lasted."""

    def transfer(self, total: int) -> None:
        """Bytes to send in the current phase: a bar, where there is a terminal."""

    def sent(self, done: int) -> None:
        """Bytes sent so far in the current phase (of `total`)."""

    def note(self, line: str) -> None:
        if self._say is not None:
            self._say(line)

    def info(self, line: str) -> None:
        """A note only for the user's information (where the results go): said as any
        note, except by a quiet launch (Quiet)."""
        self.note(line)

    def close(self) -> None:
        """The launch has returned or failed: stop any live display."""

    def __call__(self, line: str) -> None:
        self.note(line)

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


SILENT = Reporter()


def of(say: "Callable[[str], None] | Reporter | None") -> Reporter:
    """The reporter for a lifecycle call that was given a reporter, a `say` callback, or
    nothing."""
    if isinstance(say, Reporter):
        return say
    return SILENT if say is None else Reporter(say)


class Lines(Reporter):
    """One line per phase on a stream (stderr when piped)."""

    def __init__(self, stream: TextIO | None = None):
        super().__init__()
        self.stream = stream
        self.since = time.monotonic()
        self._last_retry: float | None = None
        self._lock = threading.Lock()

    def _line(self, text: str) -> None:
        stream = self.stream or sys.stderr
        with self._lock:
            stream.write(text + "\n")
            stream.flush()

    def phase(self, text: str) -> None:
        self.since = time.monotonic()
        self._last_retry = None
        self._line(text)

    def retry(self, text: str) -> None:
        now = time.monotonic()
        if self._last_retry is None or now - self._last_retry >= RETRY_EVERY_S:
            self._last_retry = now
            self._line(f"{text} ({now - self.since:.0f} s)")

    def note(self, line: str) -> None:
        self._line(line)


class _Status:
    """The live line: spinner, current phase, elapsed seconds, and the bar while sending."""

    def __init__(self):
        from rich.spinner import Spinner

        self.spinner = Spinner("dots")
        self.text = ""
        self.detail = ""
        self.since = time.monotonic()
        self.total = 0
        self.done = 0

    def __rich__(self):
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.console import RenderableType
        from rich.text import Text

        row = Table.grid(padding=(0, 1))
        cells: list[RenderableType] = [self.spinner,
                                       Text(self.text, overflow="ellipsis", no_wrap=True)]
        if self.total:
            cells += [ProgressBar(total=self.total, completed=self.done, width=30),
                      Text(f"{megabytes(self.done)} / {megabytes(self.total)}")]
        elif self.detail:
            cells.append(Text(self.detail, style="dim", overflow="ellipsis", no_wrap=True))
        cells.append(Text(f"{time.monotonic() - self.since:.0f} s", style="dim"))
        row.add_row(*cells)
        return row


class Live(Lines):
    """A terminal: each phase printed as a line, and a live status line below them."""

    def __init__(self, console=None):
        from rich.console import Console
        from rich.live import Live as RichLive

        super().__init__()
        self.console = console or Console(stderr=True)
        self.status = _Status()
        # redirect_*: a click.echo to stderr meanwhile is printed above the live line.
        self.live = RichLive(self.status, console=self.console, refresh_per_second=8,
                             transient=True, redirect_stdout=False, redirect_stderr=True)
        self.live.start()

    def _line(self, text: str) -> None:
        with self._lock:
            self.live.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def phase(self, text: str) -> None:
        self.status.text, self.status.detail = text, ""
        self.status.total = self.status.done = 0
        self.status.since = time.monotonic()
        self._line(text)

    def retry(self, text: str) -> None:
        self.status.detail = text  # shown on the live line at once, not as a new line

    def transfer(self, total: int) -> None:
        self.status.total, self.status.done = total, 0

    def sent(self, done: int) -> None:
        self.status.done = min(done, self.status.total)

    def close(self) -> None:
        if self.live.is_started:
            self.live.stop()


class Quiet(Reporter):
    """`launch -q`: the warnings and remarks that matter are said through `say`; a note
    only for information is not (-q printed where the results go on AWS)."""

    def info(self, line: str) -> None:
        pass


def for_launch(quiet: bool, say: Callable[[str], None]) -> Reporter:
    """The reporter `launch` uses: notes only with --quiet (through `say`); a live display
    when stderr is a terminal; plain lines otherwise, and also with --debug, whose log lines
    would fight with a live display."""
    if quiet:
        return Quiet(say)
    debug_log = bool(logging.getLogger().handlers)
    if sys.stderr.isatty() and not debug_log:
        try:
            return Live()
        except Exception:  # a terminal rich cannot drive: plain lines still say it all
            pass
    return Lines()
