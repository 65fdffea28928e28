"""Training curves drawn (issue 16, `cloudtrain plot`): loss and accuracy against epoch and
wall time, one colour per job, written as .png, .svg or .pdf. The metrics come read and
cleaned by curves.py (a `JobMetrics` in, a file out); matplotlib is imported only by `plot`.

It imports curves, cells and config.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from . import cells, config
from .curves import JobMetrics, accuracy_key, loss_keys, numeric_keys
from .errors import UsageError
from .host.job_status import as_time as finite  # a finite float (not a bool), else None

PLOT_LIMIT = 1e12  # |value| past this is left off a plot (it would flatten every curve)
# Where the wall-clock axis comes from: the first key any row has; (key, seconds per unit,
# whether it is an absolute unix time to measure from the job's start, JobMetrics.start).
TIME_SOURCES = (("time", 1.0, True), ("wall_time", 1.0, False), ("elapsed", 1.0, False),
                ("hours", 3600.0, False))
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


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
        label = job.label if len(runs) == 1 else f"{job.label} run {cells.shown(run)}"
        curves.append(_Curve(label, by_epoch, by_time))
    return curves


def _text(text) -> str:
    """Text for a figure: one printable line, each "$" escaped (matplotlib reads text between
    two of them as TeX, and a job name like "a$b$" would be parsed, or fail to be)."""
    return cells.printable(text).replace("$", r"\$")


def _legend_text(text) -> str:
    # matplotlib leaves out of a legend every label that starts with "_".
    text = _text(text)
    return " " + text if text.startswith("_") else text


def _format(out: Path) -> str:
    fmt = FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise UsageError(f"cannot write a plot as {cells.printable(out.name)}: the name must "
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
        raise UsageError(cells.printable(
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

    colours = matplotlib.colormaps["tab10"].colors  # type: ignore[attr-defined]  # a ListedColormap
    styles = ("-", "--", ":", "-.")
    plotted: dict[str, list] = {"loss": [], "acc": []}
    with matplotlib.rc_context({"svg.hashsalt": "cloudtrain"}):  # the same job, the same SVG
        fig = Figure(figsize=(12, 8), dpi=100, layout="constrained")
        (loss_e, acc_e), (loss_t, acc_t) = fig.subplots(2, 2)
        for n, drawn_job in enumerate(prepared):
            colour = colours[n % len(colours)]
            runs = f" ({len(drawn_job.curves)} runs)" if len(drawn_job.curves) > 1 else ""
            for i, curve in enumerate(drawn_job.curves):
                line = dict(color=colour, lw=1.5, alpha=1.0 if len(drawn_job.curves) == 1 else 0.6)
                accs = [drawn_job.acc] if drawn_job.acc else []
                for ax_e, ax_t, keys, kind in ((loss_e, loss_t, drawn_job.losses, "loss"),
                                               (acc_e, acc_t, accs, "acc")):
                    for j, key in enumerate(keys):
                        base = drawn_job.label if kind == "acc" else f"{drawn_job.label} {key}"
                        label = _legend_text(base + runs) if i == 0 else "_nolegend_"
                        xs, ys = curve.by_epoch[key]
                        if xs:
                            ax_e.plot(xs, ys, label=label, ls=styles[j % len(styles)],
                                      marker="o" if len(xs) <= 30 else None, ms=3, **line)
                            plotted[kind] += ys
                        txs, tys = curve.by_time.get(key, ((), ()))
                        if txs:
                            ax_t.plot([x / 60 for x in txs] if hours else txs, tys, label=label,
                                      ls=styles[j % len(styles)], **line)
                            plotted[kind] += tys
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
    target_label = ("target " + (cells.pct(target) if 0 < target <= 1 else cells.number(target))
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
        raise UsageError(f"cannot write {cells.printable(out)}: {exc.strerror or exc}",
                         hint="-o must name a file in a directory you can write") from None
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass
