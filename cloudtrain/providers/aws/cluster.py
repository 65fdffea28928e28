"""Jobs on several instances: N nodes as one cluster, all or nothing.

    acquire_nodes(store, job, spec)   N instances in one AZ and one cluster placement group,
                                      from one RunInstances (MinCount = MaxCount = N: EC2
                                      launches all of them or none); one that dies before it
                                      runs releases them all and the next AZ is tried
    efa_plan(spec, region)            the EFA interfaces each node gets (p4d, p5, ...)
    efa_environment(spec)             the NCCL / libfabric settings those need
    placement_groups_left(...)        the job's placement groups, deleted once empty

Why one request: AWS recommends launching all the instances a cluster placement group needs
in a single request ("launch the number of instances that you need in the placement group in
a single launch request"), and MinCount makes the capacity check all-or-nothing. A spot
instance can still be taken back while it is pending; the wait treats that as no capacity.

Why EFA only where the type has it, and how many: the layout follows the type's network cards
as EC2 describes them (DescribeInstanceTypes' NetworkCards; the bundled table without
credentials). A network interface with a public address must be the only one at launch, so
with `connect: public` a node gets one interface: EFA (with ENA) where its primary card takes
EFA, else plain ENA and no EFA (p6-b300's card 0 takes ENA only). With `connect: private` it
gets the type's maximum: the primary ENA interface, an EFA-only interface beside it on the
primary card where that card takes EFA, and one EFA-only interface on each further card that
does (AWS's recommended layout for p5, p6-b300 and the like). A Volta type's Ubuntu image has
no EFA software: its nodes talk TCP. EFA needs a security group that admits all traffic from
itself: `cloudtrain-efa`, shared like `cloudtrain`.
"""

from __future__ import annotations

import json
import time

from ...errors import CloudtrainError
from ...market import Market
from ...progress import SILENT, Reporter
from ...ssh import Endpoint
from ...ssh_host import SSHHost
from ...state import Instance, Job, Store
from . import boot as booting, bootstrap, group_launch, images, instances, job_role, network, \
    placement, reservations, volumes
from .errors import CAPACITY_ERRORS, QUOTA_ERRORS, AWSError, AWSPlacementError, StaleCache
from .instances import Attempt
from .placement import EFA_INTERFACES
from .session import AwsSession
from .tags import EFA_GROUP_NAME, TAG_ATTEMPT, TAG_JOB, TAG_OWNER

# GPUDirect RDMA over EFA (FI_EFA_USE_DEVICE_RDMA=1): the p4 and later p families.
EFA_RDMA_FAMILIES = ("p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300")
# A node that went away before it ran, for this reason, means "no capacity here".
LOST_WHILE_STARTING = ("shutting-down", "terminated", "stopping", "stopped")


class NodeLost(AWSError):
    """An instance of the cluster ended before it ran (spot capacity taken back, no
    capacity after all): the whole cluster is released and the next AZ tried."""


def efa_interfaces(aws: AwsSession, spec, region: str | None = None) -> dict | None:
    """The EFA of the type of a job on several nodes, None where it has none: {efa: the EFA
    interfaces it supports, primary: its default network card (the primary interface's),
    cards: [(index, the interface types it takes, its most interfaces or None), ...]}.
    EC2's DescribeInstanceTypes NetworkInfo where `region` is given and there are
    credentials (NetworkCards, each card's InterfaceTypes where EC2 gives them); the bundled
    table (placement.EFA_INTERFACES) without credentials, without a region, or where EC2
    could not be asked or does not know the type."""
    if spec.nodes < 2 or not spec.placement.instance_type:
        return None
    if images.image_kind(spec.placement.instance_type, spec.placement.ami) == images.VOLTA:
        return None  # p3dn's Ubuntu image has no EFA software (libfabric, aws-ofi-nccl)
    name = spec.placement.instance_type
    known = EFA_INTERFACES.get(name)
    every = ("interface", "efa", "efa-only")

    def table_cards(cards: int, primary: int, primary_efa: bool) -> list[tuple]:
        return [(i, every if i != primary or primary_efa else ("interface",), None)
                for i in range(cards)]

    info = None
    if region is not None:
        try:
            if aws.credentials(region) is not None:
                found = aws.call(region, "describe_instance_types",
                                 InstanceTypes=[name])["InstanceTypes"]
                info = (found[0].get("NetworkInfo") or {}) if found else None
        except CloudtrainError:
            info = None
    if info is None:
        if known is None:
            return None
        return {"efa": known.efa, "primary": known.primary,
                "cards": table_cards(known.cards, known.primary, known.primary_efa)}
    if not info.get("EfaSupported"):
        return None
    most = int((info.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 1)
    primary = int(info.get("DefaultNetworkCardIndex") or 0)
    primary_efa = known.primary_efa if known is not None else True
    cards = []
    for card in info.get("NetworkCards") or []:
        index = int(card.get("NetworkCardIndex") or 0)
        kinds = card.get("InterfaceTypes")  # not given: as the table says, else every kind
        if kinds is None:
            kinds = every if index != primary or primary_efa else ("interface",)
        cards.append((index, tuple(kinds), card.get("MaximumNetworkInterfaces")))
    if not cards:  # no NetworkCards in the answer: the table's cards, else one per EFA
        cards = table_cards(known.cards if known is not None else most, primary, primary_efa)
    return {"efa": most, "primary": primary, "cards": cards}


def efa_plan(aws: AwsSession, spec, region: str | None = None) -> dict | None:
    """{supported, used, rdma, why, interfaces} for a job on several nodes of an EFA type
    (`interfaces`: (network card, device index, InterfaceType) of each, the primary first;
    `used` 0: no EFA at launch, `why` says why); None otherwise."""
    most = efa_interfaces(aws, spec, region)
    if not most:
        return None
    # interfaces: (network card, device index, InterfaceType) of each, the primary first
    cards = {index: (kinds, room) for index, kinds, room in most["cards"]}
    primary = most["primary"]
    kinds, room = cards.get(primary, (("interface",), None))
    # `connect: private`: the primary ENA interface; an EFA-only one beside it where its card
    # takes EFA; one EFA-only interface on each further card that does; as many as the type
    # supports
    private = [(primary, 0, "interface")]
    if "efa-only" in kinds and (room is None or room > 1):
        private.append((primary, 1, "efa-only"))
    private += [(index, 0, "efa-only") for index, (takes, space) in sorted(cards.items())
                if index != primary and "efa-only" in takes and (space is None or space > 0)]
    private = private[:1 + most["efa"]]
    supported = len(private) - 1
    if supported == 1 and "efa" in kinds:  # one EFA (with ENA) as the primary does
        private = [(primary, 0, "efa")]
    if not supported:
        return None
    if aws.settings.connect == "private":
        interfaces = private
    else:  # a public address: the primary interface alone, EFA (with ENA) where its card can
        interfaces = [(primary, 0, "efa" if "efa" in kinds else "interface")]
    used = sum(kind != "interface" for _card, _device, kind in interfaces)
    name = spec.placement.instance_type
    family = name.split(".")[0]
    why = ""
    if not used:
        takes = "no EFA (with ENA) interface" if "efa-only" in kinds else "ENA only"
        why = (f"no EFA: the primary network card of {name} (card {primary}) takes {takes}, "
               f"and an instance with a public address gets one network interface at launch "
               f"(set `connect: private` for all {supported} EFA interfaces, on its other "
               f"cards)")
    elif used < supported:
        why = (f"{used} of {supported} EFA interfaces: an instance with a public address gets "
               f"one network interface at launch (set `connect: private` for all "
               f"{supported})")
    return {"supported": supported, "used": used, "rdma": family in EFA_RDMA_FAMILIES,
            "why": why, "interfaces": interfaces}


def efa_environment(aws: AwsSession, spec) -> dict:
    """What NCCL needs to go over EFA (the DLAMI's aws-ofi-nccl plugin reads them):
    libfabric's EFA provider, forced, so a node without its EFA fails loudly instead of
    falling back to TCP sockets; GPUDirect RDMA where the type has it; fork safety for
    the DataLoader's workers."""
    plan = efa_plan(aws, spec)
    if plan is None or not plan["used"]:  # no EFA at launch: NCCL over TCP
        return {}
    env = {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"}
    if plan["rdma"]:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env


def network_interfaces(aws: AwsSession, spec, subnet: str, groups: list[str], efa: dict) -> list[dict]:
    """The RunInstances NetworkInterfaces of an EFA node: efa_plan's `interfaces` (network
    card, device index and type of each: the primary interface on the default card first),
    each new in `subnet` with `groups`, deleted with the instance; with a public address
    (then efa_plan gives one interface) that one asks for it."""
    public = aws.settings.connect != "private"
    base = {"SubnetId": subnet, "Groups": groups, "DeleteOnTermination": True}
    out = [{**base, "DeviceIndex": device, "NetworkCardIndex": card, "InterfaceType": kind}
           for card, device, kind in efa["interfaces"]]
    if public and len(out) == 1:
        out[0]["AssociatePublicIpAddress"] = True
    return out


def ensure_efa_group(aws: AwsSession, region: str, vpc: str, owner: str) -> str:
    """The shared EFA security group of a VPC: all traffic from and to its own members. EFA's
    OS-bypass needs every protocol, and an outbound rule naming the group itself: its
    traffic is neither IPv4 nor IPv6, so the default egress rule (0.0.0.0/0) does not match
    it, and NCCL then fails with unresponsive receivers (AWS's EFA security group
    recipe adds both rules)."""
    group = network.own_group(aws, region, vpc, owner, EFA_GROUP_NAME,
                              "cloudtrain: EFA between a job's nodes")
    gid = group["GroupId"]
    rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid,
                                                        "Description": "cloudtrain EFA"}]}]
    if not _to_itself(gid, group.get("IpPermissions")):
        aws.call(region, "authorize_security_group_ingress", GroupId=gid, IpPermissions=rule)
    if not _to_itself(gid, group.get("IpPermissionsEgress")):
        aws.call(region, "authorize_security_group_egress", GroupId=gid, IpPermissions=rule)
    return gid


def _to_itself(gid: str, rules: list | None) -> bool:
    """Whether `rules` hold one for every protocol with the group `gid` itself."""
    return any(p.get("IpProtocol") == "-1" and any(g.get("GroupId") == gid for g in
                                                   p.get("UserIdGroupPairs", []))
               for p in rules or [])


def acquire_nodes(aws: AwsSession, store: Store, job: Job, spec, report: Reporter = SILENT
                  ) -> list[SSHHost]:
    """spec.nodes instances, all in one AZ and placement group, reached over SSH with
    verified host keys, in node order (EC2's launch index). Never a part of a cluster:
    what did come up is terminated before the next AZ is tried."""
    place = spec.placement
    region = aws.region(spec)
    boot = bootstrap.for_placement(aws, region, place, spec=spec)
    report.info(f"SSH port open to {boot['ssh_from']} only")
    n = spec.nodes
    placement.delete_placement_groups(aws, region, owner=boot["owner"])  # earlier jobs' empty ones
    efa = efa_plan(aws, spec, region)
    if efa is not None:
        report.phase(f"EFA: {efa['used']} interface{'s' if efa['used'] > 1 else ''} per "
                     f"node" + (f" ({efa['why']})" if efa["why"] else ""))
    found = _attempt_nodes(aws, store, job, region, spec) if job.facts.attempt > 1 else None
    # issue 27: a recovering spot job whose group AWS Auto Scaling keeps at N nodes
    grouped = found is None and job.facts.attempt == 1 and group_launch.group_recovery(aws, spec) is None
    ids = group_launch.acquire_from_group_or_say(aws, store, job, spec, report) if grouped else None
    grouped = ids is not None
    if found is not None:
        ids = found
    elif ids is None:
        try:
            ids = run_cluster(aws, store, job, spec, region, boot, efa, report)
        except StaleCache:
            from .cache import RegionCache

            RegionCache(aws.settings.aws_profile, region).clear()
            boot = bootstrap.for_placement(aws, region, place, cached=False, spec=spec)
            ids = run_cluster(aws, store, job, spec, region, boot, efa, report)
    addresses, privates, publics = _wait_cluster(aws, region, ids, report)
    zones = {i.id: i.zone for i in store.instances(job.id)}
    if found is None:
        for instance in ids:
            volumes.attach_snapshots(aws, store, job, spec, region, instance, zones.get(instance),
                                     boot["owner"])
    from ... import nodes

    report.phase(f"waiting for SSH on {n} nodes (at most "
                 f"{booting.ssh_wait_s(aws, place.instance_type, n):.0f} s)")
    warnings: list[str] = []  # said once every node is reached: no display from threads
    user = images.login_user(aws, region, place.ami)[0]  # before the threads: read once

    def reach(i: int) -> SSHHost:
        endpoint = Endpoint(addresses[i], aws.settings.ssh_port, user, str(boot["key_path"]))
        host = booting.wait_ssh(aws, region, ids[i], endpoint, place.instance_type, n)
        host.ready_file = images.ready_file(place.instance_type, place.ami)
        with Store(store.path) as mine:  # a connection of this thread's own
            verified = booting.check_host_key(aws, mine, job, region, ids[i], host,
                                               place.instance_type, Reporter(warnings.append))
            host.home()
            host.peer_address = privates[i]
            mine.update_instance(ids[i], state="running", details=json.dumps(
                {**instances.instance_details(mine, ids[i]), "address": addresses[i],
                 "private_address": privates[i], "host_key": endpoint.host_key,
                 "host_key_verified": verified, "node": i, "public_ipv4": publics[i]}))
        return host

    try:
        hosts = nodes.each(reach, n)
    finally:
        for line in warnings:
            report.note(line)
    report.phase(f"{n} nodes up: " + ", ".join(h.name for h in hosts))
    if grouped:
        group_launch.check_group_jobdir(aws, job, hosts[0], ids[0])
        group_launch.record_attempt(aws, store, job, spec, 1, ids[0])
    return hosts


def run_cluster(aws: AwsSession, store: Store, job: Job, spec, region: str, boot: dict,
                 efa: dict | None, report: Reporter) -> list[str]:
    """One RunInstances of spec.nodes instances per AZ, in AZ order, until one AZ gives
    all of them and none dies before it runs; their ids in launch order."""
    place = spec.placement
    scores = instances.zone_order_scores(aws, spec, region)
    held = boot.get("reservation")
    zones = reservations.zones(held, instances.relaunch_order(aws, boot["zones"], spec, region,
                                                              job.facts, scores))
    instances.record_zone_order(store, job, spec, region, zones, scores)
    disk = instances.root_volume_gb(aws, spec, boot)
    raised = instances.root_volume_line(aws, spec, boot)
    if raised:
        report.note(raised)
    attempts: list[Attempt] = []
    n = spec.nodes
    for k, (zone, subnet, vpc, zone_id) in enumerate(zones):
        score = scores.of(zone_id) if scores else None
        # A reservation's instances go where it is (a Capacity Block's are placed close
        # together already); EC2 puts a targeted instance in a cluster placement group only
        # where the reservation was made in it.
        group = None if held else placement.create_placement_group(aws, region, job, spec, k,
                                                                    boot["owner"])
        if group:
            store.add_event(job.id, "placement-group", detail=f"{group} (cluster) for {zone}")
        groups = [boot["group"]]
        if efa is not None:
            groups.append(ensure_efa_group(aws, region, vpc, boot["owner"]))
        request = instances.run_request(aws, job, spec, subnet, boot["group"], boot["ami"],
                                        boot["key_name"], boot["owner"], disk,
                                        boot["root_device"], held)
        request.update(MinCount=n, MaxCount=n)
        if group:
            request["Placement"] = {"GroupName": group}
        if efa is not None:
            del request["SubnetId"], request["SecurityGroupIds"]
            request["NetworkInterfaces"] = network_interfaces(aws, spec, subnet, groups, efa)
        attempt = job.facts.attempt
        token = f"{job.id}-n{n}-{k}" if attempt == 1 else f"{job.id}-a{attempt}-n{n}-{k}"
        report.phase(f"requesting {n} {place.market} {place.instance_type} in {zone}, "
                     + (f"reservation {held.id}" if held else f"placement group {group}")
                     + (f" ({attempts[-1].zone}: {attempts[-1].error.split(':')[0]})"
                        if attempts and attempts[-1].error else ""))
        try:
            response = job_role.launch_retry(aws, job, lambda: aws.call(
                region, "run_instances", fail_fast=True, ClientToken=token, **request))
        except BaseException as exc:
            code = instances.run_failed(store, job, token, zone, exc, first=not attempts)
            assert isinstance(exc, AWSError)  # run_failed raised anything else again
            if code in CAPACITY_ERRORS:
                attempts.append(Attempt(zone, subnet, f"{exc.code}: {exc.aws_message}", score))
                placement.delete_placement_groups(aws, region, job.id)
                continue
            if exc.code in QUOTA_ERRORS:
                raise AWSPlacementError(
                    f"{n} x {place.instance_type} ({place.market}) in {region}: {exc.code}: "
                    f"{exc.aws_message}",
                    hint=f"{n} nodes need {n} times the vCPU quota of one: ask AWS for "
                         "more (Service Quotas), or use fewer --nodes") from exc
            if exc.code and not exc.hint:
                raise AWSError(f"run_instances of {n} nodes failed in {zone}: {exc.code}: "
                               f"{exc.aws_message}", code=exc.code) from exc
            raise
        ids = _record_cluster(aws, store, job, spec, region, response["Instances"], {
            "zone": zone, "subnet": subnet, "group": group, "disk": disk, "boot": boot,
            "attempt": attempt, "efa": efa, "attempts": attempts,
            "score": instances.placement_score(scores, zone_id), "reservation": held})
        if len(ids) != n:  # EC2 honours MinCount; never go on with part of a cluster
            _give_back(aws, store, region, ids)
            raise AWSError(f"EC2 started {len(ids)} of the {n} instances asked for")
        try:
            _wait_cluster(aws, region, ids, report, only_check=True)
        except NodeLost as lost:
            attempts.append(Attempt(zone, subnet, lost.message, score))
            _give_back(aws, store, region, ids)
            placement.delete_placement_groups(aws, region, job.id)  # else the next cleanup's
            report.phase(f"{zone}: {lost.message}; all {n} released")
            continue
        return ids
    tried = "; ".join(f"{a.zone}: {a.error}" for a in attempts)
    raise AWSPlacementError(
        f"no capacity for {n} x {place.instance_type} ({place.market}) in one AZ of {region}, "
        f"every AZ tried (nothing is left running): {tried}",
        hint="try later, fewer --nodes, --on-demand / --spot, or another --region")


def _record_cluster(aws: AwsSession, store: Store, job: Job, spec, region: str, raws: list[dict],
                    where: dict) -> list[str]:
    """The instances one RunInstances started, recorded before any waiting (every path
    ends them), each with its node rank in launch order; their ids. `where`: the zone,
    subnet, placement group, disk, bootstrap, attempt, EFA and the AZs tried before."""
    place = spec.placement
    raws = sorted(raws, key=lambda r: r.get("AmiLaunchIndex", 0))
    ids = [r["InstanceId"] for r in raws]
    boot, efa = where["boot"], where["efa"]
    price = reservations.instance_price(where["reservation"], place.instance_type, region)
    for i, raw in enumerate(raws):
        store.add_instance(Instance(
            id=raw["InstanceId"], job_id=job.id, provider=aws.name, region=region,
            zone=where["zone"], instance_type=place.instance_type, market=place.market,
            state="requested",
            launched_at=raw["LaunchTime"].timestamp() if raw.get("LaunchTime")
            else time.time(), terminated_at=None,
            price_per_hour=price if place.market == Market.ON_DEMAND else None,
            details={"subnet": where["subnet"], "ami": boot["ami"],
                     "key_name": boot["key_name"], "group": boot["group"],
                     "disk_gb": where["disk"], "disk_mbps": spec.data.disk_mbps, "node": i,
                     "attempt": where["attempt"], "placement_group": where["group"],
                     "efa_interfaces": efa["used"] if efa else 0,
                     "attempts": [a.__dict__ for a in where["attempts"]],
                     **reservations.record(where["reservation"]), **where["score"]}))
    store.add_event(job.id, "instance", detail=f"{spec.nodes} nodes in {where['zone']} "
                    f"({where['group'] or where['reservation'].id}): " + ", ".join(ids))
    return ids


def _give_back(aws: AwsSession, store: Store, region: str, ids: list[str]) -> None:
    """Terminate a part of a cluster at once (it bills while the next AZ is tried)."""
    aws.call(region, "terminate_instances", InstanceIds=sorted(ids))
    for instance in ids:
        store.update_instance(instance, state="terminated", terminated_at=time.time())


def _cluster_describe(aws: AwsSession, region: str, ids: list[str]) -> list[dict]:
    out = []
    for res in aws.call(region, "describe_instances", InstanceIds=ids)["Reservations"]:
        out.extend(res["Instances"])
    return out


def _wait_cluster(aws: AwsSession, region: str, ids: list[str], report: Reporter = SILENT,
                  only_check: bool = False) -> tuple[list[str], list[str], list[int]]:
    """Until every instance runs: the addresses to connect to, their private ones and how
    many public IPv4 addresses each holds (billed by the hour), in the order of `ids`.
    One that goes away first raises NodeLost (its reason said); one still pending after
    instance_wait_seconds is an AWSError. `only_check`: one look, no waiting (right after
    RunInstances, for a node that is already gone)."""
    deadline = time.monotonic() + aws.settings.instance_wait_seconds
    key = "PrivateIpAddress" if aws.settings.connect == "private" else "PublicIpAddress"
    if not only_check:
        report.phase(f"{len(ids)} instances requested, waiting for them to run")
    while True:
        raws = {r["InstanceId"]: r for r in _cluster_describe(aws, region, ids)}
        for instance in ids:
            raw = raws.get(instance) or {}
            state = (raw.get("State") or {}).get("Name", "unknown")
            if state in LOST_WHILE_STARTING:
                reason = (raw.get("StateReason") or {}).get("Message") or state
                raise NodeLost(f"node {ids.index(instance)} ({instance}) went {state} "
                               f"before it ran: {reason}")
        if only_check:
            return [], [], []
        running = [raws[i] for i in ids if raws.get(i, {}).get("State", {}).get("Name")
                   == "running"]
        if len(running) == len(ids):
            missing = [r["InstanceId"] for r in running if not r.get(key)]
            if missing and aws.settings.connect != "private":
                raise AWSError(f"{missing[0]} has no public IP address",
                               hint="set `connect: private` (VPN, peering) or use a subnet "
                                    "that maps public IPs")
            if not missing:
                addresses = [r[key] for r in running]
                report.phase(f"{len(ids)} instances running: " + ", ".join(addresses))
                return (addresses, [r.get("PrivateIpAddress") or r[key] for r in running],
                        [instances.public_ipv4s(r) for r in running])
        if time.monotonic() > deadline:
            waiting = [i for i in ids if raws.get(i, {}).get("State", {}).get("Name")
                       != "running"]
            raise AWSError(f"{', '.join(waiting)} still not running after "
                           f"{aws.settings.instance_wait_seconds:.0f} s",
                           hint=f"aws ec2 describe-instances --region {region} "
                                f"--instance-ids {' '.join(waiting)}")
        time.sleep(aws.settings.poll_seconds)


def _attempt_nodes(aws: AwsSession, store: Store, job: Job, region: str, spec) -> list[str] | None:
    """A relaunch whose supervisor was killed after RunInstances: that attempt's live
    instances, if they are the whole cluster (recorded if the store did not know them);
    a part of one is terminated, and None returned (a new cluster is requested)."""
    live = [r for r in instances.query_tagged(aws, region, {TAG_JOB: job.id,
                                                      TAG_ATTEMPT: str(job.facts.attempt)})
                      if r["State"]["Name"] in ("pending", "running")]
    if not live:
        return None
    live.sort(key=lambda r: r.get("AmiLaunchIndex", 0))
    ids = [r["InstanceId"] for r in live]
    if len(ids) != spec.nodes:
        aws.call(region, "terminate_instances", InstanceIds=sorted(ids))
        store.add_event(job.id, "instance", detail=f"{len(ids)} of {spec.nodes} nodes of "
                        f"attempt {job.facts.attempt} found by their tags: terminated")
        return None
    known = {i.id for i in store.instances(job.id)}
    for i, raw in enumerate(live):
        if raw["InstanceId"] in known:
            continue
        spot = raw.get("InstanceLifecycle") == "spot"
        store.add_instance(Instance(
            id=raw["InstanceId"], job_id=job.id, provider=aws.name, region=region,
            zone=raw.get("Placement", {}).get("AvailabilityZone"),
            instance_type=raw.get("InstanceType"), market=Market.SPOT if spot else Market.ON_DEMAND,
            state="requested", launched_at=raw["LaunchTime"].timestamp(),
            terminated_at=None, price_per_hour=None,
            details={"found_by_tag": True, "node": i, "attempt": job.facts.attempt}))
    store.add_event(job.id, "instance", detail=f"attempt {job.facts.attempt}'s {len(ids)} "
                                               "found by their tags: " + ", ".join(ids))
    return ids

