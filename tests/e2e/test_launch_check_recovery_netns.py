"""Issue 37 (★): `check --launch --recovery` proves spot recovery on the user's account, here
against the namespace lab: moto's EC2, S3, IAM and FIS, tests/labs/asg.py playing EC2 Auto
Scaling (every instance a namespace host running its user-data) and tests/labs/fis.py playing
AWS Fault Injection Service's spot interruption as its documentation says."""

from __future__ import annotations

import json
import os
import re

import pytest

from labs.cloud import cloud_lab
from labs.netns import netns_available

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd"),
              pytest.mark.slow]

PROFILE = "ct-instance"
STEP_LINE = re.compile(r"^(?P<name>\S.{0,19}?) +(?P<seconds>\d+\.\d) s  "
                       r"(?P<verdict>ok  |FAILED: )(?P<detail>.*)$")
RECOVERY_STEPS = ["credentials", "instance type", "recovery", "key pair", "security group",
                  "AMI", "job store bucket"]
AFTER_LAUNCH = ["auto scaling group", "first checkpoint", "interruption", "replacement",
                "resume", "collect", "terminate", "cleanup", "bill"]


def _role(iam, name: str, service: str) -> None:
    iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": "sts:AssumeRole",
            "Principal": {"Service": service}}]}))


@pytest.fixture
def lab(cli, ct_home, tmp_path, monkeypatch):
    with cloud_lab(cli, ct_home, tmp_path, monkeypatch, [], f"ct-e2e-fis-{os.getpid()}",
                   autoscaling=True) as lab:
        import boto3

        from labs.credentials import CLIENT_CREDS, REGION
        from labs.fis import FaultInjection
        from labs.moto_placement import PlacementGroups

        PlacementGroups().install(monkeypatch)  # the cleanup looks for the job's

        iam = boto3.client("iam", endpoint_url=lab.endpoint, region_name=REGION, **CLIENT_CREDS)
        _role(iam, "ct-instance-role", "ec2.amazonaws.com")
        iam.create_instance_profile(InstanceProfileName=PROFILE)
        iam.add_role_to_instance_profile(InstanceProfileName=PROFILE, RoleName="ct-instance-role")
        lab.fis = FaultInjection(lab, monkeypatch).install()
        config = ct_home / "config.yaml"
        text = "".join(line for line in config.read_text().splitlines(keepends=True)
                       if not line.startswith("remote_root:"))
        config.write_text(text + f"instance_profile: {PROFILE}\n"
                          "remote_root: /home/ubuntu/.cloudtrain\n")
        lab.iam_client = iam
        yield lab
        lab.fis.close()
        assert lab.asg.errors() == []


def _steps(stdout: str) -> list[dict]:
    return [m.groupdict() for m in map(STEP_LINE.match, stdout.splitlines()) if m]


def _fis_templates(lab) -> list:
    import boto3

    from labs.credentials import CLIENT_CREDS, REGION

    fis = boto3.client("fis", endpoint_url=lab.endpoint, region_name=REGION, **CLIENT_CREDS)
    return fis.list_experiment_templates()["experimentTemplates"]


def test_check_launch_recovery_interrupts_through_fis_and_the_group_resumes_the_job(
        lab, cli, ct_home):
    """Issue 37 (★): a spot t3.micro in its Auto Scaling group; once its first checkpoint is
    in the job store, an AWS FIS experiment sends it the rebalance recommendation and the
    two-minute notice; the agent stores a checkpoint and powers off; the group's replacement
    boots from the job store, resumes from the checkpoint and ends the job succeeded. Every
    step ok, each timed; nothing is left (instances, group, template, experiment template,
    job store objects); the job is an ordinary one of two attempts, priced."""
    _role(lab.iam_client, "cloudtrain-fis", "fis.amazonaws.com")
    proc = cli("check", "--launch", "--recovery", "--yes", timeout=600)
    steps = _steps(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [s["name"] for s in steps]
    assert names[:len(RECOVERY_STEPS)] == RECOVERY_STEPS, proc.stdout
    assert names[-len(AFTER_LAUNCH):] == AFTER_LAUNCH, proc.stdout
    assert all(s["verdict"] == "ok  " for s in steps), proc.stdout
    by = {s["name"]: s["detail"] for s in steps}
    assert by["instance type"].startswith("t3.micro spot in us-east-1: at most $")
    assert "FIS acts with role cloudtrain-fis" in by["recovery"]
    assert by["auto scaling group"].startswith("cloudtrain-")
    first = int(re.search(r"^step (\d+) streamed", by["first checkpoint"])[1])
    assert first >= 1
    assert "rebalance recommendation and the two-minute notice" in by["interruption"]
    resumed = int(re.search(r"resumed from step (\d+)", by["resume"])[1])
    assert resumed >= first and "2 attempts" in by["resume"]
    assert "experiment template" in by["cleanup"]

    # FIS did it, as its documentation says: started, the notice, the instance ended.
    events = [e["event"] for e in lab.fis.events]
    assert events[:2] == ["started", "notice"], lab.fis.events
    (experiment,) = lab.fis.experiments.values()
    assert experiment["status"] in ("stopped", "completed")
    # Nothing is left: no instance, group, template, experiment template, stored object.
    assert {k: v for k, v in lab.asg.leftovers().items() if v} == {}
    assert _fis_templates(lab) == []
    job_id = re.search(r"\(job (\w+):", proc.stdout)[1]
    job = cli.job(job_id)
    assert job["state"] == "succeeded" and len(job["attempts"]) == 2, job
    assert job["attempts"][0]["outcome"] == "interrupted"
    log = (ct_home / "jobs" / job_id / "output.log").read_text()
    assert f"resumed from step {resumed}" in log and "cloudtrain check --launch" in log


def test_check_launch_recovery_without_the_fis_role_stops_there_and_leaves_nothing(
        lab, cli, ct_home):
    """Issue 37 (★): no role for FIS (the account's one-time step not done): the check
    stops at the interruption, naming the role and where its policy is, exits 1, and the
    job, its group, template and instances are all gone."""
    proc = cli("check", "--launch", "--recovery", "--yes", timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    steps = _steps(proc.stdout)
    failed = [s for s in steps if s["verdict"] != "ok  "]
    assert [s["name"] for s in failed] == ["interruption"], proc.stdout
    assert "cloudtrain-fis does not exist" in failed[0]["detail"]
    assert "infra/README.md section 2b" in proc.stdout
    assert "nothing is left running" in proc.stdout.splitlines()[-1]
    assert {k: v for k, v in lab.asg.leftovers().items() if v} == {}
    assert _fis_templates(lab) == []
    assert lab.fis.events[0]["event"] == "template-refused"
