"""AWS's refusals said in words (F10) and region names checked before boto sees them (F24).

In-process moto (`mock_aws`); the refusals are injected with botocore `before-call` hooks on
the provider's own clients, so everything else still reaches moto."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys

import pytest

from labs.aws import ec2_provider  # noqa: F401  (fixture)
from cloudtrain.config import Settings
from cloudtrain.errors import CloudtrainError, UsageError
from cloudtrain.providers.aws import AWSError, AWSProvider
from cloudtrain.spec import JobSpec
from conftest import REPO
from labs.credentials import KEYS_ENV, NO_AWS_FILES
from labs.loopback import serve

CREDS = {**KEYS_ENV, **NO_AWS_FILES}


@pytest.fixture
def provider(ec2_provider):
    return ec2_provider


def _refuse(client, operation, code, message, status=403):
    """Make `client` answer `operation` with AWS's error `code` (nothing reaches moto)."""
    from botocore.awsrequest import AWSResponse

    def hook(**kwargs):
        return (AWSResponse("https://aws.invalid/", status, {}, None),
                {"Error": {"Code": code, "Message": message}})

    client.meta.events.register(f"before-call.{client.meta.service_model.endpoint_prefix}."
                                f"{operation}", hook)


def test_F10_unauthorized_run_instances_names_the_action_and_the_policy(provider):
    ec2 = provider.aws.client("ec2", "us-east-1")
    _refuse(ec2, "DescribeKeyPairs", "UnauthorizedOperation",
            "You are not authorized to perform this operation. User: arn:aws:iam::1:user/me is "
            "not authorized to perform: ec2:DescribeKeyPairs because no identity-based policy "
            "allows the ec2:DescribeKeyPairs action. Encoded authorization failure message: "
            "AbCdEf0123456789")
    with pytest.raises(AWSError) as err:
        provider.aws.call("us-east-1", "describe_key_pairs")
    e = err.value
    assert e.code == "UnauthorizedOperation"
    assert e.message.startswith("not allowed: ec2:DescribeKeyPairs in us-east-1")
    assert "Encoded authorization" not in e.message  # a wall of base64 helps nobody
    assert "infra/iam-policy-cli.json" in e.hint


def test_F10_access_denied_on_the_price_list_is_an_aws_error(provider):
    pricing = provider.aws.client("pricing", "us-east-1")
    _refuse(pricing, "GetProducts", "AccessDeniedException",
            "User: arn:aws:iam::1:user/me is not authorized to perform: pricing:GetProducts")
    with pytest.raises(AWSError) as err:
        provider.account.on_demand_prices("us-east-1", ["g5.xlarge"])
    assert "not allowed: pricing:GetProducts" in err.value.message
    assert "infra/iam-policy-cli-account.json" in err.value.hint  # RE1: the file that has it


def test_F10_access_denied_without_the_action_in_the_message_names_the_operation(provider):
    # STS says AccessDenied with its own wording; the action is then service:operation.
    import botocore.exceptions

    from cloudtrain.providers.aws.errors import client_error

    exc = botocore.exceptions.ClientError(
        {"Error": {"Code": "AccessDenied", "Message": "Access denied"}}, "GetCallerIdentity")
    e = client_error(exc, "us-east-1", "sts")
    assert e.message == "not allowed: sts:GetCallerIdentity in us-east-1 (AccessDenied): Access denied"


def test_F10_opt_in_required_says_to_enable_the_region(provider):
    ec2 = provider.aws.client("ec2", "us-east-1")
    _refuse(ec2, "DescribeSubnets", "OptInRequired",
            "You are not subscribed to this service. Please go to http://aws.amazon.com to "
            "subscribe.", status=401)
    with pytest.raises(AWSError) as err:
        provider.account.subnets("us-east-1")
    assert "OptInRequired" in err.value.message and "ec2:DescribeSubnets" in err.value.message
    assert "enable the region" in err.value.hint and "iam-policy-cli.json" in err.value.hint


def test_F10_any_other_client_error_is_one_line_not_internal(provider):
    ec2 = provider.aws.client("ec2", "us-east-1")
    _refuse(ec2, "DescribeSecurityGroups", "InvalidParameterCombination", "odd", status=400)
    with pytest.raises(AWSError, match="AWS DescribeSecurityGroups failed in us-east-1: "
                                       "InvalidParameterCombination: odd"):
        provider.account.ensure_group("us-east-1", "vpc-1", "arn:aws:iam::1:user/me")


def test_F10_cleanup_keeps_going_on_dependency_violation(provider):
    """The one code cleanup tolerates still arrives as AWSError.code (a group still attached
    to an instance that is shutting down: EC2 answers DependencyViolation)."""
    ec2 = provider.aws.client("ec2", "us-east-1")
    owner = provider.account.owner("us-east-1")
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    provider.account.ensure_group("us-east-1", vpc, owner)
    _refuse(ec2, "DeleteSecurityGroup", "DependencyViolation", "resource has a dependent object",
            status=400)
    provider.cleanup(None, {"us-east-1"})  # no exception
    assert ec2.describe_security_groups(Filters=[{"Name": "group-name",
                                                  "Values": ["cloudtrain"]}])["SecurityGroups"]


@pytest.mark.parametrize("region", ["../../x", "us-east-1; id", "US-EAST-1", "us-east-", ""])
def test_F24_bad_region_is_a_usage_error_before_any_session(region, monkeypatch):
    import boto3

    def no_session(*a, **k):
        raise AssertionError("a boto3 Session was made for a bad region")

    monkeypatch.setattr(boto3, "Session", no_session)
    provider = AWSProvider(Settings())
    spec = JobSpec.of(kind="command", backend="aws", command="true", instance_type="g5.xlarge",
                   region=region or "x")
    with pytest.raises(UsageError, match="^unknown AWS region .* .from --region"):
        provider.account.region(spec)
    with pytest.raises(UsageError, match="^unknown AWS region "):
        provider.aws.client("ec2", region or "?")
    with pytest.raises(UsageError, match="from `region:` in config.yaml"):
        AWSProvider(Settings(region=region or "?")).account.region()


def test_F24_region_from_the_aws_chain_is_checked(monkeypatch):
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_REGION", "../../x")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "../../x")
    with pytest.raises(UsageError, match="from AWS_REGION"):  # the variable it came from
        AWSProvider(Settings()).account.region()
    monkeypatch.setenv("AWS_REGION", "us-gov-west-1")  # GovCloud names pass
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-gov-west-1")
    assert AWSProvider(Settings()).account.region() == "us-gov-west-1"


def test_F24_cli_launch_with_a_bad_region_is_one_line(tmp_path):
    env = {**os.environ, **CREDS, "AWS_EC2_METADATA_DISABLED": "true"}
    for region in ("../../x", "us-east-1; id"):
        proc = subprocess.run([sys.executable, "-m", "cloudtrain", "launch", "--backend", "aws",
                               "--instance", "g5.xlarge", "--region", region, "--", "true"],
                              cwd=REPO, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines()[0].startswith("Error: unknown AWS region ")
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_F10_every_aws_failure_is_a_cloudtrain_error(provider):
    """botocore's own (non-HTTP) failures too: a bad parameter never escapes raw."""
    with pytest.raises(CloudtrainError):
        provider.aws.call("us-east-1", "describe_instances", InstanceIds="not-a-list")


def test_F10_ami_lookup_refused_by_ssm_falls_back_to_the_name_then_says_so(provider):
    ssm = provider.aws.client("ssm", "us-east-1")
    _refuse(ssm, "GetParameter", "AccessDeniedException",
            "User: arn:aws:iam::1:user/me is not authorized to perform: ssm:GetParameter")
    with pytest.raises(AWSError, match="no AWS Deep Learning PyTorch AMI found in us-east-1"):
        provider.account.resolve_image("us-east-1")


def test_F10_unreadable_credentials_are_an_aws_error(provider, monkeypatch):
    import botocore.exceptions

    def broken(*a, **k):
        raise botocore.exceptions.CredentialRetrievalError(provider="sso", error_msg="expired")

    session = provider.aws.session("us-east-1")
    monkeypatch.setattr(session, "get_credentials", broken)
    with pytest.raises(AWSError, match="AWS credentials could not be loaded"):
        provider.aws.credentials("us-east-1")


# -- U59: answers that are not AWS's ---------------------------------------------------------

MOTO_500 = (b"<!doctype html>\n<html lang=en>\n<title>500 Internal Server Error</title>\n"
            b"<h1>Internal Server Error</h1>\n<p>The server encountered an internal error and "
            b"was unable to complete your request.</p>\n")


class _Foreign(http.server.BaseHTTPRequestHandler):
    """Whatever is asked, the answer the server holds: (status, content type, body); each
    request counted."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, kind, body = self.server.answer
        self.server.requests += 1
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args):
        pass


def test_F10_an_endpoint_answering_html_is_said_not_crashed_on(cli, ct_home, monkeypatch):
    url, server = serve(_Foreign)  # a captive portal: 200 and an HTML page, whatever is asked
    server.answer, server.requests = (
        200, "text/html", b"<html><body>Please log in to the hotel Wi-Fi</body></html>"), 0
    try:
        env = {"AWS_ENDPOINT_URL": url, **KEYS_ENV, "AWS_DEFAULT_REGION": "us-east-1"}
        for args in (("status", "--refresh"), ("down", "--all", "-y"),
                     ("catalog", "--refresh", "--region", "us-east-1")):
            proc = cli(*args, env=env)
            assert "internal error" not in proc.stderr, (args, proc.stderr)
            assert proc.returncode == 1 and "not an AWS reply" in proc.stdout + proc.stderr, \
                (args, proc.stdout, proc.stderr)
    finally:
        server.shutdown()


@pytest.fixture
def foreign(monkeypatch, ct_home):
    """An AWSProvider whose clients reach a loopback server answering what the test sets
    (`server.answer`), retrying once (the provider's clients retry six times)."""
    from botocore.config import Config

    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    url, server = serve(_Foreign)
    server.answer, server.requests = (500, "text/html; charset=utf-8", MOTO_500), 0
    provider = AWSProvider(Settings(region="us-east-1"))

    def client(service):
        return provider.aws.session("us-east-1").client(
            service, region_name="us-east-1", endpoint_url=url,
            config=Config(retries={"max_attempts": 1, "mode": "standard"}))

    yield server, client
    server.close()


def test_u59_an_html_error_page_is_one_line_with_the_call_and_the_status(foreign):
    """U59: moto's HTML 500 for DescribePlacementGroups ended `check --launch` as an
    "internal error" (botocore's ResponseParserError, the whole page in it), and Service
    Quotas' HTML answers became error messages holding the whole page. Each is one line:
    the call, the region, the HTTP status; a 5xx is retried as the transient error it is."""
    from cloudtrain.providers.aws.errors import aws_errors

    server, client = foreign
    said = f"(HTTP 500: not an AWS reply: text/html, {len(MOTO_500)} bytes)"
    for service, call, operation in (("ec2", "describe_placement_groups",
                                      "DescribePlacementGroups"),
                                     ("service-quotas", "list_services", "ListServices"),
                                     ("s3", "list_buckets", "ListBuckets"),
                                     ("sts", "get_caller_identity", "GetCallerIdentity")):
        server.requests = 0
        with pytest.raises(AWSError) as err:
            with aws_errors("us-east-1", service):
                getattr(client(service), call)()
        assert err.value.message == f"{operation} failed in us-east-1 {said}", service
        assert err.value.code == "500" and "proxy" in err.value.hint
        assert server.requests == 2, service  # retried once, as any 5xx
    # a proxy's plain-text 502, and a captive portal's 200 page
    server.answer = (502, "text/plain", b"upstream connect error or disconnect/reset")
    with pytest.raises(AWSError, match=r"^DescribeVpcs failed in us-east-1 \(HTTP 502: not an "
                                       r"AWS reply: text/plain, 42 bytes\)$"):
        with aws_errors("us-east-1"):
            client("ec2").describe_vpcs()
    server.answer = (200, "text/html", b"<!DOCTYPE html><p>Log in to the hotel Wi-Fi")
    with pytest.raises(AWSError, match=r"^DescribeVpcs failed in us-east-1 \(HTTP 200: not an "
                                       r"AWS reply: text/html\)$"):
        with aws_errors("us-east-1"):
            client("ec2").describe_vpcs()
    # AWS's own error documents are left as they are
    server.answer = (400, "text/xml", b"<Response><Errors><Error><Code>InvalidParameterValue"
                     b"</Code><Message>bad filter</Message></Error></Errors></Response>")
    with pytest.raises(AWSError) as err:
        with aws_errors("us-east-1"):
            client("ec2").describe_vpcs()
    assert err.value.code == "InvalidParameterValue" and err.value.message.endswith(
        "InvalidParameterValue: bad filter")


def test_u59_a_page_botocore_cannot_read_is_an_aws_error_even_without_the_hook(foreign):
    """Where a client was made without the provider's hook, botocore's ResponseParserError
    is still said in one line, not an internal error."""
    import boto3

    from cloudtrain.providers.aws.errors import aws_errors

    server, client = foreign
    plain = boto3.Session(region_name="us-east-1").client(
        "ec2", endpoint_url=client("ec2").meta.endpoint_url)
    with pytest.raises(AWSError, match=r"^AWS in us-east-1 answered something botocore cannot "
                                       r"read \(Unable to parse response") as err:
        with aws_errors("us-east-1"):
            plain.describe_vpcs()
    assert "<html" not in err.value.message
