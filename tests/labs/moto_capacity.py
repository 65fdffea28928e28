"""EC2's Capacity Reservations (ODCRs) and Capacity Blocks for ML for moto, which has neither
(moto 5.2: the calls "have not been implemented"; RunInstances ignores
CapacityReservationSpecification and calls a capacity-block instance "spot"), as EC2
documents them: what a job launched into one (`--reservation`) meets.

    DescribeCapacityReservations  the account's in the region, or those named; the Filters
        the API reference lists (* wildcards). State: scheduled before StartDate, active,
        expired from EndDate or expire(). AvailableInstanceCount: the total less its instances
        not yet stopped or terminated, read from moto each time (one that is frees its
        place: "Launch instances using Capacity Blocks"); 0 unless active ("Before a
        Capacity Block reservation begins, the available capacity appears as zero")
    DescribeCapacityBlockOfferings  offer()'s not yet bought, by InstanceType (or
        InstanceTypePreferences), InstanceCount, CapacityDurationHours, StartDateRange,
        EndDateRange. PurchaseCapacityBlock: one as a targeted capacity-block reservation,
        its fee kept in the lab only (EC2 shows it nowhere after the purchase)
    RunInstances  one naming CapacityReservationTarget.CapacityReservationId or MarketType
        capacity-block is checked (below) before moto launches it, and its instances are in
        the reservation (DescribeInstances: CapacityReservationId; a block's
        InstanceLifecycle "capacity-block"); no subnet nor AZ: the reservation's (the lab's
        choice). One naming neither, preference open (the default), goes into an active open
        ODCR of its type, AZ and tenancy with room for it all ("Launch instances into an
        existing Capacity Reservation")
    a block's end  its instances terminated from 30 minutes before EndDate (its Expiration
        Warning, 40 minutes before, says they "will begin to terminate in 10 minutes":
        "Monitor Capacity Blocks using EventBridge"), or at expire(); an ODCR's run on
        outside it ("Cancel a Capacity Reservation")

Refusals: codes from the API reference's "Error codes for the Amazon EC2 API"; (lab): the
message is the lab's, EC2 documents none.
    InvalidCapacityReservationId.Malformed (lab): an id not cr- and 8 or 17 hex;
        .NotFound (lab): none such in the region
    InvalidCapacityReservationState.PendingActivation, "Your Capacity Block reservation cr-…
        is not active yet." (as EC2 Auto Scaling's troubleshooting page quotes it): a launch
        into a scheduled one (a scheduled ODCR too: the lab's reading)
    ReservationCapacityExceeded, "The requested reservation does not have sufficient
        compatible and available capacity for this request." (EC2's words: that page,
        terraform-provider-aws #35745): beyond its available instances, another type,
        platform (every AMI is Linux/UNIX), AZ or tenancy, or an expired one (EC2 documents
        no other code for a mismatch; its message says "compatible")
    InvalidParameterCombination (lab): MarketType capacity-block without a
        CapacityReservationId target or with an ODCR's, a block's without it (the User Guide
        launches a block with both), a spot launch naming a reservation
    InvalidParameterValue (lab): CapacityDurationHours not "in 1-day increments up 14 days,
        and in 7-day increments up to 182 days", InstanceCount not 1..64, a filter EC2 does
        not list (reservation-type is not); MissingParameter (lab): no InstanceType
    InvalidCapacityBlockOfferingIdMalformed, -NotFound, -Expired (the error page's words): an
        offering id not cb- and hex, unknown, bought already
    UnauthorizedOperation: the two describes and the purchase, while `denied`

Not modelled: pagination, payment-pending, cancel and modify, resource-group targets, launch
templates' CapacityReservationSpecification, Auto Scaling's launches, StartInstances into a
full reservation, DescribeCapacityBlocks. Installed with monkeypatch on moto's EC2 response
classes, so it serves in-process `mock_aws()` and a ThreadedMotoServer alike, and goes away
at the test's end.
"""

from __future__ import annotations

import fnmatch
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

BLOCK = "capacity-block"  # ReservationType, and the RunInstances MarketType of a block
ODCR = "default"  # ReservationType of an On-Demand Capacity Reservation
LINUX = "Linux/UNIX"  # the platform of every AMI, for the lab
BLOCK_ENDS_S = 30 * 60  # a block's instances are terminated from this long before its end
IN_USE = {"pending", "running", "stopping", "shutting-down"}  # takes a place in it
CR_ID = re.compile(r"cr-(?:[0-9a-f]{8}|[0-9a-f]{17})")
OFFERING_ID = re.compile(r"cb-(?:[0-9a-f]{8}|[0-9a-f]{17})")
EXCEEDED = ("The requested reservation does not have sufficient compatible and available "
            "capacity for this request.")
FILTERS = {"instance-type": "InstanceType", "owner-id": "OwnerId",
           "instance-platform": "InstancePlatform", "availability-zone": "AvailabilityZone",
           "tenancy": "Tenancy", "state": "State", "start-date": "StartDate",
           "end-date": "EndDate", "end-date-type": "EndDateType",
           "instance-match-criteria": "InstanceMatchCriteria", "outpost-arn": "OutpostArn",
           "placement-group-arn": "PlacementGroupArn"}


@dataclass
class Held:
    """One reservation: what EC2 keeps of it, and the instances launched into it."""
    id: str
    instance_type: str
    az: str
    total: int
    kind: str  # ODCR or BLOCK
    start: float
    end: float | None  # None: no end (EndDateType unlimited)
    fee: float | None  # a block's upfront fee, USD
    match: str  # InstanceMatchCriteria
    platform: str
    region: str
    tenancy: str
    account: str
    created: float = field(default_factory=time.time)
    block_id: str | None = None  # CapacityBlockId
    tags: list[dict] = field(default_factory=list)
    ended: bool = False  # expire()d
    released: bool = False  # over, and done with its instances
    members: list[str] = field(default_factory=list)  # instance ids launched into it


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:17]}"


def _stamp(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


def _epoch(value: Any) -> float | None:
    """A request's timestamp (a datetime from moto's parser; a string or number) in seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    try:
        return float(value)
    except (TypeError, ValueError):
        return _epoch(datetime.fromisoformat(str(value).replace("Z", "+00:00")))


def _error(code: str, message: str) -> Exception:
    from moto.ec2.exceptions import EC2ClientError

    return EC2ClientError(code, message)


def _backend(account: str, region: str):
    from moto.ec2.models import ec2_backends

    return ec2_backends[account][region]


class Reservations:
    def __init__(self) -> None:
        self.held: dict[str, Held] = {}  # cr id -> reservation
        self.offerings: dict[str, dict] = {}  # id -> {"row": EC2's row, region, fee, bought}
        self.launches: list[dict] = []  # every RunInstances naming a reservation or a block
        self.denied = False
        self.lock = threading.RLock()

    def add(self, instance_type: str, az: str, count: int, kind: str = ODCR,
            start: float | None = None, end: float | None = None, fee: float | None = None,
            match: str | None = None, platform: str = LINUX, region: str = "us-east-1",
            tenancy: str = "default", account: str = "123456789012") -> str:
        """A reservation as EC2 holds one; its id. start None: now; match None: EC2's
        default (open for an ODCR; a block is always targeted)."""
        if kind not in (ODCR, BLOCK) or kind == BLOCK and (end is None or match == "open"):
            raise ValueError(f"kind {kind!r}: {ODCR!r}, or {BLOCK!r} (targeted, with an end)")
        held = Held(_new_id("cr"), instance_type, az, int(count), kind,
                    time.time() if start is None else float(start), end, fee,
                    match or ("targeted" if kind == BLOCK else "open"), platform, region,
                    tenancy, account, block_id=_new_id("cb") if kind == BLOCK else None)
        with self.lock:
            self.held[held.id] = held
        return held.id

    def offer(self, instance_type: str, az: str, count: int, hours: int, fee: float,
              start: float | None = None, region: str = "us-east-1") -> str:
        """An offering DescribeCapacityBlockOfferings gives until it is bought; its id."""
        start = int(time.time() if start is None else start)  # EC2's times: whole seconds
        oid = _new_id("cb")
        row = {"CapacityBlockOfferingId": oid, "InstanceType": instance_type,
               "AvailabilityZone": az, "InstanceCount": int(count), "StartDate": _stamp(start),
               "EndDate": _stamp(start + int(hours) * 3600),
               "CapacityBlockDurationHours": int(hours), "CapacityBlockDurationMinutes": 0,
               "UpfrontFee": f"{fee:.2f}", "CurrencyCode": "USD", "Tenancy": "default"}
        with self.lock:
            self.offerings[oid] = {"row": row, "region": region, "fee": float(fee),
                                   "bought": False}
        return oid

    def state(self, cr_id: str, now: float | None = None) -> str:
        r, now = self.held[cr_id], time.time() if now is None else now
        if r.ended or (r.end is not None and now >= r.end):
            return "expired"
        return "scheduled" if now < r.start else "active"

    def expire(self, cr_id: str) -> None:
        """It ends now: expired, a block's instances terminated (an ODCR's run on outside)."""
        with self.lock:
            self.held[cr_id].ended = True
            self._settle(self.held[cr_id])

    def instances(self, cr_id: str) -> list[str]:
        """The instances launched into it that are not terminated."""
        with self.lock:
            self._settle(self.held[cr_id])
            states = self._states(self.held[cr_id])
            return [i for i, s in states.items() if s != "terminated"]

    def _states(self, r: Held) -> dict[str, str]:
        """Each of its instances' state in moto now (one moto no longer has: terminated)."""
        backend = _backend(r.account, r.region)
        found = {i: backend.get_instance_by_id(i) for i in r.members}
        return {i: inst.state if inst else "terminated" for i, inst in found.items()}

    def _available(self, r: Held, now: float) -> int:
        if self.state(r.id, now) != "active":
            return 0
        return max(0, r.total - sum(s in IN_USE for s in self._states(r).values()))

    def _settle(self, r: Held, now: float | None = None) -> None:
        """What time has done to it: a block's instances terminated from BLOCK_ENDS_S before
        its end; an ODCR's, once it is over, out of it."""
        now = time.time() if now is None else now
        over = r.ended or (r.end is not None and now >= r.end)
        if r.released or not (over or r.kind == BLOCK and now >= (r.end or 0) - BLOCK_ENDS_S):
            return
        backend = _backend(r.account, r.region)
        alive = [i for i, s in self._states(r).items() if s != "terminated"]
        if r.kind == BLOCK and alive:
            backend.terminate_instances(alive)
        elif r.kind == ODCR:
            for i in alive:
                inst = backend.get_instance_by_id(i)
                inst.capacity_reservation_id = inst.capacity_reservation_specification = None
        r.released = over

    def _find(self, response, cr_id: str) -> Held:
        if not CR_ID.fullmatch(str(cr_id)):
            raise _error("InvalidCapacityReservationId.Malformed",
                         f'Invalid id: "{cr_id}" (expecting "cr-...")')
        r = self.held.get(cr_id)
        if r is None or r.region != response.region or r.account != response.current_account:
            raise _error("InvalidCapacityReservationId.NotFound",
                         f"The capacity reservation ID '{cr_id}' does not exist")
        return r

    def _row(self, r: Held, now: float) -> dict:
        """It as DescribeCapacityReservations gives it."""
        from moto.utilities.utils import get_partition

        self._settle(r, now)
        zone_ids = {z.name: z.zone_id for z in
                    _backend(r.account, r.region).describe_availability_zones()}
        row: dict[str, Any] = {
            "CapacityReservationId": r.id, "OwnerId": r.account,
            "CapacityReservationArn": f"arn:{get_partition(r.region)}:ec2:{r.region}:"
                                      f"{r.account}:capacity-reservation/{r.id}",
            "AvailabilityZone": r.az, "InstanceType": r.instance_type,
            "InstancePlatform": r.platform, "Tenancy": r.tenancy, "TotalInstanceCount": r.total,
            "AvailableInstanceCount": self._available(r, now), "EbsOptimized": False,
            "EphemeralStorage": False, "State": self.state(r.id, now),
            "StartDate": _stamp(r.start), "EndDateType": "limited" if r.end else "unlimited",
            "InstanceMatchCriteria": r.match, "CreateDate": _stamp(r.created),
            "Tags": list(r.tags), "ReservationType": r.kind}
        for key, value in (("AvailabilityZoneId", zone_ids.get(r.az)),
                           ("EndDate", r.end and _stamp(r.end)), ("CapacityBlockId", r.block_id)):
            if value:
                row[key] = value
        return row

    def _refuse_if_denied(self, response, action: str) -> None:
        if self.denied:
            raise _error("UnauthorizedOperation", "You are not authorized to perform this "
                         f"operation. User: arn:aws:iam::{response.current_account}:user/moto "
                         f"is not authorized to perform: ec2:{action} because no "
                         f"identity-based policy allows the ec2:{action} action")

    def _check(self, response, target: str | None, market: str | None, entry: dict) -> Held:
        """The reservation a launch naming one goes into, else the refusal EC2 answers."""
        if market == BLOCK and not target:
            raise _error("InvalidParameterCombination", "MarketType capacity-block launches "
                         "only into a Capacity Block: name it in CapacityReservationSpecification"
                         ".CapacityReservationTarget.CapacityReservationId")
        if market == "spot" or response._get_param("InstanceMarketOptions.SpotOptions"):
            raise _error("InvalidParameterCombination",
                         "Spot Instances cannot launch into a Capacity Reservation")
        r = self._find(response, str(target))
        if (r.kind == BLOCK) != (market == BLOCK):
            raise _error("InvalidParameterCombination", f"{r.id} is a Capacity Block: launch "
                         "into it with InstanceMarketOptions.MarketType capacity-block"
                         if r.kind == BLOCK else f"{r.id} is not a Capacity Block: MarketType "
                         "capacity-block launches only into one")
        now = time.time()
        self._settle(r, now)
        if self.state(r.id, now) == "scheduled":
            raise _error("InvalidCapacityReservationState.PendingActivation",
                         f"Your Capacity Block reservation {r.id} is not active yet.")
        asked = {"InstanceType": entry["InstanceType"], "InstancePlatform": LINUX,
                 "AvailabilityZone": entry["AZ"] or r.az, "Tenancy": entry["tenancy"]}
        held = {"InstanceType": r.instance_type, "InstancePlatform": r.platform,
                "AvailabilityZone": r.az, "Tenancy": r.tenancy}
        wrong = [f"{k} {asked[k]}, it holds {held[k]}" for k in held if asked[k] != held[k]]
        available = self._available(r, now)
        entry["reason"] = ("; ".join(wrong) or (f"it is {self.state(r.id, now)}"
                           if self.state(r.id, now) != "active" else None)
                           or (f"MinCount {entry['count']} > AvailableInstanceCount "
                               f"{available}" if entry["count"] > available else None))
        if entry["reason"]:
            raise _error("ReservationCapacityExceeded", EXCEEDED)
        return r

    def _assign(self, r: Held, instances: list, preference: str | None, targeted: bool) -> None:
        """moto's `instances` are in `r` from now on, and DescribeInstances says so."""
        for inst in instances:
            r.members.append(inst.id)
            inst.capacity_reservation_id = r.id
            spec = {"CapacityReservationPreference": preference} if preference else {}
            inst.capacity_reservation_specification = (
                {**spec, "CapacityReservationTarget": {"CapacityReservationId": r.id}}
                if targeted else spec or {"CapacityReservationPreference": "open"})
            if r.kind == BLOCK:
                inst.lifecycle = BLOCK  # moto said "spot" of any InstanceMarketOptions

    def _open_match(self, response, instances: list, preference: str | None) -> None:
        """An untargeted launch goes into an open ODCR that matches it and has room for it."""
        first, now = instances[0], time.time()
        with self.lock:
            for r in self.held.values():
                if (r.kind == ODCR and r.match == "open" and r.region == response.region
                        and r.account == response.current_account
                        and (r.instance_type, r.az, r.tenancy, r.platform) == (
                            first.instance_type, first.placement.zone,
                            first.placement.tenancy, LINUX)
                        and self._available(r, now) >= len(instances)):
                    return self._assign(r, instances, preference, targeted=False)

    def install(self, monkeypatch) -> "Reservations":
        from moto.core.responses import ActionResult
        from moto.ec2.exceptions import EC2ClientError, InvalidSubnetIdError
        from moto.ec2.responses import EC2Response
        from moto.ec2.responses.instances import InstanceResponse

        lab = self
        own_run_instances = InstanceResponse.run_instances  # with other labs' checks, if any

        def describe_capacity_reservations(self) -> ActionResult:
            ids = list(self._get_param("CapacityReservationIds", []) or [])
            filters = list(self._get_param("Filters", []) or [])
            with lab.lock:
                lab._refuse_if_denied(self, "DescribeCapacityReservations")
                self.error_on_dryrun()
                for f in filters:
                    if f.get("Name") not in FILTERS:
                        raise _error("InvalidParameterValue",
                                     f"The filter '{f.get('Name')}' is invalid")
                named, now = {lab._find(self, i).id for i in ids}, time.time()
                rows = [lab._row(r, now) for r in lab.held.values()
                        if r.region == self.region and r.account == self.current_account
                        and (not ids or r.id in named)]
            return ActionResult({"CapacityReservations": [
                row for row in rows if all(_passes(row, f) for f in filters)]})

        def describe_capacity_block_offerings(self) -> ActionResult:
            hours, count = self._get_param("CapacityDurationHours"), self._get_param(
                "InstanceCount")
            types = [self._get_param("InstanceType")] if self._get_param("InstanceType") else [
                p.get("InstanceType") for p in self._get_param("InstanceTypePreferences") or []]
            start_from = _epoch(self._get_param("StartDateRange"))
            end_by = _epoch(self._get_param("EndDateRange"))
            with lab.lock:
                lab._refuse_if_denied(self, "DescribeCapacityBlockOfferings")
            self.error_on_dryrun()
            if hours is None or not types:
                raise _error("MissingParameter", "The request must contain the parameter "
                             + ("CapacityDurationHours" if hours is None else
                                "InstanceType or InstanceTypePreferences"))
            if not (24 <= int(hours) <= 336 and int(hours) % 24 == 0
                    or 336 < int(hours) <= 4368 and int(hours) % 168 == 0):
                raise _error("InvalidParameterValue", f"Invalid value '{hours}' for "
                             "CapacityDurationHours: give 1-day increments up to 14 days, and "
                             "7-day increments up to 182 days")
            if count is not None and not 1 <= int(count) <= 64:
                raise _error("InvalidParameterValue", f"Invalid value '{count}' for "
                             "InstanceCount: a Capacity Block has 1 to 64 instances")
            with lab.lock:
                rows = [o["row"] for o in lab.offerings.values()
                        if o["region"] == self.region and not o["bought"]]
            return ActionResult({"CapacityBlockOfferings": sorted((
                o for o in rows if o["InstanceType"] in types
                and o["CapacityBlockDurationHours"] == int(hours)
                and (count is None or o["InstanceCount"] == int(count))
                and (start_from is None or o["StartDate"].timestamp() >= start_from)
                and (end_by is None or o["EndDate"].timestamp() <= end_by)),
                key=lambda o: o["StartDate"])})

        def purchase_capacity_block(self) -> ActionResult:
            oid = str(self._get_param("CapacityBlockOfferingId") or "")
            tags = [t for spec in self._get_param("TagSpecifications", []) or []
                    if spec.get("ResourceType") == "capacity-reservation"
                    for t in spec.get("Tags", []) or []]
            with lab.lock:
                lab._refuse_if_denied(self, "PurchaseCapacityBlock")
                self.error_on_dryrun()
                o = lab.offerings.get(oid)
                if not OFFERING_ID.fullmatch(oid):
                    raise _error("InvalidCapacityBlockOfferingIdMalformed",
                                 "The Capacity Block offering ID is malformed.")
                if o is None or o["region"] != self.region:
                    raise _error("InvalidCapacityBlockOfferingIdNotFound", "The Capacity "
                                 "Block offering ID cannot be found for this account.")
                if o["bought"]:
                    raise _error("InvalidCapacityBlockOfferingIdExpired",
                                 "The Capacity Block offering ID is no longer available.")
                o["bought"], row = True, o["row"]
                cr = lab.add(row["InstanceType"], row["AvailabilityZone"],
                             row["InstanceCount"], kind=BLOCK,
                             start=row["StartDate"].timestamp(),
                             end=row["EndDate"].timestamp(), fee=o["fee"],
                             platform=self._get_param("InstancePlatform") or LINUX,
                             region=self.region, account=self.current_account)
                lab.held[cr].tags = tags
                return ActionResult({"CapacityReservation": lab._row(lab.held[cr],
                                                                     time.time())})

        def run_instances(self) -> ActionResult:
            target = self._get_param("CapacityReservationSpecification."
                                     "CapacityReservationTarget.CapacityReservationId")
            preference = self._get_param(
                "CapacityReservationSpecification.CapacityReservationPreference")
            market = self._get_param("InstanceMarketOptions.MarketType") or None
            if not target and market != BLOCK:
                result = own_run_instances(self)
                made: Any = result.result  # moto's Reservation
                if preference != "none" and market is None and made.instances:
                    lab._open_match(self, list(made.instances), preference)
                return result
            subnet = self._get_param("SubnetId") or next(
                (n.get("SubnetId") for n in self._get_param("NetworkInterfaces", []) or []
                 if n.get("SubnetId")), None)
            az = self._get_param("Placement.AvailabilityZone")
            try:
                az = self.ec2_backend.get_subnet(subnet).availability_zone if subnet else az
            except InvalidSubnetIdError:
                pass  # moto's run_instances refuses it, as EC2 does
            entry = {"InstanceType": self._get_param("InstanceType") or "m1.small", "AZ": az,
                     "count": int(self._get_param("MinCount") or 1), "reservation id": target,
                     "market type": market, "refused": None, "reason": None, "instances": [],
                     "tenancy": self._get_param("Placement.Tenancy") or "default"}
            with lab.lock:
                lab.launches.append(entry)
                try:
                    r = lab._check(self, target, market, entry)
                except EC2ClientError as exc:
                    entry["refused"], entry["reason"] = exc.code, entry["reason"] or exc.message
                    raise
                if az is None:  # no subnet nor AZ: the lab launches it in the reservation's
                    self.params["Placement"] = {**(self.params.get("Placement") or {}),
                                                "AvailabilityZone": r.az}
                    entry["AZ"] = r.az
                result = own_run_instances(self)
                made = result.result
                lab._assign(r, list(made.instances), preference, targeted=True)
                entry["instances"] = [i.id for i in made.instances]
            return result

        for name, method in (("describe_capacity_reservations", describe_capacity_reservations),
                             ("describe_capacity_block_offerings",
                              describe_capacity_block_offerings),
                             ("purchase_capacity_block", purchase_capacity_block)):
            monkeypatch.setattr(EC2Response, name, method, raising=False)
        # on the class the other labs wrap (moto_images, moto_placement), in any order
        monkeypatch.setattr(InstanceResponse, "run_instances", run_instances)
        return self


def _passes(row: dict, f: dict) -> bool:
    """Whether a DescribeCapacityReservations row passes a filter (any of its values; a date
    as EC2 writes it, 2026-01-02T11:30:00.000Z)."""
    value = row.get(FILTERS[f["Name"]])
    if isinstance(value, datetime):
        value = value.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return value is not None and any(fnmatch.fnmatchcase(str(value), str(wanted))
                                     for wanted in f.get("Values", []) or [])
