"""Key pair, security group and subnets: what an instance needs around it, reused across jobs."""

from __future__ import annotations

import hashlib
import os
import socket
import urllib.request
from pathlib import Path

from ... import catalog, config
from ...ssh import generate_ed25519
from ...state import Store
from .cache import RegionCache
from .errors import AWSError
from .tags import GROUP_NAME, TAG_JOB, TAG_OWNER


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

    def cleanup(self, store: Store, regions: set[str]) -> list[str]:
        """Delete the security groups and key pairs that no live instance uses any more."""
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
                except AWSError as exc:
                    if exc.code != "DependencyViolation":  # still attached: next time
                        raise
            keys = self.call(region, "describe_key_pairs", Filters=[
                {"Name": f"tag:{TAG_OWNER}", "Values": [owner]}])["KeyPairs"]
            for k in keys:
                self.call(region, "delete_key_pair", KeyName=k["KeyName"])
                removed.append(k["KeyName"])
            RegionCache(self.settings.aws_profile, region).clear()
        return removed
