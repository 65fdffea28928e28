"""Instances nothing holds (F12) and a --keep job that never ran (F14), provider side:
`orphans(store)` finds this owner's live instances that no active or kept job holds, and
`release` finds the instance of a RunInstances whose answer was lost."""

from __future__ import annotations

import json
import os

import pytest
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models.instances import InstanceBackend

from aws_lab import aws, ec2_provider, moto_endpoint  # noqa: F401  (fixtures)
from cloudtrain.state import Instance, open_store

OWNER_TAG, JOB_TAG = "cloudtrain:owner", "cloudtrain:job"


def _start(p, owner, job_id=None):
    ami = p.call("us-east-1", "describe_images", Owners=["amazon"])["Images"][0]["ImageId"]
    tags = [{"Key": OWNER_TAG, "Value": owner}] + (
        [{"Key": JOB_TAG, "Value": job_id}] if job_id else [])
    (raw,) = p.call("us-east-1", "run_instances", ImageId=ami, MinCount=1, MaxCount=1,
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
    return p._describe("us-east-1", instance_id)["State"]["Name"]


def test_F12_orphans_are_live_owner_tagged_instances_no_job_holds(ec2_provider, ct_home):
    p = ec2_provider
    me = p.owner("us-east-1")
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

    found = {o["id"]: o for o in p.orphans(store)}
    assert set(found) == {leaked, unknown}
    assert found[unknown]["job"] == "lostjob1" and found[unknown]["region"] == "us-east-1"
    assert found[unknown]["type"] == "g5.xlarge" and found[unknown]["launched_at"] > 0

    p.terminate("us-east-1", sorted(found))
    assert p.orphans(store) == []
    assert _state(p, leaked) == _state(p, unknown) == "terminated"
    assert _state(p, held) == _state(p, kept_instance) == "running"


def test_F14_a_keep_job_that_never_ran_does_not_keep_its_instance(ec2_provider, ct_home):
    p = ec2_provider
    me = p.owner("us-east-1")
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
    assert p.orphans(store) == []  # the kept one is held, the other is gone


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
