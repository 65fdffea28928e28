"""DescribeRegions as EC2 answers it, where moto does not:

    DescribeRegions   EC2 lists the regions of the partition the endpoint is in (never
                      China's or GovCloud's from a commercial one) that are enabled for the
                      account, unless AllRegions=true asks for the disabled ones too. The
                      regions AWS introduced before 2019-03-20 are enabled for every
                      account ("opt-in-not-required"); a later one only once the account
                      opts in ("opted-in", else "not-opted-in"). Moto lists all 38 of its
                      regions in every partition, and says "opt-in-not-required" of some
                      opt-in regions (af-south-1, eu-south-1): a sweep of "the regions
                      enabled for the account" went to 34 regions where AWS's answer has 17.

Source: AWS's documentation, "Specify which AWS Regions your account can use" (AWS Account
Management) and the EC2 API reference for DescribeRegions (AllRegions, OptInStatus).

Installed with monkeypatch on moto's class (labs.aws.use_moto and the ec2_provider fixture
install it for every test), so it serves in-process `mock_aws()` and a ThreadedMotoServer
alike, and goes away at the test's end. `opted_in` names the opt-in regions the lab's
account has enabled.
"""

from __future__ import annotations

# The commercial regions every account has: those AWS introduced before 2019-03-20.
ENABLED_BY_DEFAULT = frozenset({
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "ca-central-1", "sa-east-1",
    "eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1", "eu-north-1",
    "ap-south-1", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3",
    "ap-southeast-1", "ap-southeast-2",
})


def partition(region: str) -> str:
    """The AWS partition of `region`: aws-cn, aws-us-gov or aws."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


class EnabledRegions:
    def __init__(self, opted_in: frozenset[str] | set[str] = frozenset()):
        self.opted_in = set(opted_in)  # opt-in regions this account has enabled

    def status(self, region: str) -> str:
        """The region's OptInStatus for this account, as EC2 says it."""
        if partition(region) != "aws" or region in ENABLED_BY_DEFAULT:
            return "opt-in-not-required"
        return "opted-in" if region in self.opted_in else "not-opted-in"

    def install(self, monkeypatch) -> "EnabledRegions":
        from moto.core.responses import ActionResult
        from moto.ec2.models.availability_zones_and_regions import Region
        from moto.ec2.responses.availability_zones_and_regions import (
            AvailabilityZonesAndRegions)

        lab = self

        def describe_regions(response) -> ActionResult:
            response.error_on_dryrun()
            everything = str(response._get_param("AllRegions", False)).lower() == "true"
            names = response._get_param("RegionNames", [])
            home = partition(response.region)
            listed = []
            for region in response.ec2_backend.describe_regions(names):
                status = lab.status(region.name)
                if partition(region.name) != home or (
                        status == "not-opted-in" and not everything):
                    continue
                listed.append(Region(region.name, region.endpoint, status))
            return ActionResult({"Regions": listed})

        monkeypatch.setattr(AvailabilityZonesAndRegions, "describe_regions", describe_regions)
        return self
