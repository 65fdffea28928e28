"""EC2 Auto Scaling groups: a recovering spot job's instances kept running by AWS itself.

    create_launch_template(region, job, spec, user_data)  the job's template (made once)
    new_template_version(region, job, spec, user_data)    its version with the pinned bundle
    create_job_group(store, job, spec, user_data)         template, group and its deadline
    recorded_groups(store, job)                           (region, name) the store says exist
    group_launches(store, job)                            the instances the job's group launched
    delete_job_groups(store, job)                         by record and by tag, then templates
    delete_job_group(region, name)                            one group (ForceDelete) and template
    group_orphans(region, owner, client)                  groups and templates by owner tag

A job's group and its launch template share one name, `cloudtrain-<job id>`, and carry the
job's tags (cloudtrain:job, cloudtrain:owner, ...), so `down` finds both by record and by tag,
in every region, with the local state lost. Deleting a group comes before terminating its
instances anywhere: a group that still exists replaces an instance `down` just terminated.
Every call goes through AWSProvider.call (its clients, standard retries, and AWS's errors in
our words); each verb is safe to run again.
"""

from __future__ import annotations

import base64
import json
import re
import time

from ...market import Market
from ...state import Job, Store
from . import bootstrap, instances, job_role, network, placement
from .errors import AWSError, aws_errors
from .instances import RUNTIME_MARGIN_MIN
from .session import AwsSession
from .tags import LIVE_STATES, TAG_ATTEMPT, TAG_JOB, TAG_OWNER, job_tags

# The timeline rows that say a job's group was made (before CreateAutoScalingGroup: a
# launcher killed in the call still leaves the record) and deleted; detail "<name> in <region>".
GROUP_EVENT, GROUP_DELETED_EVENT = "auto-scaling-group", "auto-scaling-group-deleted"
DEADLINE_ACTION = "cloudtrain-deadline"  # the scheduled action that sets the group to 0
# Spot pools chosen by AWS's capacity data first, then by price: see create_job_group.
SPOT_STRATEGY = "price-capacity-optimized"
GROUP_DELETE_WAIT_S = 120.0  # how long delete_job_group waits for the group's instances to go
# AWS's words for a group or template that does not exist (deleted already: done).
GROUP_GONE = ("not found", "does not exist")
TEMPLATE_GONE = {"InvalidLaunchTemplateName.NotFoundException",
                 "InvalidLaunchTemplateId.NotFound", "InvalidLaunchTemplateId.Malformed"}
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
ZONE = re.compile(r"[a-z]{2}(-[a-z0-9]+){1,4}")
# A group's scaling activities name what it did to an instance in their Description (an
# instance attached by hand is "Attaching an existing EC2 instance", not launched by it).
LAUNCHED = re.compile(rf"Launching a new EC2 instance: ({INSTANCE_ID.pattern})\b")
TERMINATED = re.compile(rf"Terminating EC2 instance: ({INSTANCE_ID.pattern})\b")


def group_name(job_id: str) -> str:
    """The job's Auto Scaling group and launch template (one of each per job)."""
    return f"cloudtrain-{job_id}"


def _zone(details) -> str | None:
    """The AZ an activity's Details (a JSON string: {"Subnet ID", "Availability Zone"}) names."""
    try:
        zone = json.loads(details).get("Availability Zone") if details else None
    except (ValueError, AttributeError):
        return None
    return zone if isinstance(zone, str) and ZONE.fullmatch(zone) else None


def _gone(exc: AWSError) -> bool:
    """A ValidationError that says the group does not exist (Auto Scaling has no NotFound)."""
    return exc.code == "ValidationError" and any(w in exc.aws_message for w in GROUP_GONE)


def create_launch_template(aws: AwsSession, region: str, job: Job, spec, user_data: str | bytes
                           ) -> str:
    """The job's launch template, made once (a second call finds it): what launch's
    RunInstances request holds today (AMI, type, key, security group, the encrypted gp3
    root volume, shutdown behaviour terminate, IMDSv2 with the configured hop limit, the
    instance profile when configured, the job's tags on instance and volume) with the caller's
    user-data, and instance-metadata tags on, so an instance can read its own job id.
    No market options: a mixed-instances group refuses a template that asks for spot
    (the group's InstancesDistribution does). Returns its id."""
    data, tags = _template_data(aws, region, job, spec, user_data)
    name = group_name(job.id)
    try:
        made = aws.call(region, "create_launch_template", LaunchTemplateName=name,
                        ClientToken=f"{job.id}-template", LaunchTemplateData=data,
                        TagSpecifications=[{"ResourceType": "launch-template",
                                            "Tags": tags}])
        return made["LaunchTemplate"]["LaunchTemplateId"]
    except AWSError as exc:
        if "AlreadyExists" not in exc.code:
            raise
    (found,) = aws.call(region, "describe_launch_templates",
                        LaunchTemplateNames=[name])["LaunchTemplates"]
    return found["LaunchTemplateId"]


def _template_data(aws: AwsSession, region: str, job: Job, spec, user_data: str | bytes
                   ) -> tuple[dict, list[dict]]:
    """(LaunchTemplateData, the job's tags) for the job's template with `user_data`."""
    boot = bootstrap.for_placement(aws, region, spec.placement)
    request = instances.run_request(aws, job, spec, "", boot["group"], boot["ami"],
                                    boot["key_name"], boot["owner"],
                                    instances.root_volume_gb(aws, spec, boot), boot["root_device"])
    tags = _group_tags(aws, job, spec, boot["owner"])
    data = {k: request[k] for k in (
        "ImageId", "InstanceType", "KeyName", "SecurityGroupIds",
        "InstanceInitiatedShutdownBehavior", "BlockDeviceMappings", "IamInstanceProfile")
        if k in request}
    data["MetadataOptions"] = {**request["MetadataOptions"], "InstanceMetadataTags": "enabled"}
    # Every resource RunInstances tags (the instance, its volume and network interface, its
    # spot request): creating the group checks the caller's ec2:RunInstances against the
    # template, and the CLI policy wants the owner tag on each of them.
    data["TagSpecifications"] = [{"ResourceType": t["ResourceType"], "Tags": tags}
                                 for t in request["TagSpecifications"]]
    raw = user_data if isinstance(user_data, bytes) else user_data.encode()  # gzip: bytes
    data["UserData"] = base64.b64encode(raw).decode()
    return data, tags


def new_template_version(aws: AwsSession, region: str, job: Job, spec, user_data: bytes) -> int:
    """A new version of the job's launch template with `user_data`, the rest as the first
    (made whole again, not from SourceVersion: what AWS inherits from it, moto drops), which
    the group launches from then on (it asks for $Latest); its number. One per job
    (ClientToken): a second call returns the same version."""
    data, _ = _template_data(aws, region, job, spec, user_data)
    made = aws.call(region, "create_launch_template_version",
                    LaunchTemplateName=group_name(job.id), ClientToken=f"{job.id}-pinned",
                    LaunchTemplateData=data)
    return int(made["LaunchTemplateVersion"]["VersionNumber"])


def create_job_group(aws: AwsSession, store: Store, job: Job, spec, user_data: str | bytes) -> str:
    """The job's Auto Scaling group, and its template: spec.nodes instances (desired =
    min = max), in the region's AZs that offer the type (one AZ, in the job's cluster
    placement group, for a job on several nodes: such a group is tied to one AZ), spot
    above an on-demand base of 0, the job's tags on what it launches, and a scheduled
    action that sets it to 0 at the deadline (max runtime + the power-off timers'
    margin), the last kill switch when every agent is broken. Returns the group's name.

    Spot allocation: price-capacity-optimized. AWS picks the pools least likely to be
    interrupted and, among those, the cheapest; capacity-optimized looks at capacity
    only and may pay much more for the same type. An interruption costs this job the
    work since its last checkpoint and a boot, so capacity comes first, but with one
    type over a handful of AZs, price among equally deep pools is worth taking.
    Capacity Rebalancing stays off: it starts a second instance on a rebalance
    recommendation while the first still trains, two writers of one job.

    On any failure nothing is left: the group (if made) and the template are deleted,
    then the error is raised. Safe to run again: an existing group is kept."""
    region = aws.region(spec)
    boot = bootstrap.for_placement(aws, region, spec.placement)
    scores = instances.zone_order_scores(aws, spec, region)
    zones = group_zones(aws, region, boot["zones"], spec, scores)
    instances.record_zone_order(store, job, spec, region, zones, scores)
    name = group_name(job.id)
    store.add_event(job.id, GROUP_EVENT, detail=f"{name} in {region}")
    try:
        create_launch_template(aws, region, job, spec, user_data)
        request = dict(
            AutoScalingGroupName=name, MinSize=spec.nodes, MaxSize=spec.nodes,
            DesiredCapacity=spec.nodes,
            VPCZoneIdentifier=",".join(subnet for _zone, subnet, *_ in zones),
            MixedInstancesPolicy={
                "LaunchTemplate": {
                    "LaunchTemplateSpecification": {"LaunchTemplateName": name,
                                                    "Version": "$Latest"},
                    "Overrides": [{"InstanceType": t} for t in group_types(spec)]},
                "InstancesDistribution": _distribution(spec)},
            Tags=[{**t, "PropagateAtLaunch": True, "ResourceId": name,
                   "ResourceType": "auto-scaling-group"}
                  for t in _group_tags(aws, job, spec, boot["owner"])],
            NewInstancesProtectedFromScaleIn=False, CapacityRebalance=False,
            HealthCheckType="EC2")
        if spec.nodes > 1:
            request["PlacementGroup"] = placement.create_placement_group(aws, region, job, spec, 0,
                                                                         boot["owner"])
        try:
            job_role.launch_retry(aws, job, lambda: aws.call(
                region, "create_auto_scaling_group", service="autoscaling", **request))
        except AWSError as exc:
            if exc.code != "AlreadyExists":  # a re-run: the group is there
                raise
        deadline = time.time() + spec.max_runtime_s + RUNTIME_MARGIN_MIN * 60
        import datetime

        aws.call(region, "put_scheduled_update_group_action", service="autoscaling",
                 AutoScalingGroupName=name, ScheduledActionName=DEADLINE_ACTION,
                 StartTime=datetime.datetime.fromtimestamp(deadline, datetime.timezone.utc),
                 MinSize=0, MaxSize=0, DesiredCapacity=0)
    except BaseException:
        try:
            delete_job_group(aws, region, name)
            if spec.nodes > 1:
                placement.delete_placement_groups(aws, region, job.id)
            store.add_event(job.id, GROUP_DELETED_EVENT, detail=f"{name} in {region}")
        except Exception:  # noqa: BLE001 - the first error is the one to say; the
            pass           # record stays, so `down` deletes it by record and by tag
        raise
    return name


def group_zones(aws: AwsSession, region: str, zones: list[tuple], spec,
                scores=None) -> list[tuple]:
    """The (zone, subnet, vpc, zone id) rows of launch's subnets (bootstrap's) in the AZs
    that offer the type, in launch's order (the AZ of the highest spot placement score,
    `scores`, then the catalog's cheapest spot AZ first); the first only for a job on
    several nodes. All of them when EC2 cannot be asked which AZs
    offer it: the group then skips an AZ without the type by itself."""
    place = spec.placement
    try:
        offered = {o["Location"] for o in aws.call(
            region, "describe_instance_type_offerings", LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [place.instance_type]}]
        )["InstanceTypeOfferings"]}
    except AWSError:
        offered = set()
    usable = network.order_zones(zones, place.instance_type, region, place.market,
                                 scores.scores if scores else None)
    if offered:
        usable = [z for z in usable if z[0] in offered]
        if not usable:
            raise AWSError(f"{place.instance_type} is offered in no AZ of {region} that the "
                           "subnets cover", hint="cloudtrain catalog lists types and regions")
    return usable[:1] if spec.nodes > 1 else usable


def group_types(spec) -> list[str]:
    """The instance types the group may launch: the job's own, then, for a job whose type
    --gpus chose, the types of the same GPUs it may also run on (Placement.types: at least
    its vCPUs, memory and instance store), so that a replacement that finds no capacity for
    one type takes another. One GPU model and count: the processes per node the job
    was planned for."""
    return spec.placement.types()


def _distribution(spec) -> dict:
    spot = spec.placement.market == Market.SPOT
    out = {"OnDemandBaseCapacity": 0,
           "OnDemandPercentageAboveBaseCapacity": 0 if spot else 100,
           "SpotAllocationStrategy": SPOT_STRATEGY}
    if spot and spec.placement.max_price is not None:
        out["SpotMaxPrice"] = f"{spec.placement.max_price:.4f}"
    return out


def _group_tags(aws: AwsSession, job: Job, spec, owner: str) -> list[dict]:
    """The job's tags without the attempt's: a replacement is no attempt of a launch."""
    return [t for t in job_tags(job, spec, owner) if t["Key"] != TAG_ATTEMPT]


def recorded_groups(store: Store, job: Job) -> list[tuple[str, str]]:
    """(region, name) of the groups the job's timeline says were made and not deleted."""
    made: dict[tuple[str, str], bool] = {}
    for event in store.events(job.id):
        detail = event.detail or ""
        if event.phase in (GROUP_EVENT, GROUP_DELETED_EVENT) and " in " in detail:
            name, region = detail.rsplit(" in ", 1)
            made[(region, name)] = event.phase == GROUP_EVENT
    return [key for key, live in made.items() if live]


def group_launches(aws: AwsSession, store: Store, job: Job) -> dict[str, dict]:
    """The instances the job's Auto Scaling group launched, as AWS Auto Scaling itself
    records them: id -> {launched_at, terminated_at (None while it runs), zone}; {} for a
    job without a group. The record is the group's scaling activities, which only AWS
    writes and keeps for 6 weeks, a deleted group's too (IncludeDeletedGroups), while
    EC2 stops listing an instance about an hour after its end. launched_at is when the
    group began its launch; terminated_at when the group began ending it (EC2 bills until
    the instance is shutting down; for one that EC2 ended itself, a spot reclaim, the
    group notices a little later: a bound, not the second). Raises AWSError where AWS
    refuses (autoscaling:DescribeScalingActivities, infra/iam-policy-autoscaling.json)."""
    name = job.facts.auto_scaling_group
    if not name:
        return {}
    region = aws.region_of(job)
    client = aws.client("autoscaling", region)
    out: dict[str, dict] = {}
    ends: dict[str, float] = {}
    with aws_errors(region, "autoscaling"):
        for page in client.get_paginator("describe_scaling_activities").paginate(
                AutoScalingGroupName=name, IncludeDeletedGroups=True):
            for activity in page.get("Activities") or []:
                if activity.get("AutoScalingGroupName") != name:
                    continue
                text, at = activity.get("Description") or "", activity.get("StartTime")
                if not hasattr(at, "timestamp"):
                    continue
                if found := LAUNCHED.match(text):
                    out[found.group(1)] = {"launched_at": at.timestamp(),
                                           "terminated_at": None,
                                           "zone": _zone(activity.get("Details"))}
                elif found := TERMINATED.match(text):
                    ends[found.group(1)] = at.timestamp()
    for instance, at in ends.items():
        if instance in out:
            out[instance]["terminated_at"] = at
    return out


def groups_by_tag(aws: AwsSession, region: str, key: str, value: str, client=None) -> list[dict]:
    """Auto Scaling groups tagged key=value in the region (a paginated describe)."""
    client = client or aws.client("autoscaling", region)
    out = []
    with aws_errors(region, "autoscaling"):
        for page in client.get_paginator("describe_auto_scaling_groups").paginate(
                Filters=[{"Name": f"tag:{key}", "Values": [value]}]):
            out.extend(page["AutoScalingGroups"])
    return out


def templates_by_tag(aws: AwsSession, region: str, key: str, value: str, client=None) -> list[dict]:
    """Launch templates tagged key=value in the region."""
    client = client or aws.client("ec2", region)
    out = []
    with aws_errors(region):
        for page in client.get_paginator("describe_launch_templates").paginate(
                Filters=[{"Name": f"tag:{key}", "Values": [value]}]):
            out.extend(page["LaunchTemplates"])
    return out


def group_orphans(aws: AwsSession, region: str, owner: str, held: set[str]) -> list[dict]:
    """This owner's groups, then launch templates without a group, in the region, of no
    job in `held` (job ids): what `down --all` deletes before it terminates instances.
    Each {id: name, region, job, kind: "group" | "launch-template"}. Made with the
    sweep's clients (sweep threads share nothing else)."""
    out = []
    groups = groups_by_tag(aws, region, TAG_OWNER, owner,
                            aws.sweep_client(region, "autoscaling"))
    names = set()
    for g in groups:
        tags = {t["Key"]: t["Value"] for t in g.get("Tags", [])}
        names.add(g["AutoScalingGroupName"])
        if tags.get(TAG_JOB) not in held:
            out.append({"id": g["AutoScalingGroupName"], "region": region,
                        "job": tags.get(TAG_JOB), "kind": "group"})
    for t in templates_by_tag(aws, region, TAG_OWNER, owner, aws.sweep_client(region)):
        tags = {x["Key"]: x["Value"] for x in t.get("Tags", [])}
        if t["LaunchTemplateName"] not in names and tags.get(TAG_JOB) not in held:
            out.append({"id": t["LaunchTemplateName"], "region": region,
                        "job": tags.get(TAG_JOB), "kind": "launch-template"})
    return out


def delete_job_groups(aws: AwsSession, store: Store, job: Job) -> list[str]:
    """Delete the job's groups, by record and by tag, in every region the job has
    anything in, and their templates; the names of the groups deleted. A lookup by tag
    that AWS refuses (no Auto Scaling permissions) is not an error for a job without a
    recorded group: whoever could not look could not have made one either."""
    recorded = recorded_groups(store, job)
    regions = {r for r, _ in recorded} | {i.region for i in store.instances(job.id)
                                         if i.region} | {aws.region_of(job)}
    deleted = []
    for region in sorted(regions):
        names = {n for r, n in recorded if r == region}
        try:
            names |= {g["AutoScalingGroupName"]
                      for g in groups_by_tag(aws, region, TAG_JOB, job.id)}
            names |= {t["LaunchTemplateName"]
                      for t in templates_by_tag(aws, region, TAG_JOB, job.id)}
        except AWSError as exc:
            if names or not exc.denied:
                raise
        for name in sorted(names):
            if delete_job_group(aws, region, name):
                deleted.append(name)
            if (region, name) in recorded:
                store.add_event(job.id, GROUP_DELETED_EVENT, detail=f"{name} in {region}")
    return deleted


def delete_job_group(aws: AwsSession, region: str, name: str) -> bool:
    """Delete the group `name` (ForceDelete: its instances are terminated with it) and
    wait, bounded, until none of them is still running, so that nothing it launches
    outlives the call; then its launch template. Whether a group was there. A group
    that is already being deleted, or gone, is fine (safe to run again)."""
    existed = True
    for _ in range(5):
        try:
            aws.call(region, "delete_auto_scaling_group", service="autoscaling",
                     AutoScalingGroupName=name, ForceDelete=True)
            break
        except AWSError as exc:
            if _gone(exc):
                existed = False
                break
            # A scaling activity in progress (the group launching right now) refuses a
            # delete for a moment; AWS says to try again.
            if exc.code not in ("ScalingActivityInProgress", "ResourceInUse"):
                raise
            time.sleep(aws.settings.poll_seconds)
    else:
        raise AWSError(f"the auto scaling group {name} in {region} could not be deleted: "
                       "a scaling activity is still in progress",
                       hint="run `cloudtrain down` again in a minute")
    if existed:
        _wait_group_gone(aws, region, name)
    try:
        aws.call(region, "delete_launch_template", LaunchTemplateName=name)
    except AWSError as exc:
        # moto 5.2 answers MissingParameter for a name it does not know
        if exc.code not in TEMPLATE_GONE and exc.code != "MissingParameter":
            raise
    return existed


def group_members(aws: AwsSession, region: str, name: str) -> tuple[list[dict], list[str]]:
    """(the group as Auto Scaling describes it: [] where there is none, the ids of its
    instances that are not terminating)."""
    found = aws.call(region, "describe_auto_scaling_groups", service="autoscaling",
                     AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return found, [i["InstanceId"] for g in found for i in g.get("Instances", [])
                   if not i.get("LifecycleState", "").startswith("Terminat")]


def _wait_group_gone(aws: AwsSession, region: str, name: str) -> None:
    """Until the group is gone or every instance it holds is terminating (AWS deletes a
    group asynchronously: "Delete in progress" while its instances shut down), at most
    GROUP_DELETE_WAIT_S."""
    deadline = time.monotonic() + GROUP_DELETE_WAIT_S
    while True:
        found, running = group_members(aws, region, name)
        if not found or not running and found[0].get("Status"):
            return
        if not running:  # no instance, not yet marked deleting: EC2's view decides
            live = aws.call(region, "describe_instances", Filters=[
                {"Name": "tag:aws:autoscaling:groupName", "Values": [name]},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)}])
            if not any(r["Instances"] for r in live["Reservations"]):
                return
        if time.monotonic() >= deadline:
            raise AWSError(f"the auto scaling group {name} in {region} still has instances "
                           f"running {GROUP_DELETE_WAIT_S:.0f} s after its deletion",
                           hint="run `cloudtrain down` again; the deletion goes on at AWS")
        time.sleep(aws.settings.poll_seconds)
