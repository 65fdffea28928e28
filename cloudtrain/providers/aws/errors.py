"""AWS's errors in our words: which codes mean "try another AZ", "no AZ will help", "bad
credentials" or "the cached resource is gone", and the one context manager that says them."""

from __future__ import annotations

import contextlib

from ...errors import CloudtrainError, MissingDependency

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


class AWSError(CloudtrainError):
    pass


def _code(exc) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def _message(exc) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Message", str(exc))


@contextlib.contextmanager
def aws_errors(region: str):
    """Credentials and endpoint failures, said once, in words that say what to do."""
    import botocore.exceptions

    try:
        yield
    except botocore.exceptions.NoCredentialsError as exc:
        raise MissingDependency(
            "no AWS credentials found",
            hint="run `aws configure`, or set AWS_PROFILE (or AWS_ACCESS_KEY_ID and "
                 "AWS_SECRET_ACCESS_KEY); `cloudtrain launch --dry-run` works without") from exc
    except botocore.exceptions.ClientError as exc:
        if _code(exc) in AUTH_ERRORS:
            raise AWSError(f"AWS refused the credentials ({_code(exc)}): {_message(exc)}",
                           hint="refresh them (aws sso login, or new access keys)") from exc
        raise
    except botocore.exceptions.EndpointConnectionError as exc:
        raise AWSError(f"cannot reach AWS in {region}: {exc}") from exc


class StaleCache(Exception):
    """RunInstances named a cached resource that no longer exists."""
