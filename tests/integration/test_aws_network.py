"""The security group and key pair (F9): one SSH rule per launching machine that follows its
address, members reach each other over TCP only, and cleanup removes what nothing uses even
when no job is active. In-process moto."""

from __future__ import annotations

from labs.aws import ec2_provider  # noqa: F401  (fixture)
from cloudtrain.state import open_store
from cloudtrain.providers.aws import network

OWNER_TAG = "cloudtrain:owner"


def _rules(provider, gid):
    (group,) = provider.aws.call("us-east-1", "describe_security_groups",
                             GroupIds=[gid])["SecurityGroups"]
    return group["IpPermissions"]


def _ssh(provider, gid):
    return sorted((r["CidrIp"], r.get("Description")) for p in _rules(provider, gid)
                  if p.get("FromPort") == 22 and p["IpProtocol"] == "tcp"
                  for r in p.get("IpRanges", []))


def _vpc(provider):
    return provider.aws.call("us-east-1", "describe_vpcs")["Vpcs"][0]["VpcId"]


def test_F9_the_ssh_rule_follows_this_machine_and_leaves_others(ec2_provider):
    p = ec2_provider
    owner, vpc = p.account.owner("us-east-1"), _vpc(p)
    mine = network.ssh_rule_description()
    assert mine.startswith("cloudtrain SSH ") and len(mine) == len("cloudtrain SSH ") + 12
    p.settings.ssh_cidr = "203.0.113.7/32"
    gid = p.account.ensure_group("us-east-1", vpc, owner)
    # another machine of the same user launched from its own address
    p.aws.call("us-east-1", "authorize_security_group_ingress", GroupId=gid, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
         "IpRanges": [{"CidrIp": "192.0.2.99/32", "Description": "cloudtrain SSH 0123456789ab"}]}])
    for cidr in ("198.51.100.23/32", "198.51.100.24/32"):  # cafe, then hotel
        p.settings.ssh_cidr = cidr
        assert p.account.ensure_group("us-east-1", vpc, owner) == gid
    assert _ssh(p, gid) == [("192.0.2.99/32", "cloudtrain SSH 0123456789ab"),
                            ("198.51.100.24/32", mine)]
    p.account.ensure_group("us-east-1", vpc, owner)  # same address again: nothing changes
    assert _ssh(p, gid) == [("192.0.2.99/32", "cloudtrain SSH 0123456789ab"),
                            ("198.51.100.24/32", mine)]


def test_F9_members_reach_each_other_over_tcp_only(ec2_provider):
    p = ec2_provider
    owner, vpc = p.account.owner("us-east-1"), _vpc(p)
    gid = p.aws.call("us-east-1", "create_security_group", GroupName="cloudtrain", VpcId=vpc,
                 Description="old", TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                     {"Key": OWNER_TAG, "Value": owner}]}])["GroupId"]
    # what earlier versions made: every protocol between members
    p.aws.call("us-east-1", "authorize_security_group_ingress", GroupId=gid, IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid}]}])
    assert p.account.ensure_group("us-east-1", vpc, owner) == gid
    members = [r for r in _rules(p, gid) if r.get("UserIdGroupPairs")]
    assert [(r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in members] == [("tcp", 0, 65535)]
    assert all(r["IpProtocol"] != "-1" for r in _rules(p, gid))


def test_F9_cleanup_with_nothing_active_removes_what_no_instance_uses(ec2_provider, ct_home):
    p = ec2_provider
    owner, vpc = p.account.owner("us-east-1"), _vpc(p)
    gid = p.account.ensure_group("us-east-1", vpc, owner)
    key, _ = p.account.ensure_key("us-east-1", owner)
    ami = p.aws.call("us-east-1", "describe_images", Owners=["amazon"])["Images"][0]["ImageId"]
    (raw,) = p.aws.call("us-east-1", "run_instances", ImageId=ami, MinCount=1, MaxCount=1,
                    InstanceType="g5.xlarge", KeyName=key, SecurityGroupIds=[gid],
                    TagSpecifications=[{"ResourceType": "instance", "Tags": [
                        {"Key": OWNER_TAG, "Value": owner}]}])["Instances"]
    store = open_store(ct_home)  # no job at all: `down --all` with nothing active
    assert p.cleanup(store) == []  # a live instance still uses both
    p.terminate("us-east-1", [raw["InstanceId"]])
    assert sorted(p.cleanup(store)) == sorted([gid, key])  # regions: the configured one
    assert p.aws.call("us-east-1", "describe_key_pairs")["KeyPairs"] == []
    assert p.aws.call("us-east-1", "describe_security_groups", Filters=[
        {"Name": "group-name", "Values": ["cloudtrain"]}])["SecurityGroups"] == []


def test_RE3_another_principals_group_of_the_same_name_is_left_alone(ec2_provider):
    """RE3: the group was found by name alone, so a second principal of the account (a
    colleague, CI) in the same VPC took the first one's `cloudtrain` group: IAM refuses it
    the changes (they are owner-conditioned), and creating its own failed with
    InvalidGroup.Duplicate. Each owner now gets a group of its own, the plain name while it
    is free, another name where it is not; the other's group is not touched. The EFA group
    follows the same rule."""
    from cloudtrain.providers.aws import cluster

    p = ec2_provider
    owner, vpc = p.account.owner("us-east-1"), _vpc(p)
    colleague = "arn:aws:iam::123456789012:user/colleague"
    theirs = {}
    for name in ("cloudtrain", "cloudtrain-efa"):
        theirs[name] = p.aws.call("us-east-1", "create_security_group", GroupName=name,
                                  VpcId=vpc, Description="the colleague's",
                                  TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                                      {"Key": OWNER_TAG, "Value": colleague}]}])["GroupId"]
    before = {g: _rules(p, g) for g in theirs.values()}
    gid = p.account.ensure_group("us-east-1", vpc, owner)
    efa = cluster.ensure_efa_group(p.aws, "us-east-1", vpc, owner)
    assert gid not in theirs.values() and efa not in theirs.values()
    groups = {g["GroupId"]: g for g in p.aws.call("us-east-1", "describe_security_groups",
                                                  GroupIds=[gid, efa])["SecurityGroups"]}
    assert groups[gid]["GroupName"] == network.owned_name("cloudtrain", owner)
    assert groups[efa]["GroupName"] == network.owned_name("cloudtrain-efa", owner)
    assert all({"Key": OWNER_TAG, "Value": owner} in g["Tags"] for g in groups.values())
    assert {g: _rules(p, g) for g in theirs.values()} == before
    # found again by its owner tag, not made twice; and counted among the owner's own
    assert p.account.ensure_group("us-east-1", vpc, owner) == gid
    assert cluster.ensure_efa_group(p.aws, "us-east-1", vpc, owner) == efa
    assert sorted(network.shared_resources(p.aws, "us-east-1")["security groups"]) == \
        sorted([gid, efa])


def _ssh_v6(provider, gid):
    return sorted((r["CidrIpv6"], r.get("Description")) for p in _rules(provider, gid)
                  if p.get("FromPort") == 22 and p["IpProtocol"] == "tcp"
                  for r in p.get("Ipv6Ranges", []))


def test_RH3_ssh_from_several_networks_and_ipv6_follows_the_list(ec2_provider):
    """RH3: one /32 from checkip.amazonaws.com locks out a network with several NAT egress
    addresses, and an IPv6-only client. `ssh_cidr:` takes CIDRs, IPv4 and IPv6, comma-
    separated: each is a rule of this machine's, IPv6 ones as Ipv6Ranges; a CIDR dropped from
    the list is revoked, one another machine added stays, and the same list again changes
    nothing (EC2 writes 2001:DB8:: back as 2001:db8::, which is the same network)."""
    p = ec2_provider
    owner, vpc = p.account.owner("us-east-1"), _vpc(p)
    mine = network.ssh_rule_description()
    p.settings.ssh_cidr = "198.51.100.0/28, 2001:DB8:1::/64,198.51.100.0/28"
    gid = p.account.ensure_group("us-east-1", vpc, owner)
    assert _ssh(p, gid) == [("198.51.100.0/28", mine)]
    assert [c.lower() for c, _ in _ssh_v6(p, gid)] == ["2001:db8:1::/64"]
    p.aws.call("us-east-1", "authorize_security_group_ingress", GroupId=gid, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
         "IpRanges": [{"CidrIp": "192.0.2.99/32", "Description": "cloudtrain SSH 0123456789ab"}]}])
    p.settings.ssh_cidr = "203.0.113.7/32 2001:db8:1::/64"  # the office's other egress; v6 kept
    assert p.account.ensure_group("us-east-1", vpc, owner) == gid
    assert _ssh(p, gid) == [("192.0.2.99/32", "cloudtrain SSH 0123456789ab"),
                            ("203.0.113.7/32", mine)]
    assert [c.lower() for c, _ in _ssh_v6(p, gid)] == ["2001:db8:1::/64"]
    before = _rules(p, gid)
    p.account.ensure_group("us-east-1", vpc, owner)
    assert _rules(p, gid) == before
    p.settings.ssh_cidr = "203.0.113.7/32"  # IPv6 dropped: its rule goes
    p.account.ensure_group("us-east-1", vpc, owner)
    assert _ssh_v6(p, gid) == []
    assert p.account.ssh_cidr() == "203.0.113.7/32"


def test_RH2_the_key_ec2_imports_is_ed25519_and_paramiko_signs_with_it(ec2_provider):
    """RH2 (confirmed by the review): EC2 ImportKeyPair takes the ed25519 key cloudtrain makes,
    tagged with its owner, and paramiko (>= 3.4) loads the private key to log in with it."""
    import paramiko

    p = ec2_provider
    owner = p.account.owner("us-east-1")
    name, path = p.account.ensure_key("us-east-1", owner)
    (pair,) = p.aws.call("us-east-1", "describe_key_pairs", KeyNames=[name])["KeyPairs"]
    assert pair["KeyType"] == "ed25519"
    assert {t["Key"]: t["Value"] for t in pair.get("Tags", [])}.get(OWNER_TAG) == owner
    key = paramiko.Ed25519Key.from_private_key_file(str(path))
    assert key.get_name() == "ssh-ed25519"
    public = paramiko.Ed25519Key(data=key.asbytes())
    assert public.verify_ssh_sig(b"x", paramiko.Message(key.sign_ssh_data(b"x").asbytes()))


def test_RC5_spot_azs_go_by_placement_score_then_price_and_on_demand_keeps_its_order():
    """RC5: order_zones put the catalog's cheapest spot AZ first whatever its capacity; with
    EC2's placement scores the highest scored comes first, equal scores by price, unscored
    AZs after the scored ones; on-demand is not reordered."""
    zones = [("us-east-1a", "s-a", "v", "use1-az1"), ("us-east-1b", "s-b", "v", "use1-az2"),
             ("us-east-1c", "s-c", "v", "use1-az4"), ("us-east-1z", "s-z", "v", "")]
    scores = {"use1-az4": 9, "use1-az1": 3, "use1-az2": 3}
    ordered = network.order_zones(zones, "g5.xlarge", "us-east-1", "spot", scores)
    assert ordered[0][0] == "us-east-1c" and ordered[-1][0] == "us-east-1z"
    by_price = network.order_zones(zones[:2], "g5.xlarge", "us-east-1", "spot")
    assert ordered[1:3] == by_price  # the two scored 3: the snapshot's cheaper first
    assert network.order_zones(zones, "g5.xlarge", "us-east-1", "on-demand", scores) == zones
