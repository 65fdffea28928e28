"""`cloudtrain check` (issue 16): the settings and where each came from, then the AWS side
(credentials, account, region, the Deep Learning AMI, GPU vCPU quotas against what the
recipes launch), each with a verdict; against in-process moto with Service Quotas for EC2
added (tests/moto_quotas.py), and with no AWS at all."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from moto import mock_aws

from aws_lab import AWS_ENV, REGION, SUBNETS, AWSLab
from cloudtrain import check
from cloudtrain.config import Settings
from moto_quotas import EC2Quotas

# moto's own fake keys (FOOBARKEY) would replace the credentials each test sets up.
MOTO = {"core": {"mock_credentials": False, "passthrough": {"urls": [], "services": []},
                 "reset_boto3_session": True, "service_whitelist": None}}
QUOTA_ROWS = ["quota G on-demand", "quota P on-demand", "quota G spot", "quota P spot"]


def by_name(report: check.Report) -> dict[str, check.Check]:
    return {c.name: c for c in report.checks}


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
def moto(no_aws, monkeypatch, quotas):
    """In-process moto with the lab's test credentials in the environment and us-east-1
    (no_aws's guard stays: moto answers before a request would be sent)."""
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
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
    assert region.detail == "'moon' is not an AWS region name (from AWS_REGION)"
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


# -- the Deep Learning AMI ---------------------------------------------------------------------


def test_the_deep_learning_ami_found_in_the_region(moto, dlami):
    """Issue 16: the DLAMI the launch would use, found through the provider's lookup (its SSM
    parameter), with its name and date."""
    ami = by_name(check.run())["AMI"]
    assert ami.verdict == "ok"
    assert re.fullmatch(rf"{dlami.ami} Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2\.9 "
                        r"\(Ubuntu 24\.04\) 20261101, created \d{4}-\d\d-\d\d", ami.detail), ami
    assert ami.data["id"] == dlami.ami


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


def test_quotas_that_cover_every_recipe_are_ok(moto, dlami, quotas):
    """Issue 16: each vCPU quota the recipes' instances count against (G and P, on-demand and
    spot) is read from Service Quotas and is ok when it covers the largest need; exit 0."""
    quotas.set_all(on_demand_g=64, on_demand_p=1024, spot_g=64, spot_p=1024)
    report = check.run()
    found = by_name(report)
    assert [c.name for c in report.checks if c.name.startswith("quota")] == QUOTA_ROWS
    assert all(found[n].verdict == "ok" for n in QUOTA_ROWS), report.checks
    assert found["quota G on-demand"].detail.startswith(
        "Running On-Demand G and VT instances (L-DB2E81BA): 64 vCPUs: enough for every recipe")
    # The largest need: imagenet's 16-machine variant, 16 x p3.16xlarge (64 vCPUs each).
    assert "the most: 16 x p3.16xlarge needs 1024 (imagenet machines-16)" in \
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
    """Issue 16: a P quota of 64 runs the one-machine 8-GPU variants but not imagenet's
    multi-machine ones: a warning naming them, exit 0."""
    quotas.set_all(on_demand_g=64, on_demand_p=64, spot_g=64, spot_p=1024)
    report = check.run()
    p = by_name(report)["quota P on-demand"]
    assert p.verdict == "warning", p
    assert "64 vCPUs: too few where 4 x p3.16xlarge needs 256 (imagenet machines-4); 8 x " \
           "p3.16xlarge needs 512 (imagenet machines-8); 16 x p3.16xlarge needs 1024" in p.detail
    assert "request an increase to 1024" in p.hint
    assert check.exit_code(report) == 0


def test_a_quota_never_changed_is_read_as_the_aws_default(moto, dlami, quotas):
    """Issue 16: GetServiceQuota has no applied value for a quota never changed
    (NoSuchResourceException); AWS's default value is read instead."""
    quotas.set_all(on_demand_g=0, on_demand_p=0, spot_g=0, spot_p=0, applied=False)
    quotas.applied["L-417A185B"] = 1024  # raised once, in this account
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
    quotas.set_all(on_demand_g=0, on_demand_p=64, spot_g=64, spot_p=1024)
    report = check.run()
    text = check.render(report, width=80)
    # Every line fits, but a console URL (88 characters) or a path (pytest's temporary home)
    # is never broken: it stays copyable, on a line of its own.
    long = [line for line in text.splitlines() if len(line) > 80]
    assert all(re.fullmatch(r"  \S+", line) for line in long), text
    assert "  https://us-east-1.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/" \
           "L-DB2E81BA" in long
    data = json.loads(check.to_json(report))
    assert data["exit_code"] == 1 and data["problems"] == 1 and data["warnings"] == 1
    assert len(data["settings"]) == len(report.settings)
    verdicts = {c["name"]: c["verdict"] for c in data["checks"]}
    assert verdicts["quota G on-demand"] == "problem" and verdicts["AMI"] == "ok"
    g = next(c for c in data["checks"] if c["name"] == "quota G on-demand")
    assert g["data"]["code"] == "L-DB2E81BA" and g["data"]["vcpus"] == 0
    assert g["data"]["needs"][0] == {"instance_type": "g5.xlarge", "nodes": 1, "vcpus": 4.0,
                                     "for": g["data"]["needs"][0]["for"]}
