"""Providers turn a job's resources into hosts and back.

    get(name, settings=None)    the provider of a backend: "local" (this machine, local.py) or
                                "aws" (EC2, S3 and the rest of AWS, aws/)

The contract, every verb the rest of cloudtrain calls on a provider with one line each, is
base.py: `Provider` (any backend) and `CloudProvider` (what only a cloud adds). Nothing
outside aws/ imports the AWS SDK or talks to AWS: what the lifecycle and the commands need
of the cloud is a verb there.
"""

from __future__ import annotations

from ..config import BACKENDS
from ..errors import UsageError

__all__ = ["get"]


def get(name: str, settings=None):
    """The provider of backend `name`, with `settings` (None: config.yaml's, loaded now)."""
    if name == "local":
        from .local import LocalProvider

        return LocalProvider(settings)
    if name == "aws":
        from .aws import AWSProvider

        return AWSProvider(settings)
    raise UsageError(f"unknown backend '{name}'; known backends: {', '.join(BACKENDS)}")
