"""Training curves (issue 16): a job's metrics.jsonl read, and shown as a per-epoch table (text,
CSV, JSON) and as a one-line sparkline; plots.py draws it.

Pure functions: a `JobMetrics` in, text or a file out. Everything in metrics.jsonl was written
by the job's own code or by whoever controls its host, so it is read under guard:
a line that is not a JSON object, a value that is not a finite number, bool or short string,
a partial last line, a file past MAX_BYTES: each is dropped, never raised. Each row is cut
to the schema `hostdata.clean_row` keeps.

The contract with the code that writes the file is METRICS_CONTRACT below (also in the
README). It imports cells, config, hostdata and the host side's safe reads.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from pathlib import Path

from . import cells, config
from .errors import UsageError
from .host import safefile
from .host.job_status import as_time as finite  # a finite float (not a bool), else None
from .hostdata import clean_row

METRICS_CONTRACT = """\
### metrics.jsonl: what `metrics`, `plot` and `status` read

A job, a recipe or your own script, appends one JSON object per line to
`$CLOUDTRAIN_JOB_DIR/metrics.jsonl` (`recipes/common/metrics.py: MetricsWriter` does it and
flushes every line). A line without an `event` key is a metrics row, usually one per epoch:

- `time`: unix seconds when the row was written (MetricsWriter adds it); the wall-clock axis
  of `plot` and the ELAPSED column of `metrics`, both counted from the job's start (when its
  agent started it), so startup and the first epoch count.
- `epoch`: epochs done (1 after the first); the x axis. `epochs`: the total (`3/10`).
- `run`: which of several runs (`--runs N`); each run is its own curve.
- `step`: optimiser steps so far; the x axis of a job that writes no `epoch`.
- `train_loss`, `test_loss`, and any key with `loss` in it: losses; every one is plotted.
- `test_acc`, else `top1`, `val_acc`, `acc`, `accuracy`, `top5` (the first the rows have;
  the recipe's target metric before them): the accuracy `plot` draws and `status`
  sparklines, a fraction from 0 to 1.
- keys ending `_acc`, `_accuracy`, `_top1`, `_top5`: shown as percentages.
- keys ending `_time`, and `elapsed`: seconds, shown as durations.
- `wall_time` or `elapsed` (seconds since the start), else `hours`: the wall-clock axis of a
  job whose rows have no `time`.
- anything else: a number is a column of `cloudtrain metrics`; a string is in its `--csv`
  and `--json` only.

A line with an `event` key (`target_reached`, `runs_summary`, `ranks`, ...) is an event:
listed under the table, not plotted. A value is a finite number, a bool or a string (cut to
200 characters); nested values, NaN, infinities and integers past 64 bits are dropped, and so
are keys longer than 64 characters, keys past the 64th, lines that are not one JSON object,
and a partial last line (one still being written). Where an epoch appears twice in a run (a
resumed job redoing work, a final evaluation completing the last epoch) the table, the plot
and the sparkline show one row for it, the later values winning. Only the first 64 MB and 100,000
rows of a file are read.
"""

MAX_BYTES = 64 << 20  # a 100-epoch run writes ~50 KB; 1,000 airbench runs ~3 MB
MAX_ROWS = 100_000
MAX_LINE = 64 << 10  # a row is well under 1 KB; a longer line is not parsed
MAX_EVENTS_SHOWN = 20

# Which key is the accuracy, by preference: the recipes' top-1 is test_acc (imagenet writes
# top5 beside it); the recipe's own target metric comes first when the caller names it.
ACCURACY_KEYS = ("test_acc", "top1", "val_acc", "acc", "accuracy", "top5")
LOSS_ORDER = ("train_loss", "test_loss", "val_loss", "loss")
# The first columns of the table, in this order; then other losses, other accuracies, the
# time since the job started, then everything else (the first to go in a narrow terminal).
FIRST = ("run", "epoch", "train_loss", "test_loss", "train_acc", "test_acc", "top1", "top5")
KEPT_LONGEST = ("lr", "step")
BLOCKS = "▁▂▃▄▅▆▇█"


@dataclasses.dataclass
class JobMetrics:
    """One job's metrics.jsonl, read under guard."""
    job: str  # the job's id
    name: str | None = None  # the job's name, shown beside the id
    rows: list[dict] = dataclasses.field(default_factory=list)  # no "event" key; cleaned
    events: list[dict] = dataclasses.field(default_factory=list)  # with an "event" key
    notes: list[str] = dataclasses.field(default_factory=list)  # what was left out, and why
    started_at: float | None = None  # when the job started (its agent): time 0 of ELAPSED

    @property
    def epochs(self) -> list[dict]:
        """The rows with one per (run, epoch): where a run writes an epoch again, later values
        win over earlier ones, key by key (airbench's final row, its TTA accuracy, completes
        the last epoch's row; a resumed job's redone epoch replaces the first try) and the row
        moves to where the later one was written. Rows without an epoch stay as they are.
        What the table, the plot and the sparkline show; --csv and --json keep every
        row as written."""
        out: list[dict | None] = []  # None: merged into a later row
        where: dict[tuple, int] = {}
        for row in self.rows:
            epoch = finite(row.get("epoch"))
            if epoch is None:
                out.append(row)
                continue
            key = (row.get("run"), epoch)
            if key in where:
                merged = {**(out[where[key]] or {}), **row}  # the row kept there
                out[where[key]] = None
                row = merged
            where[key] = len(out)
            out.append(row)
        return [r for r in out if r is not None]

    def start(self) -> float | None:
        """Time 0 of the wall clock: when the job started, where that is known and not after
        its first row (a clock skewed between machines); else the first row's time."""
        first = next((t for t in (finite(r.get("time")) for r in self.rows) if t is not None),
                     None)
        began = finite(self.started_at)
        if began is not None and (first is None or began <= first):
            return began
        return first

    @property
    def label(self) -> str:
        return f"{self.job} ({self.name})" if self.name else self.job


def metrics_path(job_id: str) -> Path:
    """A job's metrics.jsonl as brought home: $CLOUDTRAIN_HOME/jobs/<id>/metrics.jsonl."""
    if not job_id or "/" in job_id or job_id.startswith(".") or "\0" in job_id:
        raise UsageError(f"not a job id: {config.shown(job_id)}",
                         hint="cloudtrain status lists the jobs")
    return config.home() / "jobs" / job_id / "metrics.jsonl"


# -- reading --------------------------------------------------------------------------------

def _read(path) -> tuple[list[dict], list[dict], list[str]]:
    """(rows, events, notes) of a metrics.jsonl; never raises."""
    try:  # a job may leave a FIFO or a link to /dev/zero there: refused at once
        fd = safefile.open_regular(path)
    except FileNotFoundError:
        return [], [], [f"no metrics.jsonl yet ({path})"]
    except safefile.NotRegular as exc:
        return [], [], [f"{path} is {exc.strerror}"]
    except (OSError, ValueError) as exc:  # no permission; a NUL in the name
        return [], [], [f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"]
    notes = []
    try:
        info = os.fstat(fd)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        return [], [], [f"cannot read {path}: {exc.strerror or exc}"]
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        notes.append(f"metrics.jsonl is {info.st_size / 1e6:,.0f} MB: only the first "
                     f"{MAX_BYTES >> 20} MB read")
        data = data[:MAX_BYTES]
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: b"" or a partial line still being written
    rows: list[dict] = []
    events: list[dict] = []
    junk = 0
    for line in lines:
        if not line.strip():
            continue
        raw = None
        if len(line) <= MAX_LINE:
            try:
                raw = json.loads(line)
            except (ValueError, RecursionError):  # not JSON or not UTF-8; nested too deep
                pass
        if not isinstance(raw, dict):
            junk += 1
            continue
        if "event" in raw:
            events.append(clean_row(raw))
        elif len(rows) < MAX_ROWS:
            rows.append(clean_row(raw))
        else:
            notes.append(f"only the first {MAX_ROWS:,} rows read")
            break
    if junk:
        notes.append(f"{junk:,} line{'s' if junk != 1 else ''} skipped: not a JSON object")
    return rows, events, notes


def read_rows(path) -> tuple[list[dict], list[dict]]:
    """(metric rows, event rows) of a metrics.jsonl, each row cut to flat finite values;
    a missing or unreadable file is ([], [])."""
    rows, events, _ = _read(path)
    return rows, events


def read_job(job_id: str, name: str | None = None, path=None, *,
             started_at: float | None = None, finished: bool = False) -> JobMetrics:
    """A job's metrics: from `path`, by default its copy at home (`metrics_path`).
    `started_at`: when the job started (ELAPSED and the plot's clock count from it);
    `finished`: the job has ended, so a missing file will not come."""
    rows, events, notes = _read(metrics_path(job_id) if path is None else path)
    if finished and notes and notes[0].startswith("no metrics.jsonl yet"):
        notes[0] = "the job wrote no metrics.jsonl"
    return JobMetrics(job=job_id, name=name, rows=rows, events=events, notes=notes,
                      started_at=started_at)


# -- which key is what ------------------------------------------------------------------------

def is_accuracy(key: str) -> bool:
    k = key.lower()
    return k in ("acc", "accuracy", "top1", "top5") or k.endswith(
        ("_acc", "_accuracy", "_top1", "_top5"))


def is_loss(key: str) -> bool:
    return "loss" in key.lower()


def is_seconds(key: str) -> bool:
    return key.endswith("_time") or key == "elapsed"


def numeric_keys(rows: list[dict]) -> list[str]:
    """Keys with a finite number in some row, in the order they first appear."""
    seen: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            if key not in seen and finite(value) is not None:
                seen[key] = None
    return list(seen)


def accuracy_key(rows: list[dict], metric: str | None = None) -> str | None:
    """The accuracy to draw: `metric` (the recipe's target metric) where rows have it, else
    the first of ACCURACY_KEYS they have."""
    keys = set(numeric_keys(rows))
    for key in ((metric,) if metric else ()) + ACCURACY_KEYS:
        if key in keys:
            return key
    return None


def loss_keys(rows: list[dict]) -> list[str]:
    """Every loss key the rows have: train_loss, test_loss first."""
    found = [k for k in numeric_keys(rows) if is_loss(k)]
    return sorted(found, key=lambda k: (LOSS_ORDER.index(k) if k in LOSS_ORDER
                                        else len(LOSS_ORDER), found.index(k)))


def _ordered(rows: list[dict], clock: bool = False) -> tuple[list[str], list[str]]:
    """(main columns, the rest) of the numeric keys, in table order. `clock`: the table has
    its ELAPSED column, so the recipes' own clocks (wall_time, elapsed: since their process
    started, which a resumed job restarts) are left to --csv and --json (one time
    column, not two that disagree)."""
    hidden = ("time", "epochs") + (("wall_time", "elapsed") if clock else ())
    keys = [k for k in numeric_keys(rows) if k not in hidden]
    main = [k for k in FIRST if k in keys]
    main += [k for k in keys if k not in main and is_loss(k)]
    main += [k for k in keys if k not in main and is_accuracy(k)]
    rest = [k for k in KEPT_LONGEST if k in keys]
    rest += [k for k in keys if k not in main and k not in rest]
    return main, rest


# -- the table --------------------------------------------------------------------------------

# Beyond these a finite number is no accuracy, duration or time a job meant (1e308
# showed as `inf%`, -1e308 seconds as 300 digits): shown as "-".
MAX_ACCURACY = 100.0  # a fraction, or a percentage some scripts write
MAX_SECONDS = 1e9  # about 30 years
TIMES = (0.0, 1e11)  # unix seconds, 1970 to the year 5138


def _within(v: float | None, low: float, high: float) -> float | None:
    return v if v is not None and low <= v <= high else None


def cell(key: str, value) -> str:
    """One value of a metrics row as a table cell."""
    v = finite(value)
    if v is None:
        return "-" if value is None else cells.number(value)  # short plain text
    if is_accuracy(key):
        return cells.pct(_within(v, -MAX_ACCURACY, MAX_ACCURACY))
    if is_seconds(key):
        return cells.duration(_within(v, 0.0, MAX_SECONDS))
    if isinstance(value, int) and abs(value) < 10 ** 12:
        return str(value)
    return cells.number(v)


def _drop_order(main: list[str], rows: list[dict], after: int) -> dict[str, int]:
    """In a terminal too narrow for every column (ELAPSED wrapped at 60 columns), the
    main columns go after the `after` others: the other losses first, then the training
    accuracies, train_loss, ELAPSED and the other accuracies; the epoch (and run) and the
    first accuracy stay."""
    kept = accuracy_key(rows)
    losses = [k for k in main if is_loss(k) and k != "train_loss"]
    trained = [k for k in main if is_accuracy(k) and k.startswith("train")]
    accuracies = [k for k in main if is_accuracy(k) and k not in trained and k != kept]
    order = losses[::-1] + trained[::-1] + [k for k in main if k == "train_loss"] + \
        ["ELAPSED"] + accuracies[::-1]
    order += [k for k in main if k not in order and k not in ("run", "epoch", kept)]
    return {k: after + 1 + i for i, k in enumerate(order)}


def _job_table(job: JobMetrics, width: int | None) -> list[str]:
    out = [f"job {cells.printable(job.label)}"]
    rows = job.epochs
    if rows:
        times = [_within(finite(r.get("time")), *TIMES) for r in rows]
        t0 = job.start()  # ELAPSED: since the job started
        main, rest = _ordered(rows, clock=t0 is not None)
        runs = {r.get("run") for r in rows}
        if len(runs) < 2 and "run" in main:
            main.remove("run")  # one run (resnet9 writes run 0 always): no column for it
        drop = _drop_order(main, rows, len(rest))
        cols = [cells.Col(k.upper(), right=k != "epoch", drop=drop.get(k, 0)) for k in main]
        if t0 is not None:
            cols.append(cells.Col("ELAPSED", right=True, drop=drop["ELAPSED"]))
        cols += [cells.Col(k.upper(), right=True, drop=len(rest) - i)
                 for i, k in enumerate(rest)]
        body = []
        for row, t in zip(rows, times):
            line = [cells.epoch_text(row) if k == "epoch" else cell(k, row.get(k))
                    for k in main]
            if t0 is not None:
                line.append("-" if t is None else
                            cells.duration(_within(t - t0, 0.0, MAX_SECONDS)))
            line += [cell(k, row.get(k)) for k in rest]
            body.append(line)
        out.append(cells.grid(cols, body, width=width))
    for event in job.events[:MAX_EVENTS_SHOWN]:
        detail = ", ".join(f"{cells.printable(k)} {cell(k, v)}" for k, v in event.items()
                           if k not in ("event", "time"))
        out += cells.wrapped(f"event {cells.shown(event.get('event'))}"
                               + (f": {detail}" if detail else ""), width, "", "  ")
    if len(job.events) > MAX_EVENTS_SHOWN:
        out.append(f"... and {len(job.events) - MAX_EVENTS_SHOWN} more events (--json)")
    if not rows:
        out.append("no metric rows")
    out += [f"note: {cells.printable(n)}" for n in job.notes]
    return out


def table(jobs: list[JobMetrics], *, width: int | None = None) -> str:
    """`cloudtrain metrics`: each job's rows as a table under its id, its events below it.
    `width`: the terminal's, which each table fits (None: every column in full)."""
    return "\n\n".join("\n".join(_job_table(job, width)) for job in jobs)


# -- CSV and JSON -----------------------------------------------------------------------------

# A cell that starts with one of these is a formula to a spreadsheet (OWASP "CSV injection");
# a string from a metrics row is untrusted, so it is prefixed with ' as spreadsheets expect.
FORMULA_START = ("=", "+", "-", "@")


def csv_keys(jobs: list[JobMetrics]) -> list[str]:
    """The CSV's columns after `job`: numeric keys in table order, then string-only ones."""
    rows = [r for job in jobs for r in job.rows]
    main, rest = _ordered(rows)
    keys = main + [k for k in ("epochs", "time") if k in numeric_keys(rows)] + rest
    for row in rows:
        keys += [k for k in row if k not in keys]
    return [k for k in keys if k != "job"]  # ours: the job id


def _csv_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value if value.startswith(FORMULA_START) else value
    return "" if value is None else repr(value)  # repr: a float reads back exactly


def to_csv(jobs: list[JobMetrics]) -> str:
    """`metrics --csv`: one row per metrics row of every job, a `job` column first."""
    keys = csv_keys(jobs)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["job", *keys])
    for job in jobs:
        for row in job.rows:
            writer.writerow([job.job, *(_csv_value(row.get(k)) for k in keys)])
    return buf.getvalue()


def to_json(jobs: list[JobMetrics]) -> str:
    """`metrics --json`: [{id, name, rows, events, notes}], rows as read (cleaned); the job's
    id is `id`, as in status --json."""
    return json.dumps([{"id": j.job, "name": j.name, "rows": j.rows, "events": j.events,
                        "notes": j.notes} for j in jobs], indent=1)


# -- the sparkline ----------------------------------------------------------------------------

def sparkline(values, width: int = 20, *, low: float | None = None,
              high: float | None = None) -> str:
    """`values` as at most `width` blocks ▁..█ (what is not a finite number is skipped; more
    values than `width` are averaged in `width` equal runs). The scale is low..high, by
    default the values' own range; a constant series is a line of ▄."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise UsageError(f"a sparkline is at least 1 block wide, not {config.shown(width)}")
    xs = [v for v in (finite(x) for x in values) if v is not None]
    if not xs:
        return ""
    if len(xs) > width:
        n = len(xs)
        xs = [_mean(xs[i * n // width:(i + 1) * n // width]) for i in range(width)]
    lo = min(xs) if finite(low) is None else finite(low)
    hi = max(xs) if finite(high) is None else finite(high)
    if not hi > lo:
        return BLOCKS[3] * len(xs)
    # hi - lo of two huge floats overflows to inf: then measure in halves (which would round
    # a span of the tiniest floats, 5e-324 - 0, down to nothing).
    half = 1.0 if math.isfinite(hi - lo) else 0.5
    span = hi * half - lo * half
    top = len(BLOCKS) - 1
    out = []
    for v in xs:
        f = min(max((v * half - lo * half) / span, 0.0), 1.0)
        out.append(BLOCKS[min(int(f * len(BLOCKS)), top)])
    return "".join(out)


def _mean(xs: list[float]) -> float:
    m = sum(x / len(xs) for x in xs)  # each term divided first: the sum cannot overflow
    return min(max(m, min(xs)), max(xs))  # rounding stays inside the run's own range


def _last_run(rows: list[dict]) -> list[dict]:
    last = rows[-1].get("run") if rows else None
    return [r for r in rows if r.get("run") == last]


def accuracy_trend(rows: list[dict], *, metric: str | None = None, width: int = 20) -> str | None:
    """`status JOB`: the accuracy so far as one line, e.g. `test_acc ▁▃▅▆▇██ 94.02%`
    (the latest run of a multi-run job, an epoch once); None when the rows hold no
    accuracy."""
    rows = _last_run(JobMetrics(job="", rows=rows).epochs)
    key = accuracy_key(rows, metric)
    if key is None:
        return None
    values = [v for v in (finite(r.get(key)) for r in rows) if v is not None]
    fraction = all(0 <= v <= 1 for v in values)  # on 0..1 the height means the same each time
    line = sparkline(values, width, low=0.0 if fraction else None,
                     high=1.0 if fraction else None)
    return f"{cells.printable(key)} {line} {cells.pct(values[-1])}"
