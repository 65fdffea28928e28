"""JobSpec (cloudtrain/job_spec.py): what the user asked, and the facts derived from it alone."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from cloudtrain.job_spec import COMMAND, PART_OF, RECIPE, Data, JobSpec, Placement, Recovery
from cloudtrain.market import Market
from conftest import REPO


def test_output_paths_are_below_the_working_directory_for_own_code_and_workdir_recipes():
    """Named outputs (`--output`) relative to the job directory on the host: a recipe's
    below it, own code's (and a recipe run from a synced working directory) below work/."""
    outs = ["runs/best.pt", "plots"]
    assert JobSpec(kind=RECIPE, backend="local", outputs=outs).output_paths() == outs
    assert JobSpec(kind=RECIPE, backend="local", workdir="/w", outputs=outs).output_paths() \
        == ["work/runs/best.pt", "work/plots"]
    assert JobSpec(kind=COMMAND, backend="local", command=["true"],
                   outputs=outs).output_paths() == ["work/runs/best.pt", "work/plots"]
    assert JobSpec(kind=COMMAND, backend="local", command=["true"]).output_paths() == []


def test_reading_jobs_loads_none_of_the_instances_code():
    """`status` and `status JOB` (polled by scripts and by every waiting test) imported the
    whole instance side (host/bootstrap.py and what it ships: the stager, Auto Scaling,
    regroup) through kept -> collect -> scripts, for one helper on the spec: 0.3 to 0.4 s of
    each call's 0.8 s here."""
    code = ("import sys; import cloudtrain.lifecycle.kept, cloudtrain.lifecycle.inspect, "
            "cloudtrain.lifecycle.watch; "
            "print(sorted(m for m in sys.modules if m in ('cloudtrain.host.bootstrap', "
            "'cloudtrain.lifecycle.scripts')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert out.strip() == "[]"


# The flat keys every version has stored (state.db's jobs.spec, `status --json`'s "spec").
STORED_KEYS = {
    "kind", "backend", "name", "recipe", "profile", "args", "command", "workdir",
    "max_runtime_s", "budget_usd", "deadline_at", "resources", "requires", "resume_from", "procs", "gpus_needed",
    "gpus_exact", "nodes", "instance_type", "market", "region", "ami", "disk_gb", "max_price",
    "cpu_only", "alternatives", "reservation", "block_fee", "keep", "idle_minutes", "on_job", "kept", "expected", "target", "include",
    "datasets", "staging", "disk_mbps", "staging_allowance_s", "local_disk", "recover",
    "max_restarts", "fallback", "setup", "envs", "secrets", "outputs"}


def test_placement_recovery_and_data_are_typed_parts_of_the_spec():
    """issue 35: the spec holds where it runs, how it recovers and its data as three frozen
    parts, read as spec.placement.region, spec.recovery.max_restarts, spec.data.datasets;
    the flat names are gone from JobSpec itself."""
    spec = JobSpec.of(kind=COMMAND, backend="aws", command=["true"], instance_type="g5.xlarge",
                      market=Market.SPOT, region="us-west-2", recover=True, max_restarts=5,
                      datasets=[{"name": "cifar10"}], disk_mbps=1000)
    assert spec.placement == Placement(instance_type="g5.xlarge", market=Market.SPOT,
                                       region="us-west-2")
    assert spec.recovery == Recovery(recover=True, max_restarts=5)
    assert spec.data == Data(datasets=[{"name": "cifar10"}], disk_mbps=1000)
    for flat in PART_OF:
        assert not hasattr(spec, flat), flat
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.placement.region = "eu-west-1"  # type: ignore[misc]
    assert JobSpec(kind=COMMAND, backend="local").placement == Placement()


def test_changed_changes_one_field_of_a_part_and_keeps_the_rest():
    spec = JobSpec.of(kind=COMMAND, backend="aws", instance_type="g5.xlarge", max_price=0.5,
                      recover=True, max_restarts=2)
    there = spec.changed(region="us-east-1", market=Market.ON_DEMAND, max_price=None,
                         keep=True)
    assert there.placement == Placement(instance_type="g5.xlarge", region="us-east-1")
    assert there.recovery is spec.recovery and there.keep and not spec.keep
    assert spec.placement.max_price == 0.5 and spec.placement.region is None
    with pytest.raises(TypeError, match="placement given both"):
        JobSpec.of(kind=COMMAND, backend="aws", placement=Placement(), region="us-east-1")


def test_the_stored_spec_stays_flat_and_older_rows_load_into_the_parts():
    """to_dict() is what state.db keeps and `status --json` prints: the same flat keys as
    before the parts, so scripts and jobs stored by older versions read as they did."""
    spec = JobSpec.of(kind=RECIPE, backend="aws", recipe="resnet9", instance_type="p3.2xlarge",
                      market=Market.SPOT, recover=True, fallback="on-demand",
                      staging={"cifar10": {"bytes": 1}}, staging_allowance_s=60.0)
    stored = json.loads(json.dumps(spec.to_dict()))
    assert set(stored) == STORED_KEYS
    assert (stored["instance_type"], stored["market"], stored["recover"],
            stored["fallback"], stored["staging_allowance_s"]) == \
        ("p3.2xlarge", "spot", True, "on-demand", 60.0)
    assert JobSpec.from_dict(stored) == spec
    # a row written before the parts (and with per-attempt facts it no longer keeps), one
    # damaged by hand: each value of the wrong JSON type reads as its default
    old = {"kind": "command", "backend": "aws", "command": ["true"], "region": "eu-west-1",
           "max_restarts": 7, "datasets": [{"name": "d"}], "attempt": 3, "market": "bogus",
           "disk_gb": "big", "recover": "yes"}
    got = JobSpec.from_dict(old)
    assert got.placement == Placement(region="eu-west-1")
    assert got.recovery == Recovery(max_restarts=7)
    assert got.data == Data(datasets=[{"name": "d"}])
    # each loaded spec has parts of its own (no default shared between rows)
    other = JobSpec.from_dict({"kind": "command", "backend": "aws"})
    assert other.data.datasets == [] and other.data.datasets is not \
        JobSpec.from_dict({"kind": "command", "backend": "aws"}).data.datasets


def test_RG5_a_stored_spec_keeps_where_its_copies_went_and_older_rows_had_no_word():
    """RG5: preflight's word on the disk the copies go onto (the local NVMe or the root
    volume, and why) is kept with the job; a row from before it loads with none."""
    nvme = {"used": True, "path": "/opt/dlami/nvme", "dir": "/opt/dlami/nvme/cloudtrain/data",
            "disks": 1, "gb": 250.0, "need_gb": 161}
    spec = JobSpec.of(kind=COMMAND, backend="aws", command=["true"], local_disk=nvme)
    assert spec.data.local_disk == nvme
    stored = json.loads(json.dumps(spec.to_dict()))
    assert stored["local_disk"] == nvme and JobSpec.from_dict(stored) == spec
    assert JobSpec.from_dict({"kind": "command", "backend": "aws"}).data.local_disk is None
    assert JobSpec.from_dict({"kind": "command", "backend": "aws",
                              "local_disk": "nvme"}).data.local_disk is None
