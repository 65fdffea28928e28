"""infra/iam-policy-cli.json enforces what the CLI promises (F8), and allows every AWS call the
provider package and the S3 job store make (F10: a missing action is a denied launch)."""

from __future__ import annotations

import csv
import json
import re

import botocore.session
import pytest

from conftest import REPO

POLICY = json.loads((REPO / "infra" / "iam-policy-cli.json").read_text())
# Datasets on snapshot volumes and in the user's own bucket (issue 12): a second managed
# policy (the first is near IAM's 6,144-character limit), attached beside it.
DATASETS = json.loads((REPO / "infra" / "iam-policy-datasets.json").read_text())
OWNER = "${aws:PrincipalArn}"
# The code the policy is for: the AWS provider package and the S3 job store it uses.
SOURCES = sorted((REPO / "cloudtrain" / "providers" / "aws").glob("*.py")) + \
    [p for p in [REPO / "cloudtrain" / "jobstore.py"] if p.exists()]
SERVICES = ("ec2", "pricing", "sts", "ssm", "iam", "s3", "service-quotas")
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


def _allowed() -> set[str]:
    return {a for s in POLICY["Statement"] + DATASETS["Statement"] if s["Effect"] == "Allow"
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
    # The GPU families, and the one small type `cloudtrain check --launch` starts (issue 25).
    from cloudtrain.launch_check import CHECK_TYPE

    assert set(cond["StringLike"]["ec2:InstanceType"]) == {f"{f}.*" for f in families} | \
        {CHECK_TYPE}
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
    assert owned["Condition"]["StringEquals"]["ec2:Owner"] == "amazon"


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
    for s in POLICY["Statement"] + DATASETS["Statement"]:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        if s["Resource"] == "*":
            assert all(a.split(":")[1].startswith(("Describe", "Get")) for a in actions), s["Sid"]


def test_F8_job_store_actions_only_on_cloudtrain_buckets():
    bucket = {"s3:CreateBucket", "s3:PutBucketPublicAccessBlock", "s3:PutEncryptionConfiguration",
              "s3:PutBucketTagging", "s3:PutBucketPolicy", "s3:PutLifecycleConfiguration",
              "s3:ListBucket"}
    objects = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}
    for actions, resource in ((bucket, "arn:aws:s3:::cloudtrain-*"),
                              (objects, "arn:aws:s3:::cloudtrain-*/*")):
        for action in actions:
            found = [s for s in POLICY["Statement"] if action in s["Action"]]
            assert found and all(s["Resource"] == resource for s in found), action


def test_F8_policy_fits_a_managed_policy():
    # IAM: a managed policy document is at most 6,144 characters, whitespace not counted.
    for doc in (POLICY, DATASETS):
        assert len("".join(json.dumps(doc, separators=(",", ":")).split())) <= 6144


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
