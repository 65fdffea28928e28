"""What the account is and may run: where the credentials came from, its plan (Free or
Paid), EC2's vCPU quotas per instance family (Service Quotas), and the instance profile a
job's instances get."""

from __future__ import annotations

import os
import re

from .errors import AWSError, aws_errors
from .session import AwsSession, assumed_role

# EC2 counts the vCPUs of running instances against one quota per family group, region and
# market (EC2 User Guide, "On-Demand Instance quotas" and "Spot Instance quotas"; service code
# ec2 in Service Quotas). A new account often has 0 for G and P: RunInstances then fails
# with VcpuLimitExceeded, whichever AZ is tried.
VCPU_QUOTAS = {
    ("P", "on-demand"): ("L-417A185B", "Running On-Demand P instances"),
    ("G", "on-demand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("P", "spot"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("G", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
}
# Instance families (the letters before the generation) and the quota group they count in.
FAMILY_GROUPS = {"p": "P", "g": "G", "gr": "G", "vt": "G"}

# botocore's names for where credentials came from (Credentials.method), in words.
CREDENTIAL_SOURCES = {
    "env": "environment variables (AWS_ACCESS_KEY_ID)",
    "shared-credentials-file": "the shared credentials file",
    "config-file": "the AWS config file",
    "sso": "AWS IAM Identity Center (SSO)",
    "assume-role": "an assumed role (role_arn in the profile)",
    "assume-role-with-web-identity": "a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE)",
    "custom-process": "a credential_process",
    "iam-role": "the instance's role (instance metadata)",
    "container-role": "the container's role",
    "explicit": "given explicitly",
}


def vcpu_quota(instance_type: str, market: str) -> tuple[str, str, str] | None:
    """(quota code, AWS's name for it, family group) of the vCPU quota that launching
    `instance_type` in `market` counts against; None for a family not listed here."""
    family = re.match(r"[a-z]+", instance_type or "")
    group = FAMILY_GROUPS.get(family.group()) if family else None
    if not group:
        return None
    found = VCPU_QUOTAS.get((group, market))
    return (*found, group) if found else None


def quota_console_url(region: str, code: str) -> str:
    """Where a quota's increase is requested in the AWS console."""
    return (f"https://{region}.console.aws.amazon.com/servicequotas/home/services/ec2/quotas/"
            f"{code}")


def profile(aws: AwsSession) -> str:
    """The AWS profile the session uses (config.yaml's `aws_profile:`, AWS_PROFILE, or
    the default)."""
    return aws.session().profile_name


def credential_source(aws: AwsSession, region: str) -> dict | None:
    """{source (in words), method (botocore's), profile, access_key (masked)} of the
    credentials the session found; None without any."""
    credentials = aws.credentials(region)
    if credentials is None:
        return None
    profile = aws.session(region).profile_name
    source = CREDENTIAL_SOURCES.get(credentials.method, credentials.method)
    if credentials.method == "shared-credentials-file":
        source += " " + os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")
    elif credentials.method == "config-file":
        source += " " + os.environ.get("AWS_CONFIG_FILE", "~/.aws/config")
    key = credentials.access_key or ""
    return {"source": source, "method": credentials.method, "profile": profile,
            "access_key": "*" * max(len(key) - 4, 0) + key[-4:]}


# The session names AWS gives that are one per process, instance or login.
BOTOCORE_SESSION = re.compile(r"botocore-session-\d+$")
INSTANCE_SESSION = re.compile(r"i-[0-9a-f]{8,17}$")


def owner_prefix(aws: AwsSession, region: str) -> dict:
    """{key, kind, stable, hint} of the caller's job-store prefix (`jobs/<key>/`, the caller's
    aws:userid): which kind of principal it is, and whether the next process, login or
    laptop of the same user finds the same prefix (jobs under another prefix are denied to
    it: infra/iam-policy-cli.json names `${aws:userid}`)."""
    found = aws.identity(region)
    key, arn = str(found.get("UserId") or ""), str(found.get("Arn") or "")
    role = assumed_role(arn)
    if role is None:
        kind = "the account's root user" if arn.endswith(":root") else \
            f"IAM user {arn.rsplit('/', 1)[-1]}"
        return {"key": key, "kind": kind, "stable": True, "hint": None}
    session = arn.rsplit("/", 1)[-1]
    if role[1].startswith("AWSReservedSSO_"):
        kind = f"IAM Identity Center user {session} (permission set {role[1]})"
    elif INSTANCE_SESSION.match(session):  # EC2 names an instance role's session after it
        kind = f"role {role[1]} of instance {session} (its own prefix: another instance's " \
               "processes get another)"
    elif BOTOCORE_SESSION.match(session):
        return {"key": key, "kind": f"role {role[1]}, session {session}", "stable": False,
                "hint": "botocore names each session after its start time: set "
                        "role_session_name in the profile (or AWS_ROLE_SESSION_NAME)"}
    else:
        kind = f"role {role[1]}, session {session}" + (
            " (named by cloudtrain: the profile names no role_session_name)"
            if aws.named_sessions else "")
    return {"key": key, "kind": kind, "stable": True, "hint": None}


# The Free Tier API is global: its one endpoint is in us-east-1 (freetier.us-east-1.api.aws).
FREE_TIER_REGION = "us-east-1"


def account_plan(aws: AwsSession) -> dict | None:
    """The account's plan (AWS Free Tier API, GetAccountPlanState): {"type": FREE or PAID,
    "status": NOT_STARTED, ACTIVE or EXPIRED, "expires": ISO date or None, "credits":
    "USD 100.00" or None}; None where AWS holds no plan for it (ResourceNotFoundException:
    an account on no Free plan). Accounts opened since 15 July 2025 start on the Free plan,
    on which EC2 launches only some small instance types: no GPU type until the account is
    upgraded to the Paid plan."""
    try:
        with aws_errors(FREE_TIER_REGION, "freetier"):
            got = aws.client("freetier", FREE_TIER_REGION).get_account_plan_state()
    except AWSError as exc:
        if exc.code == "ResourceNotFoundException":
            return None
        raise
    credits = got.get("accountPlanRemainingCredits") or {}
    expires = got.get("accountPlanExpirationDate")
    return {"type": str(got.get("accountPlanType") or "?"),
            "status": str(got.get("accountPlanStatus") or "?"),
            "expires": expires.date().isoformat() if hasattr(expires, "date") else None,
            "credits": f"{credits.get('unit') or 'USD'} {float(credits['amount']):.2f}"
            if isinstance(credits.get("amount"), (int, float)) else None}


def ec2_quota(aws: AwsSession, region: str, code: str) -> float:
    """An EC2 quota's value for this account in `region`: the applied value, else AWS's
    default (GetServiceQuota answers NoSuchResourceException for a quota whose applied
    value is not available, e.g. one never changed in the account)."""
    client = aws.client("service-quotas", region)
    try:
        with aws_errors(region, "servicequotas"):
            return float(client.get_service_quota(ServiceCode="ec2",
                                                  QuotaCode=code)["Quota"]["Value"])
    except AWSError as exc:
        if exc.code != "NoSuchResourceException":
            raise
    with aws_errors(region, "servicequotas"):
        return float(client.get_aws_default_service_quota(ServiceCode="ec2",
                                                          QuotaCode=code)["Quota"]["Value"])


def instance_profile_roles(aws: AwsSession, region: str, name: str) -> list[str] | None:
    """Read-only (`check`): the roles of the instance profile `name` (the credentials an
    instance launched with it gets), None where the account has no such profile."""
    try:
        with aws_errors(region, "iam"):
            found = aws.client("iam", region).get_instance_profile(
                InstanceProfileName=name)["InstanceProfile"]
    except AWSError as exc:
        if exc.code == "NoSuchEntity":
            return None
        raise
    return [str(r.get("RoleName")) for r in found.get("Roles") or []]
