"""The owner tag is the caller's principal ARN, the value infra/iam-policy-cli.json compares
with `${aws:PrincipalArn}` (F8): for an assumed role that is the role (with its path), not the
STS session. In-process moto."""

from __future__ import annotations

import json

from labs.aws import ec2_provider  # noqa: F401  (fixture)
from cloudtrain.config import Settings
from cloudtrain.providers.aws import AWSProvider
from cloudtrain.providers.aws.session import assumed_role


def test_F8_assumed_role_session_arn_becomes_the_role_arn():
    assert assumed_role("arn:aws:sts::123456789012:assumed-role/ci-runner/build-7") == \
        ("arn:aws:iam::123456789012:role/ci-runner", "ci-runner")
    assert assumed_role("arn:aws-us-gov:sts::1:assumed-role/r/s")[0] == "arn:aws-us-gov:iam::1:role/r"
    assert assumed_role("arn:aws:iam::123456789012:user/me") is None


def test_F8_owner_of_an_sso_session_is_its_role_with_the_path(ec2_provider, monkeypatch):
    import boto3

    iam = boto3.client("iam", region_name="us-east-1")
    role = iam.create_role(RoleName="AWSReservedSSO_Admin_0123", Path="/aws-reserved/sso.amazonaws.com/",
                           AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17",
                                                                "Statement": []}))["Role"]
    creds = boto3.client("sts", region_name="us-east-1").assume_role(
        RoleArn=role["Arn"], RoleSessionName="jane@example.com")["Credentials"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", creds["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", creds["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", creds["SessionToken"])
    owner = AWSProvider(Settings(region="us-east-1")).account.owner("us-east-1")
    assert owner == role["Arn"]
    assert owner.endswith(":role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_Admin_0123")
    assert ec2_provider.account.owner("us-east-1").startswith("arn:aws:iam::")  # a plain user: as is
