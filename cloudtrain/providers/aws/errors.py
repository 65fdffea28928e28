"""AWS's errors in our words: which codes mean "try another AZ", "no AZ will help", "bad
credentials" or "the cached resource is gone", and the one context manager that says them."""

from __future__ import annotations

import contextlib
import re

from ...errors import CloudError, CredentialsError, NoCredentials, PlacementError, UsageError

# Errors that mean "not here, maybe in another AZ" (tried once per AZ, never retried blindly);
# a subnet out of free addresses too: each AZ is tried through its own subnet.
CAPACITY_ERRORS = {"InsufficientInstanceCapacity", "InsufficientCapacity",
                   "Unsupported", "SpotMaxPriceTooLow", "InsufficientHostCapacity",
                   "InsufficientReservedInstanceCapacity", "InsufficientFreeAddressesInSubnet"}
# Errors that no other AZ will fix.
QUOTA_ERRORS = {"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded",
                "PendingVerification"}
AUTH_ERRORS = {"AuthFailure", "UnrecognizedClientException", "InvalidClientTokenId",
               "ExpiredToken", "ExpiredTokenException", "RequestExpired", "SignatureDoesNotMatch"}
# A cached key pair, group, subnet or AMI that is gone: bootstrap the region again.
STALE_ERRORS = {"InvalidKeyPair.NotFound", "InvalidGroup.NotFound", "InvalidAMIID.NotFound",
                "InvalidAMIID.Unavailable", "InvalidSubnetID.NotFound"}


POLICY_FILE = "infra/iam-policy-cli.json"  # EC2
# Beyond EC2 (who calls, prices, the DLAMI's id, the instance role, the job store's objects): a
# second policy beside it (one managed policy holds 6,144 characters, and one was near them).
ACCOUNT_POLICY_FILE = "infra/iam-policy-cli-account.json"
# Auto Scaling groups and their launch templates (issue 27): a third.
GROUPS_POLICY_FILE = "infra/iam-policy-autoscaling.json"
# A job's own IAM role (`instance_profile: per-job`, job_role.py): made and deleted under
# the permissions boundary.
JOB_ROLES_POLICY_FILE = "infra/iam-policy-job-roles.json"
JOB_ROLE_ACTIONS = ("iam:CreateRole", "iam:TagRole", "iam:PutRolePolicy", "iam:DeleteRolePolicy",
                    "iam:DeleteRole", "iam:CreateInstanceProfile", "iam:TagInstanceProfile",
                    "iam:AddRoleToInstanceProfile", "iam:GetPolicy", "iam:RemoveRoleFromInstanceProfile",
                    "iam:DeleteInstanceProfile", "iam:ListRoles")
# check --launch --recovery: AWS FIS experiments on one's own spot instances, with the
# role FIS acts with (infra/iam-policy-fis-role.json).
RECOVERY_CHECK_POLICY_FILE = "infra/iam-policy-recovery-check.json"
# The job store's bucket, made and locked down once by an administrator.
STORE_ADMIN_POLICY_FILE = "infra/iam-policy-store-admin.json"
ACCOUNT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "sts:",
                   "iam:", "pricing:", "ssm:", "freetier:", "servicequotas:",
                   "ec2:DescribeCapacity")


def policy_file(action: str) -> str:
    """The policy file that allows an IAM action cloudtrain calls."""
    if action.startswith("fis:"):
        return RECOVERY_CHECK_POLICY_FILE
    if action.startswith("autoscaling:") or "LaunchTemplate" in action:
        return GROUPS_POLICY_FILE
    if action in JOB_ROLE_ACTIONS:
        return JOB_ROLES_POLICY_FILE
    if action.startswith(ACCOUNT_ACTIONS):
        return ACCOUNT_POLICY_FILE
    if action.startswith("s3:"):  # the bucket's own settings
        return STORE_ADMIN_POLICY_FILE
    return POLICY_FILE
# The region names boto accepts, checked before any client is made: botocore's own check
# (InvalidRegionError, "Provided region_name ... doesn't match a supported format") fires
# late, deep inside client creation, and the name is also a path component (keys/<region>).


class AWSError(CloudError):
    """An AWS call that failed, in words; `code` is AWS's error code where there is one
    (callers branch on it: DryRunOperation, DependencyViolation, capacity codes)."""

    def __init__(self, message: str, hint: str | None = None, code: str = "",
                 aws_message: str = ""):
        super().__init__(message, hint=hint)
        self.code = code
        self.aws_message = aws_message  # AWS's own words, for callers that rephrase

    @property
    def denied(self) -> bool:
        return is_permission_error(self.code)

    @property
    def quota(self) -> bool:
        return self.code in QUOTA_ERRORS or any(q in self.message for q in QUOTA_ERRORS)

    def refused_action(self, service: str) -> str | None:
        """The IAM action AWS refused, from the botocore error this one was raised from."""
        return denied_action(self.__cause__, service) if self.__cause__ else None


class AWSCredentialsError(AWSError, CredentialsError):
    """AWS refused the credentials (expired, revoked) or they could not be loaded."""


class AWSPlacementError(AWSError, PlacementError):
    """No capacity in any AZ tried, or a quota: said like any AWSError, and recognisable by
    the recovery (PlacementError) without it knowing about AWS."""


def code_of(exc) -> str:
    """The AWS error code of a botocore ClientError ("" for anything else)."""
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def message_of(exc) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Message", str(exc))


def is_permission_error(code: str) -> bool:
    # EC2 says UnauthorizedOperation; STS, S3 and the Price List API say AccessDenied or
    # AccessDeniedException; a service or opt-in region the account has not enabled says
    # OptInRequired.
    return code in ("UnauthorizedOperation", "OptInRequired") or code.startswith("AccessDenied")


# S3 operations whose IAM action has another name (AWS's Service Authorization Reference);
# every other operation is authorised by the action of its own name.
S3_ACTIONS = {"HeadBucket": "ListBucket", "ListObjectsV2": "ListBucket",
              "PutBucketEncryption": "PutEncryptionConfiguration",
              "PutPublicAccessBlock": "PutBucketPublicAccessBlock",
              "PutBucketLifecycleConfiguration": "PutLifecycleConfiguration",
              "DeleteObjects": "DeleteObject", "HeadObject": "GetObject"}


def iam_action(service: str, operation: str) -> str:
    """The IAM action that authorises an API operation: s3 HeadBucket -> s3:ListBucket."""
    if service == "s3":
        operation = S3_ACTIONS.get(operation, operation)
    return f"{service}:{operation}"


def denied_action(exc, service: str) -> str:
    """The IAM action AWS refused: AWS names it ("... is not authorized to perform:
    ec2:RunInstances on resource ..."); otherwise (S3 says only "Access Denied") the action
    of the operation that was refused."""
    found = re.search(r"perform: ([\w-]+:\w+)", message_of(exc))
    return found.group(1) if found else iam_action(service, getattr(exc, "operation_name", "?"))


def client_error(exc, region: str | None, service: str) -> AWSError:
    """Any ClientError as an AWSError: permissions point at the policy, credentials at a
    refresh, the rest say the call, the code and AWS's message."""
    code = code_of(exc)
    operation = getattr(exc, "operation_name", "") or "call"
    # EC2 appends a long "Encoded authorization failure message: ..." to UnauthorizedOperation.
    message = message_of(exc).split(" Encoded authorization failure message:")[0]
    said = {"code": code, "aws_message": message}
    if code.isdigit():  # no AWS error document: an HTTP status alone (foreign_answer's)
        return AWSError(f"{operation} failed in {region} (HTTP {code}"
                        + (f": {message}" if message.startswith(FOREIGN) else "") + ")",
                        hint=FOREIGN_HINT if message.startswith(FOREIGN) else None, **said)
    if code in AUTH_ERRORS:
        return AWSCredentialsError(f"AWS refused the credentials ({code}): {message}",
                        hint="refresh them (aws sso login, or new access keys)", **said)
    if code == "OptInRequired":
        return AWSError(f"AWS refused {denied_action(exc, service)} in {region} (OptInRequired): "
                        f"{message}",
                        hint=f"enable the region or subscribe the account (AWS console: Account "
                             f"> AWS Regions), or use another --region; the permissions cloudtrain "
                             f"needs are in {POLICY_FILE} and {ACCOUNT_POLICY_FILE}", **said)
    if is_permission_error(code):
        action = denied_action(exc, service)
        return AWSError(f"not allowed: {action} in {region} ({code}): {message}",
                        hint=f"attach {policy_file(action)} (it lists every action cloudtrain "
                             f"calls) to your IAM user or role; see infra/README.md", **said)
    if code in ("RequestLimitExceeded", "Throttling", "ThrottlingException"):
        return AWSError(f"AWS is throttling {operation} in {region} after retries: {message}",
                        hint="try again in a minute", **said)
    return AWSError(f"AWS {operation} failed in {region}: {code or 'error'}: {message}", **said)


# -- answers that are not AWS's ------------------------------------------------------------
#
# A proxy's or captive portal's error page, a load balancer's HTML 502, moto's HTML 500: an
# answer in no AWS protocol. botocore parses an error body by the service's protocol, and
# for one that is not in it either raises ResponseParserError with the whole page in its
# message (the XML protocols: EC2, S3, STS, IAM, Auto Scaling), or makes the page the error's
# message (the JSON ones: Service Quotas, SSM). foreign_answer, on botocore's before-parse
# event of every client the provider makes, replaces such a body with an error document of
# the service's own protocol: code the HTTP status, a message of a few words. botocore then
# raises the usual ClientError, which its retry mode retries where the status is transient
# (5xx), and client_error says in one line. A 2xx page is FOREIGN (nothing to retry).

FOREIGN = "not an AWS reply"
FOREIGN_HINT = ("something between you and AWS answered (a proxy, a captive portal, a wrong "
                "AWS_ENDPOINT_URL), or the service failed; try again")
XML_PROTOCOLS = ("ec2", "query", "rest-xml")
JSON_PROTOCOLS = ("json", "rest-json")


class ForeignAnswer(Exception):
    """A 2xx answer that is a web page, not an AWS reply."""

    def __init__(self, operation: str, status: int, kind: str):
        super().__init__(f"{operation} answered HTTP {status} with {kind}")
        self.operation, self.status, self.kind = operation, status, kind


def foreign_answer(response_dict: dict, operation_model, **_) -> None:
    """botocore's before-parse hook: an answer in no AWS protocol made an error document of
    the service's own (or, with a 2xx status, ForeignAnswer)."""
    body = response_dict.get("body")
    model = operation_model.service_model
    protocol = getattr(model, "resolved_protocol", None) or model.metadata.get("protocol")
    if not isinstance(body, (bytes, bytearray)) or not body.strip() or \
            protocol not in XML_PROTOCOLS + JSON_PROTOCOLS:
        return  # a stream (S3 GetObject), nothing (botocore's own case), or CBOR
    headers = {str(k).lower(): str(v) for k, v in (response_dict.get("headers") or {}).items()}
    kind = headers.get("content-type", "").split(";")[0].strip() or "no content type"
    status = int(response_dict.get("status_code") or 0)
    page = "html" in kind or bytes(body[:64]).lstrip().lower().startswith((b"<!doctype",
                                                                           b"<html"))
    if status < 300:
        if page:
            raise ForeignAnswer(operation_model.name, status, kind)
        return  # an S3 policy's JSON, say: the operation's own payload
    if not page and _parses(protocol, bytes(body)):
        return
    message = f"{FOREIGN}: {kind}, {len(body):,} bytes"
    response_dict["body"] = _error_document(protocol, str(status), message)


def _parses(protocol: str, body: bytes) -> bool:
    import json
    from xml.etree import ElementTree

    try:
        if protocol in XML_PROTOCOLS:
            ElementTree.fromstring(body)
        else:
            json.loads(body)
    except (ElementTree.ParseError, ValueError):
        return False
    return True


def _error_document(protocol: str, code: str, message: str) -> bytes:
    """An error as the protocol's own services write one (what botocore's parsers read)."""
    import json
    from xml.sax.saxutils import escape

    error = f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
    if protocol == "ec2":
        return f"<Response><Errors>{error}</Errors><RequestID/></Response>".encode()
    if protocol == "query":
        return f"<ErrorResponse>{error}</ErrorResponse>".encode()
    if protocol == "rest-xml":
        return error.encode()
    return json.dumps({"__type": code, "message": message}).encode()


def no_credentials() -> NoCredentials:
    """No credentials anywhere in botocore's chain (a launch adds that its dry run needs
    none: jobs.launch; other commands, data push, have no such way on)."""
    return NoCredentials(
        "no AWS credentials found",
        hint="run `aws configure`, or set AWS_PROFILE (or AWS_ACCESS_KEY_ID and "
             "AWS_SECRET_ACCESS_KEY)")


@contextlib.contextmanager
def aws_errors(region: str | None, service: str = "ec2"):
    """Every botocore failure, said once, as one of ours (never an "internal error")."""
    import botocore.exceptions
    import botocore.parsers

    try:
        yield
    except botocore.exceptions.NoCredentialsError as exc:
        raise no_credentials() from exc
    except botocore.exceptions.ClientError as exc:
        raise client_error(exc, region, service) from exc
    except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as exc:
        raise AWSError(f"cannot reach AWS in {region}: {exc}") from exc
    except (botocore.exceptions.InvalidRegionError, botocore.exceptions.NoRegionError) as exc:
        raise UsageError(f"bad AWS region {region!r}: {exc}",
                         hint="cloudtrain launch --region us-east-1 ...") from exc
    except (botocore.exceptions.PartialCredentialsError, botocore.exceptions.SSOError,
            botocore.exceptions.TokenRetrievalError,
            botocore.exceptions.CredentialRetrievalError) as exc:
        raise AWSCredentialsError(f"AWS credentials could not be loaded: {exc}",
                                  hint="refresh them (aws sso login, or new access keys)") from exc
    except botocore.exceptions.BotoCoreError as exc:
        raise AWSError(f"AWS call failed in {region}: {exc}") from exc
    except ForeignAnswer as exc:
        raise AWSError(f"{exc.operation} failed in {region} (HTTP {exc.status}: {FOREIGN}: "
                       f"{exc.kind})", hint=FOREIGN_HINT) from exc
    except botocore.parsers.ResponseParserError as exc:  # one foreign_answer let through
        raise AWSError(f"AWS in {region} answered something botocore cannot read "
                       f"({str(exc).splitlines()[0][:120]})", hint=FOREIGN_HINT) from exc
    except (KeyError, TypeError) as exc:
        # botocore parses any 200 answer, an HTML page included (a captive portal, a proxy,
        # a wrong AWS_ENDPOINT_URL), into a reply without the fields every AWS reply has.
        raise AWSError(f"the AWS endpoint for {region} answered something that is not an AWS "
                       f"reply (no {exc})", hint="check AWS_ENDPOINT_URL and any proxy or "
                       "captive portal between you and AWS") from exc


class StaleCache(Exception):
    """RunInstances named a cached resource that no longer exists."""
