"""Multi-process recipes: a `launcher: torchrun` recipe starts one process per GPU on its host
(here `--procs 2`, gloo on the CPU), every rank gets the job's environment, `down` reaches
every rank, and a recipe set up for N GPUs refuses a host that cannot run N processes.

The toy recipe is a real torch.distributed program: it all-reduces its rank numbers, so the
test fails unless both processes really joined one process group.
"""
import json
import os
import time
from pathlib import Path

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from labs.polling import wait_for

DIST_RECIPE = """\
name: dist
description: all-reduce over the ranks torchrun starts
entry: train.py
requires: [torch]
arguments:
  gpus: {type: int, default: null, help: "ranks the arguments are set up for (null: any)"}
  seconds: {type: float, default: 0, help: "stay alive this long after the all-reduce"}
  stubborn: {type: bool, default: false, help: "ignore SIGTERM (be killed after the grace)"}
resources: {gpus_per_node: 1, launcher: torchrun}
"""

DIST_TRAIN = """\
import json, os, signal, sys, time
import torch
import torch.distributed as td

seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 0
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
stopped = []
if "--stubborn" in sys.argv and sys.argv[sys.argv.index("--stubborn") + 1] == "true":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(f"rank{rank}.pid", "w") as f:
        f.write(str(os.getpid()))
else:
    signal.signal(signal.SIGTERM, lambda s, f: stopped.append(s))
if world > 1:
    td.init_process_group("gloo")
t = torch.tensor([rank + 1.0])
if world > 1:
    td.all_reduce(t)
print(f"rank {rank}/{world}: sum {t.item():g}", flush=True)
deadline = time.time() + seconds
while time.time() < deadline and not stopped:
    time.sleep(0.05)
with open(f"rank{rank}.json", "w") as f:
    json.dump({"rank": rank, "world": world, "sum": t.item(), "stopped": bool(stopped),
               "procs": os.environ.get("CLOUDTRAIN_PROCS"),
               "job": os.environ.get("CLOUDTRAIN_JOB_ID")}, f)
if world > 1 and not stopped:
    td.destroy_process_group()  # gloo aborts at exit ("terminate called ...") without it
sys.exit(143 if stopped else 0)
"""


@pytest.fixture
def dist_recipe(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "recipes"
    (root / "dist").mkdir(parents=True)
    (root / "dist" / "recipe.yaml").write_text(DIST_RECIPE)
    (root / "dist" / "train.py").write_text(DIST_TRAIN)
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(root))
    return root


def _jobdir(cli, job_id) -> Path:
    return Path(cli.job(job_id)["jobdir"])


def test_procs_2_runs_two_ranks_in_one_process_group(cli, dist_recipe):
    job_id = cli.launch("--recipe", "dist", "--set", "gpus=2", "--procs", "2")
    job = cli.wait(job_id, timeout=90)
    jobdir = _jobdir(cli, job_id)
    assert job["state"] == "succeeded", (jobdir / "output.log").read_text()
    run_sh = (jobdir / "run.sh").read_text()
    assert "-m torch.distributed.run --standalone --nproc_per_node=2" in run_sh
    ranks = [json.loads((jobdir / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3.0 for r in ranks)  # 1 + 2: both joined
    assert all(r["procs"] == "2" and r["job"] == job_id for r in ranks)
    log = (jobdir / "output.log").read_text()
    assert "rank 0/2: sum 3" in log and "rank 1/2: sum 3" in log
    running = [p for p in cli.job(job_id)["timeline"] if p["name"] == "running"]
    assert running and running[0].get("detail") == "2 processes under torchrun"


def test_without_gpus_a_torchrun_recipe_runs_one_plain_process(cli, dist_recipe):
    job_id = cli.launch("--recipe", "dist")
    assert cli.wait(job_id, timeout=60)["state"] == "succeeded"
    jobdir = _jobdir(cli, job_id)
    assert "torch.distributed.run" not in (jobdir / "run.sh").read_text()
    assert json.loads((jobdir / "rank0.json").read_text())["world"] == 1
    assert not (jobdir / "rank1.json").exists()


def test_down_reaches_every_rank(cli, dist_recipe):
    job_id = cli.launch("--recipe", "dist", "--set", "gpus=2", "--set", "seconds=60",
                        "--procs", "2")
    jobdir = _jobdir(cli, job_id)
    wait_for(lambda: "rank 1/2" in (jobdir / "output.log").read_text()
             and "rank 0/2" in (jobdir / "output.log").read_text(),
             timeout=60, what="both ranks running")
    started = time.monotonic()
    cli.ok("down", job_id)
    assert cli.wait(job_id, timeout=30)["state"] == "cancelled"
    assert time.monotonic() - started < 20  # stopped by SIGTERM, not by the 60 s sleep
    for r in (0, 1):
        result = json.loads((jobdir / f"rank{r}.json").read_text())
        assert result["stopped"], f"rank {r} never saw SIGTERM"


def test_ranks_that_ignore_sigterm_are_killed_after_the_grace_not_orphaned(cli, dist_recipe):
    """torchrun starts every rank in a session of its own, so killing the job's process
    group alone would leave them running: the agent kills every process below it."""
    job_id = cli.launch("--recipe", "dist", "--set", "gpus=2", "--set", "seconds=120",
                        "--set", "stubborn=true", "--procs", "2")
    jobdir = _jobdir(cli, job_id)
    wait_for(lambda: (jobdir / "rank0.pid").exists() and (jobdir / "rank1.pid").exists(),
             timeout=60, what="both ranks running")
    pids = [int((jobdir / f"rank{r}.pid").read_text()) for r in (0, 1)]
    cli.ok("down", job_id, "--grace", "1")
    assert cli.wait(job_id, timeout=30)["state"] == "cancelled"

    def gone(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True
    wait_for(lambda: all(gone(p) for p in pids), timeout=15, what="ranks killed")


def test_a_recipe_set_up_for_more_gpus_than_the_host_runs_is_refused(cli, dist_recipe):
    proc = cli("launch", "--recipe", "dist", "--set", "gpus=4")
    assert proc.returncode == 2
    assert "with gpus=4 runs one process per GPU on 4 GPUs, but this host has 0 GPU(s)" \
        in proc.stderr
    assert "--procs 4" in proc.stderr
    job = cli.ok("status", "--json").stdout
    assert json.loads(job)[0]["state"] == "failed"  # recorded, and nothing left running


def test_a_recipe_set_up_for_fewer_gpus_than_the_host_has_runs_that_many(cli, dist_recipe, aws):
    """gpus=2 on a 4-GPU type: 2 ranks, as the arguments say (not 4 that would all fail)."""
    proc = cli("launch", "--recipe", "dist", "--set", "gpus=2", "--instance", "g5.12xlarge",
               "--follow", "--quiet", timeout=180)
    job_id = proc.stdout.splitlines()[0]
    assert proc.returncode == 0, cli("logs", job_id).stdout + proc.stderr
    assert "rank 1/2: sum 3" in proc.stdout and "/4" not in proc.stdout


def test_procs_must_match_the_recipes_gpus(cli, dist_recipe):
    proc = cli("launch", "--recipe", "dist", "--set", "gpus=2", "--procs", "3")
    assert proc.returncode == 2
    assert "with gpus=2 needs 2 processes, not --procs 3" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (("--procs", "0", "--", "true"), "--procs must be between 1 and 1024"),
    (("--procs", "2", "--", "true"), "--procs applies to recipes started under torchrun"),
])
def test_procs_errors(cli, args, message):
    proc = cli("launch", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_procs_on_a_single_process_recipe_is_refused(cli, toy_recipes):
    proc = cli("launch", "--recipe", "toy", "--procs", "2")
    assert proc.returncode == 2 and "recipe toy runs as one process" in proc.stderr


def test_cloud_placement_follows_the_recipes_gpus(cli, dist_recipe):
    """No --instance: a recipe set up for 8 GPUs gets the cheapest type with 8 of its GPU
    (none named: A100, which every current Deep Learning AMI runs, not p3's V100: RA2); an
    instance with too few GPUs is refused before anything is created."""
    plan = cli.ok("launch", "--recipe", "dist", "--set", "gpus=8", "--backend", "aws",
                  "--region", "us-east-1", "--dry-run").stdout
    assert "p4d.24xlarge: 8x A100" in plan
    assert "processes" in plan and "8 (torchrun, one per GPU)" in plan
    proc = cli("launch", "--recipe", "dist", "--set", "gpus=8", "--instance", "g5.xlarge",
               "--dry-run")
    assert proc.returncode == 2
    assert "needs 8 GPUs on one host; g5.xlarge has 1" in proc.stderr
    assert "--gpus A100:8" in proc.stderr
    assert os.environ.get("AWS_EC2_METADATA_DISABLED") == "true"


def test_on_aws_the_process_count_comes_from_the_instance_type(cli, dist_recipe, aws):
    """g5.12xlarge has 4 A10Gs: torchrun starts 4 ranks (on the lab's CPU-only host, whose
    nvidia-smi sees nothing: the type, not the driver, decides), and they all join."""
    proc = cli("launch", "--recipe", "dist", "--instance", "g5.12xlarge", "--follow", "--quiet",
               timeout=180)
    job_id = proc.stdout.splitlines()[0]
    assert proc.returncode == 0, cli("logs", job_id).stdout + proc.stderr
    out = proc.stdout
    assert all(f"rank {r}/4: sum 10" in out for r in range(4)), out  # 1+2+3+4


def test_a_variants_gpu_count_is_the_default_that_procs_may_override(cli, tmp_path, monkeypatch):
    root = tmp_path / "recipes"
    (root / "dp").mkdir(parents=True)
    (root / "dp" / "recipe.yaml").write_text(
        "name: dp\ndescription: data-parallel\nentry: train.py\n"
        "arguments:\n  variant: {type: choice, choices: [eight, one], default: eight}\n"
        "resources: {gpu: L4, launcher: torchrun, gpus_per_variant: {eight: 8, one: 1}}\n")
    (root / "dp" / "train.py").write_text(DIST_TRAIN)
    monkeypatch.setenv("CLOUDTRAIN_RECIPES", str(root))
    proc = cli("launch", "--recipe", "dp")
    assert proc.returncode == 2
    assert "variant eight runs one process per GPU on 8 GPUs, but this host has 0" in proc.stderr
    assert "--procs N" in proc.stderr
    job_id = cli.launch("--recipe", "dp", "--procs", "2")  # a default, not a requirement
    assert cli.wait(job_id, timeout=90)["state"] == "succeeded"
    assert "--nproc_per_node=2" in (_jobdir(cli, job_id) / "run.sh").read_text()
    job_id = cli.launch("--recipe", "dp", "--set", "variant=one")
    assert cli.wait(job_id, timeout=60)["state"] == "succeeded"


def test_resnet9_on_two_gpus_runs_under_torchrun_through_the_aws_path(cli, aws):
    """The real recipe, Apple's multi-GPU form at gpus=2, on a 4-GPU type: two ranks (gloo on
    the lab's CPU), one process group, rank 0's metrics and checkpoint come home."""
    proc = cli("launch", "--recipe", "resnet9", "--profile", "smoke", "--set", "gpus=2",
               "--instance", "g5.12xlarge", "--follow", "--quiet", timeout=300)
    job_id = proc.stdout.splitlines()[0]
    assert proc.returncode == 0, cli("logs", job_id).stdout[-3000:] + proc.stderr
    job = cli.job(job_id)
    assert job["metrics"]["epoch"] == 3
    run_sh = (aws.home / "jobs" / job_id / "run.sh").read_text()
    assert "--nproc_per_node=2" in run_sh and "--gpus 2" in run_sh
    assert (aws.home / "jobs" / job_id / "checkpoints" / "last.pt").exists()
