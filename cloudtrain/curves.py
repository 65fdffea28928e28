"""Training curves (issue 16): a job's metrics.jsonl as a per-epoch table (text, CSV, JSON),
as plots of loss and accuracy against epoch and wall time, and as a one-line sparkline.

Pure functions: a `JobMetrics` in, text or a file out. Everything in metrics.jsonl was written
by the job's own code or by whoever controls its host (audit F19), so it is read under guard:
a line that is not a JSON object, a value that is not a finite number, bool or short string,
a partial last line, a file past MAX_BYTES: each is dropped, never raised. Each row is cut
to the schema `hostdata.clean_row` keeps. matplotlib is imported only by `plot`.

The contract with the code that writes the file is METRICS_CONTRACT below (also in the
README).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from pathlib import Path

from . import config, render
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
PLOT_LIMIT = 1e12  # |value| past this is left off a plot (it would flatten every curve)

# Which key is the accuracy, by preference: the recipes' top-1 is test_acc (imagenet writes
# top5 beside it); the recipe's own target metric comes first when the caller names it.
ACCURACY_KEYS = ("test_acc", "top1", "val_acc", "acc", "accuracy", "top5")
LOSS_ORDER = ("train_loss", "test_loss", "val_loss", "loss")
# The first columns of the table, in this order; then other losses, other accuracies, the
# time since the job started, then everything else (the first to go in a narrow terminal).
FIRST = ("run", "epoch", "train_loss", "test_loss", "train_acc", "test_acc", "top1", "top5")
KEPT_LONGEST = ("lr", "step")
# Where the wall-clock axis comes from: the first key any row has; (key, seconds per unit,
# whether it is an absolute unix time to measure from the job's start, JobMetrics.start).
TIME_SOURCES = (("time", 1.0, True), ("wall_time", 1.0, False), ("elapsed", 1.0, False),
                ("hours", 3600.0, False))
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
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
        What the table, the plot and the sparkline show (U19); --csv and --json keep every
        row as written."""
        out: list[dict] = []
        where: dict[tuple, int] = {}
        for row in self.rows:
            epoch = finite(row.get("epoch"))
            if epoch is None:
                out.append(row)
                continue
            key = (row.get("run"), epoch)
            if key in where:
                merged = {**out[where[key]], **row}
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
    try:  # a job may leave a FIFO or a link to /dev/zero there (F34): refused at once
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
    rows, events, junk = [], [], 0
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
    `started_at`: when the job started (ELAPSED and the plot's clock count from it, U10);
    `finished`: the job has ended, so a missing file will not come (U19)."""
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
    started, which a resumed job restarts) are left to --csv and --json (U10: one time
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

# Beyond these a finite number is no accuracy, duration or time a job meant (audit F38: 1e308
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
        return "-" if value is None else render.number(value)  # short plain text
    if is_accuracy(key):
        return render.pct(_within(v, -MAX_ACCURACY, MAX_ACCURACY))
    if is_seconds(key):
        return render.duration(_within(v, 0.0, MAX_SECONDS))
    if isinstance(value, int) and abs(value) < 10 ** 12:
        return str(value)
    return render.number(v)


def _job_table(job: JobMetrics, width: int | None) -> list[str]:
    out = [f"job {render._printable(job.label)}"]
    rows = job.epochs
    if rows:
        times = [_within(finite(r.get("time")), *TIMES) for r in rows]
        t0 = job.start()  # ELAPSED: since the job started (U10)
        main, rest = _ordered(rows, clock=t0 is not None)
        runs = {r.get("run") for r in rows}
        if len(runs) < 2 and "run" in main:
            main.remove("run")  # one run (resnet9 writes run 0 always): no column for it
        cols = [render.Col(k.upper(), right=k != "epoch") for k in main]
        if t0 is not None:
            cols.append(render.Col("ELAPSED", right=True))
        cols += [render.Col(k.upper(), right=True, drop=len(rest) - i)
                 for i, k in enumerate(rest)]
        body = []
        for row, t in zip(rows, times):
            line = [render.epoch_text(row) if k == "epoch" else cell(k, row.get(k))
                    for k in main]
            if t0 is not None:
                line.append("-" if t is None else
                            render.duration(_within(t - t0, 0.0, MAX_SECONDS)))
            line += [cell(k, row.get(k)) for k in rest]
            body.append(line)
        out.append(render.grid(cols, body, width=width))
    for event in job.events[:MAX_EVENTS_SHOWN]:
        detail = ", ".join(f"{render._printable(k)} {cell(k, v)}" for k, v in event.items()
                           if k not in ("event", "time"))
        out += render._wrapped(f"event {render._shown(event.get('event'))}"
                               + (f": {detail}" if detail else ""), width, "", "  ")  # U31
    if len(job.events) > MAX_EVENTS_SHOWN:
        out.append(f"... and {len(job.events) - MAX_EVENTS_SHOWN} more events (--json)")
    if not rows:
        out.append("no metric rows")
    out += [f"note: {render._printable(n)}" for n in job.notes]
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
    id is `id`, as in status --json (U25)."""
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
    return f"{render._printable(key)} {line} {render.pct(values[-1])}"


# -- the plot ---------------------------------------------------------------------------------

@dataclasses.dataclass
class _Curve:
    """One run of one job, ready to draw: x values and, per key, y values."""
    label: str
    by_epoch: dict[str, tuple[list[float], list[float]]]
    by_time: dict[str, tuple[list[float], list[float]]]


def _points(pairs) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for x, y in pairs:
        if x is not None and y is not None and abs(x) <= PLOT_LIMIT and abs(y) <= PLOT_LIMIT:
            xs.append(x)
            ys.append(y)
    return xs, ys


def _curves(job: JobMetrics, keys: list[str], x_key: str | None,
            clock: tuple[str, float, bool] | None) -> list[_Curve]:
    """The job's rows split by run, each as points against `x_key` and the wall clock
    (minutes since the job started, JobMetrics.start)."""
    t0 = job.start() if clock and clock[2] else None
    runs: dict[object, list[dict]] = {}
    for row in job.epochs:
        run = row.get("run")
        runs.setdefault(run if finite(run) is not None else None, []).append(row)
    curves = []
    for run, rows in runs.items():
        latest: dict[float, dict] = {}  # epoch -> its last row (a resumed job redoes epochs)
        for row in rows:
            x = finite(row.get(x_key)) if x_key else None
            if x is not None:
                latest[x] = row
        ordered = sorted(latest.items())
        by_epoch, by_time = {}, {}
        for key in keys:
            by_epoch[key] = _points((x, finite(r.get(key))) for x, r in ordered)
            if clock:
                name, unit, absolute = clock
                minutes = []
                for r in rows:
                    t = finite(r.get(name))
                    minutes.append(None if t is None else
                                   ((t - t0) if absolute else t) * unit / 60)
                by_time[key] = _points(zip(minutes, (finite(r.get(key)) for r in rows)))
        label = job.label if len(runs) == 1 else f"{job.label} run {render._shown(run)}"
        curves.append(_Curve(label, by_epoch, by_time))
    return curves


def _text(text) -> str:
    """Text for a figure: one printable line, each "$" escaped (matplotlib reads text between
    two of them as TeX, and a job name like "a$b$" would be parsed, or fail to be)."""
    return render._printable(text).replace("$", r"\$")


def _legend_text(text) -> str:
    # matplotlib leaves out of a legend every label that starts with "_".
    text = _text(text)
    return " " + text if text.startswith("_") else text


def _format(out: Path) -> str:
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise UsageError(f"cannot write a plot as {render._printable(out.name)}: the name must "
                         "end in .png, .svg or .pdf", hint="cloudtrain plot JOB -o curves.png")
    return fmt


@dataclasses.dataclass
class _Job:
    """A job as it is drawn: which keys, and its curves (one per run)."""
    label: str
    acc: str | None
    losses: list[str]
    x_key: str | None  # epoch, else step, else None (not on the epoch plots)
    clock: str | None  # the row key the wall-clock axis comes from
    curves: list[_Curve]


def _prepare(job: JobMetrics, metric: str | None, notes: list[str]) -> _Job:
    acc = accuracy_key(job.rows, metric)
    if metric and acc != metric:
        notes.append(f"{job.label}: no {metric} in its rows"
                     + (f"; {acc} drawn instead" if acc else ""))
    losses = loss_keys(job.rows)
    keys = set(numeric_keys(job.rows))
    x_key = next((k for k in ("epoch", "step") if k in keys), None)
    clock = next((c for c in TIME_SOURCES if c[0] in keys), None)
    if x_key is None:
        notes.append(f"{job.label}: no epoch or step in its rows, left off the epoch plots")
    if clock is None:
        notes.append(f"{job.label}: no time in its rows, left off the time plots")
    curves = _curves(job, losses + ([acc] if acc else []), x_key, clock)
    return _Job(job.label, acc, losses, x_key, clock and clock[0], curves)


def plot(jobs: list[JobMetrics], out, *, target: float | None = None,
         metric: str | None = None, title: str | None = None) -> list[str]:
    """`cloudtrain plot`: loss and accuracy against epoch (top) and wall-clock time since each
    job started (bottom; since its first row where its start is not known), one colour per
    job, `target` (the recipe's target accuracy, on `metric`) as a dotted line; written to `out` (.png, .svg or .pdf) atomically. A job with
    no metric rows is left out, with a note; with none left, a UsageError. Returns notes."""
    out = Path(out)
    fmt = _format(out)
    if target is not None:
        target = config.finite(target, "the target accuracy", low=0, high=100)
    if not jobs:
        raise UsageError("give at least one job to plot", hint="cloudtrain plot JOB -o curves.png")
    notes, drawn = [], []
    for job in jobs:
        if job.rows:
            drawn.append(job)
            notes += [f"{job.label}: {n}" for n in job.notes]
        elif len(jobs) > 1:
            why = f" ({job.notes[0]})" if job.notes else ""
            notes.append(f"{job.label}: no metric rows{why}, left out of the plot")
    if not drawn:
        why = f" ({jobs[0].notes[0]})" if len(jobs) == 1 and jobs[0].notes else ""
        raise UsageError(render._printable(
            (f"job {jobs[0].label} has no metric rows to plot" if len(jobs) == 1 else
             "none of these jobs has metric rows to plot") + why),
            hint="cloudtrain metrics JOB shows what its metrics.jsonl holds")
    prepared = [_prepare(job, metric, notes) for job in drawn]

    # Minutes on the time axis; hours when a job ran for more than three.
    longest = max((abs(x) for p in prepared for c in p.curves for xs, _ in c.by_time.values()
                   for x in xs), default=0.0)
    hours = longest > 180

    import matplotlib
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no display, no globals

    colours = matplotlib.colormaps["tab10"].colors
    styles = ("-", "--", ":", "-.")
    plotted = {"loss": [], "acc": []}
    with matplotlib.rc_context({"svg.hashsalt": "cloudtrain"}):  # the same job, the same SVG
        fig = Figure(figsize=(12, 8), dpi=100, layout="constrained")
        (loss_e, acc_e), (loss_t, acc_t) = fig.subplots(2, 2)
        for n, job in enumerate(prepared):
            colour = colours[n % len(colours)]
            runs = f" ({len(job.curves)} runs)" if len(job.curves) > 1 else ""
            for i, curve in enumerate(job.curves):
                line = dict(color=colour, lw=1.5, alpha=1.0 if len(job.curves) == 1 else 0.6)
                for ax_e, ax_t, keys, kind in ((loss_e, loss_t, job.losses, "loss"),
                                               (acc_e, acc_t, [job.acc] if job.acc else [],
                                                "acc")):
                    for j, key in enumerate(keys):
                        base = job.label if kind == "acc" else f"{job.label} {key}"
                        label = _legend_text(base + runs) if i == 0 else "_nolegend_"
                        xs, ys = curve.by_epoch[key]
                        if xs:
                            ax_e.plot(xs, ys, label=label, ls=styles[j % len(styles)],
                                      marker="o" if len(xs) <= 30 else None, ms=3, **line)
                            plotted[kind] += ys
                        xs, ys = curve.by_time.get(key, ((), ()))
                        if xs:
                            ax_t.plot([x / 60 for x in xs] if hours else xs, ys, label=label,
                                      ls=styles[j % len(styles)], **line)
                            plotted[kind] += ys
        _finish((loss_e, acc_e, loss_t, acc_t), prepared, plotted, target, hours)
        if title is not None:
            fig.suptitle(_text(title))
        _save(fig, out, fmt)
    return notes


def _finish(axes, prepared: list[_Job], plotted: dict, target: float | None,
            hours: bool) -> None:
    """Labels, scales, the target line and the legends."""
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    loss_e, acc_e, loss_t, acc_t = axes
    x_names = sorted({p.x_key for p in prepared if p.x_key})
    acc_names = sorted({p.acc for p in prepared if p.acc})
    clocks = [p.clock for p in prepared if p.clock]
    x_label = " / ".join(x_names) or "epoch"
    acc_label = _text("accuracy" + (f" ({', '.join(acc_names)})" if acc_names else ""))
    time_label = f"wall clock, {'hours' if hours else 'minutes'} since the job started"
    if target is not None and target > 1 and plotted["acc"] and \
            all(0 <= a <= 1 for a in plotted["acc"]):
        target = target / 100  # --target 94 over accuracies written as fractions
    target_label = ("target " + (render.pct(target) if 0 < target <= 1 else render.number(target))
                    if target is not None else "")
    for ax, kind, xl in ((loss_e, "loss", x_label), (acc_e, "acc", x_label),
                         (loss_t, "loss", time_label), (acc_t, "acc", time_label)):
        ax.set_xlabel(xl)
        ax.set_ylabel("loss" if kind == "loss" else acc_label)
        ax.grid(True, alpha=0.3)
        if not ax.lines:
            what = ("no time in metrics.jsonl" if ax in (loss_t, acc_t) and not clocks else
                    f"no {'loss' if kind == 'loss' else 'accuracy'} in metrics.jsonl")
            ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes,
                    color="0.4")
        if target is not None and kind == "acc":
            ax.axhline(target, color="0.25", ls=":", lw=1.2, label=target_label)
    for ax in (loss_e, acc_e):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and steps are whole
    losses = plotted["loss"]
    if losses and min(losses) > 0 and max(losses) / min(losses) > 30:
        loss_e.set_yscale("log")  # a first-epoch test loss of 48 flattens a curve ending at 0.4
        loss_t.set_yscale("log")
    accs = plotted["acc"] + ([target] if target is not None else [])
    if accs and all(0 <= a <= 1 for a in accs):
        for ax in (acc_e, acc_t):
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    for ax, where in ((loss_e, "upper right"), (acc_e, "lower right")):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc=where)


def _save(fig, out: Path, fmt: str) -> None:
    """Write next to `out`, then rename: a reader (or a browser reloading it) never sees half
    a file, and a failed plot leaves any earlier one in place."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, format=fmt)
        os.replace(tmp, out)
    except OSError as exc:
        raise UsageError(f"cannot write {render._printable(out)}: {exc.strerror or exc}",
                         hint="-o must name a file in a directory you can write") from None
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass
