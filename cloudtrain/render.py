"""Text and JSON for what the commands return. Pure functions: data in, strings out."""

from __future__ import annotations

import dataclasses
import json
import math
import time

from .host.agent import as_time as _finite  # a finite float, else None
from .host.agent import fmt_duration
from .market import Market
from .state import Job


# Values shown here can come from a job's own metrics rows and status.json (audit F19: a
# string accuracy, NaN or Infinity took `status` away). Every formatter takes anything and
# answers with text; what is not a finite number is shown as "-" or as short plain text.
MAX_SHOWN = 40


def _shown(value) -> str:
    """A value that is not a number, as one short line of plain text."""
    if value is None:
        return "-"
    if isinstance(value, float):  # NaN, inf
        return str(value)
    text = "".join(c if c.isprintable() else " " for c in str(value)[:MAX_SHOWN * 2])
    return text[:MAX_SHOWN - 3] + "..." if len(text) > MAX_SHOWN else text


def _printable(text: str) -> str:
    """A file name as one line that cannot steer the terminal (a name may hold escapes)."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


def error_line(text: str) -> str:
    """An error's message (or hint) as one line: a newline, an escape or another control
    character it quotes from the input is shown as \\n, \\x1b, ..., never acted on (B2: an env
    name holding a newline split its error over two lines)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in str(text))


def duration(seconds) -> str:
    s = _finite(seconds)
    if s is None:
        return _shown(seconds)
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


def money(value) -> str:
    v = _finite(value)
    return _shown(value) if v is None else f"${v:,.2f}"


def job_cost(job: Job) -> str:
    """Settled costs as they are; estimates (still running, prices not yet known) with ~."""
    if job.cost is None:
        return "-"
    return money(job.cost) if job.cost_settled else "~" + money(job.cost)


def pct(value) -> str:
    v = _finite(value)
    if v is not None and not math.isfinite(v * 100):  # 1e308 is finite; 1e310 % is not
        return "-"
    return _shown(value) if v is None else f"{v * 100:.2f}%"


def number(value) -> str:
    v = _finite(value)
    return _shown(value) if v is None else f"{v:.4g}"


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
    return f"{_shown(metrics['epoch'])}/{_shown(total)}" if total else _shown(metrics["epoch"])


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
                "pending": "yellow", "recovering": "yellow", "preempted": "magenta",
                "cancelled": "dim"}


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
         styles: dict[str, object] | None = None) -> str:
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
    console = Console(file=io.StringIO(), width=total, color_system="standard" if color else None,
                      force_terminal=color, no_color=not color, highlight=False, emoji=False,
                      markup=False, legacy_windows=False)
    console.print(t)
    return "\n".join(line.rstrip() for line in console.file.getvalue().rstrip("\n").split("\n"))


# In a narrow terminal LOSS goes first, then BACKEND, EPOCH, RUNTIME and ACC; NAME and WHAT
# are cut with an ellipsis; ID, STATE, AGE and COST always show in full.
STATUS_COLUMNS = [Col("ID"), Col("NAME", cut=10), Col("WHAT", cut=14), Col("BACKEND", drop=2),
                  Col("STATE"), Col("AGE"), Col("RUNTIME", drop=4), Col("EPOCH", drop=3),
                  Col("LOSS", drop=1), Col("ACC", drop=5), Col("COST")]
STATUS_HEADER = [c.header for c in STATUS_COLUMNS]


def status_table(jobs: list[Job], now: float | None = None, *, width: int | None = None,
                 color: bool = False) -> str:
    now = time.time() if now is None else now
    if not jobs:
        return "no jobs yet: cloudtrain launch --recipe resnet9 --profile smoke --follow"
    rows = []
    for job in jobs:
        m = job.metrics if isinstance(job.metrics, dict) else {}
        rows.append([job.id, job.name or "-", job.command, job.backend, state_text(job),
                     age(job.created_at, now), duration(runtime(job, now)),
                     "data" if job.state == "staging" else epoch_text(m),
                     number(m.get("train_loss", m.get("loss"))),
                     pct(m.get("test_acc", m.get("accuracy"))), job_cost(job)])
    return grid(STATUS_COLUMNS, rows, width=width, color=color, styles={"STATE": state_style})


def job_json(job: Job, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    data = dataclasses.asdict(job)
    data["runtime_s"] = runtime(job, now)
    return data


def jobs_json(jobs: list[Job]) -> str:
    now = time.time()
    return json.dumps([job_json(j, now) for j in jobs], indent=1)


def detail_json(job: Job, phases, log_tail: bytes, target: dict | None,
                runs: dict | None = None, attempts: list[dict] | None = None,
                recovery: dict | None = None) -> str:
    data = job_json(job)
    data["timeline"] = [dataclasses.asdict(p) for p in phases]
    data["target"] = target
    data["runs"] = runs
    data["attempts"] = attempts or []
    data["recovery"] = recovery
    from .nodes import records

    data["nodes"] = [{"node": i, "instance": r.get("instance"), "address": r.get("address"),
                      "host": r.get("host"), "agent": r.get("agent"),
                      "collected": bool(r.get("collected"))}
                     for i, r in enumerate(records(job))]
    data["log_tail"] = log_tail.decode("utf-8", "replace")
    return json.dumps(data, indent=1)


def job_detail(job: Job, phases, log_tail: bytes, target: dict | None = None,
               now: float | None = None, runs: dict | None = None,
               attempts: list[dict] | None = None, recovery: dict | None = None,
               width: int | None = None, trend: str | None = None,
               startup: dict | None = None) -> str:
    """`status JOB`; `width`: the terminal's, which its tables fit (None: full length)."""
    now = time.time() if now is None else now
    out = [f"job {job.id}" + (f" ({job.name})" if job.name else ""),
           f"  what      {job.command}",
           *args_lines(job, width),
           f"  backend   {job.backend}",
           f"  state     {job.state}" + (f": {job.reason}" if job.reason else ""),
           ]
    if job.exit_code is not None:
        out.append(f"  exit code {job.exit_code}")
    out += [f"  created   {clock(job.created_at)} ({age(job.created_at, now)} ago)",
            f"  runtime   {duration(runtime(job, now))}",
            f"  cost      {job_cost(job)}" + (" (this machine: nothing billed)"
                                                  if job.backend == "local" else
                                                  ("" if job.cost_settled else " (estimate)"))]
    detail = job.cost_detail or {}
    by_phase = detail.get("phases")  # a dict as cloudtrain writes it; else the row is damaged
    billed_phases = ", ".join(f"{k} {money4(v)}" for k, v in by_phase.items()
                              if v) if isinstance(by_phase, dict) else ""
    if billed_phases:  # a local job's phases cost nothing: no empty line (D35)
        out.append("  by phase  " + billed_phases)
    if detail.get("to_target") is not None and job.backend != "local":  # U29: nothing billed
        out.append(f"  to target {money4(detail['to_target'])}")
    expected = (job.spec or {}).get("expected")
    if expected:
        out.append(f"  estimated {money4(expected.get('usd'))} before launch: training "
                   f"{duration(expected.get('train_s'))} ({expected.get('basis')}), "
                   f"{duration(expected.get('total_s'))} billed")
    notes = detail.get("notes")
    for note in notes if isinstance(notes, list) else []:
        out.append(f"  cost note {note}")
    for name, info in ((job.spec or {}).get("staging") or {}).items():
        out.append(f"  data      {_shown(name)}: {_staged_size(info)}")
    metrics = job.metrics if isinstance(job.metrics, dict) else {}
    if metrics.get("staging"):
        out.append(f"  staging   {_shown(metrics['staging'])}")
    shown = ", ".join(f"{k} {_metric(k, v)}" for k, v in metrics.items()
                      if k not in ("time", "staging"))
    if shown:
        out.append(f"  metrics   {shown}")
    if trend:
        out.append(f"  trend     {trend}")
    if startup:
        out.append(f"  startup   {startup_text(startup)}")
    if isinstance(target, dict) and target:
        accuracies = ", ".join(f"{k} {pct(target.get(k))}" for k in ("top5", "test_acc")
                               if target.get(k) is not None)
        times = ", ".join(f"{label} {duration(target.get(k))}" for k, label in
                          (("train_time", "train time"), ("loop_time", "loop time"))
                          if target.get(k) is not None)
        out.append(f"  target    reached at epoch {target.get('epoch')}: {accuracies}, {times}")
    if isinstance(runs, dict) and runs:
        out.append(f"  runs      {runs.get('runs')}: mean {pct(runs.get('mean_acc'))} (sd "
                   f"{pct(runs.get('std_acc'))}), {runs.get('reached')} of {runs.get('runs')} "
                   f"reached {pct(runs.get('target'))}")
    if job.jobdir:
        out.append(f"  jobdir    {job.jobdir}")
    if attempts and (len(attempts) > 1 or (job.spec or {}).get("recover")):
        out += attempts_lines(attempts, recovery or {}, width=width)
    out += nodes_lines(job, width=width)
    out.append("  timeline")
    for ph in phases:
        took = "" if ph.name in ("succeeded", "failed", "cancelled", "preempted") else (
            duration(ph.duration) if ph.duration is not None else "(now)")
        out.append(f"    {ph.name:<13} {clock(ph.start)}  {took:<8} {ph.detail or ''}".rstrip())
    if log_tail:
        title = "last output" if job.state != "failed" else "last output (failed)"
        out.append(f"  {title}:")
        text = log_tail.decode("utf-8", "replace").rstrip("\n")
        out += ["    " + line for line in text.splitlines()]
    return "\n".join(_fitted(out, width))


def _fitted(lines: list[str], width: int | None) -> list[str]:
    """`status JOB`'s lines wrapped at `width` (U31): a `  key       value` line under its
    value's column, a timeline or output line two spaces in; tables (fitted already) and
    short lines as they are."""
    if width is None:
        return lines
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
        elif line.startswith("  ") and not line.startswith("   ") and line[11:12] == " ":
            out += _wrapped(line[2:], width, "  ", " " * 12)
        else:
            lead = " " * (len(line) - len(line.lstrip(" ")))
            out += _wrapped(line.lstrip(" "), width, lead, lead + "  ")
    return out


def startup_text(row: dict) -> str:
    """A recipe's startup row (issue 17): what came before its first training step."""
    parts = [f"{k.replace('_', '-')} {duration(row[k])}" for k in
             ("import", "data", "warm_up", "compile") if _finite(row.get(k)) is not None]
    first = _finite(row.get("to_first_step"))
    return ", ".join(parts) + (f"; first step {duration(first)} after the start"
                               if first is not None else "")


# The attempts table: the clock columns and the step counts go first in a narrow terminal.
ATTEMPTS_COLS = [Col("#"), Col("INSTANCE"), Col("AZ", drop=6), Col("MARKET", drop=5),
                 Col("STARTED", drop=2), Col("ENDED", drop=1), Col("OUTCOME", cut=7),
                 Col("RESUMED AT", drop=4), Col("LAST STEP", drop=3), Col("REDONE"),
                 Col("COST")]


def attempts_lines(rows: list[dict], totals: dict, width: int | None = None) -> list[str]:
    """A recovering job's attempts: where each ran, how it ended, the step it resumed from,
    the steps redone after it, and what it cost."""
    redone = totals.get("redone_steps") or 0
    head = (f"  attempts  {len(rows)}: {totals.get('interruptions', 0)} interrupted"
            + (f", {redone} steps redone (about {money4(totals.get('redone_usd'))})"
               if redone else ", no work redone"))
    table_rows = []
    for r in rows:
        step = r.get("resumed_step")
        table_rows.append([
            str(r.get("attempt")), _shown(r.get("instance")), _shown(r.get("zone")),
            _shown(r.get("market")), clock(r.get("started_at")),
            clock(r.get("ended_at")) if r.get("ended_at") else "-",
            _shown(r.get("outcome")),
            "-" if r.get("resumed_checkpoint") is None else
            (f"step {step}" if step is not None else f"ckpt {r['resumed_checkpoint']}"),
            _shown(r.get("last_step")), _shown(r.get("redone_steps")),
            money4(r.get("usd")) if r.get("usd") is not None else "-"])
    fitted = grid(ATTEMPTS_COLS, table_rows, width=None if width is None else max(width - 4, 20))
    lines = [head] + ["    " + line for line in fitted.splitlines()]
    for r in rows:
        if r.get("reason") and r.get("outcome") == "interrupted":
            lines.append(f"    {r['attempt']}: {_shown_long(r['reason'])}")
    return lines


NODES_COLS = [Col("NODE"), Col("INSTANCE", cut=10), Col("ADDRESS", drop=2),
              Col("HOST", cut=10, drop=1), Col("STATE"), Col("EXIT", drop=3),
              Col("REASON", cut=10)]


def nodes_lines(job: Job, width: int | None = None) -> list[str]:
    """A job on several machines: each node, where it is and what its agent last said (the
    job's state is theirs combined: one node failing fails the job)."""
    from .nodes import records

    recs = records(job)
    if len(recs) < 2:
        return []
    rows = []
    for i, rec in enumerate(recs):
        agent = rec.get("agent") if isinstance(rec.get("agent"), dict) else {}
        where = rec.get("host") or ("this machine" if rec.get("kind") == "LocalHost" else "-")
        rows.append([str(i) + (" (rendezvous)" if i == 0 else ""), _shown(rec.get("instance")),
                     _shown(rec.get("address")), _shown(where),
                     _shown(agent.get("state") or ("collected" if rec.get("collected")
                                                   else "-")),
                     _shown(agent.get("exit_code")), _shown_long(agent.get("reason") or "")])
    fitted = grid(NODES_COLS, rows, width=None if width is None else max(width - 4, 20))
    return [f"  nodes     {len(recs)} (logs of node i: cloudtrain logs {job.id} --node i)"] + \
        ["    " + line for line in fitted.splitlines()]


def _shown_long(text) -> str:
    return "".join(c if c.isprintable() else " " for c in str(text)[:300])


def supervisor_line(info: dict, needed: bool = True) -> str:
    """The supervisor in one line; "NOT running" in capitals only when a recovering job needs
    it (U35: with nothing to watch, not running is how it should be)."""
    if not info.get("running"):
        if not needed:
            return "supervisor: not running (no recovering spot job needs it)"
        return "supervisor: NOT running (any cloudtrain command restarts it while a recovering " \
               "job needs it)"
    beat = info.get("heartbeat_at")
    seen = f", last round {age(beat, time.time())} ago" if _finite(beat) is not None else ""
    creds = f"; AWS credentials from {info['credentials']}" if info.get("credentials") else ""
    return (f"supervisor: running (pid {info.get('pid')}, watching {info.get('watching') or 0} "
            f"job(s){seen}{creds}; tmux -L {info.get('tmux_socket') or 'cloudtrain'} attach -t "
            f"{info.get('session')})")


def whole(number):
    """A count as an int where it is whole (JSON's `gpus: 1`, not 1.0); a fraction as is."""
    return int(number) if isinstance(number, float) and number.is_integer() else number


def catalog_json(types, region: str, snapshot: str, on_demand_source: str,
                 spot_source: str) -> str:
    """`catalog --json`: each type under `instance_type`, as estimate --json names it (U25)."""
    out = []
    for t in types:
        data = dataclasses.asdict(t)
        data = {"instance_type": data.pop("name"), **data}
        data["gpus"] = whole(data["gpus"])
        out.append(data)
    return json.dumps({"snapshot": snapshot, "region": region,
                       "on_demand_source": on_demand_source, "spot_source": spot_source,
                       "types": out}, indent=1)


def supervisor_json(info: dict) -> str:
    return json.dumps(info, indent=1)


def _staged_size(info) -> str:
    if not isinstance(info, dict):
        return "?"
    size = info.get("file_bytes") or info.get("bytes")
    text = f"{size / 1e9:.1f} GB" if isinstance(size, (int, float)) else "size unknown"
    if info.get("files"):
        text += f", {info['files']:,} files"
    return text + f" ({info.get('kind', '?')})"


def _metric(key, value) -> str:
    if isinstance(value, float):
        key = str(key)
        if key.endswith("_acc") or key.endswith("accuracy") or key in ("top5", "train_top5"):
            return pct(value)
        if key.endswith("_time"):
            return duration(value)
        return number(value)
    return _shown(value)


def _published_text(pub: dict) -> str:
    return " / ".join(str(pub[k]) for k in ("result", "time", "hardware") if pub.get(k))


RECIPES_COLUMNS = [Col("RECIPE"), Col("GPUS"), Col("DESCRIPTION", cut=24),
                   Col("PUBLISHED RESULT", cut=16, drop=1)]


def recipes_table(recipes, *, width: int | None = None) -> str:
    rows = [[r.name, str(r.gpus), r.description,
             _published_text(r.published[0]) if r.published else "-"] for r in recipes]
    return grid(RECIPES_COLUMNS, rows, width=width)


def recipes_json(recipes) -> str:
    """`recipes --json`: one object per recipe (D37)."""
    return json.dumps([{"name": r.name, "gpus": r.gpus, "description": r.description,
                        "published": r.published, "profiles": sorted(r.profiles)}
                       for r in recipes], indent=1)


def recipe_json(r) -> str:
    """`recipes NAME --json`: the recipe's arguments, profiles, resources and sources."""
    return json.dumps({
        "name": r.name, "description": r.description, "entry": str(r.path / r.entry),
        "resources": r.resources, "target": r.target,
        "arguments": [{"name": a.name, "type": a.type, "choices": a.choices,
                       "default": a.default, "help": a.help} for a in r.arguments.values()],
        "profiles": r.profiles, "data": r.data, "published": r.published}, indent=1,
        default=str)


def _wrapped(text: str, width: int | None, indent: str, later: str | None = None) -> list[str]:
    """`text` after `indent`, wrapped at `width` (None: one line), later lines at `later`."""
    import textwrap

    text = _cell(text)
    if width is None:
        return [indent + text]
    return textwrap.wrap(text, width=max(width, len(indent) + 20), initial_indent=indent,
                         subsequent_indent=indent if later is None else later,
                         break_on_hyphens=False) or [indent.rstrip()]


def _argument_kind(a) -> str:
    return a.type if a.type != "choice" else " | ".join(str(c) for c in a.choices or [])


def _argument_default(a) -> str:
    return "none (auto)" if a.default is None else a.render(a.default)


ARGUMENT_COLUMNS = [Col("NAME"), Col("TYPE", cut=14, wrap=True), Col("DEFAULT", cut=11, wrap=True),
                    Col("HELP", cut=40, wrap=True)]
INDENT = "    "


def _arguments_lines(r, width: int | None) -> list[str]:
    """The arguments as a table, the help in its own column; in a terminal too narrow for a
    readable help column, each help text wrapped on the lines under its argument."""
    args = list(r.arguments.values())
    rows = [[a.name, _argument_kind(a), _argument_default(a), a.help] for a in args]
    inner = None if width is None else width - len(INDENT)
    text = grid(ARGUMENT_COLUMNS, rows, width=inner)
    if inner is None or max(len(line) for line in text.splitlines()) <= inner:
        return [INDENT + line if line else line for line in text.splitlines()]
    head = grid(ARGUMENT_COLUMNS[:3], [row[:3] for row in rows], width=inner).splitlines()
    out = [INDENT + head[0]]
    # the grid's rows, each possibly wrapped over lines: a row starts with its name
    starts = [i for i, line in enumerate(head) if i and line[:1] != " "]
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(head)
        out += [INDENT + line for line in head[start:end]]
        if args[n].help:
            out += _wrapped(args[n].help, width, INDENT + "  ")
    return out


def recipe_detail(r, *, width: int | None = None) -> str:
    out = _wrapped(f"{r.name}: {r.description}", width, "", "  ")
    out += _wrapped(f"entry      {r.path / r.entry}", width, "  ", "             ")
    out += _wrapped("resources  " + ", ".join(f"{k} {v}" for k, v in r.resources.items()),
                    width, "  ", "             ")
    if r.target:
        out.append(f"  target     {r.target.get('metric')} >= {r.target.get('value')}")
    out.append("  arguments  (--set name=value)")
    out += _arguments_lines(r, width)
    if r.profiles:
        out.append("  profiles   (--profile name)")
        for name, prof in r.profiles.items():
            prof = prof or {}
            sets = " ".join(f"{k}={v}" for k, v in (prof.get("set") or {}).items())
            out += _wrapped(f"{name:<10} {prof.get('description', '')}".rstrip(), width,
                            INDENT, INDENT + " " * 11)
            if sets:
                out += _wrapped(f"sets {sets}", width, INDENT + " " * 11, INDENT + " " * 16)
    if r.data:
        out.append("  data")
        for d in r.data:
            out += _wrapped(f"{d.get('name')}: {d.get('source', '')} ({d.get('size_mb', '?')} MB)",
                            width, INDENT, INDENT + "  ")
    if r.published:
        out.append("  published results")
        for p in r.published:
            head = f"[{p['variant']}] " if p.get("variant") else ""
            out += _wrapped(head + _published_text(p), width, INDENT, INDENT + "  ")
            if p.get("source"):
                out += _wrapped(f"source: {p['source']}", width, INDENT + "  ", INDENT + "    ")
    timed = [m for m in r.measured if m.get("gpu") and m.get("seconds") is not None]
    if timed:
        out += _wrapped("measured with this code (estimate prefers these on the same GPU)",
                        width, "  ")
        for m in timed:
            out += _wrapped(_measured_text(m), width, INDENT, INDENT + "  ")
    if "compile" in r.arguments:
        out += _wrapped("compile=true costs, before the first step (off the train clock, "
                        "billed)", width, "  ")
        costs = r.compile_costs()
        for m in costs:
            out += _wrapped(_compile_cost_text(m), width, INDENT, INDENT + "  ")
        if not any(m.get("gpu") for m in costs):
            out += _wrapped("on a GPU: not measured yet; `python benchmarks/gpu.py --compile "
                            "--runs 2` measures it (run 1 compiles, run 2 reads the cache)",
                            width, INDENT, INDENT + "  ")
    return "\n".join(out)


def _when_text(m: dict) -> str:
    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in (m.get("when") or {}).items())


def _measured_text(m: dict) -> str:
    when = _when_text(m)
    head = f"{m['gpu']} x{m.get('gpus', 1)}{f' [{when}]' if when else ''}: {m['seconds']:g} s"
    return " / ".join(str(x) for x in (head, m.get("torch"), m.get("date")) if x)


def _compile_cost_text(m: dict) -> str:
    where = m.get("gpu") or m.get("hardware") or "?"
    when = _when_text(m)
    cached = m.get("compile_cached_seconds")
    return (f"{where}{f' [{when}]' if when else ''}: {m['compile_seconds']:g} s the first time"
            + (f", {cached:g} s from the data dir's cache (runs=N and the next job on a kept "
               f"instance)" if isinstance(cached, (int, float)) else "")
            + (f"; {m['data']}" if m.get("data") else ""))


def plan(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "dry run: nothing created, nothing billed\n" + "\n".join(
        f"  {k:<{width}}  {v}" for k, v in rows)


CLOUD_COLS = [Col("INSTANCE"), Col("REGION", drop=2), Col("TYPE", drop=3), Col("STATE"),
              Col("JOB"), Col("AGE", drop=1), Col("KNOWN", cut=3)]


def cloud_instances(found: list[dict], now: float | None = None, width: int | None = None,
                    sweep=None) -> str:
    """`status --refresh`: the instances tagged cloudtrain, then (with the Sweep that found
    them) each region that could not be checked and the regions that were. "No instance is
    running" is said only when every region answered (F28)."""
    now = time.time() if now is None else now
    live = [f for f in found if f["state"] != "terminated"]
    unchecked = dict(getattr(sweep, "unchecked", None) or {})
    regions = list(getattr(sweep, "regions", None) or [])
    checked = ""  # "34 regions checked (how they were chosen): a, b, ..."
    if regions:
        other = " other" if unchecked else ""
        checked = (f"{len(regions)}{other} region{'s' if len(regions) != 1 else ''} checked "
                   f"({sweep.chosen_by}): {', '.join(regions)}")
    lines = []
    if live:
        rows = [[f["instance"], f["region"], f["type"] or "-", f["state"], f["job"] or "-",
                 age(f["launched_at"], now),
                 "yes" if f["tracked"] else "NO: not in the local store"] for f in live]
        lines.append("instances tagged cloudtrain in the cloud:\n"
                     + grid(CLOUD_COLS, rows, width=width))
        if any(not f["tracked"] for f in live):
            lines.append("an instance this store does not know may be billing: `cloudtrain down "
                         "--all` terminates every one no job holds (or `cloudtrain down JOB` by "
                         "its job)")
        if checked:
            lines += _wrapped(f"cloud: {checked}", width, "", "  ")
    elif not unchecked:
        lines += _wrapped("cloud: no instance tagged cloudtrain is running" + (
            f" in the {checked}" if checked else ""), width, "", "  ")
    elif regions:
        lines += _wrapped(f"cloud: none found in the {checked}", width, "", "  ")
    lines += [line for region, why in sorted(unchecked.items())
              for line in _wrapped(f"cloud: could not check {region}: {why}", width, "", "  ")]
    if unchecked:
        lines.append("something tagged cloudtrain may be running where the cloud could not be "
                     "checked")
    return "\n".join(lines)


def stop_outcomes(outcomes: list) -> str:
    """`down`: one line per job or instance, then where the cloud was looked at. "no active
    jobs" is an all-clear only when every region could be checked (F28)."""
    lines = [f"{o.ref}: {o.note}" for o in outcomes]
    if not any(o.kind != "sweep" for o in outcomes):
        lines.insert(0, "no active jobs" if all(o.ok for o in outcomes) else
                     "no active jobs in this store; not every region could be checked: "
                     "something may still be running there")
    return "\n".join(lines)


def catalog_table(types, region: str, *, width: int | None = None, unpriced=None) -> str:
    """Prices per hour (`$/H`), where `estimate` shows dollars per run (`$/RUN`) (D24).
    `unpriced`: catalog.no_prices(region), said instead of an empty table (U22)."""
    if unpriced is not None:
        return f"{unpriced.message}: {unpriced.hint}"
    if not types:
        return f"no instance types match in {region}"
    rows = []
    for t in types:
        spot = t.spot_snapshot.get(region) or {}
        rows.append([t.name, t.gpu, f"{t.gpus:g}", f"{t.vcpus:g}", f"{t.memory_gib:g}",
                     money4(t.on_demand.get(region)),
                     money4(min(spot.values())) if spot else "-",
                     f"{len(spot)}" if spot else "0"])
    cols = [Col("TYPE"), Col("GPU"), Col("GPUS"), Col("VCPUS", drop=2), Col("MEM GIB", drop=1),
            Col("$/H ON-DEMAND"), Col("$/H SPOT"), Col("SPOT AZS", drop=3)]
    return grid(cols, rows, width=width)


def catalog_sources(region: str, on_demand: str, spot: str, *, width: int | None = None) -> str:
    """What the catalog's prices are: per hour, in which region, from where."""
    lines = [f"prices per hour in {region}; $/H SPOT is the lowest of the region's AZs",
             f"on-demand: {on_demand}", f"spot: {spot}"]
    return "\n".join(out for line in lines for out in _wrapped(line, width, "", "  "))


def money4(value) -> str:
    v = _finite(value)
    return _shown(value) if v is None else f"${v:,.4f}"


def _estimated(dollars, settled: bool) -> str:
    """Settled money as it is, an estimate with ~ (D20)."""
    return money4(dollars) if settled else "~" + money4(dollars)


def cost_report(rows, total, by: str, *, width: int | None = None) -> str:
    """`cost-report`: a row per group and the total. By job (U29): each cloud job with its
    name, date, what it ran and its instance types (JOBS would always be 1); the jobs run on
    this machine, which cost nothing, as one row."""
    if not rows:
        return "no jobs in that period"
    copies = total.staging > 0  # the data copy's share, where any job staged data
    tail = lambda r: ([_estimated(r.dollars, r.settled), "" if r.settled else "estimate",  # noqa: E731
                       money4(r.to_target) if r.to_target is not None else ""]
                      + ([money4(r.staging) if r.staging else ""] if copies else []))
    money_cols = [Col("COST"), Col("", cut=8, drop=3), Col("TO TARGET", drop=2)] + \
        ([Col("OF WHICH DATA COPY", drop=1)] if copies else [])
    if by == "job":
        body = []
        for r in rows:
            if r.local:
                head = ["local", f"{r.jobs} job{'s' if r.jobs != 1 else ''} on this machine",
                        "", "", ""]
            else:
                head = [r.key, _printable(r.name or "-"),
                        time.strftime("%Y-%m-%d", time.localtime(r.created_at))
                        if _finite(r.created_at) is not None else "-",
                        _printable(r.what or "-"), r.instances or "-"]
            body.append(head + tail(r))
        body.append(["TOTAL", f"{total.jobs} job{'s' if total.jobs != 1 else ''}", "", "", ""]
                    + [_estimated(total.dollars, total.settled),
                       "" if total.settled else "includes estimates", ""]
                    + ([money4(total.staging)] if copies else []))
        cols = [Col("ID"), Col("NAME", cut=12, drop=5), Col("DATE", drop=6),
                Col("WHAT", cut=16, drop=4), Col("INSTANCE", cut=14, drop=7)] + money_cols
        return grid(cols, body, width=width)
    body = [[r.key, str(r.jobs)] + tail(r) for r in rows]
    body.append(["TOTAL", str(total.jobs), _estimated(total.dollars, total.settled),
                 "" if total.settled else "includes estimates", ""]
                + ([money4(total.staging)] if copies else []))
    cols = [Col(by.upper(), cut=16), Col("JOBS")] + money_cols
    return grid(cols, body, width=width)


def estimate_table(est, *, width: int | None = None) -> str:
    """`cloudtrain estimate`: one row per instance type, then the basis and the overheads.
    Money is per run (`$/RUN`), where `catalog` shows per hour (`$/H`) (D24)."""
    rows = []
    for r in est.rows:
        row = [r.instance_type if r.nodes == 1 else f"{r.nodes} x {r.instance_type}",
               f"{r.gpus * r.nodes:g}x {r.gpu}", duration(r.train_s),
               duration(r.total_s), money4(r.on_demand), money4(r.spot), ", ".join(r.marks),
               r.scaling]
        if est.staging_bytes or est.preread_s:
            share = f" ({r.staging_s / r.total_s:.0%})" if r.total_s else ""
            row[3:3] = [duration(r.staging_s) + share if r.total_s else "-"]
        rows.append(row)
    # U31: in a narrow terminal TRAINING goes, then GPUS (the type's name says them)
    cols = [Col("TYPE"), Col("GPUS", drop=5), Col("TRAINING", drop=4), Col("TOTAL"),
            Col("$/RUN ON-DEMAND"), Col("$/RUN SPOT"), Col("", cut=8, drop=2),
            Col("BASIS", cut=12, drop=1)]
    if est.staging_bytes or est.preread_s:
        cols[3:3] = [Col("DATA COPY", drop=3)]
    texts = [f"{est.recipe}{f' (profile {est.profile})' if est.profile else ''} in {est.region}: "
             f"expected time and cost per run on each instance type ({est.market} decides "
             f"'cheapest')"]
    later = [f"training: published {est.basis.text}",
             "  scaled to other GPUs by peak dense FP16 tensor TFLOPS (NVIDIA datasheets): an "
             "optimistic bound; small models gain less"]
    if est.profile_note:
        later.append(f"profile: {est.profile_note}")
    later += [
              "overheads (in TOTAL and billed): " + ", ".join(
                  f"{k} {duration(v)} ({est.overheads.source[k]})"
                  for k, v in est.overheads.seconds.items()),
              f"cost: per-second billing (60 s minimum) + {est.disk_gb} GB gp3 root volume"
              + (f" at {est.disk_mbps} MB/s" if est.disk_mbps else "")
              + (f", for each of {est.nodes} instances (one cluster placement group)"
                 if est.nodes > 1 else "")]
    if est.preread_s:
        later.append(f"data copy (in TOTAL and billed): reading the snapshot volumes once before "
                     f"training, {duration(est.preread_s)} at their provisioned throughput")
    if est.staging_bytes:
        limits = sorted({r.staging_basis for r in est.rows if r.staging_basis})
        later.append(f"data copy (in TOTAL and billed): {est.staging_bytes / 1e9:.1f} GB from S3 "
                     f"onto the disk before training, at the slower of the disk and the network "
                     f"({'; '.join(limits)}); the instance's own EBS bandwidth and S3 may be "
                     "slower on small types")
    later += [f"note: {n}" for n in est.notes]
    out = [line for text in texts for line in _wrapped(text, width, "", "  ")]
    out.append(grid(cols, rows, width=width))
    for text in later:
        indent = text[:len(text) - len(text.lstrip())]
        out += _wrapped(text.strip(), width, indent, indent + "  ")
    return "\n".join(out)


def estimate_line(row, market: str) -> str:
    """The line `launch` prints for what it is about to start."""
    price = row.spot if market == Market.SPOT else row.on_demand
    copy = (f", copying the data {duration(row.staging_s)} ({row.staging_basis})"
            if row.staging_s else "")
    profile = f"; {row.profile_note}" if row.profile_note else ""
    nodes = f" on {row.nodes} nodes" if row.nodes > 1 else ""
    return (f"estimate: training {duration(row.train_s)} ({row.scaling}{profile}){copy}, about "
            f"{duration(row.total_s)} billed with boot and setup, {money(price)} {market}"
            f"{nodes}; `cloudtrain estimate` compares instance types")


def prepare_report(report) -> str:
    """`data prepare`'s result (an imagenet_files.PrepareReport): the folders and their image
    counts, what this run wrote, and how the resized copies were made."""
    rows = [[folder, str(count)] for folder, count in report.counts.items()]
    lines = [f"prepared {report.dest}: {report.classes} classes",
             table(rows, ["FOLDER", "IMAGES"])]
    if report.blacklisted:
        lines.append(f"{report.blacklisted} blacklisted validation images left out")
    megabytes = report.bytes_written / 1e6
    lines.append(f"wrote {report.written} files ({report.linked} hard links, "
                 f"{report.extracted} from tars, {megabytes:.1f} MB); {report.skipped} were "
                 f"already there; {duration(report.seconds)}")
    if report.sizes:
        sizes = ", ".join(str(n) for n in report.sizes)
        lines.append(f"resized copies: shorter side {sizes} px, {report.resample}, JPEG quality "
                     f"{report.quality}; smaller images kept as they are")
    return "\n".join(lines)


def push_report(report) -> str:
    """`data push`'s result (a PushReport, from the AWS provider): what is stored now, what
    this run uploaded, and what it left out of the tree."""
    mb = report.uploaded_bytes / 1e6
    rate = f", {mb / report.seconds:.1f} MB/s" if report.seconds > 0 and mb else ""
    def shards(n: int) -> str:
        return f"{n} shard" + ("" if n == 1 else "s")

    lines = [f"pushed {report.url}: {report.files} files, {report.file_bytes / 1e6:.1f} MB in "
             f"{shards(report.shards)} ({report.bytes / 1e6:.1f} MB); manifest.json written last",
             f"uploaded {shards(report.uploaded)} ({mb:.1f} MB{rate}), {report.already} already "
             f"stored; {duration(report.seconds)}"]
    if report.deleted:
        lines.append(f"deleted {shards(report.deleted)} left by an earlier push of more shards")
    if report.skipped:
        shown = "; ".join(f"{_printable(path)} ({why})" for path, why in report.skipped[:5])
        more = f" and {len(report.skipped) - 5} more" if len(report.skipped) > 5 else ""
        lines.append(f"left out {len(report.skipped)}: {shown}{more}")
    return "\n".join(lines)


def datasets_table(rows: list[dict], *, width: int | None = None) -> str:
    """`cloudtrain data ls`."""
    if not rows:
        return ("no datasets declared; add them to config.yaml, e.g.\n  datasets:\n"
                "    imagenet: s3://my-bucket/imagenet")
    now = time.time()
    out = []
    for r in rows:
        size = r.get("size")
        if isinstance(size, dict) and size.get("error"):
            size_text = f"unreadable: {size['error']}"
        else:
            size_text = _staged_size(size) if isinstance(size, dict) else "not read yet"
        last = r.get("last_staged") or {}
        staged = (f"{last.get('job')} {age(last.get('at'), now)} ago on {last.get('where')}"
                  if last else "never")
        out.append([r["name"], r["kind"], r["source"], size_text, staged])
    cols = [Col("NAME"), Col("KIND"), Col("SOURCE", cut=20), Col("SIZE", cut=12, drop=2),
            Col("LAST STAGED", cut=12, drop=1)]
    return grid(cols, out, width=width)


def datasets_json(rows: list[dict]) -> str:
    return json.dumps(rows, indent=1)


def args_lines(job: Job, width: int | None = None) -> list[str]:
    """`status JOB`: a recipe job's arguments as its script got them, all of them (D18),
    wrapped at `width` (U31)."""
    args = (job.spec or {}).get("args") if isinstance(job.spec, dict) else None
    if not isinstance(args, dict) or not args:
        return []
    import shlex

    words = [f"{k}={shlex.quote(str(v).lower() if isinstance(v, bool) else str(v))}"
             for k, v in args.items()]
    return _wrapped("args      " + " ".join(words), width, "  ", " " * 12)


# -- rm / prune (history.py's plans) -------------------------------------------------------


def removal_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def removal_plan(plan, verb: str = "remove", now: float | None = None) -> str:
    """What will go (each job, its files, in aligned columns) and what is kept and why; for
    prune, first the moment it cuts at, as a date and an age (U14)."""
    # a name or a link's target may hold terminal escapes: _printable
    out = []
    if getattr(plan, "cutoff", None) is not None:
        now = time.time() if now is None else now
        ago = max(0.0, now - plan.cutoff)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(plan.cutoff))
        out.append(f"jobs that finished before {when} ({_spelled_age(ago)} ago):")
    if plan.removals:
        out.append(f"{verb} {len(plan.removals)} finished job(s) and {removal_size(plan.bytes)} "
                   f"of files ({plan.files} files):")
        rows = []
        for r in plan.removals:
            job = r.job
            what = "no files" if r.path is None else (
                f"only the link {r.path} (to {_printable(r.link_to)})" if r.link_to is not None
                else f"{r.path} ({removal_size(r.bytes)})")
            ended = time.strftime("%Y-%m-%d", time.localtime(job.ended_at)) \
                if job.ended_at else "?"
            rows.append([_printable(job.id), _printable(job.name or "-"), job.state, ended, what])
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        out += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4]
                for row in rows]
    else:
        out.append("nothing to remove")
    out += refusal_lines(plan.refused)
    return "\n".join(out)


def _spelled_age(seconds: float) -> str:
    """30 days, 6 minutes, 1 hour: an age in the largest whole unit, words not letters."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    n = int(seconds)
    return f"{n} second{'s' if n != 1 else ''}"


def refusal_lines(refused: list) -> list[str]:
    return [f"kept: {r.reason}" + (f" ({r.hint})" if r.hint else "") for r in refused]


def removal_summary(summary) -> str:
    out = [f"removed {len(summary.removed)} job(s) and {removal_size(summary.bytes)} of files"]
    return "\n".join(out + refusal_lines(summary.refused))
