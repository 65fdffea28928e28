"""tests/labs/moto_capacity.py: Capacity Reservations and Capacity Blocks as EC2 answers them,
on in-process moto and on a moto server (moto has neither). Each refusal here is a request
moto alone lets by."""

from __future__ import annotations

import datetime
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from labs.aws import moto_endpoint, reset_moto  # noqa: F401  (fixture)
from labs.credentials import CLIENT_CREDS, REGION, in_moto
from labs.moto_capacity import Reservations

AMI = "ami-12c6146b"  # one of moto's default images
HOUR = 3600.0


@pytest.fixture
def lab(monkeypatch):
    yield from in_moto(monkeypatch, Reservations())


def _ec2(region="us-east-1"):
    return boto3.client("ec2", region_name=region)


def _subnet(ec2, az: str) -> str:
    return next(s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]
                if s["AvailabilityZone"] == az and s["DefaultForAz"])


def _run(ec2, cr: str | None, az="us-east-1a", kind="p5.48xlarge", n=1, block=False, **kw):
    request = dict(ImageId=AMI, MinCount=n, MaxCount=n, InstanceType=kind,
                   SubnetId=_subnet(ec2, az), **kw)
    if cr:
        request["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": cr}}
    if block:
        request["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    return [i["InstanceId"] for i in ec2.run_instances(**request)["Instances"]]


def _code(call) -> str:
    with pytest.raises(ClientError) as refused:
        call()
    return refused.value.response["Error"]["Code"]


def _one(ec2, cr: str) -> dict:
    return ec2.describe_capacity_reservations(CapacityReservationIds=[cr])[
        "CapacityReservations"][0]


def test_a_reservation_is_described_by_id_with_ec2s_fields(lab):
    ec2 = _ec2()
    cr = lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=2)
    other = lab.add(instance_type="g5.xlarge", az="us-east-1b", count=1)
    row = _one(ec2, cr)
    assert row["CapacityReservationId"] == cr and len(cr) == len("cr-") + 17
    assert (row["InstanceType"], row["AvailabilityZone"], row["State"]) == (
        "p5.48xlarge", "us-east-1a", "active")
    assert (row["TotalInstanceCount"], row["AvailableInstanceCount"]) == (2, 2)
    assert row["ReservationType"] == "default" and row["EndDateType"] == "unlimited"
    assert row["InstanceMatchCriteria"] == "open" and row["InstancePlatform"] == "Linux/UNIX"
    assert row["AvailabilityZoneId"].startswith("use1-az")
    assert row["CapacityReservationArn"].endswith(f":capacity-reservation/{cr}")
    assert isinstance(row["StartDate"], datetime.datetime) and "EndDate" not in row
    everything = ec2.describe_capacity_reservations()["CapacityReservations"]
    assert {r["CapacityReservationId"] for r in everything} == {cr, other}
    assert _one(ec2, cr) and not _ec2("us-west-2").describe_capacity_reservations()[
        "CapacityReservations"]


def test_an_unknown_or_malformed_id_is_refused_as_ec2_refuses_it(lab):
    ec2 = _ec2()
    lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=1)
    with pytest.raises(ClientError) as refused:
        ec2.describe_capacity_reservations(CapacityReservationIds=["cr-0123456789abcdef0"])
    assert refused.value.response["Error"]["Code"] == "InvalidCapacityReservationId.NotFound"
    assert "cr-0123456789abcdef0" in refused.value.response["Error"]["Message"]
    assert _code(lambda: ec2.describe_capacity_reservations(
        CapacityReservationIds=["sir-1234"])) == "InvalidCapacityReservationId.Malformed"


def test_filters_pick_reservations_and_an_unlisted_filter_is_refused(lab):
    ec2 = _ec2()
    odcr = lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=1)
    block = lab.add(instance_type="p5.48xlarge", az="us-east-1b", count=1,
                    kind="capacity-block", end=time.time() + 48 * HOUR, fee=100.0)
    later = lab.add(instance_type="g5.xlarge", az="us-east-1a", count=1,
                    start=time.time() + 5 * HOUR)

    def ids(*filters):
        rows = ec2.describe_capacity_reservations(Filters=[
            {"Name": n, "Values": v} for n, v in filters])["CapacityReservations"]
        return {r["CapacityReservationId"] for r in rows}

    assert ids(("instance-type", ["p5.48xlarge"])) == {odcr, block}
    assert ids(("availability-zone", ["us-east-1a"])) == {odcr, later}
    assert ids(("state", ["scheduled"])) == {later}
    assert ids(("instance-type", ["p5.*"]), ("end-date-type", ["limited"])) == {block}
    ends = _one(ec2, block)["EndDate"].strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert ids(("end-date", [ends])) == {block} and not ids(("end-date", ["2020-*"]))
    assert _code(lambda: ids(("reservation-type", ["capacity-block"]))) == \
        "InvalidParameterValue"


def test_available_instances_fall_on_launch_and_rise_on_terminate(lab):
    ec2 = _ec2()
    cr = lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=3, match="targeted")
    first = _run(ec2, cr, n=2)
    assert _one(ec2, cr)["AvailableInstanceCount"] == 1
    assert sorted(lab.instances(cr)) == sorted(first)
    described = ec2.describe_instances(InstanceIds=first)["Reservations"][0]["Instances"]
    assert {i.get("CapacityReservationId") for i in described} == {cr}
    ec2.terminate_instances(InstanceIds=first[:1])
    assert _one(ec2, cr)["AvailableInstanceCount"] == 2
    assert lab.instances(cr) == first[1:]
    (launch,) = lab.launches
    assert (launch["refused"], launch["reservation id"], launch["market type"]) == (None, cr, None)
    assert (launch["InstanceType"], launch["AZ"], launch["count"]) == ("p5.48xlarge",
                                                                       "us-east-1a", 2)


def test_a_launch_into_the_wrong_az_type_or_beyond_its_capacity_is_refused(lab):
    ec2 = _ec2()
    cr = lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=2, match="targeted")
    exceeded = "ReservationCapacityExceeded"
    assert _code(lambda: _run(ec2, cr, az="us-east-1b")) == exceeded
    assert _code(lambda: _run(ec2, cr, kind="p4d.24xlarge")) == exceeded
    assert _code(lambda: _run(ec2, cr, n=3)) == exceeded
    assert [e["refused"] for e in lab.launches] == [exceeded] * 3
    assert "us-east-1b" in lab.launches[0]["reason"] and "p4d" in lab.launches[1]["reason"]
    assert not ec2.describe_instances()["Reservations"]  # nothing launched
    _run(ec2, cr, n=2)
    assert _code(lambda: _run(ec2, cr)) == exceeded
    assert _code(lambda: _run(ec2, "cr-0123456789abcdef0")) == \
        "InvalidCapacityReservationId.NotFound"


def test_a_block_needs_market_type_capacity_block_and_that_market_needs_a_block(lab):
    ec2 = _ec2()
    block = lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=2,
                    kind="capacity-block", end=time.time() + 24 * HOUR, fee=31464.0)
    odcr = lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=2)
    combination = "InvalidParameterCombination"
    assert _code(lambda: _run(ec2, block)) == combination
    assert _code(lambda: _run(ec2, odcr, block=True)) == combination
    assert _code(lambda: _run(ec2, None, block=True)) == combination
    assert _code(lambda: _run(ec2, odcr, InstanceMarketOptions={"MarketType": "spot"})) == \
        combination
    launched = _run(ec2, block, block=True)
    instance = ec2.describe_instances(InstanceIds=launched)["Reservations"][0]["Instances"][0]
    assert instance["InstanceLifecycle"] == "capacity-block"  # not moto's "spot"
    assert instance["CapacityReservationId"] == block
    assert _one(ec2, block)["AvailableInstanceCount"] == 1
    assert _one(ec2, block)["CapacityBlockId"].startswith("cb-")


def test_a_scheduled_reservation_takes_no_launch_until_it_starts(lab):
    ec2 = _ec2()
    soon = time.time() + 2 * HOUR
    block = lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=1,
                    kind="capacity-block", start=soon, end=soon + 24 * HOUR, fee=1.0)
    row = _one(ec2, block)
    assert (row["State"], row["AvailableInstanceCount"]) == ("scheduled", 0)
    assert _code(lambda: _run(ec2, block, block=True)) == \
        "InvalidCapacityReservationState.PendingActivation"
    lab.held[block].start = time.time() - 1  # the block starts
    assert _one(ec2, block)["State"] == "active"
    assert _run(ec2, block, block=True)


def test_expire_terminates_a_blocks_instances_and_takes_no_more(lab):
    ec2 = _ec2()
    block = lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=2,
                    kind="capacity-block", end=time.time() + 24 * HOUR, fee=1.0)
    launched = _run(ec2, block, n=2, block=True)
    lab.expire(block)
    states = {i["State"]["Name"] for r in ec2.describe_instances(InstanceIds=launched)[
        "Reservations"] for i in r["Instances"]}
    assert states == {"terminated"} and lab.instances(block) == []
    row = _one(ec2, block)
    assert (row["State"], row["AvailableInstanceCount"]) == ("expired", 0)
    assert _code(lambda: _run(ec2, block, block=True)) == "ReservationCapacityExceeded"


def test_a_blocks_instances_end_30_minutes_before_its_end_and_an_odcrs_run_on(lab):
    ec2 = _ec2()
    block = lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=1,
                    kind="capacity-block", end=time.time() + 24 * HOUR, fee=1.0)
    odcr = lab.add(instance_type="g5.xlarge", az="us-east-1a", count=1, match="targeted")
    in_block, in_odcr = _run(ec2, block, block=True), _run(ec2, odcr, kind="g5.xlarge")
    assert lab.instances(block) == in_block
    lab.held[block].end = time.time() + 29 * 60
    assert lab.instances(block) == [] and _one(ec2, block)["State"] == "active"
    lab.expire(odcr)
    assert lab.instances(odcr) == in_odcr and _one(ec2, odcr)["State"] == "expired"
    running = ec2.describe_instances(InstanceIds=in_odcr)["Reservations"][0]["Instances"][0]
    assert running["State"]["Name"] == "running" and "CapacityReservationId" not in running


def test_an_untargeted_launch_goes_into_a_matching_open_reservation(lab):
    ec2 = _ec2()
    targeted = lab.add(instance_type="g5.xlarge", az="us-east-1a", count=4, match="targeted")
    open_one = lab.add(instance_type="g5.xlarge", az="us-east-1a", count=2)
    _run(ec2, None, kind="g5.xlarge", n=2)
    _run(ec2, None, kind="g5.xlarge", az="us-east-1b")
    assert _one(ec2, open_one)["AvailableInstanceCount"] == 0
    assert _one(ec2, targeted)["AvailableInstanceCount"] == 4
    assert lab.launches == []  # none named a reservation


def test_offerings_are_filtered_and_a_purchase_makes_a_block(lab):
    ec2 = _ec2()
    start = time.time() + 24 * HOUR
    day = lab.offer("p5.48xlarge", "us-east-1a", 2, 24, 31464.0, start=start)
    lab.offer("p5.48xlarge", "us-east-1b", 4, 24, 62928.0, start=start)
    lab.offer("p5.48xlarge", "us-east-1a", 2, 48, 62928.0, start=start)
    lab.offer("p4d.24xlarge", "us-east-1a", 2, 24, 9000.0, start=start)
    rows = ec2.describe_capacity_block_offerings(
        InstanceType="p5.48xlarge", InstanceCount=2, CapacityDurationHours=24)[
        "CapacityBlockOfferings"]
    assert [r["CapacityBlockOfferingId"] for r in rows] == [day]
    assert (rows[0]["UpfrontFee"], rows[0]["CurrencyCode"]) == ("31464.00", "USD")
    assert rows[0]["EndDate"] - rows[0]["StartDate"] == datetime.timedelta(hours=24)
    assert not ec2.describe_capacity_block_offerings(
        InstanceType="p5.48xlarge", InstanceCount=2, CapacityDurationHours=24,
        EndDateRange=datetime.datetime.fromtimestamp(start, datetime.timezone.utc))[
        "CapacityBlockOfferings"]
    assert _code(lambda: ec2.describe_capacity_block_offerings(
        InstanceType="p5.48xlarge", InstanceCount=2, CapacityDurationHours=36)) == \
        "InvalidParameterValue"
    bought = ec2.purchase_capacity_block(CapacityBlockOfferingId=day,
                                         InstancePlatform="Linux/UNIX")["CapacityReservation"]
    assert (bought["ReservationType"], bought["State"], bought["TotalInstanceCount"]) == (
        "capacity-block", "scheduled", 2)
    assert bought["InstanceMatchCriteria"] == "targeted"
    assert lab.held[bought["CapacityReservationId"]].fee == 31464.0
    assert _one(ec2, bought["CapacityReservationId"])["EndDate"] == rows[0]["EndDate"]
    assert not ec2.describe_capacity_block_offerings(
        InstanceType="p5.48xlarge", InstanceCount=2, CapacityDurationHours=24)[
        "CapacityBlockOfferings"]
    assert _code(lambda: ec2.purchase_capacity_block(
        CapacityBlockOfferingId=day, InstancePlatform="Linux/UNIX")) == \
        "InvalidCapacityBlockOfferingIdExpired"
    assert _code(lambda: ec2.purchase_capacity_block(
        CapacityBlockOfferingId="cb-0123456789abcdef0", InstancePlatform="Linux/UNIX")) == \
        "InvalidCapacityBlockOfferingIdNotFound"


def test_denied_answers_unauthorized_operation(lab):
    ec2 = _ec2()
    lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=1)
    lab.denied = True
    assert _code(ec2.describe_capacity_reservations) == "UnauthorizedOperation"
    assert _code(lambda: ec2.describe_capacity_block_offerings(
        InstanceType="p5.48xlarge", InstanceCount=1, CapacityDurationHours=24)) == \
        "UnauthorizedOperation"
    lab.denied = False
    assert ec2.describe_capacity_reservations()["CapacityReservations"]


def test_a_moto_server_answers_the_same(moto_endpoint, monkeypatch):  # noqa: F811
    reset_moto(moto_endpoint)
    lab = Reservations().install(monkeypatch)
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name=REGION, **CLIENT_CREDS)
    cr = lab.add(instance_type="p5.48xlarge", az="us-east-1a", count=2, kind="capacity-block",
                 end=time.time() + 24 * HOUR, fee=31464.0)
    _run(ec2, cr, block=True)
    row = _one(ec2, cr)
    assert (row["State"], row["AvailableInstanceCount"]) == ("active", 1)
    assert isinstance(row["EndDate"], datetime.datetime)
    assert _code(lambda: _run(ec2, cr)) == "InvalidParameterCombination"
    start = time.time() + 24 * HOUR
    lab.offer("p5.48xlarge", "us-east-1a", 2, 24, 31464.0, start=start)
    asked = dict(InstanceType="p5.48xlarge", InstanceCount=2, CapacityDurationHours=24)
    by = datetime.datetime.fromtimestamp(start + 24 * HOUR, datetime.timezone.utc)
    assert len(ec2.describe_capacity_block_offerings(EndDateRange=by, **asked)[
        "CapacityBlockOfferings"]) == 1
    assert not ec2.describe_capacity_block_offerings(
        EndDateRange=by - datetime.timedelta(hours=1), **asked)["CapacityBlockOfferings"]


def test_a_launch_that_names_no_az_goes_into_the_reservations(lab):
    ec2 = _ec2()
    cr = lab.add(instance_type="g5.xlarge", az="us-east-1b", count=1, match="targeted")
    launched = ec2.run_instances(
        ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
        CapacityReservationSpecification={"CapacityReservationTarget": {
            "CapacityReservationId": cr}})["Instances"][0]
    assert launched["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert lab.launches[0]["AZ"] == "us-east-1b"
