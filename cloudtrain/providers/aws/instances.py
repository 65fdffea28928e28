"""Instances: the RunInstances request (tags, user-data, disk, market), each AZ in turn, and
the instances an attempt already started, found by its tags. Waiting for them to boot is
boot.py; finding, sweeping and terminating them is inventory.py."""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass
from pathlib import Path

from ...errors import CloudtrainError
from ...job_spec import JobSpec
from ...market import Market
from ...progress import SILENT, Reporter
from ...state import Instance, Job, Store
from . import images, job_role, network, pricing, reservations, spot_scores
from .errors import (
    CAPACITY_ERRORS, QUOTA_ERRORS, STALE_ERRORS, AWSError, AWSPlacementError, StaleCache,
    aws_errors)
from .images import USER_DATA_DONE
from .session import AwsSession
from .tags import LIVE_STATES, TAG_ATTEMPT, TAG_JOB, job_tags


USER_DATA = Path(__file__).resolve().parents[3] / "infra" / "user-data.sh"
# The power-off timers fire this long after the job's max runtime. At first boot they count
# from boot while the job starts only after user-data's own apt budget (600 + 900 s = 25 min
# when tmux/rsync are missing), the SSH wait and the sync: 30 min leaves the job its whole
# max runtime even then. The agent re-arms them at job start with the same margin.
RUNTIME_MARGIN_MIN = 30
REARM_PATH = "/usr/local/bin/cloudtrain-rearm"  # installed by user-data; run as root
USER_DATA_WAIT_S = 1560.0  # setup waits this long for it: the apt budget plus a minute
# The timeline phase that says a RunInstances call got no answer (the instance may exist).
UNANSWERED = "run-instances-unanswered"
# The timeline phase that says which AZs a spot launch tries first, and why.
ZONES_EVENT = "zones"
# AWS failed while handling the request: it may have been carried out.
SERVER_ERRORS = {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable"}


@dataclass
class Attempt:
    zone: str
    subnet: str
    error: str | None  # None: it worked
    score: int | None = None  # the AZ's spot placement score when it was tried


def power_off_minutes(max_runtime_s: float) -> int:
    """Minutes from now (boot, or job start) to the hard power-off for a job of this
    max runtime."""
    return int(max_runtime_s // 60) + RUNTIME_MARGIN_MIN


def user_data_wait_command(marker: str, seconds: float) -> str:
    """A shell command that waits until `marker` exists, at most `seconds`; exit 0 if so."""
    import shlex

    return (f"i=0; while [ ! -e {shlex.quote(marker)} ] && [ $i -lt {int(seconds)} ]; do "
            f"sleep 2; i=$((i+2)); done; [ -e {shlex.quote(marker)} ]")


def instance_details(store: Store, instance_id: str) -> dict:
    row = store.db.execute("SELECT details FROM instances WHERE id = ?",
                           (instance_id,)).fetchone()
    return json.loads(row["details"]) if row and row["details"] else {}


def user_data(aws: AwsSession, job: Job, spec, boot_script: str = "") -> str:
    """infra/user-data.sh rendered for the job, with the GPU software its image lacks
    (images.boot_software: a Volta type's driver and torch); `boot_script`: what an Auto Scaling
    group's instance runs to start the job by itself (group_launch.py), last, so that
    nothing in it is taken for a placeholder."""
    minutes = power_off_minutes(spec.max_runtime_s)
    command = aws.settings.shutdown_command.replace("sudo ", "")  # user-data runs as root
    software = images.boot_software(images.image_kind(spec.placement.instance_type,
                                                      spec.placement.ami))
    return (USER_DATA.read_text().replace("@@JOB_ID@@", job.id)
            .replace("@@MAX_RUNTIME_MINUTES@@", str(minutes))
            .replace("@@SHUTDOWN_COMMAND@@", command)
            .replace("@@GPU_SOFTWARE@@", software)
            .replace("@@BOOT_SCRIPT@@", boot_script))


def _performance(spec: JobSpec) -> dict:
    """Provisioned gp3 throughput for a job that copies its datasets onto the disk
    (datasets.preflight sets spec.data.disk_mbps); the volume's own 125 MB/s otherwise."""
    from ...cost import GP3_BASE_MBPS, gp3_iops_for

    mbps = int(spec.data.disk_mbps or 0)
    return {"Throughput": mbps, "Iops": gp3_iops_for(mbps)} if mbps > GP3_BASE_MBPS else {}


def run_request(aws: AwsSession, job: Job, spec, subnet: str, group: str, ami: str, key_name: str,
                owner: str, disk_gb: int, root_device: str,
                held: reservations.Reservation | None = None) -> dict:
    tags = job_tags(job, spec, owner)
    request = dict(
        ImageId=ami, InstanceType=spec.placement.instance_type, MinCount=1, MaxCount=1,
        KeyName=key_name, SubnetId=subnet, SecurityGroupIds=[group],
        InstanceInitiatedShutdownBehavior="terminate",
        MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled",
                         # 1 (the default): only the instance itself reaches IMDS (and the
                         # instance role's credentials), not containers behind a bridge.
                         "HttpPutResponseHopLimit": aws.settings.imds_hop_limit},
        BlockDeviceMappings=[{"DeviceName": root_device, "Ebs": {
            "VolumeSize": disk_gb, "VolumeType": "gp3", "Encrypted": True,
            "DeleteOnTermination": True, **_performance(spec)}}],
        TagSpecifications=[{"ResourceType": kind, "Tags": tags}
                           for kind in ("instance", "volume", "network-interface")],
        # gzipped, as cloud-init takes it: EC2 takes 16 KB of user-data, and a Volta type's
        # (with the driver and torch install) is close to that as text
        UserData=gzip.compress(user_data(aws, job, spec).encode(), 9, mtime=0),
    )
    profile = job_role.profile_name(aws, job)
    if profile:
        request["IamInstanceProfile"] = {"Name": profile}
    if spec.placement.market == Market.SPOT:
        options = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if spec.placement.max_price is not None:
            options["MaxPrice"] = f"{spec.placement.max_price:.4f}"
        request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
        # Only a spot launch creates a spot request; EC2 rejects this resource type
        # otherwise.
        request["TagSpecifications"].append({"ResourceType": "spot-instances-request",
                                             "Tags": tags})
    request.update(reservations.run_options(held))  # --reservation: into it, in its AZ
    return request


def root_volume_gb(aws: AwsSession, spec, boot: dict) -> int:
    """The root volume a launch asks for: the job's size (JobSpec.root_gb), raised to the
    image's root snapshot where that is larger: RunInstances refuses a smaller one with
    InvalidBlockDeviceMapping (the recipes' 20 and 60 GB are below a Deep Learning
    AMI's snapshot)."""
    return max(spec.root_gb(aws.settings), int(boot.get("root_gb") or 0))


def root_volume_line(aws: AwsSession, spec, boot: dict) -> str | None:
    """What the launch says when the image raised the root volume, else None."""
    asked, used = spec.root_gb(aws.settings), root_volume_gb(aws, spec, boot)
    if used == asked:
        return None
    return (f"root volume {used} GB, not the {asked} GB asked: the image's snapshot is "
            f"{used} GB, the smallest EC2 accepts")


def run_instance(aws: AwsSession, store, job, spec, region, boot: dict, report: Reporter = SILENT) -> str:
    place = spec.placement
    zones, group, ami, key_name, owner = (boot["zones"], boot["group"], boot["ami"],
                                          boot["key_name"], boot["owner"])
    scores = zone_order_scores(aws, spec, region)
    held = boot.get("reservation")
    zones = reservations.zones(held, relaunch_order(aws, zones, spec, region, job.facts, scores))
    record_zone_order(store, job, spec, region, zones, scores)
    root_device = boot["root_device"]
    disk = root_volume_gb(aws, spec, boot)
    raised = root_volume_line(aws, spec, boot)
    if raised:
        report.note(raised)
    attempts: list[Attempt] = []
    # The job's type in every AZ, then each type of the same GPUs it may also run on
    # (Placement.types: a --gpus job's), in the same AZ order.
    tries = [(kind, z) for kind in place.types() for z in zones]
    for n, (kind, (zone, subnet, _vpc, zone_id)) in enumerate(tries):
        score = scores.of(zone_id) if scores else None
        request = dict(run_request(aws, job, spec, subnet, group, ami, key_name, owner, disk,
                                   root_device, held), InstanceType=kind)
        attempt = job.facts.attempt
        token = f"{job.id}-{n}" if attempt == 1 else f"{job.id}-a{attempt}-{n}"
        where = zone if kind == place.instance_type else f"{kind} in {zone}"
        report.phase(f"requesting {place.market} {kind} in {zone}"
                     + (f" ({attempts[-1].zone}: no capacity)" if attempts else ""))
        try:
            # ClientToken: a retried request can never start a second instance.
            response = job_role.launch_retry(aws, job, lambda: aws.call(
                region, "run_instances", fail_fast=True, ClientToken=token, **request))
        except BaseException as exc:
            code = run_failed(store, job, token, zone, exc, first=not attempts)
            assert isinstance(exc, AWSError)  # run_failed raised anything else again
            if code in CAPACITY_ERRORS or (kind != place.instance_type and code in (
                    "InvalidParameterValue", "InvalidInstanceType", "Unsupported")):
                attempts.append(Attempt(where, subnet, f"{code}: {exc.aws_message}", score))
                continue
            tried = ", ".join(a.zone for a in attempts + [Attempt(zone, subnet, code)])
            if code in QUOTA_ERRORS:
                raise AWSPlacementError(f"{place.instance_type} ({place.market}) in {region}: "
                               f"{code}: {exc.aws_message} (AZs tried: {tried})",
                               hint="ask AWS for a higher quota (Service Quotas console: "
                                    "'Running On-Demand G and VT instances' / 'All G and VT "
                                    "Spot Instance Requests'), or use a smaller instance") from exc
            if code in ("InvalidParameterValue", "InvalidInstanceType") and \
                    place.instance_type in exc.aws_message:
                raise AWSError(f"{place.instance_type} is not offered in {region}: "
                               f"{exc.aws_message}", hint="cloudtrain catalog lists types and "
                                                          "regions") from exc
            if code and not exc.hint:
                raise AWSError(f"run_instances failed in {zone}: {code}: {exc.aws_message}",
                               code=code) from exc
            raise  # permissions, credentials, unreachable: already said in words
        raw = response["Instances"][0]
        instance_id = raw["InstanceId"]
        price = reservations.instance_price(held, kind, region)
        # Recorded before any waiting: from here on, every failure path can terminate it.
        store.add_instance(Instance(
            id=instance_id, job_id=job.id, provider=aws.name, region=region, zone=zone,
            instance_type=kind, market=place.market, state="requested",
            launched_at=raw["LaunchTime"].timestamp() if raw.get("LaunchTime") else time.time(),
            terminated_at=None, price_per_hour=price if place.market == Market.ON_DEMAND else None,
            details={"subnet": subnet, "ami": ami, "key_name": key_name, "group": group,
                     "disk_gb": disk, "disk_mbps": spec.data.disk_mbps,
                     "attempts": [a.__dict__ for a in attempts],
                     **reservations.record(held), **placement_score(scores, zone_id)}))
        store.add_event(job.id, "instance", detail=f"{instance_id} in {zone}" + (
            f" ({kind}: no capacity for {place.instance_type} in any AZ)"
            if kind != place.instance_type else "") + (
            f", in reservation {held.id} at ${price:.4f}/h ({held.basis})"
            if held and price is not None else ""))
        return instance_id
    tried = "; ".join(f"{a.zone}: {a.error}" for a in attempts)
    what = f"{' or '.join(place.types())} ({place.market})"
    hint = ("try --spot / --on-demand, another --instance or --region, or later"
            if place.market == Market.ON_DEMAND else
            "try --on-demand, a higher --max-price, another --instance or --region")
    raise AWSPlacementError(f"no capacity for {what} in {region}, every AZ tried: {tried}",
                            hint=hint)


def run_failed(store: Store, job: Job, token: str, zone: str, exc: BaseException,
               first: bool) -> str:
    """A RunInstances that raised: AWS's error code for the caller to decide on (capacity:
    the next AZ). No answer, or AWS failed half-way (5xx): EC2 may have started instances
    all the same, so the timeline says so and release() looks for them by tag, for
    longer than usual. Anything but an AWSError is raised again; a cached resource that
    is gone (the first AZ's try) raises StaleCache."""
    if not isinstance(exc, AWSError) or not exc.code or exc.code in SERVER_ERRORS:
        store.add_event(job.id, UNANSWERED, detail=f"ClientToken {token} in {zone}: "
                        f"{getattr(exc, 'message', None) or type(exc).__name__}")
    if not isinstance(exc, AWSError):
        raise exc
    if exc.code in STALE_ERRORS and first:
        raise StaleCache(exc.code) from exc
    return exc.code


def zone_order_scores(aws: AwsSession, spec, region: str) -> spot_scores.ZoneScores | None:
    """A spot job's AZ scores for its node count (spot_scores.py); None for on-demand."""
    place = spec.placement
    return spot_scores.zone_scores(aws, region, place.instance_type, spec.nodes, place.market)


def record_zone_order(store: Store, job: Job, spec, region: str, zones: list[tuple],
                      scores: spot_scores.ZoneScores | None) -> None:
    """The timeline's line of the AZs a spot launch tries, in order, and what the order
    follows (scores, or price and why)."""
    if scores is not None:
        store.add_event(job.id, ZONES_EVENT, detail=spot_scores.said(
            zones, scores, spec.placement.instance_type, region))


def placement_score(scores: spot_scores.ZoneScores | None, zone_id: str) -> dict:
    """What an instance's record keeps of its AZ's score: {"placement_score": n, and the
    types scored}, or {"placement_score_why": ...} where there was none; {} on-demand."""
    if scores is None:
        return {}
    score = scores.of(zone_id)
    if score is None:
        return {"placement_score_why": scores.why or "EC2 did not score this AZ"}
    return {"placement_score": score, "placement_score_types": list(scores.types)}


def relaunch_order(aws: AwsSession, zones: list[tuple], spec, region: str,
                   facts, scores: spot_scores.ZoneScores | None = None) -> list[tuple]:
    """The AZs in the order a launch tries them: the AZ EC2's spot placement score rates
    highest first (`scores`), then the catalog's cheapest spot AZ (the first launch); a
    relaunch asks EC2 for the spot prices now, and the AZs that were just interrupted
    (facts.avoid_zones) come last."""
    place = spec.placement
    by_zone = scores.scores if scores else None
    ordered = network.order_zones(zones, place.instance_type, region, place.market, by_zone)
    if facts.attempt > 1 and place.market == Market.SPOT:
        try:
            now = pricing.current_spot_prices(aws, region, [place.instance_type]).get(
                place.instance_type) or {}
        except CloudtrainError:  # no permission for the price history: the snapshot's order
            now = {}
        if now:
            ordered = sorted(ordered, key=lambda z: network.score_key(z, by_zone) + (
                z[0] not in now, now.get(z[0], 0.0)))
    avoid = set(facts.avoid_zones)
    return [z for z in ordered if z[0] not in avoid] + [z for z in ordered if z[0] in avoid]


def attempt_instance(aws: AwsSession, store: Store, job: Job, region: str, attempt: int) -> str | None:
    """A live instance already started for this attempt of the job (by its tags): the
    supervisor that started it was killed before it could go on. Recorded if the store
    did not know it."""
    for raw in query_tagged(aws, region, {TAG_JOB: job.id, TAG_ATTEMPT: str(attempt)}):
        if raw["State"]["Name"] not in ("pending", "running"):
            continue
        record_found(aws, store, job, region, raw, attempt)
        return raw["InstanceId"]
    return None


def attempt_instances(aws: AwsSession, store: Store, job: Job, attempt: int,
                      regions: list[str]) -> dict[str, list[str]]:
    """Every live instance of this attempt of the job, by region, found by its attempt tag
    in each of `regions` and in every region the store has a live instance of the job
    in: a supervisor killed mid-relaunch may have left one in any place it tried.
    Recorded if the store did not know them."""
    where = set(regions) | {i.region for i in store.instances(job.id)
                            if i.region and i.state != "terminated"}
    out: dict[str, list[str]] = {}
    for region in sorted(where):
        for raw in query_tagged(aws, region, {TAG_JOB: job.id, TAG_ATTEMPT: str(attempt)}):
            if raw["State"]["Name"] in LIVE_STATES:
                record_found(aws, store, job, region, raw, attempt)
                out.setdefault(region, []).append(raw["InstanceId"])
    return out


def public_ipv4s(raw: dict) -> int:
    """How many public IPv4 addresses an instance (DescribeInstances' record) holds: one
    per network interface with a public address (one at most at launch, cluster.py)."""
    found = {(i.get("Association") or {}).get("PublicIp")
             for i in raw.get("NetworkInterfaces") or []} - {None, ""}
    return max(len(found), 1 if raw.get("PublicIpAddress") else 0)


def record_found(aws: AwsSession, store: Store, job: Job, region: str, raw: dict, attempt: int) -> None:
    """An instance of the attempt found by its tags: recorded if the store did not know
    it (its minutes are billed like any other)."""
    if raw["InstanceId"] in {i.id for i in store.instances(job.id)}:
        return
    spot = raw.get("InstanceLifecycle") == "spot"
    zone = raw.get("Placement", {}).get("AvailabilityZone")
    store.add_instance(Instance(
        id=raw["InstanceId"], job_id=job.id, provider=aws.name, region=region, zone=zone,
        instance_type=raw.get("InstanceType"), market=Market.SPOT if spot else Market.ON_DEMAND,
        state="requested", launched_at=raw["LaunchTime"].timestamp(), terminated_at=None,
        price_per_hour=None, details={"found_by_tag": True,
                                      "public_ipv4": public_ipv4s(raw)}))
    store.add_event(job.id, "instance", detail=f"{raw['InstanceId']} in {zone} (attempt "
                    f"{attempt}, found by its tags)")


def query_tagged(aws: AwsSession, region: str, tags: dict[str, str | None], client=None,
           filters: list[dict] | None = None) -> list[dict]:
    filters = [{"Name": f"tag:{k}", "Values": [v]} if v else {"Name": "tag-key", "Values": [k]}
               for k, v in tags.items()] + list(filters or [])
    out = []
    paginator = (client or aws.client("ec2", region)).get_paginator("describe_instances")
    with aws_errors(region):
        for page in paginator.paginate(Filters=filters):
            for res in page["Reservations"]:
                out.extend(res["Instances"])
    return out
