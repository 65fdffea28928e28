"""What the commands about what can be run, where and for how much print: `recipes`, the
instance `catalog`, `estimate` and launch's estimate line, the dry run's plan, `cost-report`,
and the data commands (`data ls`, `data prepare`, `data push`). Pure functions: data in,
strings out.

It imports cells (values and grids) and the host side's as_time, nothing else of cloudtrain.
"""

from __future__ import annotations

import dataclasses
import json
import time

from . import cells, cost
from .cells import Col, age, duration, grid, money, money4, table
from .host.job_status import as_time as _finite  # a finite float, else None
from .market import Market



def whole(number):
    """A count as an int where it is whole (JSON's `gpus: 1`, not 1.0); a fraction as is."""
    return int(number) if isinstance(number, float) and number.is_integer() else number


def catalog_json(types, region: str, snapshot: str, on_demand_source: str,
                 spot_source: str) -> str:
    """`catalog --json`: each type under `instance_type`, as estimate --json names it."""
    out = []
    for t in types:
        data = dataclasses.asdict(t)
        data = {"instance_type": data.pop("name"), **data}
        data["gpus"] = whole(data["gpus"])
        out.append(data)
    return json.dumps({"snapshot": snapshot, "region": region,
                       "on_demand_source": on_demand_source, "spot_source": spot_source,
                       "types": out}, indent=1)


def _published_text(pub: dict) -> str:
    return " / ".join(str(pub[k]) for k in ("result", "time", "hardware") if pub.get(k))


RECIPES_COLUMNS = [Col("RECIPE"), Col("GPUS"), Col("DESCRIPTION", cut=24),
                   Col("PUBLISHED RESULT", cut=16, drop=1)]


def recipes_table(recipes, *, width: int | None = None) -> str:
    rows = [[r.name, str(r.gpus), r.description,
             _published_text(r.published[0]) if r.published else "-"] for r in recipes]
    return grid(RECIPES_COLUMNS, rows, width=width)


def recipes_json(recipes) -> str:
    """`recipes --json`: one object per recipe."""
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
            out += cells.wrapped(args[n].help, width, INDENT + "  ")
    return out


def recipe_detail(r, *, width: int | None = None) -> str:
    out = cells.wrapped(f"{r.name}: {r.description}", width, "", "  ")
    out += cells.wrapped(f"entry      {r.path / r.entry}", width, "  ", "             ")
    out += cells.wrapped("resources  " + ", ".join(f"{k} {v}" for k, v in r.resources.items()),
                    width, "  ", "             ")
    if r.target:
        out.append(f"  target     {r.target.get('metric')} >= {r.target.get('value')}")
        for variant, own in (r.target.get("per_variant") or {}).items():
            out.append(f"             {variant}: {own.get('metric')} >= {own.get('value')}")
    out.append("  arguments  (--set name=value)")
    out += _arguments_lines(r, width)
    if r.profiles:
        out.append("  profiles   (--profile name)")
        for name, prof in r.profiles.items():
            prof = prof or {}
            sets = " ".join(f"{k}={v}" for k, v in (prof.get("set") or {}).items())
            out += cells.wrapped(f"{name:<10} {prof.get('description', '')}".rstrip(), width,
                            INDENT, INDENT + " " * 11)
            if sets:
                out += cells.wrapped(f"sets {sets}", width, INDENT + " " * 11, INDENT + " " * 16)
    if r.data:
        out.append("  data")
        for d in r.data:
            out += cells.wrapped(f"{d.get('name')}: {d.get('source', '')} ({d.get('size_mb', '?')} MB)",
                            width, INDENT, INDENT + "  ")
    if r.published:
        out.append("  published results")
        for p in r.published:
            head = f"[{p['variant']}] " if p.get("variant") else ""
            out += cells.wrapped(head + _published_text(p), width, INDENT, INDENT + "  ")
            if p.get("source"):
                out += cells.wrapped(f"source: {p['source']}", width, INDENT + "  ", INDENT + "    ")
    timed = [m for m in r.measured if m.get("gpu") and m.get("seconds") is not None]
    if timed:
        out += cells.wrapped("measured with this code (estimate prefers these on the same GPU)",
                        width, "  ")
        for m in timed:
            out += cells.wrapped(_measured_text(m), width, INDENT, INDENT + "  ")
    if "compile" in r.arguments:
        out += cells.wrapped("compile=true costs, before the first step (off the train clock, "
                        "billed)", width, "  ")
        costs = r.compile_costs()
        for m in costs:
            out += cells.wrapped(_compile_cost_text(m), width, INDENT, INDENT + "  ")
        if not any(m.get("gpu") for m in costs):
            out += cells.wrapped("on a GPU: not measured yet; `python benchmarks/gpu.py --compile "
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


def plan(rows: list[tuple[str, str]], *, width: int | None = None) -> str:
    """The dry run's rows, each value wrapped at `width` under its column (an 80-column
    terminal split its 300-character rows mid-word); None: a row a line."""
    keys = max(len(k) for k, _ in rows)
    hang = " " * (keys + 4)
    return "\n".join(["dry run: nothing created, nothing billed"] + [
        line for k, v in rows for line in cells.wrapped(v, width, f"  {k:<{keys}}  ", hang)])


def catalog_table(types, region: str, *, width: int | None = None) -> str:
    """Prices per hour (`$/H`), where `estimate` shows dollars per run (`$/RUN`)."""
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
    return "\n".join(out for line in lines for out in cells.wrapped(line, width, "", "  "))


def _estimated(dollars, settled: bool) -> str:
    """Settled money as it is, an estimate with ~."""
    return money4(dollars) if settled else "~" + money4(dollars)


def _of_budget(r) -> str:
    """A job's budget and the share of it spent: `$5.00 (64%)`."""
    if r.budget is None:
        return ""
    return f"{money(r.budget)} ({r.dollars / r.budget:.0%})" if r.budget > 0 else money(r.budget)


def cost_report(rows, total, by: str, *, width: int | None = None) -> str:
    """`cost-report`: a row per group and the total. By job: each cloud job with its
    name, date, what it ran and its instance types (JOBS would always be 1); the jobs run on
    this machine, which cost nothing, as one row."""
    if not rows:
        return "no jobs in that period"
    copies = total.staging > 0  # the data copy's share, where any job staged data
    budgets = by == "job" and any(r.budget is not None for r in rows)
    tail = lambda r: ([_estimated(r.dollars, r.settled), "" if r.settled else "estimate",  # noqa: E731
                       money4(r.to_target) if r.to_target is not None else ""]
                      + ([money4(r.staging) if r.staging else ""] if copies else [])
                      + ([_of_budget(r)] if budgets else []))
    money_cols = [Col("COST"), Col("", cut=8, drop=3), Col("TO TARGET", drop=2)] + \
        ([Col("OF WHICH DATA COPY", drop=1)] if copies else []) + \
        ([Col("BUDGET", drop=2)] if budgets else [])
    if by == "job":
        body = []
        for r in rows:
            if r.local:
                head = ["local", f"{r.jobs} job{'s' if r.jobs != 1 else ''} on this machine",
                        "", "", ""]
            else:
                head = [r.key, cells.printable(r.name or "-"),
                        time.strftime("%Y-%m-%d", time.localtime(r.created_at))
                        if _finite(r.created_at) is not None else "-",
                        cells.printable(r.what or "-"), r.instances or "-"]
            body.append(head + tail(r))
        body.append(["TOTAL", f"{total.jobs} job{'s' if total.jobs != 1 else ''}", "", "", ""]
                    + [_estimated(total.dollars, total.settled),
                       "" if total.settled else "includes estimates", ""]
                    + ([money4(total.staging)] if copies else []) + ([""] if budgets else []))
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
    Money is per run (`$/RUN`), where `catalog` shows per hour (`$/H`)."""
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
    # In a narrow terminal TRAINING goes, then GPUS (the type's name says them)
    cols = [Col("TYPE"), Col("GPUS", drop=5), Col("TRAINING", drop=4), Col("TOTAL"),
            Col("$/RUN ON-DEMAND"), Col("$/RUN SPOT"), Col("", cut=8, drop=2),
            Col("BASIS", cut=12, drop=1)]
    if est.staging_bytes or est.preread_s:
        cols[3:3] = [Col("DATA COPY", drop=3)]
    nvme = [r.instance_type for r in est.rows if r.on_nvme]
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
              f"cost: per-second billing (60 s minimum) + "
              + (f"{est.plain_disk_gb} GB gp3 root volume" if nvme and len(nvme) == len(est.rows)
                 else f"{est.disk_gb} GB gp3 root volume"
                 + (f" at {est.disk_mbps} MB/s" if est.disk_mbps else "")
                 + (f" ({est.plain_disk_gb} GB, no throughput bought, on the types that copy "
                    "onto their local NVMe)" if nvme else ""))
              + f" + a public IPv4 address (${cost.PUBLIC_IPV4_PER_HOUR}/h)"
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
        if nvme:
            later.append("data copy onto the local NVMe (free, lost with the instance; no root "
                         "volume space or gp3 throughput bought for it): " + ", ".join(nvme)
                         + ("; the other types copy onto the root volume, sized for it"
                            if len(nvme) < len(est.rows) else ""))
    later += [f"note: {n}" for n in est.notes]
    out = [line for text in texts for line in cells.wrapped(text, width, "", "  ")]
    out.append(grid(cols, rows, width=width))
    for text in later:
        indent = text[:len(text) - len(text.lstrip())]
        out += cells.wrapped(text.strip(), width, indent, indent + "  ")
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
    if getattr(report, "links_skipped", 0):
        lines.append(f"{report.links_skipped} links in the source skipped (a link is never "
                     "carried into the prepared folder)")
    megabytes = report.bytes_written / 1e6
    lines.append(f"wrote {report.written} files ({report.linked} hard links, "
                 f"{report.extracted} from tars, {megabytes:.1f} MB); {report.skipped} were "
                 f"already there; {duration(report.seconds)}")
    if report.sizes:
        sizes = ", ".join(str(n) for n in report.sizes)
        lines.append(f"resized copies: shorter side {sizes} px, {report.resample}, JPEG quality "
                     f"{report.quality}; smaller images kept as they are")
    capped = getattr(report, "max_sides", ())
    if capped:
        sides = ", ".join(str(n) for n in capped)
        lines.append(f"FFCV's copies (max/): longer side at most {sides} px, "
                     f"{report.capped_resample}, every image a JPEG at quality {report.quality}")
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
        shown = "; ".join(f"{cells.printable(path)} ({why})" for path, why in report.skipped[:5])
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
            size_text = cells.staged_size(size) if isinstance(size, dict) else "not read yet"
        last = r.get("last_staged") or {}
        staged = (f"{last.get('job')} {age(last.get('at'), now)} ago on {last.get('where')}"
                  if last else "never")
        out.append([r["name"], r["kind"], r["source"], size_text, staged])
    cols = [Col("NAME"), Col("KIND"), Col("SOURCE", cut=20), Col("SIZE", cut=12, drop=2),
            Col("LAST STAGED", cut=12, drop=1)]
    return grid(cols, out, width=width)


def datasets_json(rows: list[dict]) -> str:
    """`data ls --json`: when a dataset was last staged (`at`) in ISO 8601 UTC."""
    return json.dumps(cells.json_times(rows, lambda k: cells.is_time_key(k) or k == "at"),
                      indent=1)
