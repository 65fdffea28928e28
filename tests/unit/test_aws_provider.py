"""The AWS provider's price rows: the instance's price and "at most", the most the job can
cost, as the dry run shows it and `launch` asks about it (U9, F29). Offline: catalog prices."""

from __future__ import annotations

import pytest

from cloudtrain import catalog, cost
from cloudtrain.config import Settings
from cloudtrain.providers.aws import AWSProvider
from cloudtrain.providers.aws.instances import power_off_minutes
from cloudtrain.spec import JobSpec
from cloudtrain.providers.aws import plan

REGION = "us-east-1"
G5 = catalog.get("g5.xlarge")
OD = G5.price(REGION, "on-demand")
DEAREST_SPOT = max(G5.spot_snapshot[REGION].values())
GP3 = catalog.gp3_price(REGION).per_gb_month


def _spec(**kw) -> JobSpec:
    fields = dict(kind="command", backend="aws", command=["true"], instance_type="g5.xlarge",
                  region=REGION, max_runtime_s=3600.0, disk_gb=60)
    fields.update(kw)
    return JobSpec.of(**fields)


def _rows(spec: JobSpec, **settings) -> dict:
    return dict(plan.price_rows(AWSProvider(Settings(**settings)).aws, spec, REGION))


def _dollars(rows: dict) -> float:
    return float(rows["at most"].split(":", 1)[0].lstrip("$"))


def _hours() -> float:
    """One instance's longest run: its max runtime, then user-data's power-off (F16)."""
    return power_off_minutes(3600.0) / 60


def _disk(gb: float = 60, extra_month: float = 0.0) -> float:
    return (gb * GP3 + extra_month) / cost.HOURS_PER_MONTH


IP = cost.PUBLIC_IPV4_PER_HOUR  # each instance's public IPv4 address (connect: public; RH5)
IP_SAID = f" and its public IPv4 address (${IP:.4f}/h)"


def test_u9_on_demand_at_most_runs_to_the_power_off_and_counts_the_disk():
    rows = _rows(_spec())
    assert _dollars(rows) == pytest.approx(round(_hours() * (OD + _disk() + IP), 2))
    assert rows["at most"].endswith(
        ": one instance of up to 90 min (the max runtime of 60 min + 30 until user-data "
        f"powers it off), with its 60 GB gp3 disk (${_disk():.4f}/h)" + IP_SAID)


def test_u9_a_recovering_spot_job_counts_every_attempt_and_the_fallback():
    """The finding's command: `--spot --max-restarts 5 --fallback on-demand`. Six instances
    may run to their power-off; every relaunch may be on demand; spot may land in the
    region's dearest AZ."""
    rows = _rows(_spec(market="spot", recover=True, max_restarts=5, fallback="on-demand"))
    first = _hours() * (DEAREST_SPOT + _disk() + IP)
    later = 5 * _hours() * (OD + _disk() + IP)
    assert _dollars(rows) == pytest.approx(round(first + later, 2))
    assert rows["at most"].endswith(
        ": 6 attempts (1 + 5 restarts) of up to 90 min each (the max runtime of 60 min + 30 "
        f"until user-data powers it off), spot at up to ${DEAREST_SPOT:.4f}/h (the dearest AZ "
        f"in the catalog), on-demand (${OD:.4f}/h) after spot runs out, each with its 60 GB "
        f"gp3 disk (${_disk():.4f}/h)" + IP_SAID)
    spot_only = _rows(_spec(market="spot", recover=True, max_restarts=3))
    assert _dollars(spot_only) == pytest.approx(round(4 * _hours() * (DEAREST_SPOT + _disk() + IP), 2))
    assert "4 attempts (1 + 3 restarts)" in spot_only["at most"]
    assert "on-demand" not in spot_only["at most"]


def test_u9_no_restarts_is_the_same_as_no_recovery():
    zero = _rows(_spec(market="spot", recover=True, max_restarts=0, fallback="on-demand"))
    off = _rows(_spec(market="spot", recover=False))
    assert zero["at most"] == off["at most"]
    assert _dollars(off) == pytest.approx(round(_hours() * (DEAREST_SPOT + _disk() + IP), 2))


def test_u9_relaunches_in_other_regions_are_priced_at_the_dearest():
    west = G5.price("eu-central-1", "on-demand")
    assert west > OD
    rows = _rows(_spec(market="spot", recover=True, max_restarts=1, fallback="on-demand"),
                 regions="eu-central-1")
    west_disk = (60 * catalog.gp3_price("eu-central-1").per_gb_month) / cost.HOURS_PER_MONTH
    assert _dollars(rows) == pytest.approx(round(
        _hours() * (DEAREST_SPOT + _disk() + IP) + _hours() * (west + west_disk + IP), 2))
    assert f"on-demand (up to ${west:.4f}/h) after spot runs out" in rows["at most"]


def test_u9_a_max_price_bounds_what_spot_bills():
    rows = _rows(_spec(market="spot", max_price=0.25))
    assert _dollars(rows) == pytest.approx(round(_hours() * (0.25 + _disk() + IP), 2))
    assert "spot at up to $0.2500/h (--max-price)" in rows["at most"]


def test_f29_the_disk_s_provisioned_throughput_and_a_snapshot_volume_are_counted():
    extra = cost.gp3_performance_per_month(1000)
    spec = _spec(disk_gb=500, disk_mbps=1000, datasets=[
        {"name": "imagenet", "kind": "snapshot", "location": "snap-0123456789abcdef0",
         "throughput": 500, "iops": 2000 * 2, "first_read": "preread"}],
        staging={"imagenet": {"kind": "snapshot", "bytes": 200 << 30}})
    snap = (200 * GP3 + cost.gp3_performance_per_month(500, 4000)) / cost.HOURS_PER_MONTH
    rows = _rows(spec)
    assert _dollars(rows) == pytest.approx(round(
        _hours() * (OD + _disk(500, extra) + snap + IP), 2))
    assert rows["at most"].endswith(
        f"with its 500 GB gp3 disk and the 200 GB volume of dataset imagenet "
        f"(${_disk(500, extra) + snap:.4f}/h)" + IP_SAID)


def test_u9_every_node_is_counted():
    rows = _rows(_spec(nodes=4))
    assert _dollars(rows) == pytest.approx(round(4 * _hours() * (OD + _disk() + IP), 2))
    assert "on each of 4 nodes" in rows["at most"]


def test_u9_the_question_quotes_the_at_most():
    spec = _spec(market="spot", recover=True, max_restarts=5, fallback="on-demand")
    provider = AWSProvider(Settings())
    rows = dict(plan.price_rows(provider.aws, spec, REGION))
    assert f"; at most {rows['at most']}." in provider.question(spec).text


# -- RG5: where the data copy goes, in the dry run ------------------------------------------------

NVME = {"used": True, "path": "/opt/dlami/nvme", "dir": "/opt/dlami/nvme/cloudtrain/data",
        "disks": 1, "gb": 250.0, "need_gb": 161}


def _lifecycle(spec: JobSpec, **settings) -> dict:
    return dict(plan._plan_lifecycle(AWSProvider(Settings(**settings)).aws, spec, REGION))


def test_RG5_the_plan_says_the_copy_goes_onto_the_free_local_nvme_and_why():
    """RG5: the dry run's disk row is the root volume as asked (not raised for the copy, no
    throughput), and its staging row says where the copy goes and why: free with the type,
    lost with the instance (as the root volume is; the job store keeps the checkpoints), and
    what happens if the image has not mounted it."""
    spec = _spec(disk_gb=None, local_disk=NVME)
    rows = _lifecycle(spec, job_store=True)
    assert rows["disk"] == "100 GB gp3, encrypted, deleted with the instance"
    assert rows["staging"] == (
        "the datasets are copied onto the local NVMe the Deep Learning AMI mounts at "
        "/opt/dlami/nvme (1 disk, 250 GB; the copy needs 161 GB): free with g5.xlarge, and "
        "lost with the instance as the root volume is (checkpoints are kept in the job "
        "store), so no root volume space or gp3 throughput is bought for it; should the "
        "image not have mounted it, the copy goes onto the root volume instead, and the "
        "timeline says so")
    p4d = _lifecycle(_spec(instance_type="p4d.24xlarge", disk_gb=None, local_disk=dict(
        NVME, disks=8, gb=8000.0)), job_store=False)["staging"]
    assert "at /opt/dlami/nvme (8 disks, 8,000 GB; the copy needs 161 GB): free with " \
           "p4d.24xlarge, and lost with the instance as the root volume is, so" in p4d
    # each node its own
    four = _lifecycle(_spec(nodes=4, disk_gb=None, local_disk=NVME))["staging"]
    assert "(each node its own copy on its own NVMe)" in four


def test_RG5_the_plan_says_why_the_copy_goes_onto_the_root_volume():
    spec = _spec(disk_gb=261, disk_mbps=437, local_disk={"used": False, "why": (
        "g5.xlarge's local NVMe (250 GB at /opt/dlami/nvme) is smaller than the 261 GB the "
        "copy needs")})
    rows = _lifecycle(spec)
    assert rows["disk"].startswith("261 GB gp3, 437 MB/s and 3000 IOPS provisioned for the "
                                   "data copy")
    assert rows["staging"] == (
        "the datasets are copied onto the root volume (sized for them above): g5.xlarge's "
        "local NVMe (250 GB at /opt/dlami/nvme) is smaller than the 261 GB the copy needs")
    # no copy (or a kept instance's): no staging row
    assert "staging" not in _lifecycle(_spec())
