"""A job's own IAM role (issue 36, providers/aws/job_role.py) against moto in this process:
made before the job's instances under the permissions boundary, in its owner's path, with the
job's policy; the instances launched with its profile; its results grant a role's, not a
presigned POST; deleted with the job, and found by `down --all` when the job is gone."""

from __future__ import annotations

import json

import boto3
import pytest

from labs.aws import ec2_provider  # noqa: F401  (fixture)
from labs.credentials import REGION
from test_aws_groups import _job
from cloudtrain.market import Market
from cloudtrain.providers.aws import acquire, group_launch, instances, job_role, results
from cloudtrain.providers.aws.inventory import ROLE_DELETED_EVENT
from cloudtrain.spec import JobSpec
from cloudtrain.state import Store


def _spec(nodes=1, **kw) -> JobSpec:
    return JobSpec.of(kind="command", backend="aws", command=["true"], instance_type="g5.xlarge",
                      market=Market.SPOT, nodes=nodes, region=REGION, max_runtime_s=3600,
                      recover=True, **kw)


@pytest.fixture
def per_job(ec2_provider, ct_home):
    """The provider with `instance_profile: per-job`, and a store."""
    ec2_provider.settings.instance_profile = job_role.PER_JOB
    with Store(ct_home / "state.db") as store:
        yield ec2_provider, store


def _iam():
    return boto3.client("iam", region_name=REGION)


def _made(p, store, spec=None):
    spec = spec or _spec()
    job = _job(store, spec)
    acquire.own_role(p.aws, store, job, spec)
    return store.job(job.id), spec


def test_issue36_a_job_s_role_is_made_under_the_boundary_in_its_owner_s_path(per_job):
    """The role every instance of the job gets: in the owner's own IAM path (the policy that
    lets the CLI make roles names only that path), carrying the permissions boundary (no
    role the CLI makes holds more than it), tagged with the owner, its owner key (the
    boundary's job store prefix) and the job; its profile holds it; the job records it."""
    p, store = per_job
    job, spec = _made(p, store)
    name = f"cloudtrain-job-{job.id}"
    assert job.facts.job_role == name
    role = _iam().get_role(RoleName=name)["Role"]
    owner_key, owner = p.aws.owner_key(REGION), p.aws.owner(REGION)
    assert role["Path"] == f"/cloudtrain-jobs/{owner_key}/"
    assert role["PermissionsBoundary"]["PermissionsBoundaryArn"] == \
        "arn:aws:iam::123456789012:policy/cloudtrain-job-boundary"
    assert {t["Key"]: t["Value"] for t in role["Tags"]} == {
        "cloudtrain:owner": owner, "cloudtrain:owner-key": owner_key, "cloudtrain:job": job.id}
    trust = role["AssumeRolePolicyDocument"]
    trust = json.loads(trust) if isinstance(trust, str) else trust
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    policy = _iam().get_role_policy(RoleName=name, PolicyName="job")["PolicyDocument"]
    policy = json.loads(policy) if isinstance(policy, str) else policy
    _, bucket, prefix = group_launch.store_place(p.aws, store, job, spec)
    assert prefix == f"jobs/{owner_key}/{job.id}/"
    assert policy == job_role.role_policy(
        partition="aws", account="123456789012", region=REGION, bucket=bucket, prefix=prefix,
        job_id=job.id, group=f"cloudtrain-{job.id}", datasets=[], nodes=1)
    profile = _iam().get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [name]
    assert profile["Path"] == role["Path"]


def test_issue36_making_the_role_again_is_safe_and_brings_its_policy_up_to_date(per_job):
    """A relaunch (or a launch retried after its launcher died) makes the role again: no
    error, one role in the profile, the policy as this launch wants it."""
    p, store = per_job
    job, spec = _made(p, store)
    name = job_role.role_name(job.id)
    _iam().put_role_policy(RoleName=name, PolicyName="job", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*",
                                                 "Resource": "*"}]}))
    acquire.own_role(p.aws, store, job, spec)
    profile = _iam().get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [name]
    policy = _iam().get_role_policy(RoleName=name, PolicyName="job")["PolicyDocument"]
    policy = json.loads(policy) if isinstance(policy, str) else policy
    assert "s3:*" not in json.dumps(policy)


def test_issue36_a_job_on_several_nodes_sees_its_peers_and_one_with_datasets_reads_them(per_job):
    """The role holds what its job does: DescribeInstances only for a job on several nodes
    (regroup asks EC2 which peers run), and GetObject on each S3 dataset's prefix."""
    p, store = per_job
    one, _ = _made(p, store)
    spec = _spec(nodes=2, datasets=[
        {"name": "imagenet", "kind": "s3", "location": "s3://my-data/imagenet", "dir": "i"},
        {"name": "snap", "kind": "snapshot", "location": "snap-0123456789abcdef0",
         "dir": "s"}])
    two, _ = _made(p, store, spec)

    def sids(job):
        doc = _iam().get_role_policy(RoleName=job_role.role_name(job.id),
                                     PolicyName="job")["PolicyDocument"]
        doc = json.loads(doc) if isinstance(doc, str) else doc
        return {s["Sid"]: s for s in doc["Statement"]}

    assert "SeeItsPeers" not in sids(one) and "ReadItsDatasets" not in sids(one)
    assert sids(two)["SeeItsPeers"]["Action"] == "ec2:DescribeInstances"
    assert sids(two)["ReadItsDatasets"]["Resource"] == ["arn:aws:s3:::my-data/imagenet/*"]


def test_issue36_the_job_s_instances_are_launched_with_its_own_profile(per_job):
    """RunInstances (and so the launch template) names the job's own profile; a job with a
    shared `instance_profile:` still names that one, and a job without any names none."""
    p, store = per_job
    job, spec = _made(p, store)

    def profile():
        return instances.run_request(p.aws, job, spec, "subnet-1", "sg-1", "ami-1", "key",
                                     "owner", 100, "/dev/sda1").get("IamInstanceProfile")

    assert profile() == {"Name": f"cloudtrain-job-{job.id}"}
    p.settings.instance_profile = "cloudtrain-instance"
    assert profile() == {"Name": "cloudtrain-instance"}
    p.settings.instance_profile = ""
    assert profile() is None


def test_issue36_a_kept_instance_takes_no_role_of_its_own(per_job):
    """A --keep instance outlives its first job, and later jobs run on it: such a job gets
    no per-job role (it writes through its presigned grant), and no role is made."""
    p, store = per_job
    spec = _spec(keep=True)
    job = _job(store, spec)
    acquire.own_role(p.aws, store, job, spec)
    assert store.job(job.id).facts.job_role is None
    assert _iam().list_roles(PathPrefix="/cloudtrain-jobs/")["Roles"] == []
    grant, _ = results.results_grant(p.aws, store, job, spec)
    assert grant is not None and "fields" in grant and grant.get("signer") is None


def test_issue36_the_results_grant_of_a_job_on_its_role_holds_no_signature(per_job):
    """RF1: the presigned POST died with the session that signed it (an SSO hour). A job on
    its own role gets a grant that says only where to write (bucket, region, prefix, the
    metadata service): the instance signs each PUT with the role's renewed credentials.
    Node i > 0 of a job on several nodes writes under nodes/<i>/ as before."""
    p, store = per_job
    job, spec = _made(p, store)
    grant, note = results.results_grant(p.aws, store, job, spec)
    _, bucket, prefix = group_launch.store_place(p.aws, store, job, spec)
    assert grant == {"signer": "role", "bucket": bucket, "region": REGION, "endpoint": None,
                     "imds": p.settings.imds_url, "prefix": prefix}  # no 5 GB limit (RF2)
    assert "own IAM role" in note and "Signature" not in json.dumps(grant)
    node1, _ = results.results_grant(p.aws, store, job, spec, node=1)
    assert node1["prefix"] == prefix + "nodes/1/"


def test_issue36_down_deletes_the_role_and_its_profile_after_the_instances(per_job):
    """Whatever ends the job (its end, `down`, an abort) releases it: the role and its
    profile go too, after its instances (said on the job's timeline); a second release is
    a no-op."""
    p, store = per_job
    job, _ = _made(p, store)
    name = job_role.role_name(job.id)
    p.release(store, store.job(job.id))
    assert _iam().list_roles(PathPrefix="/cloudtrain-jobs/")["Roles"] == []
    assert _iam().list_instance_profiles(PathPrefix="/cloudtrain-jobs/")["InstanceProfiles"] == []
    assert [e.detail for e in store.events(job.id) if e.phase == ROLE_DELETED_EVENT] == [name]
    p.release(store, store.job(job.id))
    assert [e.detail for e in store.events(job.id) if e.phase == ROLE_DELETED_EVENT] == [name]


def test_issue36_down_all_finds_a_role_whose_job_this_machine_forgot(per_job, ct_home):
    """A launcher killed after the role was made, or a store lost: `down --all` finds the
    owner's roles of jobs it does not hold (in their own path) and deletes them; a role of
    an active job stays."""
    from cloudtrain.lifecycle import stop

    p, store = per_job
    live, _ = _made(p, store)
    with Store(ct_home / "lost.db") as elsewhere:  # a machine's store that is gone
        lost, _ = _made(p, elsewhere)
    found = [o for o in p.orphans(store).found if o.get("kind") == "role"]
    assert found == [{"id": f"cloudtrain-job-{lost.id}", "region": REGION, "job": lost.id,
                      "kind": "role"}]
    said = [(tag, o.note, o.ok) for tag, o in stop._sweep(store, None, "aws", p)
            if o.kind == "orphan"]
    assert said == [(lost.id, f"IAM role of job {lost.id} not in this store: deleted", True)]
    names = [r["RoleName"] for r in _iam().list_roles(PathPrefix="/cloudtrain-jobs/")["Roles"]]
    assert names == [f"cloudtrain-job-{live.id}"]


def test_issue36_only_a_job_role_is_ever_deleted_by_name(per_job):
    """delete() takes a name from a sweep: anything not named as a job's role is refused."""
    from cloudtrain.errors import CloudtrainError

    p, _ = per_job
    _iam().create_role(RoleName="prod-admin", AssumeRolePolicyDocument=json.dumps(
        job_role.trust_policy()))
    with pytest.raises(CloudtrainError, match="not a cloudtrain job role"):
        job_role.delete(p.aws, REGION, "prod-admin")
    assert _iam().get_role(RoleName="prod-admin")["Role"]["RoleName"] == "prod-admin"
    assert job_role.delete(p.aws, REGION, "cloudtrain-job-gone0000") is False


def test_issue36_without_the_job_store_a_per_job_role_is_a_usage_error(per_job):
    """The role exists for the job store: `job_store: false` with `per-job` is refused
    before anything is made, in one line with what to change."""
    from cloudtrain.errors import UsageError

    p, store = per_job
    p.settings.job_store = False
    spec = _spec()
    job = _job(store, spec)
    with pytest.raises(UsageError, match="needs the S3 job store"):
        acquire.own_role(p.aws, store, job, spec)
    assert _iam().list_roles(PathPrefix="/cloudtrain-jobs/")["Roles"] == []


def test_RF1_the_plan_says_who_writes_the_results_and_when_a_post_dies_first(
        per_job, tmp_path, monkeypatch):
    """The dry run's results line: a job on its own role writes with credentials AWS renews;
    a job on the presigned POST signed with temporary credentials that end before its max
    runtime is told so, with when, and what gives it credentials of its own."""
    import sys
    import time

    p, _ = per_job
    spec = _spec()
    assert results.results_plan(p.aws, spec, REGION).endswith(
        "the job's own IAM role writes them, with credentials AWS renews for its whole run)")
    p.settings.instance_profile = "cloudtrain-instance"
    assert results.results_plan(p.aws, spec, REGION).endswith("presigned POST, no keys)")
    # temporary credentials that end in 30 min (botocore's real provider chain: a
    # credential_process with an Expiration, as SSO and assumed roles have)
    script = tmp_path / "creds.py"
    script.write_text("import json\nprint(json.dumps({'Version': 1, 'AccessKeyId': 'ASIAX', "
                      "'SecretAccessKey': 's', 'SessionToken': 't', 'Expiration': %r}))\n"
                      % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 1800)))
    config = tmp_path / "config"
    config.write_text(f"[profile temp]\ncredential_process = {sys.executable} {script}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    from cloudtrain.config import Settings
    from cloudtrain.providers.aws import AWSProvider

    temp = AWSProvider(Settings(region=REGION, aws_profile="temp",
                                instance_profile="cloudtrain-instance"))
    line = results.results_plan(temp.aws, spec, REGION)
    assert line.startswith("WARNING: s3://") and "end in 30 min, before the job's 1 h max " \
        "runtime" in line and "instance_profile: per-job" in line, line
