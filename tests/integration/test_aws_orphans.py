"""Instances nothing holds (F12) and a --keep job that never ran (F14), provider side:
`orphans(store)` finds this owner's live instances that no active or kept job holds, and
`release` finds the instance of a RunInstances whose answer was lost."""

from __future__ import annotations

import json
import os
import re

import pytest
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models.instances import InstanceBackend

from labs.aws import aws, ec2_provider, moto_endpoint  # noqa: F401  (fixtures)
from cloudtrain.state import Instance, open_store
from cloudtrain.providers.aws import boot
from labs.credentials import CLIENT_CREDS
from labs.aws import reset_moto

OWNER_TAG, JOB_TAG = "cloudtrain:owner", "cloudtrain:job"


def _start(p, owner, job_id=None):
    ami = p.aws.call("us-east-1", "describe_images", Owners=["amazon"])["Images"][0]["ImageId"]
    tags = [{"Key": OWNER_TAG, "Value": owner}] + (
        [{"Key": JOB_TAG, "Value": job_id}] if job_id else [])
    (raw,) = p.aws.call("us-east-1", "run_instances", ImageId=ami, MinCount=1, MaxCount=1,
                    InstanceType="g5.xlarge", TagSpecifications=[
                        {"ResourceType": "instance", "Tags": tags}])["Instances"]
    return raw["InstanceId"]


def _job(store, state, keep=False, ran=False):
    job = store.create_job(name=None, kind="command", recipe=None, command="true", backend="aws",
                           spec={"keep": keep, "region": "us-east-1", "market": "on-demand"})
    if ran:
        store.set_state(job.id, "running")
    if state != "running":
        store.set_state(job.id, state, only_if_active=False)
    return store.job(job.id)


def _record(store, job, instance_id, state="running"):
    store.add_instance(Instance(
        id=instance_id, job_id=job.id, provider="aws", region="us-east-1", zone="us-east-1a",
        instance_type="g5.xlarge", market="on-demand", state=state, launched_at=0.0,
        terminated_at=None, price_per_hour=None, details={}))


def _state(p, instance_id):
    return boot.describe_instance(p.aws, "us-east-1", instance_id)["State"]["Name"]


def test_F12_orphans_are_live_owner_tagged_instances_no_job_holds(ec2_provider, ct_home):
    p = ec2_provider
    me = p.account.owner("us-east-1")
    store = open_store(ct_home)
    active = _job(store, "running", ran=True)
    ended = _job(store, "succeeded", ran=True)
    kept = _job(store, "succeeded", keep=True, ran=True)
    held = _start(p, me, active.id)
    _record(store, active, held)
    leaked = _start(p, me, ended.id)  # its job ended, the store thinks it went
    _record(store, ended, leaked, state="terminated")
    kept_instance = _start(p, me, kept.id)
    _record(store, kept, kept_instance)
    unknown = _start(p, me, "lostjob1")  # launched from a state the store never saw
    _start(p, "arn:aws:iam::999999999999:user/someone-else", "theirs01")
    gone = _start(p, me, "gonejob1")
    p.terminate("us-east-1", [gone])

    found = {o["id"]: o for o in p.orphans(store).found}
    assert set(found) == {leaked, unknown}
    assert found[unknown]["job"] == "lostjob1" and found[unknown]["region"] == "us-east-1"
    assert found[unknown]["type"] == "g5.xlarge" and found[unknown]["launched_at"] > 0

    p.terminate("us-east-1", sorted(found))
    assert p.orphans(store).found == []
    assert _state(p, leaked) == _state(p, unknown) == "terminated"
    assert _state(p, held) == _state(p, kept_instance) == "running"


def test_F14_a_keep_job_that_never_ran_does_not_keep_its_instance(ec2_provider, ct_home):
    p = ec2_provider
    me = p.account.owner("us-east-1")
    store = open_store(ct_home)
    never_ran = _job(store, "failed", keep=True)
    ran = _job(store, "succeeded", keep=True, ran=True)
    for job in (never_ran, ran):
        _record(store, job, _start(p, me, job.id))
    p.release(store, never_ran)  # not forced, as the reaper of a dead launcher calls it
    p.release(store, ran)
    (lost,) = store.instances(never_ran.id)
    (kept,) = store.instances(ran.id)
    assert _state(p, lost.id) == "terminated" and _state(p, kept.id) == "running"
    assert p.orphans(store).found == []  # the kept one is held, the other is gone


@pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")
def test_F12_release_after_a_lost_run_instances_answer_finds_the_new_instance(cli, aws,
                                                                          monkeypatch):
    """EC2 started the instance but the answer never came (InternalError after the fact),
    and DescribeInstances does not show it for the first lookups (eventual consistency)."""
    original_run, original_describe = InstanceBackend.run_instances, InstanceBackend.describe_instances
    hidden = {"lookups": 0}

    def run_then_fail(self, *args, **kwargs):
        original_run(self, *args, **kwargs)
        hidden["lookups"] = 3
        raise EC2ClientError("InternalError", "An internal error has occurred")

    def describe(self, *args, **kwargs):
        if hidden["lookups"] > 0:
            hidden["lookups"] -= 1
            return []
        return original_describe(self, *args, **kwargs)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_then_fail)
    monkeypatch.setattr(InstanceBackend, "describe_instances", describe)
    proc = cli("launch", "--instance", "g5.xlarge", "--", "true", timeout=90)
    assert proc.returncode == 1
    assert "InternalError" in proc.stderr
    left, hidden["lookups"] = hidden["lookups"], 0
    (raw,) = aws.instances()
    assert raw["State"]["Name"] == "terminated"
    assert left == 0  # it had to look again
    job = json.loads(cli.ok("status", "--json").stdout)[0]
    timeline = [p["name"] for p in cli.job(job["id"])["timeline"]]
    assert "run-instances-unanswered" in timeline


# -- F28 / U1: a lost state and no region configured --------------------------------------------


@pytest.fixture
def lost_home(moto_endpoint, ct_home, monkeypatch):
    """Another machine, or a wiped $CLOUDTRAIN_HOME: a fresh home (no state, a config.yaml
    without `region:`), AWS credentials in the environment and no region anywhere (no
    AWS_REGION, AWS_DEFAULT_REGION or profile), as F28 and U1 found it. Returns a function
    that starts an instance tagged as the caller's in a region."""
    import boto3
    from botocore.config import Config

    from labs.credentials import AWS_ENV

    reset_moto(moto_endpoint)
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    assert "region" not in (ct_home / "config.yaml").read_text()

    def start(region: str, job_id: str) -> str:
        kw = dict(endpoint_url=moto_endpoint, region_name=region,
                  config=Config(retries={"max_attempts": 1}), **CLIENT_CREDS)
        owner = boto3.client("sts", **kw).get_caller_identity()["Arn"]
        (raw,) = boto3.client("ec2", **kw).run_instances(
            ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
            TagSpecifications=[{"ResourceType": "instance", "Tags": [
                {"Key": OWNER_TAG, "Value": owner}, {"Key": JOB_TAG, "Value": job_id}]}]
        )["Instances"]
        start.clients[raw["InstanceId"]] = boto3.client("ec2", **kw)
        return raw["InstanceId"]

    start.clients = {}

    def state(instance_id: str) -> str:
        (res,) = start.clients[instance_id].describe_instances(
            InstanceIds=[instance_id])["Reservations"]
        return res["Instances"][0]["State"]["Name"]

    start.state = state
    return start


def _refuse_in(monkeypatch, region: str) -> None:
    """DescribeInstances in `region` refused (a region the policy denies, or an SCP)."""
    original = InstanceBackend.describe_instances

    def describe(self, *args, **kwargs):
        if self.region_name == region:
            raise EC2ClientError("UnauthorizedOperation", "You are not authorized to perform "
                                 "this operation. User: x is not authorized to perform: "
                                 "ec2:DescribeInstances")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(InstanceBackend, "describe_instances", describe)


def test_F28_down_all_with_a_lost_state_and_no_region_finds_the_instance(cli, lost_home):
    instance = lost_home("us-east-1", "6a92bfde")
    proc = cli("down", "--all", "-y", "--wide", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{instance}: instance of job 6a92bfde not in this store: terminated" in proc.stdout
    assert "no active jobs" not in proc.stdout
    asked = next(l for l in proc.stdout.splitlines() if l.startswith("aws: checked"))
    assert "us-east-1" in asked and "us-west-2" in asked and "eu-west-1" in asked
    assert lost_home.state(instance) in ("shutting-down", "terminated")


def test_F28_a_configured_region_does_not_hide_the_default_one(cli, lost_home, ct_home):
    with open(ct_home / "config.yaml", "a") as f:
        f.write("region: us-west-2\n")
    east = lost_home("us-east-1", "6a92bfde")
    west = lost_home("eu-west-1", "7b03c0ef")
    proc = cli("down", "--all", "-y", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for instance in (east, west):
        assert f"{instance}: instance of job" in proc.stdout
        assert lost_home.state(instance) in ("shutting-down", "terminated")


def test_F28_down_job_known_only_from_its_tag_in_any_region(cli, lost_home):
    instance = lost_home("us-west-2", "6a92bfde")
    proc = cli("down", "-y", "6a92", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{instance}: instance of job 6a92bfde not in this store: terminated" in proc.stdout
    assert lost_home.state(instance) in ("shutting-down", "terminated")


def test_F28_status_refresh_with_a_lost_state_lists_the_instance(cli, lost_home):
    instance = lost_home("us-east-1", "6a92bfde")
    out = cli.ok("status", "--refresh", "--wide", timeout=180).stdout
    line = next(l for l in out.splitlines() if instance in l)
    assert "us-east-1" in line and "6a92bfde" in line and "NO: not in the local store" in line
    assert "no instance tagged cloudtrain is running" not in out
    assert "regions checked" in out and "us-west-2" in out


def test_u54_down_all_and_status_refresh_say_how_many_regions_and_name_them_with_wide(
        cli, lost_home):
    """U54: `status --refresh` and `down --all` printed all 34 region names in one line of
    about 600 characters every time. A count (and how they were chosen) is enough; --wide
    names them."""
    from cloudtrain import config

    regions = sorted(r for r in config.known_regions() if r.count("-") == 2)
    lost_home("us-east-1", "6a92bfde")
    refreshed = cli.ok("status", "--refresh", timeout=180).stdout
    line = next(l for l in refreshed.splitlines() if "regions checked" in l)
    assert re.fullmatch(r"cloud: \d+ regions checked \(the regions enabled for the account\)",
                        line), line
    assert "us-west-2" not in refreshed and "eu-west-1" not in refreshed
    wide = cli.ok("status", "--refresh", "--wide", timeout=180).stdout
    assert "eu-west-1, " in wide and "us-west-2" in wide
    proc = cli("down", "--all", "-y", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    swept = [l for l in proc.stdout.splitlines() if l.startswith("aws: checked")]
    assert len(swept) == 1 and re.fullmatch(
        r"aws: checked \d+ regions \(the regions enabled for the account\)", swept[0]), swept
    count = int(swept[0].split()[2])
    assert count >= 10 and not [r for r in regions if r in proc.stdout], proc.stdout
    listed = cli.ok("down", "--all", "-y", "--wide", timeout=180).stdout
    named = next(l for l in listed.splitlines() if l.startswith("aws: checked"))
    assert len(named.split(": ", 2)[2].split(", ")) == count, named


def test_F28_a_region_that_cannot_be_asked_is_never_an_all_clear(cli, lost_home, monkeypatch):
    _refuse_in(monkeypatch, "eu-west-1")
    proc = cli("down", "--all", "-y", timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "aws: could not check eu-west-1: not allowed: ec2:DescribeInstances" in proc.stdout
    assert "no active jobs" not in proc.stdout.replace("no active jobs in this store", "")
    proc = cli("status", "--refresh", timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    refreshed = proc.stdout
    assert "could not check eu-west-1: not allowed" in refreshed
    assert "no instance tagged cloudtrain is running" not in refreshed
    # the same for a job id no store knows: not "no such job" while a region went unasked
    by_id = cli("down", "-y", "6a92bfde", timeout=180)
    assert by_id.returncode == 1
    assert "could not check eu-west-1" in by_id.stdout + by_id.stderr
    assert "no such job (here or tagged in the cloud)" not in by_id.stdout


def test_F28_without_describe_regions_the_regions_cloudtrain_could_use_are_asked(
        cli, lost_home, ct_home, monkeypatch):
    from moto.ec2.models import EC2Backend

    def refused(self, *args, **kwargs):
        raise EC2ClientError("UnauthorizedOperation", "You are not authorized to perform "
                             "this operation. User: x is not authorized to perform: "
                             "ec2:DescribeRegions")

    monkeypatch.setattr(EC2Backend, "describe_regions", refused)
    with open(ct_home / "config.yaml", "a") as f:
        f.write("regions: ca-central-1, us-west-2\n")
    default = lost_home("us-east-1", "6a92bfde")  # where launches go when nothing is set
    listed = lost_home("ca-central-1", "7b03c0ef")  # a region of `regions:`
    proc = cli("down", "--all", "-y", "--wide", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for instance in (default, listed):
        assert f"{instance}: instance of job" in proc.stdout
        assert lost_home.state(instance) in ("shutting-down", "terminated")
    asked = next(l for l in proc.stdout.splitlines() if l.startswith("aws: checked"))
    assert "DescribeRegions" in asked and "ca-central-1" in asked and "us-east-1" in asked


def test_F41_release_terminates_by_record_only_what_ec2_shows_as_the_job_s(ec2_provider,
                                                                            ct_home):
    """F41: `release` (down, the job's end, an abort) terminated every instance the store
    recorded for the job. A store may hold a record learnt from the job store before those
    were checked: an untagged `prod-database` and another job's instance. Only instances EC2
    shows with the job's tag are terminated (by record or found by tag); the others stay,
    each said once in the job's events."""
    p = ec2_provider
    me = p.account.owner("us-east-1")
    store = open_store(ct_home)
    job = _job(store, "running", ran=True)
    mine = _start(p, me, job.id)
    prod = p.aws.call("us-east-1", "run_instances", ImageId=p.aws.call(
        "us-east-1", "describe_images", Owners=["amazon"])["Images"][0]["ImageId"],
        MinCount=1, MaxCount=1, InstanceType="t3.micro", TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": "prod-database"}]}]
    )["Instances"][0]["InstanceId"]
    theirs = _start(p, me, "0ther0b1")
    for instance in (mine, prod, theirs):
        _record(store, job, instance)
    p.release(store, job, force=True)
    p.release(store, job, force=True)  # `down` again: said once
    assert _state(p, mine) == "terminated"
    assert _state(p, prod) == _state(p, theirs) == "running"
    said = [e.detail for e in store.events(job.id) if e.phase == "release"]
    assert sorted(said) == sorted([
        f"{prod} NOT terminated: the job's record names it, but EC2 shows it with no "
        "cloudtrain:job tag, not this job's",
        f"{theirs} NOT terminated: the job's record names it, but EC2 shows it with job "
        "0ther0b1's tag, not this job's"])
