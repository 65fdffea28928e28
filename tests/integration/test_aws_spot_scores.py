"""EC2's spot placement scores order a spot job's AZs (issue 38): asked for one AZ, the job's
node count and three types of the same GPUs, kept a while, and where EC2 cannot or will not
score, the AZs go by price with the reason said. In-process moto with labs/moto_spot_scores.py
(moto has no GetSpotPlacementScores; tests/conftest.py installs it for every test)."""

from __future__ import annotations

import boto3
import botocore.exceptions
import pytest

from labs.aws import ec2_provider  # noqa: F401  (fixture)
from labs.credentials import CLIENT_CREDS, REGION
from labs.moto_spot_scores import SpotScores
from cloudtrain.providers.aws import instances, network, spot_scores


@pytest.fixture
def scores(monkeypatch) -> SpotScores:
    return SpotScores().install(monkeypatch)


def _ec2():
    return boto3.client("ec2", region_name=REGION, **CLIENT_CREDS)


def _zones(provider) -> list[tuple]:
    return network.subnets(provider.aws, REGION)


def test_RC5_the_lab_answers_as_ec2_documents(ec2_provider, scores):
    """RC5: the lab's GetSpotPlacementScores refuses what EC2's documentation says it refuses
    (fewer than three types, types and requirements both or neither, an unknown type) and
    answers one row per AZ id with a score of 1..10, the one the test set."""
    ec2 = _ec2()
    scores.scores["use1-az4"] = 9
    for kwargs, code in [
            ({"InstanceTypes": ["g5.xlarge"]}, "InvalidParameterValue"),
            ({"InstanceTypes": ["g5.xlarge", "g5.xlarge", "g5.2xlarge"]}, "InvalidParameterValue"),
            ({"InstanceTypes": ["g5.xlarge", "g5.2xlarge", "g5.huge"]}, "InvalidParameterValue"),
            ({}, "InvalidParameterCombination"),
            ({"InstanceTypes": ["g5.xlarge", "g5.2xlarge", "g5.4xlarge"],
              "InstanceRequirementsWithMetadata": {"ArchitectureTypes": ["x86_64"]}},
             "InvalidParameterCombination")]:
        with pytest.raises(botocore.exceptions.ClientError) as err:
            ec2.get_spot_placement_scores(TargetCapacity=1, SingleAvailabilityZone=True,
                                          **kwargs)
        assert err.value.response["Error"]["Code"] == code, kwargs
    rows = ec2.get_spot_placement_scores(
        InstanceTypes=["g5.xlarge", "g5.2xlarge", "g5.4xlarge"], TargetCapacity=2,
        SingleAvailabilityZone=True, RegionNames=[REGION])["SpotPlacementScores"]
    ids = {z[3] for z in _zones(ec2_provider)}
    assert {r["AvailabilityZoneId"] for r in rows} == ids
    assert all(1 <= r["Score"] <= 10 and r["Region"] == REGION for r in rows)
    assert rows[0] == {"Region": REGION, "AvailabilityZoneId": "use1-az4", "Score": 9}


def test_RC5_a_spot_job_asks_for_one_az_its_node_count_and_three_types_of_its_gpus(
        ec2_provider, scores):
    """RC5: the request is SingleAvailabilityZone, RegionNames the job's region, the target
    its node count in units, and the job's type first with the two of the same GPU model and
    count nearest it in size (the User Guide's minimum of three types)."""
    got = spot_scores.zone_scores(ec2_provider.aws, REGION, "g5.xlarge", 2, "spot")
    assert got is not None and got.why == "" and set(got.scores.values()) == {5}
    (call,) = scores.calls
    assert call == {"InstanceTypes": ["g5.xlarge", "g5.2xlarge", "g5.4xlarge"],
                    "TargetCapacity": 2, "TargetCapacityUnitType": "units",
                    "SingleAvailabilityZone": True, "RegionNames": [REGION],
                    "requirements": False}
    assert spot_scores.zone_scores(ec2_provider.aws, REGION, "g5.xlarge", 2,
                                   "on-demand") is None
    assert len(scores.calls) == 1  # on-demand asks nothing


def test_RC5_the_best_scored_az_is_tried_first_then_the_cheapest(ec2_provider, scores):
    """RC5: the AZ order follows the score first (the catalog's cheapest AZ for g5.xlarge is
    not the one EC2 scores highest here), then price among equal scores; a relaunch's live
    prices do not overturn the scores, and the interrupted AZs still come last."""
    from cloudtrain import catalog

    zones = _zones(ec2_provider)
    prices = catalog.get("g5.xlarge").spot_snapshot[REGION]
    cheapest = min((z for z in zones if z[3] in prices), key=lambda z: prices[z[3]])
    dearest = max((z for z in zones if z[3] in prices), key=lambda z: prices[z[3]])
    scores.scores.update({dearest[3]: 9, cheapest[3]: 2})
    got = spot_scores.zone_scores(ec2_provider.aws, REGION, "g5.xlarge", 1, "spot")
    ordered = network.order_zones(zones, "g5.xlarge", REGION, "spot", got.scores)
    assert ordered[0] == dearest and ordered[-1] == cheapest
    middle = [prices.get(z[3], 1e9) for z in ordered[1:-1]]  # all scored 5: by price
    assert middle == sorted(middle)

    class Spec:
        class placement:
            instance_type, market = "g5.xlarge", "spot"
        nodes = 1

    class Facts:
        attempt, avoid_zones = 2, [dearest[0]]

    relaunch = instances.relaunch_order(ec2_provider.aws, zones, Spec, REGION, Facts, got)
    assert relaunch[0] == ordered[1] and relaunch[-1] == dearest
    line = spot_scores.said(ordered, got, "g5.xlarge", REGION)
    assert line.startswith(f"{dearest[0]} {dearest[3]} (score 9, ${prices[dearest[3]]:.2f}/h)")
    assert "by EC2's spot placement score for 3 types of the same GPUs" in line


def test_RC5_a_type_without_two_of_the_same_gpus_goes_by_price_and_says_why(ec2_provider,
                                                                           scores):
    """RC5: p4d.24xlarge has no other type with 8 A100s of 40 GB in the catalog: one type
    would be refused (or score always low), so EC2 is not asked and the order is the
    price's, said."""
    got = spot_scores.zone_scores(ec2_provider.aws, REGION, "p4d.24xlarge", 2, "spot")
    assert scores.calls == [] and got.scores == {}
    assert "need 3 types of the same GPUs" in got.why and "p4d.24xlarge" in got.why
    line = spot_scores.said(_zones(ec2_provider), got, "p4d.24xlarge", REGION)
    assert "; by price: placement scores need 3 types" in line


def test_RC5_an_answer_is_kept_and_a_refusal_falls_back_to_price(ec2_provider, scores):
    """RC5: EC2 limits new request configurations per 24 h: an answer is reused from
    aws-cache.json (no second call), a configuration past the limit (MaxConfigLimitExceeded)
    or a denied action gives no scores and says why, and never fails the launch."""
    aws = ec2_provider.aws
    first = spot_scores.zone_scores(aws, REGION, "g5.xlarge", 1, "spot")
    assert spot_scores.zone_scores(aws, REGION, "g5.xlarge", 1, "spot") == first
    assert len(scores.calls) == 1
    scores.config_limit = 1
    limited = spot_scores.zone_scores(aws, REGION, "g5.xlarge", 3, "spot")
    assert limited.scores == {} and "MaxConfigLimitExceeded" in limited.why
    scores.denied = True
    denied = spot_scores.zone_scores(aws, REGION, "g4dn.xlarge", 1, "spot")
    assert denied.scores == {}
    assert "ec2:GetSpotPlacementScores is not allowed (UnauthorizedOperation)" in denied.why
    assert "infra/iam-policy-cli.json" in denied.why
    assert len(scores.calls) == 3


def test_RC5_a_region_without_the_call_falls_back_to_price(ec2_provider, scores):
    """RC5: a region (or endpoint) that does not offer the call leaves the AZs in price
    order, with EC2's reason."""
    scores.unsupported = True
    got = spot_scores.zone_scores(ec2_provider.aws, REGION, "g5.xlarge", 1, "spot")
    assert got.scores == {} and "EC2 refused the placement scores (UnsupportedOperation" in \
        got.why, got.why
    zones = _zones(ec2_provider)
    assert network.order_zones(zones, "g5.xlarge", REGION, "spot", got.scores) == \
        network.order_zones(zones, "g5.xlarge", REGION, "spot")


def test_RC5_the_attempt_keeps_its_az_score(ec2_provider, scores):
    """RC5: what an instance's record keeps: the score of the AZ it was launched in and the
    types scored, or why there was none; nothing for on-demand."""
    scores.scores["use1-az1"] = 8
    got = spot_scores.zone_scores(ec2_provider.aws, REGION, "g5.xlarge", 1, "spot")
    assert instances.placement_score(got, "use1-az1") == {
        "placement_score": 8, "placement_score_types": ["g5.xlarge", "g5.2xlarge", "g5.4xlarge"]}
    assert instances.placement_score(spot_scores.ZoneScores(why="x"), "use1-az1") == {
        "placement_score_why": "x"}
    assert instances.placement_score(None, "use1-az1") == {}
