"""recovery.relaunch against in-process moto (two regions): what a supervisor killed half-way
through a relaunch leaves, and what the next one does with it."""

from __future__ import annotations

import datetime

import pytest
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models.instances import InstanceBackend

from labs.aws import DLAMI_PARAMETER
from labs.credentials import AWS_ENV
from cloudtrain import state
from cloudtrain.lifecycle import attempts, launch, recovery, watch
from cloudtrain.config import Settings
from cloudtrain.spec import JobSpec
from cloudtrain.state import open_store

HOME, OTHER = "us-east-1", "us-west-2"


class Killed(BaseException):
    """SIGKILL of the supervisor: nothing after it runs (no cleanup, no release)."""


@pytest.fixture
def two_regions(monkeypatch, ct_home):
    """moto in this process, a DLAMI in both regions, `regions: us-east-1, us-west-2`."""
    from moto import mock_aws

    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    with open(ct_home / "config.yaml", "a") as f:
        f.write(f"region: {HOME}\nregions: {HOME}, {OTHER}\nssh_cidr: 127.0.0.1/32\n"
                "poll_seconds: 0.05\nssh_wait_seconds: 1\ninstance_wait_seconds: 5\n")
    with mock_aws():
        import boto3
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ssm.models import Parameter, ssm_backends

        for region in (HOME, OTHER):
            ec2 = boto3.client("ec2", region_name=region)
            image = ec2.register_image(Name="Deep Learning OSS Nvidia Driver AMI GPU PyTorch",
                                       RootDeviceName="/dev/sda1")["ImageId"]
            ssm_backends[DEFAULT_ACCOUNT_ID][region]._parameters[DLAMI_PARAMETER].append(
                Parameter(account_id=DEFAULT_ACCOUNT_ID, name=DLAMI_PARAMETER, value=image,
                          parameter_type="String", description=None, allowed_pattern=None,
                          keyid=None, last_modified_date=datetime.datetime.now(), version=1,
                          data_type="text"))
        yield {r: boto3.client("ec2", region_name=r) for r in (HOME, OTHER)}


def _recovering_job(store) -> state.Job:
    """A spot job whose first instance (in the home region) was interrupted."""
    spec = JobSpec.of(kind="command", backend="aws", command=["sleep", "600"],
                   instance_type="g5.xlarge", market="spot", recover=True, max_restarts=3,
                   region=HOME)
    job = store.create_job(name=None, kind="command", recipe=None, command="sleep 600",
                           backend="aws", spec=spec.to_dict())
    store.add_attempt(job.id, 1, region=HOME, zone=f"{HOME}a", market="spot",
                      instance_type="g5.xlarge")
    store.update_attempt(job.id, 1, ended_at=1.0, outcome=attempts.INTERRUPTED)
    store.set_state(job.id, state.RECOVERING, reason="spot interruption")
    return store.job(job.id)


def killed_while_waiting(monkeypatch, no_capacity: set) -> list[str]:
    """A supervisor SIGKILLed while it waits for the instance it started (Killed, no cleanup
    after it), in a cloud whose regions in `no_capacity` (the caller may change it) refuse
    RunInstances for capacity. Returns the ids it waited for, as it waits.
    (benchmarks/audit_lab.py runs the audit's relaunch scenarios with it.)"""
    from cloudtrain.providers.aws import boot

    waited: list[str] = []

    def wait_then_die(aws, region, instance_id, report=None, public=None):
        waited.append(instance_id)
        raise Killed()

    original_abort = launch.abort_launch

    def no_cleanup(store_, settings_, provider, job_, host, exc):
        if isinstance(exc, Killed):
            raise exc
        return original_abort(store_, settings_, provider, job_, host, exc)

    original_run = InstanceBackend.run_instances

    def run_instances(self, *args, **kwargs):
        if self.region_name in no_capacity:
            raise EC2ClientError("InsufficientInstanceCapacity", "We currently do not have "
                                 "sufficient g5.xlarge capacity")
        return original_run(self, *args, **kwargs)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)
    monkeypatch.setattr(boot, "wait_running", wait_then_die)
    monkeypatch.setattr(launch, "abort_launch", no_cleanup)
    return waited


def _live(ec2s, job_id) -> list[tuple[str, str, str]]:
    out = []
    for region, ec2 in ec2s.items():
        for res in ec2.describe_instances(Filters=[
                {"Name": "tag:cloudtrain:job", "Values": [job_id]}])["Reservations"]:
            for raw in res["Instances"]:
                if raw["State"]["Name"] in ("pending", "running"):
                    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
                    out.append((region, raw["InstanceId"], tags["cloudtrain:attempt"]))
    return sorted(out)


def test_F30_a_supervisor_killed_mid_relaunch_elsewhere_leaves_one_instance(
        two_regions, ct_home, monkeypatch):
    """F30: supervisor A started attempt 2 in a second region and was killed; B must go on
    with that instance (or terminate it), never start another beside it."""
    store = open_store(ct_home)
    job = _recovering_job(store)
    no_capacity = {HOME}
    waited = killed_while_waiting(monkeypatch, no_capacity)

    # supervisor A: no capacity at home, an instance started in us-west-2, then SIGKILL
    with pytest.raises(Killed):
        recovery.relaunch(store, Settings.load(), job)
    (first,) = _live(two_regions, job.id)
    assert first[0] == OTHER and first[2] == "2" and waited == [first[1]]
    # the next command finds the supervisor gone; capacity is back at home
    assert watch.launcher_died(store, store.job(job.id)).state == state.RECOVERING
    no_capacity.clear()
    # and an earlier supervisor had got an instance of the same attempt at home, unrecorded
    (stray,) = two_regions[HOME].run_instances(
        ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": "cloudtrain:job", "Value": job.id},
            {"Key": "cloudtrain:attempt", "Value": "2"}]}])["Instances"]

    # supervisor B goes on with A's instance, and terminates the other before anything else:
    # one instance bills, not two or three
    with pytest.raises(Killed):
        recovery.relaunch(store, Settings.load(), store.job(job.id))
    assert _live(two_regions, job.id) == [first]
    assert waited == [first[1], first[1]]
    assert store.attempt(job.id).region == OTHER
    recorded = {i.id: i for i in store.instances(job.id)}
    assert recorded[stray["InstanceId"]].state == "terminated"  # billed until now, recorded
    assert any(e.phase == "instance" and stray["InstanceId"] in (e.detail or "")
               and "terminated" in e.detail for e in store.events(job.id))


def test_RC7_a_relaunch_past_the_deadline_s_slack_goes_into_the_reservation(
        two_regions, ct_home, monkeypatch):
    """RC7 with --deadline: a recovering spot job whose deadline spot can no longer make is
    relaunched on-demand into its reservation: in the reservation's region and AZ only (not
    the other region's on-demand), RunInstances naming it, the attempt on-demand and the
    instance priced as the reservation bills."""
    import time

    from labs.moto_capacity import Reservations
    from cloudtrain import catalog

    lab = Reservations().install(monkeypatch)
    cr = lab.add(instance_type="g5.xlarge", az=f"{HOME}b", count=1, kind="default",
                 region=HOME)
    store = open_store(ct_home)
    spec = JobSpec.of(kind="command", backend="aws", command=["sleep", "600"],
                      instance_type="g5.xlarge", market="spot", recover=True, max_restarts=3,
                      region=HOME, reservation=cr, deadline_at=time.time() + 80 * 60,
                      expected={"train_s": 3600.0})
    job = store.create_job(name=None, kind="command", recipe=None, command="sleep 600",
                           backend="aws", spec=spec.to_dict())
    store.add_attempt(job.id, 1, region=HOME, zone=f"{HOME}a", market="spot",
                      instance_type="g5.xlarge")
    store.update_attempt(job.id, 1, ended_at=time.time() - 60, outcome=attempts.INTERRUPTED)
    store.set_state(job.id, state.RECOVERING, reason="spot interruption")
    waited = killed_while_waiting(monkeypatch, set())
    with pytest.raises(Killed):
        recovery.relaunch(store, Settings.load(), store.job(job.id))
    (live,) = _live(two_regions, job.id)
    assert live[0] == HOME and waited == [live[1]] and lab.instances(cr) == [live[1]]
    (launch_,) = lab.launches
    assert launch_["reservation id"] == cr and launch_["refused"] is None
    assert store.attempt(job.id).market == "on-demand"
    (inst,) = [i for i in store.instances(job.id) if i.id == live[1]]
    assert inst.zone == f"{HOME}b" and inst.details["reservation"] == cr
    assert inst.price_per_hour == catalog.get("g5.xlarge").on_demand[HOME]
    said = [e.detail for e in store.events(job.id) if e.phase == "deadline"]
    assert said and said[-1].startswith("on-demand: the switch was at "), said
