"""AwsAccount: the AWS account an AWSProvider works in (its `account`, the contract's
CloudAccount in providers/base.py), each verb one line handing the AwsSession to the concern
module that does the work: region and credentials (session.py, account.py), prices and
quotas (pricing.py, instance_types.py, account.py), datasets in S3 (datasets.py), and what a
launch makes, one step at a time for `check --launch` (network.py, images.py, results.py,
inventory.py)."""

from __future__ import annotations

from pathlib import Path

from . import (account, datasets, fis, images, instance_types, inventory, job_role, network, pricing,
               reservations, results)
from .session import DEFAULT_REGION, DEFAULT_SOURCE, AwsSession


class AwsAccount:
    """The account's verbs, by delegation; `aws` is the provider's own session."""
    DEFAULT_REGION, DEFAULT_SOURCE = DEFAULT_REGION, DEFAULT_SOURCE

    def __init__(self, aws: AwsSession):
        self.aws = aws

    # -- where, and as whom

    def region(self, spec=None) -> str:
        return self.aws.region(spec)

    def region_and_source(self, asked: str | None = None) -> tuple[str, str]:
        return self.aws.region_and_source(asked)

    def profile(self) -> str:
        return account.profile(self.aws)

    def configured(self) -> bool:
        return self.aws.configured()

    def credential_source(self, region: str) -> dict | None:
        return account.credential_source(self.aws, region)

    def check_credentials(self, region: str) -> None:
        return self.aws.check_credentials(region)

    def owner(self, region: str) -> str:
        return self.aws.owner(region)

    def owner_prefix(self, region: str) -> dict:
        return account.owner_prefix(self.aws, region)

    # -- prices and quotas

    def account_plan(self) -> dict | None:
        return account.account_plan(self.aws)

    def refresh_list_prices(self, region: str) -> str:
        return pricing.refresh_list_prices(self.aws, region)

    def refresh_spot(self, region: str) -> str:
        return pricing.refresh_spot(self.aws, region)

    def on_demand_prices(self, region: str, instance_types: list[str]) -> dict[str, float]:
        return pricing.on_demand_prices(self.aws, region, instance_types)

    def type_offered(self, region: str, name: str) -> bool | None:
        return instance_types.type_offered(self.aws, region, name)

    def reserved_type(self, region: str, reservation: str) -> str:
        return reservations.read(self.aws, region, reservation).instance_type

    def usable_reservations(self, region: str) -> list[str]:
        return reservations.usable(self.aws, region)

    def vcpu_quota(self, instance_type: str, market: str) -> tuple[str, str, str] | None:
        return account.vcpu_quota(instance_type, market)

    def quota_value(self, region: str, code: str) -> float:
        return account.ec2_quota(self.aws, region, code)

    def quota_console_url(self, region: str, code: str) -> str:
        return account.quota_console_url(region, code)

    def instance_profile_roles(self, region: str, name: str) -> list[str] | None:
        return account.instance_profile_roles(self.aws, region, name)

    def job_role_boundary(self, region: str) -> bool:
        return job_role.boundary_exists(self.aws, region)

    # -- datasets in S3

    def push_dataset(self, root: Path, bucket: str, prefix: str, *, shard_mb: int = 256,
                     workers: int = 8, region: str | None = None, progress=None) -> object:
        return datasets.push_dataset(self.aws, root, bucket, prefix, shard_mb=shard_mb,
                                     workers=workers, region=region, progress=progress)

    def dataset_size(self, location: str) -> dict:
        return datasets.dataset_size(self.aws, location)

    # -- what a launch makes, one step at a time

    def ensure_key(self, region: str, owner: str) -> tuple[str, Path]:
        return network.ensure_key(self.aws, region, owner)

    def subnets(self, region: str) -> list[tuple[str, str, str, str]]:
        return network.subnets(self.aws, region)

    def ensure_group(self, region: str, vpc: str, owner: str) -> str:
        return network.ensure_group(self.aws, region, vpc, owner)

    def ssh_cidr(self) -> str:
        return network.ssh_cidr(self.aws)

    def resolve_image(self, region: str, image: str | None = None) -> str:
        return images.resolve_ami(self.aws, region, image)

    def image_facts(self, region: str, image: str) -> dict:
        return images.image_facts(self.aws, region, image)

    def ensure_job_store(self, region: str, owner_key: str | None = None) -> tuple[str, bool]:
        return results.ensure_job_store(self.aws, region, owner_key)

    def job_store_found(self, region: str) -> tuple[str, bool]:
        return results.job_store_found(self.aws, region)

    def put_stored_object(self, region: str, job_id: str, name: str, data: bytes) -> str:
        return results.put_stored_object(self.aws, region, job_id, name, data)

    def delete_results(self, region: str, job_id: str) -> int:
        return results.delete_results(self.aws, region, job_id)

    def leftovers(self, region: str, job_id: str) -> dict[str, list[str]]:
        return inventory.leftovers(self.aws, region, job_id)

    def recovery_leftovers(self, region: str, job_id: str) -> dict[str, list[str]]:
        return inventory.recovery_leftovers(self.aws, region, job_id)

    # -- a spot interruption on demand (check --launch --recovery)

    def interrupt_spot(self, region: str, instance_id: str, job_id: str, owner: str
                       ) -> tuple[str, str]:
        return fis.interrupt(self.aws, region, instance_id, job_id, owner,
                             self.aws.settings.fis_role)

    def interruption(self, region: str, experiment_id: str) -> dict:
        return fis.experiment(self.aws, region, experiment_id)

    def end_interruption(self, region: str, template_id: str | None,
                         experiment_id: str | None) -> None:
        fis.end(self.aws, region, template_id, experiment_id)

    def shared_resources(self, region: str) -> dict[str, list[str]]:
        return network.shared_resources(self.aws, region)
