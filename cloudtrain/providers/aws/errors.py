"""AWS's errors in our words: which codes mean "try another AZ", "no AZ will help", "bad
credentials" or "the cached resource is gone", and the one context manager that says them."""

from __future__ import annotations

import contextlib
import re

from ...errors import CloudError, CredentialsError, NoCredentials, PlacementError, UsageError

# Errors that mean "not here, maybe in another AZ" (tried once per AZ, never retried blindly).
CAPACITY_ERRORS = {"InsufficientInstanceCapacity", "InsufficientCapacity",
                   "Unsupported", "SpotMaxPriceTooLow", "InsufficientHostCapacity",
                   "InsufficientReservedInstanceCapacity"}
# Errors that no other AZ will fix.
QUOTA_ERRORS = {"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded",
                "PendingVerification"}
AUTH_ERRORS = {"AuthFailure", "UnrecognizedClientException", "InvalidClientTokenId",
               "ExpiredToken", "ExpiredTokenException", "RequestExpired", "SignatureDoesNotMatch"}
# A cached key pair, group, subnet or AMI that is gone: bootstrap the region again.
STALE_ERRORS = {"InvalidKeyPair.NotFound", "InvalidGroup.NotFound", "InvalidAMIID.NotFound",
                "InvalidAMIID.Unavailable", "InvalidSubnetID.NotFound"}


POLICY_FILE = "infra/iam-policy-cli.json"
# Auto Scaling groups and their launch templates (issue 27): a second policy beside it.
GROUPS_POLICY_FILE = "infra/iam-policy-autoscaling.json"


def policy_file(action: str) -> str:
    """The policy file that allows an IAM action cloudtrain calls."""
    return GROUPS_POLICY_FILE if action.startswith("autoscaling:") or \
        "LaunchTemplate" in action else POLICY_FILE
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


def _code(exc) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def _message(exc) -> str:
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
    found = re.search(r"perform: ([\w-]+:\w+)", _message(exc))
    return found.group(1) if found else iam_action(service, getattr(exc, "operation_name", "?"))


def client_error(exc, region: str, service: str) -> AWSError:
    """Any ClientError as an AWSError: permissions point at the policy, credentials at a
    refresh, the rest say the call, the code and AWS's message."""
    code = _code(exc)
    operation = getattr(exc, "operation_name", "") or "call"
    # EC2 appends a long "Encoded authorization failure message: ..." to UnauthorizedOperation.
    message = _message(exc).split(" Encoded authorization failure message:")[0]
    said = {"code": code, "aws_message": message}
    if code in AUTH_ERRORS:
        return AWSCredentialsError(f"AWS refused the credentials ({code}): {message}",
                        hint="refresh them (aws sso login, or new access keys)", **said)
    if code == "OptInRequired":
        return AWSError(f"AWS refused {denied_action(exc, service)} in {region} (OptInRequired): "
                        f"{message}",
                        hint=f"enable the region or subscribe the account (AWS console: Account "
                             f"> AWS Regions), or use another --region; the permissions cloudtrain "
                             f"needs are in {POLICY_FILE}", **said)
    if is_permission_error(code):
        action = denied_action(exc, service)
        return AWSError(f"not allowed: {action} in {region} ({code}): {message}",
                        hint=f"attach {policy_file(action)} (it lists every action cloudtrain "
                             f"calls) to your IAM user or role; see infra/README.md", **said)
    if code in ("RequestLimitExceeded", "Throttling", "ThrottlingException"):
        return AWSError(f"AWS is throttling {operation} in {region} after retries: {message}",
                        hint="try again in a minute", **said)
    return AWSError(f"AWS {operation} failed in {region}: {code or 'error'}: {message}", **said)


def no_credentials() -> NoCredentials:
    """No credentials anywhere in botocore's chain (a launch adds that its dry run needs
    none: jobs.launch; other commands, data push, have no such way on, U21)."""
    return NoCredentials(
        "no AWS credentials found",
        hint="run `aws configure`, or set AWS_PROFILE (or AWS_ACCESS_KEY_ID and "
             "AWS_SECRET_ACCESS_KEY)")


@contextlib.contextmanager
def aws_errors(region: str, service: str = "ec2"):
    """Every botocore failure, said once, as one of ours (never an "internal error")."""
    import botocore.exceptions

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
    except (KeyError, TypeError) as exc:
        # botocore parses any 200 answer, an HTML page included (a captive portal, a proxy,
        # a wrong AWS_ENDPOINT_URL), into a reply without the fields every AWS reply has.
        raise AWSError(f"the AWS endpoint for {region} answered something that is not an AWS "
                       f"reply (no {exc})", hint="check AWS_ENDPOINT_URL and any proxy or "
                       "captive portal between you and AWS") from exc


class StaleCache(Exception):
    """RunInstances named a cached resource that no longer exists."""
