"""The README's first command, as a test: ResNet9's smoke profile through the real CLI."""

from __future__ import annotations

import json

import pytest

from labs.polling import wait_for

pytest.importorskip("torch")


def test_resnet9_smoke_job_then_resume(cli, ct_home):
    proc = cli("launch", "--recipe", "resnet9", "--profile", "smoke", "--follow", "--quiet",
               timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.splitlines()[0]
    assert proc.stdout.splitlines()[1].startswith("resnet9: starting")
    job = cli.job(job_id)
    assert job["state"] == "succeeded"
    assert job["metrics"]["epoch"] == 3 and job["metrics"]["epochs"] == 3
    jobdir = ct_home / "jobs" / job_id
    rows = [json.loads(line) for line in (jobdir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in rows if "event" not in r]
    assert [r["epoch"] for r in epochs] == [1, 2, 3]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert (jobdir / "checkpoints" / "last.pt").exists()
    # The dataset went to the shared data dir, not into the job.
    assert any((ct_home / "data").iterdir())
    row = [line for line in cli.ok("status").stdout.splitlines() if job_id in line][0]
    assert "resnet9 (smoke)" in row and "3/3" in row and "succeeded" in row



def _epochs_done(jobdir) -> int:
    """The last epoch in the job's metrics.jsonl so far (whole lines only: it is being
    written)."""
    try:
        text = (jobdir / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return 0
    rows = [json.loads(line) for line in text.split("\n")[:-1] if line]
    return max([r.get("epoch", 0) for r in rows if "event" not in r], default=0)


def test_resnet9_cancelled_mid_training_resumes_where_it_stopped(cli, ct_home):
    sets = ["--set", "epochs=4", "--set", "synthetic_train=2048"]
    job_id = cli.launch("--recipe", "resnet9", "--profile", "smoke", *sets)
    # The first epoch's row, read from the job dir here: a `status` process every 0.1 s
    # would take the CPU the training needs (what status says is checked after the stop).
    wait_for(lambda: _epochs_done(ct_home / "jobs" / job_id) >= 1, timeout=120,
             what="first epoch")
    cli.ok("down", job_id)
    stopped = cli.job(job_id)
    assert stopped["state"] == "cancelled"
    assert stopped["exit_code"] == 143  # the recipe saved a checkpoint on SIGTERM, then left
    done = stopped["metrics"]["epoch"]
    assert done < 4

    proc = cli("launch", "--recipe", "resnet9", "--profile", "smoke", *sets,
               "--resume-from", job_id, "--follow", "--quiet", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resuming from" in proc.stdout
    resumed = cli.job(proc.stdout.splitlines()[0])
    assert resumed["metrics"]["epoch"] == 4
    rows = [json.loads(line) for line in
            (ct_home / "jobs" / resumed["id"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if "event" not in r][0] >= done


def test_resnet9_apple_variant_on_two_processes_under_torchrun(cli, ct_home):
    """gpus=2 with --procs 2 on a host without GPUs: the orchestrator starts torchrun with two
    gloo ranks; the recipe runs Apple's variant on two strided shards."""
    proc = cli("launch", "--recipe", "resnet9", "--profile", "smoke", "--set", "gpus=2",
               "--procs", "2", "--follow", "--quiet", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.splitlines()[0]
    assert proc.stdout.count("resnet9: starting (variant=apple-8gpu, gpus=2") == 1  # rank 0 only
    assert "train=512 (256 per GPU)" in proc.stdout and "batch=32 per GPU x 2 = 64" in proc.stdout
    job = cli.job(job_id)
    assert job["state"] == "succeeded" and job["metrics"]["epoch"] == 3
    rows = [json.loads(line) for line in
            (ct_home / "jobs" / job_id / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in rows if "event" not in r]
    assert [(r["epoch"], r["step"]) for r in epochs] == [(1, 8), (2, 16), (3, 24)]  # 8 of 2 x 32
    assert epochs[-1]["lr"] == pytest.approx(0.15)  # apple-8gpu's floor, on the global mean loss


def test_d17_an_offline_cifar10_download_is_one_line_not_a_traceback(cli, ct_home):
    """D17: the full recipe with no way to fetch CIFAR-10 (the mirror is a local port where
    nothing listens) fails with one line that says why and what to do instead."""
    pytest.importorskip("torchvision")
    unreachable = {"CLOUDTRAIN_CIFAR10_URL": "http://127.0.0.1:9/cifar-10-python.tar.gz"}
    proc = cli("launch", "--recipe", "resnet9", "--set", "device=cpu", "--follow", "--quiet",
               env=unreachable, timeout=300)
    assert proc.returncode != 0
    job_id = proc.stdout.splitlines()[0]
    job = cli.job(job_id)
    assert job["state"] == "failed" and job["exit_code"] == 1
    line = (f"could not download CIFAR-10: connection refused; use --set data=synthetic to run "
            f"on generated data, or put cifar-10-python.tar.gz (or its cifar-10-batches-py/ "
            f"folder) in {ct_home / 'data'}")
    log = (ct_home / "jobs" / job_id / "output.log").read_text()
    assert line in log.splitlines(), log
    assert line in proc.stdout + proc.stderr
    assert "Traceback" not in log and "Traceback" not in proc.stdout + proc.stderr
