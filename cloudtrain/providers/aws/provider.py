"""EC2 through boto3: the cloud as a handful of verbs.

    preflight(spec)             credentials and instance type, before anything is created
    bootstrap(region)           key pair, security group and AMI, reused across jobs
    acquire(store, job, spec)   run_instances in each AZ in turn, record, wait, SSH -> SSHHost
    acquire_nodes(store, job, spec)  N of them in one AZ and placement group (cluster.py)
    host_for(job)               SSHHost from the stored endpoint (host key pinned)
    release(store, job)         delete its Auto Scaling group, then terminate by record and
                                by tag: nothing bills afterwards
    create_job_group(...)       a recovering spot job's Auto Scaling group (groups.py)
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

import json
import os
import threading
import time

from ... import catalog, config, preflight
from ...config import check_region
from ...errors import CloudtrainError, MissingDependency, UsageError, named_at
from ...market import Market
from ...progress import SILENT, Reporter
from ...ssh import Endpoint
from ...ssh_host import SSHHost
from ...state import Job, Store
from .account import AccountMixin
from .boot import BootMixin
from .cache import CACHE_TTL_S, RegionCache
from .cluster import ClusterMixin
from .datasets import DatasetsMixin
from .errors import AWSError, StaleCache, aws_errors, foreign_answer, no_credentials
from .group_launch import GroupLaunchMixin
from .groups import GroupsMixin
from .images import ImagesMixin
from .instances import (
    REARM_PATH, USER_DATA_DONE, USER_DATA_WAIT_S, InstancesMixin, power_off_minutes,
    user_data_wait_command)
from .inventory import InventoryMixin
from .network import NetworkMixin
from .plan import PlanMixin
from .pricing import PricingMixin
from .results import ResultsStoreMixin
from .volumes import VolumesMixin

DEFAULT_REGION = "us-east-1"  # where a job goes when no region is configured anywhere
DEFAULT_SOURCE = ("the default: no --region, `region:` in config.yaml, AWS_REGION, "
                  "AWS_DEFAULT_REGION or region in the AWS profile")  # config.REGION_DEFAULT's order


# Variables through which boto3 finds credentials without a file (keys, a profile, a web
# identity or container role).
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN",
                        "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                        "AWS_CONTAINER_CREDENTIALS_FULL_URI")


def assumed_role(arn: str) -> tuple[str, str] | None:
    """(role ARN without a path, role name) for an STS assumed-role session ARN, else None."""
    parts = arn.split(":", 5)
    if len(parts) == 6 and parts[2] == "sts" and parts[5].startswith("assumed-role/"):
        name = parts[5].split("/")[1]
        return f"arn:{parts[1]}:iam::{parts[4]}:role/{name}", name
    return None


class AWSProvider(PlanMixin, ClusterMixin, GroupsMixin, GroupLaunchMixin, InstancesMixin, BootMixin, InventoryMixin, NetworkMixin,
                  ImagesMixin, PricingMixin, ResultsStoreMixin, VolumesMixin, AccountMixin,
                  DatasetsMixin):
    name = "aws"
    DEFAULT_REGION, DEFAULT_SOURCE = DEFAULT_REGION, DEFAULT_SOURCE

    def __init__(self, settings: config.Settings | None = None):
        self.settings = settings or config.Settings.load()
        self._sessions: dict[str, object] = {}
        self._clients: dict[tuple, object] = {}
        self._sweep_lock = threading.Lock()  # sweep threads make their clients one at a time

    # -- sessions and clients ------------------------------------------------------------------

    def session(self, region: str | None = None):
        """A boto3 session; with no region, the AWS chain's (AWS_REGION, AWS_DEFAULT_REGION,
        the profile), which region() checks before any client is made from it."""
        import boto3
        import botocore.exceptions

        if region:
            check_region(region, "--region or a job's record")
        elif self.settings.region:
            check_region(self.settings.region, "`region:` in config.yaml")
        key = region or ""
        if key not in self._sessions:
            try:
                self._sessions[key] = boto3.Session(
                    profile_name=self.settings.aws_profile or None,
                    region_name=region or self.settings.region
                    or os.environ.get("AWS_REGION") or None)
                self._sessions[key].events.register("before-parse", foreign_answer)
            except botocore.exceptions.ProfileNotFound as exc:
                raise UsageError(f"AWS profile not found: {exc}",
                                 hint="list yours with: aws configure list-profiles") from exc
        return self._sessions[key]

    def region(self, spec=None) -> str:
        return self.region_and_source(spec)[0]

    def region_and_source(self, spec=None) -> tuple[str, str]:
        """The job's region and where it came from, the same way for every command: --region,
        `region:` in config.yaml, AWS_REGION, AWS_DEFAULT_REGION, the AWS profile's; else
        us-east-1 (the catalog's and estimate's default), said as such. botocore itself reads
        AWS_DEFAULT_REGION only (D2), so AWS_REGION is read here."""
        if spec is not None and spec.region:
            source = "--region"
            region = spec.region
        elif self.settings.region:
            source, region = "`region:` in config.yaml", self.settings.region
        elif os.environ.get("AWS_REGION"):
            source, region = "AWS_REGION", os.environ["AWS_REGION"]
        elif os.environ.get("AWS_DEFAULT_REGION"):
            source, region = "AWS_DEFAULT_REGION", os.environ["AWS_DEFAULT_REGION"]
        else:
            region = self.session().region_name
            if not region:
                return DEFAULT_REGION, DEFAULT_SOURCE
            source = "the AWS profile"
        check_region(region, source)
        return config.check_known_region(region, source), source

    def client(self, service: str, region: str, fail_fast: bool = False):
        """A client; fail_fast for run_instances (capacity errors are not retried, the next
        AZ is tried instead). Others retry throttling and 5xx with backoff (standard mode)."""
        key = (service, region, fail_fast)
        if key not in self._clients:
            check_region(region)
            from botocore.config import Config

            retries = {"max_attempts": 1} if fail_fast else {"max_attempts": 6, "mode": "standard"}
            cfg = Config(retries=retries, connect_timeout=10, read_timeout=60)
            self._clients[key] = self.session(region).client(service, region_name=region,
                                                             config=cfg)
        return self._clients[key]

    def configured(self) -> bool:
        """Whether this machine may have AWS credentials, told without asking for them
        (botocore's chain ends at the instance metadata service, a second's wait off EC2): a
        credentials variable, an AWS config or credentials file, or settings that name AWS."""
        if self.settings.backend == self.name or self.settings.region or \
                self.settings.aws_profile or any(os.environ.get(v) for v in CREDENTIAL_VARIABLES):
            return True
        files = (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
                 os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config")
        return any(os.path.isfile(os.path.expanduser(f)) for f in files)

    def credentials(self, region: str):
        """The session's credentials, None without any (a broken credential_process or an
        expired SSO token is an error in words, not a traceback)."""
        with aws_errors(region, "sts"):
            return self.session(region).get_credentials()

    def call(self, region: str, method: str, fail_fast: bool = False, service: str = "ec2",
             **kwargs):
        """One call (EC2's unless `service` names another, e.g. autoscaling), with AWS's
        errors turned into ours where we know what to say."""
        with aws_errors(region, service):
            return getattr(self.client(service, region, fail_fast), method)(**kwargs)

    # -- identity and bootstrap ------------------------------------------------------------------

    def check_credentials(self, region: str) -> None:
        """Ask STS whether the credentials still work (GetCallerIdentity, never cached): a
        relaunch asks before it starts anything, so that credentials that expired while it
        waited pause the recovery instead of failing the launch half-way."""
        with aws_errors(region, "sts"):
            self.session(region).client("sts", region_name=region).get_caller_identity()

    def owner(self, region: str) -> str:
        """The caller's principal ARN: the cloudtrain:owner tag of everything this user
        creates, and what infra/iam-policy-cli.json compares it with (`${aws:PrincipalArn}`).
        For an IAM user that is GetCallerIdentity's ARN; for an assumed role (SSO, CI) STS
        names the session (arn:aws:sts::A:assumed-role/R/S) while aws:PrincipalArn is the
        role itself, path included (arn:aws:iam::A:role/PATH/R): asked of IAM (GetRole on
        one's own role), else the role without a path."""
        if not hasattr(self, "_owner"):
            arn = self._identity(region)["Arn"]
            role = assumed_role(arn)
            if role is not None:
                try:
                    with aws_errors(region, "iam"):
                        iam = self.session(region).client("iam", region_name=region)
                        arn = iam.get_role(RoleName=role[1])["Role"]["Arn"]
                except CloudtrainError:
                    arn = role[0]
            self._owner = arn
        return self._owner

    def owner_key(self, region: str) -> str:
        """The caller's aws:userid (GetCallerIdentity's UserId: an IAM user's unique id, or
        `<role id>:<session name>`): the job store keeps each principal's jobs under
        `jobs/<owner_key>/`, the prefix infra/iam-policy-cli.json names `${aws:userid}`."""
        if not hasattr(self, "_owner_key"):
            self._owner_key = self._identity(region)["UserId"]
        return self._owner_key

    def _identity(self, region: str) -> dict:
        """STS GetCallerIdentity, asked once."""
        if not hasattr(self, "_caller"):
            with aws_errors(region, "sts"):
                sts = self.session(region).client("sts", region_name=region)
                self._caller = sts.get_caller_identity()
        return self._caller

    def preflight(self, spec):
        """What the launch checks before anything is created, and the dry run with it: the
        options, the region, and the instance type (exists, offered in the region, runs the
        AMI's architecture, has a GPU unless --cpu-only). Returns the type's facts (None for
        --on, which reuses a kept job's instance: jobs checks that one)."""
        if not spec.instance_type and not spec.on_job:  # --on: the kept job's instance
            raise UsageError("which instance? pass --instance (e.g. g5.xlarge)")
        if spec.market not in tuple(Market):
            raise UsageError(f"market must be on-demand or spot, not {spec.market!r}")
        if spec.max_price is not None and spec.market != Market.SPOT:
            raise UsageError("--max-price applies to --spot")
        if spec.on_job:
            return None
        return self.check_type(spec, self.region(spec))

    def ready(self, spec) -> None:
        """What a real launch needs beyond the dry run, checked before it asks or records
        anything (U5): credentials to launch with. The dry run works without them."""
        if spec.on_job:
            return
        region = self.region(spec)
        if self.credentials(region) is None:
            exc = no_credentials()
            exc.hint = f"{exc.hint}; `cloudtrain launch --dry-run` works without"  # U21
            raise exc

    def check_type(self, spec, region: str) -> preflight.TypeFacts:
        """preflight.instance_type with EC2's answers where the bundled catalog has none and
        there are credentials to ask with (DescribeInstanceTypes, ...TypeOfferings, the
        --ami's architecture)."""
        describe = offered = None
        ami_arch = None if spec.ami else catalog.DEFAULT_ARCH
        try:
            credentials = self.credentials(region)
        except CloudtrainError:
            credentials = None  # said where it matters: the plan's permissions row, the launch
        if credentials is not None:
            describe = lambda name: self.describe_type(region, name)  # noqa: E731
            offered = lambda name: self.type_offered(region, name)  # noqa: E731
            if spec.ami:
                ami_arch = self.ami_architecture(region, spec.ami)
        try:
            return preflight.instance_type(spec.instance_type, region, cpu_ok=spec.cpu_only,
                                           ami_arch=ami_arch, describe=describe,
                                           offered=offered)
        except UsageError as exc:  # U11: a job file's `instance:` is named where it is
            raise named_at(exc, getattr(spec, "origins", {}).get("instance_type"),
                           "--instance") from None

    def describe_type(self, region: str, name: str) -> dict | None:
        """{gpus, gpu, arch} of an instance type from EC2; None when EC2 has no such type; {}
        when EC2 could not be asked (no permission, unreachable)."""
        try:
            found = self.call(region, "describe_instance_types",
                              InstanceTypes=[name])["InstanceTypes"]
        except AWSError as exc:
            return None if exc.code in ("InvalidInstanceType", "InvalidParameterValue") else {}
        if not found:
            return None
        gpus = (found[0].get("GpuInfo") or {}).get("Gpus") or []
        arches = found[0].get("ProcessorInfo", {}).get("SupportedArchitectures") or []
        return {"gpus": sum(g.get("Count", 0) for g in gpus),
                "gpu": gpus[0].get("Name") if gpus else None,
                "arch": catalog.DEFAULT_ARCH if catalog.DEFAULT_ARCH in arches
                else (arches[0] if arches else catalog.DEFAULT_ARCH)}

    def type_offered(self, region: str, name: str) -> bool | None:
        """Whether EC2 offers the type in the region; None when it could not be asked."""
        try:
            found = self.call(region, "describe_instance_type_offerings", LocationType="region",
                              Filters=[{"Name": "instance-type", "Values": [name]}])
        except AWSError:
            return None
        return bool(found.get("InstanceTypeOfferings"))

    def ami_architecture(self, region: str, ami: str) -> str | None:
        """The --ami's architecture (x86_64, arm64); None when it cannot be read here (the
        launch then says what is wrong with the AMI)."""
        try:
            images = self.call(region, "describe_images", ImageIds=[ami])["Images"]
        except AWSError:
            return None
        return images[0].get("Architecture") if images else None

    def bootstrap(self, region: str, ami: str | None, cached: bool = True) -> dict:
        """Owner, key pair, subnets, security group, AMI and its root device for a region.
        What was set up before is taken from $CLOUDTRAIN_HOME/aws-cache.json (AMI and subnets
        for a day), so a warm launch makes no describe calls; a stale entry shows up as a
        *.NotFound from RunInstances, and the caller bootstraps again uncached."""
        cache = RegionCache(self.settings.aws_profile, region)
        entry = cache.load() if cached else {}
        credentials = self.credentials(region)
        access_key = credentials.access_key if credentials else None
        if entry.get("access_key") == access_key and entry.get("owner"):
            self._owner = entry["owner"]
            if entry.get("owner_key"):
                self._owner_key = entry["owner_key"]
        owner = self.owner(region)
        key_path = self.key_path(region)
        if entry.get("key_name") and key_path.exists():
            key_name = entry["key_name"]
        else:
            key_name, key_path = self.ensure_key(region, owner)
        now = time.time()
        if now - entry.get("zones_at", 0) < CACHE_TTL_S and entry.get("zones"):
            zones = [tuple(z) + ("",) * (4 - len(z)) for z in entry["zones"]]
        else:
            zones = self.subnets(region)
            entry.update(zones=[list(z) for z in zones], zones_at=now)
        group_key = f"{zones[0][2]}|{self.ssh_cidr()}|{self.settings.ssh_port}"
        if entry.get("group_key") == group_key:
            group = entry["group"]
        else:
            group = self.ensure_group(region, zones[0][2], owner)
            entry.update(group_key=group_key, group=group)
        if ami is not None:  # the user's own: resolved each time, never cached as the default
            root_device = self.root_device(region, ami)
        elif now - entry.get("ami_at", 0) < CACHE_TTL_S and entry.get("ami"):
            ami, root_device = entry["ami"], entry["root_device"]
        else:
            ami = self.resolve_ami(region, None)
            root_device = self.root_device(region, ami)
            entry.update(ami=ami, root_device=root_device, ami_at=now)
        entry.update(access_key=access_key, owner=owner, owner_key=self.owner_key(region),
                     key_name=key_name)
        cache.save(entry)
        return {"owner": owner, "key_name": key_name, "key_path": key_path, "zones": zones,
                "group": group, "ami": ami, "root_device": root_device}

    def acquire(self, store: Store, job: Job, spec, report: Reporter = SILENT) -> SSHHost:
        region = self.region(spec)
        boot = self.bootstrap(region, spec.ami)
        # A relaunch whose supervisor was killed after RunInstances goes on with that instance.
        found = self.attempt_instance(store, job, region, job.facts.attempt) \
            if job.facts.attempt > 1 else None
        instance = found
        grouped = self.group_recovery(spec) is None and job.facts.attempt == 1
        if instance is None and grouped:  # issue 27: AWS Auto Scaling relaunches this one
            ids = self.acquire_from_group_or_say(store, job, spec, report)
            instance, grouped = ids and ids[0], ids is not None
        if instance is None:
            try:
                instance = self._run(store, job, spec, region, boot, report)
            except StaleCache:
                RegionCache(self.settings.aws_profile, region).clear()
                boot = self.bootstrap(region, spec.ami, cached=False)
                instance = self._run(store, job, spec, region, boot, report)
        key_path = boot["key_path"]
        address = self._wait_running(region, instance, report)
        zone = next((i.zone for i in store.instances(job.id) if i.id == instance), None)
        if found is None:
            self.attach_snapshots(store, job, spec, region, instance, zone, boot["owner"])
        endpoint = Endpoint(address, self.settings.ssh_port, self.settings.ssh_user, str(key_path))
        host = self._wait_ssh(region, instance, endpoint, report)
        report.phase(f"checking {instance}'s host key against its console output")
        verified = self._check_host_key(store, job, region, instance, host, spec.instance_type,
                                        report)
        home = host.home()  # the first command, only now that the key is settled
        store.update_instance(instance, state="running", details=json.dumps(
            {**self._details(store, instance), "address": address, "host_key": endpoint.host_key,
             "host_key_verified": verified}))
        if grouped:
            self.check_group_jobdir(job, host, instance, home)
            self.record_attempt(store, job, spec, 1, instance)
        return host

    def adopt(self, store: Store, kept: Job, job: Job) -> SSHHost:
        """`launch --on`: the new job takes over the kept job's instance (and from now on
        its billing) without provisioning anything; the host is reached the same way."""
        info = (kept.host or {}).get("collected_from") or kept.host or {}
        host = self.host_for(Job(**{**kept.__dict__, "host": info}))
        host.run("true")  # still there, and still the machine whose host key we pinned
        for inst in store.instances(kept.id):
            if inst.state != "terminated":
                store.hand_over(inst, job.id)
        return host

    def host_for(self, job: Job) -> SSHHost:
        info = job.host or {}
        if not info.get("host"):  # the launch never got as far as an instance's address (D8)
            raise UsageError(f"job {job.id} has no instance" + (f" ({job.reason})"
                                                                 if job.reason else ""),
                             hint=f"cloudtrain status {job.id}")
        endpoint = Endpoint(info["host"], info.get("port", 22), info.get("user", "ubuntu"),
                            info.get("key_path"), info.get("host_key"))
        return SSHHost(endpoint, info.get("tmux_socket", "cloudtrain"), info.get("python", "python3"))

    def setup(self, host: SSHHost) -> None:
        """The host has what the agent needs: python3 (3.8+) and tmux. Without tmux, wait
        (bounded) for user-data to finish installing it rather than race its apt-get: SSH
        answers long before cloud-init's final stage has run user-data (F16)."""
        probe = ("command -v /opt/pytorch/bin/python || command -v python3; "
                 "printf 'tmux:'; command -v tmux")
        found = host.run(probe, check=False).stdout.splitlines()
        finished = True
        if "tmux:" in found:  # `command -v tmux` printed nothing
            finished = host.run(user_data_wait_command(USER_DATA_DONE, USER_DATA_WAIT_S),
                                check=False, timeout=USER_DATA_WAIT_S + 60).ok
            if finished:
                found = host.run(probe, check=False).stdout.splitlines()
        pythons = [line for line in found if not line.startswith("tmux:")]
        if self.settings.remote_python:
            host.python = self.settings.remote_python
        elif pythons:
            host.python = pythons[0]
        else:
            raise MissingDependency(f"{host.name} has no python3")
        if "tmux:" in found:
            from ...hosts import TMUX_INSTALL_HINT

            raise MissingDependency(f"tmux is not installed on {host.name}" + (
                "" if finished else f" (user-data had not finished after {USER_DATA_WAIT_S:.0f}"
                                    " s)"), hint=TMUX_INSTALL_HINT)

    def gpus(self, spec, host: SSHHost) -> int:
        """The instance type's GPU count (what is paid for), not what the driver shows now:
        a driver still loading must not quietly turn an 8-GPU job into one process. A type
        the catalog does not know (or `--on` a kept instance): ask the host."""
        t = catalog.get(spec.instance_type) if spec.instance_type else None
        return int(t.gpus) if t is not None else host.gpu_count()

    def root(self, host: SSHHost) -> str:
        root = self.settings.remote_root
        return host.home() + root[1:] if root.startswith("~") else root

    def jobdir(self, job_id: str, host: SSHHost | None = None) -> str:
        return f"{self.root(host)}/jobs/{job_id}"

    def data_dir(self, host: SSHHost | None = None) -> str:
        return f"{self.root(host)}/data"

    def data_mounts(self, store: Store, job: Job, host: SSHHost,
                    instance: str | None = None) -> dict[str, str]:
        """The job's snapshot volumes (those of `instance`: one node's), mounted read-only:
        {dataset: mountpoint}."""
        return self.mount_snapshots(store, job, host, instance)

    def agent_settings(self, spec) -> dict:
        """What the agent on this host does beyond the job: watch the spot interruption
        notice (spot only), and move the instance's power-off timer (user-data armed it for
        the first job only, F16): `argv + [start_minutes]` at job start, and on a kept
        instance `argv + [idle_minutes]` at job end."""
        settings = {"rearm": {
            "argv": ["sudo", "-n", REARM_PATH],
            "start_minutes": power_off_minutes(spec.max_runtime_s),
            "idle_minutes": self.idle_minutes(spec) if spec.keep else None}}
        if spec.market == Market.SPOT:
            settings["imds_url"] = self.settings.imds_url
            settings["spot_poll_s"] = self.settings.spot_poll_seconds
        return settings

    def idle_minutes(self, spec) -> int:
        """A kept instance's idle time: whole minutes after its last job before it powers
        itself off (the job's --idle-minutes, else config.yaml's keep_idle_minutes)."""
        return self.settings.idle_minutes(spec.idle_minutes)

    def shutdown(self, spec) -> tuple[str | None, float]:
        """What the agent runs after the job, and after how long."""
        if spec.keep:
            return None, 0.0
        delay = spec.idle_minutes * 60 if spec.idle_minutes is not None \
            else self.settings.shutdown_delay_seconds
        return self.settings.shutdown_command, delay

    def region_of(self, job: Job) -> str:
        return job.spec.region or self.region()
