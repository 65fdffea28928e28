"""EC2 through boto3: the cloud as a handful of verbs.

    preflight(spec)             credentials and instance type, before anything is created
    bootstrap(region)           key pair, security group and AMI, reused across jobs
    acquire(store, job, spec)   run_instances in each AZ in turn, record, wait, SSH -> SSHHost
    host_for(job)               SSHHost from the stored endpoint (host key pinned)
    release(store, job)         terminate by record and by tag: nothing bills afterwards
    reconcile(store)            one DescribeInstances per region: every instance tagged ours
    cleanup(region)             delete the security group and key pair no instance uses
    plan(spec)                  what launch would do (dry run), without creating anything

Raw boto dicts stay inside this module. Every resource is tagged at creation
(TagSpecifications) with cloudtrain:job, cloudtrain:owner, cloudtrain:recipe and Name, so the
cloud itself can always tell what is ours, even with the local database lost.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .. import catalog, config
from ..errors import CloudtrainError, HostError, MissingDependency, UsageError
from ..hosts import SSHHost, default_tmux_socket
from ..ssh import Endpoint, generate_ed25519
from ..state import Instance, Job, Store

TAG_JOB, TAG_OWNER, TAG_RECIPE = "cloudtrain:job", "cloudtrain:owner", "cloudtrain:recipe"
GROUP_NAME = "cloudtrain"
USER_DATA = Path(__file__).resolve().parent.parent.parent / "infra" / "user-data.sh"
# The AWS Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9 (Ubuntu 24.04) by its SSM public
# parameter; its Python is /opt/pytorch/bin/python (DLAMI release notes). The newest image
# matching the name is the fallback when SSM is not reachable.
DLAMI_PARAMETER = ("/aws/service/deeplearning/ami/x86_64/"
                   "oss-nvidia-driver-gpu-pytorch-2.9-ubuntu-24.04/latest/ami-id")
DLAMI_NAME = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 24.04) *"
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
RUNTIME_MARGIN_MIN = 15  # user-data powers off this long after the job's max runtime
CACHE_TTL_S = 24 * 3600  # how long a resolved AMI and the subnet list are reused


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


# The Price List Query API answers from us-east-1 (also eu-central-1, ap-south-1) for every
# region; the region asked about is a filter.
PRICING_REGION = "us-east-1"
EC2_PRICE_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                     "capacitystatus": "Used"}


def price_per_unit(item: str, unit: str) -> float | None:
    """The on-demand USD price per `unit` ("Hrs", "GB-Mo") in one PriceList item: a JSON
    document whose terms.OnDemand.<offer>.priceDimensions.<rate> has unit and pricePerUnit.
    Zero-priced dimensions (reserved-capacity placeholders) do not count."""
    doc = json.loads(item)
    prices = []
    for offer in ((doc.get("terms") or {}).get("OnDemand") or {}).values():
        for dim in (offer.get("priceDimensions") or {}).values():
            if dim.get("unit") == unit:
                try:
                    usd = float((dim.get("pricePerUnit") or {}).get("USD", "nan"))
                except ValueError:
                    continue
                if usd > 0:
                    prices.append(usd)
    return min(prices) if prices else None


def ec2_transition_time(reason: str) -> float | None:
    """EC2 puts the time of a stop or termination in StateTransitionReason:
    'User initiated (2026-11-22 03:00:00 GMT)'."""
    import calendar
    import re

    m = re.search(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)", reason or "")
    if not m:
        return None
    return float(calendar.timegm(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")))


class StaleCache(Exception):
    """RunInstances named a cached resource that no longer exists."""


class RegionCache:
    """What bootstrap found per (profile, region), in $CLOUDTRAIN_HOME/aws-cache.json."""

    def __init__(self, profile: str, region: str):
        self.path = config.home() / "aws-cache.json"
        self.key = f"{profile or 'default'}|{region}"

    def _all(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def load(self) -> dict:
        return self._all().get(self.key, {})

    def save(self, entry: dict) -> None:
        data = self._all()
        data[self.key] = entry
        self._write(data)

    def clear(self) -> None:
        data = self._all()
        if data.pop(self.key, None) is not None:
            self._write(data)

    def _write(self, data: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)


@dataclass
class Attempt:
    zone: str
    subnet: str
    error: str | None  # None: it worked


class AWSProvider:
    name = "aws"

    def __init__(self, settings: config.Settings | None = None):
        self.settings = settings or config.Settings.load()
        self._sessions: dict[str, object] = {}
        self._clients: dict[tuple, object] = {}

    # -- sessions and clients ------------------------------------------------------------------

    def session(self, region: str | None = None):
        import boto3
        import botocore.exceptions

        key = region or ""
        if key not in self._sessions:
            try:
                self._sessions[key] = boto3.Session(
                    profile_name=self.settings.aws_profile or None,
                    region_name=region or self.settings.region or None)
            except botocore.exceptions.ProfileNotFound as exc:
                raise UsageError(f"AWS profile not found: {exc}",
                                 hint="list yours with: aws configure list-profiles") from exc
        return self._sessions[key]

    def region(self, spec=None) -> str:
        region = (spec.region if spec is not None and spec.region else None) \
            or self.settings.region or self.session().region_name
        if not region:
            raise UsageError("no AWS region: pass --region, set `region:` in config.yaml, "
                             "or AWS_REGION", hint="cloudtrain launch --region us-east-1 ...")
        return region

    def client(self, service: str, region: str, fail_fast: bool = False):
        """A client; fail_fast for run_instances (capacity errors are not retried, the next
        AZ is tried instead). Others retry throttling and 5xx with backoff (standard mode)."""
        key = (service, region, fail_fast)
        if key not in self._clients:
            from botocore.config import Config

            retries = {"max_attempts": 1} if fail_fast else {"max_attempts": 6, "mode": "standard"}
            cfg = Config(retries=retries, connect_timeout=10, read_timeout=60)
            self._clients[key] = self.session(region).client(service, region_name=region,
                                                             config=cfg)
        return self._clients[key]

    def call(self, region: str, method: str, fail_fast: bool = False, **kwargs):
        """One EC2 call, with AWS's errors turned into ours where we know what to say."""
        with aws_errors(region):
            return getattr(self.client("ec2", region, fail_fast), method)(**kwargs)

    # -- identity and bootstrap ------------------------------------------------------------------

    def owner(self, region: str) -> str:
        """The caller's ARN: the cloudtrain:owner tag of everything this user creates."""
        if not hasattr(self, "_owner"):
            with aws_errors(region):
                sts = self.session(region).client("sts", region_name=region)
                self._owner = sts.get_caller_identity()["Arn"]
        return self._owner

    def key_path(self, region: str) -> Path:
        return config.home() / "keys" / region / "cloudtrain_ed25519"

    def ensure_key(self, region: str, owner: str) -> tuple[str, Path]:
        """An ed25519 key kept 0600 under $CLOUDTRAIN_HOME/keys/<region>, imported into EC2
        under a name derived from the public key (so the two can never disagree)."""
        path = self.key_path(region)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(path.parent, 0o700)
            public = generate_ed25519(str(path))
            Path(f"{path}.pub").write_text(public + "\n")
        public = Path(f"{path}.pub").read_text().strip()
        name = "cloudtrain-" + hashlib.sha256(public.encode()).hexdigest()[:12]
        found = self.call(region, "describe_key_pairs",
                          Filters=[{"Name": "key-name", "Values": [name]}])["KeyPairs"]
        if not found:
            self.call(region, "import_key_pair", KeyName=name, PublicKeyMaterial=public.encode(),
                      TagSpecifications=[{"ResourceType": "key-pair", "Tags": [
                          {"Key": TAG_OWNER, "Value": owner}, {"Key": "Name", "Value": name}]}])
        return name, path

    def ssh_cidr(self) -> str:
        if self.settings.ssh_cidr:
            return self.settings.ssh_cidr
        try:
            with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=5) as resp:
                ip = resp.read().decode().strip()
            socket.inet_aton(ip)
        except (OSError, ValueError) as exc:
            raise AWSError(f"could not find this machine's public address ({exc}) to allow SSH "
                           "from it", hint="set `ssh_cidr: <your address>/32` in config.yaml") from exc
        return f"{ip}/32"

    def ensure_group(self, region: str, vpc: str, owner: str) -> str:
        """One security group per VPC, reused: SSH from ssh_cidr only, plus all traffic
        between members (multi-node jobs)."""
        found = self.call(region, "describe_security_groups", Filters=[
            {"Name": "group-name", "Values": [GROUP_NAME]}, {"Name": "vpc-id", "Values": [vpc]}
        ])["SecurityGroups"]
        if found:
            group = found[0]
        else:
            gid = self.call(region, "create_security_group", GroupName=GROUP_NAME, VpcId=vpc,
                            Description="cloudtrain: SSH from the launching machine only",
                            TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                                {"Key": TAG_OWNER, "Value": owner},
                                {"Key": "Name", "Value": GROUP_NAME}]}])["GroupId"]
            group = {"GroupId": gid, "IpPermissions": []}
        gid = group["GroupId"]
        cidr = self.ssh_cidr()
        port = self.settings.ssh_port
        have_ssh = any(p.get("FromPort") == port and any(r.get("CidrIp") == cidr
                                                         for r in p.get("IpRanges", []))
                       for p in group.get("IpPermissions", []))
        have_self = any(any(g.get("GroupId") == gid for g in p.get("UserIdGroupPairs", []))
                        for p in group.get("IpPermissions", []))
        perms = []
        if not have_ssh:
            perms.append({"IpProtocol": "tcp", "FromPort": port, "ToPort": port,
                          "IpRanges": [{"CidrIp": cidr, "Description": "cloudtrain SSH"}]})
        if not have_self:
            perms.append({"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid}]})
        if perms:
            self.call(region, "authorize_security_group_ingress", GroupId=gid, IpPermissions=perms)
        return gid

    def resolve_ami(self, region: str, ami: str | None = None) -> str:
        if ami:
            return ami
        import botocore.exceptions

        try:
            ssm = self.session(region).client("ssm", region_name=region)
            return ssm.get_parameter(Name=DLAMI_PARAMETER)["Parameter"]["Value"]
        except botocore.exceptions.ClientError:
            pass  # not published in this region or not allowed: fall back to the name
        images = self.call(region, "describe_images", Owners=["amazon"], Filters=[
            {"Name": "name", "Values": [DLAMI_NAME]}, {"Name": "state", "Values": ["available"]}
        ])["Images"]
        if not images:
            raise AWSError(f"no AWS Deep Learning PyTorch AMI found in {region}",
                           hint="pass --ami ami-... (an Ubuntu image with NVIDIA drivers and PyTorch)")
        return max(images, key=lambda i: i.get("CreationDate", ""))["ImageId"]

    def root_device(self, region: str, ami: str) -> str:
        """The AMI's root device name (/dev/sda1 on Ubuntu, /dev/xvda on Amazon Linux): the
        volume size and type only apply when the mapping names the real root device."""
        images = self.call(region, "describe_images", ImageIds=[ami])["Images"]
        if not images:
            raise AWSError(f"AMI {ami} does not exist in {region}",
                           hint="check --ami, or leave it out for the Deep Learning AMI")
        return images[0].get("RootDeviceName") or "/dev/sda1"

    def subnets(self, region: str) -> list[tuple[str, str, str, str]]:
        """(zone, subnet, vpc, zone id) to try, one per AZ: the configured subnet, or the
        default VPC's (or `vpc_id`'s)."""
        def row(s):
            return (s["AvailabilityZone"], s["SubnetId"], s["VpcId"], s.get("AvailabilityZoneId", ""))

        if self.settings.subnet_id:
            found = self.call(region, "describe_subnets",
                              SubnetIds=[self.settings.subnet_id])["Subnets"]
            return [row(s) for s in found]
        filters = [{"Name": "default-for-az", "Values": ["true"]}]
        if self.settings.vpc_id:
            filters = [{"Name": "vpc-id", "Values": [self.settings.vpc_id]}]
        found = self.call(region, "describe_subnets", Filters=filters)["Subnets"]
        if not found:
            raise AWSError(f"no default VPC subnets in {region}",
                           hint="set `subnet_id:` (and `vpc_id:`) in config.yaml")
        by_zone: dict[str, tuple[str, str, str, str]] = {}
        for s in sorted(found, key=lambda s: (s["AvailabilityZone"], s["SubnetId"])):
            by_zone.setdefault(s["AvailabilityZone"], row(s))
        return list(by_zone.values())

    @staticmethod
    def order_zones(zones: list[tuple], instance_type: str, region: str, market: str) -> list:
        """Spot: the AZ the catalog's snapshot prices lowest first (AZ ids, which differ from
        AZ names per account); AZs without a known price keep their order, after those."""
        t = catalog.get(instance_type)
        prices = (t.spot_snapshot.get(region) or {}) if t and market == "spot" else {}
        if not prices:
            return list(zones)
        return sorted(zones, key=lambda z: (z[3] not in prices, prices.get(z[3], 0.0)))

    # -- the provider contract -------------------------------------------------------------------

    def preflight(self, spec) -> None:
        if not spec.instance_type and not spec.on_job:  # --on: the kept job's instance
            raise UsageError("which instance? pass --instance (e.g. g5.xlarge)")
        if spec.market not in ("on-demand", "spot"):
            raise UsageError(f"market must be on-demand or spot, not {spec.market!r}")
        if spec.max_price is not None and spec.market != "spot":
            raise UsageError("--max-price applies to --spot")

    def bootstrap(self, region: str, ami: str | None, cached: bool = True) -> dict:
        """Owner, key pair, subnets, security group, AMI and its root device for a region.
        What was set up before is taken from $CLOUDTRAIN_HOME/aws-cache.json (AMI and subnets
        for a day), so a warm launch makes no describe calls; a stale entry shows up as a
        *.NotFound from RunInstances, and the caller bootstraps again uncached."""
        cache = RegionCache(self.settings.aws_profile, region)
        entry = cache.load() if cached else {}
        credentials = self.session(region).get_credentials()
        access_key = credentials.access_key if credentials else None
        if entry.get("access_key") == access_key and entry.get("owner"):
            self._owner = entry["owner"]
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
        entry.update(access_key=access_key, owner=owner, key_name=key_name)
        cache.save(entry)
        return {"owner": owner, "key_name": key_name, "key_path": key_path, "zones": zones,
                "group": group, "ami": ami, "root_device": root_device}

    def acquire(self, store: Store, job: Job, spec) -> SSHHost:
        region = self.region(spec)
        boot = self.bootstrap(region, spec.ami)
        try:
            instance = self._run(store, job, spec, region, boot)
        except StaleCache:
            RegionCache(self.settings.aws_profile, region).clear()
            boot = self.bootstrap(region, spec.ami, cached=False)
            instance = self._run(store, job, spec, region, boot)
        key_path = boot["key_path"]
        address = self._wait_running(region, instance)
        endpoint = Endpoint(address, self.settings.ssh_port, self.settings.ssh_user, str(key_path))
        host = self._wait_ssh(region, instance, endpoint)
        store.update_instance(instance, state="running", details=json.dumps(
            {**self._details(store, instance), "address": address, "host_key": endpoint.host_key}))
        return host

    def _details(self, store: Store, instance_id: str) -> dict:
        row = store.db.execute("SELECT details FROM instances WHERE id = ?",
                               (instance_id,)).fetchone()
        return json.loads(row["details"]) if row and row["details"] else {}

    def _tags(self, job: Job, spec, owner: str) -> list[dict]:
        return [{"Key": TAG_JOB, "Value": job.id}, {"Key": TAG_OWNER, "Value": owner},
                {"Key": TAG_RECIPE, "Value": spec.recipe or "command"},
                {"Key": "Name", "Value": f"cloudtrain-{job.id}" + (f"-{job.name}" if job.name else "")}]

    def user_data(self, job: Job, spec) -> str:
        minutes = int(spec.max_runtime_s // 60) + RUNTIME_MARGIN_MIN
        command = self.settings.shutdown_command.replace("sudo ", "")  # user-data runs as root
        return (USER_DATA.read_text().replace("@@JOB_ID@@", job.id)
                .replace("@@MAX_RUNTIME_MINUTES@@", str(minutes))
                .replace("@@SHUTDOWN_COMMAND@@", command))

    def run_request(self, job: Job, spec, subnet: str, group: str, ami: str, key_name: str,
                    owner: str, disk_gb: int, root_device: str) -> dict:
        tags = self._tags(job, spec, owner)
        request = dict(
            ImageId=ami, InstanceType=spec.instance_type, MinCount=1, MaxCount=1,
            KeyName=key_name, SubnetId=subnet, SecurityGroupIds=[group],
            InstanceInitiatedShutdownBehavior="terminate",
            MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled",
                             "HttpPutResponseHopLimit": 2},
            BlockDeviceMappings=[{"DeviceName": root_device, "Ebs": {
                "VolumeSize": disk_gb, "VolumeType": "gp3", "Encrypted": True,
                "DeleteOnTermination": True}}],
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags},
                               {"ResourceType": "volume", "Tags": tags}],
            UserData=self.user_data(job, spec),
        )
        if self.settings.instance_profile:
            request["IamInstanceProfile"] = {"Name": self.settings.instance_profile}
        if spec.market == "spot":
            options = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if spec.max_price is not None:
                options["MaxPrice"] = f"{spec.max_price:.4f}"
            request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
        return request

    def _run(self, store, job, spec, region, boot: dict) -> str:
        import botocore.exceptions

        zones, group, ami, key_name, owner = (boot["zones"], boot["group"], boot["ami"],
                                              boot["key_name"], boot["owner"])
        zones = self.order_zones(zones, spec.instance_type, region, spec.market)
        root_device = boot["root_device"]
        disk = spec.disk_gb or self.settings.disk_gb or int(spec.resources.get("disk_gb", 100))
        attempts: list[Attempt] = []
        for n, (zone, subnet, _vpc, _zone_id) in enumerate(zones):
            request = self.run_request(job, spec, subnet, group, ami, key_name, owner, disk,
                                       root_device)
            try:
                # ClientToken: a retried request can never start a second instance.
                response = self.call(region, "run_instances", fail_fast=True,
                                     ClientToken=f"{job.id}-{n}", **request)
            except botocore.exceptions.ClientError as exc:
                code = _code(exc)
                if code in STALE_ERRORS and not attempts:
                    raise StaleCache(code) from exc
                if code in CAPACITY_ERRORS:
                    attempts.append(Attempt(zone, subnet, f"{code}: {_message(exc)}"))
                    continue
                tried = ", ".join(a.zone for a in attempts + [Attempt(zone, subnet, code)])
                if code in QUOTA_ERRORS:
                    raise AWSError(f"{spec.instance_type} ({spec.market}) in {region}: {code}: "
                                   f"{_message(exc)} (AZs tried: {tried})",
                                   hint="ask AWS for a higher quota (Service Quotas console: "
                                        "'Running On-Demand G and VT instances' / 'All G and VT "
                                        "Spot Instance Requests'), or use a smaller instance") from exc
                if code in ("InvalidParameterValue", "InvalidInstanceType") and \
                        spec.instance_type in _message(exc):
                    raise AWSError(f"{spec.instance_type} is not offered in {region}: "
                                   f"{_message(exc)}", hint="cloudtrain catalog lists types and "
                                                            "regions") from exc
                raise AWSError(f"run_instances failed in {zone}: {code}: {_message(exc)}") from exc
            raw = response["Instances"][0]
            instance_id = raw["InstanceId"]
            price = (catalog.get(spec.instance_type).price(region, "on-demand")
                     if catalog.get(spec.instance_type) else None)
            # Recorded before any waiting: from here on, every failure path can terminate it.
            store.add_instance(Instance(
                id=instance_id, job_id=job.id, provider=self.name, region=region, zone=zone,
                instance_type=spec.instance_type, market=spec.market, state="requested",
                launched_at=raw["LaunchTime"].timestamp() if raw.get("LaunchTime") else time.time(),
                terminated_at=None, price_per_hour=price if spec.market == "on-demand" else None,
                details={"subnet": subnet, "ami": ami, "key_name": key_name, "group": group,
                         "disk_gb": disk, "attempts": [a.__dict__ for a in attempts]}))
            store.add_event(job.id, "instance", detail=f"{instance_id} in {zone}")
            return instance_id
        tried = "; ".join(f"{a.zone}: {a.error}" for a in attempts)
        what = f"{spec.instance_type} ({spec.market})"
        hint = ("try --spot / --on-demand, another --instance or --region, or later"
                if spec.market == "on-demand" else
                "try --on-demand, a higher --max-price, another --instance or --region")
        raise AWSError(f"no capacity for {what} in {region}, every AZ tried: {tried}", hint=hint)

    def _describe(self, region: str, instance_id: str) -> dict:
        reservations = self.call(region, "describe_instances",
                                 InstanceIds=[instance_id])["Reservations"]
        return reservations[0]["Instances"][0]

    def _wait_running(self, region: str, instance_id: str) -> str:
        deadline = time.monotonic() + self.settings.instance_wait_seconds
        while True:
            raw = self._describe(region, instance_id)
            state = raw["State"]["Name"]
            if state == "running":
                key = "PrivateIpAddress" if self.settings.connect == "private" else "PublicIpAddress"
                if raw.get(key):
                    return raw[key]
                if self.settings.connect != "private":
                    raise AWSError(f"{instance_id} has no public IP address",
                                   hint="set `connect: private` (VPN, peering) or use a subnet "
                                        "that maps public IPs")
            if state in ("shutting-down", "terminated", "stopping", "stopped"):
                reason = raw.get("StateReason", {}).get("Message", state)
                raise AWSError(f"{instance_id} went {state} while starting: {reason}")
            if time.monotonic() > deadline:
                raise AWSError(f"{instance_id} is still {state} after "
                               f"{self.settings.instance_wait_seconds:.0f} s",
                               hint=f"aws ec2 describe-instances --instance-ids {instance_id} "
                                    f"--region {region}")
            time.sleep(self.settings.poll_seconds)

    def _wait_ssh(self, region: str, instance_id: str, endpoint: Endpoint) -> SSHHost:
        deadline = time.monotonic() + self.settings.ssh_wait_seconds
        last = None
        while time.monotonic() < deadline:
            host = SSHHost(endpoint, default_tmux_socket(),
                           python=self.settings.remote_python or "python3")
            try:
                host.home()  # the first round trip; later steps need it anyway
                return host
            except HostError as exc:
                last = exc
                host.close()
                time.sleep(self.settings.poll_seconds)
        console = self.console_tail(region, instance_id)
        raise AWSError(f"SSH to {instance_id} ({endpoint.label()}) did not answer in "
                       f"{self.settings.ssh_wait_seconds:.0f} s: {last.message if last else ''}"
                       + (f"; console output ends: {console}" if console else ""),
                       hint=f"aws ec2 get-console-output --instance-id {instance_id} --region "
                            f"{region} --latest; check the security group allows {self.ssh_cidr()}")

    def console_tail(self, region: str, instance_id: str) -> str:
        import base64

        import botocore.exceptions

        try:
            out = self.call(region, "get_console_output", InstanceId=instance_id).get("Output")
        except (botocore.exceptions.ClientError, CloudtrainError):
            return ""
        if not out:
            return ""
        try:
            text = base64.b64decode(out).decode("utf-8", "replace")
        except ValueError:
            text = out
        return " | ".join(text.strip().splitlines()[-3:])

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
        endpoint = Endpoint(info["host"], info.get("port", 22), info.get("user", "ubuntu"),
                            info.get("key_path"), info.get("host_key"))
        return SSHHost(endpoint, info.get("tmux_socket", "cloudtrain"), info.get("python", "python3"))

    def setup(self, host: SSHHost) -> None:
        """The host has what the agent needs: python3 (3.8+) and tmux."""
        found = host.run("command -v /opt/pytorch/bin/python || command -v python3; "
                         "printf 'tmux:'; command -v tmux", check=False).stdout.splitlines()
        pythons = [line for line in found if not line.startswith("tmux:")]
        if self.settings.remote_python:
            host.python = self.settings.remote_python
        elif pythons:
            host.python = pythons[0]
        else:
            raise MissingDependency(f"{host.name} has no python3")
        if "tmux:" in found:  # `command -v tmux` printed nothing
            from ..hosts import TMUX_INSTALL_HINT

            raise MissingDependency(f"tmux is not installed on {host.name}", hint=TMUX_INSTALL_HINT)

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

    def agent_settings(self, spec) -> dict:
        """What the agent on this host watches: the spot interruption notice (spot only)."""
        return {"imds_url": self.settings.imds_url} if spec.market == "spot" else {}

    def shutdown(self, spec) -> tuple[str | None, float]:
        """What the agent runs after the job, and after how long."""
        if spec.keep:
            return None, 0.0
        delay = spec.idle_minutes * 60 if spec.idle_minutes is not None \
            else self.settings.shutdown_delay_seconds
        return self.settings.shutdown_command, delay

    def instance_states(self, store: Store, job: Job) -> dict[str, dict]:
        """EC2's view of the job's instances: id -> {state, reason, terminated}."""
        out = {}
        for region in {i.region for i in store.instances(job.id) if i.region}:
            for raw in self._query(region, {TAG_JOB: job.id}):
                out[raw["InstanceId"]] = {"state": raw["State"]["Name"],
                                          "reason": raw.get("StateReason", {}).get("Code", ""),
                                          "message": raw.get("StateReason", {}).get("Message", "")}
        return out

    def _query(self, region: str, tags: dict[str, str | None]) -> list[dict]:
        filters = [{"Name": f"tag:{k}", "Values": [v]} if v else {"Name": "tag-key", "Values": [k]}
                   for k, v in tags.items()]
        out = []
        paginator = self.client("ec2", region).get_paginator("describe_instances")
        with aws_errors(region):
            for page in paginator.paginate(Filters=filters):
                for res in page["Reservations"]:
                    out.extend(res["Instances"])
        return out

    def release(self, store: Store, job: Job, force: bool = False) -> None:
        """Terminate what the job has: the recorded instances and anything tagged with its id
        (a request whose answer was lost still started an instance). A --keep job's instance
        stays until `cloudtrain down` (force)."""
        if (job.spec or {}).get("keep") and not force and job.state != "cancelled":
            return
        recorded = store.instances(job.id)
        regions = {i.region for i in recorded if i.region} or {self.region_of(job)}
        for region in regions:
            ids = {i.id for i in recorded if i.region == region and i.state != "terminated"}
            tagged = {r["InstanceId"] for r in self._query(region, {TAG_JOB: job.id})
                      if r["State"]["Name"] not in ("terminated",)}
            ids |= tagged
            if ids:
                self.call(region, "terminate_instances", InstanceIds=sorted(ids))
            for raw in self._query(region, {TAG_JOB: job.id}) if ids else []:
                known = {i.id for i in store.instances(job.id)}
                if raw["InstanceId"] not in known:  # found by tag only: record it now
                    store.add_instance(Instance(
                        id=raw["InstanceId"], job_id=job.id, provider=self.name, region=region,
                        zone=raw.get("Placement", {}).get("AvailabilityZone"),
                        instance_type=raw.get("InstanceType"), market=(job.spec or {}).get("market"),
                        state="requested", launched_at=raw["LaunchTime"].timestamp(),
                        terminated_at=None, price_per_hour=None, details={"found_by_tag": True}))
        self.record_ends(store, job)

    def record_ends(self, store: Store, job: Job) -> None:
        """Termination times from EC2 (its state-transition reason carries the time), and for
        spot instances the price history of their AZ over their life: what the bill uses."""
        for inst in store.instances(job.id):
            if inst.state == "terminated" and inst.terminated_at and not (
                    inst.market == "spot" and not (inst.details or {}).get("spot_history")):
                continue
            raw = {}
            try:
                raw = self._describe(inst.region, inst.id)
            except Exception:  # gone from EC2's view (about an hour after termination)
                pass
            ended = ec2_transition_time(raw.get("StateTransitionReason", "")) or time.time()
            fields = {"state": "terminated", "terminated_at": inst.terminated_at or ended}
            if inst.market == "spot":
                import botocore.exceptions

                details = dict(inst.details or {})
                try:
                    details["spot_history"] = self.spot_history(
                        inst.region, raw.get("Placement", {}).get("AvailabilityZone") or inst.zone,
                        inst.instance_type, inst.launched_at, fields["terminated_at"])
                except (CloudtrainError, botocore.exceptions.ClientError):
                    pass  # the cost stays an estimate; `cost-report --refresh` asks again
                fields["details"] = json.dumps(details)
            store.update_instance(inst.id, **fields)

    # -- list prices (the Price List Query API) --------------------------------------------------

    def _products(self, filters: dict[str, str]) -> list[str]:
        """GetProducts for AmazonEC2 with TERM_MATCH filters: the PriceList items (JSON text)."""
        items: list[str] = []
        paginator = self.client("pricing", PRICING_REGION).get_paginator("get_products")
        with aws_errors(PRICING_REGION):
            for page in paginator.paginate(
                    ServiceCode="AmazonEC2", FormatVersion="aws_v1", Filters=[
                        {"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()]):
                items.extend(page.get("PriceList") or [])
        return items

    def on_demand_prices(self, region: str, instance_types: list[str]) -> dict[str, float]:
        """Linux on-demand USD/h per type in `region`, from AWS's public price list: shared
        tenancy, no pre-installed software, capacity "Used" (the rows a plain RunInstances is
        billed at). One query per type, a few at a time."""
        from concurrent.futures import ThreadPoolExecutor

        def one(name: str) -> tuple[str, float | None]:
            items = self._products({**EC2_PRICE_FILTERS, "regionCode": region,
                                    "instanceType": name})
            prices = [p for p in (price_per_unit(item, "Hrs") for item in items) if p]
            return name, (min(prices) if prices else None)

        with ThreadPoolExecutor(max_workers=8) as pool:
            found = dict(pool.map(one, instance_types))
        return {name: price for name, price in found.items() if price is not None}

    def gp3_price(self, region: str) -> float | None:
        """gp3 storage, USD per GB-month in `region`, from the price list."""
        items = self._products({"productFamily": "Storage", "volumeApiName": "gp3",
                                "regionCode": region})
        prices = [p for p in (price_per_unit(item, "GB-Mo") for item in items) if p]
        return min(prices) if prices else None

    def current_spot_prices(self, region: str, instance_types: list[str]) -> dict[str, dict[str, float]]:
        """The spot price now, per type and AZ (Linux/UNIX): the newest history row of each."""
        import datetime

        latest: dict[str, dict[str, tuple[float, float]]] = {}
        paginator = self.client("ec2", region).get_paginator("describe_spot_price_history")
        with aws_errors(region):
            for page in paginator.paginate(
                    InstanceTypes=instance_types, ProductDescriptions=["Linux/UNIX"],
                    StartTime=datetime.datetime.now(datetime.timezone.utc)):
                for p in page["SpotPriceHistory"]:
                    at = p["Timestamp"].timestamp()
                    zones = latest.setdefault(p["InstanceType"], {})
                    if p["AvailabilityZone"] not in zones or zones[p["AvailabilityZone"]][0] < at:
                        zones[p["AvailabilityZone"]] = (at, float(p["SpotPrice"]))
        return {t: {z: price for z, (_, price) in zones.items()} for t, zones in latest.items()}

    def spot_history(self, region: str, zone: str, instance_type: str, start: float,
                     end: float) -> list[list[float]]:
        """[(at, USD/h)] for Linux/UNIX in that AZ, from the last change before `start`."""
        import datetime

        def ts(t):
            return datetime.datetime.fromtimestamp(t, datetime.timezone.utc)

        points = []
        paginator = self.client("ec2", region).get_paginator("describe_spot_price_history")
        with aws_errors(region):
            for page in paginator.paginate(
                    AvailabilityZone=zone, InstanceTypes=[instance_type],
                    ProductDescriptions=["Linux/UNIX"], StartTime=ts(start), EndTime=ts(end)):
                for p in page["SpotPriceHistory"]:
                    points.append([p["Timestamp"].timestamp(), float(p["SpotPrice"])])
        return sorted(points)

    def region_of(self, job: Job) -> str:
        return (job.spec or {}).get("region") or self.region()

    def reconcile(self, store: Store) -> list[dict]:
        """Every instance tagged as ours in the regions we use, one DescribeInstances each;
        marks whether the store knows it. Updates the store's instance states."""
        regions = {r["region"] for r in store.db.execute(
            "SELECT DISTINCT region FROM instances WHERE provider = 'aws' AND region IS NOT NULL")}
        try:
            regions.add(self.region())
        except UsageError:
            pass
        known = {r["id"]: r["job_id"] for r in store.db.execute(
            "SELECT id, job_id FROM instances WHERE provider = 'aws'")}
        found = []
        for region in sorted(regions):
            for raw in self._query(region, {TAG_JOB: None}):
                tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
                state = raw["State"]["Name"]
                found.append({"instance": raw["InstanceId"], "region": region, "state": state,
                              "type": raw.get("InstanceType"), "job": tags.get(TAG_JOB),
                              "tracked": raw["InstanceId"] in known,
                              "launched_at": raw["LaunchTime"].timestamp()})
                if raw["InstanceId"] in known and state == "terminated":
                    store.db.execute(
                        "UPDATE instances SET state = 'terminated', terminated_at = "
                        "COALESCE(terminated_at, ?) WHERE id = ?", (time.time(), raw["InstanceId"]))
        return found

    def cleanup(self, store: Store, regions: set[str]) -> list[str]:
        """Delete the security groups and key pairs that no live instance uses any more."""
        import botocore.exceptions

        removed = []
        for region in sorted(regions):
            live = [r for r in self._query(region, {TAG_JOB: None})
                    if r["State"]["Name"] not in ("terminated",)]
            if live:
                continue
            owner = self.owner(region)
            groups = self.call(region, "describe_security_groups", Filters=[
                {"Name": "group-name", "Values": [GROUP_NAME]},
                {"Name": f"tag:{TAG_OWNER}", "Values": [owner]}])["SecurityGroups"]
            for g in groups:
                try:
                    self.call(region, "delete_security_group", GroupId=g["GroupId"])
                    removed.append(g["GroupId"])
                except botocore.exceptions.ClientError as exc:
                    if _code(exc) != "DependencyViolation":  # still attached: next time
                        raise
            keys = self.call(region, "describe_key_pairs", Filters=[
                {"Name": f"tag:{TAG_OWNER}", "Values": [owner]}])["KeyPairs"]
            for k in keys:
                self.call(region, "delete_key_pair", KeyName=k["KeyName"])
                removed.append(k["KeyName"])
            RegionCache(self.settings.aws_profile, region).clear()
        return removed

    # -- dry run ---------------------------------------------------------------------------------

    def plan(self, spec) -> list[tuple[str, str]]:
        """What launch would do, as (what, value) rows; creates nothing, bills nothing. With
        credentials it also resolves AZs and AMI and asks EC2 (DryRun=True) whether
        RunInstances would be allowed."""
        import botocore.exceptions

        self.preflight(spec)
        region = self.region(spec)
        rows = [("backend", "aws"), ("region", region)]
        t = catalog.get(spec.instance_type)
        if t is None:
            rows.append(("instance", f"{spec.instance_type} (not in the bundled catalog: "
                                     "price unknown)"))
        else:
            rows.append(("instance", f"{t.name}: {t.gpus:g}x {t.gpu}, {t.vcpus:g} vCPU, "
                                     f"{t.memory_gib:g} GiB"))
        if spec.kind == "recipe" and t is not None:
            procs = spec.processes(int(t.gpus))
            rows.append(("processes", f"{procs}" + (" (torchrun, one per GPU)" if procs > 1
                                                    else "")))
        rows.append(("market", spec.market + (f", max price ${spec.max_price}/h"
                                              if spec.max_price is not None else "")))
        price = t.price(region, spec.market) if t else None
        if price is not None:
            basis = catalog.on_demand_source(region) if spec.market == "on-demand" \
                else f"cheapest AZ: {catalog.spot_source(region)}"
            cap = price * spec.max_runtime_s / 3600
            rows.append(("price", f"${price:.4f}/h ({basis})"))
            rows.append(("at most", f"${cap:.2f} if it runs its whole max runtime of "
                                    f"{spec.max_runtime_s / 60:g} min"))
        elif t is not None:
            rows.append(("price", f"no {spec.market} price for {t.name} in {region} in the catalog"))
        disk = spec.disk_gb or self.settings.disk_gb or int(spec.resources.get("disk_gb", 100))
        rows.append(("disk", f"{disk} GB gp3, encrypted, deleted with the instance"))
        rows.append(("shutdown", "the agent powers the instance off after the job "
                     + ("(no: --keep)" if spec.keep else f"(after {self.shutdown(spec)[1]:g} s)")
                     + f"; user-data after {int(spec.max_runtime_s // 60) + RUNTIME_MARGIN_MIN} min"
                     " regardless"))
        if self.session(region).get_credentials() is None:
            rows.append(("AMI", f"resolved at launch from SSM {DLAMI_PARAMETER}"
                         if not spec.ami else spec.ami))
            rows.append(("permissions", "not checked: no AWS credentials (this plan needs none)"))
            return rows
        try:
            zones = self.subnets(region)
            zones = self.order_zones(zones, spec.instance_type, region, spec.market)
            rows.append(("AZs to try", ", ".join(z[0] for z in zones)))
            ami = self.resolve_ami(region, spec.ami)
            rows.append(("AMI", ami))
            request = dict(ImageId=ami, InstanceType=spec.instance_type, MinCount=1, MaxCount=1,
                           SubnetId=zones[0][1], DryRun=True)
            if spec.market == "spot":
                request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                    "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
            try:
                self.call(region, "run_instances", fail_fast=True, **request)
                rows.append(("permissions", "RunInstances: EC2 answered without DryRunOperation"))
            except botocore.exceptions.ClientError as exc:
                if _code(exc) == "DryRunOperation":
                    rows.append(("permissions", "RunInstances allowed (EC2 DryRun)"))
                elif _code(exc) == "UnauthorizedOperation":
                    rows.append(("permissions", "RunInstances DENIED: attach infra/iam-policy-cli.json"))
                else:
                    rows.append(("permissions", f"RunInstances: {_code(exc)}: {_message(exc)}"))
        except CloudtrainError as exc:
            rows.append(("credentials", exc.message))
        return rows
