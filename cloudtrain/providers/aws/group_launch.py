"""A recovering spot job launched through its Auto Scaling group: AWS relaunches it, not us.

    group_recovery(spec)                      None where the job runs in a group, else why not
    acquire_from_group(store, job, spec, boot, report)   boot files, group, its first instance
    pin_bundle(store, job, spec, pin)         the template's new version: the bundle's sha256
    group_settings(store, job, spec)          job.json's "auto_scaling" (what the agent ends)
    record_attempt(store, job, spec, n, instance)        attempts/<n>.json in the job store

The launch of such a job (issue 27) differs from RunInstances' in where its instance comes from
and in what every instance carries: before the group is made, `<prefix>boot.tar` (the host
modules) goes to the job store; the launch template's user-data holds the boot loader
(host/boot_loader.py with the two modules it imports) and the tar's sha256; at boot the loader
fetches the tar with the instance role, checks it, and runs bootstrap.py, which waits for the
job's bundle. On the group's first instance the launching machine syncs and starts the job over
SSH as for any job (bootstrap.py finds the job's files there and leaves it alone); the bundle
goes to the store before the agent starts; a replacement, on a fresh disk, starts the job from
it, resumed from the last checkpoint in the store. Nothing of this machine is needed after the
launch: the group replaces a lost instance by itself, the agent ends the group with the job.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import tarfile
import time

from ...job_spec import JobSpec
from ...market import Market
from ...host import job_records
from ...hosts import HOST_PACKAGE, host_files
from ...progress import SILENT, Reporter
from ...ssh import Endpoint
from ...state import Instance, Job, Store
from . import boot as booting, bootstrap, groups, host_setup, images, instances, jobstore, \
    jobstore_attempts, results
from .placement import EFA_INTERFACES
from .errors import AWSError, aws_errors
from .groups import group_name
from .session import AwsSession

# The host modules of the boot loader (what it imports, and itself), written into the user-data
# as the host package has them (hosts.host_files).
LOADER_MODULES = ("stage_errors", "awsapi", "boot_loader")
# below the job's prefix, with the bundle (the instance role reads bundle/*): bootstrap.py and
# every host module
BOOT_TAR = "bundle/boot.tar"
BOOT_DIR = "/var/lib/cloudtrain/boot"  # on the instance, where the loader puts them
WATCHDOG_MARK = "CLOUDTRAIN_WATCHDOG_END"  # the here-document of the watchdog's arguments
# How long bootstrap.py on the group's first instance waits for the bundle: the launch's sync
# and setup (a replacement finds it there at once).
BUNDLE_WAIT_S = 3600
GROUP_START_WAIT_S = 600.0  # for the group to launch its first instance
USER_DATA_MAX = 16384  # EC2's limit on user-data, in raw (here gzipped) form


def boot_tar() -> tuple[bytes, str]:
    """The host package and its launchers as one tar (hosts.host_files: names only, fixed
    times and modes, the same bytes for the same files) and its sha256."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in host_files():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    data = out.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def boot_script(loader_args: list[str], bootstrap_args: list[str], run_as: str) -> str:
    """The bash the user-data runs (detached) on every instance of the group: the loader's
    files written from here-documents, then the loader run as `run_as` where that user exists
    (the SSH user: the job's files are then that user's, as on a launch over SSH)."""
    lines = ["set -u", f"DIR={shlex.quote(BOOT_DIR)}", f'mkdir -p "$DIR/{HOST_PACKAGE}"']
    for name, data in host_files(LOADER_MODULES):
        text = data.decode()
        end = "CLOUDTRAIN_FILE_" + hashlib.sha256(text.encode()).hexdigest()[:16]
        if end in text:  # never: the marker is the text's own hash
            raise RuntimeError(f"{name} holds its own here-document marker")
        lines += [f"cat >\"$DIR/{name}\" <<'{end}'", text.rstrip("\n"), end]
    argv = " ".join(shlex.quote(a) for a in ["--dir", BOOT_DIR, *loader_args, "--",
                                             *bootstrap_args])
    user = shlex.quote(run_as)
    lines += [
        f"RUN_AS={user}",
        "AS=",
        'if [ "$(id -u)" = 0 ] && [ "$RUN_AS" != root ] && id -u "$RUN_AS" >/dev/null 2>&1 '
        '&& command -v runuser >/dev/null 2>&1; then',
        '    chown -R "$RUN_AS" "$DIR"',
        '    AS="runuser -u $RUN_AS -- env HOME=$(getent passwd "$RUN_AS" | cut -d: -f6)"',
        "fi",
        # The user-data's power-off timer, should it fire (the agent ends the job at its
        # max runtime; this is for an agent that did not), ends the job's group first, or
        # the group would start a replacement into the same end. The re-arm script runs
        # this instead of the bare power-off from now on (watchdog-command).
        f"END_ARGS=$(cat <<'{WATCHDOG_MARK}'",
        " ".join(shlex.quote(a) for a in ["--end-group", *bootstrap_args]),
        WATCHDOG_MARK,
        ")",
        'SHUTDOWN=$(cat /var/lib/cloudtrain/shutdown-command 2>/dev/null)',
        f'printf \'%s\\n\' "$AS python3 {shlex.quote(BOOT_DIR + "/bootstrap.py")} $END_ARGS; '
        '${SHUTDOWN:-shutdown -h now}" >/var/lib/cloudtrain/watchdog-command',
        "MINUTES=$(sed -n 's/^max_runtime_minutes=\\([0-9][0-9]*\\)$/\\1/p' "
        "/var/lib/cloudtrain/user-data-ran 2>/dev/null | tail -n 1)",
        f'[ -n "$MINUTES" ] && {instances.REARM_PATH} "$MINUTES"',
        f'$AS python3 "$DIR/boot_loader.py" {argv}',
        "CODE=$?",
        # 0: the job runs (or the launching machine starts it); 10, 11: bootstrap ended the
        # group and powered off; 14: it set the group to on-demand (a deadline) and powered
        # off. Anything else: this instance cannot run the job, so it
        # does not stay up billing (bootstrap ended the job where it could).
        'case $CODE in',
        '    0|10|11|14) ;;',
        '    *) echo "cloudtrain boot: exit $CODE: this instance cannot run the job; '
        'powering off"',
        '       SHUTDOWN=$(cat /var/lib/cloudtrain/shutdown-command 2>/dev/null)',
        '       eval "${SHUTDOWN:-shutdown -h now}" ;;',
        'esac',
    ]
    return "\n".join(lines)


def instance_home(user: str) -> str:
    """The SSH user's home on the instance (the DLAMI's ubuntu: /home/ubuntu; root: /root):
    the same on every instance of the group, so the bundle's job directory is every one's."""
    return "/root" if user == "root" else f"/home/{user}"


def group_recovery(aws: AwsSession, spec: JobSpec) -> str | None:
    """None where AWS Auto Scaling relaunches this job; else why the supervisor on this
    machine does, or what would let AWS do it (said in the plan)."""
    if not spec.recovery.recover or spec.placement.market != Market.SPOT:
        return "not a recovering spot job"
    if spec.nodes > 1 and EFA_INTERFACES.get(spec.placement.instance_type or ""):
        return (f"AWS Auto Scaling cannot: {spec.placement.instance_type} has EFA, and the group's "
                "launch template does not give its instances EFA interfaces yet")
    if spec.deadline_at is not None and spec.nodes > 1:
        return ("a deadline's move to on-demand on several nodes is made by the supervisor on "
                "this machine, which must stay on for it (an instance of a group sets it to "
                "on-demand for a job on one node only)")
    if spec.placement.reservation:
        return (f"a deadline's move into reservation {spec.placement.reservation} is made by "
                "the supervisor on this machine, which must stay on for it (an Auto Scaling "
                "group's on-demand instances do not go into it)")
    if spec.recovery.fallback == Market.ON_DEMAND or aws.settings.regions:
        return ("AWS Auto Scaling cannot follow --fallback on-demand or more regions "
                "(regions: in config.yaml): it relaunches in the job's region and market "
                "only")
    if not aws.settings.instance_profile:
        return ("set `instance_profile:` in config.yaml to let AWS Auto Scaling do it (the "
                "role a replacement instance reads the job's bundle with: infra/README.md)")
    if not aws.settings.job_store:
        return ("AWS Auto Scaling cannot with job_store: false: a replacement starts the "
                "job from the job store")
    return None


def login_user(aws: AwsSession, job: Job) -> str:
    """The user the job's instances are logged in to as (images.login_user)."""
    return images.login_user(aws, aws.region_of(job), job.spec.placement.ami)[0]


def group_jobdir(aws: AwsSession, job: Job) -> str:
    """The job directory on every instance of its group."""
    root = aws.settings.remote_root
    home = instance_home(login_user(aws, job))
    root = home + root[1:] if root.startswith("~") else root
    return f"{root}/jobs/{job.id}"


def check_group_jobdir(aws: AwsSession, job: Job, host, instance: str, home: str | None = None
                       ) -> None:
    """The job directory over SSH is the one every instance of the group starts it in."""
    if host_setup.jobdir(aws, job.id, host) != group_jobdir(aws, job):
        raise AWSError(f"{instance}'s home is {home or host.home()}, not "
                       f"{group_jobdir(aws, job)}'s: a replacement instance would not "
                       "find the job's files",
                       hint="set ssh_user in config.yaml to the AMI's user")


def store_place(aws: AwsSession, store: Store, job: Job, spec) -> tuple[str, str, str]:
    """(region, bucket, job prefix) of the job's job store, made ready."""
    region = job.facts.store_region or spec.placement.region or aws.region_of(job)
    _, bucket, _ = results.job_store_client(aws, region)
    owner_key = results.job_store_owner(aws, store, job, record=True, region=region)
    ready = ("job-store-ready", region, owner_key)  # one check a launch, not one a call
    if ready not in aws.clients:
        results.ensure_job_store(aws, region, owner_key)
        aws.clients[ready] = True
    return region, bucket, jobstore.job_prefix(job.id, owner_key=owner_key)


def _store_put(aws: AwsSession, store: Store, job: Job, region: str, name: str, data: bytes) -> None:
    """One object under the job's prefix (jobstore.put: encrypted, the bucket's owner
    checked)."""
    s3, bucket, account = results.job_store_client(aws, region)
    with aws_errors(region, "s3"):
        jobstore.put(s3, bucket, job.id, name, data, expected_owner=account or None,
                     owner_key=results.job_store_owner(aws, store, job))


def acquire_from_group(aws: AwsSession, store: Store, job: Job, spec, report: Reporter = SILENT
                       ) -> list[str]:
    """The boot files to the job store, the group (groups.create_job_group) with the
    user-data that starts the job on any instance, and the group's first instances (one
    per node), recorded as the job's (from here on every failure path deletes the
    group)."""
    region = aws.region(spec)
    store_region = store_place(aws, store, job, spec)[0]
    data, _ = boot_tar()
    _store_put(aws, store, job, store_region, BOOT_TAR, data)
    user_data = group_user_data(aws, store, job, spec)
    report.phase(f"creating the job's Auto Scaling group in {region}")
    # the region's set-up as the group's template will take it (bootstrap caches it)
    set_up = bootstrap.for_placement(aws, region, spec.placement)
    raised = instances.root_volume_line(aws, spec, set_up)
    if raised:
        report.note(raised)
    name = groups.create_job_group(aws, store, job, spec, user_data)
    store.record_facts(job.id, auto_scaling_group=name)
    report.phase("waiting for AWS Auto Scaling to launch the instance"
                 + (f"s of {spec.nodes} nodes" if spec.nodes > 1 else ""))
    return _group_instances(aws, store, job, spec, region, name,
                            instances.root_volume_gb(aws, spec, set_up))


def group_user_data(aws: AwsSession, store: Store, job: Job, spec, pin: str | None = None
                    ) -> bytes:
    """The user-data (gzipped) of every instance of the job's group: the boot loader with
    boot.tar's place and sha256, bootstrap's arguments (the job's store, directory and
    group; `pin`: the sha256 of the bundle's manifest, once it is uploaded)."""
    import gzip

    store_region, bucket, prefix = store_place(aws, store, job, spec)
    _, digest = boot_tar()
    endpoint = results.store_endpoint()
    where = ["--region", store_region] + (["--endpoint", endpoint] if endpoint else [])
    loader = ["--bucket", bucket, "--key", prefix + BOOT_TAR, "--sha256", digest, *where,
              "--imds", aws.settings.imds_url]
    boot = ["--bucket", bucket, "--prefix", prefix, "--jobdir", group_jobdir(aws, job),
            *where, "--imds", aws.settings.imds_url, "--wait-s", str(BUNDLE_WAIT_S),
            "--group", group_name(job.id)]  # max_restarts: job.json's, in the bundle
    if pin:
        boot += ["--manifest-sha256", pin]
    script = boot_script(loader, boot, login_user(aws, job))
    user_data = gzip.compress(instances.user_data(aws, job, spec, script).encode(), 9, mtime=0)
    if len(user_data) > USER_DATA_MAX:
        raise AWSError(f"the job's user-data is {len(user_data)} bytes gzipped, more than "
                       f"EC2's {USER_DATA_MAX}")
    return user_data


def pin_bundle(aws: AwsSession, store: Store, job: Job, spec, pin: str) -> str | None:
    """For a job of an Auto Scaling group, once its bundle is uploaded: a new version of the
    group's launch template whose user-data names the sha256 of the bundle's manifest
    (`pin`), which the group launches from then on ($Latest). A writer of the job's prefix
    (any holder of its instances' credentials or its upload grant) may then rewrite the
    bundle, but a replacement refuses it rather than run it; only the user's principal may
    change the template. What it did, in words; None for a job without a group. AWS refusing
    it is a WARNING, not a failed launch: the job recovers as before, unpinned."""
    name = store.job(job.id).facts.auto_scaling_group
    if not name:
        return None
    try:
        version = groups.new_template_version(aws, aws.region(spec), job, spec,
                                              group_user_data(aws, store, job, spec, pin))
    except AWSError as exc:
        return (f"WARNING: the bundle is not pinned in the group's launch template "
                f"({' '.join(exc.message.split())}): a replacement runs whatever the job's "
                "bundle holds when it starts")
    return (f"the group's replacements start only this bundle (its manifest's sha256 "
            f"{pin[:12]}..., launch template version {version})")


def acquire_from_group_or_say(aws: AwsSession, store: Store, job: Job, spec,
                              report: Reporter = SILENT) -> list[str] | None:
    """acquire_from_group; None where AWS refuses it for want of permissions (the
    Auto Scaling policy, infra/iam-policy-autoscaling.json, is not attached): the job is
    then launched as any other and the supervisor here relaunches it, said as a WARNING
    (nothing of the group is left: create_job_group deletes what it made)."""
    try:
        return acquire_from_group(aws, store, job, spec, report)
    except AWSError as exc:
        if not exc.denied:
            raise
        note = (f"WARNING: AWS refused the job's Auto Scaling group ({exc.message}): the "
                "supervisor on this machine relaunches it instead, only while this machine "
                "is on (infra/iam-policy-autoscaling.json lets AWS do it)")
        store.add_event(job.id, "recovery", detail=note)
        report.note(note)
        return None


def _group_instances(aws: AwsSession, store: Store, job: Job, spec, region: str, name: str,
                     disk: int) -> list[str]:
    """The group's first instances, one per node (in instance-id order: node 0 first),
    recorded (the job's instances from now on) with the root volume's size, `disk` GB."""
    place = spec.placement
    deadline = time.monotonic() + GROUP_START_WAIT_S
    while True:
        _, ids = groups.group_members(aws, region, name)
        if len(ids) >= spec.nodes:
            break
        if time.monotonic() >= deadline:
            raise AWSError(f"the Auto Scaling group {name} launched {len(ids)} of "
                           f"{spec.nodes} instances in {GROUP_START_WAIT_S:.0f} s",
                           hint=f"cloudtrain down {job.id}")
        time.sleep(aws.settings.poll_seconds)
    ids = sorted(ids)[:spec.nodes]
    raw = aws.call(region, "describe_instances", InstanceIds=ids)
    found = {i["InstanceId"]: i for r in raw["Reservations"] for i in r["Instances"]}
    for node, instance_id in enumerate(ids):
        inst = found.get(instance_id) or {}
        zone = inst.get("Placement", {}).get("AvailabilityZone")
        launched = inst.get("LaunchTime")
        store.add_instance(Instance(
            id=instance_id, job_id=job.id, provider=aws.name, region=region, zone=zone,
            # the type EC2 launched: one of the group's overrides (groups.group_types)
            instance_type=inst.get("InstanceType") or place.instance_type,
            market=place.market, state="requested",
            launched_at=launched.timestamp() if launched else time.time(),
            terminated_at=None, price_per_hour=None,
            details={"subnet": inst.get("SubnetId"), "ami": inst.get("ImageId"),
                     "key_name": inst.get("KeyName"), "auto_scaling_group": name,
                     "disk_gb": disk, "disk_mbps": spec.data.disk_mbps,
                     **({"node": node} if spec.nodes > 1 else {})}))
        store.add_event(job.id, "instance", detail=f"{instance_id} in {zone} "
                        f"(Auto Scaling group {name}" +
                        (f", node {node})" if spec.nodes > 1 else ")"))
    return ids


def group_settings(aws: AwsSession, store: Store, job: Job, spec) -> dict:
    """job.json's "auto_scaling" for a job of a group (the agent ends its group with the
    job; bootstrap.py counts the restarts): {} for any other job."""
    if group_recovery(aws, spec) is not None \
            or not store.job(job.id).facts.auto_scaling_group:
        return {}  # not run by a group (or AWS refused to make one)
    store_region, bucket, prefix = store_place(aws, store, job, spec)
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    return {"auto_scaling": {"group": group_name(job.id), "region": aws.region(spec),
                             "endpoint": endpoint, "max_restarts": spec.recovery.max_restarts,
                             "prefix": prefix, "bucket": bucket,
                             "store_region": store_region, "nodes": spec.nodes,
                             "timing": regroup_timing(aws.settings),
                             "on_demand_at": on_demand_at(spec)}}


def on_demand_at(spec) -> float | None:
    """job.json's auto_scaling.on_demand_at: the moment the plan said spot stops fitting the
    deadline (lifecycle/plan.py's expected "deadline"), after which the instance that stops
    sets the group to on-demand (host/auto_scaling.py); None without a deadline on spot."""
    decided = (spec.expected or {}).get("deadline") or {}
    at = decided.get("switch_at")
    return float(at) if spec.deadline_at is not None and decided.get("market") == "spot" \
        and isinstance(at, (int, float)) else None


def regroup_timing(settings) -> dict:
    """job.json's auto_scaling.timing: host/regroup.py's waits, from config.yaml."""
    return {"watch_s": settings.regroup_watch_seconds,
            "peers_s": settings.regroup_peers_seconds,
            "lost_wait_s": settings.regroup_lost_wait_seconds,
            "stop_grace_s": settings.regroup_stop_grace_seconds}


def record_attempt(aws: AwsSession, store: Store, job: Job, spec, n: int, instance_id: str) -> None:
    """attempts/<n>.json in the job store: the attempt that this machine started (a
    replacement's is written by its bootstrap.py), so that counting starts at 1."""
    store_region, _, _ = store_place(aws, store, job, spec)
    inst = next((i for i in store.instances(job.id) if i.id == instance_id), None)
    doc = job_records.attempt_doc(n, {"instance": instance_id, "zone": inst and inst.zone,
                                      "type": inst.instance_type if inst else
                                      spec.placement.instance_type, "lifecycle": "spot"},
                                  by="launch")
    _store_put(aws, store, job, store_region, job_records.attempt_key("", n),
               json.dumps(doc).encode())


def group_record(aws: AwsSession, store: Store, job: Job) -> dict:
    """What the job's instances wrote to the job store while nobody here watched: each
    attempt (attempts/<n>.json: instance, AZ, type, start, where it resumed), how far
    each got and the job's end (final.json), each checked as untrusted input
    (jobstore_attempts.records): {"attempts": [doc, ...] by n, "reached": {n: step},
    "final": doc or None, "group": its size (group_size)}."""
    region = job.facts.store_region or job.spec.placement.region or aws.region_of(job)
    s3, bucket, account = results.job_store_client(aws, region)
    prefix = jobstore.job_prefix(job.id, owner_key=results.job_store_owner(aws, store, job))
    with aws_errors(region, "s3"):
        out = jobstore_attempts.records(s3, bucket, prefix, account or None)
    out["group"] = group_size(aws, job)
    return out


def follow_replacement(aws: AwsSession, store: Store, job: Job, instance_id: str) -> dict:
    """The job's host record for the instance AWS Auto Scaling put in place of its own:
    its address, and its host key checked against its console output as at launch
    (boot.py; refused on a mismatch). The job's other settings (user, key, python, tmux
    socket) are the first instance's: the same launch template."""
    region = aws.region_of(job)
    info = dict(job.host or {})
    public: list = []
    address = booting.wait_running(aws, region, instance_id, public=public)
    endpoint = Endpoint(address, info.get("port", aws.settings.ssh_port),
                        info.get("user") or login_user(aws, job), info.get("key_path"))
    host = booting.wait_ssh(aws, region, instance_id, endpoint,
                            job.spec.placement.instance_type, job.spec.nodes)
    try:
        verified = booting.check_host_key(aws, store, job, region, instance_id, host,
                                           job.spec.placement.instance_type)
    finally:
        host.close()
    store.update_instance(instance_id, details=json.dumps(
        {**instances.instance_details(store, instance_id), "address": address,
         "host_key": endpoint.host_key, "host_key_verified": verified,
         "public_ipv4": public[0] if public else 0}))
    return {**info, "host": address, "host_key": endpoint.host_key}


def follow_nodes(aws: AwsSession, store: Store, job: Job) -> dict | None:
    """A job on several nodes of its group, after AWS replaced one: its host record for
    the nodes of the newest attempt once they have met (attempts/<n>/<instance>.json,
    each record checked and ranked as the nodes rank them, host/regroup.py), a node now
    on another instance reached at that instance's address with its host key checked
    against its console (follow_replacement). None until all of them have met."""
    from ...host import regroup

    recs = [dict(r) for r in (job.host or {}).get("nodes") or []]
    record = group_record(aws, store, job)
    if not recs or not record["attempts"]:
        return None
    n = record["attempts"][-1]["attempt"]
    region = job.facts.store_region or job.spec.placement.region or aws.region_of(job)
    s3, bucket, account = results.job_store_client(aws, region)
    prefix = jobstore.job_prefix(job.id, owner_key=results.job_store_owner(aws, store, job))
    with aws_errors(region, "s3"):
        found = jobstore_attempts.members(s3, bucket, prefix, n, len(recs), account or None)
    ranks = regroup.ranked(found, len(recs))
    if ranks is None:
        return None
    for m in ranks:
        rec = recs[m["rank"]]
        if rec.get("instance") == m["instance"]:
            continue
        moved = follow_replacement(aws, store, job, m["instance"])
        store.update_instance(m["instance"], details=json.dumps(
            {**instances.instance_details(store, m["instance"]), "node": m["rank"]}))
        rec.update(host=moved["host"], host_key=moved["host_key"], instance=m["instance"],
                   address=m["address"], iface=m["iface"])
    return {**(job.host or {}), "host": recs[0]["host"], "host_key": recs[0].get("host_key"),
            "nodes": recs}


def group_size(aws: AwsSession, job: Job) -> dict | None:
    """{"desired": n} of the job's group, {"gone": True} where there is none, None where
    Auto Scaling cannot be asked (the CLI policy alone)."""
    name = job.facts.auto_scaling_group
    if not name:
        return None
    try:
        found, _ = groups.group_members(aws, aws.region_of(job), name)
    except AWSError:
        return None
    return {"desired": int(found[0].get("DesiredCapacity") or 0)} if found else {"gone": True}
