"""A job's own IAM role (issue 36, providers/aws/job_role.py), evaluated as IAM evaluates it
(labs.iam: explicit deny wins, default deny, conditions, policy variables, the permissions
boundary): every key the instance's code reads or writes is allowed to job A's role, and
nothing of job B's, of another owner's, or of the bundle that pins the code a replacement
runs. The boundary (infra/iam-policy-job-boundary.json) alone holds a role the CLI could
make with any policy to its owner's job."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from labs.iam import Request, evaluate
from cloudtrain.host import agent_upload, job_records
from cloudtrain.host.bundle_reader import BUNDLE
from cloudtrain.host.checkpoint_manifest import LATEST, SLOTS, STREAM
from cloudtrain.providers.aws import job_role
from cloudtrain.providers.aws.errors import AWSError
from cloudtrain.providers.aws.group_launch import BOOT_TAR

ACCOUNT = "123456789012"
REGION = "us-east-1"
BUCKET = f"cloudtrain-{ACCOUNT}-{REGION}"
OWNER = f"arn:aws:iam::{ACCOUNT}:user/alice"
OWNER_KEY = "AIDAALICE0000000001"
A, B = "aaaa1111", "bbbb2222"
INSTANCE = "i-0123456789abcdef0"


def _prefix(job: str, owner_key: str = OWNER_KEY) -> str:
    return f"jobs/{owner_key}/{job}/"


def _policy(job: str = A, nodes: int = 1, datasets=(("my-data", "imagenet/"),)) -> dict:
    return job_role.role_policy(partition="aws", account=ACCOUNT, region=REGION, bucket=BUCKET,
                                prefix=_prefix(job), job_id=job, group=f"cloudtrain-{job}",
                                datasets=list(datasets), nodes=nodes)


def _boundary() -> dict:
    text = (REPO / "infra" / "iam-policy-job-boundary.json").read_text()
    return json.loads(text.replace("DATASET_BUCKET", "my-data").replace("DATASET_PREFIX",
                                                                        "imagenet"))


def _session(job: str = A) -> dict:
    """The request context of a request signed with job `job`'s role credentials: the
    role's tags are its principal tags."""
    return {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalArn":
            f"arn:aws:iam::{ACCOUNT}:role/cloudtrain-jobs/{OWNER_KEY}/cloudtrain-job-{job}",
            "aws:PrincipalTag/cloudtrain:owner": OWNER,
            "aws:PrincipalTag/cloudtrain:owner-key": OWNER_KEY,
            "aws:PrincipalTag/cloudtrain:job": job}


def _s3(action: str, key: str, bucket: str = BUCKET, **context) -> Request:
    resource = f"arn:aws:s3:::{bucket}" + (f"/{key}" if action != "s3:ListBucket" else "")
    return Request(action, resource, {**_session(), "aws:ResourceAccount": ACCOUNT, **context})


def _decide(request: Request, policy: dict | None = None, boundary: bool = True) -> str:
    return evaluate([policy or _policy()], request, _boundary() if boundary else None)


def _reads(prefix: str) -> list[str]:
    """Every key the instance's code reads under its job's prefix: the boot archive and the
    bundle (bootstrap), each checkpoint slot (a replacement's restore), the records of each
    attempt (regroup, bootstrap)."""
    bundle = [prefix + BUNDLE + n for n in ("manifest.json", "files.tar", "start.sh",
                                            "job/job.json", "job/run.sh")]
    stream = [prefix + STREAM + LATEST] + [prefix + STREAM + s + "/model.pt" for s in SLOTS]
    records = [job_records.final_key(prefix), job_records.attempt_key(prefix, 2),
               job_records.member_key(prefix, 2, INSTANCE), job_records.ended_key(prefix, 2, 1),
               job_records.progress_key(prefix, 2)]
    return [prefix + BOOT_TAR] + bundle + stream + records


def _writes(prefix: str) -> list[str]:
    """Every key the instance's code writes: the results (agent_upload: the job's files,
    its checkpoints, a node's own under nodes/<i>/, the manifest last), the checkpoint
    stream, the job's records (final.json, attempts, members, ends, notices)."""
    files = [prefix + f for f in agent_upload.JOB_FILES] + [
        prefix + agent_upload.MANIFEST, prefix + "checkpoints/epoch_2/model.pt",
        prefix + "nodes/1/" + agent_upload.MANIFEST, prefix + "work/results/a.csv"]
    stream = [prefix + STREAM + LATEST] + [prefix + STREAM + s + "/model.pt" for s in SLOTS]
    records = [job_records.final_key(prefix), job_records.attempt_key(prefix, 3),
               job_records.member_key(prefix, 3, INSTANCE), job_records.ended_key(prefix, 3, 1),
               job_records.leaving_key(prefix, 3, 1), job_records.progress_key(prefix, 3)]
    return files + stream + records


# -- what job A's role may do: everything its instances do ----------------------------------


@pytest.mark.parametrize("key", _reads(_prefix(A)))
def test_issue36_every_key_the_instance_reads_is_allowed_to_its_job_s_role(key):
    assert _decide(_s3("s3:GetObject", key)) == "allow"


@pytest.mark.parametrize("key", _writes(_prefix(A)))
def test_RF1_every_key_the_instance_writes_is_allowed_to_its_job_s_role(key):
    """RF1: with the role, not a presigned POST, whatever the user's session does."""
    assert _decide(_s3("s3:PutObject", key)) == "allow"


def test_issue36_the_role_lists_its_attempts_and_nothing_else():
    folder = job_records.attempt_folder(_prefix(A), 2)
    assert _decide(_s3("s3:ListBucket", "", **{"s3:prefix": folder})) == "allow"
    for prefix in (_prefix(A), _prefix(B) + "attempts/2/", f"jobs/{OWNER_KEY}/", "jobs/"):
        assert _decide(_s3("s3:ListBucket", "", **{"s3:prefix": prefix})) != "allow", prefix


def test_issue36_the_role_reads_its_datasets_and_writes_nothing_there():
    key = "imagenet/shards/train-000001.tar"
    assert _decide(_s3("s3:GetObject", key, bucket="my-data")) == "allow"
    assert _decide(_s3("s3:PutObject", key, bucket="my-data")) != "allow"
    assert _decide(_s3("s3:GetObject", "other/secret.csv", bucket="my-data")) != "allow"


# -- what it may not: another job's anything, its own bundle -------------------------------


@pytest.mark.parametrize("key", _reads(_prefix(B)) + _reads(_prefix(A, "AIDABOB000000000001")))
def test_F40_job_a_s_role_reads_nothing_of_job_b_or_another_owner(key):
    """F40: every instance's role read every job's bundle, job.json (its write grant) and
    checkpoints; job A's own role reads nothing under job B's prefix, nor another
    owner's: by its own policy, and by the boundary, each alone."""
    assert _decide(_s3("s3:GetObject", key)) == "implicit-deny"
    assert _decide(_s3("s3:GetObject", key), boundary=False) == "implicit-deny"
    assert evaluate([WIDE], _s3("s3:GetObject", key), _boundary()) == "implicit-deny"


@pytest.mark.parametrize("key", _writes(_prefix(B)) + [_prefix(B) + BUNDLE + "start.sh"]
                         + _writes(_prefix(A, "AIDABOB000000000001")))
def test_F40_job_a_s_role_writes_nothing_under_job_b_s_prefix(key):
    """... nor under another owner's job of the same id."""
    assert _decide(_s3("s3:PutObject", key)) == "implicit-deny"
    assert _decide(_s3("s3:PutObject", key), boundary=False) == "implicit-deny"


@pytest.mark.parametrize("name", ["start.sh", "manifest.json", "files.tar", "job/job.json"])
def test_F40_the_role_never_rewrites_its_own_bundle(name):
    """The bundle is the code every replacement runs (its manifest also pinned by the
    launch template's user-data): the job's own role is denied writing it, explicitly."""
    key = _prefix(A) + BUNDLE + name
    assert _decide(_s3("s3:PutObject", key)) == "explicit-deny"
    assert _decide(_s3("s3:DeleteObject", key)) == "explicit-deny"


def _group(job: str, action: str, owner: str = OWNER, **sizes) -> Request:
    """An Auto Scaling request on `job`'s group; `sizes` the request's MinSize and MaxSize
    (its context's autoscaling: keys: AWS has none for DesiredCapacity)."""
    arn = (f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:"
           f"0b1c2d3e-0000-4000-8000-000000000000:autoScalingGroupName/cloudtrain-{job}")
    return Request(action, arn, {**_session(), "aws:ResourceTag/cloudtrain:owner": owner,
                                 "aws:ResourceTag/cloudtrain:job": job,
                                 **{f"autoscaling:{k}": v for k, v in sizes.items()}})


def test_F44_the_role_ends_its_own_group_and_only_lowers_it_to_zero():
    """F44: the instance role could resize any cloudtrain group upward, or revive one its
    deadline emptied. Job A's role deletes its own group, sets it to 0 (all three sizes),
    and nothing else."""
    assert _decide(_group(A, "autoscaling:DeleteAutoScalingGroup")) == "allow"
    assert _decide(_group(A, "autoscaling:UpdateAutoScalingGroup", MinSize=0,
                          MaxSize=0)) == "allow"
    for sizes in ({"MinSize": 0, "MaxSize": 4}, {"MaxSize": 0}, {"MinSize": 0}, {}):
        assert _decide(_group(A, "autoscaling:UpdateAutoScalingGroup", **sizes)) != "allow", \
            sizes


@pytest.mark.parametrize("action", ["autoscaling:DeleteAutoScalingGroup",
                                    "autoscaling:UpdateAutoScalingGroup"])
def test_F44_job_a_s_role_cannot_touch_job_b_s_group(action):
    sizes = {"MinSize": 0, "MaxSize": 0}
    assert _decide(_group(B, action, **sizes)) == "implicit-deny"
    assert _decide(_group(B, action, **sizes), boundary=False) == "implicit-deny"


@pytest.mark.parametrize("named", [
    {"MinSize": 1, "MaxSize": 4}, {"MaxSize": 8}, {"InstanceTypes": ["p5.48xlarge"]},
    {"VPCZoneIdentifiers": ["subnet-0123"]}, {"LaunchTemplateVersionSpecified": "true"},
    {"LaunchTemplateVersionSpecified": "false"}, {"LaunchConfigurationName": "other"}])
def test_issue38_a_deadline_job_s_role_sets_its_own_group_to_on_demand_and_nothing_more(named):
    """Issue 38: the role of a spot job with a deadline may update its own group where the
    update names no size, type, subnet, launch template or configuration (the switch to
    on-demand names only the instances distribution); any update that names one of them is
    refused, so the instance cannot grow the group, change its type or send it elsewhere.
    Without a deadline (job_role's default) there is no such update; job B's group never."""
    policy = job_role.role_policy(partition="aws", account=ACCOUNT, region=REGION,
                                  bucket=BUCKET, prefix=_prefix(A), job_id=A,
                                  group=f"cloudtrain-{A}", datasets=[], nodes=1, deadline=True)
    update = "autoscaling:UpdateAutoScalingGroup"
    assert _decide(_group(A, update), policy) == "allow"
    assert _decide(_group(A, update, **named), policy) != "allow", named
    assert _decide(_group(A, update)) != "allow"  # the policy of a job without a deadline
    assert _decide(_group(B, update), policy) == "implicit-deny"


def test_issue36_the_role_deletes_its_own_launch_template_only():
    def template(job: str, owner: str = OWNER) -> Request:
        return Request("ec2:DeleteLaunchTemplate",
                       f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/lt-0123456789abcdef0",
                       {**_session(), "aws:ResourceTag/cloudtrain:job": job,
                        "aws:ResourceTag/cloudtrain:owner": owner})

    assert _decide(template(A)) == "allow"
    assert _decide(template(B)) == "implicit-deny"
    assert _decide(template(A, owner="arn:aws:iam::123456789012:user/bob")) == "implicit-deny"


@pytest.mark.parametrize("action, resource", [
    ("ec2:TerminateInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{INSTANCE}"),
    ("ec2:RunInstances", "*"), ("autoscaling:CreateAutoScalingGroup", "*"),
    ("ec2:CreateLaunchTemplateVersion", "*"), ("iam:PassRole", "*"),
    ("s3:DeleteObject", f"arn:aws:s3:::{BUCKET}/{_prefix(B)}final.json"),
    ("ec2:DescribeInstances", "*"), ("ec2:DescribeLaunchTemplateVersions", "*")])
def test_issue36_a_single_node_job_s_role_does_nothing_else(action, resource):
    """A stolen credential of a one-node job is worth that job: no instance of anyone's is
    terminated or started, no group made, no role passed, nothing of other jobs deleted,
    and nothing of the account described."""
    assert _decide(Request(action, resource, _session())) == "implicit-deny"


def test_issue36_only_a_job_on_several_nodes_asks_ec2_about_instances():
    """regroup asks EC2 which of its peers run: the one account-wide read, and only on the
    role of a job on several nodes (IAM cannot narrow DescribeInstances to resources)."""
    describe = Request("ec2:DescribeInstances", "*", _session())
    assert _decide(describe, _policy(nodes=3)) == "allow"
    assert _decide(describe, _policy(nodes=1)) == "implicit-deny"


# -- the boundary alone: no role the CLI makes holds more -----------------------------------


WIDE = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*",
                                                "Resource": "*"}]}


@pytest.mark.parametrize("request_", [
    _s3("s3:GetObject", _prefix(B) + "bundle/job/job.json"),
    _s3("s3:PutObject", _prefix(B) + "stream/latest.json"),
    _s3("s3:GetObject", _prefix(A, "AIDABOB000000000001") + "final.json"),
    _s3("s3:GetObject", "secret/payroll.csv", bucket="company-data"),
    _group(B, "autoscaling:DeleteAutoScalingGroup"),
    _group(A, "autoscaling:UpdateAutoScalingGroup", MinSize=0, MaxSize=8),
    _group(A, "autoscaling:DeleteAutoScalingGroup", owner="arn:aws:iam::123456789012:user/bob"),
    Request("iam:CreateRole", "arn:aws:iam::123456789012:role/admin", _session()),
    Request("ec2:RunInstances", "*", _session()),
], ids=["B-bundle", "B-stream", "bob-final", "other-bucket", "B-group", "A-group-up",
        "bob-group", "iam", "run"])
def test_issue36_the_boundary_holds_a_role_with_any_policy_to_its_own_job(request_):
    """The CLI may create roles (iam-policy-job-roles.json) only with this boundary: were
    it to give a role `*` on `*`, the role could still reach only its owner's job (its
    tags), never another job's prefix or group, another owner's, or anything else."""
    assert evaluate([WIDE], request_, _boundary()) == "implicit-deny"
    assert evaluate([WIDE], request_) == "allow"  # the boundary is what refuses it


def test_issue36_the_boundary_allows_what_the_job_s_own_policy_does():
    """Nothing the instance needs is lost to the boundary: each of its reads and writes is
    still allowed with both."""
    for key in _reads(_prefix(A)):
        assert _decide(_s3("s3:GetObject", key)) == "allow", key
    for key in _writes(_prefix(A)):
        assert evaluate([_policy()], _s3("s3:PutObject", key), _boundary()) == "allow", key


# -- the CLI's policy to make them ------------------------------------------------------------


CLI = json.loads((REPO / "infra" / "iam-policy-job-roles.json").read_text())
BOUNDARY_ARN = f"arn:aws:iam::{ACCOUNT}:policy/cloudtrain-job-boundary"


def _caller(**context) -> dict:
    return {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalArn": OWNER, "aws:userid": OWNER_KEY,
            **context}


def _create(path_owner: str = OWNER_KEY, boundary: str | None = BOUNDARY_ARN,
            tags: dict | None = None) -> Request:
    tags = {"cloudtrain:owner": OWNER, "cloudtrain:owner-key": OWNER_KEY,
            "cloudtrain:job": A} if tags is None else tags
    context = _caller(**{f"aws:RequestTag/{k}": v for k, v in tags.items()})
    context["aws:TagKeys"] = list(tags)
    if boundary:
        context["iam:PermissionsBoundary"] = boundary
    return Request("iam:CreateRole", f"arn:aws:iam::{ACCOUNT}:role/cloudtrain-jobs/"
                   f"{path_owner}/cloudtrain-job-{A}", context)


def test_issue36_the_cli_creates_a_job_role_only_under_the_boundary_as_itself():
    """iam:CreateRole only in the caller's own path, only with the boundary, only tagged
    with the caller's own ARN and owner key (the boundary scopes the role by them)."""
    assert evaluate([CLI], _create()) == "allow"
    refused = {
        "no boundary": _create(boundary=None),
        "another boundary": _create(boundary=f"arn:aws:iam::{ACCOUNT}:policy/AdminAccess"),
        "another owner's path": _create(path_owner="AIDABOB000000000001"),
        "another owner key": _create(tags={"cloudtrain:owner": OWNER, "cloudtrain:job": A,
                                           "cloudtrain:owner-key": "AIDABOB000000000001"}),
        "another owner": _create(tags={"cloudtrain:owner": "arn:aws:iam::1:user/bob",
                                       "cloudtrain:owner-key": OWNER_KEY,
                                       "cloudtrain:job": A}),
        "an extra tag": _create(tags={"cloudtrain:owner": OWNER, "cloudtrain:job": A,
                                      "cloudtrain:owner-key": OWNER_KEY, "team": "x"}),
    }
    for why, request in refused.items():
        assert evaluate([CLI], request) == "implicit-deny", why


@pytest.mark.parametrize("action", ["iam:PutRolePolicy", "iam:DeleteRolePolicy"])
def test_issue36_the_cli_sets_a_job_role_s_policy_only_on_a_role_under_the_boundary(action):
    role = f"arn:aws:iam::{ACCOUNT}:role/cloudtrain-jobs/{OWNER_KEY}/cloudtrain-job-{A}"
    assert evaluate([CLI], Request(action, role, _caller(
        **{"iam:PermissionsBoundary": BOUNDARY_ARN}))) == "allow"
    assert evaluate([CLI], Request(action, role, _caller())) == "implicit-deny"
    other = role.replace(OWNER_KEY, "AIDABOB000000000001")
    assert evaluate([CLI], Request(action, other, _caller(
        **{"iam:PermissionsBoundary": BOUNDARY_ARN}))) == "implicit-deny"


@pytest.mark.parametrize("action, kind", [
    ("iam:PassRole", "role"), ("iam:DeleteRole", "role"),
    ("iam:DeleteInstanceProfile", "instance-profile"),
    ("iam:RemoveRoleFromInstanceProfile", "instance-profile"),
    ("iam:AddRoleToInstanceProfile", "instance-profile")])
def test_issue36_the_cli_passes_and_deletes_only_its_own_job_roles(action, kind):
    """Another user of the account holding the same policy can neither pass your job's role
    to an instance of theirs nor delete it: each owner's roles are in their own path."""
    mine = f"arn:aws:iam::{ACCOUNT}:{kind}/cloudtrain-jobs/{OWNER_KEY}/cloudtrain-job-{A}"
    context = _caller(**{"iam:PassedToService": "ec2.amazonaws.com"})
    assert evaluate([CLI], Request(action, mine, context)) == "allow"
    bob = _caller(**{"aws:userid": "AIDABOB000000000001",
                     "aws:PrincipalArn": "arn:aws:iam::123456789012:user/bob",
                     "iam:PassedToService": "ec2.amazonaws.com"})
    assert evaluate([CLI], Request(action, mine, bob)) == "implicit-deny"
    if action == "iam:PassRole":
        assert evaluate([CLI], Request(action, mine, _caller(
            **{"iam:PassedToService": "lambda.amazonaws.com"}))) == "implicit-deny"


# -- launching while IAM catches up ------------------------------------------------------------


class _Aws:
    def __init__(self, profile: str):
        from cloudtrain.config import Settings

        self.settings = Settings(instance_profile=profile)


class _Job:
    id = A
    keeps_instance = False

    class spec:  # noqa: N801 - a stand-in for the job's spec
        kept = None


def _flaky(failures: int, message: str):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= failures:
            raise AWSError(message, code="InvalidParameterValue")
        return "launched"
    return call, calls


UNKNOWN = ("Value (cloudtrain-job-aaaa1111) for parameter iamInstanceProfile.name is invalid. "
           "Invalid IAM Instance Profile name")


def test_issue36_a_launch_waits_out_iam_s_delay_for_the_new_profile():
    """IAM is eventually consistent: EC2 refuses a profile made seconds ago ("Invalid IAM
    Instance Profile name"). The launch asks again (1, 2, 4 s ...), within PROPAGATION_S."""
    call, calls = _flaky(3, UNKNOWN)
    slept: list[float] = []
    clock = iter(range(0, 1000)).__next__
    got = job_role.launch_retry(_Aws(job_role.PER_JOB), _Job(), call, clock=clock,
                                sleep=slept.append)
    assert got == "launched" and len(calls) == 4 and slept == [1.0, 2.0, 4.0]


def test_issue36_the_wait_for_the_profile_is_bounded_and_other_errors_are_not_retried():
    call, calls = _flaky(100, UNKNOWN)
    now = [0.0]

    def sleep(s):
        now[0] += s

    with pytest.raises(AWSError, match="Invalid IAM Instance Profile"):
        job_role.launch_retry(_Aws(job_role.PER_JOB), _Job(), call, clock=lambda: now[0],
                              sleep=sleep)
    assert now[0] <= job_role.PROPAGATION_S and len(calls) > 3
    for profile, message in ((job_role.PER_JOB, "VcpuLimitExceeded: no more vCPUs"),
                             ("cloudtrain-instance", UNKNOWN)):
        call, calls = _flaky(1, message)
        with pytest.raises(AWSError):
            job_role.launch_retry(_Aws(profile), _Job(), call, sleep=sleep)
        assert len(calls) == 1, (profile, message)


def test_issue36_an_owner_that_cannot_be_an_iam_path_is_said_in_one_line():
    from cloudtrain.errors import CloudtrainError

    assert job_role.role_path("AROAEXAMPLE:alice@example.com") == \
        "/cloudtrain-jobs/AROAEXAMPLE:alice@example.com/"
    for bad in ("", "a/b", "caf\u00e9", "a b"):
        with pytest.raises(CloudtrainError, match="cannot make an IAM path"):
            job_role.role_path(bad)


def test_issue38_a_spot_job_with_a_budget_may_read_the_spot_price_and_no_other_job_may():
    """A spot job whose instances keep a budget read their AZ's spot price
    (DescribeSpotPriceHistory, which IAM cannot narrow to resources); the boundary allows it;
    a job without a budget, or on demand, is not given it."""
    from cloudtrain.providers.aws.job_role import role_policy

    def actions(**kw) -> set:
        doc = role_policy(partition="aws", account="123456789012", region="us-east-1",
                          bucket="cloudtrain-b", prefix="jobs/K/ab12cd34/", job_id="ab12cd34",
                          group="cloudtrain-ab12cd34", datasets=[], nodes=1, **kw)
        return {a for st in doc["Statement"] for a in (
            st["Action"] if isinstance(st["Action"], list) else [st["Action"]])}

    assert "ec2:DescribeSpotPriceHistory" in actions(spot_budget=True)
    assert "ec2:DescribeSpotPriceHistory" not in actions()
    boundary = json.loads((REPO / "infra" / "iam-policy-job-boundary.json").read_text())
    assert any(st.get("Action") == "ec2:DescribeSpotPriceHistory" and st["Effect"] == "Allow"
               for st in boundary["Statement"])
