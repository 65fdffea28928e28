"""Key pair, security group and subnets: what an instance needs around it, reused across jobs."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import socket
import urllib.request
from pathlib import Path

from ... import catalog, config
from ...market import Market
from ...ssh import generate_ed25519
from .errors import AWSError
from .session import AwsSession
from .tags import EFA_GROUP_NAME, GROUP_NAME, LIVE_STATES, TAG_OWNER


def key_path(region: str) -> Path:
    return config.home() / "keys" / region / "cloudtrain_ed25519"


def ensure_key(aws: AwsSession, region: str, owner: str) -> tuple[str, Path]:
    """An ed25519 key kept 0600 under $CLOUDTRAIN_HOME/keys/<region>, imported into EC2
    under a name derived from the public key (so the two can never disagree)."""
    path = key_path(region)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        public = generate_ed25519(str(path))
        Path(f"{path}.pub").write_text(public + "\n")
    public = Path(f"{path}.pub").read_text().strip()
    name = "cloudtrain-" + hashlib.sha256(public.encode()).hexdigest()[:12]
    found = aws.call(region, "describe_key_pairs",
                     Filters=[{"Name": "key-name", "Values": [name]}])["KeyPairs"]
    if not found:
        aws.call(region, "import_key_pair", KeyName=name, PublicKeyMaterial=public.encode(),
                 TagSpecifications=[{"ResourceType": "key-pair", "Tags": [
                     {"Key": TAG_OWNER, "Value": owner}, {"Key": "Name", "Value": name}]}])
    return name, path


def ssh_cidrs(aws: AwsSession) -> list[str]:
    """Who may reach the instances' SSH port: `ssh_cidr:` (IPv4 and IPv6 CIDRs), else this
    machine's public IPv4 address as checkip.amazonaws.com sees it, /32."""
    if aws.settings.ssh_cidr:
        return config.ssh_cidrs(aws.settings.ssh_cidr)
    try:
        ip = _public_address()
    except (OSError, ValueError) as exc:
        raise AWSError(f"could not find this machine's public address ({exc}) to allow SSH "
                       "from it", hint="set `ssh_cidr: <your address>/32` in config.yaml (an "
                                       "IPv6 network, or several: comma-separated)") from exc
    return [f"{ip}/32"]


@functools.lru_cache(maxsize=1)
def _public_address() -> str:
    """This machine's public IPv4 address, asked once per process."""
    with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=5) as resp:
        ip = resp.read().decode().strip()
    socket.inet_aton(ip)
    return ip


def ssh_cidr(aws: AwsSession) -> str:
    """ssh_cidrs as one line, and where they came from: what the plan and hints say."""
    cidrs = ", ".join(ssh_cidrs(aws))
    return cidrs if aws.settings.ssh_cidr else \
        f"{cidrs} (this machine's public address, from checkip.amazonaws.com)"


def ssh_rule_description() -> str:
    """The description of this machine's SSH rule: one rule per launching machine, so a
    new address replaces the machine's old rule instead of piling up beside it."""
    machine = hashlib.sha256(f"{socket.gethostname()}|{config.home()}".encode()).hexdigest()
    return f"cloudtrain SSH {machine[:12]}"


def owned_name(base: str, owner: str) -> str:
    """The name an owner's group takes where another owner's group has `base` in the VPC."""
    return f"{base}-{hashlib.sha256(owner.encode()).hexdigest()[:10]}"


def own_group(aws: AwsSession, region: str, vpc: str, owner: str, base: str,
              description: str) -> dict:
    """The owner's security group `base` in the VPC, made on first use: the one named
    `base` (or owned_name's) that carries the owner's tag. Names are one per VPC, so where
    another principal of the account made `base` first, this owner's is named apart. (Found
    by name alone, the first user's group was the second's too: IAM refused it the changes,
    and creating its own failed with InvalidGroup.Duplicate.)"""
    names = [base, owned_name(base, owner)]
    found = aws.call(region, "describe_security_groups", Filters=[
        {"Name": "group-name", "Values": names}, {"Name": "vpc-id", "Values": [vpc]}
    ])["SecurityGroups"]
    mine = [g for g in found if {"Key": TAG_OWNER, "Value": owner} in (g.get("Tags") or [])]
    if mine:
        return min(mine, key=lambda g: names.index(g.get("GroupName")))
    name = names[1] if any(g.get("GroupName") == base for g in found) else base
    gid = aws.call(region, "create_security_group", GroupName=name, VpcId=vpc,
                   Description=description,
                   TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                       {"Key": TAG_OWNER, "Value": owner},
                       {"Key": "Name", "Value": name}]}])["GroupId"]
    return {"GroupId": gid, "GroupName": name, "IpPermissions": [], "IpPermissionsEgress": []}


def ensure_group(aws: AwsSession, region: str, vpc: str, owner: str) -> str:
    """The owner's security group of the VPC (own_group), reused: SSH from ssh_cidr only
    (one rule per launching machine, its old address revoked), plus TCP between members
    (multi-node jobs)."""
    group = own_group(aws, region, vpc, owner, GROUP_NAME,
                      "cloudtrain: SSH from the launching machine only")
    gid = group["GroupId"]
    wanted = ssh_cidrs(aws)
    port = aws.settings.ssh_port
    mine = ssh_rule_description()
    have: set[str] = set()
    have_members, revoke = False, []
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
        for ranges, key in (("IpRanges", "CidrIp"), ("Ipv6Ranges", "CidrIpv6")):
            for r in p.get(ranges, []):
                same = _same_network(r.get(key), wanted)
                if same is not None:
                    # EC2 refuses a second rule for the same CIDR and port whatever its
                    # description (InvalidPermission.Duplicate): one there already will do.
                    have.add(same)
                elif r.get("Description") == mine:  # this machine's earlier addresses
                    revoke.append({"IpProtocol": "tcp", "FromPort": port, "ToPort": port,
                                   ranges: [{key: r[key]}]})
    if revoke:
        aws.call(region, "revoke_security_group_ingress", GroupId=gid, IpPermissions=revoke)
    perms = []
    for cidr in (c for c in wanted if c not in have):
        v6 = ipaddress.ip_network(cidr, strict=False).version == 6
        perms.append({"IpProtocol": "tcp", "FromPort": port, "ToPort": port,
                      ("Ipv6Ranges" if v6 else "IpRanges"): [
                          {("CidrIpv6" if v6 else "CidrIp"): cidr, "Description": mine}]})
    if not have_members:
        # torchrun's rendezvous (29500) and NCCL's sockets use ephemeral TCP ports, so
        # members get every TCP port from each other and nothing else (no UDP, no ICMP;
        # EFA, which would need all traffic, is not used).
        perms.append({"IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535,
                      "UserIdGroupPairs": [{"GroupId": gid,
                                            "Description": "cloudtrain multi-node"}]})
    if perms:
        aws.call(region, "authorize_security_group_ingress", GroupId=gid, IpPermissions=perms)
    return gid


def _same_network(rule: str | None, wanted: list[str]) -> str | None:
    """The one of `wanted` that is the network of a rule's CIDR (EC2 writes it normalised:
    2001:DB8::/64 comes back as 2001:db8::/64), or None."""
    try:
        net = ipaddress.ip_network(rule or "", strict=False)
    except ValueError:
        return None
    return next((c for c in wanted if ipaddress.ip_network(c, strict=False) == net), None)


def subnets(aws: AwsSession, region: str) -> list[tuple[str, str, str, str]]:
    """(zone, subnet, vpc, zone id) to try, one per AZ: the configured subnet, or the
    default VPC's (or `vpc_id`'s)."""
    def row(s):
        return (s["AvailabilityZone"], s["SubnetId"], s["VpcId"], s.get("AvailabilityZoneId", ""))

    if aws.settings.subnet_id:
        found = aws.call(region, "describe_subnets",
                         SubnetIds=[aws.settings.subnet_id])["Subnets"]
        return [row(s) for s in found]
    filters = [{"Name": "default-for-az", "Values": ["true"]}]
    if aws.settings.vpc_id:
        filters = [{"Name": "vpc-id", "Values": [aws.settings.vpc_id]}]
    found = aws.call(region, "describe_subnets", Filters=filters)["Subnets"]
    if not found:
        raise AWSError(f"no default VPC subnets in {region}",
                       hint="set `subnet_id:` (and `vpc_id:`) in config.yaml")
    by_zone: dict[str, tuple[str, str, str, str]] = {}
    for s in sorted(found, key=lambda s: (s["AvailabilityZone"], s["SubnetId"])):
        by_zone.setdefault(s["AvailabilityZone"], row(s))
    return list(by_zone.values())


def order_zones(zones: list[tuple], instance_type: str, region: str, market: str,
                scores: dict[str, int] | None = None) -> list:
    """Spot: the AZs EC2 scores highest for the job's capacity first (`scores`: AZ id -> its
    spot placement score, spot_scores.py), then the one the catalog's snapshot prices lowest
    (AZ ids, which differ from AZ names per account); AZs without a known score or price keep
    their order, after those."""
    t = catalog.get(instance_type)
    prices = (t.spot_snapshot.get(region) or {}) if t and market == Market.SPOT else {}
    if market != Market.SPOT or not (prices or scores):
        return list(zones)
    return sorted(zones, key=lambda z: score_key(z, scores) + (
        z[3] not in prices, prices.get(z[3], 0.0)))


def score_key(zone: tuple, scores: dict[str, int] | None) -> tuple[bool, int]:
    """The part of an AZ's sort key that its spot placement score makes: scored first, the
    highest first."""
    score = (scores or {}).get(zone[3])
    return score is None, -(score or 0)


def shared_resources(aws: AwsSession, region: str) -> dict[str, list[str]]:
    """This owner's resources that every job in `region` reuses: {"security groups":
    [ids] (cloudtrain, cloudtrain-efa), "key pairs": [names]}."""
    owner = aws.owner(region)
    names = [GROUP_NAME, EFA_GROUP_NAME]
    groups = aws.call(region, "describe_security_groups", Filters=[
        {"Name": "group-name", "Values": names + [owned_name(n, owner) for n in names]},
        {"Name": f"tag:{TAG_OWNER}", "Values": [owner]}])["SecurityGroups"]
    keys = aws.call(region, "describe_key_pairs", Filters=[
        {"Name": f"tag:{TAG_OWNER}", "Values": [owner]}])["KeyPairs"]
    return {"security groups": [g["GroupId"] for g in groups],
            "key pairs": [k["KeyName"] for k in keys]}


def in_use(aws: AwsSession, region: str, name: str, value: str) -> bool:
    """Whether an instance not yet terminated matches the filter `name` = `value`."""
    found = aws.call(region, "describe_instances", Filters=[
        {"Name": name, "Values": [value]},
        {"Name": "instance-state-name", "Values": list(LIVE_STATES) + ["shutting-down"]}])
    return any(r["Instances"] for r in found["Reservations"])


def _ports(permission: dict) -> dict:
    """FromPort/ToPort of a rule, as revoke needs them back ("-1" rules have none)."""
    return {k: permission[k] for k in ("FromPort", "ToPort") if k in permission}
