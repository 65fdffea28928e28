"""Inventory: the instances that are ours, found by tag in one region or every one the
account has (sweep), terminated (release, terminate), reconciled with the store, and their
end times for the bill."""

from __future__ import annotations

import json
import time

from ... import catalog
from ...config import REGION_PATTERN, check_region
from ...errors import CloudtrainError, MissingDependency, UsageError
from ...state import Instance, Job, Store
from ...market import Market
from ..base import Sweep
from . import boot, groups as job_groups, instances as ec2, job_role, network, placement, pricing, \
    volumes as ebs
from .cache import RegionCache
from .errors import AWSError
from .instances import UNANSWERED
from .session import AwsSession, partition
from .tags import LIVE_STATES, TAG_GROUP, TAG_JOB, TAG_OWNER

ROLE_DELETED_EVENT = "job-role-deleted"  # the timeline row of the job's IAM role's end

# How long release() keeps looking by tag for the instance of an unanswered RunInstances.
RELEASE_LOOKUP_S = 60.0
# An instance recorded this recently that EC2 says does not exist may just not be visible yet.
FRESH_S = 600.0


def ec2_transition_time(reason: str) -> float | None:
    """EC2 puts the time of a stop or termination in StateTransitionReason:
    'User initiated (2026-11-22 03:00:00 GMT)'."""
    import calendar
    import re

    m = re.search(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)", reason or "")
    if not m:
        return None
    return float(calendar.timegm(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")))


# A sweep asks every region the owner can have instances in: this many at once, and
# for at most this long in all (a region that has not answered by then is said unchecked).
SWEEP_WORKERS = 16
SWEEP_WAIT_S = 60.0


def instance_states(aws: AwsSession, store: Store, job: Job) -> dict[str, dict]:
    """EC2's view of the job's instances: id -> {state, reason, message, group (the Auto
    Scaling group's tag, which only AWS sets, or None), job (its cloudtrain:job tag)}. By the job's tag, and by id for a
    recorded one tagged with another job's id: a kept instance that `launch --on` handed
    over keeps the tag of the job that launched it (tags are set only at creation)."""
    out = {}
    recorded = store.instances(job.id)
    regions = {i.region for i in recorded if i.region}
    if job.facts.auto_scaling_group and job.spec.placement.region:
        regions.add(job.spec.placement.region)  # where its group's replacements are
    for region in regions:
        found = ec2.query_tagged(aws, region, {TAG_JOB: job.id})
        other = sorted({i.id for i in recorded if i.region == region and i.id.startswith("i-")}
                       - {raw["InstanceId"] for raw in found})
        if other:  # a filter, not InstanceIds: an id EC2 forgot is no error, just absent
            found += ec2.query_tagged(aws, region, {}, filters=[{"Name": "instance-id",
                                                           "Values": other}])
        for raw in found:
            tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
            out[raw["InstanceId"]] = {"state": raw["State"]["Name"],
                                      "reason": raw.get("StateReason", {}).get("Code", ""),
                                      "message": raw.get("StateReason", {}).get("Message", ""),
                                      "group": tags.get(TAG_GROUP), "job": tags.get(TAG_JOB)}
    return out


def release(aws: AwsSession, store: Store, job: Job, force: bool = False) -> None:
    """Terminate what the job has: its Auto Scaling group first (groups.py), then the
    recorded instances and anything tagged with its id (a request whose answer was lost
    still started an instance). A --keep job's instance
    stays until `cloudtrain down` (force)."""
    events = [e.phase for e in store.events(job.id)]
    # --keep keeps an instance that ran the job; one that never did (the launch failed or
    # its launcher died) goes like any other.
    if job.keeps_instance and not force and job.state != "cancelled" \
            and "running" in events:
        return
    # The job's Auto Scaling group first: it would replace what is terminated below. Its
    # instances are terminated even if it cannot be deleted; that is said at the end.
    group_error: CloudtrainError | None
    try:
        job_groups.delete_job_groups(aws, store, job)
        group_error = None
    except MissingDependency as exc:  # no credentials: as for the instances below
        group_error = exc if job_groups.recorded_groups(store, job) else None
    except CloudtrainError as exc:
        group_error = exc
    recorded = store.instances(job.id)
    regions = {i.region for i in recorded if i.region} or {aws.region_of(job)}
    # RunInstances went unanswered (timeout, dropped connection, 5xx, interrupted): an
    # instance may exist that the store never heard of, and DescribeInstances is
    # eventually consistent, so a seconds-old instance can be missing from a tag lookup.
    # Look again, bounded, until it shows up.
    lost = UNANSWERED in events and not recorded
    until = time.monotonic() + RELEASE_LOOKUP_S if lost else None
    for region in regions:
        ids = {i.id for i in recorded if i.region == region and i.state != "terminated"}
        try:
            tagged = _find_by_tag(aws, region, job.id, until)
            ids = tagged | _still_the_job_s(aws, store, job, region, ids - tagged)
        except MissingDependency:
            # No AWS credentials at all, nothing recorded and no request unanswered:
            # this launch never reached EC2, there is nothing to look for.
            if recorded or lost:
                raise
        if ids:
            _terminate(aws, store, job, region, ids)
        if int(job.spec.nodes or 1) > 1:
            # Deleted here if its instances are gone already, else by the next cleanup
            # (`down`, the next multi-node launch): a group in use cannot be deleted.
            placement.delete_placement_groups(aws, region, job.id)
        if any(d.get("kind") == "snapshot" for d in job.spec.data.datasets or []):
            # Attached volumes go with their instance; one the launch made but never
            # attached (or attached without DeleteOnTermination) would bill on alone.
            # By tag, not by record: a launcher killed right after CreateVolume
            # recorded nothing.
            ebs.delete_job_volumes(aws, region, job.id)
        for raw in ec2.query_tagged(aws, region, {TAG_JOB: job.id}) if ids else []:
            known = {i.id for i in store.instances(job.id)}
            if raw["InstanceId"] not in known:  # found by tag only: record it now
                store.add_instance(Instance(
                    id=raw["InstanceId"], job_id=job.id, provider=aws.name, region=region,
                    zone=raw.get("Placement", {}).get("AvailabilityZone"),
                    instance_type=raw.get("InstanceType"), market=job.spec.placement.market,
                    state="requested", launched_at=raw["LaunchTime"].timestamp(),
                    terminated_at=None, price_per_hour=None, details={"found_by_tag": True}))
    record_ends(aws, store, job)
    # The job's own IAM role last: its instances are gone (a role deleted under a running
    # instance ends that instance's writes, and a group could still start one with it).
    role = store.job(job.id).facts.job_role
    if role and group_error is None:
        if job_role.delete(aws, aws.region_of(job), role):
            store.add_event(job.id, ROLE_DELETED_EVENT, detail=role)
    if group_error is not None:
        raise group_error


def _terminate(aws: AwsSession, store: Store, job: Job, region: str, ids: set[str]) -> None:
    """TerminateInstances on `ids`. EC2 refuses the whole call when one id is unknown
    (InvalidInstanceID.NotFound, "The instance IDs 'i-1, i-2' do not exist"): an id it
    no longer knows whose record is older than FRESH_S ended long ago (EC2 forgets an
    instance about an hour after its end) and is left to record_ends; a fresher one may
    not be visible yet (EC2 is eventually consistent) and is asked again, for at most
    RELEASE_LOOKUP_S. The rest are terminated either way."""
    import re

    launched = {i.id: i.launched_at for i in store.instances(job.id)}
    left, until = set(ids), time.monotonic() + RELEASE_LOOKUP_S
    while left:
        try:
            aws.call(region, "terminate_instances", InstanceIds=sorted(left))
            return
        except AWSError as exc:
            unknown = set(re.findall(r"\bi-[0-9a-f]{8,17}\b", exc.message)) & left \
                if exc.code == "InvalidInstanceID.NotFound" else set()
            if not unknown:
                raise
            fresh = {i for i in unknown
                     if time.time() - (launched.get(i) or time.time()) < FRESH_S}
            if fresh and time.monotonic() >= until:
                raise
            left -= unknown - fresh
            if fresh and left == fresh:
                time.sleep(aws.settings.poll_seconds)


def _still_the_job_s(aws: AwsSession, store: Store, job: Job, region: str, ids: set[str]) -> set[str]:
    """Of instances the store records for the job that a lookup by its tag did not
    return, those still to terminate: each one EC2 shows with the job's tag, and each
    one EC2 does not list at all (seconds old, not yet in DescribeInstances, which is
    eventually consistent; or gone long ago: no other instance answers to its id). One
    EC2 shows without the job's tag is not the job's, whatever the store says (a record
    learnt from the job store, which the job's grant writes): left alone, and said."""
    if not ids:
        return set()
    shown = {}
    for one in ec2.query_tagged(aws, region, {}, filters=[{"Name": "instance-id",
                                                     "Values": sorted(ids)}]):
        shown[one["InstanceId"]] = one
    # a kept instance handed over by `launch --on` wears the tag of the job that launched it
    tagged = {i.id: (i.details or {}).get("tagged_job", job.id) for i in store.instances(job.id)}
    keep = set()
    for instance in sorted(ids):
        raw = shown.get(instance)
        tags = {t["Key"]: t["Value"] for t in (raw or {}).get("Tags", [])}
        if raw is None or tags.get(TAG_JOB) == tagged.get(instance, job.id):
            keep.add(instance)
            continue
        other = f"job {tags[TAG_JOB]}'s tag" if tags.get(TAG_JOB) else "no cloudtrain:job tag"
        store.add_event(job.id, "release", once=True, detail=(
            f"{instance} NOT terminated: the job's record names it, but EC2 shows it with "
            f"{other}, not this job's"))
    return keep


def _find_by_tag(aws: AwsSession, region: str, job_id: str, until: float | None) -> set[str]:
    """The job's instances not yet terminated, by its tag; with `until`, asked again
    every poll_seconds until one shows up or that time passes."""
    while True:
        found = {r["InstanceId"] for r in ec2.query_tagged(aws, region, {TAG_JOB: job_id})
                 if r["State"]["Name"] != "terminated"}
        if found or until is None or time.monotonic() >= until:
            return found
        time.sleep(aws.settings.poll_seconds)


def record_ends(aws: AwsSession, store: Store, job: Job) -> None:
    """Termination times from EC2 (its state-transition reason carries the time), and for
    spot instances the price history of their AZ over their life: what the bill uses.
    EC2 stops listing an instance about an hour after its end; for one of the job's Auto
    Scaling group, the group's own record (its scaling activities, kept 6 weeks) still
    has when the group ended it, and is read too where EC2's reason has no time. Only where
    neither knows is the end taken as now."""
    launched: dict | None = None  # the group's record, read once where EC2 has forgotten
    for inst in store.instances(job.id):
        if inst.state == "terminated" and inst.terminated_at and not (
                inst.market == Market.SPOT and not (inst.details or {}).get("spot_history")):
            continue
        assert inst.region is not None  # an EC2 instance is recorded with its region
        raw = {}
        try:
            raw = boot.describe_instance(aws, inst.region, inst.id)
        except Exception:  # gone from EC2's view (about an hour after termination)
            pass
        ended = ec2_transition_time(raw.get("StateTransitionReason", ""))
        # Where EC2 has forgotten the instance, or gives no time for its end (a spot
        # interruption's reason need not carry one), the group's record of it has the time.
        if not ended and not inst.terminated_at and (inst.details or {}).get(
                "auto_scaling_group"):
            if launched is None:
                try:
                    launched = job_groups.group_launches(aws, store, job)
                except CloudtrainError:
                    launched = {}
            ended = (launched.get(inst.id) or {}).get("terminated_at")
        ended = ended or time.time()
        # EC2's reason and the group's record give whole seconds: an instance that powered
        # off within the second it started (a spot replacement past a deadline's switch)
        # would end before its recorded start.
        end = max(inst.terminated_at or ended, inst.launched_at or 0.0)
        fields: dict[str, object] = {"state": "terminated", "terminated_at": end}
        if inst.market == Market.SPOT:
            details = dict(inst.details or {})
            zone = raw.get("Placement", {}).get("AvailabilityZone") or inst.zone
            try:
                details["spot_history"] = pricing.spot_history(
                    aws, inst.region, zone, inst.instance_type, inst.launched_at, end)
            except CloudtrainError:
                pass  # the cost stays an estimate; `cost-report --refresh` asks again
            fields["details"] = json.dumps(details)
        store.update_instance(inst.id, **fields)


def regions_in_use(aws: AwsSession, store: Store | None) -> set[str]:
    """The regions the store has instances in, plus the one launches use (the built-in
    default included: it is where a job goes when nothing names a region)."""
    regions = {r["region"] for r in store.db.execute(
        "SELECT DISTINCT region FROM instances WHERE provider = 'aws' AND region IS NOT NULL")
    } if store is not None else set()
    try:
        regions.add(aws.region())
    except UsageError:
        pass
    return regions


def sweep_regions(aws: AwsSession, store: Store | None) -> tuple[list[str], str]:
    """Every region the owner can have instances in, and how they were chosen: the
    regions enabled for the account (DescribeRegions, asked in the region launches use;
    opt-in regions not enabled cannot hold instances). Without that answer, every region
    cloudtrain itself could have used: the one launches use (the default included),
    those config.yaml names, those the store knows, and the bundled catalog's."""
    home = aws.region()
    try:
        answer = aws.call(home, "describe_regions")
        named = [r.get("RegionName") for r in answer.get("Regions") or []]
        regions = {r for r in named if isinstance(r, str) and REGION_PATTERN.fullmatch(r)
                   and partition(r) == partition(home)}
        if regions:
            return sorted(regions | {home}), "the regions enabled for the account"
        why = "it listed none"
    except MissingDependency:
        raise
    except CloudtrainError as exc:
        why = exc.message
    regions = regions_in_use(aws, store) | set(catalog.regions())
    regions |= {r.strip() for r in f"{aws.settings.region},{aws.settings.regions}"
                .split(",") if REGION_PATTERN.fullmatch(r.strip())}
    return sorted(regions), (f"DescribeRegions failed ({why}), so the regions cloudtrain "
                             "could have used")


def sweep(aws: AwsSession, store: Store | None, ask) -> Sweep:
    """ask(region) in every region of sweep_regions at once, SWEEP_WORKERS at a time, in
    daemon threads: a region that never answers holds the command up SWEEP_WAIT_S at
    most, and is then said to be unchecked like one whose call failed. `ask` makes only
    AWS calls (the store is not shared between threads)."""
    import queue
    import threading

    regions, chosen_by = sweep_regions(aws, store)
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for region in regions:
        todo.put(region)
    answers: dict[str, object] = {}
    failures: dict[str, str] = {}
    finished = threading.Semaphore(0)

    def work() -> None:
        while True:
            try:
                region = todo.get_nowait()
            except queue.Empty:
                return
            try:
                answers[region] = ask(region)
            except CloudtrainError as exc:
                failures[region] = exc.message
            except Exception as exc:  # noqa: BLE001 - said as that region's failure
                failures[region] = f"{type(exc).__name__}: {exc}"
            finished.release()

    for _ in range(min(SWEEP_WORKERS, len(regions))):
        threading.Thread(target=work, daemon=True, name="cloudtrain-sweep").start()
    deadline = time.monotonic() + SWEEP_WAIT_S
    for _ in regions:
        if not finished.acquire(timeout=max(0.0, deadline - time.monotonic())):
            break
    answers, failures = dict(answers), dict(failures)
    unchecked = {r: failures.get(r) or f"no answer in {SWEEP_WAIT_S:g} s"
                 for r in regions if r not in answers}
    return Sweep(answers, sorted(answers), unchecked, chosen_by)


def _tagged(aws: AwsSession, region: str, tags: dict[str, str | None]) -> list[dict]:
    """query_tagged for a sweep (its own clients)."""
    return ec2.query_tagged(aws, region, tags, aws.sweep_client(region))


def orphans(aws: AwsSession, store: Store) -> Sweep:
    """Every live instance tagged as this owner's, in every region it can have one
    (sweep), that no active job of the store holds (nor an ended --keep job, whose
    instance is kept on purpose), its dataset volumes left unattached, and the Auto
    Scaling groups and launch templates of jobs that hold none (kind "group",
    "launch-template"; groups.py): what `down
    --all` terminates when the local state was lost or never learned of an instance.
    Sweep.found is the list; Sweep.unchecked the regions not asked."""
    rows = store.db.execute(
        "SELECT id, job_id FROM instances WHERE provider = 'aws' AND state != 'terminated'")
    held_rows = [r for r in rows if _holds(store.job(r["job_id"]), store)]
    held = {r["id"] for r in held_rows}
    # A job that runs (or keeps its instance) holds its Auto Scaling group too.
    held_jobs = {r["job_id"] for r in held_rows} | {j.id for j in store.jobs(active_only=True)}
    owner = aws.owner(aws.region())

    def ask(region: str) -> tuple[list[dict], list[dict], list[dict]]:
        try:
            groups = job_groups.group_orphans(aws, region, owner, held_jobs)
        except AWSError as exc:
            # Without Auto Scaling permissions (infra/iam-policy-autoscaling.json not
            # attached) no group of this owner's can exist: it could not have made one.
            if not exc.denied:
                raise
            groups = []
        return (_tagged(aws, region, {TAG_OWNER: owner}),
                ebs.dataset_volumes(aws, region, owner, aws.sweep_client(region)), groups)

    swept = sweep(aws, store, ask)
    out = []
    if aws.settings.instance_profile == job_role.PER_JOB or store.db.execute(
            "SELECT 1 FROM jobs WHERE backend = 'aws' AND "
            "json_extract(details, '$.job_role') IS NOT NULL LIMIT 1").fetchone():
        # IAM is global: asked once, not per region. Roles bill nothing: without the
        # permission to list them (no per-job roles were made), none is looked for.
        try:
            out += job_role.orphans(aws, aws.region(), aws.owner_key(aws.region()), held_jobs)
        except AWSError as exc:
            if not exc.denied:
                raise
    for region in swept.regions:
        instances, volumes, groups = swept.found[region]
        out += groups
        for raw in instances:
            if raw["State"]["Name"] not in LIVE_STATES or raw["InstanceId"] in held:
                continue
            tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
            out.append({"id": raw["InstanceId"], "region": region,
                        "job": tags.get(TAG_JOB), "type": raw.get("InstanceType"),
                        "state": raw["State"]["Name"],
                        "launched_at": raw["LaunchTime"].timestamp()})
        out += ebs.orphan_volumes(store, region, volumes)
    swept.found = out
    return swept


def _holds(job: Job, store: Store) -> bool:
    """Whether the job still holds its instance: it is active, or it ran with --keep
    (kept for `launch --on` until `down`)."""
    return job.active or (job.keeps_instance
                          and "running" in [e.phase for e in store.events(job.id)])


def terminate(aws: AwsSession, region: str, ids: list[str]) -> None:
    """Terminate these instances (the caller has decided they are ours and unused)."""
    volumes = [i for i in ids if i.startswith("vol-")]
    ids = [i for i in ids if not i.startswith("vol-")]
    for volume in volumes:  # a dataset volume left unattached (volumes.py)
        aws.call(check_region(region), "delete_volume", VolumeId=volume)
    if ids:
        aws.call(check_region(region), "terminate_instances", InstanceIds=sorted(ids))


def reconcile(aws: AwsSession, store: Store) -> Sweep:
    """Every instance tagged as ours in every region the owner can have one (sweep);
    marks whether the store knows it, and updates the store's instance states.
    Sweep.found is the list; Sweep.unchecked the regions that could not be asked."""
    known = {r["id"]: r["job_id"] for r in store.db.execute(
        "SELECT id, job_id FROM instances WHERE provider = 'aws'")}
    swept = sweep(aws, store, lambda region: _tagged(aws, region, {TAG_JOB: None}))
    found = []
    for region in swept.regions:
        for raw in swept.found[region]:
            tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
            state = raw["State"]["Name"]
            found.append({"instance": raw["InstanceId"], "region": region, "state": state,
                          "type": raw.get("InstanceType"), "job": tags.get(TAG_JOB),
                          "tracked": raw["InstanceId"] in known,
                          "launched_at": raw["LaunchTime"].timestamp()})
            if raw["InstanceId"] in known and state == "terminated":
                store.db.execute(
                    "UPDATE instances SET state = 'terminated', terminated_at = "
                    "COALESCE(terminated_at, ?) WHERE id = ?", (time.time(), raw["InstanceId"]))
    swept.found = found
    return swept


def cleanup(aws: AwsSession, store: Store, regions: set[str] | None = None) -> list[str]:
    """Delete this owner's security groups, key pairs and empty placement groups where
    no live instance uses them
    (any instance: EC2 would refuse the group with DependencyViolation anyway). No
    regions: every region the store knows plus the configured one, so `down --all` can
    call it with nothing active."""
    removed = []
    for region in sorted(regions or regions_in_use(aws, store)):
        owner = aws.owner(region)
        if store is not None and store.db.execute(
                "SELECT 1 FROM jobs WHERE backend = 'aws' AND "
                "CAST(json_extract(spec, '$.nodes') AS INTEGER) > 1 LIMIT 1").fetchone():
            placement.delete_placement_groups(aws, region, owner=owner)  # of jobs on several nodes
        shared = network.shared_resources(aws, region)
        for gid in shared["security groups"]:
            if network.in_use(aws, region, "instance.group-id", gid):
                continue
            try:
                aws.call(region, "delete_security_group", GroupId=gid)
                removed.append(gid)
            except AWSError as exc:
                # An instance still shutting down holds the group: next time.
                if exc.code != "DependencyViolation":
                    raise
        for name in shared["key pairs"]:
            if network.in_use(aws, region, "key-name", name):
                continue
            aws.call(region, "delete_key_pair", KeyName=name)
            removed.append(name)
        if removed:
            RegionCache(aws.settings.aws_profile, region).clear()
    return removed


def leftovers(aws: AwsSession, region: str, job_id: str) -> dict[str, list[str]]:
    """What the cloud still holds of one job, by its tag: instances not yet terminated
    (shutting-down included), volumes not deleted, placement groups not deleted. The key
    pair and security group are not the job's: they are shared and reused."""
    tag = [{"Name": f"tag:{TAG_JOB}", "Values": [job_id]}]
    instances = [f"{r['InstanceId']} ({r['State']['Name']})"
                 for r in ec2.query_tagged(aws, region, {TAG_JOB: job_id})
                 if r["State"]["Name"] != "terminated"]
    volumes = [f"{v['VolumeId']} ({v.get('State')})" for v in aws.call(
        region, "describe_volumes", Filters=tag)["Volumes"]
        if v.get("State") not in ("deleted",)]
    groups = [g["GroupName"] for g in aws.call(
        region, "describe_placement_groups", Filters=tag)["PlacementGroups"]
        if g.get("State") not in ("deleting", "deleted")]
    return {"instances": instances, "volumes": volumes, "placement groups": groups}


def recovery_leftovers(aws: AwsSession, region: str, job_id: str) -> dict[str, list[str]]:
    """What a recovering job makes beyond its instances, by its tag or name: Auto Scaling
    groups, launch templates, its own IAM role, FIS experiment templates."""
    from . import fis

    found = {"auto scaling groups": [g["AutoScalingGroupName"] for g in job_groups.groups_by_tag(
                 aws, region, TAG_JOB, job_id)],
             "launch templates": [t["LaunchTemplateName"] for t in job_groups.templates_by_tag(
                 aws, region, TAG_JOB, job_id)],
             "experiment templates": fis.templates(aws, region, job_id)}
    found["job roles"] = [job_role.role_name(job_id)] if job_role.exists(
        aws, region, job_role.role_name(job_id)) else []
    return found
