"""Issue 12: a dataset on an EBS snapshot, through the AWS path (moto EC2, a real sshd at the
instance's private IP): a gp3 volume made from the snapshot in the instance's AZ, tagged,
attached, set to go with the instance, mounted read-only on the host and read once before the
job (first_read: preread), deleted at teardown, and in the bill.

The lab has no block devices: the "instance" finds its disk through an `lsblk` that asks moto
which volumes are attached, and its `sudo mount -o ro DEV DIR` links DIR to the tree that
stands for the snapshot's contents. Everything else (EC2 calls, the mount script, the
stager's preread, the timeline) is the real code."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from moto.ec2.models.elastic_block_store import EBSBackend

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from labs.credentials import CLIENT_CREDS, REGION
from conftest import tiny_prepared_imagenet

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")

TINY = ("--set", "variant=tiny", "--set", "arch=resnet18", "--set", "workers=0",
        "--set", "data=imagenet", "--set", "epochs=1")

LSBLK = """#!{python}
# The lab instance's lsblk: its "disks" are the volumes moto has attached to any instance.
import sys, boto3
ec2 = boto3.client("ec2", endpoint_url={endpoint!r}, region_name={region!r},
                   **{creds!r})
args = sys.argv[1:]
if "NAME,SERIAL" in args:
    for v in ec2.describe_volumes()["Volumes"]:
        if v["State"] == "in-use":
            print("/dev/lab-%s %s" % (v["VolumeId"], v["VolumeId"].replace("-", "")))
else:
    print(args[-1] + " disk")
"""

SUDO = """#!/bin/bash
# The lab instance's sudo: `mount -o ro DEV DIR` links DIR to the snapshot's stand-in tree
# (recorded); anything else goes to the lab's own shim.
[ "$1" = -n ] && shift
if [ "$1" = mount ]; then
    echo "$*" >> {log}
    rmdir "$5" && ln -s {tree} "$5"
    exit 0
fi
exec {lab_sudo} -n "$@"
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return tiny_prepared_imagenet(tmp_path_factory.mktemp("data"), seed=7)


@pytest.fixture
def snap(aws, tree, moto_endpoint, monkeypatch):
    """A completed snapshot in moto, and the lab instance's lsblk and mount."""
    shims = aws.work / "instance-bin"
    (shims / "sudo").rename(shims / "sudo.lab")
    mounts = aws.work / "mounts.log"
    (shims / "sudo").write_text(SUDO.format(log=mounts, tree=tree, lab_sudo=shims / "sudo.lab"))
    (shims / "lsblk").write_text(LSBLK.format(python=sys.executable, endpoint=moto_endpoint,
                                              region=REGION, creds=CLIENT_CREDS))
    for name in ("sudo", "lsblk"):
        (shims / name).chmod(0o755)
    vol = aws.ec2.create_volume(Size=30, AvailabilityZone="us-east-1a", VolumeType="gp3")
    snapshot = aws.ec2.create_snapshot(VolumeId=vol["VolumeId"])["SnapshotId"]
    aws.ec2.delete_volume(VolumeId=vol["VolumeId"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return snapshot, mounts


def _job_volumes(aws, job_id):
    return aws.ec2.describe_volumes(Filters=[{"Name": "tag:cloudtrain:job",
                                              "Values": [job_id]}])["Volumes"]


def test_snapshot_volume_is_made_attached_mounted_read_and_gone_with_the_instance(
        cli, aws, snap, ct_home, tree, monkeypatch):
    snapshot, mounts = snap
    made = []
    original = EBSBackend.create_volume

    def recording(self, *args, **kwargs):  # what EC2 was asked for, and the volume's tags
        volume = original(self, *args, **kwargs)
        made.append((args, kwargs, volume))
        return volume

    monkeypatch.setattr(EBSBackend, "create_volume", recording)
    aws.write_config(datasets={"imagenet": {"source": snapshot, "throughput": 500,
                                            "first_read": "preread"}})
    dry = cli.ok("launch", "--recipe", "imagenet", *TINY, "--instance", "g5.xlarge",
                 "--dry-run").stdout
    assert f"imagenet from {snapshot} (32.2 GB volume)" in dry  # 30 GiB
    # the job reads the mounted copy (training on a staged copy is test_data_staging.py's)
    proc = cli("launch", "--data", "imagenet", "--instance", "g5.xlarge", "--follow", "--quiet",
               "--", "bash", "-c", "find \"$CLOUDTRAIN_DATA_DIR/imagenet/\" -name '*.JPEG' | wc -l",
               timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.splitlines()[0]
    job = cli.job(job_id)
    assert job["state"] == "succeeded"
    assert str(sum(1 for _ in tree.rglob("*.JPEG"))) in proc.stdout.splitlines()
    (raw,) = aws.instances(**{"tag:cloudtrain:job": job_id})
    # the volume: from the snapshot, in the instance's AZ, gp3 at the asked throughput,
    # encrypted, tagged like the instance; mounted read-only; deleted with the instance
    events = {p["name"]: p for p in job["timeline"]}
    assert events["volume"]["detail"].startswith("vol-") and snapshot in \
        events["volume"]["detail"] and "500 MB/s, 3000 IOPS" in events["volume"]["detail"] \
        and raw["Placement"]["AvailabilityZone"] in events["volume"]["detail"]
    assert mounts.read_text().split()[:3] == ["mount", "-o", "ro"]
    ((args, kwargs, volume),) = [m for m in made if m[1].get("snapshot_id")]  # not the root
    assert kwargs["zone_name"] == raw["Placement"]["AvailabilityZone"]
    assert kwargs["snapshot_id"] == snapshot and kwargs["volume_type"] == "gp3"
    assert kwargs["throughput"] == 500 and kwargs["iops"] == 3000 and kwargs["encrypted"]
    tags = {t["key"]: t["value"] for t in volume.get_tags()}
    assert tags["cloudtrain:job"] == job_id and tags["cloudtrain:dataset"] == "imagenet"
    assert tags["cloudtrain:owner"].startswith("arn:aws:")
    # the stager read every file once (preread) before the job
    files = [p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()]
    assert f"data staged: imagenet {sum(p.stat().st_size for p in files) / 1e6:.1f} MB, " \
        f"{len(files):,} files" in events["running"]["detail"]
    assert [v["State"] for v in _job_volumes(aws, job_id)] in ([], ["deleted"])
    # the bill has the volume: its GBs and throughput beyond gp3's own, with the instance
    import sqlite3

    from cloudtrain import cost, ledger
    from cloudtrain.state import Store

    row = sqlite3.connect(ct_home / "state.db").execute(
        "SELECT details FROM instances WHERE job_id = ?", (job_id,)).fetchone()
    (vol,) = json.loads(row[0])["data_volumes"]
    assert (vol["gb"], vol["mbps"], vol["iops"], vol["snapshot"]) == (30, 500, 3000, snapshot)
    with Store(ct_home / "state.db") as store:
        (inst,) = store.instances(job_id)
        run = ledger.run_of(inst)
    gp3 = cost.gp3_price("us-east-1").per_gb_month
    root = json.loads(row[0])["disk_gb"]
    assert run.disk_gb == root + 30
    assert run.gp3_per_gb_month * run.disk_gb == pytest.approx(
        gp3 * (root + 30) + cost.gp3_performance_per_month(500, 3000))


def test_attach_failure_terminates_the_instance_and_deletes_the_volume(
        cli, aws, snap, monkeypatch):
    snapshot, _ = snap
    aws.write_config(datasets={"imagenet": snapshot})
    from moto.ec2.exceptions import EC2ClientError

    def refuse(self, *a, **kw):
        raise EC2ClientError("VolumeInUse", "the lab refuses to attach")

    monkeypatch.setattr(EBSBackend, "attach_volume", refuse)
    proc = cli("launch", "--data", "imagenet", "--instance", "g5.xlarge", "--quiet", "--",
               "true", timeout=120)
    assert proc.returncode != 0 and "the lab refuses to attach" in proc.stderr
    (job,) = json.loads(cli.ok("status", "--json").stdout)
    assert job["state"] == "failed"
    (raw,) = aws.instances(**{"tag:cloudtrain:job": job["id"]})
    assert raw["State"]["Name"] in ("shutting-down", "terminated")
    assert [v["State"] for v in _job_volumes(aws, job["id"])] in ([], ["deleted"])


def test_missing_snapshot_or_the_wrong_backend_stops_before_anything_exists(cli, aws, snap):
    missing = cli("launch", "--recipe", "imagenet", *TINY, "--instance", "g5.xlarge",
                  "--data", "imagenet=snap-0123456789abcdef0")
    assert missing.returncode != 0
    assert f"no EBS snapshot snap-0123456789abcdef0 in {REGION}" in missing.stderr
    local = cli("launch", "--recipe", "imagenet", *TINY, "--backend", "local", "--data",
                f"imagenet={snap[0]}")
    assert local.returncode != 0 and "becomes a volume on an AWS instance" in local.stderr
    bad = cli("launch", "--recipe", "imagenet", *TINY, "--instance", "g5.xlarge", "--data",
              "imagenet=snap-zz")
    assert bad.returncode != 0 and "is not s3://BUCKET/PREFIX, an EBS snapshot id" in bad.stderr
    assert aws.instances() == []
    assert "no jobs yet" in cli.ok("status").stdout


def test_down_all_deletes_a_dataset_volume_no_job_holds(cli, aws, snap, ct_home):
    """A launcher killed between CreateVolume and AttachVolume leaves a volume billing that
    no instance takes down with it: it is an orphan (found by its tags), and `down --all`
    deletes it; an unrelated volume stays, and one of a job being launched is no orphan."""
    from cloudtrain.providers.aws import AWSProvider

    owner = AWSProvider().account.owner(REGION)
    tags = [{"Key": "cloudtrain:owner", "Value": owner}, {"Key": "cloudtrain:job",
                                                           "Value": "deadbeef"},
            {"Key": "cloudtrain:dataset", "Value": "imagenet"}]
    left = aws.ec2.create_volume(Size=30, AvailabilityZone="us-east-1a", VolumeType="gp3",
                                 SnapshotId=snap[0], TagSpecifications=[
                                     {"ResourceType": "volume", "Tags": tags}])["VolumeId"]
    other = aws.ec2.create_volume(Size=5, AvailabilityZone="us-east-1a")["VolumeId"]
    from cloudtrain.state import PROVISIONING, Store

    with Store(ct_home / "state.db") as store:  # a job being launched, its volume just made
        launching = store.create_job(name=None, kind="recipe", recipe="imagenet",
                                     command="imagenet", backend="aws", spec={})
        store.set_state(launching.id, PROVISIONING)
        store.update_job(launching.id, lease_until=time.time() + 3600,
                         launcher="elsewhere:1")
    held = aws.ec2.create_volume(
        Size=30, AvailabilityZone="us-east-1a", VolumeType="gp3", SnapshotId=snap[0],
        TagSpecifications=[{"ResourceType": "volume", "Tags": [
            dict(t, Value=launching.id) if t["Key"] == "cloudtrain:job" else t
            for t in tags]}])["VolumeId"]
    with Store(ct_home / "state.db") as store:
        found = {o["id"] for o in AWSProvider().orphans(store).found}
    assert left in found and held not in found and other not in found
    proc = cli("down", "--all", "-y")  # (which also cancels the launching job, and its volume goes)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "volume of job deadbeef not in this store: deleted" in proc.stdout + proc.stderr
    states = {v["VolumeId"]: v["State"] for v in aws.ec2.describe_volumes()["Volumes"]}
    assert left not in states or states[left] == "deleted"
    assert states[other] == "available"


def test_a_launch_that_stops_after_attach_deletes_the_still_attached_volume(
        cli, aws, snap, monkeypatch):
    """The launch fails between AttachVolume and DeleteOnTermination (here EC2 refuses
    ModifyInstanceAttribute): the volume is attached but would outlive the instance, so
    release deletes it by its tag once the terminating instance lets it go."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses.instances import InstanceResponse

    def refuse(self):
        raise EC2ClientError("UnauthorizedOperation", "the lab refuses ModifyInstanceAttribute")

    monkeypatch.setattr(InstanceResponse, "_block_device_mapping_handler", refuse)
    aws.write_config(datasets={"imagenet": snap[0]})
    proc = cli("launch", "--data", "imagenet", "--instance", "g5.xlarge", "--quiet", "--",
               "true", timeout=120)
    assert proc.returncode != 0 and "refuses ModifyInstanceAttribute" in proc.stderr
    (job,) = json.loads(cli.ok("status", "--json").stdout)
    (raw,) = aws.instances(**{"tag:cloudtrain:job": job["id"]})
    assert raw["State"]["Name"] in ("shutting-down", "terminated")
    assert [v["State"] for v in _job_volumes(aws, job["id"])] in ([], ["deleted"])
