"""The RunInstances request cloudtrain sends (checked whole: this is what bills)."""

from __future__ import annotations

import gzip

from cloudtrain.config import Settings
from cloudtrain.providers.aws import AWSProvider
from cloudtrain.spec import JobSpec
from cloudtrain.state import Job
from cloudtrain.providers.aws import instances, network


def _job():
    return Job(id="abcd1234", name="exp", kind="recipe", recipe="resnet9", command="resnet9",
               backend="aws", state="provisioning", created_at=0.0, started_at=None,
               ended_at=None, exit_code=None, reason=None, spec={}, host=None, jobdir=None,
               metrics=None, cost=None)


def _request(settings: dict | None = None, **spec_fields):
    spec = JobSpec.of(kind="recipe", backend="aws", recipe="resnet9", instance_type="g5.xlarge",
                   max_runtime_s=3600, **spec_fields)
    provider = AWSProvider(Settings(shutdown_command="sudo shutdown -h now", **(settings or {})))
    return instances.run_request(provider.aws, _job(), spec, "subnet-1", "sg-1", "ami-1", "key-1",
                                "arn:aws:iam::1:user/me", 60, "/dev/sda1")


def test_on_demand_request():
    r = _request()
    assert r["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert r["MetadataOptions"]["HttpTokens"] == "required"
    assert r["MetadataOptions"]["HttpPutResponseHopLimit"] == 1  # F9: no IMDS from containers
    assert "InstanceMarketOptions" not in r
    (bdm,) = r["BlockDeviceMappings"]
    assert bdm["DeviceName"] == "/dev/sda1"
    assert bdm["Ebs"] == {"VolumeSize": 60, "VolumeType": "gp3", "Encrypted": True,
                          "DeleteOnTermination": True}
    tags = {s["ResourceType"]: {t["Key"]: t["Value"] for t in s["Tags"]}
            for s in r["TagSpecifications"]}
    # F9: the ENI is tagged too; a spot request only exists (and is tagged) for spot
    assert set(tags) == {"instance", "volume", "network-interface"}
    assert tags["instance"] == tags["volume"] == tags["network-interface"] == {
        "cloudtrain:job": "abcd1234", "cloudtrain:owner": "arn:aws:iam::1:user/me",
        "cloudtrain:recipe": "resnet9", "cloudtrain:attempt": "1",
        "Name": "cloudtrain-abcd1234-exp"}
    assert (r["SubnetId"], r["SecurityGroupIds"], r["KeyName"], r["ImageId"]) == \
        ("subnet-1", ["sg-1"], "key-1", "ami-1")


def test_RH1_a_job_that_runs_a_container_may_let_it_reach_imds_with_a_hop_limit_of_2():
    """RH1: with hop limit 1 a container on a bridge network (Docker's default) cannot reach
    the metadata service nor the instance role; `imds_hop_limit: 2` in config.yaml lets it,
    and EC2's range (1 to 64) is checked where the setting is read."""
    assert _request({"imds_hop_limit": 2})["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
    assert _request()["MetadataOptions"]["HttpPutResponseHopLimit"] == 1


def test_spot_request_is_one_time_and_terminates():
    r = _request(market="spot", max_price=0.5)
    assert r["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate",
        "MaxPrice": "0.5000"}}
    kinds = [s["ResourceType"] for s in r["TagSpecifications"]]
    assert kinds == ["instance", "volume", "network-interface", "spot-instances-request"]
    assert r["TagSpecifications"][-1]["Tags"] == r["TagSpecifications"][0]["Tags"]


def test_user_data_powers_off_after_the_max_runtime_plus_margin():
    r = _request()
    ud = gzip.decompress(r["UserData"]).decode()  # gzipped, as cloud-init takes it
    for placeholder in ("@@JOB_ID@@", "@@MAX_RUNTIME_MINUTES@@", "@@SHUTDOWN_COMMAND@@"):
        assert placeholder not in ud
    assert "\n90\n" in ud  # 60 min runtime + 30 min margin (F16 addendum)
    assert "\nabcd1234\n" in ud
    assert "\nshutdown -h now\n" in ud and "sudo shutdown" not in ud  # user-data runs as root


def test_spot_tries_the_cheapest_az_of_the_snapshot_first():
    # g5.xlarge spot in us-east-1 (catalog snapshot): use1-az2 is not the first by name.
    from cloudtrain import catalog

    prices = catalog.get("g5.xlarge").spot_snapshot["us-east-1"]
    zones = [(f"us-east-1{c}", f"subnet-{c}", "vpc-1", zid)
             for c, zid in zip("abcdef", sorted(prices))] + [("us-east-1z", "subnet-z", "vpc-1", "")]
    ordered = network.order_zones(zones, "g5.xlarge", "us-east-1", "spot")
    got = [prices[z[3]] for z in ordered if z[3]]
    assert got == sorted(got) and ordered[-1][0] == "us-east-1z"
    assert network.order_zones(zones, "g5.xlarge", "us-east-1", "on-demand") == zones


def test_gpus_request_resolves_to_the_cheapest_type():
    from cloudtrain import catalog
    from cloudtrain.errors import UsageError

    t, region, _ = catalog.cheapest("V100", 1, ["us-east-1", "us-west-2"])
    assert t.name == "p3.2xlarge" and t.on_demand[region] == 3.06
    t, region, zone = catalog.cheapest("a10g", 1, ["us-east-1"], "spot")
    assert t.gpu == "A10G" and zone in t.spot_snapshot["us-east-1"]
    assert t.spot_snapshot["us-east-1"][zone] == min(
        p for c in catalog.matching("A10G", 1) for p in c.spot_snapshot.get("us-east-1", {}).values())
    import pytest

    with pytest.raises(UsageError, match=r"^no instance type with 3x A100 in us-east-1: A100 "
                                         r"comes only in 8-GPU types here: p4d.24xlarge"):
        catalog.cheapest("A100", 3, ["us-east-1"])
