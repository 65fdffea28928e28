"""A job's one instance: run it (or take the one its Auto Scaling group started), wait for it,
its host key checked, and a kept job's instance taken over (`launch --on`); before any
instance, the job's own IAM role where it takes one (job_role.py)."""

from __future__ import annotations

import json

from ...errors import UsageError
from ...progress import SILENT, Reporter
from ...ssh import Endpoint
from ...ssh_host import SSHHost
from ...state import Job, Store
from . import boot as booting, bootstrap, group_launch, images, instances, job_role, volumes
from .cache import RegionCache
from .errors import StaleCache
from .session import AwsSession


def own_role(aws: AwsSession, store: Store, job: Job, spec, report: Reporter = SILENT) -> None:
    """The job's own IAM role and instance profile (`instance_profile: per-job`), made
    before its instances (one node or many, a group's or not), scoped to its job store
    prefix, datasets and group. IAM needs seconds before EC2 accepts a new profile: the
    launch's other steps (security group, key pair, image) run meanwhile, and the launch
    retries what still finds it unknown (job_role.launch_retry)."""
    if not job_role.job_role(aws, job):
        return
    if not aws.settings.job_store:
        raise UsageError("instance_profile: per-job needs the S3 job store, and config.yaml "
                         "has job_store: false",
                         hint="set job_store: true, or name a shared instance profile")
    report.phase("making the job's own IAM role")
    place = group_launch.store_place(aws, store, job, spec)
    datasets = [tuple((d["location"][len("s3://"):] + "/").split("/", 1))
                for d in spec.data.datasets or [] if d.get("kind") == "s3"]
    name = job_role.prepare(aws, store, job, spec, place, datasets,
                            group_launch.group_name(job.id))
    report.info(f"IAM role {name}: the job's instances read and write s3://{place[1]}/"
                f"{place[2]} only, with credentials AWS renews (none of yours on them)")


def acquire(aws: AwsSession, store: Store, job: Job, spec, report: Reporter = SILENT) -> SSHHost:
    place = spec.placement
    region = aws.region(spec)
    boot = bootstrap.for_placement(aws, region, place, spec=spec)
    report.info(f"SSH port open to {boot['ssh_from']} only")
    # A relaunch whose supervisor was killed after RunInstances goes on with that instance.
    found = instances.attempt_instance(aws, store, job, region, job.facts.attempt) \
        if job.facts.attempt > 1 else None
    instance = found
    grouped = group_launch.group_recovery(aws, spec) is None and job.facts.attempt == 1
    if instance is None and grouped:  # issue 27: AWS Auto Scaling relaunches this one
        ids = group_launch.acquire_from_group_or_say(aws, store, job, spec, report)
        instance, grouped = ids[0] if ids else None, ids is not None  # one per node
    if instance is None:
        try:
            instance = instances.run_instance(aws, store, job, spec, region, boot, report)
        except StaleCache:
            RegionCache(aws.settings.aws_profile, region).clear()
            boot = bootstrap.for_placement(aws, region, place, cached=False, spec=spec)
            instance = instances.run_instance(aws, store, job, spec, region, boot, report)
    key_path = boot["key_path"]
    public: list = []
    address = booting.wait_running(aws, region, instance, report, public)
    zone = next((i.zone for i in store.instances(job.id) if i.id == instance), None)
    if found is None:
        volumes.attach_snapshots(aws, store, job, spec, region, instance, zone, boot["owner"])
    endpoint = Endpoint(address, aws.settings.ssh_port,
                        images.login_user(aws, region, place.ami)[0], str(key_path))
    host = booting.wait_ssh(aws, region, instance, endpoint, place.instance_type, 1, report)
    host.ready_file = images.ready_file(place.instance_type, place.ami)
    report.phase(f"checking {instance}'s host key against its console output")
    verified = booting.check_host_key(aws, store, job, region, instance, host, place.instance_type,
                                       report)
    home = host.home()  # the first command, only now that the key is settled
    store.update_instance(instance, state="running", details=json.dumps(
        {**instances.instance_details(store, instance), "address": address, "host_key": endpoint.host_key,
         "host_key_verified": verified, "public_ipv4": public[0] if public else 0}))
    if grouped:
        group_launch.check_group_jobdir(aws, job, host, instance, home)
        group_launch.record_attempt(aws, store, job, spec, 1, instance)
    return host


def adopt(aws: AwsSession, store: Store, kept: Job, job: Job) -> SSHHost:
    """`launch --on`: the new job takes over the kept job's instance (and from now on
    its billing) without provisioning anything; the host is reached the same way."""
    info = (kept.host or {}).get("collected_from") or kept.host or {}
    host = host_for(Job(**{**kept.__dict__, "host": info}))
    host.run("true")  # still there, and still the machine whose host key we pinned
    for inst in store.instances(kept.id):
        if inst.state != "terminated":
            store.hand_over(inst, job.id)
    return host


def host_for(job: Job) -> SSHHost:
    info = job.host or {}
    if not info.get("host"):  # the launch never got as far as an instance's address
        raise UsageError(f"job {job.id} has no instance" + (f" ({job.reason})"
                                                             if job.reason else ""),
                         hint=f"cloudtrain status {job.id}")
    endpoint = Endpoint(info["host"], info.get("port", 22), info.get("user", "ubuntu"),
                        info.get("key_path"), info.get("host_key"))
    return SSHHost(endpoint, info.get("tmux_socket", "cloudtrain"), info.get("python", "python3"))
