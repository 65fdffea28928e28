"""Text and JSON for what the commands return. Pure functions: data in, strings out."""

from __future__ import annotations

import dataclasses
import json
import time

from .agent import as_time as _finite  # a finite float, else None
from .agent import fmt_duration
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


def duration(seconds) -> str:
    s = _finite(seconds)
    if s is None:
        return _shown(seconds)
    if s < 10:
        return f"{s:.2f}s"
    if abs(s) > 1e12:  # ~30,000 years: not a duration worth spelling out
        return f"{s:.3g}s"
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
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


STATUS_HEADER = ["ID", "NAME", "WHAT", "BACKEND", "STATE", "AGE", "RUNTIME", "EPOCH", "LOSS",
                 "ACC", "COST"]


def status_table(jobs: list[Job], now: float | None = None) -> str:
    now = time.time() if now is None else now
    if not jobs:
        return "no jobs yet: cloudtrain launch --recipe resnet9 --profile smoke --follow"
    rows = []
    for job in jobs:
        m = job.metrics if isinstance(job.metrics, dict) else {}
        what = job.command if len(job.command) <= 40 else job.command[:37] + "..."
        rows.append([job.id, job.name or "-", what, job.backend, state_text(job),
                     age(job.created_at, now), duration(runtime(job, now)),
                     "data" if job.state == "staging" else epoch_text(m),
                     number(m.get("train_loss", m.get("loss"))),
                     pct(m.get("test_acc", m.get("accuracy"))), job_cost(job)])
    return table(rows, STATUS_HEADER)


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
    data["log_tail"] = log_tail.decode("utf-8", "replace")
    return json.dumps(data, indent=1)


def job_detail(job: Job, phases, log_tail: bytes, target: dict | None = None,
               now: float | None = None, runs: dict | None = None,
               attempts: list[dict] | None = None, recovery: dict | None = None) -> str:
    now = time.time() if now is None else now
    out = [f"job {job.id}" + (f" ({job.name})" if job.name else ""),
           f"  what      {job.command}",
           *args_lines(job),
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
    if detail.get("phases"):
        out.append("  by phase  " + ", ".join(f"{k} {money4(v)}" for k, v in
                                             detail["phases"].items() if v))
    if detail.get("to_target") is not None:
        out.append(f"  to target {money4(detail['to_target'])}")
    expected = (job.spec or {}).get("expected")
    if expected:
        out.append(f"  estimated {money4(expected.get('usd'))} before launch: training "
                   f"{duration(expected.get('train_s'))} ({expected.get('basis')}), "
                   f"{duration(expected.get('total_s'))} billed")
    for note in detail.get("notes") or []:
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
        out += attempts_lines(attempts, recovery or {})
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
    return "\n".join(out)


ATTEMPTS_HEADER = ["#", "INSTANCE", "AZ", "MARKET", "STARTED", "ENDED", "OUTCOME",
                   "RESUMED AT", "LAST STEP", "REDONE", "COST"]


def attempts_lines(rows: list[dict], totals: dict) -> list[str]:
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
    lines = [head] + ["    " + line for line in table(table_rows, ATTEMPTS_HEADER).splitlines()]
    for r in rows:
        if r.get("reason") and r.get("outcome") == "interrupted":
            lines.append(f"    {r['attempt']}: {_shown_long(r['reason'])}")
    return lines


def _shown_long(text) -> str:
    return "".join(c if c.isprintable() else " " for c in str(text)[:300])


def supervisor_line(info: dict) -> str:
    if not info.get("running"):
        return "supervisor: NOT running (any cloudtrain command restarts it while a recovering " \
               "job needs it)"
    beat = info.get("heartbeat_at")
    seen = f", last round {age(beat, time.time())} ago" if _finite(beat) is not None else ""
    return (f"supervisor: running (pid {info.get('pid')}, watching {info.get('watching') or 0} "
            f"job(s){seen}; tmux -L {info.get('tmux_socket') or 'cloudtrain'} attach -t "
            f"{info.get('session')})")


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


def recipes_table(recipes) -> str:
    rows = []
    for r in recipes:
        pub = r.published[0] if r.published else {}
        result = " ".join(str(x) for x in (pub.get("result"), pub.get("time"),
                                            pub.get("hardware")) if x)
        rows.append([r.name, str(r.gpus), r.description, result or "-"])
    return table(rows, ["RECIPE", "GPUS", "DESCRIPTION", "PUBLISHED RESULT"])


def recipe_detail(r) -> str:
    out = [f"{r.name}: {r.description}", f"  entry      {r.path / r.entry}",
           "  resources  " + ", ".join(f"{k} {v}" for k, v in r.resources.items())]
    if r.target:
        out.append(f"  target     {r.target.get('metric')} >= {r.target.get('value')}")
    out.append("  arguments  (--set name=value)")
    for a in r.arguments.values():
        kind = a.type if a.type != "choice" else "|".join(str(c) for c in a.choices or [])
        default = "-" if a.default is None else a.render(a.default)
        out.append(f"    {a.name:<16} {kind:<24} default {default:<14} {a.help}".rstrip())
    if r.profiles:
        out.append("  profiles   (--profile name)")
        for name, prof in r.profiles.items():
            sets = " ".join(f"{k}={v}" for k, v in ((prof or {}).get("set") or {}).items())
            out.append(f"    {name:<10} {(prof or {}).get('description', '')}")
            if sets:
                out.append(f"               sets {sets}")
    if r.data:
        out.append("  data")
        for d in r.data:
            out.append(f"    {d.get('name')}: {d.get('source', '')} ({d.get('size_mb', '?')} MB)")
    if r.published:
        out.append("  published results")
        for p in r.published:
            head = f"    [{p['variant']}] " if p.get("variant") else "    "
            out.append(head + " / ".join(str(p[k]) for k in ("result", "time", "hardware")
                                          if p.get(k)))
            if p.get("source"):
                out.append(f"      source: {p['source']}")
    return "\n".join(out)


def plan(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "dry run: nothing created, nothing billed\n" + "\n".join(
        f"  {k:<{width}}  {v}" for k, v in rows)


def cloud_instances(found: list[dict], now: float | None = None) -> str:
    now = time.time() if now is None else now
    live = [f for f in found if f["state"] != "terminated"]
    if not live:
        return "cloud: no instance tagged cloudtrain is running"
    rows = [[f["instance"], f["region"], f["type"] or "-", f["state"], f["job"] or "-",
             age(f["launched_at"], now), "yes" if f["tracked"] else "NO: not in the local store"]
            for f in live]
    text = "instances tagged cloudtrain in the cloud:\n" + table(
        rows, ["INSTANCE", "REGION", "TYPE", "STATE", "JOB", "AGE", "KNOWN"])
    if any(not f["tracked"] for f in live):
        text += ("\nan instance this store does not know may be billing: `cloudtrain down "
                 "--all` terminates every one no job holds (or `cloudtrain down JOB` by its job)")
    return text


def catalog_table(types, region: str) -> str:
    if not types:
        return f"no instance types match in {region}"
    rows = []
    for t in types:
        spot = t.spot_snapshot.get(region) or {}
        rows.append([t.name, t.gpu, f"{t.gpus:g}", f"{t.vcpus:g}", f"{t.memory_gib:g}",
                     money4(t.on_demand.get(region)),
                     money4(min(spot.values())) if spot else "-",
                     f"{len(spot)}" if spot else "0"])
    return table(rows, ["TYPE", "GPU", "GPUS", "VCPUS", "MEM GIB", f"ON-DEMAND/H ({region})",
                        "SPOT/H (lowest AZ)", "SPOT AZS"])


def money4(value) -> str:
    v = _finite(value)
    return _shown(value) if v is None else f"${v:,.4f}"


def cost_report(rows, total, by: str) -> str:
    if not rows:
        return "no jobs in that period"
    copies = total.staging > 0  # the data copy's share, where any job staged data
    body = [[r.key, str(r.jobs), money4(r.dollars), "" if r.settled else "estimate",
             money4(r.to_target) if r.to_target is not None else ""]
            + ([money4(r.staging) if r.staging else ""] if copies else []) for r in rows]
    body.append(["TOTAL", str(total.jobs), money4(total.dollars),
                 "" if total.settled else "includes estimates", ""]
                + ([money4(total.staging)] if copies else []))
    return table(body, [by.upper(), "JOBS", "COST", "", "TO TARGET"]
                 + (["OF WHICH DATA COPY"] if copies else []))


def estimate_table(est) -> str:
    """`cloudtrain estimate`: one row per instance type, then the basis and the overheads."""
    rows = []
    for r in est.rows:
        row = [r.instance_type, f"{r.gpus:g}x {r.gpu}", duration(r.train_s),
               duration(r.total_s), money4(r.on_demand), money4(r.spot), ", ".join(r.marks),
               r.scaling]
        if est.staging_bytes or est.preread_s:
            share = f" ({r.staging_s / r.total_s:.0%})" if r.total_s else ""
            row[3:3] = [duration(r.staging_s) + share if r.total_s else "-"]
        rows.append(row)
    header = ["TYPE", "GPUS", "TRAINING", "TOTAL", "ON-DEMAND", "SPOT", "", "BASIS"]
    if est.staging_bytes or est.preread_s:
        header[3:3] = ["DATA COPY"]
    out = [f"{est.recipe} in {est.region}: expected time and cost per instance type "
           f"({est.market} decides 'cheapest')",
           table(rows, header),
           f"training: published {est.basis.text}",
           "  scaled to other GPUs by peak dense FP16 tensor TFLOPS (NVIDIA datasheets): an "
           "optimistic bound; small models gain less",
           "overheads (in TOTAL and billed): " + ", ".join(
               f"{k} {duration(v)} ({est.overheads.source[k]})"
               for k, v in est.overheads.seconds.items()),
           f"cost: per-second billing (60 s minimum) + {est.disk_gb} GB gp3 root volume"
           + (f" at {est.disk_mbps} MB/s" if est.disk_mbps else "")]
    if est.preread_s:
        out.append(f"data copy (in TOTAL and billed): reading the snapshot volumes once before "
                   f"training, {duration(est.preread_s)} at their provisioned throughput")
    if est.staging_bytes:
        limits = sorted({r.staging_basis for r in est.rows if r.staging_basis})
        out.append(f"data copy (in TOTAL and billed): {est.staging_bytes / 1e9:.1f} GB from S3 "
                   f"onto the disk before training, at the slower of the disk and the network "
                   f"({'; '.join(limits)}); the instance's own EBS bandwidth and S3 may be "
                   "slower on small types")
    out += [f"note: {n}" for n in est.notes]
    return "\n".join(out)


def estimate_line(row, market: str) -> str:
    """The line `launch` prints for what it is about to start."""
    price = row.spot if market == "spot" else row.on_demand
    copy = (f", copying the data {duration(row.staging_s)} ({row.staging_basis})"
            if row.staging_s else "")
    return (f"estimate: training {duration(row.train_s)} ({row.scaling}){copy}, about "
            f"{duration(row.total_s)} billed with boot and setup, {money(price)} {market}; "
            f"`cloudtrain estimate` compares instance types")


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
    """`data push`'s result (a providers.aws.datasets.PushReport): what is stored now, what
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


def datasets_table(rows: list[dict]) -> str:
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
    return table(out, ["NAME", "KIND", "SOURCE", "SIZE", "LAST STAGED"])


def datasets_json(rows: list[dict]) -> str:
    return json.dumps(rows, indent=1)


def args_lines(job: Job) -> list[str]:
    """`status JOB`: a recipe job's arguments as its script got them, all of them (D18)."""
    args = (job.spec or {}).get("args") if isinstance(job.spec, dict) else None
    if not isinstance(args, dict) or not args:
        return []
    import shlex

    words = [f"{k}={shlex.quote(str(v).lower() if isinstance(v, bool) else str(v))}"
             for k, v in args.items()]
    return ["  args      " + " ".join(words)]
