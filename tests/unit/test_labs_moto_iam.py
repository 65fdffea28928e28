"""labs.moto_iam: moto (which evaluates no policy) made to refuse what IAM refuses, for requests
signed with a role session's credentials, and to refuse revoked and expired keys. The lab's
enforcement must itself be able to fail: each refusal here is a request moto alone allows."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from labs.aws import moto_endpoint, reset_moto  # noqa: F401  (fixture)
from labs.credentials import CLIENT_CREDS, REGION
from labs.moto_iam import RoleSessions

POLICY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::lab-bucket/a/*"},
    {"Effect": "Allow", "Action": "autoscaling:DeleteAutoScalingGroup", "Resource": "*",
     "Condition": {"StringEquals": {"aws:ResourceTag/job": "${aws:PrincipalTag/job}"}}}]}
BOUNDARY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": ["s3:*", "autoscaling:*"], "Resource": "*"},
    {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::lab-bucket/a/secret"}]}


@pytest.fixture
def lab(moto_endpoint, monkeypatch):  # noqa: F811
    reset_moto(moto_endpoint)
    sessions = RoleSessions().install(monkeypatch)
    admin = {"endpoint_url": moto_endpoint, "region_name": REGION, **CLIENT_CREDS}
    iam = boto3.client("iam", **admin)
    boundary = iam.create_policy(PolicyName="b", PolicyDocument=json.dumps(BOUNDARY))
    iam.create_role(RoleName="job-role", AssumeRolePolicyDocument="{}",
                    PermissionsBoundary=boundary["Policy"]["Arn"],
                    Tags=[{"Key": "job", "Value": "j1"}])
    iam.put_role_policy(RoleName="job-role", PolicyName="p", PolicyDocument=json.dumps(POLICY))
    s3 = boto3.client("s3", **admin)
    s3.create_bucket(Bucket="lab-bucket")
    for key in ("a/x", "a/secret", "b/x"):
        s3.put_object(Bucket="lab-bucket", Key=key, Body=b"data")
    return sessions, admin, moto_endpoint


def _as(creds: dict, service: str, endpoint: str):
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id=creds["AccessKeyId"],
                        aws_secret_access_key=creds["SecretAccessKey"],
                        aws_session_token=creds.get("Token"),
                        config=Config(retries={"max_attempts": 1}))


def _code(call) -> tuple[str, int]:
    with pytest.raises(ClientError) as caught:
        call()
    error = caught.value.response
    return error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]


def test_a_role_session_gets_what_its_policy_and_boundary_allow_and_nothing_more(lab):
    sessions, _, endpoint = lab
    s3 = _as(sessions.issue("job-role"), "s3", endpoint)
    assert s3.get_object(Bucket="lab-bucket", Key="a/x")["Body"].read() == b"data"
    assert _code(lambda: s3.get_object(Bucket="lab-bucket", Key="b/x")) == ("AccessDenied", 403)
    # allowed by the role's policy, denied by its boundary
    assert _code(lambda: s3.get_object(Bucket="lab-bucket", Key="a/secret")) == (
        "AccessDenied", 403)
    assert _code(lambda: s3.put_object(Bucket="lab-bucket", Key="a/y", Body=b"")) == (
        "AccessDenied", 403)
    decided = [(a, r.rsplit("/", 2)[-2:], d) for _, a, r, d in sessions.decisions]
    assert decided == [("s3:GetObject", ["a", "x"], "allow"),
                       ("s3:GetObject", ["b", "x"], "implicit-deny"),
                       ("s3:GetObject", ["a", "secret"], "explicit-deny"),
                       ("s3:PutObject", ["a", "y"], "implicit-deny")]


def test_a_query_api_call_is_decided_on_its_resource_s_tags(lab):
    """DeleteAutoScalingGroup on the group named in the request, with its tags as
    aws:ResourceTag: the role's own job's group only."""
    sessions, admin, endpoint = lab
    ec2 = boto3.client("ec2", **admin)
    ec2.create_launch_template(LaunchTemplateName="lab-template", LaunchTemplateData={
        "ImageId": "ami-12c6146b", "InstanceType": "t3.micro"})
    asg = boto3.client("autoscaling", **admin)
    for name, job in (("mine", "j1"), ("theirs", "j2")):
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=0, MaxSize=0, DesiredCapacity=0,
            LaunchTemplate={"LaunchTemplateName": "lab-template"}, AvailabilityZones=[f"{REGION}a"],
            Tags=[{"Key": "job", "Value": job, "ResourceId": name,
                   "ResourceType": "auto-scaling-group", "PropagateAtLaunch": False}])
    mine = _as(sessions.issue("job-role"), "autoscaling", endpoint)
    assert _code(lambda: mine.delete_auto_scaling_group(AutoScalingGroupName="theirs"))[0] == \
        "AccessDenied"
    mine.delete_auto_scaling_group(AutoScalingGroupName="mine", ForceDelete=True)
    left = [g["AutoScalingGroupName"] for g in asg.describe_auto_scaling_groups()[
        "AutoScalingGroups"]]
    assert left == ["theirs"]


def test_issue38_an_update_s_keys_are_in_the_context_only_where_it_names_them(lab):
    """The keys AWS gives UpdateAutoScalingGroup beyond the sizes (autoscaling:InstanceTypes,
    VPCZoneIdentifiers, LaunchTemplateVersionSpecified, LaunchConfigurationName) are in the
    request context only where the request names their parts, so a policy's Null test on
    them tells the switch to on-demand (the distribution only) from an update that retypes,
    moves, resizes or re-templates the group."""
    from cloudtrain.providers.aws.job_role import SWITCH_KEYS_ABSENT

    sessions, admin, endpoint = lab
    iam = boto3.client("iam", **admin)
    iam.put_role_policy(RoleName="job-role", PolicyName="switch", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": "autoscaling:UpdateAutoScalingGroup", "Resource": "*",
            "Condition": {"Null": {k: "true" for k in SWITCH_KEYS_ABSENT}}}]}))
    mine = _as(sessions.issue("job-role"), "autoscaling", endpoint)
    distribution = {"InstancesDistribution": {"OnDemandPercentageAboveBaseCapacity": 100}}
    template = {"LaunchTemplateSpecification": {"LaunchTemplateName": "lab-t", "Version": "3"}}
    for kwargs in ({"MixedInstancesPolicy": distribution},
                   {"MixedInstancesPolicy": {**distribution, "LaunchTemplate": {
                       "Overrides": [{"InstanceType": "p5.48xlarge"}]}}},
                   {"MixedInstancesPolicy": {**distribution, "LaunchTemplate": template}},
                   {"VPCZoneIdentifier": "subnet-1,subnet-2"}, {"MaxSize": 4},
                   {"LaunchConfigurationName": "other"}):
        try:
            mine.update_auto_scaling_group(AutoScalingGroupName="g", **kwargs)
        except ClientError:
            pass  # the group does not exist: IAM's decision came first
    assert [d for _, a, _, d in sessions.decisions
            if a == "autoscaling:UpdateAutoScalingGroup"] == ["allow"] + ["implicit-deny"] * 5


def test_revoked_and_expired_keys_are_refused_and_others_pass_as_before(lab):
    """An access key deleted (or a session ended) is refused as AWS refuses it; a role
    session past its Expiration answers ExpiredToken, and IMDS then hands out new
    credentials, which work; keys the lab does not know pass as moto lets them."""
    sessions, _, endpoint = lab
    user = {"AccessKeyId": "AKIAUSERSESSION01", "SecretAccessKey": "s"}
    s3 = _as(user, "s3", endpoint)
    assert s3.get_object(Bucket="lab-bucket", Key="b/x")["Body"].read() == b"data"
    sessions.revoke("AKIAUSERSESSION01")
    assert _code(lambda: s3.get_object(Bucket="lab-bucket", Key="b/x"))[0] == \
        "InvalidAccessKeyId"
    assert _code(lambda: _as(user, "autoscaling", endpoint).describe_auto_scaling_groups())[
        0] == "InvalidClientTokenId"
    old = sessions.issue("job-role")
    sessions.expire("job-role")
    assert _code(lambda: _as(old, "s3", endpoint).get_object(
        Bucket="lab-bucket", Key="a/x"))[0] == "ExpiredToken"
    new = sessions.issue("job-role")
    assert new["AccessKeyId"] != old["AccessKeyId"]
    assert _as(new, "s3", endpoint).get_object(Bucket="lab-bucket", Key="a/x")["Body"].read()


def test_a_deleted_role_s_sessions_are_refused_everything(lab):
    """IAM evaluates a session's role's policies at each request: once the role is gone
    (a job's role deleted with the job), its credentials, though not expired, get nothing."""
    sessions, admin, endpoint = lab
    s3 = _as(sessions.issue("job-role"), "s3", endpoint)
    assert s3.get_object(Bucket="lab-bucket", Key="a/x")["Body"].read() == b"data"
    iam = boto3.client("iam", **admin)
    iam.delete_role_policy(RoleName="job-role", PolicyName="p")
    iam.delete_role(RoleName="job-role")
    assert _code(lambda: s3.get_object(Bucket="lab-bucket", Key="a/x")) == ("AccessDenied", 403)
