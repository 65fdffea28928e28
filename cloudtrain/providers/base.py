"""The provider contract: every verb the rest of cloudtrain calls on a provider, one line each.

`Provider` is the core, what a job's provider does whatever the backend: the lifecycle calls
these on `providers.get(spec.backend)`. What only some backends can do is a capability, a
Protocol of its own that the lifecycle asks for with isinstance(provider, Capability):

    Account        a cloud account: credentials before a launch, and `account` (CloudAccount:
                   region, prices, quotas, stored datasets, what a launch makes, step by step)
    CloudHosts     hosts that power themselves off, have volumes and a fast network, are
                   billed until their end and can be kept
    ResultStore    a store that outlives the hosts: the job's bundle, its results
    CloudRecovery  a job the cloud relaunches by itself (its Auto Scaling group)
    Sweeps         looks for what is tagged ours, held by a job or lost
    Datasets       datasets the backend reads itself

LocalProvider is a Provider and nothing more; AWSProvider is a Provider with every capability
(tests/unit/test_providers.py checks both, that every provider verb called in cloudtrain/ is
listed here, and the contract's size).

Beside the contract, the two records it passes: Question (what launch asks) and Sweep (what a
look for what is tagged ours found).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..datasets import Staged
from ..hosts import Host
from ..progress import SILENT, Reporter
from ..state import Job, Store


@dataclass
class Question:
    """What `launch` says before it creates anything (a provider's question(spec)), and asks
    in a terminal."""
    text: str | None  # the question's own words (what is bought, at most what it costs)
    warnings: list[str] = field(default_factory=list)  # said on stderr, asked or not
    default: bool = True  # Enter's answer: no where the plan predicts the job fails


@dataclass
class Sweep:
    """A look for what is tagged ours in every region: what was found, the regions that
    answered, those that could not be asked (region -> why), and how the regions were
    chosen. Nothing may be called "all clear" while `unchecked` is not empty."""
    found: Any  # per region while sweeping (a dict); the caller's list afterwards
    regions: list[str]
    unchecked: dict[str, str]
    chosen_by: str


@runtime_checkable
class Provider(Protocol):
    """The core: what every backend does for a job, from the dry run to giving the hosts back.
    Anything more is a capability below, asked for with isinstance(provider, Capability)."""
    name: str  # the backend's name ("local", "aws")

    # -- before anything is created
    def plan(self, spec) -> list[tuple[str, str]]:
        """What launch would do, as (what, value) rows; creates nothing."""
    def question(self, spec) -> Question | None:
        """What launch says and asks before it goes on."""
    def preflight(self, spec) -> None:
        """Refuse early (MissingDependency, UsageError) what cannot run."""

    # -- getting hosts and setting them up
    def acquire(self, store: Store, job: Job, spec, report: Reporter = SILENT) -> list[Host]:
        """The job's spec.nodes hosts (one for a job on one machine), node 0 first, all or
        none, their instances recorded."""
    def host_for(self, job: Job) -> Host:
        """The host of a job launched earlier, from the store's record."""
    def setup(self, host: Host) -> str | None:
        """Make the host ready for the agent (python3, tmux); what the job's software is
        there (torch, its CUDA, the driver), a line for the timeline, where it was read."""
    def gpus(self, spec, host: Host) -> int:
        """GPUs the job's host has (torchrun starts one process each)."""
    def jobdir(self, job_id: str, host: Host | None = None) -> str:
        """Where the job's directory is on that host."""
    def data_dir(self, host: Host | None = None) -> str:
        """Where datasets are cached on that host."""
    def results_grant(self, store: Store, job: Job, spec, node: int = 0
                      ) -> tuple[dict | None, str | None]:
        """(the agent's upload grant to the result store or None, a line for the user)."""
    def checkpoint_plan(self, store: Store, job: Job, expires_s: float) -> dict | None:
        """The latest checkpoint the job streamed to its result store, as a restore plan;
        None where the job keeps its checkpoints on its host."""

    # -- after the job
    def instance_states(self, store: Store, job: Job) -> dict[str, dict]:
        """The backend's view of the job's instances (when its host is lost); {}: none lost."""
    def release(self, store: Store, job: Job, force: bool = False) -> None:
        """Give the hosts back: nothing may keep billing afterwards."""
    def cleanup(self, store: Store, regions: set[str] | None = None) -> list[str]:
        """Remove shared resources that nothing uses any more; what was removed."""


@runtime_checkable
class Account(Protocol):
    """A cloud account: the job needs its credentials (`ready`); `account` is the account
    itself (region, credentials, prices, quotas, what a launch makes, step by step)."""
    account: CloudAccount

    def ready(self, spec) -> None:
        """What a real launch needs beyond the dry run (credentials), before it asks."""


@runtime_checkable
class CloudHosts(Protocol):
    """Hosts that are cloud instances: they power themselves off, may be spot, have volumes
    and a fast network, are billed until their end, and can be kept for the next job."""
    def network_environment(self, spec) -> dict:
        """Environment variables for the nodes' fast network, {} without one."""
    def data_mounts(self, store: Store, job: Job, host: Host, instance: str | None = None
                    ) -> dict[str, str]:
        """{dataset name: path on the host} of the snapshot volumes attached for the job."""
    def shutdown(self, spec) -> tuple[str | None, float]:
        """(command, delay): how the host powers itself off after the job."""
    def agent_settings(self, spec) -> dict:
        """Extra job.json settings for the agent (the spot notice watch, the power-off timer)."""
    def power_off_minutes(self, max_runtime_s: float) -> int:
        """Minutes from boot to the instance's own hard power-off, for that max runtime."""
    def record_ends(self, store: Store, job: Job) -> None:
        """Termination times and prices from the cloud, for the bill."""
    def adopt(self, store: Store, kept: Job, job: Job) -> Host:
        """The host of a kept job, taken over by a new job (`launch --on`)."""


@runtime_checkable
class ResultStore(Protocol):
    """A store beside the hosts that outlives them: the job's bundle goes there (an instance
    starts the job from it by itself), its results and checkpoints come home from it."""
    def upload_bundle(self, store: Store, job: Job, spec, parts: list[tuple[str, Path]],
                      meta: dict) -> str | None:
        """The job's bundle to its result store; a line saying where and how much."""
    def fetch_results(self, store: Store, job: Job, local: Path, node: int = 0
                      ) -> dict | None:
        """The result store's files of the job into `local`; None when nothing is stored."""


@runtime_checkable
class CloudRecovery(Protocol):
    """A job the cloud relaunches by itself (an Auto Scaling group that replaces a lost
    instance), which the supervisor follows and `down` ends."""
    def group_settings(self, store: Store, job: Job, spec) -> dict:
        """job.json's settings for a job the cloud relaunches (the agent ends the job's
        group with the job); {} for any other job."""
    def follow_replacement(self, store: Store, job: Job, instance_id: str) -> dict:
        """The job's host record for the instance its group put in place of the recorded
        one (its host key checked as at launch)."""
    def follow_nodes(self, store: Store, job: Job) -> dict | None:
        """A job on several nodes of a group: its host record for the nodes of its newest
        attempt once they have met again (None until then)."""
    def group_record(self, store: Store, job: Job) -> dict:
        """What the instances of a job's group wrote to its result store:
        {"attempts": [...], "final": the job's end or None}."""
    def group_launches(self, store: Store, job: Job) -> dict[str, dict]:
        """The instances the job's group launched, by the cloud's own record of the group:
        id -> {launched_at, terminated_at, zone}."""
    def recorded_groups(self, store: Store, job: Job) -> list[tuple[str, str]]:
        """(region, name) of the job's groups its timeline says exist (no cloud call)."""
    def delete_job_groups(self, store: Store, job: Job) -> list[str]:
        """Delete the job's groups (by record and by tag) and templates: the names deleted."""


@runtime_checkable
class Sweeps(Protocol):
    """Looks for what is tagged ours wherever it is, held by a job or lost."""
    def reconcile(self, store: Store) -> Sweep:
        """Every instance tagged ours, in every region the owner can have one."""
    def orphans(self, store: Store) -> Sweep:
        """Live instances (and groups) of this owner that no active or kept job holds."""
    def terminate(self, region: str, ids: list[str]) -> None:
        """Terminate those instances (and delete those volumes)."""
    def delete_job_group(self, region: str, name: str) -> bool:
        """Delete one group a sweep found (its instances end with it) and its template."""

    def delete_job_role(self, region: str, name: str) -> bool:
        """Delete one job's own role a sweep found (and its instance profile)."""
    def attempt_instances(self, store: Store, job: Job, attempt: int, regions: list[str]
                          ) -> dict[str, list[str]]:
        """Live instances of attempt n of a recovering job, by its attempt tag."""


@runtime_checkable
class Datasets(Protocol):
    """Datasets the backend reads itself (a bucket, a snapshot); a backend without reads
    its jobs' bucket datasets through providers.read_dataset."""
    def read_dataset(self, spec, source: dict) -> Staged:
        """What one of the job's datasets holds, read before launch."""
    def staging_disk(self, spec, wanted: int) -> dict:
        """The disks a copy onto the job's instance can go onto: {local, mbps}. `local`: the
        instance's own disk, free with it and lost with it ({path, dir (the copies' folder
        there), disks, gb}), or {path: None, why} where it has none (said in the plan), None
        where the backend knows of no such disk; `mbps`: the root volume's MB/s for the copy,
        `wanted` or less where the instance cannot take more (what it could not use is not
        bought); None where none is `wanted` (0)."""


CAPABILITIES = (Account, CloudHosts, ResultStore, CloudRecovery, Sweeps, Datasets)


@runtime_checkable
class CloudAccount(Protocol):
    """The account a cloud provider works in (`provider.account`): where and as whom, its
    prices and quotas, the datasets it stores, and each thing a launch makes there, one at a
    time (`check`, `check --launch`, `catalog --refresh`, `data push`, `data ls --check`)."""
    DEFAULT_REGION: str  # where a job goes when no region is configured anywhere

    # -- where, and as whom
    def region(self, spec=None) -> str:
        """The job's region (--region, config.yaml, the environment, the profile, the default)."""
    def region_and_source(self, asked: str | None = None) -> tuple[str, str]:
        """The region (`asked`: --region's) and where it came from, in words."""
    def profile(self) -> str:
        """The profile of the cloud's credentials in use."""
    def configured(self) -> bool:
        """Whether this machine may have credentials for it, told without a network call."""
    def account_plan(self) -> dict | None:
        """The account's plan ({"type": FREE or PAID, "status", "expires", "credits"}); None
        where the cloud holds none for it."""
    def credential_source(self, region: str) -> dict | None:
        """Where the credentials came from (source, method, profile, masked key); None."""
    def check_credentials(self, region: str) -> None:
        """A CredentialsError if the cloud no longer accepts the credentials."""
    def owner(self, region: str) -> str:
        """The caller's principal: the owner tag of everything it creates."""
    def owner_prefix(self, region: str) -> dict:
        """{key, kind, stable, hint}: the caller's own part of the result store, and whether
        the same user finds it again from another process or login."""

    # -- prices and quotas
    def refresh_list_prices(self, region: str) -> str:
        """Fetch and keep the region's on-demand and disk list prices; a summary line."""
    def refresh_spot(self, region: str) -> str:
        """Fetch and keep the region's current spot prices; a summary line."""
    def on_demand_prices(self, region: str, instance_types: list[str]) -> dict[str, float]:
        """USD/h per type from the price list."""
    def type_offered(self, region: str, name: str) -> bool | None:
        """Whether the region offers that instance type (None: cannot tell)."""
    def reserved_type(self, region: str, reservation: str) -> str:
        """The instance type a capacity reservation the user holds is for."""
    def usable_reservations(self, region: str) -> list[str]:
        """A line for each capacity reservation or Capacity Block a job could go into."""
    def vcpu_quota(self, instance_type: str, market: str) -> tuple[str, str, str] | None:
        """(code, name, family group) of the vCPU quota a launch of that type counts against."""
    def quota_value(self, region: str, code: str) -> float:
        """That quota's value for the account in the region."""
    def quota_console_url(self, region: str, code: str) -> str:
        """Where that quota's increase is asked for."""
    def instance_profile_roles(self, region: str, name: str) -> list[str] | None:
        """Read-only: the roles of that instance profile; None where there is none."""
    def job_role_boundary(self, region: str) -> bool:
        """Read-only: whether the permissions boundary that per-job roles carry exists."""

    # -- datasets the account stores
    def push_dataset(self, root: Path, bucket: str, prefix: str, *, shard_mb: int = 256,
                     workers: int = 8, region: str | None = None, progress=None) -> object:
        """A folder (datasets.check_push) as shards and a manifest in a bucket: a PushReport."""
    def dataset_size(self, location: str) -> dict:
        """What the bucket prefix at `location` holds now (kind, files, bytes, file_bytes)."""

    # -- what a launch makes, one step at a time (`check --launch`)
    def ensure_key(self, region: str, owner: str) -> tuple[str, Path]:
        """The region's key pair, imported on first use: (name, private key file)."""
    def subnets(self, region: str) -> list[tuple[str, str, str, str]]:
        """(zone, subnet, vpc, zone id) to try, one per zone."""
    def ensure_group(self, region: str, vpc: str, owner: str) -> str:
        """The network's security group, made on first use: SSH from ssh_cidr() only."""
    def ssh_cidr(self) -> str:
        """Who may reach port 22 (this machine's public address /32, or the setting)."""
    def resolve_image(self, region: str, image: str | None = None) -> str:
        """The image a launch boots: `image`, else the current deep learning image."""
    def image_facts(self, region: str, image: str) -> dict:
        """{id, name, created, architecture, root_gb} of that image."""
    def ensure_job_store(self, region: str, owner_key: str | None = None) -> tuple[str, bool]:
        """The result store's bucket, made on first use: (bucket, made now)."""
    def job_store_found(self, region: str) -> tuple[str, bool]:
        """Read-only: the result store's bucket, and whether it is there and ours."""
    def put_stored_object(self, region: str, job_id: str, name: str, data: bytes) -> str:
        """One object under the job's prefix of the result store; its URL."""
    def delete_results(self, region: str, job_id: str) -> int:
        """Delete what the result store holds for the job; how many objects there were."""
    def leftovers(self, region: str, job_id: str) -> dict[str, list[str]]:
        """What still exists of the job, by its tag (instances, volumes, placement groups)."""
    def recovery_leftovers(self, region: str, job_id: str) -> dict[str, list[str]]:
        """What still exists of a recovering job beyond its instances: its Auto Scaling
        groups, launch templates, own role, fault-injection experiment templates."""
    def interrupt_spot(self, region: str, instance_id: str, job_id: str, owner: str
                       ) -> tuple[str, str]:
        """The cloud's own spot interruption sent to one instance: (template, experiment)."""
    def interruption(self, region: str, experiment_id: str) -> dict:
        """That experiment's {"status", "reason"}."""
    def end_interruption(self, region: str, template_id: str | None,
                         experiment_id: str | None) -> None:
        """The experiment stopped if it runs, its template deleted."""
    def shared_resources(self, region: str) -> dict[str, list[str]]:
        """This owner's key pairs and security groups that every job in the region reuses."""
