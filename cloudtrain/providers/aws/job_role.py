"""A job's own IAM role (issue 36): the credentials its instances and their replacements use,
which AWS issues to each instance and renews for as long as it runs, and which hold that
job's power only.

    PER_JOB                              the `instance_profile:` value that asks for one
    role_name(job_id)                    cloudtrain-job-<id>: the role and its instance profile
    role_path(owner_key)                 /cloudtrain-jobs/<owner key>/: each owner's own
    profile_name(aws, job)               what RunInstances and the launch template name (or None)
    job_role(aws, job)                   whether the job runs on a role of its own
    trust_policy(partition)              EC2 may assume it
    role_policy(...)                     its inline policy: the job's prefix, group, template
    boundary_arn(partition, account)     the permissions boundary every such role carries
    boundary_exists(aws, region)         whether the account has it (`check`)
    prepare(aws, store, job, spec)       made (again: safe), its name kept with the job first
    delete(aws, region, name)            the role and its profile gone; whether any was there
    exists(aws, region, name)            whether the role is there
    orphans(aws, region, owner_key, held)   the owner's job roles of no job in `held`

Why a role per job (infra/README.md says it for the person who sets it up): an EC2 role's
session carries no tag of its instance or job, so one shared role can only be scoped to every
job of the account; a role per job names its job's prefix, group and template in its policy,
and every role the CLI creates must carry the permissions boundary
(infra/iam-policy-job-boundary.json), which confines it to the creator's own prefix and
groups through the role's tags (`${aws:PrincipalTag/cloudtrain:owner-key}`), so the right to
create roles is not a way to more power. The role's tags are set at its creation only, by a
principal whose policy requires their values to be its own (iam-policy-job-roles.json).
Each owner's roles and profiles live under a path of their own (their aws:userid, as their
job store prefix), which that policy names as `${aws:userid}`: nobody else sharing the
account can pass, change or delete them.
"""

from __future__ import annotations

import json
import time

from ...config import PER_JOB_PROFILE
from ...errors import CloudtrainError
from ...market import Market
from ...state import Job, Store
from .errors import AWSError, aws_errors
from .session import AwsSession
from .tags import TAG_JOB, TAG_OWNER

PER_JOB = PER_JOB_PROFILE
ROLE_PATH = "/cloudtrain-jobs/"
ROLE_PREFIX = "cloudtrain-job-"
BOUNDARY_NAME = "cloudtrain-job-boundary"
POLICY_NAME = "job"  # the role's one inline policy
# The owner key (aws:userid) of whoever made the role: the job store prefix the boundary
# confines the role to (jobs/<owner key>/...).
TAG_OWNER_KEY = "cloudtrain:owner-key"
# IAM is eventually consistent: a profile made a moment ago is not yet one RunInstances or
# Auto Scaling accepts ("Invalid IAM Instance Profile name"). How long a launch retries that.
PROPAGATION_S = 60.0
GONE = "NoSuchEntity"


def role_name(job_id: str) -> str:
    return ROLE_PREFIX + job_id


def role_path(owner_key: str) -> str:
    """The IAM path of the owner's job roles and profiles (IAM: printable ASCII)."""
    if not owner_key or "/" in owner_key or not all("!" <= c <= "~" for c in owner_key):
        raise CloudtrainError(f"cannot make an IAM path of the owner {owner_key!r}")
    return f"{ROLE_PATH}{owner_key}/"


def job_role(aws: AwsSession, job: Job) -> bool:
    """Whether the job's instances run on a role of its own: `instance_profile: per-job`,
    for a job that starts its own instances (a --keep instance outlives its first job, so a
    job that keeps or reuses one takes the presigned upload grant instead)."""
    kept = bool(getattr(job.spec, "kept", None)) or job.keeps_instance
    return aws.settings.instance_profile == PER_JOB and not kept


def profile_name(aws: AwsSession, job: Job) -> str | None:
    """The instance profile the job's instances are launched with: its own, the one
    `instance_profile:` names, or None (no role: the presigned grant only)."""
    if aws.settings.instance_profile == PER_JOB:
        return role_name(job.id) if job_role(aws, job) else None
    return aws.settings.instance_profile or None


def boundary_arn(partition: str, account: str) -> str:
    return f"arn:{partition}:iam::{account}:policy/{BOUNDARY_NAME}"


def boundary_exists(aws: AwsSession, region: str) -> bool:
    """Read-only (`check`): whether the account has the boundary every job role carries
    (an administrator's one-time step: CreateRole refuses a boundary that is not there)."""
    partition, account = _arn_parts(aws.owner(region))
    try:
        with aws_errors(region, "iam"):
            aws.client("iam", region).get_policy(PolicyArn=boundary_arn(partition, account))
    except AWSError as exc:
        if exc.code == GONE:
            return False
        raise
    return True


def trust_policy() -> dict:
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "Ec2InstancesOfTheJob", "Effect": "Allow",
        "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


# AWS's condition keys of UpdateAutoScalingGroup that a request naming sizes, types, subnets,
# a launch template or a launch configuration carries: the switch to on-demand names none.
SWITCH_KEYS_ABSENT = ("autoscaling:MinSize", "autoscaling:MaxSize", "autoscaling:InstanceTypes",
                      "autoscaling:VPCZoneIdentifiers", "autoscaling:LaunchTemplateVersionSpecified",
                      "autoscaling:LaunchConfigurationName")


def role_policy(*, partition: str, account: str, region: str, bucket: str, prefix: str,
                job_id: str, group: str, datasets: list[tuple[str, str]], nodes: int,
                spot_budget: bool = False, deadline: bool = False) -> dict:
    """The role's inline policy: read and write the job's own prefix of the job store (its
    bundle read only), list its attempts, read its datasets (bucket, key prefix), end
    (delete, or set to 0) its own group, delete its own launch template; a job on several
    nodes also asks EC2 which of its peers run (DescribeInstances, which IAM cannot narrow
    to resources); a spot job with a budget reads its AZ's spot price (DescribeSpotPriceHistory,
    which neither can be narrowed), to count what it spends (host/budget.py); a spot job with
    a deadline sets its own group to on-demand once the switch is past (host/auto_scaling.py):
    an update that names no size, type, subnet, launch template or configuration (IAM's
    Null test on AWS's condition keys for UpdateAutoScalingGroup), so all it can change is
    how the group's own type is bought."""
    store = f"arn:{partition}:s3:::{bucket}"
    statements: list[dict] = [
        {"Sid": "ReadItsJob", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": f"{store}/{prefix}*"},
        # PutObject covers a multipart upload's parts; its abort is an action of its own.
        {"Sid": "WriteItsJob", "Effect": "Allow",
         "Action": ["s3:PutObject", "s3:AbortMultipartUpload"],
         "Resource": f"{store}/{prefix}*"},
        # The bundle is the code every replacement runs: written by the launch only.
        {"Sid": "NeverItsBundle", "Effect": "Deny", "Action": ["s3:PutObject", "s3:DeleteObject"],
         "Resource": f"{store}/{prefix}bundle/*"},
        {"Sid": "ListItsAttempts", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": store, "Condition": {"StringLike": {"s3:prefix": f"{prefix}attempts/*"}}},
        {"Sid": "EndItsGroup", "Effect": "Allow",
         "Action": "autoscaling:DeleteAutoScalingGroup", "Resource": _group_arn(
             partition, region, account, group)},
        {"Sid": "EmptyItsGroup", "Effect": "Allow",
         "Action": "autoscaling:UpdateAutoScalingGroup",
         "Resource": _group_arn(partition, region, account, group),
         # autoscaling:MinSize and MaxSize are AWS's only size keys (no DesiredCapacity);
         # AWS refuses a desired capacity above the maximum, so 0 and 0 is empty.
         "Condition": {"NumericEquals": {"autoscaling:MinSize": "0",
                                         "autoscaling:MaxSize": "0"}}},
        {"Sid": "DeleteItsLaunchTemplate", "Effect": "Allow", "Action": "ec2:DeleteLaunchTemplate",
         "Resource": f"arn:{partition}:ec2:{region}:{account}:launch-template/*",
         "Condition": {"StringEquals": {f"aws:ResourceTag/{TAG_JOB}": job_id}}},
    ]
    if datasets:
        statements.append({"Sid": "ReadItsDatasets", "Effect": "Allow", "Action": "s3:GetObject",
                           "Resource": sorted({f"arn:{partition}:s3:::{b}/{p}*"
                                               for b, p in datasets})})
    if nodes > 1:
        statements.append({"Sid": "SeeItsPeers", "Effect": "Allow",
                           "Action": "ec2:DescribeInstances", "Resource": "*"})
    if deadline:
        statements.append({
            "Sid": "SwitchItsGroupToOnDemand", "Effect": "Allow",
            "Action": "autoscaling:UpdateAutoScalingGroup",
            "Resource": _group_arn(partition, region, account, group),
            "Condition": {"Null": {k: "true" for k in SWITCH_KEYS_ABSENT}}})
    if spot_budget:
        statements.append({"Sid": "ReadItsSpotPrice", "Effect": "Allow",
                           "Action": "ec2:DescribeSpotPriceHistory", "Resource": "*"})
    return {"Version": "2012-10-17", "Statement": statements}


def _group_arn(partition: str, region: str, account: str, group: str) -> str:
    return (f"arn:{partition}:autoscaling:{region}:{account}:autoScalingGroup:*:"
            f"autoScalingGroupName/{group}")


def prepare(aws: AwsSession, store: Store, job: Job, spec, store_place: tuple[str, str, str],
            datasets: list[tuple[str, str]], group: str) -> str | None:
    """The job's role and instance profile, made under the boundary and tagged with the
    caller and the job (the name is kept with the job first, so that a launcher killed
    half-way leaves a record `down` follows); a role made before (a relaunch, a retried
    launch) is brought to this policy. None where the job takes no role of its own.
    `store_place`: (region, bucket, prefix) of the job's store."""
    if not job_role(aws, job):
        return None
    name = role_name(job.id)
    if store.job(job.id).facts.job_role != name:
        store.record_facts(job.id, job_role=name)
    region, bucket, prefix = store_place
    owner, owner_key = aws.owner(region), aws.owner_key(region)
    partition, account = _arn_parts(owner)
    path = role_path(owner_key)
    tags = [{"Key": TAG_OWNER, "Value": owner}, {"Key": TAG_OWNER_KEY, "Value": owner_key},
            {"Key": TAG_JOB, "Value": job.id}]
    policy = role_policy(partition=partition, account=account, region=aws.region(spec),
                         bucket=bucket, prefix=prefix, job_id=job.id, group=group,
                         datasets=datasets, nodes=int(spec.nodes or 1),
                         spot_budget=spec.budget_usd is not None
                         and spec.placement.market == Market.SPOT,
                         deadline=spec.deadline_at is not None
                         and spec.placement.market == Market.SPOT and int(spec.nodes or 1) == 1)
    iam = aws.client("iam", region)
    with aws_errors(region, "iam"):
        _made(lambda: iam.create_role(
            RoleName=name, Path=path, AssumeRolePolicyDocument=json.dumps(trust_policy()),
            PermissionsBoundary=boundary_arn(partition, account), Tags=tags,
            Description=f"cloudtrain job {job.id}: its instances' credentials"))
        iam.put_role_policy(RoleName=name, PolicyName=POLICY_NAME,
                            PolicyDocument=json.dumps(policy))
        _made(lambda: iam.create_instance_profile(InstanceProfileName=name, Path=path,
                                                  Tags=tags))
        roles = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"]
        if not any(r.get("RoleName") == name for r in roles):
            iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    return name


def _made(create) -> None:
    """create(), where one made before is as good."""
    try:
        create()
    except Exception as exc:  # botocore's ClientError; anything else raised as it is
        if getattr(exc, "response", {}).get("Error", {}).get("Code") != "EntityAlreadyExists":
            raise


def _arn_parts(arn: str) -> tuple[str, str]:
    """(partition, account) of an ARN."""
    parts = arn.split(":")
    if len(parts) < 6 or not parts[4]:
        raise CloudtrainError(f"cannot read the account of {arn!r}")
    return parts[1], parts[4]


def delete(aws: AwsSession, region: str, name: str) -> bool:
    """The role `name` and its instance profile deleted (its inline policies, and the role
    out of the profile, first: IAM refuses a role still in use); whether anything was
    there. Safe to run again. A role deleted under a running instance ends that instance's
    credentials at their next renewal: the job's instances go first (inventory.release)."""
    if not name.startswith(ROLE_PREFIX):
        raise CloudtrainError(f"{name!r} is not a cloudtrain job role")
    iam = aws.client("iam", region)
    found = False
    with aws_errors(region, "iam"):
        try:
            iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=name)
            found = True
        except Exception as exc:  # noqa: BLE001 - gone is done; the rest raised
            _raise_unless_gone(exc)
        for step in (lambda: iam.delete_instance_profile(InstanceProfileName=name),
                     lambda: iam.delete_role_policy(RoleName=name, PolicyName=POLICY_NAME),
                     lambda: iam.delete_role(RoleName=name)):
            try:
                step()
                found = True
            except Exception as exc:  # noqa: BLE001
                _raise_unless_gone(exc)
    return found


def exists(aws: AwsSession, region: str, name: str) -> bool:
    """Whether the role is there (a check's cleanup asks)."""
    try:
        with aws_errors(region, "iam"):
            aws.client("iam", region).get_role(RoleName=name)
        return True
    except AWSError as exc:
        if exc.code == GONE:
            return False
        raise


def _raise_unless_gone(exc: Exception) -> None:
    if getattr(exc, "response", {}).get("Error", {}).get("Code") != GONE:
        raise exc


def orphans(aws: AwsSession, region: str, owner_key: str, held: set[str]) -> list[dict]:
    """The owner's job roles (under their path) of no job in `held`: what `down --all`
    deletes. Each {id: role name, region, job, kind: "role"}."""
    iam = aws.client("iam", region)
    out = []
    with aws_errors(region, "iam"):
        for page in iam.get_paginator("list_roles").paginate(PathPrefix=role_path(owner_key)):
            for role in page.get("Roles", []):
                name = role["RoleName"]
                job = name[len(ROLE_PREFIX):]
                if name.startswith(ROLE_PREFIX) and job not in held:
                    out.append({"id": name, "region": region, "job": job, "kind": "role"})
    return out


def launch_retry(aws: AwsSession, job: Job, call, clock=time.monotonic, sleep=time.sleep):
    """call() (RunInstances, CreateAutoScalingGroup), tried again for up to PROPAGATION_S
    while AWS does not know the job's own new instance profile yet (IAM is eventually
    consistent: "Invalid IAM Instance Profile name" for seconds after it is made). A job
    on a shared profile, or none, is called once."""
    own = job_role(aws, job)
    until = clock() + PROPAGATION_S
    delay = 1.0
    while True:
        try:
            return call()
        except AWSError as exc:
            if not (own and _profile_unknown(exc)) or clock() + delay > until:
                raise
        sleep(delay)
        delay = min(delay * 2, 8.0)


def _profile_unknown(exc: AWSError) -> bool:
    text = exc.message.lower()
    return "instance profile" in text and ("invalid" in text or "not found" in text
                                           or "does not exist" in text)
