"""infra/iam-policy-cli.json enforces what the CLI promises (F8), and allows every AWS call the
provider package and the S3 job store make (F10: a missing action is a denied launch)."""

from __future__ import annotations

import csv
import json
import re

import botocore.session
import pytest

from conftest import REPO
from cloudtrain.providers.aws import job_role

# RE1: the CLI's policy is two managed policies (one holds 6,144 characters, and the first
# was near them): EC2 and the rest, and who calls and the job store's objects. A user attaches
# both; what they allow together is what is checked here.
CLI = json.loads((REPO / "infra" / "iam-policy-cli.json").read_text())
CLI_ACCOUNT = json.loads((REPO / "infra" / "iam-policy-cli-account.json").read_text())
POLICY = {"Version": CLI["Version"], "Statement": CLI["Statement"] + CLI_ACCOUNT["Statement"]}
# Datasets on snapshot volumes and in the user's own bucket (issue 12): a second managed
# policy (the first is near IAM's 6,144-character limit), attached beside it.
DATASETS = json.loads((REPO / "infra" / "iam-policy-datasets.json").read_text())
# Auto Scaling groups and their launch templates (issue 27): a third, beside the two.
AUTOSCALING = json.loads((REPO / "infra" / "iam-policy-autoscaling.json").read_text())
# A job's own IAM role (issue 36, `instance_profile: per-job`): made and deleted by the CLI
# under the permissions boundary; attached beside the others by whoever uses it.
JOB_ROLES = json.loads((REPO / "infra" / "iam-policy-job-roles.json").read_text())
# check --launch --recovery's AWS FIS experiments, and the role FIS acts with.
RECOVERY_CHECK = json.loads((REPO / "infra" / "iam-policy-recovery-check.json").read_text())
FIS_ROLE = json.loads((REPO / "infra" / "iam-policy-fis-role.json").read_text())
OWNER = "${aws:PrincipalArn}"
# The code the policy is for: the AWS provider package (the S3 job store is in it).
SOURCES = sorted((REPO / "cloudtrain" / "providers" / "aws").glob("*.py"))
SERVICES = ("ec2", "pricing", "sts", "ssm", "iam", "s3", "service-quotas", "autoscaling",
            "fis", "freetier")
# Where AWS names the IAM action differently from the API operation (Service Authorization
# Reference), and boto3 helpers that are not operations.
ACTION_OF = {
    "s3:HeadBucket": "s3:ListBucket", "s3:ListObjectsV2": "s3:ListBucket",
    "s3:PutBucketEncryption": "s3:PutEncryptionConfiguration",
    "s3:PutPublicAccessBlock": "s3:PutBucketPublicAccessBlock",
    "s3:PutBucketLifecycleConfiguration": "s3:PutLifecycleConfiguration",
    "s3:DeleteObjects": "s3:DeleteObject", "s3:HeadObject": "s3:GetObject",
}
HELPERS = {"download_file": "s3:GetObject", "upload_file": "s3:PutObject",
           "generate_presigned_post": "s3:PutObject", "generate_presigned_url": "s3:GetObject"}


def _statements(action: str, resource_type: str | None = None) -> list[dict]:
    out = []
    for s in POLICY["Statement"] + DATASETS["Statement"]:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
        if s["Effect"] == "Allow" and action in actions and (
                resource_type is None or any(f":{resource_type}/" in r for r in resources)):
            out.append(s)
    return out


def _only(action: str, resource_type: str) -> dict:
    found = _statements(action, resource_type)
    assert len(found) == 1, f"{action} on {resource_type}: {len(found)} statements"
    return found[0]["Condition"] if "Condition" in found[0] else {}


def _allowed(groups: dict | None = None) -> set[str]:
    """Everything the four policies allow: the job store's bucket settings are the store
    admin's (F32), the rest everyday; `groups` in place of the Auto Scaling policy."""
    groups = AUTOSCALING if groups is None else groups
    return {a for s in POLICY["Statement"] + DATASETS["Statement"] + STORE_ADMIN["Statement"]
            + groups["Statement"] + JOB_ROLES["Statement"] + RECOVERY_CHECK["Statement"]
            if s["Effect"] == "Allow"
            for a in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])}


def _calls() -> dict[str, set[str]]:
    """action -> files, for every AWS API operation named in the sources (as a method call or
    the method name `call()` is given)."""
    session = botocore.session.get_session()
    operations: dict[str, list[str]] = {}
    for service in SERVICES:
        model = session.get_service_model(service)
        prefix = model.signing_name if service != "s3" else "s3"
        for op in model.operation_names:
            operations.setdefault(botocore.xform_name(op), []).append(f"{prefix}:{op}")
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        for name in set(re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", path.read_text())):
            for action in ([HELPERS[name]] if name in HELPERS else operations.get(name, [])):
                found.setdefault(ACTION_OF.get(action, action), set()).add(path.name)
    return found


def test_F8_every_call_the_provider_makes_is_allowed():
    calls = _calls()
    assert {"ec2:RunInstances", "ec2:GetConsoleOutput", "pricing:GetProducts",
            "ec2:RevokeSecurityGroupIngress", "sts:GetCallerIdentity"} <= set(calls)
    missing = {a: sorted(files) for a, files in calls.items() if a not in _allowed()}
    assert missing == {}, f"actions the code calls but infra/iam-policy-cli.json lacks: {missing}"


def test_F8_run_instances_requires_imdsv2_gpu_types_and_the_owner_tag():
    cond = _only("ec2:RunInstances", "instance")
    assert cond["StringEquals"]["ec2:MetadataHttpTokens"] == "required"
    assert cond["StringEquals"]["aws:RequestTag/cloudtrain:owner"] == OWNER
    assert cond["NumericLessThanEquals"]["ec2:MetadataHttpPutResponseHopLimit"] == "1"
    with (REPO / "cloudtrain" / "data" / "aws-gpu-vms.csv").open() as f:
        families = {row["InstanceType"].split(".")[0] for row in csv.DictReader(f)}
    # The GPU families, the one small type `cloudtrain check --launch` starts (issue 25), and
    # the one its --nodes check starts (issue 37: a type a cluster placement group takes).
    from cloudtrain.launch_check import CHECK_TYPE
    from cloudtrain.launch_check_nodes import NODES_TYPE

    assert set(cond["StringLike"]["ec2:InstanceType"]) == {f"{f}.*" for f in families} | \
        {CHECK_TYPE, NODES_TYPE}
    assert not any(t in ("*", "*.*") for t in cond["StringLike"]["ec2:InstanceType"])


def test_F8_volumes_are_encrypted_and_tagged():
    cond = _only("ec2:RunInstances", "volume")
    assert cond["Bool"]["ec2:Encrypted"] == "true"
    assert cond["StringEquals"]["aws:RequestTag/cloudtrain:owner"] == OWNER


@pytest.mark.parametrize("kind", ["security-group", "key-pair"])
def test_F8_launch_uses_only_the_callers_own_group_and_key(kind):
    assert _only("ec2:RunInstances", kind)["StringEquals"] == {
        "aws:ResourceTag/cloudtrain:owner": OWNER}


def test_F8_images_are_amazons_or_listed_by_id():
    found = _statements("ec2:RunInstances", "image")
    unconditioned = [s for s in found if "Condition" not in s]
    assert all(r.split("/")[-1].startswith("ami-") for s in unconditioned
               for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]))
    (owned,) = [s for s in found if "Condition" in s]
    from cloudtrain.providers.aws import images

    # Amazon's (the DLAMI), and Canonical's account's (a Volta type's Ubuntu 24.04: RA2)
    assert owned["Condition"]["StringEquals"]["ec2:Owner"] == ["amazon",
                                                              images.CANONICAL_OWNER]


def test_RA2_the_cli_policy_lets_a_volta_job_run_canonicals_image_and_no_one_elses():
    """RA2: a p3 job runs Canonical's Ubuntu image; the shipped policy allowed only Amazon's
    images, so AWS would have refused the launch. Evaluated as IAM does (tests/labs/iam.py):
    RunInstances on an image owned by Canonical's account is allowed, one owned by another
    account is not."""
    from labs.iam import Request, evaluate

    from cloudtrain.providers.aws import images

    image = "arn:aws:ec2:us-east-1::image/ami-0123456789abcdef0"
    assert evaluate([POLICY], Request("ec2:RunInstances", image, {
        "ec2:Owner": images.CANONICAL_OWNER})) == "allow"
    assert evaluate([POLICY], Request("ec2:RunInstances", image, {
        "ec2:Owner": "111122223333"})) == "implicit-deny"


def test_RC7_the_cli_policy_lets_a_launch_go_into_a_reservation_and_read_it():
    """RC7: RunInstances into a capacity reservation is authorized on the reservation too
    (the capacity-reservation resource of RunInstances in EC2's service authorization
    reference); the launch reads the reservation (DescribeCapacityReservations) and, for a
    Capacity Block without --block-fee, today's offerings. Evaluated as IAM does."""
    from labs.iam import Request, evaluate

    reservation = "arn:aws:ec2:us-east-1:123456789012:capacity-reservation/cr-0123456789abcdef0"
    assert evaluate([POLICY], Request("ec2:RunInstances", reservation, {})) == "allow"
    for action in ("ec2:DescribeCapacityReservations", "ec2:DescribeCapacityBlockOfferings"):
        assert evaluate([POLICY], Request(action, "*", {})) == "allow"
    # nothing else is done to a reservation: no purchase, change or cancel
    for action in ("ec2:PurchaseCapacityBlock", "ec2:CancelCapacityReservation",
                   "ec2:ModifyCapacityReservation", "ec2:CreateCapacityReservation"):
        assert evaluate([POLICY], Request(action, reservation, {})) == "implicit-deny"


@pytest.mark.parametrize("action,kind", [
    ("ec2:TerminateInstances", "instance"), ("ec2:GetConsoleOutput", "instance"),
    ("ec2:DeleteSecurityGroup", "security-group"),
    ("ec2:AuthorizeSecurityGroupIngress", "security-group"),
    ("ec2:RevokeSecurityGroupIngress", "security-group"), ("ec2:DeleteKeyPair", "key-pair")])
def test_F8_destructive_calls_need_owner_tag_equality(action, kind):
    assert _only(action, kind)["StringEquals"] == {"aws:ResourceTag/cloudtrain:owner": OWNER}


@pytest.mark.parametrize("action,kind", [
    ("ec2:CreateSecurityGroup", "security-group"), ("ec2:ImportKeyPair", "key-pair")])
def test_F8_created_resources_carry_the_callers_owner_tag(action, kind):
    assert _only(action, kind)["StringEquals"]["aws:RequestTag/cloudtrain:owner"] == OWNER


def test_F8_no_allow_without_a_scope_except_read_only_calls():
    """`Resource: *` only for calls AWS offers no resource-level permission for."""
    for s in POLICY["Statement"] + DATASETS["Statement"] + AUTOSCALING["Statement"]:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        if s["Resource"] == "*":
            assert all(a.split(":")[1].startswith(("Describe", "Get")) for a in actions), s["Sid"]


# The job store (F32): each principal its own key prefix, jobs/<aws:userid>/<job>/ (jobstore.py).
OWN_PREFIX = "arn:aws:s3:::cloudtrain-*/jobs/${aws:userid}/*"
# Jobs stored before owner prefixes: jobs/<8-hex id>/, read-only (jobstore.OWNER_KEY is never
# 8 characters, so this pattern cannot reach an owner's prefix).
OLD_LAYOUT = "arn:aws:s3:::cloudtrain-*/jobs/????????/*"
BUCKET_SETTINGS = {"s3:CreateBucket", "s3:DeleteBucket", "s3:PutBucketPublicAccessBlock",
                   "s3:PutEncryptionConfiguration", "s3:PutBucketTagging", "s3:PutBucketPolicy",
                   "s3:PutLifecycleConfiguration"}
STORE_ADMIN = json.loads((REPO / "infra" / "iam-policy-store-admin.json").read_text())


def _listed(x) -> list:
    return x if isinstance(x, list) else [x]


def _store_problems(policy: dict) -> list[str]:
    """What in `policy` lets one principal reach another's job store objects (F32)."""
    problems = []
    for s in policy["Statement"]:
        actions = {a for a in _listed(s["Action"]) if a.startswith("s3:")}
        resources = _listed(s["Resource"])
        if s["Effect"] != "Allow" or not actions or not any("cloudtrain-" in r
                                                             for r in resources):
            continue
        sid = s.get("Sid", "?")
        if actions & BUCKET_SETTINGS:
            problems.append(f"{sid}: bucket settings in the everyday policy")
        for action in actions & {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}:
            allowed = {OWN_PREFIX} | ({OLD_LAYOUT} if action == "s3:GetObject" else set())
            if not set(resources) <= allowed or "Condition" in s:
                problems.append(f"{sid}: {action} on {resources}")
        if "s3:ListBucket" in actions:
            prefixes = s.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
            if resources != ["arn:aws:s3:::cloudtrain-*"] or set(_listed(prefixes or [])) - {
                    "jobs/${aws:userid}/*", "jobs/????????/*"} or not prefixes:
                problems.append(f"{sid}: s3:ListBucket beyond the caller's prefix")
    return problems


def test_F32_job_store_objects_only_under_the_callers_own_prefix():
    assert _store_problems(POLICY) == [] and _store_problems(DATASETS) == []
    writes = [s for s in POLICY["Statement"] if {"s3:PutObject", "s3:DeleteObject"} &
              set(_listed(s["Action"]))]
    assert writes and all(_listed(s["Resource"]) == [OWN_PREFIX] for s in writes)
    assert _statements("s3:GetObject") and _statements("s3:ListBucket")


@pytest.mark.parametrize("widen", ["objects", "list", "settings"])
def test_F32_the_check_fails_a_policy_without_the_owner_scope(widen):
    """The check above is not vacuous: the grants before F32 fail it."""
    policy = json.loads(json.dumps(POLICY))
    if widen == "objects":
        policy["Statement"].append({"Sid": "Old", "Effect": "Allow", "Action": [
            "s3:GetObject", "s3:PutObject"], "Resource": "arn:aws:s3:::cloudtrain-*/*"})
    elif widen == "list":
        policy["Statement"].append({"Sid": "Old", "Effect": "Allow", "Action": "s3:ListBucket",
                                    "Resource": "arn:aws:s3:::cloudtrain-*"})
    else:
        policy["Statement"].append({"Sid": "Old", "Effect": "Allow", "Action": [
            "s3:PutBucketPolicy"], "Resource": "arn:aws:s3:::cloudtrain-*"})
    assert _store_problems(policy) and _store_problems(policy)[0].startswith("Old:")


def test_F32_the_policy_prefix_is_the_one_the_store_writes():
    from fnmatch import fnmatchcase

    from cloudtrain.providers.aws import jobstore

    arn = "arn:aws:s3:::cloudtrain-123456789012-eu-west-1/"
    for owner in ("AIDAJQABLZS4A3QDU576Q", "AROA3X42LBCDUVY8K5WCZ:alice@example.com",
                  "123456789012", "123456789012:bob"):
        key = jobstore.job_prefix("ab12cd34", owner_key=owner) + "status.json"
        assert fnmatchcase(arn + key, OWN_PREFIX.replace("${aws:userid}", owner))
        assert not fnmatchcase(arn + key, OLD_LAYOUT)  # the old layout's read misses it
    old = jobstore.job_prefix("ab12cd34", owner_key=None) + "status.json"
    assert fnmatchcase(arn + old, OLD_LAYOUT)


def test_F32_bucket_settings_are_a_one_time_admin_step():
    everyday = {a for s in POLICY["Statement"] + DATASETS["Statement"]
                for a in _listed(s["Action"])}
    assert not everyday & BUCKET_SETTINGS
    admin = {a for s in STORE_ADMIN["Statement"] for a in _listed(s["Action"])}
    assert BUCKET_SETTINGS <= admin
    assert all(_listed(s["Resource"]) == ["arn:aws:s3:::cloudtrain-*"]
               for s in STORE_ADMIN["Statement"])


def test_F32_the_instance_role_has_no_bucket_grant():
    role = json.loads((REPO / "infra" / "instance-role-policy.json").read_text())
    assert "CLOUDTRAIN_BUCKET" not in json.dumps(role)
    # In S3 it only reads; besides, it only ends its job's group (issue 27, GROUP_END), sees
    # its peers (PEERS) and reads the spot price a budget is counted with (issue 38).
    assert {a for s in role["Statement"] for a in _listed(s["Action"])} - GROUP_END - PEERS == \
        {"s3:GetObject", "ec2:DescribeSpotPriceHistory"}


def test_F8_policy_fits_a_managed_policy():
    # IAM: a managed policy document is at most 6,144 characters, whitespace not counted.
    for doc in (CLI, CLI_ACCOUNT, DATASETS, STORE_ADMIN, AUTOSCALING):
        assert len("".join(json.dumps(doc, separators=(",", ":")).split())) <= 6144


def test_RE1_each_cli_policy_leaves_room_and_no_statement_is_in_both():
    """RE1: the CLI policy was 5,843 characters (then 6,037) of IAM's 6,144, with fixes to
    come that did not fit. Split in two, each keeps a quarter of the limit free, their
    statement ids are distinct, and the hints name the file that allows a refused action."""
    from cloudtrain.providers.aws.errors import policy_file

    sizes = [len("".join(json.dumps(doc, separators=(",", ":")).split()))
             for doc in (CLI, CLI_ACCOUNT)]
    assert all(size <= 6144 * 3 // 4 for size in sizes), sizes
    sids = [st["Sid"] for st in POLICY["Statement"]]
    assert len(sids) == len(set(sids))
    for doc, name in ((CLI, "infra/iam-policy-cli.json"),
                      (CLI_ACCOUNT, "infra/iam-policy-cli-account.json")):
        for st in doc["Statement"]:
            for action in _listed(st["Action"]):
                assert policy_file(action) == name, (action, name)
    for st in STORE_ADMIN["Statement"]:
        for action in set(_listed(st["Action"])) - {"s3:ListBucket"}:
            assert policy_file(action) == "infra/iam-policy-store-admin.json", action


def test_issue12_data_volumes_are_encrypted_gp3_owner_tagged_and_only_own_ones_change():
    made = _only("ec2:CreateVolume", "volume")
    assert made["StringEquals"] == {"aws:RequestTag/cloudtrain:owner": OWNER,
                                    "ec2:VolumeType": "gp3"}
    assert made["Bool"] == {"ec2:Encrypted": "true"}
    for action, kind in (("ec2:AttachVolume", "volume"), ("ec2:DeleteVolume", "volume"),
                         ("ec2:AttachVolume", "instance"),
                         ("ec2:ModifyInstanceAttribute", "instance")):
        assert _only(action, kind)["StringEquals"] == {"aws:ResourceTag/cloudtrain:owner": OWNER}
    tagging = _only("ec2:CreateTags", "volume")["StringEquals"]
    assert "CreateVolume" in tagging["ec2:CreateAction"]


def test_issue12_the_instance_role_reads_datasets_and_writes_nothing_there():
    role = json.loads((REPO / "infra" / "instance-role-policy.json").read_text())
    (read,) = [s for s in role["Statement"] if "DATASET_BUCKET" in json.dumps(s["Resource"])]
    assert read["Action"] == "s3:GetObject"
    assert read["Resource"] == "arn:aws:s3:::DATASET_BUCKET/DATASET_PREFIX/*"
    dataset_statements = [s for s in DATASETS["Statement"] if "DATASET_BUCKET" in
                          json.dumps(s["Resource"])]
    assert all(r.startswith("arn:aws:s3:::DATASET_BUCKET") for s in dataset_statements
               for r in s["Resource"])


# -- Auto Scaling groups and launch templates (issue 27) ----------------------------------------

GROUP_ARN = "arn:aws:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/cloudtrain-*"
TEMPLATE_ARN = "arn:aws:ec2:*:*:launch-template/*"


def _group_statements(action: str) -> list[dict]:
    return [s for s in AUTOSCALING["Statement"] if s["Effect"] == "Allow"
            and action in _listed(s["Action"])]


def test_issue27_every_group_and_template_call_is_in_the_autoscaling_policy():
    calls = _calls()
    groups = {a for a in calls if a.startswith("autoscaling:") or "LaunchTemplate" in a}
    assert {"autoscaling:CreateAutoScalingGroup", "autoscaling:DeleteAutoScalingGroup",
            "autoscaling:PutScheduledUpdateGroupAction", "autoscaling:DescribeAutoScalingGroups",
            "ec2:CreateLaunchTemplate", "ec2:DeleteLaunchTemplate",
            "ec2:DescribeLaunchTemplates"} <= groups  # the scan sees groups.py
    assert all("groups.py" in calls[a] for a in groups if a.startswith("autoscaling:"))
    everyday = {a for s in AUTOSCALING["Statement"] for a in _listed(s["Action"])}
    assert groups <= everyday, f"not in infra/iam-policy-autoscaling.json: {groups - everyday}"


def test_F41_the_groups_scaling_activities_are_readable_as_the_other_group_lookups():
    """F41: an attempt whose instance EC2 no longer lists is the job's where the job's group's
    scaling activities show the group launched it (providers/aws/groups.py). The Service
    Authorization Reference gives DescribeScalingActivities no resource type (Resource "*"
    only): a read, in GroupsDiscovery beside DescribeAutoScalingGroups, with no condition."""
    action = "autoscaling:DescribeScalingActivities"
    assert "groups.py" in _calls().get(action, set())  # the code asks for them
    (s,) = _group_statements(action)
    assert s["Sid"] == "GroupsDiscovery" and s["Resource"] == "*" and "Condition" not in s
    assert "autoscaling:DescribeAutoScalingGroups" in s["Action"]
    missing = {a for a in _calls() if a not in _allowed({"Statement": [
        {**x, "Action": [a for a in _listed(x["Action"]) if a != action]}
        for x in AUTOSCALING["Statement"]]})}
    assert missing == {action}  # the check above fails a policy without it


@pytest.mark.parametrize("drop", ["all", "CreateGroupOwnerTag", "OwnGroupsDeadlineDelete",
                                  "CreateTemplateOwnerTag"])
def test_issue27_a_policy_without_the_group_statements_fails_the_check(drop):
    """The check above is not vacuous: without the new statements, calls are missing."""
    policy = {"Statement": [s for s in AUTOSCALING["Statement"]
                            if drop != "all" and s["Sid"] != drop]}
    missing = {a for a in _calls() if a not in _allowed(policy)}
    assert missing
    if drop == "all":
        assert {"autoscaling:CreateAutoScalingGroup", "ec2:CreateLaunchTemplate"} <= missing


@pytest.mark.parametrize("action,resource", [
    ("autoscaling:CreateAutoScalingGroup", GROUP_ARN), ("ec2:CreateLaunchTemplate", TEMPLATE_ARN),
    ("autoscaling:CreateOrUpdateTags", GROUP_ARN)])
def test_issue27_groups_and_templates_are_created_with_the_callers_owner_and_a_job(action,
                                                                                   resource):
    (s,) = _group_statements(action)
    assert _listed(s["Resource"]) == [resource]
    assert s["Condition"]["StringEquals"]["aws:RequestTag/cloudtrain:owner"] == OWNER
    assert s["Condition"]["Null"] == {"aws:RequestTag/cloudtrain:job": "false"}


@pytest.mark.parametrize("action,resource", [
    ("autoscaling:DeleteAutoScalingGroup", GROUP_ARN),
    ("autoscaling:PutScheduledUpdateGroupAction", GROUP_ARN),
    ("ec2:DeleteLaunchTemplate", TEMPLATE_ARN), ("ec2:RunInstances", TEMPLATE_ARN),
    ("ec2:CreateLaunchTemplateVersion", TEMPLATE_ARN)])
def test_issue27_only_the_callers_own_groups_and_templates_change(action, resource):
    (s,) = _group_statements(action)
    assert _listed(s["Resource"]) == [resource]
    assert s["Condition"]["StringEquals"] == {"aws:ResourceTag/cloudtrain:owner": OWNER}


def test_issue27_template_tags_only_at_creation_and_the_role_only_to_ec2():
    """Template tags only in the call that makes it; RD8 (confirmed against the Auto Scaling
    API permissions page): passing the instance role to EC2 only is what a group's template
    naming its profile needs, and the first group's service-linked role is Auto Scaling's."""
    (tags,) = _group_statements("ec2:CreateTags")
    assert tags["Condition"]["StringEquals"]["ec2:CreateAction"] == "CreateLaunchTemplate"
    assert tags["Condition"]["StringEquals"]["aws:RequestTag/cloudtrain:owner"] == OWNER
    # A template that names the instance profile is passed by the group's creator: the CLI
    # policy's PassRole, for that one role and to EC2 only, covers it.
    (passing,) = _statements("iam:PassRole")
    assert _listed(passing["Resource"]) == ["arn:aws:iam::*:role/cloudtrain-instance"]
    assert passing["Condition"]["StringEquals"] == {"iam:PassedToService": "ec2.amazonaws.com"}
    (linked,) = _group_statements("iam:CreateServiceLinkedRole")
    assert linked["Condition"]["StringEquals"] == {
        "iam:AWSServiceName": "autoscaling.amazonaws.com"}


ROLE = json.loads((REPO / "infra" / "instance-role-policy.json").read_text())
BUNDLE_READ = {"arn:aws:s3:::cloudtrain-*/jobs/*/bundle/*",
               "arn:aws:s3:::cloudtrain-*/jobs/*/stream/*"}
# A replacement reads the job's end and counts its attempts (host/bootstrap.py).
RECORDS_READ = {"arn:aws:s3:::cloudtrain-*/jobs/*/final.json",
                "arn:aws:s3:::cloudtrain-*/jobs/*/attempts/*"}


def _bundle_problems(role: dict) -> list[str]:
    """Why an instance role cannot start a job from its bundle (issue 27), or reads more than
    the job store's bundles and checkpoint slots of its own account."""
    reads = [s for s in role["Statement"] if s["Effect"] == "Allow"
             and any(r.startswith("arn:aws:s3:::cloudtrain-") for r in _listed(s["Resource"]))
             and s.get("Sid") != "ListJobAttempts"]
    if not reads:
        return ["no statement reads the job store's bundles"]
    problems = []
    for s in reads:
        if _listed(s["Action"]) != ["s3:GetObject"]:
            problems.append(f"{s.get('Sid')}: {s['Action']} beyond s3:GetObject")
        if set(_listed(s["Resource"])) - BUNDLE_READ - RECORDS_READ:
            problems.append(f"{s.get('Sid')}: objects beyond bundle/, stream/, final.json "
                            "and attempts/")
        if s.get("Condition") != {"StringEquals": {
                "aws:ResourceAccount": "${aws:PrincipalAccount}"}}:
            problems.append(f"{s.get('Sid')}: buckets of other accounts")
    readable = {r for s in reads for r in _listed(s["Resource"])}
    if BUNDLE_READ - readable:
        problems.append("bundle/ or stream/ not readable")
    if RECORDS_READ - readable:
        problems.append("final.json or attempts/ not readable")
    return problems


GROUP_END = {"autoscaling:DeleteAutoScalingGroup", "autoscaling:UpdateAutoScalingGroup",
             "ec2:DeleteLaunchTemplate"}
GROUP_RESOURCES = {"autoscaling": GROUP_ARN, "ec2": TEMPLATE_ARN}


# The sizes host/auto_scaling.end_group sets a group to, each 0: all the role may set (F44).
# AWS has condition keys for the minimum and maximum only (autoscaling:MinSize, MaxSize; the
# Service Authorization Reference lists no DesiredCapacity, and a condition on a key that is
# never in the request never holds); a desired capacity above the maximum is refused.
EMPTY_GROUP = ("MinSize", "MaxSize")


def _group_end_problems(role: dict) -> list[str]:
    """Why an instance role cannot end its job's group (host/auto_scaling.end_group), or may
    change more than groups and launch templates tagged as cloudtrain's jobs'."""
    problems, found = [], set()
    for s in role["Statement"]:
        actions = set(_listed(s["Action"]))
        if s["Effect"] != "Allow" or not actions & (GROUP_END | {"autoscaling:*", "ec2:*"}):
            continue
        if actions - GROUP_END:
            problems.append(f"{s.get('Sid')}: {sorted(actions - GROUP_END)} beyond ending a group")
        for action in actions & GROUP_END:
            if _listed(s["Resource"]) != [GROUP_RESOURCES[action.split(":")[0]]]:
                problems.append(f"{s.get('Sid')}: {action} on {s['Resource']}")
        tags = (s.get("Condition") or {}).get("Null") or {}
        if tags.get("aws:ResourceTag/cloudtrain:owner") != "false" or \
                tags.get("aws:ResourceTag/cloudtrain:job") != "false":
            problems.append(f"{s.get('Sid')}: not only resources tagged with an owner and a job")
        sizes = (s.get("Condition") or {}).get("NumericEquals") or {}
        # an update to sizes 0 (the end), or one that names no size, type, subnet or
        # template (issue 38: the switch to on-demand, which names only the distribution)
        switch = all(tags.get(k) == "true" for k in job_role.SWITCH_KEYS_ABSENT)
        if "autoscaling:UpdateAutoScalingGroup" in actions and not switch and any(
                sizes.get(f"autoscaling:{k}") != "0" for k in EMPTY_GROUP):
            problems.append(f"{s.get('Sid')}: UpdateAutoScalingGroup to sizes other than 0 (F44)")
        found |= actions & GROUP_END
    if GROUP_END - found:
        problems.append(f"not allowed: {sorted(GROUP_END - found)}")
    return problems


PEERS = {"s3:ListBucket", "ec2:DescribeInstances"}


def _peer_problems(role: dict) -> list[str]:
    """Why the nodes of a job on several nodes cannot meet again after a loss
    (host/regroup.py: they list attempts/<n>/ and ask EC2 whether a peer still runs), or
    may list more than the job store's attempts/."""
    by_sid = {s.get("Sid"): s for s in role["Statement"]}
    problems = []
    listing = by_sid.get("ListJobAttempts")
    if listing is None:
        problems.append("attempts/ cannot be listed")
    else:
        if _listed(listing["Action"]) != ["s3:ListBucket"] or \
                _listed(listing["Resource"]) != ["arn:aws:s3:::cloudtrain-*"]:
            problems.append("ListJobAttempts: more than listing the job stores")
        cond = listing.get("Condition") or {}
        if cond.get("StringLike") != {"s3:prefix": "jobs/*/attempts/*"}:
            problems.append("ListJobAttempts: prefixes beyond attempts/")
        if cond.get("StringEquals") != {"aws:ResourceAccount": "${aws:PrincipalAccount}"}:
            problems.append("ListJobAttempts: buckets of other accounts")
    peers = by_sid.get("SeeJobPeers")
    if peers is None or _listed(peers["Action"]) != ["ec2:DescribeInstances"]:
        problems.append("the peers' state cannot be asked, or more than that is allowed")
    for s in role["Statement"]:
        if s.get("Sid") not in ("ListJobAttempts", "SeeJobPeers") and \
                set(_listed(s["Action"])) & PEERS:
            problems.append(f"{s.get('Sid')}: {sorted(set(_listed(s['Action'])) & PEERS)}")
    return problems


def test_issue27_several_nodes_list_only_attempts_and_see_their_peers():
    """A node of a job on several nodes lists attempts/<n>/ (who has joined) and asks EC2
    whether a peer still runs: nothing else listed, and nothing but DescribeInstances."""
    assert _peer_problems(ROLE) == []
    from cloudtrain.host import job_records

    assert job_records.member_key("jobs/o/j/", 2, "i-0123456789abcdef0").startswith(
        "jobs/o/j/attempts/")


@pytest.mark.parametrize("change", ["without-list", "any-prefix", "any-account", "more",
                                    "without-describe"])
def test_issue27_the_check_fails_a_role_that_cannot_meet_or_lists_more(change):
    role = json.loads(json.dumps(ROLE))
    by_sid = {s["Sid"]: s for s in role["Statement"]}
    listing = by_sid["ListJobAttempts"]
    if change == "without-list":
        role["Statement"].remove(listing)
    elif change == "any-prefix":
        listing["Condition"]["StringLike"]["s3:prefix"] = "jobs/*"
    elif change == "any-account":
        del listing["Condition"]["StringEquals"]
    elif change == "more":
        listing["Action"] = ["s3:ListBucket", "s3:PutObject"]
    else:
        role["Statement"].remove(by_sid["SeeJobPeers"])
    assert _peer_problems(role)


def test_issue27_the_instance_role_reads_its_job_store_bundles_and_checkpoints_only():
    """An instance that starts its job alone reads bundle/ (host/bootstrap.py) and the
    checkpoint slots (stream/) with its role; nothing else of the job store, nothing written,
    only buckets of its own account."""
    assert _bundle_problems(ROLE) == []
    from cloudtrain.host import bootstrap, checkpoint_manifest

    assert bootstrap.BUNDLE == "bundle/" and checkpoint_manifest.STREAM == "stream/"


@pytest.mark.parametrize("change", ["without", "write", "everything", "any-account"])
def test_issue27_the_check_fails_a_role_without_the_bundle_read_or_with_more(change):
    role = json.loads(json.dumps(ROLE))
    (read,) = [s for s in role["Statement"] if s["Sid"] == "ReadJobBundlesAndCheckpoints"]
    if change == "without":
        role["Statement"].remove(read)
    elif change == "write":
        read["Action"] = ["s3:GetObject", "s3:PutObject"]
    elif change == "everything":
        read["Resource"] = ["arn:aws:s3:::cloudtrain-*/*"]
    else:
        del read["Condition"]
    assert _bundle_problems(role)


def test_issue27_the_instance_role_ends_only_tagged_job_groups_and_reads_their_records():
    """The agent at a job's end and a replacement that finds it over delete (or set to 0)
    the job's group and delete its launch template (host/auto_scaling.end_group); bootstrap
    reads final.json and attempts/ (host/bootstrap.take_attempt): nothing more."""
    from cloudtrain.host import job_records

    assert _group_end_problems(ROLE) == [] and _bundle_problems(ROLE) == []
    assert job_records.FINAL == "final.json" and job_records.ATTEMPTS == "attempts/"


@pytest.mark.parametrize("change", ["without-groups", "without-templates", "without-records",
                                    "untagged", "any-group", "more-actions", "resize-upward",
                                    "resize-unbounded", "template-versions", "switch-resizes",
                                    "switch-retypes", "switch-untagged"])
def test_issue27_the_check_fails_a_role_without_the_group_statements_or_with_more(change):
    """F44 among them: the role may set a group's sizes to 0 only; before, it could resize
    any cloudtrain group upward, or revive one its deadline had emptied. F40: a role that
    may add a version to a job's template could unpin the code its replacements run."""
    role = json.loads(json.dumps(ROLE))
    by_sid = {s["Sid"]: s for s in role["Statement"]}
    groups, templates = by_sid["EndJobGroups"], by_sid["DeleteJobLaunchTemplates"]
    if change == "resize-upward":
        by_sid["EmptyJobGroups"]["Condition"]["NumericEquals"]["autoscaling:MaxSize"] = "16"
    elif change == "resize-unbounded":
        del by_sid["EmptyJobGroups"]["Condition"]["NumericEquals"]
    elif change == "without-groups":
        role["Statement"].remove(groups)
    elif change == "without-templates":
        role["Statement"].remove(templates)
    elif change == "without-records":
        role["Statement"].remove(by_sid["ReadJobEndsAndAttempts"])
    elif change == "untagged":
        del templates["Condition"]
    elif change == "any-group":
        groups["Resource"] = "*"
    elif change.startswith("switch-"):  # issue 38: the switch to on-demand may do no more
        null = by_sid["SwitchJobGroupsToOnDemand"]["Condition"]["Null"]
        del null[{"switch-resizes": "autoscaling:MaxSize", "switch-retypes":
                  "autoscaling:InstanceTypes", "switch-untagged":
                  "aws:ResourceTag/cloudtrain:job"}[change]]
    elif change == "template-versions":
        templates["Action"] = _listed(templates["Action"]) + ["ec2:CreateLaunchTemplateVersion"]
    else:
        groups["Action"] = _listed(groups["Action"]) + ["autoscaling:CreateAutoScalingGroup"]
    assert _group_end_problems(role) or _bundle_problems(role)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "infra").glob("*.json")))
def test_RE5_every_shipped_policy_is_one_iam_creates(name, monkeypatch):
    """RE5: the CLI policy as shipped could not be created: a Resource that is a bare policy
    variable (`${aws:PrincipalArn}`) is not an ARN, and IAM's validation (moto's follows it)
    refused the document, so none of its statements ever reached an account. Each shipped
    document goes through IAM's CreatePolicy (the trust policy through CreateRole), and fits
    a managed policy's 6,144 characters (whitespace not counted)."""
    import boto3
    from moto import mock_aws

    for var, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    text = (REPO / "infra" / name).read_text()
    with mock_aws():
        iam = boto3.client("iam", region_name="us-east-1")
        if "trust" in name:
            made = iam.create_role(RoleName="cloudtrain-instance",
                                   AssumeRolePolicyDocument=text)["Role"]
        else:
            made = iam.create_policy(PolicyName=name[:-5], PolicyDocument=text)["Policy"]
        assert made["Arn"].startswith("arn:aws:iam::123456789012:")
    assert len(json.dumps(json.loads(text), separators=(",", ":"))) <= 6144


def test_RB4_the_launch_checks_role_probe_is_a_key_the_shipped_role_may_read():
    """RB4: `check --launch` put its role probe at jobs/<owner>/<name>-role/role-check.txt,
    which no GetObject statement of the shipped role names, so a least-privilege role was
    refused and the hint told the user to grant the whole bucket. The probe's key (as
    jobstore.put makes it) must match the role's own read statements (IAM's wildcards: `*`
    spans slashes), in the role's own account."""
    import fnmatch

    from cloudtrain import launch_check
    from cloudtrain.providers.aws import jobstore

    key = jobstore.job_prefix("check-20261203-1a2b-role", owner_key="AIDAEXAMPLEOWNER0001") \
        + launch_check.ROLE_KEY
    arn = f"arn:aws:s3:::cloudtrain-123456789012-us-east-1/{key}"
    reads = [s for s in ROLE["Statement"] if s["Effect"] == "Allow"
             and "s3:GetObject" in _listed(s["Action"])]
    matching = [s["Sid"] for s in reads
                if any(fnmatch.fnmatchcase(arn, r) for r in _listed(s["Resource"]))]
    assert matching == ["ReadJobBundlesAndCheckpoints"], (arn, matching)
    old = arn.replace("/bundle/", "/")  # where it was: no statement of the role reads it
    assert not [s for s in reads if any(fnmatch.fnmatchcase(old, r)
                                        for r in _listed(s["Resource"]))]


def test_RE4_the_cli_policy_lets_the_launch_list_and_read_the_dlami_parameters():
    """RE4: the DLAMI's SSM parameters are public, owned by no account
    (arn:aws:ssm:REGION::parameter/aws/service/...); the launch reads the newest one by
    path (RA1: GetParametersByPath) and falls back to one by name (GetParameter): the CLI
    policy allows both on that ARN, and the paths the code reads are under it."""
    from cloudtrain.providers.aws import images

    wanted = "arn:aws:ssm:*::parameter/aws/service/deeplearning/*"
    allowed = [s for s in POLICY["Statement"] if s["Effect"] == "Allow"
               and wanted in ([s["Resource"]] if isinstance(s["Resource"], str)
                              else s["Resource"])]
    actions = {a for s in allowed for a in ([s["Action"]] if isinstance(s["Action"], str)
                                            else s["Action"])}
    assert {"ssm:GetParameter", "ssm:GetParametersByPath"} <= actions, allowed
    for path in (images.DLAMI_PATH, images.DLAMI_PARAMETER):
        assert path.startswith("/aws/service/deeplearning/"), path


def test_RA2_the_cli_policy_lets_the_launch_read_canonicals_ubuntu_parameter():
    """RA2: a Volta type's job takes Canonical's Ubuntu 24.04 by its public SSM parameter
    (owned by no account, like the DLAMI's); the CLI policy allows GetParameter on it, and
    the path the code reads is under the ARN allowed."""
    import fnmatch

    from cloudtrain.providers.aws import images

    arn = f"arn:aws:ssm:us-east-1::parameter{images.UBUNTU_PARAMETER}"
    allowed = [s for s in POLICY["Statement"] if s["Effect"] == "Allow"
               and "ssm:GetParameter" in _listed(s["Action"])
               and any(fnmatch.fnmatchcase(arn, r) for r in _listed(s["Resource"]))]
    assert [s["Sid"] for s in allowed] == ["UbuntuIdFromSsm"]


def test_RD2_infra_readme_says_a_group_s_later_launches_are_its_service_linked_role_s():
    """RD2: infra/README said the group's instances were checked against the CLI policy's
    RunInstances statements as if the user had launched them; AWS checks the caller's
    permissions when the group is created or updated, and the group launches with its
    service-linked role (AWSServiceRoleForAutoScaling)."""
    text = " ".join((REPO / "infra" / "README.md").read_text().split())
    assert "as if you had launched them" not in text
    assert "When you create the group, AWS checks **your** `ec2:RunInstances`" in text
    assert "launched by Auto Scaling's service-linked role, not checked against your policy " \
           "again" in text


# -- issue 36: every policy linted with parliament ---------------------------------------------

# What parliament (1.6) reports on the shipped policies that is as intended, each said once:
# (file, finding) -> (how many, why it is right).
PER_RESOURCE_TYPE = ("one statement per resource type of the call (its conditions apply to that "
                     "type only: a single statement with them on every type would deny the "
                     "call), where parliament wants each statement to name every type")
LINT_EXPLAINED = {
    ("iam-policy-cli.json", "RESOURCE_MISMATCH"): (8, PER_RESOURCE_TYPE),
    ("iam-policy-autoscaling.json", "RESOURCE_MISMATCH"): (1, PER_RESOURCE_TYPE),
    ("iam-policy-datasets.json", "RESOURCE_MISMATCH"): (3, PER_RESOURCE_TYPE),
    ("iam-policy-recovery-check.json", "RESOURCE_MISMATCH"): (3, PER_RESOURCE_TYPE),
    ("iam-policy-cli-account.json", "UNKNOWN_ACTION"): (
        1, "freetier:GetAccountPlanState (RB5) is newer than parliament's action database: the "
           "Free Tier API's account plans came with the Free plan of July 2025 (botocore's "
           "freetier model has the operation)"),
    ("iam-policy-cli-account.json", "RESOURCE_MISMATCH"): (
        2, "AWS's public SSM parameters (the DLAMI's, Canonical's Ubuntu's) have an ARN with "
           "no account (arn:aws:ssm:REGION::parameter/aws/service/...), which parliament's "
           "format lacks"),
    ("iam-policy-job-boundary.json", "RESOURCE_MISMATCH"): (
        1, "the object ARN holds policy variables whose names contain ':' "
           "(${aws:PrincipalTag/cloudtrain:owner-key}), which parliament splits as ARN parts"),
    ("iam-policy-store-admin.json", "RESOURCE_POLICY_PRIVILEGE_ESCALATION"): (
        4, "the administrator's one-time step sets the bucket's own policy and lifecycle "
           "(TLS only, expiry): the power to write a bucket policy is the point of it"),
}


def _lint() -> dict[tuple[str, str], int]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # parliament imports pkg_resources
        import parliament
    found: dict[tuple[str, str], int] = {}
    for path in sorted((REPO / "infra").glob("*.json")):
        if "trust" in path.name:  # a trust policy (Principal): not an identity policy
            continue
        for finding in parliament.analyze_policy_string(path.read_text()).findings:
            key = (path.name, finding.issue)
            found[key] = found.get(key, 0) + 1
    return found


def test_issue36_every_policy_passes_parliament_or_each_finding_is_explained():
    """Every policy cloudtrain ships, linted with parliament: no finding beyond those said
    above. Its first run found a real one: `autoscaling:DesiredCapacity` is no condition
    key of AWS's (the Service Authorization Reference has MinSize and MaxSize only), so the
    instance role's statement emptying its group, conditioned on it, could never apply on
    AWS; it now asks MinSize and MaxSize 0 (AWS refuses a desired capacity above the
    maximum)."""
    assert _lint() == {k: n for k, (n, _) in LINT_EXPLAINED.items()}


def test_issue36_the_lint_is_not_vacuous():
    """A policy with a condition key AWS does not have is found (the DesiredCapacity
    mistake), and so is an action that does not exist."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import parliament
    bad = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "autoscaling:UpdateAutoScalingGroup",
         "Resource": "arn:aws:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/x",
         "Condition": {"NumericEquals": {"autoscaling:DesiredCapacity": "0"}}},
        {"Effect": "Allow", "Action": "s3:GetObjekt", "Resource": "arn:aws:s3:::b/*"}]}
    issues = {f.issue for f in parliament.analyze_policy_string(json.dumps(bad)).findings}
    assert {"UNKNOWN_CONDITION_FOR_ACTION", "UNKNOWN_ACTION"} <= issues


def test_issue36_a_refused_job_role_action_names_the_job_roles_policy():
    """The hint of a refused call names the file that allows it. iam:PassRole is in both
    (the shared role's and the job roles'): its hint stays the CLI policy's, and a user
    without the job roles' policy is refused CreateRole, named here, before any PassRole."""
    from cloudtrain.providers.aws.errors import policy_file

    for st in JOB_ROLES["Statement"]:
        for action in set(_listed(st["Action"])) - {"iam:PassRole"}:
            assert policy_file(action) == "infra/iam-policy-job-roles.json", action


# -- check --launch --recovery: AWS FIS on one's own spot instances ------------------------------

FIS_ME = "arn:aws:iam::123456789012:user/alice"
FIS_OTHER = "arn:aws:iam::123456789012:user/bob"


def _fis(action: str, resource: str, **context) -> str:
    from labs.iam import Request, evaluate

    return evaluate([RECOVERY_CHECK], Request(action, resource, dict(
        {"aws:PrincipalArn": FIS_ME}, **context)))


def _fis_calls(owner_tags: dict) -> list[tuple[str, str, dict]]:
    """The requests the check makes (providers/aws/fis.py), in IAM's terms: the action, the
    resource and the condition keys AWS sets (the Service Authorization Reference for FIS)."""
    request_tags = {f"aws:RequestTag/{k}": v for k, v in owner_tags.items()}
    request_tags["aws:TagKeys"] = sorted(owner_tags)
    mine = {f"aws:ResourceTag/{k}": v for k, v in owner_tags.items()}
    template = "arn:aws:fis:us-east-1:123456789012:experiment-template/EXT1"
    experiment = "arn:aws:fis:us-east-1:123456789012:experiment/EXP1"
    action = "arn:aws:fis:us-east-1::action/aws:ec2:send-spot-instance-interruptions"
    return [("fis:CreateExperimentTemplate", template, request_tags),
            ("fis:CreateExperimentTemplate", action, request_tags),
            ("fis:TagResource", template, request_tags),
            ("fis:StartExperiment", template, mine),
            ("fis:StartExperiment", experiment, request_tags),
            ("fis:TagResource", experiment, request_tags),
            ("fis:GetExperiment", experiment, mine),
            ("fis:StopExperiment", experiment, mine),
            ("fis:DeleteExperimentTemplate", template, mine),
            ("fis:ListExperimentTemplates", "*", {}),
            ("iam:PassRole", "arn:aws:iam::123456789012:role/cloudtrain-fis",
             {"iam:PassedToService": "fis.amazonaws.com"})]


def test_issue37_the_recovery_check_may_run_fis_on_its_own_templates_and_experiments():
    """Issue 37 (★): every request `check --launch --recovery` makes of FIS (and the PassRole
    of its role) is allowed by infra/iam-policy-recovery-check.json, evaluated as IAM does
    (tests/labs/iam.py), with the owner and job tags the code sends."""
    tags = {"cloudtrain:owner": FIS_ME, "cloudtrain:job": "abc123"}
    refused = [(a, r) for a, r, ctx in _fis_calls(tags) if _fis(a, r, **ctx) != "allow"]
    assert refused == []


def test_issue37_the_recovery_check_cannot_touch_another_owners_experiments_or_pass_roles():
    """Issue 37 (★): someone else's experiment templates and experiments (their owner tag),
    a template without a job tag, and passing the FIS role to any other service, or any
    other role to FIS, are refused."""
    theirs = {"cloudtrain:owner": FIS_OTHER, "cloudtrain:job": "abc123"}
    allowed = [(a, r) for a, r, ctx in _fis_calls(theirs)
               if _fis(a, r, **ctx) == "allow" and a not in ("fis:ListExperimentTemplates",
                                                             "iam:PassRole")]
    assert allowed == []
    no_job = {"aws:RequestTag/cloudtrain:owner": FIS_ME, "aws:TagKeys": ["cloudtrain:owner"]}
    assert _fis("fis:CreateExperimentTemplate",
                "arn:aws:fis:us-east-1:123456789012:experiment-template/X", **no_job) != "allow"
    assert _fis("iam:PassRole", "arn:aws:iam::123456789012:role/cloudtrain-fis",
                **{"iam:PassedToService": "ec2.amazonaws.com"}) != "allow"
    assert _fis("iam:PassRole", "arn:aws:iam::123456789012:role/admin",
                **{"iam:PassedToService": "fis.amazonaws.com"}) != "allow"


def test_issue37_the_fis_role_interrupts_only_cloudtrain_job_instances():
    """Issue 37 (★): the role FIS acts with (infra/iam-policy-fis-role.json) may send a spot
    interruption only to an instance tagged with a cloudtrain job, and do nothing else."""
    from labs.iam import Request, evaluate

    instance = "arn:aws:ec2:us-east-1:123456789012:instance/i-0abc"
    job = evaluate([FIS_ROLE], Request("ec2:SendSpotInstanceInterruptions", instance,
                                       {"aws:ResourceTag/cloudtrain:job": "abc123"}))
    other = evaluate([FIS_ROLE], Request("ec2:SendSpotInstanceInterruptions", instance, {}))
    terminate = evaluate([FIS_ROLE], Request("ec2:TerminateInstances", instance,
                                             {"aws:ResourceTag/cloudtrain:job": "abc123"}))
    assert (job, other, terminate) == ("allow", "implicit-deny", "implicit-deny")
