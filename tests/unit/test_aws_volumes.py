"""Issue 12: `first_read: fsr` checks that fast snapshot restore is enabled for the snapshot in
the instance's AZ. moto has no DescribeFastSnapshotRestores, so the call is answered by
botocore's own Stubber, which checks the request against EC2's API model."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from cloudtrain.errors import UsageError
from cloudtrain.providers.aws.volumes import _check_fsr

SNAP, ZONE = "snap-0123456789abcdef0", "us-east-1a"


def _ec2(states: list[str]):
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x",
                       aws_secret_access_key="y")
    stub = Stubber(ec2)
    stub.add_response("describe_fast_snapshot_restores", {"FastSnapshotRestores": [
        {"SnapshotId": SNAP, "AvailabilityZone": ZONE, "State": s} for s in states]},
        {"Filters": [{"Name": "snapshot-id", "Values": [SNAP]},
                     {"Name": "availability-zone", "Values": [ZONE]}]})
    stub.activate()
    return ec2, stub


def test_fsr_enabled_in_the_instances_az_passes():
    ec2, stub = _ec2(["enabled"])
    _check_fsr(ec2, SNAP, ZONE)
    stub.assert_no_pending_responses()


@pytest.mark.parametrize("states", [[], ["enabling"], ["optimizing", "disabled"]])
def test_fsr_not_enabled_there_stops_with_how_to_enable_it(states):
    ec2, _ = _ec2(states)
    with pytest.raises(UsageError) as err:
        _check_fsr(ec2, SNAP, ZONE)
    assert err.value.message == (f"first_read: fsr, but fast snapshot restore is not enabled "
                                 f"for {SNAP} in {ZONE}")
    assert f"aws ec2 enable-fast-snapshot-restores --source-snapshot-ids {SNAP} " \
           f"--availability-zones {ZONE}" in err.value.hint
