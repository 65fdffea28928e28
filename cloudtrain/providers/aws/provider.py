"""EC2 through boto3: the cloud as a handful of verbs.

    preflight(spec)             credentials and instance type, before anything is created
    bootstrap(region)           key pair, security group and AMI, reused across jobs
    acquire(store, job, spec)   run_instances in each AZ in turn, record, wait, SSH -> SSHHost
    acquire_nodes(store, job, spec)  N of them in one AZ and placement group (cluster.py)
    host_for(job)               SSHHost from the stored endpoint (host key pinned)
    release(store, job)         terminate by record and by tag: nothing bills afterwards
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
import math
import os
import threading
import time

from ... import catalog, config, cost, preflight
from ...config import check_region
from ...errors import CloudtrainError, MissingDependency, UsageError
from ...ssh_host import SSHHost
from ...progress import SILENT, Reporter
from ...ssh import Endpoint
from ...state import Job, Store
from ..base import Question
from .account import AccountMixin
from .boot import BootMixin
from .cache import CACHE_TTL_S, RegionCache
from .cluster import EFA_GROUP_NAME, ClusterMixin
from .datasets import DatasetsMixin
from .errors import POLICY_FILE, AWSError, StaleCache, aws_errors, no_credentials
from .images import DLAMI_PARAMETER, ImagesMixin
from .instances import REARM_PATH, USER_DATA_DONE, USER_DATA_WAIT_S, InstancesMixin, \
    power_off_minutes, user_data_wait_command
from .inventory import InventoryMixin
from .network import NetworkMixin
from .pricing import PricingMixin
from .results import ResultsStoreMixin
from .volumes import VolumesMixin

DEFAULT_REGION = "us-east-1"  # where a job goes when no region is configured anywhere
DEFAULT_SOURCE = ("the default: no --region, AWS_REGION, AWS_DEFAULT_REGION, `region:` in "
                  "config.yaml or in the AWS profile")


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


class AWSProvider(ClusterMixin, InstancesMixin, BootMixin, InventoryMixin, NetworkMixin,
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

    def call(self, region: str, method: str, fail_fast: bool = False, **kwargs):
        """One EC2 call, with AWS's errors turned into ours where we know what to say."""
        with aws_errors(region):
            return getattr(self.client("ec2", region, fail_fast), method)(**kwargs)

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
        if spec.market not in ("on-demand", "spot"):
            raise UsageError(f"market must be on-demand or spot, not {spec.market!r}")
        if spec.max_price is not None and spec.market != "spot":
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
        return preflight.instance_type(spec.instance_type, region, cpu_ok=spec.cpu_only,
                                       ami_arch=ami_arch, describe=describe, offered=offered)

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
        found = self.attempt_instance(store, job, region, spec.attempt) \
            if spec.attempt > 1 else None
        instance = found
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
        host.home()  # the first command, only now that the key is settled
        store.update_instance(instance, state="running", details=json.dumps(
            {**self._details(store, instance), "address": address, "host_key": endpoint.host_key,
             "host_key_verified": verified}))
        return host

    def adopt(self, store: Store, kept: Job, job: Job) -> SSHHost:
        """`launch --on`: the new job takes over the kept job's instance (and from now on
        its billing) without provisioning anything; the host is reached the same way."""
        info = (kept.host or {}).get("collected_from") or kept.host or {}
        host = self.host_for(Job(**{**kept.__dict__, "host": info}))
        host.run("true")  # still there, and still the machine whose host key we pinned
        for inst in store.instances(kept.id):
            if inst.state != "terminated":
                store.db.execute("UPDATE instances SET job_id = ? WHERE id = ?", (job.id, inst.id))
                store.add_event(job.id, "instance", detail=f"{inst.id} taken over from job {kept.id}")
                store.add_event(kept.id, "handover", detail=f"{inst.id} to job {job.id}")
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
            "idle_minutes": (max(1, int(math.ceil(spec.idle_minutes))) if spec.keep
                             and spec.idle_minutes is not None else None)}}
        if spec.market == "spot":
            settings["imds_url"] = self.settings.imds_url
            settings["spot_poll_s"] = self.settings.spot_poll_seconds
        return settings

    def shutdown(self, spec) -> tuple[str | None, float]:
        """What the agent runs after the job, and after how long."""
        if spec.keep:
            return None, 0.0
        delay = spec.idle_minutes * 60 if spec.idle_minutes is not None \
            else self.settings.shutdown_delay_seconds
        return self.settings.shutdown_command, delay

    def region_of(self, job: Job) -> str:
        return (job.spec or {}).get("region") or self.region()

    def price_rows(self, spec, region: str | None = None) -> list[tuple[str, str]]:
        """The instances' price and the most the job can cost, as the plan shows them and
        `launch` asks about them."""
        region = region or self.region(spec)
        t = catalog.get(spec.instance_type) if spec.instance_type else None
        price = t.price(region, spec.market) if t else None
        if price is None:
            return [("price", f"no {spec.market} price for {spec.instance_type} in {region} in "
                              "the catalog")]
        basis = catalog.on_demand_source(region) if spec.market == "on-demand" \
            else f"cheapest AZ: {catalog.spot_source(region)}"
        n = max(1, int(spec.nodes or 1))
        each = f"${price:.4f}/h ({basis})" if n == 1 else \
            f"${price * n:.4f}/h for {n} nodes (${price:.4f}/h each; {basis})"
        return [("price", each), ("at most", self.at_most(spec, t, region))]

    def at_most(self, spec, t: catalog.InstanceType, region: str) -> str:
        """The most the job can cost (U9), and what that assumes: every attempt (1 +
        --max-restarts for a recovering spot job), each of its instances billed until
        user-data powers it off (the max runtime + RUNTIME_MARGIN_MIN, whatever the agent
        does), at the dearest price it may get (spot: the region's dearest AZ in the catalog,
        or --max-price; a relaunch: the dearest place it may go, on demand with --fallback),
        with its volumes (F29)."""
        n = max(1, int(spec.nodes or 1))
        minutes = power_off_minutes(spec.max_runtime_s)
        attempts = 1 + spec.max_restarts if spec.recover else 1

        def rate(where: str, market: str) -> float | None:  # an instance, USD/h
            if market == "spot" and spec.max_price is not None:  # never billed above it
                return min(spec.max_price, t.on_demand.get(where) or spec.max_price)
            return t.dearest(where, market)

        first = rate(region, spec.market)
        places = spec.relaunch_places(self.settings, region) if attempts > 1 else []
        priced = {(r, m): rate(r, m) for r, m in places}
        later = [p + self.volumes_per_hour(spec, r) for (r, m), p in priced.items()
                 if p is not None]
        volumes = self.volumes_per_hour(spec, region)
        total = n * minutes / 60 * (first + volumes
                                    + (attempts - 1) * max(later, default=first + volumes))
        margin = minutes - int(spec.max_runtime_s // 60)
        text = (f"${total:.2f}: " + ("one instance" if attempts == 1 else
                                     f"{attempts} attempts (1 + {attempts - 1} restarts)")
                + f" of up to {minutes} min" + (" each" if attempts > 1 else "")
                + f" (the max runtime of {spec.max_runtime_s / 60:g} min + {margin} until "
                  "user-data powers it off)" + (f" on each of {n} nodes" if n > 1 else ""))
        if spec.market == "spot":
            spot = max([first] + [p for (_, m), p in priced.items() if m == "spot" and p])
            text += (f", spot at up to ${spot:.4f}/h ("
                     + ("--max-price" if spec.max_price is not None else
                        "the dearest AZ in the catalog") + ")")
            on_demand = [p for (_, m), p in priced.items() if m == "on-demand" and p]
            if on_demand:
                text += (f", on-demand ({'up to ' if len(on_demand) > 1 else ''}"
                         f"${max(on_demand):.4f}/h) after spot runs out")
        unpriced = sorted({r for (r, _), p in priced.items() if p is None})
        if unpriced:
            text += f", relaunches in {', '.join(unpriced)} not counted (no catalog price)"
        vols = "".join(f" and the {gb:g} GB volume of dataset {name}"
                       for name, gb in self.snapshot_volumes(spec))
        return (text + f", {'each ' if attempts > 1 else ''}with its "
                f"{spec.root_gb(self.settings)} GB gp3 disk{vols} (${volumes:.4f}/h)")

    def snapshot_volumes(self, spec) -> list[tuple[str, float]]:
        """(dataset, GiB) of each volume made from an EBS snapshot for the job."""
        return [(d["name"], int(((spec.staging or {}).get(d["name"]) or {}).get("bytes") or 0)
                 / (1 << 30)) for d in spec.datasets if d["kind"] == "snapshot"]

    def volumes_per_hour(self, spec, region: str) -> float:
        """USD per hour of an instance's EBS volumes in `region`: the gp3 root volume with
        its provisioned throughput and IOPS, and each dataset's snapshot volume with its."""
        gp3 = catalog.gp3_price(region).per_gb_month
        month = spec.root_gb(self.settings) * gp3 + (
            cost.gp3_performance_per_month(spec.disk_mbps) if spec.disk_mbps else 0.0)
        by_name = {d["name"]: d for d in spec.datasets}
        for name, gb in self.snapshot_volumes(spec):
            d = by_name[name]
            month += gb * gp3 + cost.gp3_performance_per_month(
                int(d.get("throughput") or cost.GP3_BASE_MBPS),
                int(d.get("iops") or cost.GP3_BASE_IOPS))
        return month / cost.HOURS_PER_MONTH

    def question(self, spec) -> Question | None:
        """What `launch` asks before creating paid resources (none for --on: the kept instance
        bills already)."""
        if spec.on_job:
            return None
        rows = dict(self.price_rows(spec))
        at_most = f"; at most {rows['at most']}" if "at most" in rows else ""
        what = f"a {spec.market} {spec.instance_type}" if spec.nodes <= 1 else \
            f"{spec.nodes} {spec.market} {spec.instance_type} instances"
        return Question(f"This launches {what} in {self.region(spec)}, "
                        f"billed per second: {rows['price']}{at_most}.",
                        self.warnings(spec, self.region(spec)))

    def warnings(self, spec, region: str) -> list[str]:
        """What the plan and the launch say before anything is bought (U23): a --max-price
        below the catalog's cheapest spot price of the type there."""
        t = catalog.get(spec.instance_type) if spec.instance_type else None
        cheapest = t.price(region, "spot") if t is not None else None
        if spec.market != "spot" or spec.max_price is None or cheapest is None or \
                spec.max_price >= cheapest:
            return []
        return [f"--max-price ${spec.max_price:g}/h is below the cheapest spot price of "
                f"{t.name} in {region} (${cheapest:.4f}/h in the catalog): EC2 starts no "
                "instance while spot costs more"]

    # -- dry run ---------------------------------------------------------------------------------

    def plan(self, spec) -> list[tuple[str, str]]:
        """What launch would do, as (what, value) rows; creates nothing, bills nothing. With
        credentials it also resolves AZs and AMI and asks EC2 (DryRun=True) whether
        RunInstances would be allowed."""
        facts = self.preflight(spec)
        region, source = self.region_and_source(spec)
        rows = [("backend", "aws"),
                ("region", region + ("" if source == "--region" else f" ({source})"))]
        if spec.on_job:
            rows.append(("instance", f"the kept instance of job {spec.on_job} (--on): no "
                                     "provisioning, only changed files synced"))
            return rows
        t = catalog.get(spec.instance_type)
        if t is None:
            gpus = f"{facts.gpus:g}x {facts.gpu}" if facts.gpus else "no GPU (--cpu-only)"
            rows.append(("instance", f"{spec.instance_type}: {gpus} (not in the bundled "
                                     "catalog: price unknown)"))
        else:
            rows.append(("instance", f"{t.name}: {t.gpus:g}x {t.gpu}, {t.vcpus:g} vCPU, "
                                     f"{t.memory_gib:g} GiB"))
        if facts.note:
            rows.append(("note", facts.note))
        if spec.nodes > 1:
            rows.append(("nodes", f"{spec.nodes} instances in one AZ, one cluster placement "
                                  f"group (created for the job, deleted after), all or none: "
                                  f"a node that cannot be had releases the others and the "
                                  f"next AZ is tried"))
            efa = self.efa_plan(spec)
            rows.append(("network", "TCP between the nodes (security group cloudtrain admits "
                                    "its members); no EFA on " + spec.instance_type
                         if efa is None else
                         f"EFA, {efa['used']} interface{'s' if efa['used'] > 1 else ''} per "
                         f"node (security group {EFA_GROUP_NAME}); NCCL over libfabric: "
                         + " ".join(f"{k}={v}" for k, v in self.efa_environment(spec).items())
                         + (f"; {efa['why']}" if efa["why"] else "")))
        if spec.kind == "recipe" and (t is not None or facts.source == "EC2"):
            procs = spec.processes(int(facts.gpus))
            if spec.nodes > 1:
                rows.append(("processes", f"{procs} per node x {spec.nodes} nodes = "
                                          f"{procs * spec.nodes} (torchrun --nnodes "
                                          f"{spec.nodes}, rendezvous at node 0)"))
            else:
                rows.append(("processes", f"{procs}" + (" (torchrun, one per GPU)" if procs > 1
                                                        else "")))
        elif spec.nodes > 1:
            rows.append(("processes", f"your command on each of {spec.nodes} nodes, with "
                                      "CLOUDTRAIN_NODES, CLOUDTRAIN_NODE_RANK, MASTER_ADDR and "
                                      "MASTER_PORT set (start torchrun with them)"))
        rows.append(("market", spec.market + (f", max price ${spec.max_price}/h"
                                              if spec.max_price is not None else "")))
        rows += [("WARNING", warning) for warning in self.warnings(spec, region)]
        rows += self.price_rows(spec, region)
        disk = spec.root_gb(self.settings)
        fast = ""
        if spec.disk_mbps and spec.disk_mbps > cost.GP3_BASE_MBPS:  # for the data copy
            fast = (f", {spec.disk_mbps} MB/s and {cost.gp3_iops_for(spec.disk_mbps)} IOPS "
                    f"provisioned for the data copy (+$"
                    f"{cost.gp3_performance_per_month(spec.disk_mbps) / cost.HOURS_PER_MONTH:.4f}"
                    "/h)")
        rows.append(("disk", f"{disk} GB gp3{fast}, encrypted, deleted with the instance"
                     + (" (each node its own)" if spec.nodes > 1 else "")))
        rows.append(("shutdown", "the agent powers the instance off after the job "
                     + ("(no: --keep)" if spec.keep else f"(after {self.shutdown(spec)[1]:g} s)")
                     + f"; user-data after {power_off_minutes(spec.max_runtime_s)} min"
                     " regardless"))
        rows.append(("results", self.results_plan(spec, region)))
        if spec.recover:
            where = "the other AZs of the region (cheapest spot price now first)" + (
                ", then " + self.settings.regions if self.settings.regions else "") + (
                ", then on-demand" if spec.fallback == "on-demand" else "")
            new = "a new instance" if spec.nodes <= 1 else \
                f"{spec.nodes} new instances (an interruption of any node relaunches all)"
            rows.append(("recovery", f"on a spot interruption the job continues from its last "
                                     f"checkpoint (streamed to the job store) on {new}, at "
                                     f"most {spec.max_restarts} times: {where}; "
                                     "a supervisor on this machine does it"))
        elif spec.market == "spot":
            why = "--max-restarts 0" if spec.max_restarts == 0 else "--no-recover"
            rows.append(("recovery", f"off ({why}): an interruption ends the job as "
                                     "preempted"))
        if self.credentials(region) is None:
            rows.append(("AMI", f"resolved at launch from SSM {DLAMI_PARAMETER}"
                         if not spec.ami else spec.ami))
            rows.append(("permissions", "not checked: no AWS credentials (this plan needs none)"))
            return rows
        step = "AZs to try"  # D31: a failure is said under the row it is about
        try:
            zones = self.subnets(region)
            zones = self.order_zones(zones, spec.instance_type, region, spec.market)
            rows.append((step, ", ".join(z[0] for z in zones)))
            step = "AMI"
            ami = self.resolve_ami(region, spec.ami)
            rows.append((step, ami))
            step = "permissions"
            request = dict(ImageId=ami, InstanceType=spec.instance_type,
                           MinCount=spec.nodes, MaxCount=spec.nodes,
                           SubnetId=zones[0][1], DryRun=True)
            if spec.market == "spot":
                request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                    "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
            try:
                self.call(region, "run_instances", fail_fast=True, **request)
                rows.append((step, "RunInstances: EC2 answered without DryRunOperation"))
            except AWSError as exc:
                if exc.code == "DryRunOperation":
                    rows.append((step, "RunInstances allowed (EC2 DryRun)"))
                elif exc.code == "UnauthorizedOperation":
                    rows.append((step, f"RunInstances DENIED: attach {POLICY_FILE}"))
                else:
                    rows.append((step, f"RunInstances: {exc.code}: {exc.aws_message}"))
        except CloudtrainError as exc:
            rows.append((step, exc.message))
        return rows
