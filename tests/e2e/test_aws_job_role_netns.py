"""Issue 36 end to end: a job's instances hold only that job's power, and outlive the user's
session.

Through the real AWS path against the lab's moto, with tests/labs/asg.py playing AWS Auto
Scaling and tests/labs/moto_iam.py playing IAM: each instance gets its role's own credentials
from the metadata service, and every request signed with them is allowed or refused as IAM
would (the role's policy and its permissions boundary, evaluated); a key the test revokes is
refused from then on. `instance_profile: per-job`: each job runs on a role of its own.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from labs.cloud import cloud_lab
from labs.netns import netns_available
from labs.polling import wait_for

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd"),
              pytest.mark.slow]


# Job A, compromised: its command takes its instance's own role credentials from the
# metadata service and turns them on job B (whose prefix, group and instance it was told).
ATTACK = r"""
import json, os, sys, urllib.request
import boto3
from botocore.config import Config
endpoint, bucket, theirs, group, instance = sys.argv[1:6]
own = theirs.rstrip("/").rsplit("/", 1)[0] + "/" + os.environ["CLOUDTRAIN_JOB_ID"] + "/"
imds = "http://169.254.169.254/latest/"
token = urllib.request.urlopen(urllib.request.Request(imds + "api/token", method="PUT",
    headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})).read().decode()
def meta(path):
    return urllib.request.urlopen(urllib.request.Request(imds + path, headers={
        "X-aws-ec2-metadata-token": token})).read().decode()
role = meta("meta-data/iam/security-credentials/").split()[0]
c = json.loads(meta("meta-data/iam/security-credentials/" + role))
kw = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=c["AccessKeyId"],
          aws_secret_access_key=c["SecretAccessKey"], aws_session_token=c["Token"],
          config=Config(retries={"max_attempts": 1}))
s3, asg, ec2 = (boto3.client(s, **kw) for s in ("s3", "autoscaling", "ec2"))
tries = {
    "read B's job.json": lambda: s3.get_object(Bucket=bucket, Key=theirs + "bundle/job/job.json"),
    "read B's bundle manifest": lambda: s3.get_object(Bucket=bucket,
                                                      Key=theirs + "bundle/manifest.json"),
    "read B's checkpoint": lambda: s3.get_object(Bucket=bucket, Key=theirs + "stream/latest.json"),
    "write B's start.sh": lambda: s3.put_object(Bucket=bucket, Key=theirs + "bundle/start.sh",
                                                Body=b"touch /tmp/pwned"),
    "write B's checkpoint": lambda: s3.put_object(Bucket=bucket, Key=theirs + "stream/latest.json",
                                                  Body=b"{}"),
    "write B's final.json": lambda: s3.put_object(Bucket=bucket, Key=theirs + "final.json",
                                                  Body=b'{"state": "succeeded"}'),
    "resize B's group": lambda: asg.update_auto_scaling_group(
        AutoScalingGroupName=group, MinSize=0, MaxSize=3, DesiredCapacity=3),
    "empty B's group": lambda: asg.update_auto_scaling_group(
        AutoScalingGroupName=group, MinSize=0, MaxSize=0, DesiredCapacity=0),
    "delete B's group": lambda: asg.delete_auto_scaling_group(AutoScalingGroupName=group,
                                                              ForceDelete=True),
    "terminate B's instance": lambda: ec2.terminate_instances(InstanceIds=[instance]),
    "write its own prefix": lambda: s3.put_object(Bucket=bucket, Key=own + "probe.txt",
                                                  Body=b"mine"),
}
for what, call in tries.items():
    try:
        call()
        print("ATTACK", json.dumps({"try": what, "outcome": "done"}), flush=True)
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__
        print("ATTACK", json.dumps({"try": what, "outcome": code}), flush=True)
"""


@pytest.fixture
def lab(cli, ct_home, tmp_path, monkeypatch):
    with cloud_lab(cli, ct_home, tmp_path, monkeypatch, [], f"ct-e2e-jobrole-{os.getpid()}",
                   autoscaling=True, iam=True) as lab:
        import boto3

        from conftest import REPO
        from labs.credentials import CLIENT_CREDS, REGION

        # The administrator's one-time step: the boundary every job role must carry.
        boundary = (REPO / "infra" / "iam-policy-job-boundary.json").read_text()
        boto3.client("iam", endpoint_url=lab.endpoint, region_name=REGION, **CLIENT_CREDS
                     ).create_policy(PolicyName="cloudtrain-job-boundary", PolicyDocument=boundary
                                     .replace("DATASET_BUCKET", "none").replace("DATASET_PREFIX",
                                                                                "none"))
        config = ct_home / "config.yaml"
        text = "".join(line for line in config.read_text().splitlines(keepends=True)
                       if not line.startswith("remote_root:"))
        config.write_text(text + "instance_profile: per-job\n"
                          "remote_root: /home/ubuntu/.cloudtrain\n")
        yield lab
        assert lab.asg.errors() == []


def _session(n: int) -> dict:
    """The environment of a `cloudtrain` run with the user's n-th session (SSO, an assumed
    role): its own temporary key each time."""
    return {"AWS_ACCESS_KEY_ID": f"ASIAUSERSESSION{n:04d}", "AWS_SECRET_ACCESS_KEY": f"s{n}",
            "AWS_SESSION_TOKEN": f"user-session-{n}"}


def _stored(lab, job_id: str, name: str) -> str | None:
    """A file of the job's results in the job store (the lab's own credentials)."""
    import boto3

    from labs.credentials import CLIENT_CREDS, REGION

    s3 = boto3.client("s3", endpoint_url=lab.endpoint, region_name=REGION, **CLIENT_CREDS)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=_bucket(lab)):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith(f"/{job_id}/{name}"):
                return s3.get_object(Bucket=_bucket(lab), Key=obj["Key"])["Body"].read().decode()
    return None


def _bucket(lab) -> str:
    import boto3

    from labs.credentials import CLIENT_CREDS, REGION

    s3 = boto3.client("s3", endpoint_url=lab.endpoint, region_name=REGION, **CLIENT_CREDS)
    (bucket,) = [b["Name"] for b in s3.list_buckets()["Buckets"]
                 if b["Name"].startswith("cloudtrain-")]
    return bucket


def _roles(lab) -> list[str]:
    import boto3

    from labs.credentials import CLIENT_CREDS, REGION

    iam = boto3.client("iam", endpoint_url=lab.endpoint, region_name=REGION, **CLIENT_CREDS)
    return [r["RoleName"] for r in iam.list_roles(PathPrefix="/cloudtrain-jobs/")["Roles"]] + [
        p["InstanceProfileName"] for p in iam.list_instance_profiles(
            PathPrefix="/cloudtrain-jobs/")["InstanceProfiles"]]


def test_issue36_revoked_user_credentials_a_compromised_neighbour_and_a_reclaim(
        lab, cli, ct_home, tmp_path):
    """Issue 36's done-when, in one run, with the laptop closed:

    - job B is launched by the user's session, which then ends (its key revoked);
    - job A, launched by a later session, is compromised: its command turns its instance's
      own role credentials on B (B's bundle and job.json, B's checkpoint and final.json, B's
      group, B's instance). IAM refuses every one of them; A still writes its own prefix;
    - B's instance is then taken back (no notice): AWS Auto Scaling's replacement gets B's
      role, boots from B's bundle, resumes from the newest checkpoint, and B ends succeeded,
      its group deleting itself: nothing of the revoked session was needed.

    Only then does a new session run `status`: B succeeded in 2 attempts; no instance,
    group, template, role or instance profile is left."""
    from test_spot_recovery import _own_job  # a step every 0.15 s, a checkpoint every 5

    b = cli.launch("--instance", "g5.xlarge", "--spot", "--workdir", str(_own_job(tmp_path, 0)),
                   "--", "python3", "job.py", "300", env=_session(1), timeout=300)
    b_name = f"cloudtrain-{b}"
    (first,) = lab.asg.wait_for_group(b_name, 1)
    wait_for(lambda: (lab.stored_checkpoint(b) or {}).get("step", 0) >= 10, timeout=120,
             what="B's first streamed checkpoints")
    lab.iam.revoke(_session(1)["AWS_ACCESS_KEY_ID"])  # the session that launched B ends

    bucket = _bucket(lab)
    b_prefix = json.loads(_stored_prefix(lab, b))
    a_dir = tmp_path / "a"
    a_dir.mkdir()
    (a_dir / "attack.py").write_text(ATTACK)
    # (this machine's python, which the lab's instances share: it has boto3)
    a = cli.launch("--instance", "g5.xlarge", "--spot", "--workdir", str(a_dir), "--",
                   sys.executable, "attack.py", lab.endpoint, bucket, b_prefix, b_name,
                   first.id, env=_session(2), timeout=300)
    lab.asg.kill_launching_machine()  # the laptop closes
    lab.iam.revoke(_session(2)["AWS_ACCESS_KEY_ID"])
    wait_for(lambda: not lab.asg.live(f"cloudtrain-{a}") and _stored(lab, a, "final.json"),
             timeout=180, interval=1.0, what="job A to end")
    log = _stored(lab, a, "output.log") or ""
    tries = {d["try"]: d["outcome"] for d in (json.loads(line.split(" ", 1)[1])
                                              for line in log.splitlines()
                                              if line.startswith("ATTACK "))}
    assert tries == {
        "read B's job.json": "AccessDenied", "read B's bundle manifest": "AccessDenied",
        "read B's checkpoint": "AccessDenied", "write B's start.sh": "AccessDenied",
        "write B's checkpoint": "AccessDenied", "write B's final.json": "AccessDenied",
        "resize B's group": "AccessDenied", "empty B's group": "AccessDenied",
        "delete B's group": "AccessDenied", "terminate B's instance": "AccessDenied",
        "write its own prefix": "done"}, log[-3000:]
    assert [i.id for i in lab.asg.live(b_name)] == [first.id]  # B untouched

    step = (lab.stored_checkpoint(b) or {}).get("step", 0)
    lab.take_back({"InstanceId": first.id, "PrivateIpAddress": first.ip})
    replacement = wait_for(lambda: next((i for i in lab.asg.live(b_name) if i.id != first.id),
                                        None), timeout=120, what="B's replacement")
    wait_for(lambda: not lab.asg.leftovers()["instances"] and not lab.asg.live(b_name),
             timeout=300, interval=1.0, what=f"B to end: {lab.asg.leftovers()}")
    assert replacement.user_data_exit == 0

    job = cli.job(b)  # a new session, the first command since the laptop closed
    assert job["state"] == "succeeded", (job["reason"], job["timeline"])
    assert [x["attempt"] for x in job["attempts"]] == [1, 2]
    resumed = job["attempts"][1]["resumed_step"]
    assert resumed is not None and resumed >= step > 0, (resumed, step)
    assert "done at step 300" in cli.ok("logs", b).stdout
    cli.job(a)
    wait_for(lambda: not any(lab.asg.leftovers().values()) and not _roles(lab), timeout=60,
             what=f"nothing left: {lab.asg.leftovers()} {_roles(lab)}")
    # every request a job's role made was decided by the role's policy and boundary
    roles = {r for r, *_ in lab.iam.decisions}
    assert {f"cloudtrain-job-{b}", f"cloudtrain-job-{a}"} <= roles


def _stored_prefix(lab, job_id: str) -> str:
    """B's prefix in the job store, as an attacker learns it (A's own prefix names the
    owner; the job's id is in its instances' tags)."""
    import boto3

    from labs.credentials import CLIENT_CREDS, REGION

    s3 = boto3.client("s3", endpoint_url=lab.endpoint, region_name=REGION, **CLIENT_CREDS)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=_bucket(lab))["Contents"]
            if f"/{job_id}/" in o["Key"]]
    return json.dumps(keys[0].split(f"/{job_id}/")[0] + f"/{job_id}/")
