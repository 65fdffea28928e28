"""AWSProvider: the provider contract (providers/base.py) over EC2 and the rest of AWS, each
verb one line handing its AwsSession (session.py) to the concern module that does the work.
It is a Provider with every capability; `account` (cloud_account.py) is the AWS account.

    preflight(spec)             instance type, before anything is created (instance_types.py)
    acquire(store, job, spec)   one instance: run_instances in each AZ in turn, record, wait,
                                SSH -> SSHHost (acquire.py, after bootstrap.py's key pair,
                                group and AMI); N of them in one AZ and placement group
                                (cluster.py)
    host_for(job)               SSHHost from the stored endpoint (host key pinned)
    release(store, job)         delete its Auto Scaling group, then terminate by record and
                                by tag: nothing bills afterwards (inventory.py)
    reconcile(store)            one DescribeInstances per region: every instance tagged ours
    orphans(store)              live instances of this owner that no active or kept job holds
    terminate(region, ids)      terminate those
    cleanup(store, regions)     delete the security group and key pair no instance uses
    plan(spec)                  what launch would do (dry run), without creating anything

Raw boto dicts stay inside this package. Every resource is tagged at creation
(TagSpecifications) with cloudtrain:job, cloudtrain:owner, cloudtrain:recipe and Name, so the
cloud itself can always tell what is ours, even with the local database lost.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from ... import config
from ...datasets import Staged
from ...hosts import Host
from ...progress import SILENT, Reporter
from ...ssh_host import SSHHost
from ...state import Job, Store
from ..base import Question, Sweep
from . import (
    acquire, budget_plan, cluster, datasets, group_launch, groups, host_setup, images, instance_types,
    instances, inventory, job_role, plan, results, volumes)
from .cloud_account import AwsAccount
from .session import AwsSession


class AWSProvider:
    """The contract's verbs, by delegation; `aws` is the session every module is handed."""
    name = "aws"

    def __init__(self, settings: config.Settings | None = None):
        self.aws = AwsSession(settings)
        self.settings = self.aws.settings
        self.account = AwsAccount(self.aws)

    # -- Provider: the core

    def plan(self, spec) -> list[tuple[str, str]]:
        return budget_plan.with_budget(self.aws, spec, plan.plan(self.aws, spec))

    def question(self, spec) -> Question | None:
        budget_plan.with_budget(self.aws, spec, [])  # one attempt must fit: refused first
        return plan.question(self.aws, spec)

    def preflight(self, spec) -> None:
        return instance_types.preflight(self.aws, spec)

    def acquire(self, store: Store, job: Job, spec, report: Reporter = SILENT) -> list[Host]:
        acquire.own_role(self.aws, store, job, spec, report)
        if spec.nodes > 1:  # all of them at once, or none
            return list(cluster.acquire_nodes(self.aws, store, job, spec, report))
        return [acquire.acquire(self.aws, store, job, spec, report)]

    def host_for(self, job: Job) -> Host:
        return acquire.host_for(job)

    def setup(self, host: Host) -> str | None:
        return host_setup.setup(self.aws, _ssh(host))

    def gpus(self, spec, host: Host) -> int:
        return host_setup.gpus(spec, _ssh(host))

    def jobdir(self, job_id: str, host: Host | None = None) -> str:
        return host_setup.jobdir(self.aws, job_id, _ssh(host) if host is not None else None)

    def data_dir(self, host: Host | None = None) -> str:
        return host_setup.data_dir(self.aws, _ssh(host) if host is not None else None)

    def results_grant(self, store: Store, job: Job, spec, node: int = 0
                      ) -> tuple[dict | None, str | None]:
        return results.results_grant(self.aws, store, job, spec, node)

    def checkpoint_plan(self, store: Store, job: Job, expires_s: float) -> dict | None:
        return results.checkpoint_plan(self.aws, store, job, expires_s)

    def instance_states(self, store: Store, job: Job) -> dict[str, dict]:
        return inventory.instance_states(self.aws, store, job)

    def release(self, store: Store, job: Job, force: bool = False) -> None:
        return inventory.release(self.aws, store, job, force)

    def cleanup(self, store: Store, regions: set[str] | None = None) -> list[str]:
        return inventory.cleanup(self.aws, store, regions)

    # -- Account

    def ready(self, spec) -> None:
        return instance_types.ready(self.aws, spec)

    # -- CloudHosts

    def network_environment(self, spec) -> dict:
        return cluster.efa_environment(self.aws, spec)

    def data_mounts(self, store: Store, job: Job, host: Host, instance: str | None = None
                    ) -> dict[str, str]:
        return volumes.mount_snapshots(self.aws, store, job, host, instance)

    def shutdown(self, spec) -> tuple[str | None, float]:
        return host_setup.shutdown(self.aws, spec)

    def agent_settings(self, spec) -> dict:
        meter = budget_plan.meter_settings(self.aws, spec, self.aws.region(spec))
        return {**host_setup.agent_settings(self.aws, spec),
                **({"budget": meter} if meter else {})}

    def power_off_minutes(self, max_runtime_s: float) -> int:
        return instances.power_off_minutes(max_runtime_s)

    def record_ends(self, store: Store, job: Job) -> None:
        return inventory.record_ends(self.aws, store, job)

    def adopt(self, store: Store, kept: Job, job: Job) -> Host:
        return acquire.adopt(self.aws, store, kept, job)

    # -- ResultStore

    def upload_bundle(self, store: Store, job: Job, spec, parts: list[tuple[str, Path]],
                      meta: dict) -> str | None:
        line, pin = results.upload_bundle(self.aws, store, job, spec, parts, meta)
        return "; ".join(filter(None, [line, group_launch.pin_bundle(self.aws, store, job,
                                                                     spec, pin)]))

    def fetch_results(self, store: Store, job: Job, local: Path, node: int = 0
                      ) -> dict | None:
        return results.fetch_results(self.aws, store, job, local, node)

    # -- CloudRecovery

    def group_settings(self, store: Store, job: Job, spec) -> dict:
        return group_launch.group_settings(self.aws, store, job, spec)

    def follow_replacement(self, store: Store, job: Job, instance_id: str) -> dict:
        return group_launch.follow_replacement(self.aws, store, job, instance_id)

    def follow_nodes(self, store: Store, job: Job) -> dict | None:
        return group_launch.follow_nodes(self.aws, store, job)

    def group_record(self, store: Store, job: Job) -> dict:
        return group_launch.group_record(self.aws, store, job)

    def group_launches(self, store: Store, job: Job) -> dict[str, dict]:
        return groups.group_launches(self.aws, store, job)

    def recorded_groups(self, store: Store, job: Job) -> list[tuple[str, str]]:
        return groups.recorded_groups(store, job)

    def delete_job_groups(self, store: Store, job: Job) -> list[str]:
        return groups.delete_job_groups(self.aws, store, job)

    # -- Sweeps

    def reconcile(self, store: Store) -> Sweep:
        return inventory.reconcile(self.aws, store)

    def orphans(self, store: Store) -> Sweep:
        return inventory.orphans(self.aws, store)

    def terminate(self, region: str, ids: list[str]) -> None:
        return inventory.terminate(self.aws, region, ids)

    def delete_job_group(self, region: str, name: str) -> bool:
        return groups.delete_job_group(self.aws, region, name)

    def delete_job_role(self, region: str, name: str) -> bool:
        return job_role.delete(self.aws, region, name)

    def attempt_instances(self, store: Store, job: Job, attempt: int, regions: list[str]
                          ) -> dict[str, list[str]]:
        return instances.attempt_instances(self.aws, store, job, attempt, regions)

    # -- Datasets

    def read_dataset(self, spec, source: dict) -> Staged:
        return datasets.read_dataset(self.aws, spec, source)

    def staging_disk(self, spec, wanted: int) -> dict:
        local = images.local_nvme(spec.placement.instance_type, spec.placement.ami) \
            if spec.placement.instance_type else None
        return {"local": local, "mbps": instance_types.ebs_throughput_cap(self.aws, spec, wanted)
                if wanted else None}


def _ssh(host: Host) -> SSHHost:
    """An instance's host: this provider's hosts are all reached over SSH (acquire, host_for)."""
    return cast(SSHHost, host)
