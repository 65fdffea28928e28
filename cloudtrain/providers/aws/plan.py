"""What a launch would do and cost, said before anything is bought: the dry run's rows
(plan), the price rows and the most a job can cost (price_rows, at_most), and the question
`launch` asks (question, warnings). Creates nothing; asks EC2 only with DryRun."""

from __future__ import annotations

from ... import catalog, cost
from ...errors import CloudtrainError
from ...market import Market
from ..base import Question
from . import (
    cluster, group_launch, groups, host_setup, images, instance_types, network, reservations,
    results, spot_scores)
from .cluster import EFA_GROUP_NAME
from .errors import POLICY_FILE, AWSError
from .images import DLAMI_PATH
from .instances import power_off_minutes
from .session import AwsSession


def price_rows(aws: AwsSession, spec, region: str | None = None) -> list[tuple[str, str]]:
    """The instances' price and the most the job can cost, as the plan shows them and
    `launch` asks about them."""
    place = spec.placement
    region = region or aws.region(spec)
    t = catalog.get(place.instance_type) if place.instance_type else None
    price = t.price(region, place.market) if t else None
    held = reservations.planned_for(aws, spec, region, place.market)
    if held is not None:
        price = held.usd_per_hour
    if t is None or price is None:
        return [("price", f"no {place.market} price for {place.instance_type} in {region} in "
                          "the catalog")]
    basis = held.basis if held is not None else catalog.on_demand_source(region) \
        if place.market == Market.ON_DEMAND else f"cheapest AZ: {catalog.spot_source(region)}"
    n = max(1, int(spec.nodes or 1))
    each = f"${price:.4f}/h ({basis})" if n == 1 else \
        f"${price * n:.4f}/h for {n} nodes (${price:.4f}/h each; {basis})"
    return [("price", each), ("at most", at_most(aws, spec, t, region))]


def at_most(aws: AwsSession, spec, t: catalog.InstanceType, region: str) -> str:
    return most_and_why(aws, spec, t, region)[1]


def most_and_why(aws: AwsSession, spec, t: catalog.InstanceType, region: str
                 ) -> tuple[float, str]:
    """The most the job can cost, and what that assumes: every attempt (1 +
    --max-restarts for a recovering spot job), each of its instances billed until
    user-data powers it off (the max runtime + RUNTIME_MARGIN_MIN, whatever the agent
    does), at the dearest price it may get (spot: the region's dearest AZ in the catalog,
    or --max-price; a relaunch: the dearest place it may go, on demand with --fallback),
    with its volumes."""
    n = max(1, int(spec.nodes or 1))
    minutes = billed_minutes(aws, spec)
    attempts = 1 + spec.recovery.max_restarts if spec.recovery.recover else 1

    # the job's type, and the others it may run on (Placement.types): the dearest
    kinds = [t] + [k for name in spec.placement.alternatives
                   if (k := catalog.get(name)) is not None]

    def one(k: catalog.InstanceType, where: str, market: str) -> float | None:
        held = reservations.planned_for(aws, spec, region, market)
        if held is not None and held.usd_per_hour is not None:
            return held.usd_per_hour  # the reservation's share
        if market == Market.SPOT and spec.placement.max_price is not None:  # never billed above it
            return min(spec.placement.max_price, k.on_demand.get(where) or spec.placement.max_price)
        return k.dearest(where, market)

    def rate(where: str, market: str) -> float | None:  # an instance, USD/h
        found = [p for k in kinds if (p := one(k, where, market)) is not None]
        return max(found) if found else None

    first = rate(region, spec.placement.market)
    assert first is not None  # asked only where the catalog prices the type (prices)
    places = spec.relaunch_places(aws.settings, region) if attempts > 1 else []
    priced = {(r, m): rate(r, m) for r, m in places}
    ipv4 = public_ipv4_per_hour(aws)
    later = [p + volumes_per_hour(aws, spec, r) + ipv4 for (r, m), p in priced.items()
             if p is not None]
    volumes = volumes_per_hour(aws, spec, region) + ipv4
    total = n * minutes / 60 * (first + volumes
                                + (attempts - 1) * max(later, default=first + volumes))
    margin = minutes - int(spec.max_runtime_s // 60)
    until = "until user-data powers it off" if minutes == power_off_minutes(
        spec.max_runtime_s) else "idle until the kept instance powers itself off"
    text = (f"${total:.2f}: " + ("one instance" if attempts == 1 else
                                 f"{attempts} attempts (1 + {attempts - 1} restarts)")
            + f" of up to {minutes} min" + (" each" if attempts > 1 else "")
            + f" (the max runtime of {spec.max_runtime_s / 60:g} min + {margin} {until})"
            + (f" on each of {n} nodes" if n > 1 else ""))
    if spec.placement.market == Market.SPOT:
        spot = max([first] + [p for (_, m), p in priced.items() if m == Market.SPOT and p])
        text += (f", spot at up to ${spot:.4f}/h ("
                 + ("--max-price" if spec.placement.max_price is not None else
                    "the dearest AZ in the catalog") + ")")
        on_demand = [p for (_, m), p in priced.items() if m == Market.ON_DEMAND and p]
        if on_demand:
            text += (f", on-demand ({'up to ' if len(on_demand) > 1 else ''}"
                     f"${max(on_demand):.4f}/h) after spot runs out")
    unpriced = sorted({r for (r, _), p in priced.items() if p is None})
    if unpriced:
        text += f", relaunches in {', '.join(unpriced)} not counted (no catalog price)"
    vols = "".join(f" and the {gb:g} GB volume of dataset {name}"
                   for name, gb in snapshot_volumes(spec))
    return total, (text + f", {'each ' if attempts > 1 else ''}with its "
                   f"{spec.root_gb(aws.settings)} GB gp3 disk{vols} (${volumes - ipv4:.4f}/h)"
                   + (f" and its public IPv4 address (${ipv4:.4f}/h)" if ipv4 else ""))


def _group_types(spec) -> str:
    """The recovery line's word on a group of several types, or ""."""
    types = groups.group_types(spec)
    if len(types) < 2:
        return ""
    return (f", on {types[0]} or {', '.join(types[1:])}: the same GPUs, at least its vCPUs, "
            "memory and instance store, wherever AWS finds capacity first")


def public_ipv4_per_hour(aws: AwsSession) -> float:
    """USD per hour of an instance's public IPv4 address: one with `connect: public` (the
    launch needs it); with `connect: private` none is asked for (a subnet that maps public
    addresses still gives one, which the bill then counts)."""
    return cost.PUBLIC_IPV4_PER_HOUR if aws.settings.connect != "private" else 0.0


def billed_minutes(aws: AwsSession, spec) -> int:
    """The most minutes an instance of the job bills, from the job's start: its max
    runtime, then until user-data's timer powers it off (RUNTIME_MARGIN_MIN), or for a
    kept instance until its idle time after the job has passed, whichever is later."""
    minutes = power_off_minutes(spec.max_runtime_s)
    if spec.keep:
        minutes = max(minutes, int(spec.max_runtime_s // 60) + host_setup.idle_minutes(aws, spec))
    return minutes


def shutdown_plan(aws: AwsSession, spec) -> str:
    """The plan's line on the instance's power-off after the job (kept or not)."""
    if spec.keep:
        return (f"kept after the job: it bills until it powers itself off "
                f"{host_setup.idle_minutes(aws, spec)} min after its last job ends (--idle-minutes; "
                f"each `launch --on` job re-arms it), or `cloudtrain down JOB`; "
                f"{power_off_minutes(spec.max_runtime_s)} min after a job's start if its "
                "agent dies")
    if spec.on_job:
        return (f"the agent powers the kept instance off after this job (--no-keep; "
                f"after {host_setup.shutdown(aws, spec)[1]:g} s)")
    return (f"the agent powers the instance off after the job (after "
            f"{host_setup.shutdown(aws, spec)[1]:g} s; --keep keeps it); user-data after "
            f"{power_off_minutes(spec.max_runtime_s)} min regardless")


def kept_plan(aws: AwsSession, spec) -> list[tuple[str, str]]:
    """`--on`: the kept instance the job runs on (sources.kept_source put it in
    spec.kept), the queue it waits in, what it bills and what happens to it after."""
    kept = spec.kept or {}
    t = catalog.get(spec.placement.instance_type) if spec.placement.instance_type else None
    what = f"{t.name}: {t.gpus:g}x {t.gpu}" if t is not None else \
        (spec.placement.instance_type or "type unknown")
    holder = kept.get("holder") or spec.on_job
    rows = [("instance", f"{kept.get('instance') or 'the instance'} ({what}), kept by job "
                         f"{holder} (--on): no provisioning, only changed files synced")]
    ahead = list(kept.get("ahead") or [])
    if ahead:
        others = len(ahead) - 1
        rows.append(("queue", f"job {ahead[0]} runs on it now"
                     + (f" and {others} more {'is' if others == 1 else 'are'} queued"
                        if others else "")
                     + ": this job is queued behind, on the instance, and starts there when "
                       "they have ended, whether or not this machine is on (they may take "
                       f"up to {kept.get('wait_s', 0) / 60:.0f} min)"))
    for job_id in kept.get("made_kept") or []:
        rows.append(("note", f"job {job_id} was to power the instance off after it: it "
                             "keeps it for the queue now"))
    rows.append(("market", spec.placement.market))
    if spec.placement.instance_type:
        rows += price_rows(aws, spec)
    rows.append(("shutdown", shutdown_plan(aws, spec)))
    return rows


def snapshot_volumes(spec) -> list[tuple[str, float]]:
    """(dataset, GiB) of each volume made from an EBS snapshot for the job."""
    return [(d["name"], int(((spec.data.staging or {}).get(d["name"]) or {}).get("bytes") or 0)
             / (1 << 30)) for d in spec.data.datasets if d["kind"] == "snapshot"]


def volumes_per_hour(aws: AwsSession, spec, region: str) -> float:
    """USD per hour of an instance's EBS volumes in `region`: the gp3 root volume with
    its provisioned throughput and IOPS, and each dataset's snapshot volume with its."""
    gp3 = catalog.gp3_price(region).per_gb_month
    month = spec.root_gb(aws.settings) * gp3 + (
        cost.gp3_performance_per_month(spec.data.disk_mbps) if spec.data.disk_mbps else 0.0)
    by_name = {d["name"]: d for d in spec.data.datasets}
    for name, gb in snapshot_volumes(spec):
        d = by_name[name]
        month += gb * gp3 + cost.gp3_performance_per_month(
            int(d.get("throughput") or cost.GP3_BASE_MBPS),
            int(d.get("iops") or cost.GP3_BASE_IOPS))
    return month / cost.HOURS_PER_MONTH


def question(aws: AwsSession, spec) -> Question | None:
    """What `launch` asks before creating paid resources (none for --on: the kept instance
    bills already)."""
    if spec.on_job:
        return None
    rows = dict(price_rows(aws, spec))
    at_most = f"; at most {rows['at most']}" if "at most" in rows else ""
    what = f"a {spec.placement.market} {spec.placement.instance_type}" if spec.nodes <= 1 else \
        f"{spec.nodes} {spec.placement.market} {spec.placement.instance_type} instances"
    return Question(f"This launches {what} in {aws.region(spec)}, "
                    f"billed per second: {rows['price']}{at_most}.",
                    warnings(spec, aws.region(spec)))


def warnings(spec, region: str) -> list[str]:
    """What the plan and the launch say before anything is bought: a --max-price
    below the catalog's cheapest spot price of the type there."""
    place = spec.placement
    t = catalog.get(place.instance_type) if place.instance_type else None
    cheapest = t.price(region, "spot") if t is not None else None
    if t is None or place.market != Market.SPOT or place.max_price is None or cheapest is None or \
            place.max_price >= cheapest:
        return []
    return [f"--max-price ${place.max_price:g}/h is below the cheapest spot price of "
            f"{t.name} in {region} (${cheapest:.4f}/h in the catalog): EC2 starts no "
            "instance while spot costs more"]


# The largest training types (8 GPUs, EFA), which AWS sells in practice through Capacity
# Blocks for ML and reservations: several of them free at once in one AZ is rare on spot.
SCARCE_FAMILIES = ("p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300")


def scarce_together(spec) -> str | None:
    """What the plan says of N spot instances of the largest types in one AZ at once."""
    name = spec.placement.instance_type or ""
    if spec.nodes <= 1 or spec.placement.market != Market.SPOT or \
            name.split(".")[0] not in SCARCE_FAMILIES:
        return None
    return (f"{spec.nodes} spot {name} in one AZ at once is rare outside Capacity Blocks for "
            f"ML: expect the launch to wait for capacity (each AZ is tried; a relaunch waits "
            f"up to recovery_wait_minutes), or fail for it; on-demand starts sooner")


def plan(aws: AwsSession, spec) -> list[tuple[str, str]]:
    """What launch would do, as (what, value) rows; creates nothing, bills nothing. With
    credentials it also resolves AZs and AMI and asks EC2 (DryRun=True) whether
    RunInstances would be allowed."""
    facts = instance_types.preflight(aws, spec)
    region, source = aws.region_and_source(spec.placement.region)
    rows = [("backend", "aws"),
            ("region", region + ("" if source == "--region" else f" ({source})"))]
    if spec.on_job:
        return rows + kept_plan(aws, spec)
    t = catalog.get(spec.placement.instance_type)
    rows += _plan_machines(aws, spec, facts, t)
    rows.append(("market", market_line(aws, spec, region)))
    rows += [("WARNING", warning) for warning in warnings(spec, region)]
    rows += price_rows(aws, spec, region)
    rows += _plan_lifecycle(aws, spec, region)
    return rows + _plan_checks(aws, spec, region)


def market_line(aws: AwsSession, spec, region: str) -> str:
    """The plan's market row: spot (and its --max-price), on-demand, or the reservation the
    job's instances go into."""
    place = spec.placement
    if place.reservation:
        held = reservations.planned(aws, spec, region)
        return (f"{place.market}, in reservation " if place.market != Market.SPOT else
                "spot, then on-demand once the deadline's slack is out, in reservation ") + (
            reservations.said(held) if held is not None else reservations.unread(spec))
    return place.market + (f", max price ${place.max_price}/h" if place.max_price is not None
                           else "")


def _plan_machines(aws: AwsSession, spec, facts, t) -> list[tuple[str, str]]:
    """The plan's rows about the machines: the instance type, each node and the
    network between them, the processes on each."""
    rows: list[tuple[str, str]] = []
    if t is None:
        gpus = f"{facts.gpus:g}x {facts.gpu}" if facts.gpus else "no GPU (--cpu-only)"
        rows.append(("instance", f"{spec.placement.instance_type}: {gpus} (not in the bundled "
                                 "catalog: price unknown)"))
    else:
        rows.append(("instance", f"{t.name}: {t.gpus:g}x {t.gpu}, {t.vcpus:g} vCPU, "
                                 f"{t.memory_gib:g} GiB" + (
                                     f"; then {', '.join(spec.placement.alternatives)} (the "
                                     "same GPUs, at least its vCPUs, memory and instance "
                                     "store) where no AZ has capacity for it"
                                     if spec.placement.alternatives and spec.nodes == 1
                                     else "")))
    if facts.note:
        rows.append(("note", facts.note))
    if spec.nodes > 1:
        rows.append(("nodes", f"{spec.nodes} instances in one AZ, " + (
            "the reservation's (its own placement), all or none" if spec.placement.reservation
            else "one cluster placement group (created for the job, deleted after), all or "
                 "none: a node that cannot be had releases the others and the next AZ is "
                 "tried")))
        scarce = scarce_together(spec)
        if scarce:
            rows.append(("note", scarce))
        efa = cluster.efa_plan(aws, spec)
        rows.append(("network", "TCP between the nodes (security group cloudtrain admits "
                                "its members); no EFA on " + spec.placement.instance_type
                     + (": its Ubuntu image has no EFA software" if images.image_kind(
                         spec.placement.instance_type, spec.placement.ami) == images.VOLTA
                        else "")
                     if efa is None else
                     "TCP between the nodes; " + efa["why"] if not efa["used"] else
                     f"EFA, {efa['used']} interface{'s' if efa['used'] > 1 else ''} per "
                     f"node (security group {EFA_GROUP_NAME}); NCCL over libfabric: "
                     + " ".join(f"{k}={v}" for k, v in cluster.efa_environment(aws, spec).items())
                     + (f"; {efa['why']}" if efa["why"] else "")))
    if spec.kind == "recipe" and (t is not None or facts.source == "EC2"):
        procs = spec.processes(int(facts.gpus))
        if spec.nodes > 1:
            rows.append(("processes", f"{procs} per node x {spec.nodes} nodes = "
                                      f"{procs * spec.nodes} (torchrun --nnodes "
                                      f"{spec.nodes}, rendezvous at node 0)"))
        else:
            rows.append(("processes", f"{procs}" + (" (torchrun, one per GPU)" if procs > 1
                                                    else "")))
    elif spec.nodes > 1:
        rows.append(("processes", f"your command on each of {spec.nodes} nodes, with "
                                  "CLOUDTRAIN_NODES, CLOUDTRAIN_NODE_RANK, MASTER_ADDR and "
                                  "MASTER_PORT set (start torchrun with them)"))
    return rows


def staging_plan(aws: AwsSession, spec) -> str | None:
    """The dry run's word on where the data copy goes (datasets.preflight's Data.local_disk):
    the local NVMe the image mounts, free with the type and lost with the instance as its root
    volume is; or the root volume, and why. None where nothing is copied."""
    local = spec.data.local_disk
    if not local:
        return None
    if not local.get("used"):
        return ("the datasets are copied onto the root volume (sized for them above): "
                + local["why"])
    disks = local["disks"]
    kept = " (checkpoints are kept in the job store)" if aws.settings.job_store else ""
    return (f"the datasets are copied onto the local NVMe the Deep Learning AMI mounts at "
            f"{local['path']} ({disks} disk{'' if disks == 1 else 's'}, {local['gb']:,.0f} GB;"
            f" the copy needs {local['need_gb']:,} GB)"
            + (" (each node its own copy on its own NVMe)" if spec.nodes > 1 else "")
            + f": free with {spec.placement.instance_type}, and lost with the instance as the "
              f"root volume is{kept}, so no root volume space or gp3 throughput is bought for "
              "it; should the image not have mounted it, the copy goes onto the root volume "
              "instead, and the timeline says so")


def _plan_lifecycle(aws: AwsSession, spec, region: str) -> list[tuple[str, str]]:
    """The plan's rows about the instance's life: its disk, when it powers off, where
    the results go, what a spot interruption does."""
    rows: list[tuple[str, str]] = []
    disk = spec.root_gb(aws.settings)
    fast = ""
    if spec.data.disk_mbps and spec.data.disk_mbps > cost.GP3_BASE_MBPS:  # for the data copy
        fast = (f", {spec.data.disk_mbps} MB/s and {cost.gp3_iops_for(spec.data.disk_mbps)} IOPS "
                f"provisioned for the data copy (+$"
                f"{cost.gp3_performance_per_month(spec.data.disk_mbps) / cost.HOURS_PER_MONTH:.4f}"
                "/h)")
    rows.append(("disk", f"{disk} GB gp3{fast}, encrypted, deleted with the instance"
                 + (" (each node its own)" if spec.nodes > 1 else "")))
    staging = staging_plan(aws, spec)
    if staging:
        rows.append(("staging", staging))
    rows.append(("shutdown", shutdown_plan(aws, spec)))
    rows.append(("results", results.results_plan(aws, spec, region)))
    if spec.recovery.recover:
        where = "the other AZs of the region (cheapest spot price now first)" + (
            ", then " + aws.settings.regions if aws.settings.regions else "") + (
            ", then on-demand" if spec.recovery.fallback == Market.ON_DEMAND else "")
        new = "a new instance" if spec.nodes <= 1 else \
            f"{spec.nodes} new instances (an interruption of any node relaunches all)"
        grouped = group_launch.group_recovery(aws, spec)
        if grouped is None:
            place = "the region's AZs" if spec.nodes <= 1 else \
                "the job's placement group"
            lost = "a new instance" if spec.nodes <= 1 else (
                "a new instance in place of the lost node (the other nodes stay; all "
                f"{spec.nodes} meet again through the job store and resume together)")
            rows.append(("recovery", f"on a spot interruption the job continues from its "
                                     f"last checkpoint (streamed to the job store) on "
                                     f"{lost}, at most {spec.recovery.max_restarts} times: "
                                     f"relaunched by AWS Auto Scaling in {place} "
                                     f"(the job's group{_group_types(spec)}), this machine "
                                     "needed for nothing "
                                     "after the launch; no move to another region" + (
                                         "; past the deadline's switch, the instance that "
                                         "stops sets the group to on-demand, so AWS's next "
                                         "one is" if group_launch.on_demand_at(spec)
                                         else " or to on-demand (the supervisor here does "
                                         "that only for the jobs it relaunches)")))
        else:
            # Who relaunches (the cause), then what would let AWS do it
            rows.append(("recovery", f"on a spot interruption the job continues from its "
                                     f"last checkpoint (streamed to the job store) on {new},"
                                     f" at most {spec.recovery.max_restarts} times, in {where}; "
                                     "relaunched by a supervisor on this machine (only "
                                     f"while it is on); {grouped}"))
    elif spec.placement.market == Market.SPOT:
        why = "--max-restarts 0" if spec.recovery.max_restarts == 0 else "--no-recover"
        rows.append(("recovery", f"off ({why}): an interruption ends the job as "
                                 "preempted"))
    return rows


def _offline_zones(aws: AwsSession, spec, region: str) -> str:
    """The dry run's AZ line without credentials: EC2 is not asked, so the scores are said
    to come at launch (or why there will be none), and the AZs go by the catalog's price."""
    place = spec.placement
    t = catalog.get(place.instance_type)
    prices = (t.spot_snapshot.get(region) or {}) if t else {}
    scores = spot_scores.zone_scores(aws, region, place.instance_type, spec.nodes,
                                     place.market, ask=False)
    zones = network.order_zones([(z, "", "", z) for z in sorted(prices)], place.instance_type,
                                region, place.market, scores.scores if scores else None)
    return spot_scores.said(zones, scores, place.instance_type, region)


def _plan_checks(aws: AwsSession, spec, region: str) -> list[tuple[str, str]]:
    """The plan's rows that ask AWS (with credentials): the AZs to try, the AMI, and
    whether RunInstances would be allowed (EC2 DryRun)."""
    place = spec.placement
    rows: list[tuple[str, str]] = []
    kind = images.image_kind(place.instance_type, place.ami)
    if aws.credentials(region) is None:
        rows.append(("AMI", place.ami if not kind else (
            f"Ubuntu 24.04, Canonical's, resolved at launch from SSM "
            f"{images.UBUNTU_PARAMETER}; {images.volta_software()}" if kind == images.VOLTA
            else f"the newest PyTorch Deep Learning AMI, resolved at launch from "
                 f"SSM {DLAMI_PATH}oss-nvidia-driver-gpu-pytorch-X.Y-ubuntu-24.04 "
                 "(its torch X.Y at /opt/pytorch/bin/python, NVIDIA's open driver: "
                 "Turing and newer GPUs); the exact torch, CUDA and driver are read "
                 "at setup (the timeline's software line)")))
        rows.append(("permissions", "not checked: no AWS credentials (this plan needs none)"))
        if place.market == Market.SPOT:
            rows.append(("AZs to try", _offline_zones(aws, spec, region)))
        return rows
    step = "AZs to try"  # a failure is said under the row it is about
    try:
        zones = network.subnets(aws, region)
        scores = spot_scores.zone_scores(aws, region, place.instance_type, spec.nodes,
                                         place.market)
        zones = network.order_zones(zones, place.instance_type, region, place.market,
                                    scores.scores if scores else None)
        rows.append((step, spot_scores.said(zones, scores, place.instance_type, region)))
        step = "AMI"
        ami = images.resolve_ami(aws, region, place.ami, kind)
        facts = images.image_facts(aws, region, ami)
        rows.append((step, f"{ami} {facts['name']}".strip() + images.software_said(
            facts["name"], place.ami, kind)))
        user, why = images.login_user(aws, region, place.ami)
        rows.append(("SSH user", f"{user}: {why}"))
        snapshot = facts["root_gb"] or 0
        if snapshot > spec.root_gb(aws.settings):  # the launch asks for the snapshot's
            rows.append(("disk", f"{snapshot} GB, not {spec.root_gb(aws.settings)}: the "
                                 f"image's root snapshot is {snapshot} GB, the smallest "
                                 "root volume EC2 accepts"))
        step = "permissions"
        request = dict(ImageId=ami, InstanceType=place.instance_type,
                       MinCount=spec.nodes, MaxCount=spec.nodes,
                       SubnetId=zones[0][1], DryRun=True)
        if place.market == Market.SPOT:
            request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        try:
            aws.call(region, "run_instances", fail_fast=True, **request)
            rows.append((step, "RunInstances: EC2 answered without DryRunOperation"))
        except AWSError as exc:
            if exc.code == "DryRunOperation":
                rows.append((step, "RunInstances allowed (EC2 DryRun)"))
            elif exc.code == "UnauthorizedOperation":
                rows.append((step, f"RunInstances DENIED: attach {POLICY_FILE}"))
            else:
                rows.append((step, f"RunInstances: {exc.code}: {exc.aws_message}"))
    except CloudtrainError as exc:
        rows.append((step, exc.message))
    return rows
