"""Datasets on EBS snapshots: a gp3 volume made from the snapshot in the instance's AZ,
attached, mounted read-only, and gone with the instance.

    snapshot_size(spec, snapshot_id)           GiB, or a one-line error (missing, pending)
    attach_snapshots(store, job, spec, ...)    create + attach + DeleteOnTermination, recorded
    mount_snapshots(store, job, host)          mount each one read-only -> {name: mountpoint}
    delete_job_volumes(region, job_id)         volumes of the job left unattached (a failure
                                               between create and attach), deleted

Every volume is tagged like the instance (cloudtrain:job, cloudtrain:owner, Name) at creation,
encrypted (the account's default key; an unencrypted snapshot gives an encrypted volume), and
set to DeleteOnTermination once attached: terminating the instance, by `down`, by the agent's
power-off or by EC2 taking a spot instance back, deletes it. Until then `release` deletes it by
tag. Its price (gp3 GB-month plus provisioned throughput and IOPS) is recorded with the
instance, so the bill includes it.

A volume made from a snapshot is slow on first read: its blocks come from S3 as they are
touched. `first_read` says who pays that: "preread" (the stager reads every file once before
the job starts, at the volume's provisioned throughput, and the staging phase shows it),
"fsr" (fast snapshot restore, which the user enabled on the snapshot in that AZ: checked here,
billed by AWS per hour while enabled), or "none" (the first epoch pays it).
"""

from __future__ import annotations

import json
import shlex
import time

from ...errors import CloudtrainError, NotFound, UsageError
from ...state import Job, Store
from . import host_setup
from .errors import aws_errors, code_of
from .session import AwsSession
from .tags import TAG_JOB, TAG_OWNER, job_tags

DEVICES = ("/dev/sdf", "/dev/sdg", "/dev/sdh", "/dev/sdi", "/dev/sdj", "/dev/sdk")
VOLUME_WAIT_S = 600.0  # a large volume from a snapshot can take minutes to be available
MOUNT_WAIT_S = 120.0  # the attached device appearing on the instance

# Finds the attached volume's block device on the instance, waits for it, and mounts it
# read-only. Nitro instances name it /dev/nvmeNn1 with the volume id (without its dash) as
# the disk's serial; Xen instances (p3) keep the requested name as /dev/xvdX. A snapshot of
# a partitioned disk mounts its first partition.
MOUNT_SCRIPT = r"""
set -e
vol=$1; xen=$2; mp=$3; wait_s=$4
dev=""
end=$(( $(date +%s) + wait_s ))
while [ -z "$dev" ]; do
  dev=$(lsblk -dpno NAME,SERIAL 2>/dev/null | awk -v v="$vol" '$2 == v {print $1; exit}')
  if [ -z "$dev" ] && [ -b "$xen" ]; then dev=$xen; fi
  if [ -z "$dev" ]; then
    [ "$(date +%s)" -lt "$end" ] || { echo "volume $vol did not appear as a disk" >&2; exit 3; }
    sleep 1
  fi
done
part=$(lsblk -pno NAME,TYPE "$dev" 2>/dev/null | awk '$2 == "part" {print $1; exit}')
mkdir -p "$mp"
if ! mountpoint -q "$mp" 2>/dev/null; then
  sudo -n mount -o ro "${part:-$dev}" "$mp"
fi
"""


def snapshot_size(aws: AwsSession, spec, snapshot_id: str) -> int:
    """The snapshot's size in GiB (what the volume made from it needs at least)."""
    from botocore.exceptions import ClientError

    region = aws.region(spec)
    try:
        found = aws.client("ec2", region).describe_snapshots(SnapshotIds=[snapshot_id])
    except ClientError as exc:
        if code_of(exc) in ("InvalidSnapshot.NotFound", "InvalidSnapshotID.Malformed"):
            raise NotFound(f"no EBS snapshot {snapshot_id} in {region} (snapshots belong to "
                           "one region)",
                           hint=f"copy it: aws ec2 copy-snapshot --source-snapshot-id "
                                f"{snapshot_id} --source-region SRC --region {region}"
                           ) from None
        raise
    snaps = found.get("Snapshots") or []
    if not snaps:
        raise NotFound(f"no EBS snapshot {snapshot_id} in {region}")
    snap = snaps[0]
    if snap.get("State") != "completed":
        raise UsageError(f"EBS snapshot {snapshot_id} is {snap.get('State')} "
                         f"({snap.get('Progress') or '?'}): a volume can be made from it "
                         "once it is completed")
    size = snap.get("VolumeSize")
    if not isinstance(size, int) or size <= 0:
        raise CloudtrainError(f"EBS snapshot {snapshot_id}: EC2 gave no size ({size!r})")
    return size


def attach_snapshots(aws: AwsSession, store: Store, job: Job, spec, region: str, instance_id: str,
                     zone: str | None, owner: str) -> list[dict]:
    """A volume from each snapshot dataset, in the instance's AZ, attached to it and set
    to go with it; each recorded with the instance (for the bill and for release)."""
    sources = [d for d in spec.data.datasets if d["kind"] == "snapshot"]
    if not sources:
        return []
    if len(sources) > len(DEVICES):
        raise UsageError(f"at most {len(DEVICES)} snapshot datasets per job")
    with aws_errors(region):
        return _attach(aws, store, job, spec, sources, aws.client("ec2", region),
                       instance_id, zone, owner)


def _attach(aws: AwsSession, store, job, spec, sources, ec2, instance_id, zone, owner) -> list[dict]:
    made: list[dict] = []
    tags = job_tags(job, spec, owner)
    for source, device in zip(sources, DEVICES):
        size = int((spec.data.staging or {}).get(source["name"], {}).get("bytes", 0) // (1 << 30))
        if source.get("first_read") == "fsr":
            _check_fsr(ec2, source["location"], zone)
        vol = ec2.create_volume(
            SnapshotId=source["location"], AvailabilityZone=zone, VolumeType="gp3",
            Throughput=int(source.get("throughput") or 125),
            Iops=int(source.get("iops") or 3000), Encrypted=True,
            TagSpecifications=[{"ResourceType": "volume", "Tags": tags + [
                {"Key": "cloudtrain:dataset", "Value": source["name"]}]}])
        entry = {"name": source["name"], "volume": vol["VolumeId"], "device": device,
                 "gb": int(vol.get("Size") or size), "mbps": source.get("throughput"),
                 "iops": source.get("iops"), "snapshot": source["location"]}
        made.append(entry)
        _record_volumes(store, instance_id, made)
        store.add_event(job.id, "volume", detail=(
            f"{entry['volume']} ({entry['gb']} GiB gp3, {entry['mbps']} MB/s, "
            f"{entry['iops']} IOPS) from {source['location']} in {zone} for {source['name']}"))
        _wait_volume(aws, ec2, entry["volume"], "available")
        ec2.attach_volume(VolumeId=entry["volume"], InstanceId=instance_id, Device=device)
        _wait_volume(aws, ec2, entry["volume"], "in-use")
        # From here the volume goes with the instance; until here, release deletes it
        # by its tag (delete_job_volumes), attached or not.
        ec2.modify_instance_attribute(InstanceId=instance_id, BlockDeviceMappings=[
            {"DeviceName": device, "Ebs": {"DeleteOnTermination": True}}])
    return made


def _check_fsr(ec2, snapshot_id: str, zone: str) -> None:
    found = ec2.describe_fast_snapshot_restores(Filters=[
        {"Name": "snapshot-id", "Values": [snapshot_id]},
        {"Name": "availability-zone", "Values": [zone]}]).get("FastSnapshotRestores") or []
    if not any(f.get("State") == "enabled" for f in found):
        raise UsageError(f"first_read: fsr, but fast snapshot restore is not enabled for "
                         f"{snapshot_id} in {zone}",
                         hint=f"aws ec2 enable-fast-snapshot-restores --source-snapshot-ids "
                              f"{snapshot_id} --availability-zones {zone} (billed per hour "
                              "while enabled), or first_read: preread")


def _wait_volume(aws: AwsSession, ec2, volume_id: str, state: str) -> None:
    deadline = time.monotonic() + VOLUME_WAIT_S
    while True:
        vols = ec2.describe_volumes(VolumeIds=[volume_id]).get("Volumes") or []
        now = vols[0].get("State") if vols else None
        if now == state:
            return
        if now == "error" or time.monotonic() > deadline:
            raise CloudtrainError(f"volume {volume_id} is {now}, not {state}, after "
                                  f"{VOLUME_WAIT_S:.0f} s")
        time.sleep(aws.settings.poll_seconds)


def _record_volumes(store: Store, instance_id: str, volumes: list[dict]) -> None:
    row = store.db.execute("SELECT details FROM instances WHERE id = ?",
                           (instance_id,)).fetchone()
    details = json.loads(row["details"]) if row and row["details"] else {}
    details["data_volumes"] = volumes
    store.update_instance(instance_id, details=json.dumps(details))


def mount_snapshots(aws: AwsSession, store: Store, job: Job, host,
                    instance: str | None = None) -> dict[str, str]:
    """Mount each snapshot volume attached to the job's instance (`instance`: that node's
    of a job on several) read-only below the host's root: {dataset name: mountpoint}."""
    mounts: dict[str, str] = {}
    for inst in store.instances(job.id):
        if instance is not None and inst.id != instance:
            continue
        if inst.state == "terminated":  # an earlier attempt's instance
            continue
        for v in (inst.details or {}).get("data_volumes") or []:
            mountpoint = f"{host_setup.root(aws, host)}/volumes/{v['name']}"
            xen = v["device"].replace("/dev/sd", "/dev/xvd")
            result = host.run("bash -c " + shlex.quote(MOUNT_SCRIPT) + " mount " + shlex.join(
                [v["volume"].replace("-", ""), xen, mountpoint, str(int(MOUNT_WAIT_S))]),
                check=False, timeout=MOUNT_WAIT_S + 60)
            if not result.ok:
                why = (result.stderr.strip().splitlines() or ["no output"])[-1][:300]
                raise CloudtrainError(f"dataset {v['name']}: mounting volume {v['volume']} "
                                      f"on the instance failed: {why}")
            mounts[v["name"]] = mountpoint
    return mounts


def dataset_volumes(aws: AwsSession, region: str, owner: str, client=None) -> list[dict]:
    """This owner's dataset volumes in the region that no instance has attached."""
    with aws_errors(region):
        return (client or aws.client("ec2", region)).describe_volumes(Filters=[
            {"Name": f"tag:{TAG_OWNER}", "Values": [owner]},
            {"Name": "tag-key", "Values": ["cloudtrain:dataset"]},
            {"Name": "status", "Values": ["available"]}]).get("Volumes") or []


def orphan_volumes(store: Store, region: str, volumes: list[dict]) -> list[dict]:
    """Of those `volumes` (dataset_volumes), the ones whose job is not being launched (a
    launcher killed between CreateVolume and AttachVolume): what `down --all` deletes,
    in the shape of `orphans()`' instances."""
    out = []
    for v in volumes:
        tags = {t["Key"]: t["Value"] for t in v.get("Tags", [])}
        try:
            active = store.job(tags.get(TAG_JOB, "")).active
        except CloudtrainError:
            active = False
        if not active:
            out.append({"id": v["VolumeId"], "region": region, "job": tags.get(TAG_JOB),
                        "type": f"volume {v.get('Size')} GiB", "state": v.get("State"),
                        "launched_at": v["CreateTime"].timestamp()
                        if hasattr(v.get("CreateTime"), "timestamp") else None})
    return out


def delete_job_volumes(aws: AwsSession, region: str, job_id: str) -> int:
    """Delete the job's volumes that are not attached (made, then the launch failed
    before or while attaching): attached ones go with their instance."""
    with aws_errors(region):
        return _delete_job_volumes(aws, aws.client("ec2", region), job_id)


def _delete_job_volumes(aws: AwsSession, ec2, job_id: str) -> int:
    """Every volume tagged with the job that would outlive its instance: unattached ones
    at once; one still attached without DeleteOnTermination (the launch stopped between
    AttachVolume and ModifyInstanceAttribute) once the terminating instance lets it go.
    Volumes set to go with their instance are left to EC2."""
    vols = ec2.describe_volumes(Filters=[
        {"Name": f"tag:{TAG_JOB}", "Values": [job_id]},
        {"Name": "status", "Values": ["available", "creating", "in-use"]}])
    deleted = 0
    for v in vols.get("Volumes") or []:
        attached = [a for a in v.get("Attachments") or []
                    if a.get("State") in ("attaching", "attached", "detaching")]
        if attached and all(a.get("DeleteOnTermination") for a in attached):
            continue
        if v.get("State") != "available":
            _wait_volume(aws, ec2, v["VolumeId"], "available")
        ec2.delete_volume(VolumeId=v["VolumeId"])
        deleted += 1
    return deleted
