"""`cloudtrain check` (issue 16): the settings and where each came from, then the AWS side
(credentials, account, region, the Deep Learning AMI, GPU vCPU quotas against what the
recipes launch), each with a verdict; against in-process moto with Service Quotas for EC2
added (tests/labs/moto_quotas.py), and with no AWS at all."""

from __future__ import annotations

import dataclasses
import json
import re
import time

import botocore.endpoint
import pytest
from moto import mock_aws

from labs.aws import SUBNETS, AWSLab, aws, moto_endpoint  # noqa: F401
from labs.credentials import AWS_ENV, CLIENT_CREDS, REGION
from cloudtrain import check
from cloudtrain.config import Settings
from labs.moto_quotas import EC2Quotas
from labs.pricing import price_list  # noqa: F401  (fixture)

# moto's own fake keys (FOOBARKEY) would replace the credentials each test sets up.
MOTO = {"core": {"mock_credentials": False, "passthrough": {"urls": [], "services": []},
                 "reset_boto3_session": True, "service_whitelist": None}}
QUOTA_ROWS = ["quota G on-demand", "quota P on-demand", "quota G spot", "quota P spot"]


def by_name(report: check.Report) -> dict[str, check.Check]:
    return {c.name: c for c in report.checks}


_REAL_SEND = botocore.endpoint.Endpoint._send


def _no_network(self, request):
    raise AssertionError(f"an AWS request was sent: {request.url}")


@pytest.fixture
def no_aws(monkeypatch, ct_home):
    """No AWS credentials anywhere, no region set, and any request that would leave botocore
    fails the test."""
    import os

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr("botocore.endpoint.Endpoint._send", _no_network)
    return ct_home


@pytest.fixture
def quotas(monkeypatch) -> EC2Quotas:
    return EC2Quotas().install(monkeypatch)


@pytest.fixture
def capacity(monkeypatch):
    """The account's capacity reservations (moto has no DescribeCapacityReservations)."""
    from labs.moto_capacity import Reservations

    return Reservations().install(monkeypatch)


@pytest.fixture
def moto(no_aws, monkeypatch, quotas, capacity):
    """In-process moto with the lab's test credentials in the environment and us-east-1
    (no_aws's guard stays: moto answers before a request would be sent)."""
    from labs.freetier import free_tier

    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    tier = free_tier()  # moto has no Free Tier API: the lab's stand-in, on loopback
    monkeypatch.setenv("AWS_ENDPOINT_URL_FREETIER", tier.url)

    def only_the_stand_in(self, request):  # no_aws's guard, but for the stand-in
        if not request.url.startswith(tier.url):
            _no_network(self, request)
        return _REAL_SEND(self, request)

    monkeypatch.setattr("botocore.endpoint.Endpoint._send", only_the_stand_in)
    with mock_aws(config=MOTO):
        yield quotas


@pytest.fixture
def dlami(moto, ct_home, tmp_path) -> AWSLab:
    """The lab's Deep Learning AMI (image + SSM parameter) in moto's us-east-1."""
    lab = AWSLab(None, ct_home, tmp_path / "lab")
    lab.work.mkdir()
    lab.build_cloud("127.0.0.0/16", SUBNETS)
    return lab


# -- no AWS at all ------------------------------------------------------------------------------


def test_no_credentials_is_a_warning_that_only_the_local_backend_works(no_aws):
    """Issue 16: without credentials the AWS side is a warning (only the local backend
    works), nothing is asked of AWS, and the exit code is 0."""
    report = check.run()
    found = by_name(report)
    creds = found["credentials"]
    assert creds.verdict == "warning", creds
    assert "no AWS credentials found: only the local backend works" in creds.detail
    assert "aws configure" in creds.hint
    assert not {"account", "AMI", "quotas", *QUOTA_ROWS} & set(found)
    assert found["region"].verdict == "ok"  # the region needs no credentials
    assert check.exit_code(report) == 0
    text = check.render(report, width=100)
    assert re.search(r"^credentials\s+warning\s+no AWS credentials found", text, re.M), text
    assert "credentials: run `aws configure`" in text
    assert text.endswith("no problem, 1 warning")


def test_no_credentials_with_the_aws_backend_configured_is_a_problem(no_aws, monkeypatch):
    """Issue 16: `backend: aws` (here from CLOUDTRAIN_BACKEND) without credentials is a problem:
    every default launch would fail; exit code 1."""
    monkeypatch.setenv("CLOUDTRAIN_BACKEND", "aws")
    report = check.run()
    creds = by_name(report)["credentials"]
    assert creds.verdict == "problem" and "the backend setting is aws" in creds.detail
    assert check.exit_code(report) == 1
    assert {s.name: s.source for s in report.settings}["backend"] == "CLOUDTRAIN_BACKEND"
    assert check.render(report).endswith("1 problem: fix the problems before launching")


def test_a_profile_that_does_not_exist_is_a_problem_in_words(no_aws, monkeypatch):
    """Issue 16: AWS_PROFILE naming no profile is a one-line problem with a hint, never a
    traceback."""
    monkeypatch.setenv("AWS_PROFILE", "nope")
    report = check.run()
    creds = by_name(report)["credentials"]
    assert creds.verdict == "problem", creds
    assert creds.detail.startswith("AWS profile not found") and "\n" not in creds.detail
    assert "aws configure list-profiles" in creds.hint
    assert "Traceback" not in check.render(report)
    assert check.exit_code(report) == 1


# -- the region chain ---------------------------------------------------------------------------


@pytest.mark.parametrize("source, expected", [
    ("--region", "eu-west-1 (from --region)"),
    ("config.yaml", "eu-central-1 (from `region:` in config.yaml)"),
    ("AWS_REGION", "us-west-2 (from AWS_REGION)"),
    ("AWS_DEFAULT_REGION", "us-east-2 (from AWS_DEFAULT_REGION)"),
    ("profile", "ap-northeast-1 (from the AWS profile lab)"),
    ("nothing", "us-east-1 (from the default: no --region"),
])
def test_the_region_and_where_it_came_from(no_aws, monkeypatch, tmp_path, ct_home, source,
                                           expected):
    """Issue 16: the region is the chain's answer (--region, config.yaml, AWS_REGION,
    AWS_DEFAULT_REGION, the AWS profile, else us-east-1), each source set here together with
    every source below it, so the row shows which one won."""
    chain = ["--region", "config.yaml", "AWS_REGION", "AWS_DEFAULT_REGION", "profile"]
    below = chain[chain.index(source):] if source in chain else []
    flag = "eu-west-1" if "--region" in below else None
    if "config.yaml" in below:
        with open(ct_home / "config.yaml", "a") as f:
            f.write("region: eu-central-1\n")
    if "AWS_REGION" in below:
        monkeypatch.setenv("AWS_REGION", "us-west-2")
    if "AWS_DEFAULT_REGION" in below:
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-2")
    if "profile" in below:
        (tmp_path / "aws-config").write_text("[profile lab]\nregion = ap-northeast-1\n")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
        monkeypatch.setenv("AWS_PROFILE", "lab")
    region = by_name(check.run(region=flag))["region"]
    assert region.verdict == "ok" and region.detail.startswith(expected), region


def test_a_region_that_is_not_one_is_a_problem(no_aws, monkeypatch):
    """Issue 16: AWS_REGION=mars-1 is a problem naming where it came from."""
    monkeypatch.setenv("AWS_REGION", "moon")
    report = check.run()
    region = by_name(report)["region"]
    assert region.verdict == "problem"
    assert region.detail == "unknown AWS region 'moon' (from AWS_REGION)"
    assert "us-east-1" in region.hint
    assert check.exit_code(report) == 1


# -- credentials and the account ---------------------------------------------------------------


def test_credentials_from_the_environment_and_the_account(moto, dlami):
    """Issue 16: with credentials the row says where they came from, and the account and
    ARN come from STS GetCallerIdentity."""
    found = by_name(check.run())
    creds = found["credentials"]
    assert creds.verdict == "ok"
    assert creds.detail == ("from environment variables (AWS_ACCESS_KEY_ID), profile default, "
                            "access key ***ting")
    account = found["account"]
    assert account.verdict == "ok"
    assert account.detail == "123456789012: arn:aws:sts::123456789012:user/moto"
    assert account.data == {"account": "123456789012",
                            "arn": "arn:aws:sts::123456789012:user/moto"}


def test_credentials_from_a_profile_in_the_shared_file(moto, monkeypatch, tmp_path):
    """Issue 16: credentials of a named profile in the shared credentials file are said as
    such, with the profile."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    creds_file = tmp_path / "credentials"
    creds_file.write_text("[lab]\naws_access_key_id = AKIALAB0000000001234\n"
                          "aws_secret_access_key = secret\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds_file))
    monkeypatch.setenv("AWS_PROFILE", "lab")
    creds = by_name(check.run())["credentials"]
    assert creds.verdict == "ok"
    assert creds.detail == (f"from the shared credentials file {creds_file}, profile lab, "
                            "access key ****************1234")


def _role(name: str = "trainer") -> dict:
    import boto3

    return boto3.client("iam", region_name=REGION, **CLIENT_CREDS).create_role(
        RoleName=name, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17",
                                                             "Statement": []}))["Role"]


def _role_profile(monkeypatch, tmp_path, role: dict, session_name: str | None = None) -> None:
    """AWS_PROFILE `ci`: role_arn on `role` from the keys of profile `base` (and the session
    name given, if any), as `aws configure` writes it; no credentials in the environment."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "credentials").write_text("[base]\naws_access_key_id = AKIABASE000000000001\n"
                                         "aws_secret_access_key = secret\n")
    (tmp_path / "config").write_text(
        f"[profile ci]\nrole_arn = {role['Arn']}\nsource_profile = base\n"
        + (f"role_session_name = {session_name}\n" if session_name else ""))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "ci")


def test_RE2_a_role_arn_profile_keeps_one_jobs_prefix_from_process_to_process(
        moto, dlami, monkeypatch, tmp_path):
    """RE2: botocore names the session of a `role_arn` profile without `role_session_name`
    `botocore-session-<unix time>`, so each process was a new aws:userid, a new job-store
    prefix (jobs/${aws:userid}/), and the jobs under the last one were out of its reach.
    cloudtrain names the session once per local user; `check` says whose prefix it is."""
    import getpass

    from cloudtrain.providers.aws.session import AwsSession

    role = _role()
    _role_profile(monkeypatch, tmp_path, role)
    first = AwsSession(Settings()).owner_key(REGION)
    time.sleep(1.1)  # botocore's name would change with the second
    assert AwsSession(Settings()).owner_key(REGION) == first == \
        f"{role['RoleId']}:cloudtrain-{getpass.getuser()}"
    row = by_name(check.run())["jobs prefix"]
    assert (row.verdict, row.detail) == ("ok", (
        f"jobs/{first}/: role trainer, session cloudtrain-{getpass.getuser()} (named by "
        "cloudtrain: the profile names no role_session_name), the same in every process"))
    # A profile's own session name is kept as it is.
    _role_profile(monkeypatch, tmp_path, role, session_name="jane")
    assert AwsSession(Settings()).owner_key(REGION) == f"{role['RoleId']}:jane"


def test_RE2_a_session_named_after_its_start_time_is_a_warning(moto, dlami, monkeypatch):
    """Credentials of a role session that someone else named after its start time (keys in
    the environment, from a script's AssumeRole): the next session is another prefix, said."""
    import boto3

    role = _role()
    creds = boto3.client("sts", region_name=REGION, **CLIENT_CREDS).assume_role(
        RoleArn=role["Arn"], RoleSessionName="botocore-session-1796277998")["Credentials"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", creds["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", creds["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", creds["SessionToken"])
    report = check.run()
    row = by_name(report)["jobs prefix"]
    assert row.verdict == "warning" and row.detail == (
        f"jobs/{role['RoleId']}:botocore-session-1796277998/: role trainer, session "
        "botocore-session-1796277998: another process of yours gets another prefix, and the "
        "jobs under this one are out of its reach")
    assert "role_session_name" in row.hint and "AWS_ROLE_SESSION_NAME" in row.hint


def test_RE2_an_iam_users_jobs_prefix_is_its_user_id(moto, dlami):
    import boto3

    user_id = boto3.client("sts", region_name=REGION, **CLIENT_CREDS).get_caller_identity()[
        "UserId"]
    row = by_name(check.run())["jobs prefix"]
    assert (row.verdict, row.detail, row.data["stable"]) == (
        "ok", f"jobs/{user_id}/: IAM user moto, the same in every process", True)


# -- the Deep Learning AMI ---------------------------------------------------------------------


def _plan_check(plan=None, denied=False) -> check.Check:
    from labs.freetier import free_tier

    tier = free_tier()
    tier.plan, tier.denied = plan, denied
    report = check.run()
    assert tier.calls == ["AWSFreeTierService.GetAccountPlanState"]
    return by_name(report)["account plan"], report


def test_RB5_an_account_on_the_free_plan_is_a_problem_before_any_gpu_launch(moto, dlami):
    """RB5: accounts opened since 15 July 2025 start on AWS's Free plan, on which EC2
    launches only some small types: `check --launch` passed on its t3.micro and the first GPU
    job failed. `check` asks the Free Tier API for the plan and says so, with how to upgrade;
    exit 1."""
    row, report = _plan_check({"accountId": "123456789012", "accountPlanType": "FREE",
                               "accountPlanStatus": "ACTIVE",
                               "accountPlanRemainingCredits": {"amount": 87.5, "unit": "USD"},
                               "accountPlanExpirationDate": 1800000000})
    assert row.verdict == check.PROBLEM
    assert row.detail.startswith("Free plan (USD 87.50 of credits left, until 2027-01-15): EC2 "
                                 "launches only some small instance types on it, no GPU type")
    assert "Paid plan" in row.hint and "upgrade-account-plan" in row.hint
    assert check.exit_code(report) == 1
    ended, _ = _plan_check({"accountPlanType": "FREE", "accountPlanStatus": "EXPIRED"})
    assert ended.verdict == check.PROBLEM and ended.detail.startswith("the Free plan has ended")


def test_RB5_a_paid_account_or_one_on_no_plan_is_ok(moto, dlami):
    paid, _ = _plan_check({"accountPlanType": "PAID", "accountPlanStatus": "ACTIVE"})
    assert (paid.verdict, paid.detail) == (
        check.OK, "Paid plan: every instance type your quotas allow")
    none, _ = _plan_check(None)
    assert none.verdict == check.OK and none.detail.startswith("no Free plan")


def test_RB5_the_plan_not_allowed_is_a_warning_naming_the_action(moto, dlami):
    row, report = _plan_check(denied=True)
    assert row.verdict == check.WARNING
    assert "freetier:GetAccountPlanState" in row.detail
    assert by_name(report)["AMI"].verdict == check.OK  # the other checks still ran


def test_the_deep_learning_ami_found_in_the_region(moto, dlami):
    """Issue 16: the DLAMI the launch would use, found through the provider's lookup (its SSM
    parameter), with its name and date."""
    ami = by_name(check.run())["AMI"]
    assert ami.verdict == "ok"
    assert re.fullmatch(rf"{dlami.ami} Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2\.9 "
                        r"\(Ubuntu 24\.04\) 20261101, created \d{4}-\d\d-\d\d", ami.detail), ami
    assert ami.data["id"] == dlami.ami


def _store_and_profile(ct_home, profile: str | None = "cloudtrain-instance",
                       bucket: bool = True, role: bool = True) -> None:
    """In moto: the account's job store bucket, an instance profile (with its role), and
    config.yaml naming `profile`."""
    import boto3

    if bucket:
        boto3.client("s3", region_name=REGION, **CLIENT_CREDS).create_bucket(
            Bucket=f"cloudtrain-123456789012-{REGION}")
    iam = boto3.client("iam", region_name=REGION, **CLIENT_CREDS)
    iam.create_instance_profile(InstanceProfileName="cloudtrain-instance")
    if role:
        iam.create_role(RoleName="cloudtrain-instance", AssumeRolePolicyDocument="{}")
        iam.add_role_to_instance_profile(InstanceProfileName="cloudtrain-instance",
                                         RoleName="cloudtrain-instance")
    if profile:
        (ct_home / "config.yaml").write_text(f"instance_profile: {profile}\n")


def _job_boundary() -> None:
    """The administrator's one-time step of `instance_profile: per-job`, in moto."""
    import boto3

    from conftest import REPO

    boto3.client("iam", region_name=REGION, **CLIENT_CREDS).create_policy(
        PolicyName="cloudtrain-job-boundary",
        PolicyDocument=(REPO / "infra" / "iam-policy-job-boundary.json").read_text())


def test_u57_check_looks_at_the_job_store_and_says_spot_recovery_needs_this_machine(
        moto, dlami, ct_home):
    """U57: plain `check` said "no problem" without looking at the job store bucket or
    instance_profile, on which it depends whether a spot job is relaunched with this machine
    off. Both are looked at, read-only: a bucket not made yet is said (and not made), and
    without instance_profile the supervisor here relaunches, only while this machine is on."""
    import boto3

    report = check.run()
    found = by_name(report)
    store = found["job store"]
    assert store.verdict == "warning" and store.detail.startswith(
        f"s3://cloudtrain-123456789012-{REGION} does not exist yet: the first launch creates it")
    recovery = found["spot recovery"]
    assert recovery.verdict == "warning" and recovery.detail == (
        "a supervisor on this machine relaunches an interrupted spot job, only while this "
        "machine is on (no instance_profile in config.yaml)")
    assert recovery.hint.startswith("set instance_profile: in config.yaml") and \
        "with this machine off" in recovery.hint
    assert "instance profile" not in found
    assert boto3.client("s3", region_name=REGION, **CLIENT_CREDS).list_buckets()["Buckets"] == []
    shown = check.render(report)
    assert "spot recovery: set instance_profile: in config.yaml" in shown
    assert "job store: cloudtrain check --launch makes it and tries it" in shown


def test_u57_with_the_bucket_and_an_instance_profile_aws_relaunches_without_this_machine(
        moto, dlami, ct_home):
    _store_and_profile(ct_home)
    found = by_name(check.run())
    assert (found["job store"].verdict, found["job store"].detail) == (
        "ok", f"s3://cloudtrain-123456789012-{REGION}: there, and ours")
    # issue 36: it works, but one role serves every job: said, with the way out
    assert (found["instance profile"].verdict, found["instance profile"].detail) == (
        "warning", "cloudtrain-instance, role cloudtrain-instance: shared by every job, whose "
        "instances can read every job's bundle and checkpoints; a job's writes end with your "
        "session")
    assert found["instance profile"].hint.startswith("set instance_profile: per-job")
    assert found["spot recovery"].verdict == "ok" and found["spot recovery"].detail.startswith(
        "AWS Auto Scaling relaunches an interrupted spot job: this machine may be off")


@pytest.mark.parametrize("profile, role, detail", [
    ("nope", True, "nope (instance_profile in config.yaml) does not exist in this account: "
                   "RunInstances refuses a launch with it"),
    ("cloudtrain-instance", False, "cloudtrain-instance has no role: its instances get no "
                                   "credentials to read the job store"),
])
def test_u57_an_instance_profile_a_launch_cannot_use_is_a_problem(moto, dlami, ct_home,
                                                                   profile, role, detail):
    _store_and_profile(ct_home, profile, role=role)
    report = check.run()
    found = by_name(report)
    assert (found["instance profile"].verdict, found["instance profile"].detail) == (
        "problem", detail)
    assert found["spot recovery"].verdict == "warning"
    assert check.exit_code(report) == 1


@pytest.mark.parametrize("boundary", [True, False], ids=["boundary", "no-boundary"])
def test_issue36_per_job_roles_are_checked_by_their_boundary(moto, dlami, ct_home, boundary):
    """`instance_profile: per-job` names no profile: each job makes its own role, which IAM
    refuses without the boundary an administrator creates once. check looks for that
    boundary (read-only): there, AWS relaunches with this machine off; missing, a problem
    with where the setup is said."""
    import boto3

    from conftest import REPO

    _store_and_profile(ct_home, "per-job")
    if boundary:
        _job_boundary()
    report = check.run()
    found = by_name(report)
    row = found["instance profile"]
    if boundary:
        assert row.verdict == "ok" and row.detail.startswith(
            "per-job: each job gets its own IAM role")
        assert found["spot recovery"].verdict == "ok"
    else:
        assert row.verdict == "problem" and "cloudtrain-job-boundary does not exist" in \
            row.detail and row.hint.endswith("infra/README.md section 2a")
        assert found["spot recovery"].verdict == "warning"
        assert check.exit_code(report) == 1


def test_u57_job_store_off_is_said_with_what_it_costs(moto, dlami, ct_home):
    _store_and_profile(ct_home, bucket=False)
    with open(ct_home / "config.yaml", "a") as f:
        f.write("job_store: false\n")
    found = by_name(check.run())
    assert found["job store"].verdict == "warning" and \
        found["job store"].detail.startswith("off (job_store: false in config.yaml)")
    assert found["spot recovery"].detail.endswith(
        "(job_store: false, and a replacement starts the job from the job store)")


def test_no_deep_learning_ami_in_the_region_is_a_problem(moto, quotas):
    """Issue 16: a region without the DLAMI (neither its SSM parameter nor an image by name)
    is a problem with a hint: a launch without --ami would fail."""
    quotas.set_all(64, 1024, 64, 1024)
    report = check.run()
    ami = by_name(report)["AMI"]
    assert ami.verdict == "problem"
    assert ami.detail == "no AWS Deep Learning PyTorch AMI found in us-east-1"
    assert "--ami" in ami.hint
    assert check.exit_code(report) == 1


def test_describe_images_denied_is_a_warning_naming_the_permission(moto, dlami, quotas,
                                                                   monkeypatch):
    """Issue 16: AccessDenied on the AMI lookup is a warning naming ec2:DescribeImages, not a
    crash and not a problem."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.amis import AmiBackend

    def denied(self, *args, **kwargs):
        raise EC2ClientError("UnauthorizedOperation", "You are not authorized to perform this "
                             "operation. User: arn:aws:iam::123456789012:user/moto is not "
                             "authorized to perform: ec2:DescribeImages because no "
                             "identity-based policy allows the ec2:DescribeImages action")

    monkeypatch.setattr(AmiBackend, "describe_images", denied)
    quotas.set_all(64, 1024, 64, 1024)
    report = check.run()
    ami = by_name(report)["AMI"]
    assert ami.verdict == "warning", ami
    assert "not allowed: ec2:DescribeImages in us-east-1 (UnauthorizedOperation)" in ami.detail
    assert "iam-policy-cli.json" in ami.hint
    assert check.exit_code(report) == 0


# -- GPU quotas --------------------------------------------------------------------------------


def test_quotas_that_cover_every_recipe_are_ok(moto, dlami, quotas, ct_home):
    """Issue 16, RC3 (the codes confirmed by the review, the same dstack reads): each vCPU
    quota the recipes' instances count against (G and P, on-demand and spot: L-DB2E81BA,
    L-417A185B, L-3819A6DF, L-7212CCBC) is read from Service Quotas and is ok when it
    covers the largest need; exit 0
    (and, with the job store and an instance profile there, nothing else to say: U57)."""
    quotas.set_all(on_demand_g=64, on_demand_p=1536, spot_g=64, spot_p=1536)
    _store_and_profile(ct_home, "per-job")  # the recommended setup: a role per job (issue 36)
    _job_boundary()
    report = check.run()
    found = by_name(report)
    assert [c.name for c in report.checks if c.name.startswith("quota")] == QUOTA_ROWS
    assert all(found[n].verdict == "ok" for n in QUOTA_ROWS), report.checks
    assert found["quota G on-demand"].detail.startswith(
        "Running On-Demand G and VT instances (L-DB2E81BA): 64 vCPUs: enough for every recipe")
    # The largest need: imagenet's 16-machine variant, 16 x p4d.24xlarge (96 vCPUs each: 8
    # A100, the default for 8 GPUs since no current DLAMI runs p3's V100s, RA2).
    assert "the most: 16 x p4d.24xlarge needs 1536 (imagenet machines-16)" in \
        found["quota P on-demand"].detail
    assert {(a, c) for a, _, c in quotas.calls} == {
        ("GetServiceQuota", c) for c in ("L-DB2E81BA", "L-417A185B", "L-3819A6DF", "L-7212CCBC")}
    assert {r for _, r, _ in quotas.calls} == {REGION}
    assert check.exit_code(report) == 0
    assert check.render(report).endswith("everything checked is ok")


def test_a_zero_quota_is_a_problem_with_a_hint(moto, dlami, quotas):
    """Issue 16: an on-demand G quota of 0 (a new account's) is a problem: g5.xlarge needs 4
    vCPUs; the hint says where to ask for an increase. The same on spot (not the configured
    market) is only a warning."""
    quotas.set_all(on_demand_g=0, on_demand_p=1024, spot_g=0, spot_p=1024)
    report = check.run()
    g = by_name(report)["quota G on-demand"]
    assert g.verdict == "problem"
    assert g.detail.startswith("Running On-Demand G and VT instances (L-DB2E81BA): 0 vCPUs: "
                               "g5.xlarge needs 4 (your own command, airbench94")
    assert g.hint == ("request an increase to at least 4 in us-east-1 at https://us-east-1."
                      "console.aws.amazon.com/servicequotas/home/services/ec2/quotas/L-DB2E81BA")
    spot = by_name(report)["quota G spot"]
    assert spot.verdict == "warning" and "0 vCPUs (for --spot): g5.xlarge needs 4" in spot.detail
    assert check.exit_code(report) == 1
    assert "quota G on-demand: request an increase to at least 4" in check.render(report)


def test_a_quota_below_the_largest_variant_is_a_warning_naming_it(moto, dlami, quotas):
    """Issue 16: a P quota of 96 runs the one-machine 8-GPU variants but not imagenet's
    multi-machine ones: a warning naming them, exit 0."""
    quotas.set_all(on_demand_g=64, on_demand_p=96, spot_g=64, spot_p=1536)
    report = check.run()
    p = by_name(report)["quota P on-demand"]
    assert p.verdict == "warning", p
    assert "96 vCPUs: too few where 4 x p4d.24xlarge needs 384 (imagenet machines-4); 8 x " \
           "p4d.24xlarge needs 768 (imagenet machines-8); 16 x p4d.24xlarge needs 1536" in p.detail
    assert "request an increase to 1536" in p.hint
    assert check.exit_code(report) == 0


def test_a_quota_never_changed_is_read_as_the_aws_default(moto, dlami, quotas):
    """Issue 16: GetServiceQuota has no applied value for a quota never changed
    (NoSuchResourceException); AWS's default value is read instead."""
    quotas.set_all(on_demand_g=0, on_demand_p=0, spot_g=0, spot_p=0, applied=False)
    quotas.applied["L-417A185B"] = 1536  # raised once, in this account
    report = check.run()
    found = by_name(report)
    assert found["quota G on-demand"].verdict == "problem"
    assert found["quota P on-demand"].verdict == "ok"
    assert ("GetAWSDefaultServiceQuota", REGION, "L-DB2E81BA") in quotas.calls
    assert ("GetAWSDefaultServiceQuota", REGION, "L-417A185B") not in quotas.calls


def test_quotas_denied_is_one_warning_naming_the_permission(moto, dlami, quotas):
    """Issue 16: AccessDenied from Service Quotas is one warning naming
    servicequotas:GetServiceQuota (a launch does not need it), not a crash; exit 0."""
    quotas.denied.add("GetServiceQuota")
    report = check.run()
    found = by_name(report)
    assert not set(QUOTA_ROWS) & set(found)
    q = found["quotas"]
    assert q.verdict == "warning"
    assert q.detail == ("GPU quotas not checked: not allowed: servicequotas:GetServiceQuota in "
                        "us-east-1 (AccessDeniedException)")
    assert "servicequotas:GetServiceQuota" in q.hint and "console.aws.amazon.com" in q.hint
    assert check.exit_code(report) == 0


def test_RC7_the_reservations_a_job_could_go_into_are_listed_soonest_end_first(
        moto, dlami, capacity):
    """RC7: `check` lists the capacity the account holds in the region (what --reservation
    can name): active and scheduled ones, for Linux and default tenancy, each with its free
    instances and, for a Capacity Block, when EC2 begins to terminate its instances (30 min
    before its end); not an expired one, nor one for another platform or tenancy."""
    held = capacity
    assert by_name(check.run())["reservations"].detail == "none active or scheduled in us-east-1"
    now = time.time()
    odcr = held.add("g5.xlarge", "us-east-1a", 2)
    block = held.add("p5.48xlarge", "us-east-1b", 1, kind="capacity-block",
                     start=now + 86400, end=now + 86400 + 24 * 3600)
    gone = held.add("g5.xlarge", "us-east-1a", 1)
    held.expire(gone)
    held.add("g5.xlarge", "us-east-1a", 1, platform="Windows")
    held.add("g5.xlarge", "us-east-1a", 1, tenancy="dedicated")
    held.add("g5.xlarge", "us-west-2a", 1, region="us-west-2")
    row = by_name(check.run())["reservations"]
    assert row.verdict == "ok", row

    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))

    assert row.data["reservations"] == [
        f"{block}: Capacity Block, 1 p5.48xlarge in us-east-1b from "
        f"{when(now + 86400)}, EC2 terminates its instances from "
        f"{when(now + 86400 + 24 * 3600 - 1800)}",
        f"{odcr}: capacity reservation, 2 of 2 g5.xlarge free in us-east-1a"], row.data
    assert row.detail == "; ".join(row.data["reservations"]) + \
        " (launch into one with --reservation ID)"

    held.denied = True  # the account policy not attached: a warning naming the action
    row = by_name(check.run())["reservations"]
    assert row.verdict == "warning" and row.detail.startswith(
        "capacity reservations not checked: ") and \
        "ec2:DescribeCapacityReservations" in row.detail + row.hint, row


def test_u59_quota_rows_say_an_html_answer_in_one_line(moto, dlami, quotas, monkeypatch):
    """U59: Service Quotas answering an HTML error page (a proxy's, moto's) put the whole page
    into each quota row; each row now says the call and the HTTP status. botocore retries the
    5xx (without its backoff's sleeps here) before the row says so."""
    import botocore.retries.standard
    from moto.servicequotas.responses import ServiceQuotasResponse

    page = "<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n"
    asked = []

    def html(self):
        asked.append(1)
        return page, {"status": 500, "Content-Type": "text/html; charset=utf-8"}

    monkeypatch.setattr(ServiceQuotasResponse, "get_service_quota", html)
    monkeypatch.setattr(botocore.retries.standard.ExponentialBackoff, "delay_amount",
                        lambda self, context: 0)
    found = by_name(check.run())
    for row in QUOTA_ROWS:
        assert found[row].verdict == "warning", found[row]
        assert found[row].detail.endswith(
            f"not checked: GetServiceQuota failed in us-east-1 (HTTP 500: not an AWS reply: "
            f"text/html, {len(page)} bytes)"), found[row].detail
        assert "<" not in found[row].detail
    assert len(asked) == 7 * len(QUOTA_ROWS)  # each retried, as any 5xx


# -- the settings and where each came from -------------------------------------------------------


def test_every_setting_with_its_value_and_source(no_aws, ct_home, monkeypatch):
    """Issue 16: every Settings field is listed once with its value and its source: the
    built-in default, config.yaml with the line, or the environment variable."""
    # conftest's config.yaml holds stop_grace_seconds, heartbeat_seconds, stale_after_seconds.
    with open(ct_home / "config.yaml", "a") as f:
        f.write("instance-type: g6.xlarge\nmarket:\n")
    monkeypatch.setenv("CLOUDTRAIN_BACKEND", "local")
    report = check.run()
    rows = {s.name: s for s in report.settings}
    assert [s.name for s in report.settings] == [f.name for f in dataclasses.fields(Settings)]
    assert (rows["stop_grace_seconds"].value, rows["stop_grace_seconds"].source) == \
        (2.0, "config.yaml line 1")
    assert (rows["instance_type"].value, rows["instance_type"].source) == \
        ("g6.xlarge", "config.yaml line 4")
    assert (rows["market"].value, rows["market"].source) == ("on-demand", "default")  # `market:`
    assert (rows["backend"].value, rows["backend"].source) == ("local", "CLOUDTRAIN_BACKEND")
    assert (rows["max_runtime_minutes"].value, rows["max_runtime_minutes"].source) == \
        (720.0, "default")
    config = by_name(report)["config"]
    assert config.verdict == "ok"
    assert config.detail == (f"{ct_home / 'config.yaml'}: 4 settings, the rest built-in "
                             "defaults; from the environment: CLOUDTRAIN_BACKEND")
    text = check.render(report, width=120)
    assert re.search(r"^instance_type\s+g6\.xlarge\s+config\.yaml line 4$", text, re.M), text
    assert re.search(r"^backend\s+local\s+CLOUDTRAIN_BACKEND$", text, re.M), text


def test_a_config_yaml_refused_is_a_problem_and_the_rest_still_runs(no_aws, ct_home):
    """Issue 16: a config.yaml that Settings refuses is one problem naming it (exit 1); the
    other checks still run, on the built-in defaults."""
    (ct_home / "config.yaml").write_text("market: cheap\n")
    report = check.run()
    config = by_name(report)["config"]
    assert config.verdict == "problem"
    assert config.detail.startswith(f"{ct_home / 'config.yaml'} line 1: 'market' must be one "
                                    "of on-demand, spot, got 'cheap'")
    assert config.hint.startswith("fix or remove line 1 of")  # U7: the line it names
    assert report.settings == []
    assert by_name(report)["credentials"].verdict == "warning"
    assert check.exit_code(report) == 1


# -- output --------------------------------------------------------------------------------------


def test_text_fits_the_width_and_json_carries_the_same(moto, dlami, quotas):
    """Issue 16: the text fits the width it is given; --json has the settings, every check
    with its verdict and facts, and the exit code."""
    quotas.set_all(on_demand_g=0, on_demand_p=96, spot_g=64, spot_p=1536)
    report = check.run()
    text = check.render(report, width=80)
    # Every line fits, but a console URL (88 characters) or a path (pytest's temporary home)
    # is never broken: it stays copyable, on a line of its own.
    long = [line for line in text.splitlines() if len(line) > 80]
    assert all(re.fullmatch(r"  \S+", line) for line in long), text
    assert "  https://us-east-1.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/" \
           "L-DB2E81BA" in long
    data = json.loads(check.to_json(report))
    assert data["exit_code"] == 1 and data["problems"] == 1 and data["warnings"] == 3
    assert [c["name"] for c in data["checks"] if c["verdict"] == "warning"][:2] == [
        "job store", "spot recovery"]  # U57: not made yet; no instance_profile
    assert len(data["settings"]) == len(report.settings)
    verdicts = {c["name"]: c["verdict"] for c in data["checks"]}
    assert verdicts["quota G on-demand"] == "problem" and verdicts["AMI"] == "ok"
    g = next(c for c in data["checks"] if c["name"] == "quota G on-demand")
    assert g["data"]["code"] == "L-DB2E81BA" and g["data"]["vcpus"] == 0
    assert g["data"]["needs"][0] == {"instance_type": "g5.xlarge", "nodes": 1, "vcpus": 4.0,
                                     "for": g["data"]["needs"][0]["for"]}


# -- check --launch (issue 25): one real launch, small, through the real lifecycle ------------------
#
# The lab: moto's EC2 and S3 server in this process, a real sshd answering at the instance's
# private IP, the agent in real tmux, the Price List API's stand-in (tests/labs/pricing.py).

LAUNCH_STEPS = ["credentials", "instance type", "key pair", "security group", "AMI",
                "job store bucket", "RunInstances", "instance running", "SSH", "host key",
                "sync", "setup", "agent", "job", "job store round trip", "collect",
                "terminate", "cleanup", "bill"]
STEP_LINE = re.compile(r"^(?P<name>\S.{0,19}?) +(?P<seconds>\d+\.\d) s  "
                       r"(?P<verdict>ok  |FAILED: )(?P<detail>.*)$")
NOT_ALLOWED = ("You are not authorized to perform this operation. User: "
               "arn:aws:iam::123456789012:user/moto is not authorized to perform: {action} on "
               "resource: arn:aws:ec2:us-east-1:123456789012:{what} because no identity-based "
               "policy allows the {action} action. Encoded authorization failure message: "
               "Zm9vYmFy")


def _steps(stdout: str) -> list[dict]:
    """The step lines of `check --launch`, parsed; every line before the closing ones is one."""
    found = []
    for line in stdout.splitlines():
        m = STEP_LINE.match(line)
        if m:
            found.append(m.groupdict())
    return found


def _live(aws) -> list[str]:
    return [i["InstanceId"] for i in aws.instances()
            if i["State"]["Name"] not in ("terminated", "shutting-down")]


def _stored(aws) -> list[str]:
    """Every object in the lab account's job store."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=aws.endpoint, region_name=REGION,
                      **CLIENT_CREDS)
    bucket = f"cloudtrain-123456789012-{REGION}"
    try:
        return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    except s3.exceptions.NoSuchBucket:
        return []


@pytest.fixture
def launch_lab(aws, price_list, monkeypatch):
    """The AWS lab with the Price List API answering t3.micro's us-east-1 price, and the
    placement groups moto lacks (the cleanup looks for the job's)."""
    from labs.moto_placement import PlacementGroups

    PlacementGroups().install(monkeypatch)
    price_list.instance(REGION, "t3.micro", "0.0104000000")
    return aws


def test_check_launch_runs_every_step_and_leaves_nothing(cli, launch_lab, ct_home):
    """Issue 25: `check --launch` launches a t3.micro and runs the whole path once, each step
    on one line with its time and `ok`: nothing is left running or stored, the instance was
    launched like any job's (tagged, shutdown behaviour terminate), and the bill is the
    60-second minimum at the price list's figure, to the fraction of a cent."""
    aws = launch_lab
    proc = cli("check", "--launch", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = _steps(proc.stdout)
    assert [s["name"] for s in steps] == LAUNCH_STEPS, proc.stdout
    assert all(s["verdict"] == "ok  " for s in steps), proc.stdout
    by = {s["name"]: s["detail"] for s in steps}
    assert by["instance type"] == "t3.micro on-demand in us-east-1: $0.0104/h (AWS price list)"
    assert by["host key"].startswith("verified SHA256:")
    assert "1 file" in by["sync"]
    assert "exited 0 on the instance and printed the synced check.txt" in by["job"]
    assert "each matching the manifest's sha256" in by["job store round trip"]
    assert "over SSH" in by["collect"]
    assert "job-store objects deleted" in by["cleanup"] and "stay for the next launch" in \
        by["cleanup"]

    (raw,) = aws.instances()
    assert raw["State"]["Name"] == "terminated" and raw["InstanceType"] == "t3.micro"
    tags = aws.tags(raw)
    job_id = tags["cloudtrain:job"]
    assert tags["cloudtrain:owner"].startswith("arn:aws:") and tags["Name"].startswith(
        f"cloudtrain-{job_id}-check-launch-")
    attr = aws.ec2.describe_instance_attribute(InstanceId=raw["InstanceId"],
                                               Attribute="instanceInitiatedShutdownBehavior")
    assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    assert raw["MetadataOptions"]["HttpTokens"] == "required"
    assert _live(aws) == [] and _stored(aws) == []
    assert aws.ec2.describe_volumes(Filters=[{"Name": "tag:cloudtrain:job",
                                              "Values": [job_id]}])["Volumes"] == []
    # The job is an ordinary one, with its cost recorded.
    job = cli.job(job_id)
    assert job["state"] == "succeeded"
    assert "cloudtrain check --launch" in (ct_home / "jobs" / job_id / "output.log").read_text()
    # The bill: a run under a minute is billed the minute, at $0.0104/h.
    assert "60 s billed (the 60-second minimum; it ran" in by["bill"]
    assert f"x $0.0104/h = ${0.0104 * 60 / 3600:.6f}" in by["bill"]
    assert job["cost"] == pytest.approx(float(re.search(r"total \$(\d+\.\d+)", by["bill"])[1]),
                                        abs=1e-6)
    assert proc.stdout.splitlines()[-1].startswith("every step ok")


def _deny_run_instances(monkeypatch):
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    def run_instances(self, *args, **kwargs):
        raise EC2ClientError("UnauthorizedOperation", NOT_ALLOWED.format(
            action="ec2:RunInstances", what="instance/*"))

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)


def _deny_create_security_group(monkeypatch):
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.security_groups import SecurityGroupBackend

    def create_security_group(self, *args, **kwargs):
        raise EC2ClientError("UnauthorizedOperation", NOT_ALLOWED.format(
            action="ec2:CreateSecurityGroup", what="security-group/*"))

    monkeypatch.setattr(SecurityGroupBackend, "create_security_group", create_security_group)


def _deny_the_instances_upload(monkeypatch):
    """S3 refuses the agent's presigned POST, as it does when the credentials that signed it
    lack s3:PutObject (this machine's own PUTs still go through)."""
    from moto.s3.exceptions import S3AccessDeniedError
    from moto.s3.models import S3Backend

    original = S3Backend.put_object

    def put_object(self, *args, **kwargs):
        if kwargs.get("request_method") == "POST":
            raise S3AccessDeniedError()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(S3Backend, "put_object", put_object)


@pytest.mark.parametrize("deny, step, action, launched, as_json", [
    (_deny_run_instances, "RunInstances", "ec2:RunInstances", False, False),
    (_deny_create_security_group, "security group", "ec2:CreateSecurityGroup", False, True),
    (_deny_the_instances_upload, "job store round trip", "s3:PutObject", True, True),
])
def test_check_launch_stops_at_a_refusal_naming_the_action_and_leaves_nothing(
        cli, launch_lab, monkeypatch, deny, step, action, launched, as_json):
    """Issue 25: AWS refusing one action (RunInstances; CreateSecurityGroup before it; S3
    refusing the instance's upload after the instance runs) stops the check at that step,
    which names the IAM action and says what to attach; what was started is terminated, the
    job store holds nothing, the exit code is 1. The same steps as text lines and as data
    (--json)."""
    aws = launch_lab
    deny(monkeypatch)
    proc = cli("check", "--launch", *(["--json"] if as_json else []), timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    if as_json:
        data = json.loads(proc.stdout)
        assert data["ok"] is False and data["exit_code"] == 1
        steps = data["steps"]
    else:
        lines = proc.stdout.splitlines()
        assert lines[-2] == f"{step}: attach infra/iam-policy-cli.json (it lists every " \
            "action cloudtrain calls) to your IAM user or role; see infra/README.md"
        assert re.fullmatch(rf"FAILED at {step}: nothing is left running; nothing was billed "
                            r"\(job (\w+): cloudtrain status \1\)", lines[-1]), lines[-1]
        steps = [{"name": s["name"], "ok": s["verdict"] == "ok  ", "detail": s["detail"],
                  "hint": lines[-2]} for s in _steps(proc.stdout)]
        data = {"cost_usd": 0, "job": None}
    names = [s["name"] for s in steps]
    bad = [s for s in steps if not s["ok"]]
    assert [s["name"] for s in bad] == [step], steps
    assert action in bad[0]["detail"] and (  # RE1: the file that allows it
        "iam-policy-cli-account.json" if action.startswith("s3:") else "iam-policy-cli.json"
    ) in bad[0]["hint"]
    # It went no further than the refusal, then took down what it had started.
    assert names[names.index(step) + 1:] == (["terminate"] if launched else []) + \
        ["cleanup", "bill"]
    assert all(s["ok"] for s in steps if s["name"] in ("terminate", "cleanup", "bill"))
    assert _live(aws) == [] and _stored(aws) == []
    assert len(aws.instances()) == (1 if launched else 0)
    if launched:
        assert data["job"] and data["cost_usd"] > 0
        assert cli.job(data["job"])["state"] in ("succeeded", "cancelled", "failed")
    else:
        assert data["cost_usd"] == 0


def test_u59_an_answer_that_is_not_aws_s_at_cleanup_is_said_and_the_bill_still_comes(
        cli, aws, price_list, monkeypatch):
    """U59: moto answered DescribePlacementGroups with an HTML 500 in the cleanup step;
    `check --launch` printed `FAILED: ResponseParserError` with the raw page, then ended as an
    internal error without the bill. Now the cleanup says in one line what it could not ask,
    and the bill follows."""
    from moto.ec2.responses import EC2Response

    def broken(self):
        raise RuntimeError("not implemented in this lab")

    monkeypatch.setattr(EC2Response, "describe_placement_groups", broken, raising=False)
    price_list.instance(REGION, "t3.micro", "0.0104000000")
    proc = cli("check", "--launch", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "internal error" not in proc.stderr and "<html" not in proc.stdout + proc.stderr
    steps = {s["name"]: s for s in _steps(proc.stdout)}
    assert list(steps)[-2:] == ["cleanup", "bill"], proc.stdout
    assert re.fullmatch(r"could not verify the cleanup: DescribePlacementGroups failed in "
                        r"us-east-1 \(HTTP 500: not an AWS reply: text/html, [0-9,]+ bytes\)",
                        steps["cleanup"]["detail"]), steps["cleanup"]
    assert steps["bill"]["verdict"] == "ok  " and "60 s billed" in steps["bill"]["detail"]
    assert _live(aws) == []


@pytest.mark.parametrize("role_may_read", [True, False])
def test_check_launch_reads_with_the_instance_role_when_one_is_configured(
        cli, launch_lab, ct_home, monkeypatch, role_may_read):
    """Issue 25: with `instance_profile` set, the job store round trip covers the instance
    role too: an object put in the job store is read on the instance with the role's
    credentials (IMDSv2), through the datasets' own staging path, and then deleted. A role
    that may not read it fails the `instance role` step, naming s3:GetObject."""
    import boto3

    from labs.imds import FakeIMDS

    aws = launch_lab
    if not role_may_read:
        from moto.s3.exceptions import S3AccessDeniedError
        from moto.s3.models import S3Backend

        original = S3Backend.get_object

        def get_object(self, bucket_name, key_name, *args, **kwargs):
            if key_name.endswith("/role-check.txt"):
                raise S3AccessDeniedError()
            return original(self, bucket_name, key_name, *args, **kwargs)

        monkeypatch.setattr(S3Backend, "get_object", get_object)
    iam = boto3.client("iam", endpoint_url=aws.endpoint, region_name=REGION,
                       **CLIENT_CREDS)
    iam.create_instance_profile(InstanceProfileName="cloudtrain-instance")
    imds = FakeIMDS(role="cloudtrain-instance")
    try:
        aws.write_config(instance_profile="cloudtrain-instance", imds_url=imds.url)
        proc = cli("check", "--launch", timeout=240)
    finally:
        imds.close()
    steps = _steps(proc.stdout)
    names = [s["name"] for s in steps]
    if not role_may_read:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert names[:8] == LAUNCH_STEPS[:6] + ["role test object", "RunInstances"]
        assert names[-4:] == ["instance role", "terminate", "cleanup", "bill"], proc.stdout
        bad = [s for s in steps if s["verdict"] != "ok  "]
        assert [s["name"] for s in bad] == ["instance role"]
        assert "could not read the test object with its role" in bad[0]["detail"]
        assert "instance role: the role of instance profile cloudtrain-instance needs " \
               "infra/instance-role-policy.json's ReadJobBundlesAndCheckpoints (s3:GetObject " \
               "on arn:aws:s3:::cloudtrain-*/jobs/*/bundle/*" in proc.stdout
        assert _live(aws) == [] and _stored(aws) == []
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert names == LAUNCH_STEPS[:6] + ["role test object"] + LAUNCH_STEPS[6:15] + \
        ["instance role"] + LAUNCH_STEPS[15:], proc.stdout
    assert all(s["verdict"] == "ok  " for s in steps), proc.stdout
    role = {s["name"]: s["detail"] for s in steps}["instance role"]
    assert "with the role of instance profile cloudtrain-instance" in role
    # The role's credentials were asked for, with an IMDSv2 token.
    assert any(method == "GET" and path.endswith("/cloudtrain-instance") and token
               for method, path, token in imds.seen), imds.seen
    assert _live(aws) == [] and _stored(aws) == []


def test_check_launch_interrupted_terminates_what_it_started(cli, launch_lab):
    """Issue 25: SIGTERM (a CI cancellation, `timeout`) while the check waits for SSH fails
    that step as interrupted; the instance it started is terminated and checked gone before
    it exits (130), and nothing is left in the job store."""
    import signal
    import subprocess
    import sys

    from conftest import REPO

    aws = launch_lab
    aws.sshd.stop()
    aws.write_config(ssh_wait_seconds=120.0)
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "check", "--launch"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:  # each step is printed as it ends
        seen.append(line)
        if line.startswith("instance running"):
            break
    assert _live(aws), "".join(seen)
    time.sleep(1.0)  # into the SSH wait
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    out = "".join(seen) + out
    assert proc.returncode == 130, out + err
    steps = {s["name"]: s for s in _steps(out)}
    assert steps["SSH"]["verdict"] == "FAILED: " and \
        steps["SSH"]["detail"].startswith("interrupted (SIGTERM)"), out
    assert [n for n in steps][-3:] == ["terminate", "cleanup", "bill"]
    assert all(steps[n]["verdict"] == "ok  " for n in ("terminate", "cleanup", "bill")), out
    assert out.splitlines()[-1].startswith("interrupted (SIGTERM): nothing is left running")
    assert "Traceback" not in err
    assert _live(aws) == [] and _stored(aws) == []


def test_everything_check_launch_asks_of_aws_is_allowed_by_the_cli_policy(launch_lab,
                                                                          monkeypatch):
    """Issue 25: every AWS call `check --launch` makes (recorded as botocore makes it), and
    the instance's presigned POST (s3:PutObject, signed with the user's credentials), is
    allowed by infra/iam-policy-cli.json and iam-policy-cli-account.json alone, its instance type
    included: the policies a new user attaches are all the check needs, once the job store's bucket exists (F32: creating
    it is the administrator's one-time step, infra/iam-policy-store-admin.json, made here
    before the calls are recorded)."""
    import fnmatch
    from pathlib import Path

    import botocore.client

    from cloudtrain import launch_check, providers
    from cloudtrain.providers.aws.errors import iam_action

    admin = providers.get("aws")
    admin.account.ensure_job_store(admin.account.region())  # the administrator's step, before the user's

    made: set[str] = set()
    original = botocore.client.BaseClient._make_api_call

    def recorded(self, operation, params):
        made.add(iam_action(self.meta.service_model.signing_name, operation))
        return original(self, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recorded)
    report = launch_check.run()
    assert report.ok, [launch_check.render_step(s) for s in report.steps]
    infra = Path(launch_check.__file__).parents[1] / "infra"
    statements = [s for name in ("iam-policy-cli.json", "iam-policy-cli-account.json")
                  for s in json.loads((infra / name).read_text())["Statement"]]  # RE1: both
    allowed, types = set(), []
    for s in statements:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        allowed |= set(actions)
        if "ec2:RunInstances" in actions:
            types += s.get("Condition", {}).get("StringLike", {}).get("ec2:InstanceType", [])
    made.add("s3:PutObject")  # the instance's upload: a presigned POST signed with them
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "ec2:DescribeVolumes",
            "s3:DeleteObject", "pricing:GetProducts"} <= made
    # Issue 27: the teardown also looks for the job's Auto Scaling group by tag, which the
    # second policy (iam-policy-autoscaling.json) allows; refused, the lookup is skipped
    # (no group can exist that the user could not have described), so the CLI policy alone
    # still runs the check.
    groups = json.loads((Path(launch_check.__file__).parents[1] / "infra" /
                         "iam-policy-autoscaling.json").read_text())
    lookups = {"autoscaling:DescribeAutoScalingGroups", "ec2:DescribeLaunchTemplates"}
    in_groups = {a for st in groups["Statement"] for a in
                 (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])}
    assert lookups <= in_groups
    assert sorted(made - allowed - lookups) == []
    assert any(fnmatch.fnmatchcase(report.instance_type, t) for t in types)


def test_check_launch_without_credentials_fails_at_once_and_creates_nothing(no_aws):
    """Issue 25: with no AWS credentials `check --launch` stops at its first step, saying
    how to get some, before it asks anything or creates anything (no network: no_aws)."""
    from cloudtrain import launch_check

    asked = []
    report = launch_check.run(confirm=asked.append)
    assert [(s.name, s.ok) for s in report.steps] == [("credentials", False)]
    assert report.steps[0].detail == "no AWS credentials found"
    assert "aws configure" in report.steps[0].hint
    assert asked == [] and report.job_id is None
    assert launch_check.exit_code(report) == 1
    assert launch_check.render_end(report).splitlines()[-1] == \
        "FAILED at credentials: nothing is left running"


def test_gpu_without_launch_is_a_usage_error(cli):
    """Issue 25: --gpu (and --yes) only mean something with --launch."""
    proc = cli("check", "--gpu")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == "Error: --gpu applies to --launch"
    # issue 37: so does --recovery, which is a check of its own (not with --gpu)
    proc = cli("check", "--recovery")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[:2] == ["Error: --recovery applies to --launch",
                                            "Hint: cloudtrain check --launch --recovery"]
    proc = cli("check", "--launch", "--gpu", "--recovery")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == ("Error: --gpu and --recovery are separate checks: "
                                           "run one, then the other")
    # and --nodes N (issue 37's two nodes meeting), on 2 to 4 nodes
    proc = cli("check", "--nodes", "2")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[:2] == ["Error: --nodes applies to --launch",
                                            "Hint: cloudtrain check --launch --nodes 2"]
    proc = cli("check", "--launch", "--recovery", "--nodes", "2")
    assert proc.returncode == 2 and "--recovery and --nodes are separate checks" in proc.stderr
    for n in ("1", "5"):
        proc = cli("check", "--launch", "--nodes", n, "--yes")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines()[0] == f"Error: --nodes {n}: the check runs on 2 to 4 " \
                                              "nodes", proc.stderr
    proc = cli("check", "--launch", "--nodes", "two")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_check_launch_gpu_takes_the_regions_cheapest_whole_gpu_type(cli, launch_lab):
    """Issue 25: `--gpu` launches the region's cheapest type with a whole GPU that runs the
    x86_64 Deep Learning AMI (not the fractional g6f, not the arm64 g5g): g4dn.xlarge in
    us-east-1, at the catalog's price, billed the same way."""
    from cloudtrain import catalog

    aws = launch_lab
    proc = cli("check", "--launch", "--gpu", "--json", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["instance_type"] == "g4dn.xlarge"
    cheaper = [t.name for t in catalog.load().values()
               if (t.on_demand.get(REGION) or 1e9) < data["price_per_hour"]]
    assert cheaper and all(catalog.get(n).gpus < 1 or catalog.get(n).arch != "x86_64"
                           for n in cheaper)
    assert data["price_per_hour"] == catalog.get("g4dn.xlarge").on_demand[REGION]
    (raw,) = aws.instances()
    assert raw["InstanceType"] == "g4dn.xlarge" and raw["State"]["Name"] == "terminated"
    (bill,) = data["steps"][-1]["data"]["instances"]
    assert bill["billed_seconds"] == 60 and bill["compute_usd"] == pytest.approx(
        data["price_per_hour"] * 60 / 3600)
    assert data["cost_usd"] == pytest.approx(bill["usd"])


def test_check_launch_at_a_quota_says_which_quota_to_raise(cli, launch_lab, monkeypatch):
    """Issue 25: RunInstances refused for a quota (VcpuLimitExceeded) fails that step with
    the quota a t3.micro counts against (not the GPU quotas a job's launch names) and where
    to ask for more; nothing was started."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    def run_instances(self, *args, **kwargs):
        raise EC2ClientError("VcpuLimitExceeded", "You have requested more vCPU capacity than "
                             "your current vCPU limit of 0 allows")

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)
    proc = cli("check", "--launch", "--json", timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (bad,) = [s for s in json.loads(proc.stdout)["steps"] if not s["ok"]]
    assert bad["name"] == "RunInstances" and "VcpuLimitExceeded" in bad["detail"]
    assert bad["hint"] == ("ask AWS for more vCPUs of 'Running On-Demand Standard (A, C, D, H, "
                           "I, M, R, T, Z) instances' (L-1216C47A) in us-east-1: https://us-east"
                           "-1.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/"
                           "L-1216C47A")
    assert launch_lab.instances() == []
