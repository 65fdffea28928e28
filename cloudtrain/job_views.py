"""What the commands about jobs print: `status` (the table, a job's detail with its attempts
and nodes, JSON), the supervisor's line, `status --refresh`'s cloud instances, `down`'s
outcomes, and `rm`/`prune`'s plans (history.py's). Pure functions: data in, strings out.

It imports cells (values and grids), state's Job and nodes (a job's node records).
"""

from __future__ import annotations

import dataclasses
import json
import time

from . import cells
from .cells import (Col, age, clock, duration, epoch_text, grid, job_cost, money4, number, pct,
                    runtime, state_style, state_text)
from .host.job_status import as_time as _finite  # a finite float, else None
from .state import TERMINAL_STATES, Job



# In a narrow terminal LOSS goes first, then BACKEND, EPOCH, RUNTIME and ACC; NAME and WHAT
# are cut with an ellipsis; ID, STATE, AGE and COST always show in full.
STATUS_COLUMNS = [Col("ID"), Col("NAME", cut=10), Col("WHAT", cut=14), Col("BACKEND", drop=2),
                  Col("STATE"), Col("AGE"), Col("RUNTIME", drop=4), Col("EPOCH", drop=3),
                  Col("LOSS", drop=1), Col("ACC", drop=5), Col("COST")]
STATUS_HEADER = [c.header for c in STATUS_COLUMNS]


def budget_words(job: Job) -> str:
    """The budget beside what the job has spent: `$5.00: ~$3.20 spent (64%)`, and whether its
    instances stopped it there."""
    budget = float(job.spec.budget_usd or 0.0)
    spent = job_cost(job)
    share = f" ({job.cost / budget:.0%})" if job.cost is not None and budget > 0 else ""
    ended = "; its instances stopped it there (stopped: budget)" if job.state == "stopped" \
        else ""
    return f"{cells.money(budget)}: {spent} spent{share}{ended}"


def status_table(jobs: list[Job], now: float | None = None, *, width: int | None = None,
                 color: bool = False, kept: list[dict] | None = None) -> str:
    """`status`: one row a job; `kept` (kept.survey's rows): a job whose kept instance runs
    on says so in its STATE, and a line below the table says what it bills and when it
    powers itself off."""
    now = time.time() if now is None else now
    if not jobs:
        return "no jobs yet: cloudtrain launch --recipe resnet9 --profile smoke --follow"
    holding = {k["job"] for k in kept or [] if k["state"] == "kept"}
    rows = []
    for job in jobs:
        m = job.metrics if isinstance(job.metrics, dict) else {}
        rows.append([job.id, job.name or "-", job.command, job.backend,
                     state_text(job) + (KEPT_MARK if job.id in holding else ""),
                     age(job.created_at, now), duration(runtime(job, now)),
                     "data" if job.state == "staging" else epoch_text(m),
                     number(m.get("train_loss", m.get("loss"))),
                     pct(m.get(accuracy_key(job, m))), job_cost(job)])
    table = grid(STATUS_COLUMNS, rows, width=width, color=color,
                 styles={"STATE": _kept_style})
    lines = kept_lines(kept or [], now, width)
    return table + ("\n" + "\n".join(lines) if lines else "")


def accuracy_key(job: Job, metrics: dict) -> str:
    """The ACC column's metric: the recipe's target metric where the row has it (imagenet's
    top5, as `status JOB` and `plot` show), else test_acc, else accuracy."""
    target = job.spec.target
    metric = target.get("metric") if isinstance(target, dict) else None
    if isinstance(metric, str) and metric in metrics:
        return metric
    return "test_acc" if "test_acc" in metrics else "accuracy"


# -- a kept instance: its STATE mark, its lines, its JSON --------------------------------

KEPT_MARK = ", kept"  # `succeeded, kept`: the job ended, its instance runs and bills on


def _kept_style(text: str) -> str | None:
    return "bold yellow" if str(text).endswith(KEPT_MARK) else state_style(text)


def _at(ts: float | None, now: float) -> str:
    """A moment as this machine's clock says it, and how far off: `00:12 (in 47m)`."""
    if ts is None or _finite(ts) is None:
        return "-"
    when = time.strftime("%H:%M", time.localtime(ts))
    return f"{when} (in {age(now, ts)})" if ts >= now else f"{when} ({age(ts, now)} ago)"


def _price(k: dict) -> str:
    return f"{money4(k['price_per_hour'])}/h" if _finite(k.get("price_per_hour")) is not None \
        else "(price unknown)"


def kept_words(k: dict, now: float) -> str:
    """One kept instance in words: what bills, since when, and when it powers itself off."""
    who = k["job"] + (f" ({cells.shown(k['name'])})" if k.get("name") else "")
    where = ", ".join(cells.shown(v) for v in (k.get("type"), k.get("region")) if v)
    head = f"{k['instance']} ({where})" if where else str(k["instance"])
    if k["state"] == "busy":
        return (f"{head} runs job {who}; queued behind it: " + ", ".join(k["queued"])
                + " (each starts there when the one before it ends)")
    text = (f"{head} of job {who}: running and billing {_price(k)} since "
            f"{_at(k.get('billing_since'), now)}; ")
    if k.get("queued"):
        return text + "starting the job queued there: " + ", ".join(k["queued"])
    if k.get("due"):
        return text + (f"its power-off was due at {_at(k.get('power_off_at'), now)} "
                       "(not confirmed yet: cloudtrain status --refresh asks EC2)")
    return text + (f"powers itself off at {_at(k.get('power_off_at'), now)}, "
                   f"{k.get('idle_minutes')} min after its last job, unless a job comes "
                   f"(cloudtrain launch --on {k['job']}); cloudtrain down {k['job']} ends it now")


def kept_lines(kept: list[dict], now: float | None = None, width: int | None = None) -> list[str]:
    """The lines below `status`'s table: each kept instance, and each one with jobs queued."""
    now = time.time() if now is None else now
    out = []
    for k in kept:
        out += cells.wrapped(("kept: " if k["state"] == "kept" else "queue: ")
                             + kept_words(k, now), width, "", "  ")
    return out


def kept_note(k: dict, now: float | None = None) -> str:
    """What `ssh` says on its way to a kept instance."""
    return "kept instance " + kept_words(k, time.time() if now is None else now)


def queue_of(job: Job, kept: list[dict]) -> dict | None:
    """A queued job's place: the instance, the job running there, its position (from 1)."""
    for k in kept:
        if job.id in k.get("queued", []):
            return {"instance": k["instance"], "running": k["job"] if k["state"] == "busy"
                    else None, "position": k["queued"].index(job.id) + 1}
    return None


def launched_line(job: Job) -> str:
    """What `launch` says of the job it made: started, or queued on a kept instance."""
    if job.state == "queued":
        kept = job.spec.kept or {}
        ahead = kept.get("ahead") or []
        return (f"queued job {job.id}: {job.command} on {job.backend}, on the kept instance "
                f"{kept.get('instance')} behind job {ahead[-1] if ahead else '?'}: it starts "
                "there when that one ends, whether or not this machine is on")
    return f"launched job {job.id}: {job.command} on {job.backend}"


def job_json(job: Job, now: float | None = None, kept: list[dict] | None = None) -> dict:
    """A job as --json gives it: its times in ISO 8601 UTC; its metrics row as the job
    wrote it; its kept instance, or its place in one's queue."""
    now = time.time() if now is None else now
    data = {**dataclasses.asdict(job), "spec": job.spec.to_dict(), "facts": job.facts.to_dict()}
    data.pop("details")
    data["runtime_s"] = runtime(job, now)
    if kept is not None:
        data["kept"] = next((k for k in kept if k["job"] == job.id and k["state"] == "kept"),
                            None)
        data["queue"] = queue_of(job, kept)
    return {**cells.json_times(data), "metrics": data["metrics"]}


def jobs_json(jobs: list[Job], kept: list[dict] | None = None) -> str:
    now = time.time()
    return json.dumps([job_json(j, now, kept) for j in jobs], indent=1)


def detail_json(job: Job, phases, log_tail: bytes, target: dict | None,
                runs: dict | None = None, attempts: list[dict] | None = None,
                recovery: dict | None = None, kept: list[dict] | None = None) -> str:
    data = job_json(job, kept=kept)
    data["timeline"] = [{**dataclasses.asdict(p), "start": cells.iso_time(p.start)}
                        for p in phases]
    data["target"] = target
    data["runs"] = runs
    data["attempts"] = cells.json_times(attempts or [])
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
               startup: dict | None = None, kept: list[dict] | None = None) -> str:
    """`status JOB`; `width`: the terminal's, which its tables fit (None: full length);
    `kept` (kept.survey's rows): its kept instance, or its place in one's queue."""
    now = time.time() if now is None else now
    holds = next((k for k in kept or [] if k["job"] == job.id and k["state"] == "kept"), None)
    place = queue_of(job, kept or [])
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
                                                  " (so far: its kept instance still bills)"
                                                  if holds else
                                                  ("" if job.cost_settled else " (estimate)"))]
    if job.spec.budget_usd is not None:
        out.append(f"  budget    {budget_words(job)}")
    if holds:
        out.append(f"  kept      {kept_words(holds, now)}")
    if place:
        out.append(f"  queue     number {place['position']} on the kept instance "
                   f"{place['instance']}" + (f", behind job {place['running']} running there"
                                             if place["running"] else ""))
    detail = job.cost_detail or {}
    by_phase = detail.get("phases")  # a dict as cloudtrain writes it; else the row is damaged
    billed_phases = ", ".join(f"{k} {money4(v)}" for k, v in by_phase.items()
                              if v) if isinstance(by_phase, dict) else ""
    if billed_phases:  # a local job's phases cost nothing: no empty line
        out.append("  by phase  " + billed_phases)
    if detail.get("to_target") is not None and job.backend != "local":  # nothing billed
        out.append(f"  to target {money4(detail['to_target'])}")
    expected = job.spec.expected
    if expected:
        out.append(f"  estimated {money4(expected.get('usd'))} before launch: training "
                   f"{duration(expected.get('train_s'))} ({expected.get('basis')}), "
                   f"{duration(expected.get('total_s'))} billed")
    notes = detail.get("notes")
    for note in notes if isinstance(notes, list) else []:
        out.append(f"  cost note {note}")
    for name, info in (job.spec.data.staging or {}).items():
        out.append(f"  data      {cells.shown(name)}: {cells.staged_size(info)}")
    metrics = job.metrics if isinstance(job.metrics, dict) else {}
    if metrics.get("staging"):
        out.append(f"  staging   {cells.shown(metrics['staging'])}")
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
    if job.jobdir:  # a path on the instance until the job's files come home
        remote = isinstance(job.host, dict) and job.host.get("kind") not in (None, "LocalHost")
        out.append(f"  jobdir    {'on the instance: ' if remote else ''}{job.jobdir}")
    if attempts and (len(attempts) > 1 or job.spec.recovery.recover):
        out += attempts_lines(attempts, recovery or {}, width=width)
    out += nodes_lines(job, width=width)
    out.append("  timeline")
    for ph in phases:  # after the job's end nothing is "(now)" (its outputs, collected)
        took = "" if ph.name in TERMINAL_STATES else (
            duration(ph.duration) if ph.duration is not None else
            "(now)" if job.active else "")
        out.append(f"    {ph.name:<13} {clock(ph.start)}  {took:<8} {ph.detail or ''}".rstrip())
    if log_tail:
        title = "last output" if job.state != "failed" else "last output (failed)"
        out.append(f"  {title}:")
        text = log_tail.decode("utf-8", "replace").rstrip("\n")
        out += ["    " + line for line in text.splitlines()]
    return "\n".join(_fitted(out, width))


def _fitted(lines: list[str], width: int | None) -> list[str]:
    """`status JOB`'s lines wrapped at `width`: a `  key       value` line under its
    value's column, a timeline or output line two spaces in; tables (fitted already) and
    short lines as they are."""
    if width is None:
        return lines
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
        elif line.startswith("  ") and not line.startswith("   ") and line[11:12] == " ":
            out += cells.wrapped(line[2:], width, "  ", " " * 12)
        else:
            lead = " " * (len(line) - len(line.lstrip(" ")))
            out += cells.wrapped(line.lstrip(" "), width, lead, lead + "  ")
    return out


def startup_text(row: dict) -> str:
    """A recipe's startup row (issue 17): what came before its first training step."""
    parts = [f"{k.replace('_', '-')} {duration(row[k])}" for k in
             ("import", "data", "warm_up", "compile") if _finite(row.get(k)) is not None]
    first = _finite(row.get("to_first_step"))
    threads = _threads_text(row)
    return ", ".join(parts) + (f"; first step {duration(first)} after the start"
                               if first is not None else "") + (f"; {threads}" if threads else "")


def _count(value) -> int | None:
    """A whole count from the host's row, or None (a float, a bool, text, a negative)."""
    return value if type(value) is int and 0 <= value < 10**6 else None


def _threads_text(row: dict) -> str:
    """The startup row's torch threads and why (issue 28, recipes/common/startup.py)."""
    threads = _count(row.get("threads"))
    if threads is None:
        return ""
    if row.get("threads_from") == "job":
        return f"torch threads {threads} (the job's OMP_NUM_THREADS)"
    cores, procs = _count(row.get("cores")), _count(row.get("procs"))
    if row.get("threads_from") != "cores" or cores is None or procs is None:
        return f"torch threads {threads}"
    less = _count(row.get("loader_workers")) or 0
    return (f"torch threads {threads} ({cores} cores / {procs} processes"
            + (f", less {less} loader workers" if less else "") + ")")


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
            str(r.get("attempt")), cells.shown(r.get("instance")), _zone_cell(r),
            cells.shown(r.get("market")), clock(r.get("started_at")),
            clock(r.get("ended_at")) if r.get("ended_at") else "-",
            cells.shown(r.get("outcome")),
            "-" if r.get("resumed_checkpoint") is None else
            (f"step {step}" if step is not None else f"ckpt {r['resumed_checkpoint']}"),
            cells.shown(r.get("last_step")), cells.shown(r.get("redone_steps")),
            money4(r.get("usd")) if r.get("usd") is not None else "-"])
    fitted = grid(ATTEMPTS_COLS, table_rows, width=None if width is None else max(width - 4, 20))
    lines = [head] + ["    " + line for line in fitted.splitlines()]
    for r in rows:
        if r.get("reason") and r.get("outcome") == "interrupted":
            lines.append(f"    {r['attempt']}: {_shown_long(r['reason'])}")
    return lines


def _zone_cell(row: dict) -> str:
    """An attempt's AZ, with the spot placement score EC2 gave it at launch: 'us-east-1d 9/10'."""
    score = row.get("score")
    return cells.shown(row.get("zone")) + (f" {score}/10" if type(score) is int else "")


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
        agent = rec.get("agent")
        agent = agent if isinstance(agent, dict) else {}
        where = rec.get("host") or ("this machine" if rec.get("kind") == "LocalHost" else "-")
        rows.append([str(i) + (" (rendezvous)" if i == 0 else ""), cells.shown(rec.get("instance")),
                     cells.shown(rec.get("address")), cells.shown(where),
                     cells.shown(agent.get("state") or ("collected" if rec.get("collected")
                                                   else "-")),
                     cells.shown(agent.get("exit_code")), _shown_long(agent.get("reason") or "")])
    fitted = grid(NODES_COLS, rows, width=None if width is None else max(width - 4, 20))
    return [f"  nodes     {len(recs)} (logs of node i: cloudtrain logs {job.id} --node i)"] + \
        ["    " + line for line in fitted.splitlines()]


def _shown_long(text) -> str:
    return "".join(c if c.isprintable() else " " for c in str(text)[:300])


def supervisor_line(info: dict, needed: bool = True) -> str:
    """The supervisor in one line; "NOT running" in capitals only when a recovering job needs
    it (with nothing to watch, not running is how it should be)."""
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


def supervisor_json(info: dict) -> str:
    return json.dumps(cells.json_times(info), indent=1)


def _metric(key, value) -> str:
    if isinstance(value, float):
        key = str(key)
        if key.endswith("_acc") or key.endswith("accuracy") or key in ("top5", "train_top5"):
            return pct(value)
        if key.endswith("_time"):
            return duration(value)
        return number(value)
    return cells.shown(value)


CLOUD_COLS = [Col("INSTANCE"), Col("REGION", drop=2), Col("TYPE", drop=3), Col("STATE"),
              Col("JOB"), Col("AGE", drop=1), Col("KNOWN", cut=3)]


def cloud_instances(found: list[dict], now: float | None = None, width: int | None = None,
                    sweep=None, listed: bool = False) -> str:
    """`status --refresh`: the instances tagged cloudtrain, then (with the Sweep that found
    them) each region that could not be checked and how many were; `listed` (--wide): which
    (34 names on every refresh). "No instance is running" is said only when every
    region answered."""
    now = time.time() if now is None else now
    live = [f for f in found if f["state"] != "terminated"]
    unchecked = dict(getattr(sweep, "unchecked", None) or {})
    regions = list(getattr(sweep, "regions", None) or [])
    checked = ""  # "34 regions checked (how they were chosen)[: a, b, ...]"
    if regions:
        other = " other" if unchecked else ""
        checked = (f"{len(regions)}{other} region{'s' if len(regions) != 1 else ''} checked "
                   f"({sweep.chosen_by})" + (f": {', '.join(regions)}" if listed else ""))
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
            lines += cells.wrapped(f"cloud: {checked}", width, "", "  ")
    elif not unchecked:
        lines += cells.wrapped("cloud: no instance tagged cloudtrain is running" + (
            f" in the {checked}" if checked else ""), width, "", "  ")
    elif regions:
        lines += cells.wrapped(f"cloud: none found in the {checked}", width, "", "  ")
    lines += [line for region, why in sorted(unchecked.items())
              for line in cells.wrapped(f"cloud: could not check {region}: {why}", width, "", "  ")]
    if unchecked:
        lines.append("something tagged cloudtrain may be running where the cloud could not be "
                     "checked")
    return "\n".join(lines)


def stop_outcomes(outcomes: list, listed: bool = False) -> str:
    """`down`: one line per job or instance, then where the cloud was looked at: how many
    regions, and with `listed` (--wide) which. "no active jobs" is an all-clear only
    when every region could be checked."""
    lines = [f"{o.ref}: {o.note}" + (f": {', '.join(o.regions)}"
                                     if listed and getattr(o, "regions", None) else "")
             for o in outcomes]
    if not any(o.kind != "sweep" for o in outcomes):
        lines.insert(0, "no active jobs" if all(o.ok for o in outcomes) else
                     "no active jobs in this store; not every region could be checked: "
                     "something may still be running there")
    return "\n".join(lines)


def args_lines(job: Job, width: int | None = None) -> list[str]:
    """`status JOB`: a recipe job's arguments as its script got them, all of them,
    wrapped at `width`."""
    args = job.spec.args
    if not isinstance(args, dict) or not args:
        return []
    import shlex

    words = [f"{k}={shlex.quote(str(v).lower() if isinstance(v, bool) else str(v))}"
             for k, v in args.items()]
    return cells.wrapped("args      " + " ".join(words), width, "  ", " " * 12)


# -- rm / prune (history.py's plans) -------------------------------------------------------


def removal_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def removal_plan(plan, verb: str = "remove", now: float | None = None) -> str:
    """What will go (each job, its files, in aligned columns) and what is kept and why; for
    prune, first the moment it cuts at, as a date and an age."""
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
                f"only the link {r.path} (to {cells.printable(r.link_to)})" if r.link_to is not None
                else f"{r.path} ({removal_size(r.bytes)})")
            ended = time.strftime("%Y-%m-%d", time.localtime(job.ended_at)) \
                if job.ended_at else "?"
            rows.append([cells.printable(job.id), cells.printable(job.name or "-"), job.state, ended, what])
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
