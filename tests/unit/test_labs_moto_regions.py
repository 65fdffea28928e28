"""tests/labs/moto_regions.py: DescribeRegions as EC2 answers it (the enabled regions of the
endpoint's partition), on in-process moto."""

from __future__ import annotations

import boto3
import pytest

from labs.credentials import in_moto
from labs.moto_regions import ENABLED_BY_DEFAULT, EnabledRegions


@pytest.fixture
def regions(monkeypatch):
    yield from in_moto(monkeypatch, EnabledRegions())


def _listed(region="us-east-1", **kw) -> dict[str, str]:
    answer = boto3.client("ec2", region_name=region).describe_regions(**kw)["Regions"]
    return {r["RegionName"]: r["OptInStatus"] for r in answer}


def test_an_account_lists_the_17_regions_it_has_by_default(regions):
    listed = _listed()
    assert set(listed) == ENABLED_BY_DEFAULT and len(listed) == 17
    assert set(listed.values()) == {"opt-in-not-required"}


def test_all_regions_adds_the_opt_in_ones_not_enabled_and_never_another_partition(regions):
    listed = _listed(AllRegions=True)
    assert listed["af-south-1"] == listed["eu-south-1"] == "not-opted-in"
    assert not [r for r in listed if r.startswith(("cn-", "us-gov-"))]
    assert {r for r, s in listed.items() if s != "not-opted-in"} == ENABLED_BY_DEFAULT


def test_an_opt_in_region_the_account_enabled_is_listed_as_opted_in(regions):
    regions.opted_in.add("me-south-1")
    assert _listed()["me-south-1"] == "opted-in"
    assert len(_listed()) == 18
