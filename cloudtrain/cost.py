"""What a job cost: pure functions over EC2 launch/termination times and prices.

AWS rules relied on (Linux instances, the only kind cloudtrain launches):

* EC2 bills per second with a 60-second minimum per instance run (launch to termination).
  A run shorter than 60 s is billed as if it had run for 60 s.
* On-demand: the catalog price per hour, constant over the run.
* Spot: the Spot price in force, which AWS changes over time (per instance type and
  Availability Zone); each second is billed at the price in force in that second. The price
  history (``DescribeSpotPriceHistory``) is piecewise constant: a point applies from its
  timestamp until the next point. The history must be fetched for the run's AZ and must cover
  the run (fetch it after termination, starting before launch).
* EBS volumes (gp3 root volume): priced per GB-month, billed per second with a 60-second
  minimum. AWS prorates a GB-month over the hours of the actual billing month (672 h in a
  28-day month ... 744 h in a 31-day month); we use the yearly average of 730 h
  (``HOURS_PER_MONTH``), so our volume figure is ~1.9 % above the invoice's in a 31-day month
  and ~7.9 % below it in February. Pass ``hours_per_month`` to ``ebs_cost`` for the exact month.
* Public IPv4 addresses: $0.005 per address per hour, in use or not (Amazon VPC pricing, since
  2024-02-01); an instance with a public address pays it for as long as it runs.

Choices of ours, where AWS does not say:

* The 60 s minimum on spot: a run shorter than 60 s is billed for the window
  [start, start + 60 s] of the spot price history, i.e. as if it had run for 60 s (with
  a single price in that minute this is 60 s at the price in force at ``start``).
  Billing "60 s at the price in force at start" instead would make the cost fall when a
  59 s run becomes a 60 s one across a price drop; ours is monotone in the end time.
* A still-running instance (``end=None``) is billed up to ``now`` and marked unsettled.
* A public IPv4 address is prorated by the second with no minimum (AWS states an hourly rate).
* Money is a float in USD, summed with ``math.fsum``; round only for display.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Sequence

from .market import Market

__all__ = [
    "MIN_BILLED_SECONDS", "HOURS_PER_MONTH", "GP3_PRICE_PER_GB_MONTH", "PUBLIC_IPV4_PER_HOUR", "PricePoint", "Billed",
    "Gp3Price", "InstanceRun", "Phase", "billed_seconds", "on_demand_cost", "spot_cost",
    "ebs_cost", "gp3_price", "instance_cost", "job_cost", "cost_by_phase", "cost_to_target",
]

MIN_BILLED_SECONDS = 60.0
# Every public IPv4 address, in use or idle: $0.005 an hour since 2024-02-01 (Amazon VPC
# pricing); prorated by the second here, with no minimum (AWS states an hourly rate only).
PUBLIC_IPV4_PER_HOUR = 0.005
HOURS_PER_MONTH = 730.0          # 365 * 24 / 12, the month of AWS's pricing calculator
GP3_PRICE_PER_GB_MONTH: dict[str, float] = {
    # Only figures with a source we trust (see shared/data/README.md, "EBS gp3"): AWS's own
    # reference gives $0.08 in us-east-1, "approximate as of early 2026".
    "us-east-1": 0.08,
}
_DEFAULT_GP3_REGION = "us-east-1"
# gp3 performance beyond what comes with the volume (3,000 IOPS, 125 MB/s), us-east-1 list
# prices: USD per provisioned MB/s-month and per IOPS-month.
GP3_BASE_MBPS, GP3_BASE_IOPS = 125, 3000
GP3_MBPS_MONTH, GP3_IOPS_MONTH = 0.040, 0.005


def gp3_iops_for(mbps: int) -> int:
    """The IOPS a gp3 volume needs for `mbps` (at most 0.25 MB/s per IOPS)."""
    return max(GP3_BASE_IOPS, int(mbps) * 4)


def gp3_performance_per_month(mbps: int, iops: int | None = None) -> float:
    """USD per month for provisioning a gp3 volume to `mbps` and `iops` (default: the IOPS
    that `mbps` needs)."""
    iops = gp3_iops_for(mbps) if iops is None else int(iops)
    return (max(int(mbps) - GP3_BASE_MBPS, 0) * GP3_MBPS_MONTH
            + max(iops - GP3_BASE_IOPS, 0) * GP3_IOPS_MONTH)


@dataclass(frozen=True)
class PricePoint:
    """One row of EC2 spot price history: ``price`` (USD/hour) is in force from ``at`` (unix s)
    until the next point."""
    at: float
    price: float


@dataclass(frozen=True)
class Billed:
    dollars: float
    billed_seconds: float          # after the 60 s minimum
    settled: bool                  # closed interval and prices known for all of it
    notes: tuple[str, ...] = ()    # why it is an estimate


@dataclass(frozen=True)
class Gp3Price:
    per_gb_month: float
    approximate: bool              # True when the region has no figure of its own here
    note: str = ""


@dataclass(frozen=True)
class InstanceRun:
    """One instance of one attempt of a job."""
    instance_id: str
    market: str                    # "on-demand" | "spot" | "local"
    start: float                   # launch time from EC2
    end: float | None              # termination time from EC2; None = still running
    price_per_hour: float | None   # on-demand catalog price
    spot_history: tuple[PricePoint, ...] = ()
    disk_gb: float = 0.0
    gp3_per_gb_month: float | None = None
    public_ipv4: int = 0              # public IPv4 addresses it held (PUBLIC_IPV4_PER_HOUR)


@dataclass(frozen=True)
class Phase:
    name: str
    start: float
    end: float | None              # None = open (until the instances stop)


# --- internals --------------------------------------------------------------------------

@dataclass(frozen=True)
class _Charge:
    """One billed resource: piecewise-constant ``segments`` (t0, t1, usd_per_hour) covering the
    actual interval [start, end], plus ``extra`` dollars for the 60 s minimum beyond it."""
    segments: tuple[tuple[float, float, float], ...]
    extra: float
    billed_seconds: float
    short: bool                    # shorter than 60 s: billed for the minimum
    settled: bool
    notes: tuple[str, ...]

    def pieces(self) -> list[float]:
        return [_dollars(rate, t0, t1) for t0, t1, rate in self.segments] + [self.extra]

    def billed(self) -> Billed:
        return Billed(math.fsum(self.pieces()), self.billed_seconds, self.settled, self.notes)


def _dollars(usd_per_hour: float, t0: float, t1: float) -> float:
    return usd_per_hour * (t1 - t0) / 3600.0


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def _nonneg(name: str, value: float) -> float:
    value = _finite(name, value)
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return value


def _interval(start: float, end: float | None, now: float | None) -> tuple[float, float, tuple[str, ...]]:
    """The interval to bill, and the note if it is still open."""
    start = _finite("start", start)
    notes: tuple[str, ...]
    if end is None:
        if now is None:
            raise ValueError("end is None (still running): pass now= to bill up to it")
        stop, notes = _finite("now", now), (f"still running at {_utc(now)}; billed up to then",)
    else:
        stop, notes = _finite("end", end), ()
    if stop < start:
        raise ValueError(f"interval ends before it starts: start={start!r}, end={stop!r}")
    return start, stop, notes


def _constant_charge(start, end, usd_per_hour, now) -> _Charge:
    start, stop, notes = _interval(start, end, now)
    segments = ((start, stop, usd_per_hour),) if stop > start else ()
    short = max(0.0, MIN_BILLED_SECONDS - (stop - start))
    return _Charge(segments, usd_per_hour * short / 3600.0, billed_seconds(start, stop),
                   short > 0, not notes, notes)


def _spot_segments(t0: float, t1: float, ats: list[float], prices: list[float]):
    """Segments (a, b, price) of the sorted history over [t0, t1]; before the first point the
    first price applies."""
    out = []
    a = t0
    while a < t1:
        i = bisect.bisect_right(ats, a) - 1         # last point at or before a
        b = min(t1, ats[i + 1]) if i + 1 < len(ats) else t1
        out.append((a, b, prices[max(i, 0)]))
        a = b
    return out


def _spot_charge(start, end, history: Iterable[PricePoint], now) -> _Charge:
    start, stop, notes = _interval(start, end, now)
    points = sorted(history, key=lambda p: p.at)    # stable: among equal `at`, the last wins
    if not points:
        raise ValueError("no spot price history: cannot price a spot run")
    ats = [_finite("PricePoint.at", p.at) for p in points]
    prices = [_nonneg("PricePoint.price", p.price) for p in points]
    segments = _spot_segments(start, stop, ats, prices)
    extra = 0.0
    if stop - start < MIN_BILLED_SECONDS:
        extra = math.fsum(_dollars(r, a, b) for a, b, r in
                          _spot_segments(stop, start + MIN_BILLED_SECONDS, ats, prices))
    settled = not notes
    if start < ats[0]:
        settled = False
        notes += (f"no spot price at or before {_utc(start)}, used the first known price "
                  f"(${prices[0]}/h from {_utc(ats[0])})",)
    return _Charge(tuple(segments), extra, billed_seconds(start, stop),
                   stop - start < MIN_BILLED_SECONDS, settled, notes)


def _ebs_charge(start, end, size_gb, price_per_gb_month, now, hours_per_month) -> _Charge:
    usd_per_hour = (_nonneg("size_gb", size_gb) * _nonneg("price_per_gb_month", price_per_gb_month)
                    / _finite("hours_per_month", hours_per_month))
    return _constant_charge(start, end, usd_per_hour, now)


def _run_charges(run: InstanceRun, now) -> tuple[list[_Charge], tuple[str, ...]]:
    """The compute charge first, then the volume's (if any); plus notes of the run itself."""
    if run.market == "local":
        return [], ()
    notes: tuple[str, ...] = ()
    if run.market == Market.ON_DEMAND:
        if run.price_per_hour is None:
            raise ValueError(f"{run.instance_id}: on-demand run without price_per_hour")
        charges = [_constant_charge(run.start, run.end, _nonneg("price_per_hour",
                                                                run.price_per_hour), now)]
    elif run.market == Market.SPOT:
        if run.spot_history:
            charges = [_spot_charge(run.start, run.end, run.spot_history, now)]
        elif run.price_per_hour is not None:
            c = _constant_charge(run.start, run.end, _nonneg("price_per_hour",
                                                             run.price_per_hour), now)
            charges = [c]
            notes += (f"no spot price history, used the recorded price ${run.price_per_hour}/h",)
        else:
            raise ValueError(f"{run.instance_id}: spot run without price history or price")
    else:
        raise ValueError(f"{run.instance_id}: unknown market {run.market!r}")
    if run.disk_gb:
        price = run.gp3_per_gb_month
        if price is None:
            gp3 = gp3_price(_DEFAULT_GP3_REGION)
            price = gp3.per_gb_month
            notes += (f"no gp3 price recorded, used the {_DEFAULT_GP3_REGION} figure "
                      f"${price}/GB-month",)
        charges.append(_ebs_charge(run.start, run.end, run.disk_gb, price, now, HOURS_PER_MONTH))
    if run.public_ipv4:
        ipv4 = _constant_charge(run.start, run.end,
                                _nonneg("public_ipv4", run.public_ipv4) * PUBLIC_IPV4_PER_HOUR,
                                now)
        charges.append(dataclasses.replace(ipv4, extra=0.0, short=False))  # no 60 s minimum
    return charges, notes


def _unique(notes: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(notes))


# --- public API -------------------------------------------------------------------------

def billed_seconds(start: float, end: float) -> float:
    """EC2 Linux per-second billing with a 60-second minimum per instance run:
    ``max(60, end - start)``."""
    start, end = _finite("start", start), _finite("end", end)
    if end < start:
        raise ValueError(f"interval ends before it starts: start={start!r}, end={end!r}")
    return max(MIN_BILLED_SECONDS, end - start)


def on_demand_cost(start: float, end: float | None, price_per_hour: float, *,
                   now: float | None = None) -> Billed:
    """On-demand: ``price_per_hour`` over the billed seconds (60 s minimum). ``end=None`` means
    still running: billed up to ``now`` (required then) and not settled."""
    return _constant_charge(start, end, _nonneg("price_per_hour", price_per_hour), now).billed()


def spot_cost(start: float, end: float | None, history: Sequence[PricePoint], *,
              now: float | None = None) -> Billed:
    """Spot: the integral of the piecewise-constant spot price over [start, end].

    ``history`` may be unsorted. The price in force at ``start`` is the last point at or before
    ``start``; changes inside the interval are counted. With no point at or before ``start``
    the first point's price is used for the uncovered prefix and the result is not settled.
    A run shorter than 60 s is billed for [start, start + 60 s] (see the module docstring).
    ``end=None``: billed up to ``now`` (required then), not settled."""
    return _spot_charge(start, end, history, now).billed()


def ebs_cost(start: float, end: float | None, size_gb: float, price_per_gb_month: float, *,
             now: float | None = None, hours_per_month: float = HOURS_PER_MONTH) -> Billed:
    """EBS gp3 storage: ``size_gb * price_per_gb_month`` prorated per second over a month of
    ``hours_per_month`` (730 by default; AWS uses the billing month's own length), with a 60 s
    minimum. ``end=None``: billed up to ``now`` (required then), not settled."""
    return _ebs_charge(start, end, size_gb, price_per_gb_month, now, hours_per_month).billed()


def gp3_price(region: str) -> Gp3Price:
    """The gp3 price per GB-month for ``region``: its own figure when
    ``GP3_PRICE_PER_GB_MONTH`` has one, else the us-east-1 figure flagged ``approximate``."""
    if region in GP3_PRICE_PER_GB_MONTH:
        return Gp3Price(GP3_PRICE_PER_GB_MONTH[region], approximate=False)
    price = GP3_PRICE_PER_GB_MONTH[_DEFAULT_GP3_REGION]
    return Gp3Price(price, approximate=True,
                    note=f"no gp3 price known for {region}; used the {_DEFAULT_GP3_REGION} "
                         f"figure ${price}/GB-month (prices differ by region)")


def instance_cost(run: InstanceRun, *, now: float | None = None) -> Billed:
    """Compute (on-demand or spot) plus the root volume (``disk_gb`` of gp3) and its public
    IPv4 addresses (``public_ipv4``) over the run.

    ``billed_seconds`` is the compute's. A spot run with no history but a recorded
    ``price_per_hour`` is billed at that price, not settled; a volume without
    ``gp3_per_gb_month`` is priced at the us-east-1 figure, not settled. A "local" run costs 0
    and is settled."""
    if run.market == "local":
        return Billed(0.0, 0.0, True)
    charges, notes = _run_charges(run, now)
    return Billed(
        math.fsum(p for c in charges for p in c.pieces()),
        charges[0].billed_seconds,
        all(c.settled for c in charges) and not notes,
        _unique([n for c in charges for n in c.notes] + list(notes)),
    )


def job_cost(runs: Sequence[InstanceRun], *, now: float | None = None) -> Billed:
    """The sum over every instance of every attempt; settled only if every part is (a job with
    no instances costs 0, settled). Notes are prefixed with the instance id."""
    parts = [(r.instance_id, instance_cost(r, now=now)) for r in runs]
    return Billed(
        math.fsum(b.dollars for _, b in parts),
        math.fsum(b.billed_seconds for _, b in parts),
        all(b.settled for _, b in parts),
        tuple(f"{iid}: {n}" for iid, b in parts for n in b.notes),
    )


def cost_by_phase(runs: Sequence[InstanceRun], phases: Sequence[Phase], *,
                  now: float | None = None) -> dict[str, float]:
    """Split ``job_cost(runs).dollars`` over the job's timeline ``phases``.

    Each phase gets the cost of the instances' (compute and volume) time inside its window
    [start, end) (``end=None``: open-ended). Time outside every phase, and each 60 s minimum's
    extra (billed minus actual seconds), go to ``"other"``. Phases must not overlap (touching is
    fine); phases sharing a name are added up. The values add up to the job's cost."""
    windows = []
    for p in phases:
        ps = _finite("Phase.start", p.start)
        pe = math.inf if p.end is None else _finite("Phase.end", p.end)
        if pe < ps:
            raise ValueError(f"phase {p.name!r} ends before it starts")
        windows.append((ps, pe, p.name))
    windows.sort(key=lambda w: w[0])
    for (_, e1, n1), (s2, _, n2) in zip(windows, windows[1:]):
        if s2 < e1:
            raise ValueError(f"phases {n1!r} and {n2!r} overlap")
    acc: dict[str, list[float]] = {p.name: [] for p in phases}
    acc.setdefault("other", [])
    for run in runs:
        for charge in _run_charges(run, now)[0]:
            acc["other"].append(charge.extra)
            for t0, t1, rate in charge.segments:
                cursor = t0
                for ps, pe, name in windows:
                    a, b = max(cursor, ps), min(t1, pe)
                    if a >= b:
                        continue
                    acc["other"].append(_dollars(rate, cursor, a))
                    acc[name].append(_dollars(rate, a, b))
                    cursor = b
                acc["other"].append(_dollars(rate, cursor, t1))
    return {name: math.fsum(v) for name, v in acc.items()}


def cost_to_target(runs: Sequence[InstanceRun], target_time: float, *,
                   now: float | None = None) -> float:
    """DAWNBench-style cost to reach a result at wall-clock ``target_time``: every instance
    billed as if it had stopped then (runs launched later cost nothing). Truncation does not
    add a 60 s minimum; a run that itself lasted under 60 s is billed its minimum in full,
    since AWS charges that minute whenever such a run stops."""
    target = _finite("target_time", target_time)
    pieces = []
    for run in runs:
        if run.market == "local" or run.start >= target:
            continue
        for charge in _run_charges(run, now)[0]:
            if charge.short:                        # the run itself was shorter than 60 s
                pieces.extend(charge.pieces())
                continue
            for t0, t1, rate in charge.segments:
                if t0 < target:
                    pieces.append(_dollars(rate, t0, min(t1, target)))
    return math.fsum(pieces)
