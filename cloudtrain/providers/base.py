"""The provider contract: every verb the rest of cloudtrain calls on a provider, one line each.

`Provider` is what a job's provider does, whatever the backend: the lifecycle calls these on
`providers.get(spec.backend)`. `CloudProvider` adds what only a cloud has (regions,
credentials, sweeps for what is tagged ours, datasets in S3, prices and quotas, and the
steps `check --launch` walks one by one); the lifecycle and the commands call those on a
cloud job's provider or on `providers.get("aws")`. LocalProvider is a Provider; AWSProvider
is a CloudProvider (tests/unit/test_providers.py checks both, and that every provider verb
called in cloudtrain/ is listed here).

Beside the contract, the two records it passes: Question (what launch asks) and Sweep (what a
look for what is tagged ours found).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

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


class Provider(Protocol):
    # -- before anything is created
    def preflight(self, spec) -> None:
        """Refuse early (MissingDependency, UsageError) what cannot run."""
    def ready(self, spec) -> None:
        """What a real launch needs beyond the dry run (credentials), before it asks."""
    def plan(self, spec) -> list[tuple[str, str]]:
        """What launch would do, as (what, value) rows; creates nothing."""
    def question(self, spec) -> Question | None:
        """What launch says and asks before it goes on."""
    def read_dataset(self, spec, source: dict) -> Staged:
        """What one of the job's datasets (s3, snapshot) holds, read before launch."""

    # -- getting hosts
    def acquire(self, store: Store, job: Job, spec, report: Reporter = SILENT) -> Host:
        """A host for the job, its instances recorded."""
    def acquire_nodes(self, store: Store, job: Job, spec, report: Reporter = SILENT
                      ) -> list[Host]:
        """The job's spec.nodes hosts, node 0 first."""
    def host_for(self, job: Job) -> Host:
        """The host of a job launched earlier, from the store's record."""
    def node_address(self, host: Host) -> str:
        """Where the other nodes reach this one (the torchrun rendezvous)."""
    def node_instances(self, store: Store, job: Job, hosts: list) -> list[str | None]:
        """The instance id of each node's host (None: not an instance)."""
    def efa_environment(self, spec) -> dict:
        """Environment variables for the nodes' fast network (EFA), {} without one."""

    # -- setting a host up for the job
    def setup(self, host: Host) -> None:
        """Make the host ready for the agent (python3, tmux)."""
    def gpus(self, spec, host: Host) -> int:
        """GPUs the job's host has (torchrun starts one process each)."""
    def jobdir(self, job_id: str, host: Host | None = None) -> str:
        """Where the job's directory is on that host."""
    def data_dir(self, host: Host | None = None) -> str:
        """Where datasets are cached on that host."""
    def data_mounts(self, store: Store, job: Job, host: Host, instance: str | None = None
                    ) -> dict[str, str]:
        """{dataset name: path on the host} of the snapshot volumes attached for the job."""
    def shutdown(self, spec) -> tuple[str | None, float]:
        """(command, delay): how the host powers itself off after the job."""
    def agent_settings(self, spec) -> dict:
        """Extra job.json settings for the agent (the spot notice watch)."""
    def results_grant(self, store: Store, job: Job, spec, node: int = 0
                      ) -> tuple[dict | None, str | None]:
        """(the agent's upload grant to the job store or None, a line for the user)."""
    def checkpoint_plan(self, store: Store, job: Job, expires_s: float) -> dict | None:
        """The latest checkpoint the job streamed to its job store, as a restore plan."""

    def upload_bundle(self, store: Store, job: Job, spec, parts: list[tuple[str, Path]],
                      meta: dict) -> str | None:
        """The job's bundle to its job store (what an instance starts it from by itself);
        a line saying where and how much, None without a job store."""
    def group_settings(self, store: Store, job: Job, spec) -> dict:
        """job.json's settings for a job that AWS Auto Scaling relaunches (the agent ends
        the job's group with the job); {} for any other job."""
    def follow_replacement(self, store: Store, job: Job, instance_id: str) -> dict:
        """The job's host record for the instance its Auto Scaling group put in place of
        the recorded one (its host key checked as at launch)."""
    def follow_nodes(self, store: Store, job: Job) -> dict | None:
        """A job on several nodes of a group: its host record for the nodes of its newest
        attempt once they have met again (None until then)."""
    def group_record(self, store: Store, job: Job) -> dict:
        """What the instances of a job's Auto Scaling group wrote to its job store:
        {"attempts": [...], "final": the job's end or None}."""

    # -- after the job
    def fetch_results(self, store: Store, job: Job, local: Path, node: int = 0
                      ) -> dict | None:
        """The job store's files of the job into `local`; None when nothing is stored."""
    def instance_states(self, store: Store, job: Job) -> dict[str, dict]:
        """The cloud's view of the job's instances (when its host is lost)."""
    def record_ends(self, store: Store, job: Job) -> None:
        """Termination times and prices from the cloud, for the bill."""
    def release(self, store: Store, job: Job, force: bool = False) -> None:
        """Give the host back: nothing may keep billing afterwards."""
    def cleanup(self, store: Store, regions: set[str] | None = None) -> list[str]:
        """Remove shared resources (group, key pair) that nothing uses."""


class CloudProvider(Provider, Protocol):
    DEFAULT_REGION: str  # where a job goes when no region is configured anywhere

    # -- where, and as whom
    def region(self, spec=None) -> str:
        """The job's region (--region, config.yaml, AWS_REGION, the profile, the default)."""
    def region_and_source(self, spec=None) -> tuple[str, str]:
        """The region and where it came from, in words."""
    def profile(self) -> str:
        """The profile of the cloud's credentials in use."""
    def configured(self) -> bool:
        """Whether this machine may have credentials for it, told without a network call."""
    def credential_source(self, region: str) -> dict | None:
        """Where the credentials came from (source, method, profile, masked key); None."""
    def check_credentials(self, region: str) -> None:
        """A CredentialsError if the cloud no longer accepts the credentials."""
    def owner(self, region: str) -> str:
        """The caller's principal: the owner tag of everything it creates."""

    # -- what is tagged ours, wherever it is
    def reconcile(self, store: Store) -> Sweep:
        """Every instance tagged ours, in every region the owner can have one."""
    def orphans(self, store: Store) -> Sweep:
        """Live instances of this owner that no active or kept job holds."""
    def terminate(self, region: str, ids: list[str]) -> None:
        """Terminate those instances (and delete those volumes)."""
    def attempt_instances(self, store: Store, job: Job, attempt: int, regions: list[str]
                          ) -> dict[str, list[str]]:
        """Live instances of attempt n of a recovering job, by its attempt tag."""
    def recorded_groups(self, store: Store, job: Job) -> list[tuple[str, str]]:
        """(region, name) of the job's groups its timeline says exist (no cloud call)."""
    def group_launches(self, store: Store, job: Job) -> dict[str, dict]:
        """The instances the job's group launched, by the cloud's own record of the group
        (kept after EC2 forgets them): id -> {launched_at, terminated_at, zone}."""
    def delete_job_groups(self, store: Store, job: Job) -> list[str]:
        """Delete the job's groups (by record and by tag) and templates: the names deleted."""
    def delete_job_group(self, region: str, name: str) -> bool:
        """Delete one group (its instances end with it) and its template; whether it was."""
    def adopt(self, store: Store, kept: Job, job: Job) -> Host:
        """The host of a kept job, taken over by a new job (`launch --on`)."""

    # -- datasets in S3 (`data push`, `data ls --check`)
    def push_dataset(self, root: Path, bucket: str, prefix: str, *, shard_mb: int = 256,
                     workers: int = 8, region: str | None = None, progress=None) -> object:
        """A folder (datasets.check_push) as shards and a manifest in S3: a PushReport."""
    def dataset_size(self, location: str) -> dict:
        """What the S3 prefix at `location` holds now (kind, files, bytes, file_bytes)."""

    # -- prices and quotas (`catalog --refresh`, `check`)
    def refresh_list_prices(self, region: str) -> str:
        """Fetch and keep the region's on-demand and gp3 list prices; a summary line."""
    def refresh_spot(self, region: str) -> str:
        """Fetch and keep the region's current spot prices; a summary line."""
    def on_demand_prices(self, region: str, instance_types: list[str]) -> dict[str, float]:
        """USD/h per type from the price list."""
    def type_offered(self, region: str, name: str) -> bool | None:
        """Whether the region offers that instance type (None: cannot tell)."""
    def vcpu_quota(self, instance_type: str, market: str) -> tuple[str, str, str] | None:
        """(code, name, family group) of the vCPU quota a launch of that type counts against."""
    def ec2_quota(self, region: str, code: str) -> float:
        """That quota's value for the account in the region."""
    def instance_profile_roles(self, region: str, name: str) -> list[str] | None:
        """Read-only: the roles of that instance profile; None where there is none."""
    def quota_console_url(self, region: str, code: str) -> str:
        """Where that quota's increase is asked for."""
    def power_off_minutes(self, max_runtime_s: float) -> int:
        """Minutes from boot to the instance's own hard power-off, for that max runtime."""

    # -- what a launch makes, one step at a time (`check --launch`)
    def ensure_key(self, region: str, owner: str) -> tuple[str, Path]:
        """The region's key pair, imported on first use: (name, private key file)."""
    def subnets(self, region: str) -> list[tuple[str, str, str, str]]:
        """(zone, subnet, vpc, zone id) to try, one per AZ."""
    def ensure_group(self, region: str, vpc: str, owner: str) -> str:
        """The VPC's security group, made on first use: SSH from ssh_cidr() only."""
    def ssh_cidr(self) -> str:
        """Who may reach port 22 (this machine's public address /32, or the setting)."""
    def resolve_ami(self, region: str, ami: str | None = None) -> str:
        """The image a launch boots: `ami`, else the current Deep Learning AMI."""
    def image_facts(self, region: str, ami: str) -> dict:
        """{id, name, created, architecture, root_gb} of that image."""
    def ensure_job_store(self, region: str, owner_key: str | None = None) -> tuple[str, bool]:
        """The job store's bucket, made on first use: (bucket, made now)."""
    def job_store_found(self, region: str) -> tuple[str, bool]:
        """Read-only: the job store's bucket, and whether it is there and ours."""
    def put_stored_object(self, region: str, job_id: str, name: str, data: bytes) -> str:
        """One object under the job's prefix of the job store; its s3:// URL."""
    def delete_results(self, region: str, job_id: str) -> int:
        """Delete what the job store holds for the job; how many objects there were."""
    def leftovers(self, region: str, job_id: str) -> dict[str, list[str]]:
        """What still exists of the job, by its tag (instances, volumes, placement groups)."""
    def shared_resources(self, region: str) -> dict[str, list[str]]:
        """This owner's key pairs and security groups that every job in the region reuses."""
