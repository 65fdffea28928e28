"""A value as the text of a cell, and the grid of cells that fits the terminal: what every
view (job_views, catalog_views, curves, check) prints its values and tables with. Pure
functions: anything in, one line of text out.

It imports state (the Job a job's cell reads) and the host side's time helpers, nothing else
of cloudtrain.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

from .host.job_status import as_time as _finite  # a finite float, else None
from .host.job_status import fmt_duration
from .state import Job


# Values shown here can come from a job's own metrics rows and status.json (a
# string accuracy, NaN or Infinity took `status` away). Every formatter takes anything and
# answers with text; what is not a finite number is shown as "-" or as short plain text.
MAX_SHOWN = 40


def shown(value) -> str:
    """A value that is not a number, as one short line of plain text."""
    if value is None:
        return "-"
    if isinstance(value, float):  # NaN, inf
        return str(value)
    text = "".join(c if c.isprintable() else " " for c in str(value)[:MAX_SHOWN * 2])
    return text[:MAX_SHOWN - 3] + "..." if len(text) > MAX_SHOWN else text


def printable(text: object) -> str:
    """A file name as one line that cannot steer the terminal (a name may hold escapes)."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


def error_line(text: str) -> str:
    """An error's message (or hint) as one line: a newline, an escape or another control
    character it quotes from the input is shown as \\n, \\x1b, ..., never acted on (an env
    name holding a newline split its error over two lines)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in str(text))


def duration(seconds) -> str:
    s = _finite(seconds)
    if s is None:
        return shown(seconds)
    if abs(s) > 1e12:  # ~30,000 years (either way): not a duration worth spelling out
        return f"{s:.3g}s"
    if s < 10:
        return f"{s:.2f}s"
    return fmt_duration(s)


def age(ts, now) -> str:
    ts, now = _finite(ts), _finite(now)
    if ts is None or now is None:
        return "-"
    s = max(now - ts, 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit}"
    return f"{int(s)}s"


def clock(ts) -> str:
    t = _finite(ts)
    if t is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 100):02d}"
    except (OverflowError, OSError, ValueError):  # past what the C library's time_t holds
        return f"{t:.0f}"


def iso_time(ts) -> str | None:
    """A moment as JSON gives it: ISO 8601 in UTC to the millisecond
    (`2026-12-01T09:30:12.345Z`); None for what is no finite time."""
    import datetime

    t = _finite(ts)
    if t is None:
        return None
    try:
        when = datetime.datetime.fromtimestamp(t, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):  # past what datetime holds
        return None
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def is_time_key(key) -> bool:
    """Whether a field holds a moment (unix seconds in cloudtrain's records): `*_at`, and
    the launch lease's `lease_until`, a kept instance's `billing_since`."""
    return isinstance(key, str) and (key.endswith("_at") or key in ("lease_until",
                                                                   "billing_since"))


def json_times(value, keys=is_time_key):
    """`value` (dicts and lists, as a --json output holds them) with every number under a
    time field as iso_time's text, so every --json output gives times one way."""
    if isinstance(value, dict):
        return {k: (iso_time(v) if keys(k) and isinstance(v, (int, float))
                    and not isinstance(v, bool) else json_times(v, keys))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_times(v, keys) for v in value]
    return value


def money(value) -> str:
    v = _finite(value)
    return shown(value) if v is None else f"${v:,.2f}"


def job_cost(job: Job) -> str:
    """Settled costs as they are; estimates (still running, prices not yet known) with ~."""
    if job.cost is None:
        return "-"
    return money(job.cost) if job.cost_settled else "~" + money(job.cost)


def pct(value) -> str:
    v = _finite(value)
    if v is not None and not math.isfinite(v * 100):  # 1e308 is finite; 1e310 % is not
        return "-"
    return shown(value) if v is None else f"{v * 100:.2f}%"


def number(value) -> str:
    v = _finite(value)
    return shown(value) if v is None else f"{v:.4g}"


def runtime(job: Job, now: float) -> float | None:
    started, ended = _finite(job.started_at), _finite(job.ended_at)
    if started is None:
        return None
    return (ended or _finite(now) or started) - started


def state_text(job: Job) -> str:
    if job.state == "failed" and job.exit_code not in (None, 0):
        return f"failed ({job.exit_code})"
    return job.state


def epoch_text(metrics) -> str:
    if not isinstance(metrics, dict) or metrics.get("epoch") is None:
        return "-"
    total = metrics.get("epochs")
    return f"{shown(metrics['epoch'])}/{shown(total)}" if total else shown(metrics["epoch"])


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain table at its natural width (small listings that never need fitting)."""
    return grid([Col(h) for h in header], rows)


# -- tables that fit the terminal ---------------------------------------------------------------
#
# Every listing is a `grid`: a header row and rows, two spaces between columns, no borders
# (like `kubectl get`), rendered by rich into a string so the output is deterministic. With a
# `width` (the terminal's, or COLUMNS) it fits: optional columns are dropped first, in their
# `drop` order, then the text columns that may be cut are narrowed (an ellipsis marks the cut,
# or the text wraps inside its column); ids, states and money are never cut. `width=None` is
# everything at full length (`--wide`, and output piped to a script).

GAP = 2  # spaces between columns

# State colours, used only when the caller says the output is a colour terminal.
STATE_STYLES = {"succeeded": "green", "failed": "red", "running": "cyan", "staging": "cyan",
                "provisioning": "yellow", "syncing": "yellow", "setting-up": "yellow",
                "pending": "yellow", "recovering": "yellow", "queued": "yellow", "preempted": "magenta",
                "cancelled": "dim", "stopped": "magenta"}


@dataclasses.dataclass(frozen=True)
class Col:
    """One column of a grid."""
    header: str
    cut: int = 0  # 0: never cut; else the narrowest the column may be made (text columns)
    drop: int = 0  # 0: always shown; else optional, dropped first at the lowest number
    wrap: bool = False  # a cut column wraps its text instead of ending it with an ellipsis
    right: bool = False  # right-justified (numbers)


def state_style(text: str) -> str | None:
    """The colour of a STATE cell ("failed (1)" is failed)."""
    return STATE_STYLES.get(str(text).split(" ", 1)[0])


def _cell(value) -> str:
    """A cell as one line of printable text (a name or command may hold escapes or newlines)."""
    return "".join(c if c.isprintable() else " " for c in str(value))


def _fit(cols: list[Col], natural: list[int], width: int | None) -> tuple[list[int], list[int]]:
    """Which columns to show (indices) and how wide each is, to fit `width`."""
    shown = list(range(len(cols)))

    def floor(i: int) -> int:
        return natural[i] if not cols[i].cut else min(natural[i], cols[i].cut)

    if width is None:
        return shown, natural
    optional = sorted((i for i, c in enumerate(cols) if c.drop), key=lambda i: cols[i].drop)
    while sum(natural[i] for i in shown) + GAP * (len(shown) - 1) > width and optional:
        if sum(floor(i) for i in shown) + GAP * (len(shown) - 1) <= width:
            break  # narrowing the text columns is enough
        shown.remove(optional.pop(0))
    widths = list(natural)
    excess = sum(widths[i] for i in shown) + GAP * (len(shown) - 1) - width
    while excess > 0:  # narrow the widest cuttable column, a character at a time
        room = [i for i in shown if cols[i].cut and widths[i] > floor(i)]
        if not room:
            break
        widest = max(room, key=lambda i: widths[i] - floor(i))
        widths[widest] -= 1
        excess -= 1
    return shown, widths


def _plain_grid(cols: list[Col], body: list[list[str]], shown: list[int],
                widths: list[int]) -> str:
    """What rich draws for a grid without colour or wrapping, drawn directly: rich lays out
    each cell as a renderable, over a second for a 1,000-job `status`."""
    from rich.cells import cell_len, set_cell_size

    def fit(text: str, i: int) -> str:
        w = widths[i]
        if cell_len(text) > w:
            text = set_cell_size(text, w - 1) + "…" if w > 1 else set_cell_size(text, w)
        pad = " " * (w - cell_len(text))
        return pad + text if cols[i].right else text + pad

    lines = [[c.header for c in cols], *body]
    return "\n".join((" " * GAP).join(fit(row[i], i) for i in shown).rstrip() for row in lines)


def grid(cols: list[Col], rows: list[list], *, width: int | None = None, color: bool = False,
         styles: dict[str, Callable[[str], str | None]] | None = None) -> str:
    """Rows under a header, fitted to `width` (None: full length); `styles` maps a header to
    a function giving a cell's rich style (used only with `color`)."""
    from rich.cells import cell_len  # rich's console and table only where they are needed:
    # the plain path (no colour, no wrapping) is `status` on every call, 70 ms less

    body = [[_cell(v) for v in row] for row in rows]
    natural = [max([len(c.header)] + [cell_len(r[i]) for r in body]) for i, c in enumerate(cols)]
    shown, widths = _fit(cols, natural, width)
    if not color and not any(cols[i].wrap for i in shown):
        return _plain_grid(cols, body, shown, widths)
    import io

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(box=None, padding=(0, GAP // 2), pad_edge=False, show_edge=False,
              header_style="bold" if color else None)
    for i in shown:
        c = cols[i]
        t.add_column(c.header, width=widths[i], no_wrap=not c.wrap,
                     overflow="fold" if c.wrap else "ellipsis",
                     justify="right" if c.right else "left")
    styles = styles or {}
    for row in body:
        cells = []
        for i in shown:
            fn = styles.get(cols[i].header) if color else None
            cells.append(Text(row[i], style=(fn(row[i]) or "") if fn else ""))
        t.add_row(*cells)
    total = sum(widths[i] for i in shown) + GAP * len(shown)
    out = io.StringIO()
    console = Console(file=out, width=total, color_system="standard" if color else None,
                      force_terminal=color, no_color=not color, highlight=False, emoji=False,
                      markup=False, legacy_windows=False)
    console.print(t)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").split("\n"))


def staged_size(info) -> str:
    if not isinstance(info, dict):
        return "?"
    size = info.get("file_bytes") or info.get("bytes")
    text = f"{size / 1e9:.1f} GB" if isinstance(size, (int, float)) else "size unknown"
    if info.get("files"):
        text += f", {info['files']:,} files"
    return text + f" ({info.get('kind', '?')})"


def wrapped(text: str, width: int | None, indent: str, later: str | None = None) -> list[str]:
    """`text` after `indent`, wrapped at `width` (None: one line), later lines at `later`."""
    import textwrap

    text = _cell(text)
    if width is None:
        return [indent + text]
    return textwrap.wrap(text, width=max(width, len(indent) + 20), initial_indent=indent,
                         subsequent_indent=indent if later is None else later,
                         break_on_hyphens=False) or [indent.rstrip()]


def money4(value) -> str:
    v = _finite(value)
    return shown(value) if v is None else f"${v:,.4f}"
