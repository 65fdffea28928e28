"""What each job cost, from the store: the bridge between the ledger of what happened
(instances with EC2's launch and termination times, the timeline, the target event) and the
pure cost arithmetic in cost.py. Reports read only the store, so they work offline.
"""

from __future__ import annotations

import csv
import math
import io
import re
import time
from dataclasses import dataclass
from typing import Any

from . import cost
from .state import Instance, Job, Store
from .state_columns import json_column

# Timeline phases -> the cost phases a user reads.
COST_PHASES = (("boot", ("provisioning", "instance")), ("setup", ("syncing", "setting-up")),
               ("staging", ("staging",)), ("training", ("running",)))


def runs_of(store: Store, job: Job) -> list[cost.InstanceRun]:
    return [run_of(i) for i in store.instances(job.id)]


def spent_before(store: Store, job: Job, current: int, now: float | None = None) -> float:
    """USD the job's earlier attempts cost (their instances; a run not yet seen ending is
    billed to `now`, erring on the side of a budget): all its instances but the `current`
    newest, which are the attempt being launched."""
    instances = sorted(store.instances(job.id), key=lambda i: i.launched_at or 0.0)
    earlier = instances[:max(0, len(instances) - current)]
    if not earlier:
        return 0.0
    return cost.job_cost([run_of(i) for i in earlier], now=now).dollars


def run_of(inst: Instance) -> cost.InstanceRun:
    details = inst.details or {}
    history = tuple(cost.PricePoint(float(at), float(price))
                    for at, price in details.get("spot_history") or [])
    gp3 = details.get("gp3_per_gb_month")
    if gp3 is None and details.get("disk_gb") and inst.region:
        from . import catalog

        gp3 = catalog.gp3_price(inst.region).per_gb_month
    disk_gb = float(details.get("disk_gb") or 0.0)
    volumes = [v for v in details.get("data_volumes") or [] if isinstance(v, dict)]
    if gp3 is None and volumes and inst.region:
        from . import catalog

        gp3 = catalog.gp3_price(inst.region).per_gb_month
    if gp3 is not None and (volumes or details.get("disk_mbps")):
        # Provisioned throughput and IOPS, and the snapshot volumes the job's datasets came
        # on, are billed by the month like the root's GBs: folded into one price per GB.
        monthly = gp3 * disk_gb + (cost.gp3_performance_per_month(details["disk_mbps"])
                                   if details.get("disk_mbps") else 0.0)
        for v in volumes:
            gb = float(v.get("gb") or 0)
            monthly += gp3 * gb + cost.gp3_performance_per_month(
                int(v.get("mbps") or cost.GP3_BASE_MBPS), int(v.get("iops") or cost.GP3_BASE_IOPS))
            disk_gb += gb
        gp3 = monthly / disk_gb if disk_gb else gp3
    price = inst.price_per_hour
    if price is None and inst.instance_type and inst.region:
        # No price recorded (spot whose history is not fetched yet): the catalog's figure,
        # as an estimate (cost.py marks a spot run without history unsettled).
        from . import catalog

        t = catalog.get(inst.instance_type)
        price = t.price(inst.region, inst.market or "on-demand") if t else None
        if price is None and t is not None:
            price = t.price(inst.region, "on-demand")
    market = inst.market or "on-demand"
    if market not in ("on-demand", "spot", "local"):
        market = "on-demand"
    return cost.InstanceRun(
        instance_id=inst.id, market=market,
        start=inst.launched_at or 0.0, end=inst.terminated_at,
        price_per_hour=price, spot_history=history,
        disk_gb=disk_gb, gp3_per_gb_month=gp3,
        public_ipv4=int(details.get("public_ipv4") or 0) if isinstance(
            details.get("public_ipv4"), (int, bool)) else 0)


def phases_of(store: Store, job: Job) -> list[cost.Phase]:
    events = store.events(job.id)
    starts: dict[str, float] = {}
    for ev in events:
        starts.setdefault(ev.phase, ev.at)
    marks = []
    for name, phases in COST_PHASES:
        at = min((starts[p] for p in phases if p in starts), default=None)
        if at is not None:
            marks.append((name, at))
    if job.ended_at is not None:
        marks.append(("teardown", job.ended_at))
    # The marks come from two clocks (the launching process's events, the agent's end), and
    # a short job can end before its launcher records "running": keep them in order.
    ordered: list[tuple[str, float]] = []
    for name, at in marks:
        ordered.append((name, max(at, ordered[-1][1]) if ordered else at))
    return [cost.Phase(name, at, ordered[i + 1][1] if i + 1 < len(ordered) else None)
            for i, (name, at) in enumerate(ordered)]


def settle(store: Store, job: Job, target_time: float | None = None,
           now: float | None = None) -> cost.Billed:
    """Compute the job's cost from its instances and record it (settled or an estimate)."""
    now = time.time() if now is None else now
    runs = runs_of(store, job)
    try:
        billed = cost.job_cost(runs, now=now)
    except ValueError as exc:  # e.g. a type the catalog has no price for: say so, not fail
        store.update_job(job.id, cost=None, cost_settled=0,
                         cost_detail={"notes": [f"cost unknown: {exc}"]})
        return cost.Billed(0.0, 0.0, False, (f"cost unknown: {exc}",))
    detail: dict[str, Any] = {"notes": list(billed.notes),
                              "billed_seconds": billed.billed_seconds}
    if runs:
        try:
            detail["phases"] = cost.cost_by_phase(runs, phases_of(store, job), now=now)
        except ValueError as exc:  # a timeline we cannot split: the total still stands
            detail["notes"].append(f"no split per phase: {exc}")
        if target_time is not None:
            detail["to_target"] = cost.cost_to_target(runs, target_time, now=now)
            detail["target_time"] = target_time
    store.update_job(job.id, cost=billed.dollars, cost_settled=int(billed.settled),
                     cost_detail=detail)
    return billed


# -- reports -----------------------------------------------------------------------------------

GROUPINGS = ("job", "recipe", "instance", "day", "month")


@dataclass
class Row:
    key: str  # the group: a job's id, a recipe, an instance, a day or a month
    jobs: int
    dollars: float
    settled: bool  # every contribution settled
    to_target: float | None = None
    staging: float = 0.0  # of `dollars`: copying datasets onto the disk before training
    # By job: what the job was; `local`: the one row of every job run on this machine,
    # which costs nothing (a row each buried the cloud jobs).
    name: str | None = None
    created_at: float | None = None
    what: str | None = None  # what it ran, as status's WHAT: the recipe and its arguments
    instances: str | None = None  # instance types, e.g. "g5.xlarge" or "2 x p3.16xlarge"
    local: bool = False
    budget: float | None = None  # by job: its --budget, USD


# A duration's units, in seconds: m is minutes (30m), as `status --since` has always read it;
# min and mo say minutes and months (30 days) without doubt, y is 365 days.
DURATION_UNITS = {"s": 1, "min": 60, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400,
                  "mo": 30 * 86400, "y": 365 * 86400}
DURATION = re.compile(r"\s*([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*"
                      r"(s|min|mo|m|h|d|w|y)\s*\Z")


def duration_seconds(text: str) -> tuple[float, str] | None:
    """'30d' -> (2592000.0, 'd'); None when `text` is not a number and a unit."""
    m = DURATION.match(text or "")
    if not m:
        return None
    return float(m.group(1)) * DURATION_UNITS[m.group(2)], m.group(2)


def parse_since(text: str | None, now: float) -> float | None:
    from .errors import UsageError

    if not text:
        return None
    got = duration_seconds(text)
    if got is None:
        raise UsageError(f"--since {text}: expected a number and a unit, e.g. 30d, 12h, 2w") from None
    return now - got[0]


def report(store: Store, by: str = "job", since: str | None = None,
           now: float | None = None) -> tuple[list[Row], Row]:
    """Rows and the total, newest first (job) or by key."""
    now = time.time() if now is None else now
    start = parse_since(since, now)
    where, params = ("WHERE created_at >= ?", (start,)) if start is not None else ("", ())
    jobs = store.db.execute(
        f"SELECT id, name, recipe, command, backend, created_at, cost, cost_settled, "
        f"cost_detail, spec FROM jobs {where} ORDER BY created_at DESC, id", params).fetchall()
    rows: dict[str, Row] = {}
    if by == "instance":
        ids = [j["id"] for j in jobs]
        inst = store.db.execute(
            f"SELECT i.*, j.cost_settled FROM instances i JOIN jobs j ON j.id = i.job_id "
            f"{'WHERE j.created_at >= ?' if start is not None else ''}", params).fetchall() \
            if ids else []
        for r in inst:
            i = Instance(**{k: r[k] for k in Instance.__dataclass_fields__ if k != "details"},
                         details=json_column(r["details"]))
            if i.provider == "local":  # this machine is one row, not one per job
                row = rows.setdefault(LOCAL, Row(LOCAL, 0, 0.0, True, local=True))
                row.jobs += 1
                continue
            key = f"{i.id} ({i.instance_type}, {i.market})"
            try:
                billed = cost.instance_cost(run_of(i), now=now)
            except ValueError as exc:  # times or prices that cannot be billed (an edited row)
                rows[key] = Row(f"{key} (cost unknown: {exc})", 1, 0.0, False)
                continue
            rows[key] = Row(key, 1, billed.dollars, billed.settled)
    else:
        types = _instance_types(store, [j["id"] for j in jobs]) if by == "job" else {}
        for j in jobs:
            if by == "job" and j["backend"] == "local":
                key = LOCAL  # the jobs of this machine, which cost nothing, as one row
            elif by == "job":
                key = j["id"]
            elif by == "recipe":
                key = j["recipe"] or "(own command)"
            elif by == "day":
                key = time.strftime("%Y-%m-%d", time.localtime(j["created_at"]))
            else:
                key = time.strftime("%Y-%m", time.localtime(j["created_at"]))
            row = rows.setdefault(key, Row(key, 0, 0.0, True, local=key == LOCAL and by == "job"))
            if by == "job" and not row.local:
                row.name, row.created_at = j["name"], j["created_at"]
                row.what = j["command"]
                row.instances = types.get(j["id"])
                spec = json_column(j["spec"])
                budget = spec.get("budget_usd") if isinstance(spec, dict) else None
                row.budget = float(budget) if isinstance(budget, (int, float)) and \
                    not isinstance(budget, bool) and math.isfinite(budget) else None
            row.jobs += 1
            dollars = j["cost"]
            if dollars is None:  # never settled (a launch that failed before the job ran)
                dollars = unrecorded_cost(store, j["id"], now)
            row.dollars += dollars or 0.0
            row.settled = row.settled and bool(j["cost_settled"])
            detail = json_column(j["cost_detail"]) or {}
            phases = detail.get("phases") if isinstance(detail, dict) else None
            staging = phases.get("staging") if isinstance(phases, dict) else None
            if isinstance(staging, (int, float)) and staging == staging:
                row.staging += staging
            if by == "job" and not row.local:
                row.to_target = detail.get("to_target") if isinstance(detail, dict) else None
    local = rows.pop(LOCAL, None) if by in ("job", "instance") else None
    ordered = list(rows.values()) + ([local] if local else []) if by in ("job", "instance") else \
        sorted(rows.values(), key=lambda r: r.key, reverse=by in ("day", "month"))
    total = Row("total", sum(r.jobs for r in ordered),
                sum(r.dollars for r in ordered), all(r.settled for r in ordered),
                staging=sum(r.staging for r in ordered))
    return ordered, total



LOCAL = "local"  # the one row of the jobs (or instances) of this machine


def _instance_types(store: Store, ids: list[str]) -> dict[str, str]:
    """{job id: its instance types as a cell: "g5.xlarge", "2 x p3.16xlarge", "g5.xlarge,
    p3.2xlarge" (a relaunch on another type)}; one query."""
    counts: dict[str, dict[str, int]] = {}
    for r in store.db.execute("SELECT job_id, instance_type FROM instances WHERE provider != "
                              "'local' ORDER BY launched_at"):
        counts.setdefault(r["job_id"], {}).setdefault(r["instance_type"] or "?", 0)
        counts[r["job_id"]][r["instance_type"] or "?"] += 1
    return {job: ", ".join(t if n == 1 else f"{n} x {t}" for t, n in by_type.items())
            for job, by_type in counts.items() if job in set(ids)}


def unrecorded_cost(store: Store, job_id: str, now: float) -> float | None:
    """The estimate of a job no cost was recorded for, from its instances' own times (60 s
    minimum; up to now for one still running) and the catalog's prices: a launch that failed
    waiting for SSH terminates its instance without settling, and its 26 s of EC2 were shown
    as $0.0000. None where there is nothing to bill or it cannot be priced."""
    runs = [run_of(i) for i in store.instances(job_id)]
    if not runs:
        return None
    try:
        return cost.job_cost(runs, now=now).dollars
    except ValueError:  # no price known for the type: the report cannot say more
        return None


# The JSON name of what a row groups by: a job is "id" as in every other --json.
JSON_KEYS = {"job": "id"}


def report_json(rows: list[Row], total: Row, by: str) -> str:
    """`cost-report --json`: each row's group under the name of what it groups (id of a job,
    recipe, instance, day, month), then jobs, dollars, settled, to_target, staging."""
    import dataclasses
    import json

    name = JSON_KEYS.get(by, by)

    def row(r: Row) -> dict:
        data = dataclasses.asdict(r)
        extra = ("name", "created_at", "what", "instances")
        if by != "job" or r.local or r.key == "total":
            for k in extra:
                data.pop(k)
        if not r.local:
            data.pop("local")
        return {name: data.pop("key"), **data}

    from .cells import json_times  # a job's created_at in ISO 8601 UTC

    return json.dumps(json_times({"by": by, "rows": [row(r) for r in rows],
                                  "total": row(total)}), indent=1)


def report_csv(rows: list[Row], total: Row, by: str) -> str:
    """`cost-report --csv`: by job, also each job's name, creation time (ISO 8601), what it
    ran and its instance types."""
    out = io.StringIO()
    w = csv.writer(out)
    described = by == "job"
    w.writerow([by, *(("name", "created", "what", "instances") if described else ()),
                "jobs", "usd", "settled", "usd_to_target", "usd_data_copy"])
    for r in [*rows, total]:
        extra: tuple[str, ...] = ()
        if described:
            created = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(r.created_at)) \
                if r.created_at is not None else ""
            extra = (r.name or "", created, r.what or "", r.instances or "")
        w.writerow([r.key, *extra, r.jobs, f"{r.dollars:.6f}",
                    "yes" if r.settled else "estimate",
                    "" if r.to_target is None else f"{r.to_target:.6f}", f"{r.staging:.6f}"])
    return out.getvalue()


def spot_savings(store: Store, since: str | None = None, now: float | None = None) -> dict:
    """What the spot instances of the jobs created since `since` cost, what the same hours
    would have cost on-demand (the catalog's price of each type and region), and the
    difference: the dashboard's spot savings. Instances the catalog cannot price on-demand
    are counted apart."""
    import dataclasses

    from . import catalog

    now = time.time() if now is None else now
    start = parse_since(since, now)
    spent = on_demand = 0.0
    counted = unpriced = 0
    rows = store.db.execute(
        "SELECT i.* FROM instances i JOIN jobs j ON j.id = i.job_id WHERE i.market = 'spot'"
        + (" AND j.created_at >= ?" if start is not None else ""),
        (start,) if start is not None else ()).fetchall()
    for r in rows:
        inst = Instance(**{**dict(r), "details": json_column(r["details"])})
        t = catalog.get(inst.instance_type or "")
        price = t.price(inst.region, "on-demand") if t and inst.region else None
        if price is None:
            unpriced += 1
            continue
        run = run_of(inst)
        try:
            spent += cost.instance_cost(run, now=now).dollars
            on_demand += cost.instance_cost(dataclasses.replace(
                run, market="on-demand", price_per_hour=price, spot_history=()),
                now=now).dollars
        except ValueError:  # a run the cost model cannot price
            unpriced += 1
            continue
        counted += 1
    return {"spot_usd": spent, "on_demand_usd": on_demand, "saved_usd": on_demand - spent,
            "instances": counted, "unpriced": unpriced}
