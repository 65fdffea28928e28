"""Key pair, security group and subnets: what an instance needs around it, reused across jobs."""

from __future__ import annotations

import hashlib
import os
import socket
import urllib.request
from pathlib import Path

from ... import catalog, config
from ...market import Market
from ...ssh import generate_ed25519
from ...state import Store
from .cache import RegionCache
from .errors import AWSError
from .tags import EFA_GROUP_NAME, GROUP_NAME, LIVE_STATES, TAG_JOB, TAG_OWNER


class NetworkMixin:
    """AWSProvider's key pair, security group and subnet handling (needs self.call,
    self.owner, self._query and self.settings)."""

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

    def ssh_rule_description(self) -> str:
        """The description of this machine's SSH rule: one rule per launching machine, so a
        new address replaces the machine's old rule instead of piling up beside it (F9)."""
        machine = hashlib.sha256(f"{socket.gethostname()}|{config.home()}".encode()).hexdigest()
        return f"cloudtrain SSH {machine[:12]}"

    def ensure_group(self, region: str, vpc: str, owner: str) -> str:
        """One security group per VPC, reused: SSH from ssh_cidr only (one rule per launching
        machine, its old address revoked), plus TCP between members (multi-node jobs)."""
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
        mine = self.ssh_rule_description()
        have_ssh, have_members, revoke = False, False, []
        for p in group.get("IpPermissions", []):
            members = [g for g in p.get("UserIdGroupPairs", []) if g.get("GroupId") == gid]
            if members and p.get("IpProtocol") == "tcp" and (p.get("FromPort"), p.get("ToPort")) \
                    == (0, 65535):
                have_members = True
            elif members:  # the old "-1" (every protocol) member rule: narrowed to TCP
                revoke.append({"IpProtocol": p["IpProtocol"], **_ports(p),
                               "UserIdGroupPairs": [{"GroupId": gid}]})
            if p.get("IpProtocol") != "tcp" or p.get("FromPort") != port:
                continue
            for r in p.get("IpRanges", []):
                if r.get("CidrIp") == cidr:
                    # EC2 refuses a second rule for the same CIDR and port whatever its
                    # description (InvalidPermission.Duplicate): one there already will do.
                    have_ssh = True
                elif r.get("Description") == mine:  # this machine's previous address
                    revoke.append({"IpProtocol": "tcp", "FromPort": port, "ToPort": port,
                                   "IpRanges": [{"CidrIp": r["CidrIp"]}]})
        if revoke:
            self.call(region, "revoke_security_group_ingress", GroupId=gid, IpPermissions=revoke)
        perms = []
        if not have_ssh:
            perms.append({"IpProtocol": "tcp", "FromPort": port, "ToPort": port,
                          "IpRanges": [{"CidrIp": cidr, "Description": mine}]})
        if not have_members:
            # torchrun's rendezvous (29500) and NCCL's sockets use ephemeral TCP ports, so
            # members get every TCP port from each other and nothing else (no UDP, no ICMP;
            # EFA, which would need all traffic, is not used).
            perms.append({"IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535,
                          "UserIdGroupPairs": [{"GroupId": gid,
                                                "Description": "cloudtrain multi-node"}]})
        if perms:
            self.call(region, "authorize_security_group_ingress", GroupId=gid, IpPermissions=perms)
        return gid

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
        prices = (t.spot_snapshot.get(region) or {}) if t and market == Market.SPOT else {}
        if not prices:
            return list(zones)
        return sorted(zones, key=lambda z: (z[3] not in prices, prices.get(z[3], 0.0)))

    def cleanup(self, store: Store, regions: set[str] | None = None) -> list[str]:
        """Delete this owner's security groups, key pairs and empty placement groups where
        no live instance uses them
        (any instance: EC2 would refuse the group with DependencyViolation anyway). No
        regions: every region the store knows plus the configured one, so `down --all` can
        call it with nothing active."""
        removed = []
        for region in sorted(regions or self.regions_in_use(store)):
            owner = self.owner(region)
            if store is not None and store.db.execute(
                    "SELECT 1 FROM jobs WHERE backend = 'aws' AND "
                    "CAST(json_extract(spec, '$.nodes') AS INTEGER) > 1 LIMIT 1").fetchone():
                self.delete_placement_groups(region, owner=owner)  # of jobs on several nodes
            shared = self.shared_resources(region)
            for gid in shared["security groups"]:
                if self._live(region, "instance.group-id", gid):
                    continue
                try:
                    self.call(region, "delete_security_group", GroupId=gid)
                    removed.append(gid)
                except AWSError as exc:
                    # An instance still shutting down holds the group: next time.
                    if exc.code != "DependencyViolation":
                        raise
            for name in shared["key pairs"]:
                if self._live(region, "key-name", name):
                    continue
                self.call(region, "delete_key_pair", KeyName=name)
                removed.append(name)
            if removed:
                RegionCache(self.settings.aws_profile, region).clear()
        return removed

    def shared_resources(self, region: str) -> dict[str, list[str]]:
        """This owner's resources that every job in `region` reuses: {"security groups":
        [ids] (cloudtrain, cloudtrain-efa), "key pairs": [names]}."""
        owner = self.owner(region)
        groups = self.call(region, "describe_security_groups", Filters=[
            {"Name": "group-name", "Values": [GROUP_NAME, EFA_GROUP_NAME]},
            {"Name": f"tag:{TAG_OWNER}", "Values": [owner]}])["SecurityGroups"]
        keys = self.call(region, "describe_key_pairs", Filters=[
            {"Name": f"tag:{TAG_OWNER}", "Values": [owner]}])["KeyPairs"]
        return {"security groups": [g["GroupId"] for g in groups],
                "key pairs": [k["KeyName"] for k in keys]}

    def leftovers(self, region: str, job_id: str) -> dict[str, list[str]]:
        """What the cloud still holds of one job, by its tag: instances not yet terminated
        (shutting-down included), volumes not deleted, placement groups not deleted. The key
        pair and security group are not the job's: they are shared and reused."""
        tag = [{"Name": f"tag:{TAG_JOB}", "Values": [job_id]}]
        instances = [f"{r['InstanceId']} ({r['State']['Name']})"
                     for r in self._query(region, {TAG_JOB: job_id})
                     if r["State"]["Name"] != "terminated"]
        volumes = [f"{v['VolumeId']} ({v.get('State')})" for v in self.call(
            region, "describe_volumes", Filters=tag)["Volumes"]
            if v.get("State") not in ("deleted",)]
        groups = [g["GroupName"] for g in self.call(
            region, "describe_placement_groups", Filters=tag)["PlacementGroups"]
            if g.get("State") not in ("deleting", "deleted")]
        return {"instances": instances, "volumes": volumes, "placement groups": groups}

    def _live(self, region: str, name: str, value: str) -> bool:
        """Whether an instance not yet terminated matches the filter `name` = `value`."""
        found = self.call(region, "describe_instances", Filters=[
            {"Name": name, "Values": [value]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES) + ["shutting-down"]}])
        return any(r["Instances"] for r in found["Reservations"])


def _ports(permission: dict) -> dict:
    """FromPort/ToPort of a rule, as revoke needs them back ("-1" rules have none)."""
    return {k: permission[k] for k in ("FromPort", "ToPort") if k in permission}
