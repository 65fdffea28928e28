"""recipes/resnet9/train.py with several processes: Apple's 8-GPU variant as gloo ranks on the
CPU (spec sections 1C and 5, "Distributed on CPU").

Two ranks (gpus=2), started either by torchrun (`python -m torch.distributed.run --standalone
--nproc_per_node=2`, as the orchestrator does) or by hand with torchrun's environment
(RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), in one process group of
their own so that a signal can go to the group. Checked: identical initial weights on every
rank despite different per-rank seeds; one distributed step equals the single-process step on
the whole batch; a run stopped (by --stop-at-step, or SIGUSR1 to the process group) and
resumed ends with exactly the weights of an uninterrupted run.
"""
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import import_recipe_file

REPO = Path(__file__).resolve().parents[2]
TRAIN_PY = REPO / "recipes" / "resnet9" / "train.py"


train = import_recipe_file("resnet9", "train.py", "resnet9_train_dist")
APPLE = train.HYP["apple-8gpu"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def _spawn(argv: list, n: int, logs: Path, stdout0=subprocess.DEVNULL) -> list:
    """n ranks with torchrun's environment, all in one new process group (rank 0's pid)."""
    port, procs = _free_port(), []
    logs.mkdir(parents=True, exist_ok=True)
    for rank in range(n):
        env = _env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(
            [sys.executable, *argv], env=env, cwd=REPO, text=True,
            stdout=stdout0 if rank == 0 else subprocess.DEVNULL,
            stderr=open(logs / f"rank{rank}.err", "w"),
            process_group=0 if rank == 0 else procs[0].pid))
    return procs


def _wait(procs, logs: Path, timeout=120) -> list:
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return codes


def _errors(logs: Path) -> str:
    return "".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(logs.glob("*.err")))


# ---------------------------------------------------------------------------------------------
# One step: 2 ranks x B images == 1 process x 2B images

WORKER = r'''
import importlib.util, sys
import torch
spec = importlib.util.spec_from_file_location("resnet9_train", sys.argv[1])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
B, S, SEED = 32, 4, 100        # per-rank batch, ghost splits per rank, the run's seed
world = train.distributed.setup("cpu")
hyp = train.HYP["apple-8gpu"]
gen = torch.Generator().manual_seed(1234)   # the same data and filters on every rank
filters = 0.3 * torch.randn(27, 3, 3, 3, generator=gen)
x = torch.randn(2 * B, 3, 32, 32, generator=gen)
y = torch.randint(0, 10, (2 * B,), generator=gen)
torch.manual_seed(SEED + world.rank)        # what init_model builds before its broadcast
own = {k: v.clone() for k, v in train.build_model("apple-8gpu", 16, S).state_dict().items()}
model = train.init_model("apple-8gpu", 16, S, SEED, world, torch.device("cpu"), filters)
init = {k: v.clone() for k, v in model.state_dict().items()}
opt = train.NesterovSGD(train.param_groups(model, hyp, B), hyp["momentum"])
xb, yb = x[world.rank * B:(world.rank + 1) * B], y[world.rank * B:(world.rank + 1) * B]
for step in (30, 90):                       # two lrs: the momentum buffer matters in step 2
    lr = train.lr_at(step, 24, hyp, 18, B)
    train.train_step(model, opt, xb, yb, lr, hyp["label_smoothing"], world)
torch.save({"own": own, "init": init, "after": dict(model.named_parameters()),
            "x": x, "y": y, "filters": filters}, f"{sys.argv[2]}/rank{world.rank}.pt")
world.close()
'''


def _reference_step(init: dict, x, y, order, splits: int, batch: int):
    """Single process: the same two updates on the batch x[order] of `batch` images."""
    model = train.build_model("apple-8gpu", 16, splits)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(init[k])
    opt = train.NesterovSGD(train.param_groups(model, APPLE, batch), APPLE["momentum"])
    for step in (30, 90):
        lr = train.lr_at(step, 24, APPLE, 18, batch)
        train.train_step(model, opt, x[order], y[order], lr, APPLE["label_smoothing"])
    return {k: p.detach() for k, p in params.items()}


@pytest.mark.slow(seconds=45)
def test_initial_weights_and_one_distributed_step(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    procs = _spawn([str(worker), str(TRAIN_PY), str(tmp_path)], 2, tmp_path / "logs")
    assert _wait(procs, tmp_path / "logs") == [0, 0], _errors(tmp_path / "logs")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))

    # Different seeds build different weights; after the broadcast every rank has rank 0's.
    assert not torch.equal(r0["own"]["layer1.0.conv.weight"], r1["own"]["layer1.0.conv.weight"])
    for k, v in r0["init"].items():
        assert torch.equal(v, r1["init"][k]), k
        if k != "whiten.weight":
            assert torch.equal(v, r0["own"][k]), k
    assert torch.equal(r0["init"]["whiten.weight"], r0["filters"])
    # After two updates the ranks still agree exactly (the all-reduce gives both the same sum).
    for k, v in r0["after"].items():
        assert torch.equal(v, r1["after"][k]), k

    # The single-process equivalent: batch 2B with lr/(2B) and wd*2B on the summed loss; and
    # 2S ghost batches, ordered so that each is exactly one rank's ghost batch. GhostBN puts
    # image i of a batch in ghost batch i % splits, so interleaving the ranks' images in
    # blocks of S (rank 0's 0..S-1, rank 1's 0..S-1, rank 0's S..2S-1, ...) gives ghost batch
    # t < S = rank 0's ghost batch t and ghost batch S + t = rank 1's ghost batch t.
    B, S = 32, 4
    blocks = torch.arange(2 * B).view(2, B // S, S).transpose(0, 1).reshape(-1)
    assert sorted(blocks.tolist()) == list(range(2 * B)) and blocks[:2 * S].tolist() == \
        [0, 1, 2, 3, 32, 33, 34, 35]
    ref = _reference_step(r0["init"], r0["x"], r0["y"], blocks, 2 * S, 2 * B)
    moved = 0.0
    for k, v in r0["after"].items():
        # float32: the all-reduce adds two half-batch gradients where the reference sums all
        # 64 images in one backward, so the two differ by rounding only.
        assert torch.allclose(v, ref[k], rtol=1e-4, atol=1e-5), (k, (v - ref[k]).abs().max())
        moved = max(moved, (v - r0["init"][k]).abs().max().item())
    assert moved > 1e-2  # the steps did move the weights, by far more than the tolerance

    # The check can fail: the plain concatenation regroups the ghost batches, and summing the
    # ranks' gradients without averaging is a different (doubled) step.
    wrong_ghosts = _reference_step(r0["init"], r0["x"], r0["y"], torch.arange(2 * B), 2 * S,
                                   2 * B)
    doubled = _reference_step(r0["init"], r0["x"], r0["y"], blocks, 2 * S, B)
    for other in (wrong_ghosts, doubled):
        assert not all(torch.allclose(v, other[k], rtol=1e-4, atol=1e-5)
                       for k, v in r0["after"].items())


# ---------------------------------------------------------------------------------------------
# Whole runs: stopped and resumed == uninterrupted, bit for bit

RUN = ["--gpus", "2", "--device", "cpu", "--data", "synthetic", "--synthetic_train", "512",
       "--synthetic_test", "64", "--width_div", "16", "--ghost_splits", "4", "--batch_size",
       "64", "--epochs", "5"]  # apple-8gpu, 256 images per rank: 4 steps per epoch, 20 in all


def _argv(tmp_path, job, *extra):
    return [str(TRAIN_PY), *RUN, "--job-dir", str(tmp_path / job), "--data-dir",
            str(tmp_path / "data"), *extra]


def _torchrun(tmp_path, job, *extra):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", *_argv(tmp_path, job, *extra)],
                          env=_env(), cwd=REPO, capture_output=True, text=True, timeout=180)
    return proc


def _ckpt(tmp_path, job):
    return torch.load(tmp_path / job / "checkpoints" / "last.pt", weights_only=True)


def _epoch_rows(tmp_path, job):
    return [r for r in train.metrics.read_metrics(tmp_path / job / "metrics.jsonl")
            if "event" not in r]


def _assert_same_run(tmp_path, job, reference):
    resumed = _ckpt(tmp_path, job)
    assert resumed["step"] == 20 and resumed["epoch"] == 5 and resumed["world_size"] == 2
    for k, v in reference["model"].items():
        assert torch.equal(v, resumed["model"][k]), (job, k)
    for a, b in zip(reference["optimizer"]["velocity"], resumed["optimizer"]["velocity"]):
        assert all(torch.equal(u, w) for u, w in zip(a, b)), job
    keys = ("epoch", "step", "lr", "train_loss", "train_acc", "test_acc")
    assert [tuple(r[k] for k in keys) for r in _epoch_rows(tmp_path, job)] == \
        [tuple(r[k] for k in keys) for r in _epoch_rows(tmp_path, "straight")], job


@pytest.mark.slow(seconds=60)
def test_two_process_run_stopped_and_resumed_is_bit_for_bit(tmp_path):
    # The reference, started as the orchestrator starts it.
    proc = _torchrun(tmp_path, "straight")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("resnet9: starting (variant=apple-8gpu, gpus=2") == 1  # rank 0
    assert "batch=64 per GPU x 2 = 128 steps/epoch=4" in proc.stdout
    reference = _ckpt(tmp_path, "straight")
    assert reference["step"] == 20 and len(reference["ranks"]) == 2
    assert not torch.equal(reference["ranks"][0]["rng"]["torch"],
                           reference["ranks"][1]["rng"]["torch"])  # per-rank states, both kept

    # Stopped mid-epoch by the testing aid: both ranks stop at the same step and exit 143.
    logs = tmp_path / "logs-stop"
    procs = _spawn(_argv(tmp_path, "stopped", "--stop-at-step", "6"), 2, logs)
    assert _wait(procs, logs) == [143, 143], _errors(logs)
    stopped = _ckpt(tmp_path, "stopped")
    assert stopped["step"] == 6 and stopped["epoch"] == 1 and len(stopped["ranks"]) == 2
    assert all(r["partial"]["seen"] == 2 * 64 for r in stopped["ranks"])  # 2 steps of epoch 2
    logs = tmp_path / "logs-resume"
    procs = _spawn(_argv(tmp_path, "stopped", "--resume", "true"), 2, logs)
    assert _wait(procs, logs) == [0, 0], _errors(logs)
    _assert_same_run(tmp_path, "stopped", reference)

    # SIGUSR1 to the process group once rank 0 has finished epoch 1, then resumed by torchrun.
    logs = tmp_path / "logs-usr1"
    procs = _spawn(_argv(tmp_path, "signalled"), 2, logs, stdout0=subprocess.PIPE)
    try:
        for line in procs[0].stdout:
            if line.startswith("           1 "):
                break
        os.killpg(procs[0].pid, signal.SIGUSR1)
        out = procs[0].stdout.read()
    finally:
        codes = _wait(procs, logs)
    assert codes == [143, 143], out + _errors(logs)
    assert "stopped" in out and "checkpoint saved" in out
    errors = _errors(logs)
    assert errors.count("SIGUSR1 received") == 2, errors  # each rank got it
    signalled = _ckpt(tmp_path, "signalled")
    assert 4 <= signalled["step"] < 20, signalled["step"]
    proc = _torchrun(tmp_path, "signalled", "--resume", "true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"resuming from run 0, epoch {signalled['epoch']} (step {signalled['step']})" \
        in proc.stdout
    _assert_same_run(tmp_path, "signalled", reference)
