"""Providers turn a job's resources into hosts and back.

    get(name, settings=None)    the provider of a backend: "local" (this machine, local.py) or
                                "aws" (EC2, S3 and the rest of AWS, aws/)
    shared()                    within it, get() gives one provider per backend and settings
    DatasetReader(settings)     reads a job's datasets with the provider that can
    able(capability, settings)  (name, provider) of each backend that has a capability

The contract, every verb the rest of cloudtrain calls on a provider with one line each, is
base.py: `Provider` (any backend) and the capabilities only some have. Nothing outside aws/
imports the AWS SDK or talks to AWS: what the lifecycle and the commands need of the cloud is
a verb there.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..config import BACKENDS
from ..datasets import Staged
from ..errors import UsageError
from .base import Datasets

__all__ = ["DatasetReader", "able", "get", "shared"]

# Within shared(): the providers made, by (backend, id of the settings given).
_SHARED: dict[tuple[str, int], Any] | None = None


@contextlib.contextmanager
def shared():
    """Within it, get() gives the provider it gave before for the same backend and settings:
    `status` refreshes every active job with one AWS session (its credentials resolved once,
    a role assumed once, its clients and their connections kept) rather than one per job."""
    global _SHARED
    if _SHARED is not None:  # already within: the outer one keeps them
        yield
        return
    _SHARED = {}
    try:
        yield
    finally:
        _SHARED = None


def get(name: str, settings=None):
    """The provider of backend `name`, with `settings` (None: config.yaml's, loaded now)."""
    if _SHARED is None:
        return _made(name, settings)
    key = (name, id(settings))
    if key not in _SHARED:
        _SHARED[key] = (_made(name, settings), settings)  # settings kept: its id stays its own
    return _SHARED[key][0]


def _made(name: str, settings):
    if name == "local":
        from .local import LocalProvider

        return LocalProvider(settings)
    if name == "aws":
        from .aws import AWSProvider

        return AWSProvider(settings)
    raise UsageError(f"unknown backend '{name}'; known backends: {', '.join(BACKENDS)}")


def able(capability, settings=None) -> list[tuple[str, Any]]:
    """(name, provider) of each backend whose provider has `capability` (a Protocol of
    base.py: Sweeps, CloudRecovery, ...), in BACKENDS order: what `down --all` sweeps and
    `status --refresh` asks, with no backend named."""
    found = [(name, get(name, settings)) for name in BACKENDS]
    return [(name, p) for name, p in found if isinstance(p, capability)]



class DatasetReader:
    """Reads a job's datasets before launch (datasets.preflight) with the provider that can:
    the job's own where it reads datasets itself (a Datasets), else (the local backend) an S3
    dataset with the user's AWS credentials as the AWS provider reads it (the host fetches it
    with presigned links); an EBS snapshot needs an AWS instance."""

    def __init__(self, settings=None):
        self.settings = settings

    def read_dataset(self, spec, source: dict) -> Staged:
        provider = get(spec.backend, self.settings)
        if isinstance(provider, Datasets):
            return provider.read_dataset(spec, source)
        if source["kind"] == "snapshot":
            raise UsageError(f"dataset {source['name']}: an EBS snapshot "
                             f"({source['location']}) becomes a volume on an AWS instance; the "
                             f"{spec.backend} backend cannot use it",
                             hint="use --backend aws, or a path: on this machine")
        return get("aws", self.settings).read_dataset(spec, source)

    def staging_disk(self, spec, wanted: int) -> dict:
        """The disks the copy can go onto (base.Datasets.staging_disk), as the job's provider
        has them; a provider that reads no datasets itself has no local disk to say and no
        volume to buy throughput for (this machine: the data dir is the disk)."""
        provider = get(spec.backend, self.settings)
        return provider.staging_disk(spec, wanted) if isinstance(provider, Datasets) \
            else {"local": None, "mbps": wanted or None}
