"""Issue 15: jobs on several instances through the AWS path, against in-process moto (with
the placement groups moto lacks: tests/labs/moto_placement.py) and, where SSH is needed, the
lab's loopback sshd. The runs themselves (torchrun over namespace hosts) are in
tests/e2e/test_multinode.py.

All or nothing: N instances come from one RunInstances (MinCount = MaxCount = N) in one AZ
and one cluster placement group; an AZ without capacity for all of them, or one instance that
goes away before it runs, releases whatever came up and the next AZ is tried."""

from __future__ import annotations

import json
import time

import pytest

from labs.aws import aws, ec2_provider, moto_endpoint  # noqa: F401  (fixtures)
from labs.credentials import REGION
from cloudtrain import catalog, cost
from cloudtrain.errors import PlacementError
from cloudtrain.spec import JobSpec
from cloudtrain.state import Store
from cloudtrain.providers.aws import bootstrap, cluster, placement
from conftest import error_line
from labs.moto_placement import PlacementGroups

CAPACITY = ("Server.InsufficientInstanceCapacity",
            "Server.InsufficientInstanceCapacity: Insufficient capacity")


@pytest.fixture
def groups(monkeypatch):
    return PlacementGroups().install(monkeypatch)


@pytest.fixture
def cloud(ec2_provider, groups, ct_home):
    """moto's EC2 with a default VPC (one subnet per AZ), a registered DLAMI, and a store."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    image = ec2.register_image(Name="Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9 "
                                    "(Ubuntu 24.04) 20261101", RootDeviceName="/dev/sda1")
    with Store(ct_home / "state.db") as store:
        yield ec2_provider, store, ec2, image["ImageId"]


def _job(store: Store, spec: JobSpec):
    return store.create_job(name=None, kind=spec.kind, recipe=spec.recipe,
                            command=spec.display(), backend="aws", spec=spec.to_dict(),
                            launcher="test:1")


def _spec(nodes=3, instance="g5.12xlarge", market="on-demand", ami=None, **kw) -> JobSpec:
    return JobSpec.of(kind="command", backend="aws", command=["true"], instance_type=instance,
                   market=market, nodes=nodes, region=REGION, ami=ami, max_runtime_s=3600,
                   **kw)


def _boot(provider, ami):
    return bootstrap.bootstrap(provider.aws, REGION, ami)


def _live(ec2, job_id):
    return [i for r in ec2.describe_instances(Filters=[
        {"Name": "tag:cloudtrain:job", "Values": [job_id]}])["Reservations"]
        for i in r["Instances"] if i["State"]["Name"] != "terminated"]


def _lose_in_zone(monkeypatch, zone: str, node: int):
    """The `node`th instance of a RunInstances into `zone` goes away before it runs, as a
    spot instance EC2 cannot keep, or a capacity shortfall after the request: terminated
    with EC2's capacity reason."""
    from moto.ec2.models.instances import InstanceBackend, StateReason

    original = InstanceBackend.run_instances
    lost = []

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        reservation = original(self, image_id, count, user_data, security_group_names, **kwargs)
        inst = reservation.instances[node] if len(reservation.instances) > node else None
        if inst is not None and inst.availability_zone == zone:
            self.terminate_instances([inst.id])
            inst.state_reason = StateReason(CAPACITY[1], CAPACITY[0])
            lost.append(inst.id)
        return reservation

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)
    return lost


def test_nodes_come_from_one_request_in_one_placement_group(cloud, groups):
    """Issue 15: N nodes are one RunInstances of N in one AZ, in a cluster placement group
    tagged with the job and owner; each recorded with its node index (EC2's launch index)."""
    provider, store, ec2, ami = cloud
    spec = _spec(ami=ami)
    job = _job(store, spec)
    ids = cluster.run_cluster(provider.aws, store, job, spec, REGION, _boot(provider, ami), None,
                                _silent())
    assert len(ids) == 3
    (launch,) = groups.launches
    assert launch["count"] == 3 and launch["group"] == f"cloudtrain-{job.id}-a1-0"
    (group,) = [groups.groups[n] for n in groups.live()]
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert group["Strategy"] == "cluster" and tags["cloudtrain:job"] == job.id
    assert tags["cloudtrain:owner"] == provider.account.owner(REGION)
    recorded = {i.id: i for i in store.instances(job.id)}
    assert [recorded[i].details["node"] for i in ids] == [0, 1, 2]
    assert {recorded[i].zone for i in ids} == {"us-east-1a"}
    assert len({i["Placement"]["AvailabilityZone"] for i in _live(ec2, job.id)}) == 1


def test_a_node_lost_before_it_runs_releases_all_and_the_next_az_gets_the_job(
        cloud, groups, monkeypatch):
    """Issue 15, partial capacity: the 3rd instance in us-east-1a goes away before it runs
    (EC2's capacity reason). The two that came up are terminated at once, that AZ's placement
    group goes, and all three nodes come from us-east-1b."""
    provider, store, ec2, ami = cloud
    lost = _lose_in_zone(monkeypatch, "us-east-1a", node=2)
    spec = _spec(ami=ami)
    job = _job(store, spec)
    ids = cluster.run_cluster(provider.aws, store, job, spec, REGION, _boot(provider, ami), None,
                                _silent())
    assert len(lost) == 1 and lost[0] not in ids
    first, second = groups.launches
    assert first["count"] == second["count"] == 3
    assert {i["InstanceId"] for i in _live(ec2, job.id)} == set(ids)
    assert {i["Placement"]["AvailabilityZone"] for i in _live(ec2, job.id)} == {"us-east-1b"}
    # The first AZ's two survivors were terminated and recorded as such (they billed seconds).
    gone = [i for i in store.instances(job.id) if i.id in first["ids"]]
    assert len(gone) == 3 and all(i.state == "terminated" for i in gone)
    events = [e.detail for e in store.events(job.id) if e.phase == "instance"]
    assert len(events) == 2
    # The first group could be deleted at once (its instances are terminated in moto).
    assert groups.live() == [f"cloudtrain-{job.id}-a1-1"]


def test_no_az_with_capacity_for_all_nodes_leaves_nothing(cloud, groups, monkeypatch):
    """Issue 15: every AZ loses a node: a PlacementError saying what each AZ said, no
    instance left running, no placement group left."""
    provider, store, ec2, ami = cloud
    _lose_in_zone(monkeypatch, "us-east-1a", node=1)
    from moto.ec2.models.instances import InstanceBackend

    once = InstanceBackend.run_instances

    def everywhere(self, image_id, count, user_data, security_group_names, **kwargs):
        reservation = once(self, image_id, count, user_data, security_group_names, **kwargs)
        from moto.ec2.models.instances import StateReason

        inst = reservation.instances[-1]
        if inst.state != "terminated":
            self.terminate_instances([inst.id])
            inst.state_reason = StateReason(CAPACITY[1], CAPACITY[0])
        return reservation

    monkeypatch.setattr(InstanceBackend, "run_instances", everywhere)
    spec = _spec(ami=ami)
    job = _job(store, spec)
    with pytest.raises(PlacementError) as err:
        cluster.run_cluster(provider.aws, store, job, spec, REGION, _boot(provider, ami), None, _silent())
    message = err.value.message
    zones = [z for z in ("us-east-1a", "us-east-1b", "us-east-1c") if z in message]
    assert len(zones) >= 2 and "before it ran" in message and "nothing is left running" in message
    assert _live(ec2, job.id) == []
    assert groups.live() == []
    assert all(i.state == "terminated" for i in store.instances(job.id))


def test_a_capacity_refusal_tries_the_next_az_before_anything_starts(cloud, groups):
    """EC2 refuses the whole request (MinCount cannot be met: InsufficientInstanceCapacity):
    nothing was created there; the next AZ is asked."""
    provider, store, ec2, ami = cloud
    client = provider.aws.client("ec2", REGION, fail_fast=True)
    calls = []

    def refuse_first(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            from botocore.awsrequest import AWSResponse

            return (AWSResponse("https://aws.invalid/", 500, {}, None),
                    {"Error": {"Code": "InsufficientInstanceCapacity",
                               "Message": "We currently do not have sufficient g5.12xlarge "
                                          "capacity in the Availability Zone you requested"}})
        return None

    client.meta.events.register("before-call.ec2.RunInstances", refuse_first)
    spec = _spec(ami=ami)
    job = _job(store, spec)
    ids = cluster.run_cluster(provider.aws, store, job, spec, REGION, _boot(provider, ami), None,
                                _silent())
    assert len(calls) == 2 and len(ids) == 3
    assert len(groups.launches) == 1  # the refused request never reached moto
    assert groups.live() == [f"cloudtrain-{job.id}-a1-1"]


def test_efa_types_get_efa_interfaces_and_the_efa_group(cloud, groups):
    """p4d.24xlarge supports 4 EFA interfaces: with `connect: private` each node gets the
    primary ENA interface, an EFA-only one beside it and one on each further network card, in
    the cloudtrain and cloudtrain-efa groups; cloudtrain-efa admits all traffic from itself,
    and lets all out to itself (RG1: EFA's traffic matches no 0.0.0.0/0 egress rule)."""
    provider, store, ec2, ami = cloud
    provider.settings.connect = "private"
    spec = _spec(instance="p4d.24xlarge", ami=ami)
    job = _job(store, spec)
    efa = cluster.efa_plan(provider.aws, spec, REGION)
    assert (efa["supported"], efa["used"], efa["rdma"], efa["why"]) == (4, 4, True, "")
    cluster.run_cluster(provider.aws, store, job, spec, REGION, _boot(provider, ami), efa, _silent())
    (launch,) = groups.launches
    interfaces = sorted(launch["interfaces"], key=lambda n: (n["NetworkCardIndex"],
                                                              n["DeviceIndex"]))
    assert [(n["NetworkCardIndex"], n["DeviceIndex"], n["InterfaceType"]) for n in interfaces] \
        == [(0, 0, "interface"), (0, 1, "efa-only"), (1, 0, "efa-only"), (2, 0, "efa-only"),
            (3, 0, "efa-only")]
    (efa_group,) = ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["cloudtrain-efa"]}])["SecurityGroups"]
    assert all(len(n["Groups"]) == 2 and efa_group["GroupId"] in n["Groups"] for n in interfaces)
    (rule,) = efa_group["IpPermissions"]
    assert rule["IpProtocol"] == "-1"
    assert rule["UserIdGroupPairs"][0]["GroupId"] == efa_group["GroupId"]
    assert [p["UserIdGroupPairs"][0]["GroupId"] for p in efa_group["IpPermissionsEgress"]
            if p["IpProtocol"] == "-1" and p["UserIdGroupPairs"]] == [efa_group["GroupId"]]
    # A second job's launch finds both rules there and adds neither again.
    assert cluster.ensure_efa_group(provider.aws, REGION, efa_group["VpcId"],
                                    provider.account.owner(REGION)) == \
        efa_group["GroupId"]
    assert provider.network_environment(spec) == {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1",
                                              "FI_EFA_USE_DEVICE_RDMA": "1"}


def test_efa_with_public_addresses_is_one_interface_and_says_why(ec2_provider):
    """An instance with a public IP gets one network interface at launch: one EFA (with ENA)
    as the primary, and the plan says how to get all of them."""
    spec = _spec(instance="p5.48xlarge")
    ec2_provider.settings.connect = "public"
    efa = cluster.efa_plan(ec2_provider.aws, spec)
    assert efa["used"] == 1 and efa["supported"] == 32 and "connect: private" in efa["why"]
    (nic,) = cluster.network_interfaces(ec2_provider.aws, spec, "subnet-1", ["sg-1", "sg-2"], efa)
    assert nic["InterfaceType"] == "efa" and nic["AssociatePublicIpAddress"] is True
    assert cluster.efa_plan(ec2_provider.aws, _spec(instance="p3.16xlarge")) is None  # no EFA on p3
    assert cluster.efa_plan(ec2_provider.aws, _spec(nodes=1, instance="p4d.24xlarge")) is None


def _ec2_refuses(ec2, instance_type: str, interfaces: list[dict]) -> list[str]:
    """What EC2 would refuse in the NetworkInterfaces of a RunInstances of `instance_type`
    ([] for nothing), checked against its DescribeInstanceTypes NetworkInfo (moto's copy of
    EC2's answer) by the rules of EC2's documentation: the primary interface (device 0 on
    the default network card) is not EFA-only; each interface sits on a card of the type,
    of a kind that card takes (NetworkCards[].InterfaceTypes), at most
    MaximumNetworkInterfaces a card, one per (card, device); at most MaximumEfaInterfaces
    EFA; a public address only where the request has one interface."""
    (found,) = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
    info = found["NetworkInfo"]
    cards = {c["NetworkCardIndex"]: c for c in info["NetworkCards"]}
    wrong = []
    default = info.get("DefaultNetworkCardIndex", 0)
    primary = [n for n in interfaces if (n["NetworkCardIndex"], n["DeviceIndex"]) == (default, 0)]
    if len(primary) != 1 or primary[0].get("InterfaceType") == "efa-only":
        wrong.append(f"no primary interface that carries IP on card {default}: {primary}")
    places = [(n["NetworkCardIndex"], n["DeviceIndex"]) for n in interfaces]
    if len(set(places)) != len(places):
        wrong.append(f"two interfaces at one (card, device): {places}")
    for n in interfaces:
        card = cards.get(n["NetworkCardIndex"])
        kind = n.get("InterfaceType", "interface")
        if card is None:
            wrong.append(f"no network card {n['NetworkCardIndex']}")
        elif kind not in card.get("InterfaceTypes", [kind]):
            wrong.append(f"card {n['NetworkCardIndex']} takes {card['InterfaceTypes']}, not {kind}")
    for index, card in cards.items():
        if places and sum(c == index for c, _ in places) > card["MaximumNetworkInterfaces"]:
            wrong.append(f"more than {card['MaximumNetworkInterfaces']} interfaces on card {index}")
    efa = sum(n.get("InterfaceType") in ("efa", "efa-only") for n in interfaces)
    if efa > (info.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0):
        wrong.append(f"{efa} EFA interfaces")
    if len(interfaces) > 1 and any(n.get("AssociatePublicIpAddress") for n in interfaces):
        wrong.append("a public address with more than one network interface")
    return wrong


def _layout(interfaces: list[dict]) -> list[tuple]:
    return [(n["NetworkCardIndex"], n["DeviceIndex"], n["InterfaceType"]) for n in interfaces]


def test_RG2_p6_b300_gets_efa_on_cards_1_to_16_its_primary_card_takes_ena_only(cloud, groups):
    """RG2: p6-b300.48xlarge has 17 network cards, and its primary one (card 0) takes ENA
    only (EC2's NetworkCards[0].InterfaceTypes is ["interface"]). With `connect: private`
    each node gets the primary ENA interface on card 0 and one EFA-only interface on each of
    cards 1..16: all 16 EFA, none on card 0, a request EC2 accepts (it refused the old
    layout's EFA-only interface on card 0)."""
    provider, store, ec2, ami = cloud
    provider.settings.connect = "private"
    spec = _spec(nodes=2, instance="p6-b300.48xlarge", ami=ami)
    job = _job(store, spec)
    efa = cluster.efa_plan(provider.aws, spec, REGION)
    assert (efa["supported"], efa["used"], efa["rdma"], efa["why"]) == (16, 16, True, "")
    cluster.run_cluster(provider.aws, store, job, spec, REGION, _boot(provider, ami), efa, _silent())
    (launch,) = groups.launches
    assert _layout(launch["interfaces"]) == \
        [(0, 0, "interface")] + [(card, 0, "efa-only") for card in range(1, 17)]
    assert _ec2_refuses(ec2, "p6-b300.48xlarge", launch["interfaces"]) == []
    assert all(i.details["efa_interfaces"] == 16 for i in store.instances(job.id))


def test_RG2_p5_and_p4d_layouts_follow_ec2s_network_cards(ec2_provider):
    """RG2: where every card takes EFA (p5.48xlarge: 32 cards, p4d.24xlarge: 4), `connect:
    private` gives the primary ENA interface at card 0 device 0, an EFA-only one beside it
    at device 1 and one EFA-only interface on each further card, as AWS recommends; with a
    public address one EFA (with ENA) interface, the primary, carries it. EC2 accepts each."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    aws = ec2_provider.aws
    aws.settings.connect = "private"
    for instance, cards in (("p5.48xlarge", 32), ("p4d.24xlarge", 4)):
        spec = _spec(instance=instance)
        efa = cluster.efa_plan(aws, spec, REGION)
        assert (efa["supported"], efa["used"], efa["why"]) == (cards, cards, "")
        nics = cluster.network_interfaces(aws, spec, "subnet-1", ["sg-1"], efa)
        assert _layout(nics) == [(0, 0, "interface"), (0, 1, "efa-only")] + \
            [(card, 0, "efa-only") for card in range(1, cards)]
        assert not any(n.get("AssociatePublicIpAddress") for n in nics)
        assert _ec2_refuses(ec2, instance, nics) == []
    aws.settings.connect = "public"
    spec = _spec(instance="p5.48xlarge")
    efa = cluster.efa_plan(aws, spec, REGION)
    assert (efa["supported"], efa["used"]) == (32, 1) and "connect: private" in efa["why"]
    (nic,) = cluster.network_interfaces(aws, spec, "subnet-1", ["sg-1"], efa)
    assert _layout([nic]) == [(0, 0, "efa")] and nic["AssociatePublicIpAddress"] is True
    assert _ec2_refuses(ec2, "p5.48xlarge", [nic]) == []


def test_RG2_p6_b300_with_a_public_address_gets_one_ena_interface_and_the_plan_says_why(
        ec2_provider):
    """RG2: an instance with a public address gets one network interface at launch, the
    primary, on card 0; p6-b300's card 0 takes no EFA, so that interface is ENA (an EFA one
    there is a request EC2 refuses) and the plan says the node gets no EFA, and that
    `connect: private` gives all 16."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    aws = ec2_provider.aws
    aws.settings.connect = "public"
    spec = _spec(instance="p6-b300.48xlarge")
    for region in (REGION, None):  # EC2's answer, and the bundled table's
        efa = cluster.efa_plan(aws, spec, region)
        assert (efa["supported"], efa["used"]) == (16, 0)
        assert "ENA only" in efa["why"] and "connect: private" in efa["why"] \
            and "16" in efa["why"]
        (nic,) = cluster.network_interfaces(aws, spec, "subnet-1", ["sg-1", "sg-2"], efa)
        assert _layout([nic]) == [(0, 0, "interface")]
        assert nic["AssociatePublicIpAddress"] is True and nic["Groups"] == ["sg-1", "sg-2"]
        assert _ec2_refuses(ec2, "p6-b300.48xlarge", [nic]) == []
    assert cluster.efa_environment(aws, spec) == {}  # no EFA: NCCL is not forced onto it


def test_RA2_volta_nodes_talk_tcp_their_ubuntu_image_has_no_efa_software(ec2_provider):
    """RA2, RG2: p3dn.24xlarge supports EFA, but a Volta type's job gets Ubuntu with the
    driver and torch installed at boot and no libfabric or aws-ofi-nccl: NCCL forced onto
    EFA there would fail. Its nodes get no EFA interface and no EFA settings (TCP), and the
    plan says why; with --ami (an image that may have them) EFA is planned as before."""
    aws = ec2_provider.aws
    aws.settings.connect = "private"
    spec = _spec(nodes=2, instance="p3dn.24xlarge")
    assert cluster.efa_plan(aws, spec, REGION) is None
    assert cluster.efa_environment(aws, spec) == {}
    own = _spec(nodes=2, instance="p3dn.24xlarge", ami="ami-0123456789abcdef0")
    assert cluster.efa_plan(aws, own, REGION)["used"] == 1
    assert cluster.efa_environment(aws, own)["FI_PROVIDER"] == "efa"


def test_RG2_ec2s_network_cards_win_over_the_bundled_table(ec2_provider, monkeypatch):
    """RG2: where EC2 can be asked, its DescribeInstanceTypes answer makes the layout, not
    the bundled table: moto here answers p4d.24xlarge with an ENA-only card 0 (as EC2 does
    for p6-b300), and g5.12xlarge without EFA; the layout follows (no EFA on card 0: 3 EFA
    interfaces, on cards 1..3; no EFA plan for g5.12xlarge), where the table says 4 and 1."""
    import copy

    from moto.ec2.models.instance_types import InstanceTypeBackend

    answers = {t["InstanceType"]: t for t in InstanceTypeBackend.instance_types}
    p4d = copy.deepcopy(answers["p4d.24xlarge"]["NetworkInfo"])
    p4d["NetworkCards"][0]["InterfaceTypes"] = ["interface"]
    monkeypatch.setitem(answers["p4d.24xlarge"], "NetworkInfo", p4d)
    g5 = copy.deepcopy(answers["g5.12xlarge"]["NetworkInfo"])
    g5["EfaSupported"] = False
    g5.pop("EfaInfo", None)
    monkeypatch.setitem(answers["g5.12xlarge"], "NetworkInfo", g5)
    aws = ec2_provider.aws
    aws.settings.connect = "private"
    spec = _spec(instance="p4d.24xlarge")
    efa = cluster.efa_plan(aws, spec, REGION)
    assert (efa["supported"], efa["used"]) == (3, 3)
    assert _layout(cluster.network_interfaces(aws, spec, "subnet-1", ["sg-1"], efa)) == \
        [(0, 0, "interface"), (1, 0, "efa-only"), (2, 0, "efa-only"), (3, 0, "efa-only")]
    assert cluster.efa_plan(aws, _spec(instance="g5.12xlarge"), REGION) is None
    # Without a region (no EC2 question) the bundled table answers as before.
    assert cluster.efa_plan(aws, spec)["used"] == 4
    assert cluster.efa_plan(aws, _spec(instance="g5.12xlarge"))["used"] == 1


@pytest.fixture
def uncredentialed(monkeypatch, ct_home):
    """An AWSProvider where botocore finds no credentials, and any request that would leave
    botocore fails the test."""
    import os

    from labs.credentials import NO_AWS_FILES
    from cloudtrain.config import Settings
    from cloudtrain.providers.aws import AWSProvider

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in {**NO_AWS_FILES, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)

    def no_network(*args, **kwargs):
        raise AssertionError("a request left botocore")

    monkeypatch.setattr("botocore.endpoint.Endpoint._send", no_network)
    return AWSProvider(Settings(region=REGION, ssh_cidr="127.0.0.1/32"))


def test_RG2_without_credentials_the_bundled_table_knows_p6_b300s_ena_only_primary_card(
        uncredentialed):
    """RG2: without credentials EC2 cannot be asked, and the bundled table is the fallback:
    it says p6-b300.48xlarge has 17 cards, the primary (card 0) ENA only, and 16 EFA
    interfaces; the layout it gives puts them on cards 1..16. p5.48xlarge's primary card
    takes EFA: an EFA-only interface beside the primary one on card 0."""
    aws = uncredentialed.aws
    aws.settings.connect = "private"
    assert aws.credentials(REGION) is None
    b300 = placement.EFA_INTERFACES["p6-b300.48xlarge"]
    assert (b300.efa, b300.cards, b300.primary, b300.primary_efa) == (16, 17, 0, False)
    spec = _spec(instance="p6-b300.48xlarge")
    efa = cluster.efa_plan(aws, spec, REGION)
    assert (efa["supported"], efa["used"]) == (16, 16)
    assert _layout(cluster.network_interfaces(aws, spec, "subnet-1", ["sg-1"], efa)) == \
        [(0, 0, "interface")] + [(card, 0, "efa-only") for card in range(1, 17)]
    spec = _spec(instance="p5.48xlarge")
    efa = cluster.efa_plan(aws, spec, REGION)
    assert _layout(cluster.network_interfaces(aws, spec, "subnet-1", ["sg-1"], efa)) == \
        [(0, 0, "interface"), (0, 1, "efa-only")] + [(c, 0, "efa-only") for c in range(1, 32)]
    assert cluster.efa_plan(aws, _spec(instance="p3.16xlarge"), REGION) is None


def test_RG2_the_bundled_table_agrees_with_ec2s_network_cards(ec2_provider):
    """RG2: the fallback table holds, for each type, what DescribeInstanceTypes answers
    (moto's copy of EC2's data): EfaInfo.MaximumEfaInterfaces, the number of network cards,
    DefaultNetworkCardIndex, and whether that card takes EFA-only interfaces."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    for name, known in placement.EFA_INTERFACES.items():
        (found,) = ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"]
        info = found["NetworkInfo"]
        primary = info["DefaultNetworkCardIndex"]
        (card,) = [c for c in info["NetworkCards"] if c["NetworkCardIndex"] == primary]
        assert (known.efa, known.cards, known.primary, known.primary_efa) == (
            info["EfaInfo"]["MaximumEfaInterfaces"], len(info["NetworkCards"]), primary,
            "efa-only" in card["InterfaceTypes"]), name


def test_release_terminates_every_node_and_deletes_the_placement_group(cloud, groups):
    provider, store, ec2, ami = cloud
    spec = _spec(ami=ami)
    job = _job(store, spec)
    cluster.run_cluster(provider.aws, store, job, spec, REGION, _boot(provider, ami), None, _silent())
    assert len(_live(ec2, job.id)) == 3 and len(groups.live()) == 1
    provider.release(store, store.job(job.id), force=True)
    assert _live(ec2, job.id) == []
    assert groups.live() == []
    assert all(i.state == "terminated" for i in store.instances(job.id))


def test_a_placement_group_still_in_use_is_left_for_the_next_cleanup(cloud, groups):
    """EC2 refuses to delete a group whose instances are still shutting down: release leaves
    it (no error), and the next cleanup (`down`, the next launch) deletes it."""
    provider, store, ec2, ami = cloud
    spec = _spec(ami=ami)
    job = _job(store, spec)
    ids = cluster.run_cluster(provider.aws, store, job, spec, REGION, _boot(provider, ami), None,
                                _silent())
    assert placement.delete_placement_groups(provider.aws, REGION, job.id) == []  # in use: refused, kept
    assert len(groups.live()) == 1
    ec2.terminate_instances(InstanceIds=ids)
    provider.cleanup(store, {REGION})
    assert groups.live() == []


# -- the dry run and the launch's checks ---------------------------------------------------


def test_dry_run_16_nodes_without_an_account(cli, monkeypatch):
    """Issue 15: the dry run of the published 16-machine ImageNet run on p3.16xlarge (with an
    --ami that runs its V100s: no current Deep Learning AMI does, RA2), with no AWS account:
    16 instances in a placement group, 8 processes on each, and the price of all of them per
    hour and at most."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    out = cli.ok("launch", "--recipe", "imagenet", "--set", "variant=machines-16", "--set",
                 "data_dir=/data/imagenet", "--instance", "p3.16xlarge", "--spot", "--dry-run",
                 "--region", "us-east-1", "--ami", "ami-0123456789abcdef0").stdout
    rows = {line[2:15].strip(): line[15:] for line in out.splitlines()[1:]}
    assert "[16 nodes]" in rows["job"]
    assert rows["nodes"].startswith("16 instances in one AZ, one cluster placement group")
    assert rows["processes"].startswith("8 per node x 16 nodes = 128")
    assert "no EFA on p3.16xlarge" in rows["network"]
    price = catalog.get("p3.16xlarge").price("us-east-1", "spot")
    assert rows["price"].startswith(f"${16 * price:.4f}/h for 16 nodes (${price:.4f}/h each")
    # U9: 4 attempts (a spot job recovers, 3 restarts by default) of 16 instances, each until
    # its power-off 390 min after it starts, in the dearest AZ, with its 400 GB disk
    dearest = catalog.get("p3.16xlarge").dearest("us-east-1", "spot")
    disk = 400 * catalog.gp3_price("us-east-1").per_gb_month / cost.HOURS_PER_MONTH
    ip = cost.PUBLIC_IPV4_PER_HOUR  # each node's public IPv4 address (RH5)
    assert rows["at most"].startswith(
        f"${4 * 16 * 6.5 * (dearest + disk + ip):.2f}: 4 attempts (1 + 3 restarts) of up to 390 min "
        "each (the max runtime of 360 min + 30 until user-data powers it off) on each of 16 "
        "nodes"), rows["at most"]
    assert "on 16 nodes" in rows["estimate"]
    explicit = cli.ok("launch", "--nodes", "16", "--instance", "p4d.24xlarge", "--dry-run",
                      "--region", "us-east-1", "--", "bash", "-c", "echo hi").stdout
    assert "your command on each of 16 nodes" in explicit


def test_RG6_several_spot_nodes_of_the_largest_types_are_said_to_wait(cli, monkeypatch):
    """RG6: several spot p5 (or p4d, p6) nodes in one AZ at once are rare outside Capacity
    Blocks: the plan says the launch may wait or fail for capacity; not for one node, nor
    on-demand, nor smaller types."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")

    def plan(*args):
        return " ".join(cli.ok("launch", "--dry-run", "--region", "us-east-1", *args, "--",
                               "bash", "-c", "echo hi").stdout.split())

    said = "2 spot p5.48xlarge in one AZ at once is rare outside Capacity Blocks for ML"
    assert said in plan("--nodes", "2", "--instance", "p5.48xlarge", "--spot")
    assert "rare outside Capacity Blocks" not in plan("--nodes", "2", "--instance",
                                                      "p5.48xlarge", "--on-demand")
    assert "rare outside Capacity Blocks" not in plan("--instance", "p5.48xlarge", "--spot")
    assert "rare outside Capacity Blocks" not in plan("--nodes", "2", "--instance",
                                                      "g5.12xlarge", "--spot")


def test_the_recipe_variant_says_how_many_nodes_and_nodes_1_overrides(cli, monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    four = cli.ok("launch", "--recipe", "imagenet", "--set", "variant=machines-4", "--set",
                  "data_dir=/d", "--instance", "p4d.24xlarge", "--dry-run").stdout
    assert "[4 nodes]" in four and "8 per node x 4 nodes = 32" in four
    one = cli.ok("launch", "--recipe", "imagenet", "--set", "variant=machines-4", "--set",
                 "data_dir=/d", "--instance", "p4d.24xlarge", "--nodes", "1", "--dry-run").stdout
    assert "nodes" not in [line[2:15].strip() for line in one.splitlines()]


@pytest.mark.parametrize("args, said", [
    (("--nodes", "0", "--instance", "g5.xlarge", "--", "true"), "--nodes must be a whole number"),
    (("--nodes", "65", "--instance", "g5.xlarge", "--", "true"), "from 1 to 64, got 65"),
    (("--nodes", "2", "--recipe", "airbench94", "--instance", "g5.xlarge"),
     "runs as one process on one machine"),
    (("--nodes", "2", "--on", "abcdefgh", "--", "true"), "--on reuses one kept instance"),
    (("--nodes", "2", "--recipe", "resnet9", "--set", "gpus=3", "--instance", "g5.12xlarge"),
     "must split evenly over the nodes"),
    (("--nodes", "2", "--", "true"), "the local backend runs node 0 here"),
])
def test_nodes_that_cannot_be_are_one_line(cli, args, said):
    proc = cli("launch", "--dry-run", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert said in error_line(proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr


def test_u8_a_recipe_job_that_cannot_span_its_nodes_is_refused_before_anything_boots(cli):
    """U8: resnet9 with gpus=1 is one process, and stops at once (exit 2) when torchrun starts it
    with WORLD_SIZE 2: two instances would boot and bill, then fail. The dry run, the launch
    and `estimate --nodes 2` refuse it in one line; gpus=2 (one process a node) runs."""
    said = "Error: recipe resnet9 with gpus=1 runs 1 process: it cannot span 2 nodes"
    hint = "Hint: --set gpus=2 (one process on each node), or leave out --nodes"
    for args in (("launch", "--dry-run"), ("launch", "-y"), ("estimate",)):
        proc = cli(*args, "--recipe", "resnet9", "--nodes", "2", "--instance", "g5.xlarge")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.splitlines() == [said, hint], proc.stderr
    two = cli.ok("launch", "--dry-run", "--recipe", "resnet9", "--set", "gpus=2", "--nodes",
                 "2", "--instance", "g5.xlarge").stdout
    assert "1 per node x 2 nodes = 2" in two
    cli.ok("estimate", "--recipe", "resnet9", "--set", "gpus=2", "--nodes", "2", "--instance",
           "g5.xlarge")


def test_a_launch_with_no_capacity_for_all_nodes_leaves_nothing(cli, aws, monkeypatch, groups):
    """Issue 15, at the CLI: every AZ loses a node before it runs. The launch fails with one
    line naming each AZ; no instance, no placement group, the job failed with its cost."""
    from moto.ec2.models.instances import InstanceBackend, StateReason

    original = InstanceBackend.run_instances

    def lose_last(self, image_id, count, user_data, security_group_names, **kwargs):
        reservation = original(self, image_id, count, user_data, security_group_names, **kwargs)
        last = reservation.instances[-1]
        self.terminate_instances([last.id])
        last.state_reason = StateReason(CAPACITY[1], CAPACITY[0])
        return reservation

    monkeypatch.setattr(InstanceBackend, "run_instances", lose_last)
    proc = cli("launch", "--nodes", "3", "--instance", "g5.xlarge", "--yes", "--", "true",
               timeout=120)
    assert proc.returncode != 0
    line = error_line(proc.stderr)
    assert "no capacity for 3 x g5.xlarge" in line and "us-east-1a" in line \
        and "us-east-1b" in line, proc.stderr
    assert "Traceback" not in proc.stderr
    assert [i for i in aws.instances() if i["State"]["Name"] != "terminated"] == []
    assert groups.live() == []
    (job,) = json.loads(cli.ok("status", "--json").stdout)
    assert job["state"] == "failed"


def _silent():
    from cloudtrain.progress import SILENT

    return SILENT


def test_cost_of_a_job_on_nodes_sums_every_node(cloud, groups):
    """Issue 15: the bill is every node of every attempt (each an instance in the ledger)."""
    from cloudtrain import ledger

    provider, store, ec2, ami = cloud
    spec = _spec(ami=ami)
    job = _job(store, spec)
    cluster.run_cluster(provider.aws, store, job, spec, REGION, _boot(provider, ami), None, _silent())
    started = time.time() - 3600
    for inst in store.instances(job.id):
        store.update_instance(inst.id, launched_at=started, terminated_at=started + 600,
                              state="terminated", price_per_hour=5.672)
    ledger.settle(store, store.job(job.id))
    assert store.job(job.id).cost == pytest.approx(3 * 5.672 * 600 / 3600, rel=0.02)
    assert json.dumps(store.job(job.id).cost_detail)  # priced per phase, serialisable


def test_RC7_nodes_go_into_their_capacity_block_without_a_placement_group_of_their_own(
        cloud, groups, monkeypatch):
    """RC7: a job's N nodes in a Capacity Block are one RunInstances of N into the block, in
    its AZ (us-east-1b, though us-east-1a comes first otherwise), with no cluster placement
    group of the job's own (EC2 puts a targeted instance in one only where the reservation
    was made in it; a block's instances are placed close together already), each recorded
    at the block's price; a block with fewer free instances than nodes is refused first."""
    from labs.moto_capacity import Reservations
    from cloudtrain.errors import UsageError
    from cloudtrain.providers.aws import reservations

    lab = Reservations().install(monkeypatch)
    start = time.time() - 60
    cr = lab.add(instance_type="g5.12xlarge", az="us-east-1b", count=3, kind="capacity-block",
                 start=start, end=start + 24 * 3600, fee=720.0)
    provider, store, ec2, ami = cloud
    spec = _spec(ami=ami, reservation=cr, block_fee=720.0)
    job = _job(store, spec)
    boot = dict(_boot(provider, ami), reservation=reservations.held(provider.aws, spec, REGION))
    ids = cluster.run_cluster(provider.aws, store, job, spec, REGION, boot, None, _silent())
    assert len(ids) == 3 and sorted(lab.instances(cr)) == sorted(ids)
    assert groups.live() == [] and [g["group"] for g in groups.launches] == [None]
    (launch,) = lab.launches
    assert launch["count"] == 3 and launch["market type"] == "capacity-block"
    recorded = store.instances(job.id)
    assert {i.zone for i in recorded} == {"us-east-1b"}
    assert [i.price_per_hour for i in recorded] == pytest.approx([720.0 / (3 * 24)] * 3)
    assert {i.details["reservation"] for i in recorded} == {cr}
    with pytest.raises(UsageError, match=f"--reservation {cr} has 0 of its 3 g5.12xlarge "
                                         "free; the job needs 3"):
        reservations.held(provider.aws, spec, REGION)
