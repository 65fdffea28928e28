"""Capacity the user holds as a market (`--reservation cr-…`): an On-Demand Capacity
Reservation (ODCR) or a Capacity Block for ML, read from EC2, checked against the job before
anything is paid, priced from what it is, and named by every launch of the job's instances.

What EC2 documents and this follows:
- Launching into one: RunInstances with CapacityReservationSpecification.
  CapacityReservationTarget naming it, in its AZ ("Your instance can't launch in a subnet in a
  different Availability Zone"), of its type and platform; a Capacity Block's also with
  InstanceMarketOptions.MarketType "capacity-block" (User Guide: "Launch instances using
  Capacity Blocks"). Each instance takes one of its AvailableInstanceCount.
- An ODCR bills its type's on-demand rate whether instances run in it or not: a job in it
  costs on-demand, and nothing more than the reservation already does.
- A Capacity Block is paid up front, at purchase. EC2 shows the fee only in the offering
  (DescribeCapacityBlockOfferings' UpfrontFee): neither DescribeCapacityReservations nor
  DescribeCapacityBlocks has it. The job's price is its share of the block, the fee over the
  block's instance-hours; the fee is what the user says (`--block-fee`), else today's offering
  of a block of the same type, size and length, said as such.
- A Capacity Block's instances are terminated before its end: its Expiration Warning comes
  40 minutes before the end and says they "will begin to terminate in 10 minutes" (User
  Guide: "Monitor Capacity Blocks using EventBridge"). A job must be over before then: its
  max runtime is refused where it would not be.
"""

from __future__ import annotations

import math
import time
import weakref
from dataclasses import dataclass, replace

from ... import catalog
from ...errors import CloudtrainError, UsageError
from ...market import Market
from .errors import AWSError, AWSPlacementError
from .session import AwsSession

BLOCK = "capacity-block"  # ReservationType, and the RunInstances MarketType of a block
BLOCK_ENDS_S = 30 * 60  # a block's instances are terminated from this long before its end
LINUX = "Linux/UNIX"  # the platform of every image cloudtrain launches
NOT_FOUND = ("InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed")


@dataclass(frozen=True)
class Reservation:
    """One capacity reservation as EC2 describes it, and the price a job pays in it."""
    id: str
    block: bool  # a Capacity Block for ML (else an ODCR)
    zone: str
    instance_type: str
    state: str  # scheduled, active, expired, cancelled, ...
    total: int
    available: int
    start: float | None
    end: float | None  # None: an ODCR without an end date
    match: str  # InstanceMatchCriteria: open or targeted
    platform: str
    tenancy: str
    usd_per_hour: float | None = None  # an instance in it, per hour (priced())
    basis: str = ""  # where that price comes from, in words

    def kind(self) -> str:
        return "Capacity Block" if self.block else "capacity reservation"

    def stops_at(self) -> float | None:
        """When EC2 begins to terminate its instances: a block's end less BLOCK_ENDS_S."""
        return self.end - BLOCK_ENDS_S if self.block and self.end else None


def _stamp(value) -> float | None:
    return value.timestamp() if hasattr(value, "timestamp") else None


def read(aws: AwsSession, region: str, rid: str) -> Reservation:
    """The reservation `rid` in `region`, as EC2 describes it now; a one-line error where it
    is not there or cannot be read."""
    try:
        rows = aws.call(region, "describe_capacity_reservations",
                        CapacityReservationIds=[rid])["CapacityReservations"]
    except AWSError as exc:
        if exc.code in NOT_FOUND:
            raise UsageError(f"--reservation {rid}: no such capacity reservation in {region}",
                             hint="give --region where it is; `aws ec2 "
                                  "describe-capacity-reservations` lists yours") from None
        raise
    if not rows:
        raise UsageError(f"--reservation {rid}: no such capacity reservation in {region}")
    return _reservation(rows[0], rid)


def usable(aws: AwsSession, region: str) -> list[str]:
    """A line for each reservation of the account's in `region` a job could go into now or
    later (active or scheduled, for Linux, default tenancy), soonest end first: what
    `check` shows as --reservation's choices."""
    found: list[Reservation] = []
    token = None
    while True:
        page = aws.call(region, "describe_capacity_reservations", Filters=[
            {"Name": "state", "Values": ["active", "scheduled"]}],
            **({"NextToken": token} if token else {}))
        found += [_reservation(r, str(r.get("CapacityReservationId")))
                  for r in page.get("CapacityReservations", [])]
        token = page.get("NextToken")
        if not token:
            break
    found = [r for r in found if r.platform in ("", LINUX) and r.tenancy == "default"]
    found.sort(key=lambda r: (r.end is None, r.end or 0.0, r.id))
    # a scheduled one has none free until it starts (EC2 counts 0 available until then)
    return [f"{r.id}: {r.kind()}, "
            + (f"{r.total} {r.instance_type} in {r.zone} from {_when(r.start or 0.0)}"
               if r.state == "scheduled" else
               f"{r.available} of {r.total} {r.instance_type} free in {r.zone}")
            + (f", EC2 terminates its instances from {_when(stops)}"
               if (stops := r.stops_at()) is not None
               else f", until {_when(r.end)}" if r.end else "") for r in found]


def _reservation(r: dict, rid: str) -> Reservation:
    return Reservation(
        id=rid, block=r.get("ReservationType") == BLOCK, zone=str(r.get("AvailabilityZone")),
        instance_type=str(r.get("InstanceType")), state=str(r.get("State")),
        total=int(r.get("TotalInstanceCount") or 0),
        available=int(r.get("AvailableInstanceCount") or 0), start=_stamp(r.get("StartDate")),
        end=_stamp(r.get("EndDate")), match=str(r.get("InstanceMatchCriteria") or "open"),
        platform=str(r.get("InstancePlatform") or ""), tenancy=str(r.get("Tenancy") or "default"))


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def refusal(spec, r: Reservation, now: float | None = None) -> str | None:
    """Why the job cannot run in `r` (a line), or None: its type, its state, its free
    instances, its platform and tenancy, and a block's end against the max runtime."""
    now = time.time() if now is None else now
    place = spec.placement
    name = f"--reservation {r.id}"
    if place.instance_type != r.instance_type:
        return (f"{name} holds {r.instance_type}, not {place.instance_type}: launch with "
                f"--instance {r.instance_type}")
    if r.state == "scheduled" or (r.state == "active" and r.start and r.start > now):
        return (f"{name} ({r.kind()}) starts at {_when(r.start or now)}: instances go into it "
                "only from then; launch then")
    if r.state != "active":
        return f"{name} is {r.state}: instances go only into an active one"
    n = max(1, int(spec.nodes or 1))
    if r.available < n:
        return (f"{name} has {r.available} of its {r.total} {r.instance_type} free; the job "
                f"needs {n}")
    if r.platform and r.platform != LINUX:
        return f"{name} is for {r.platform}; cloudtrain's images are {LINUX}"
    if r.tenancy != "default":
        return f"{name} is for {r.tenancy} tenancy; cloudtrain launches default tenancy"
    stops = r.stops_at()
    if stops is not None:
        ends = now + spec.max_runtime_s
        if ends > stops:
            room = max(0.0, stops - now) / 60
            return (f"{name} ends at {_when(r.end or stops)} and EC2 terminates its instances "
                    f"from {_when(stops)}: the job's max runtime of "
                    f"{spec.max_runtime_s / 60:g} min would run past that (--max-runtime "
                    f"{int(room)}m at most)")
    return None


def offered_fee(aws: AwsSession, region: str, r: Reservation) -> float | None:
    """The lowest upfront fee EC2 offers now for a block like `r` (its type, size and
    length in hours), or None where nothing is offered or EC2 cannot be asked."""
    if not (r.start and r.end):
        return None
    hours = max(1, round((r.end - r.start) / 3600))
    try:
        rows = aws.call(region, "describe_capacity_block_offerings", InstanceType=r.instance_type,
                        InstanceCount=r.total, CapacityDurationHours=hours
                        ).get("CapacityBlockOfferings", [])
    except (AWSError, CloudtrainError):
        return None
    fees = []
    for row in rows:
        try:
            fee = float(row.get("UpfrontFee"))
        except (TypeError, ValueError):  # an answer we cannot read is not a price
            continue
        if math.isfinite(fee) and fee >= 0:
            fees.append(fee)
    return min(fees) if fees else None


def priced(aws: AwsSession, spec, region: str, r: Reservation) -> Reservation:
    """`r` with the price of an instance-hour in it and its basis; a UsageError where a
    block's fee is neither given nor offered."""
    if not r.block:
        t = catalog.get(r.instance_type)
        price = t.price(region, "on-demand") if t else None
        if price is None:
            raise UsageError(f"--reservation {r.id}: no on-demand price for {r.instance_type} "
                             f"in {region} to price it with",
                             hint="`cloudtrain prices --refresh` reads AWS's price list")
        return replace(r, usd_per_hour=price, basis="on-demand: a capacity reservation bills "
                                                    "its type's on-demand rate, used or not")
    hours = max((r.end or 0) - (r.start or 0), 0.0) / 3600
    if hours <= 0 or r.total < 1:
        raise UsageError(f"--reservation {r.id}: EC2 gave the block no length or size to "
                         "price it by")
    fee = spec.placement.block_fee
    if fee is not None:
        basis = f"the block's ${fee:,.2f} fee over {r.total} x {hours:g} h"
    else:
        fee = offered_fee(aws, region, r)
        if fee is None:
            raise UsageError(f"--reservation {r.id}: EC2 does not show a Capacity Block's fee "
                             "after its purchase, and offers no block like it now to price it "
                             "by", hint="give what you paid: --block-fee USD")
        basis = (f"today's offering of a block like it, ${fee:,.2f} over {r.total} x "
                 f"{hours:g} h (--block-fee: what you paid)")
    return replace(r, usd_per_hour=fee / (r.total * hours), basis=basis)


def held(aws: AwsSession, spec, region: str, now: float | None = None) -> Reservation | None:
    """The reservation this attempt of the job goes into, read, checked and priced (None:
    it has none, or it is a spot attempt, which goes in only once a deadline moves the job
    off spot); a UsageError where the job cannot run in it."""
    rid = spec.placement.reservation
    if not rid or spec.placement.market == Market.SPOT:
        return None
    r = read(aws, region, rid)
    why = refusal(spec, r, now)
    if why:
        raise UsageError(why)
    return priced(aws, spec, region, r)


_PLANNED: "weakref.WeakKeyDictionary[AwsSession, dict]" = weakref.WeakKeyDictionary()


def planned(aws: AwsSession, spec, region: str) -> Reservation | None:
    """held() for the plan, its price rows and its budget, read once per session (the launch
    reads it again, fresh), for a spot job with a deadline as its on-demand attempts will go
    into it; None without a reservation, or without credentials to read it with (the plan
    says so: unread())."""
    if not spec.placement.reservation:
        return None
    try:
        if aws.credentials(region) is None:
            return None
    except CloudtrainError:
        return None
    key = (region, spec.placement.reservation, spec.placement.block_fee, spec.nodes,
           spec.max_runtime_s)
    seen = _PLANNED.setdefault(aws, {})
    if key not in seen:
        later = spec if spec.placement.market != Market.SPOT else \
            spec.changed(market=Market.ON_DEMAND, max_price=None)
        seen[key] = held(aws, later, region)
    return seen[key]


def planned_for(aws: AwsSession, spec, region: str, market: str) -> Reservation | None:
    """planned(), where an attempt on `market` runs in it and it is priced: a spot attempt
    never does (only a deadline's on-demand attempts go into it)."""
    held = planned(aws, spec, region) if market != Market.SPOT else None
    return held if held is not None and held.usd_per_hour is not None else None


def unread(spec) -> str:
    """The plan's line on a reservation it could not read."""
    return (f"{spec.placement.reservation}: not read (no credentials): the launch reads it, "
            "and refuses what does not fit it; priced here at on-demand")


def zones(r: Reservation | None, ordered: list[tuple]) -> list[tuple]:
    """The AZs (zone, subnet, vpc, zone id) a launch tries: only the reservation's."""
    if r is None:
        return ordered
    found = [z for z in ordered if z[0] == r.zone]
    if not found:
        raise AWSPlacementError(f"--reservation {r.id} is in {r.zone}, where cloudtrain's VPC "
                                "has no subnet", hint="add a subnet in that AZ to the VPC")
    return found


def run_options(r: Reservation | None) -> dict:
    """What RunInstances adds to launch into `r` ({} without one)."""
    if r is None:
        return {}
    out: dict = {"CapacityReservationSpecification": {
        "CapacityReservationTarget": {"CapacityReservationId": r.id}}}
    if r.block:
        out["InstanceMarketOptions"] = {"MarketType": BLOCK}
    return out


def instance_price(r: Reservation | None, instance_type: str, region: str) -> float | None:
    """What an instance of the job bills per hour outside spot: its share of the
    reservation `r`, else its type's on-demand price (None where the catalog has none)."""
    if r is not None and r.usd_per_hour is not None:
        return r.usd_per_hour
    t = catalog.get(instance_type)
    return t.price(region, "on-demand") if t else None


def record(r: Reservation | None) -> dict:
    """What an instance's record keeps of the reservation it runs in ({} without one)."""
    if r is None:
        return {}
    return {"reservation": r.id, "reservation_kind": BLOCK if r.block else "odcr",
            "reservation_ends_at": r.end, "price_basis": r.basis}


def said(r: Reservation) -> str:
    """The plan's line on the reservation the job runs in."""
    line = (f"{r.id}, a {r.kind()} of {r.total} {r.instance_type} in {r.zone}, "
            f"{r.available} free")
    stops = r.stops_at()
    if stops is not None:
        line += (f"; it ends at {_when(r.end or stops)}, and EC2 terminates its instances "
                 f"from {_when(stops)}")
    elif r.end:
        line += f"; it ends at {_when(r.end)}"
    return line + f"; ${r.usd_per_hour:.4f}/h an instance ({r.basis})"
