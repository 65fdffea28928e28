"""recipes/wide-resnet34/train.py: the facts of spec section 2 (fast.ai CIFAR), checked on the CPU.

The CircularLR_beta schedule at named iterations, WRN-22-6's parameter count and block wiring,
the fp32-master-weight optimiser, the augmentation invariants, data-parallel training with gloo
on 2 local processes, and training end to end: the smoke profile as the orchestrator runs it,
resume (1 and 2 processes), SIGUSR1, --runs.

Every test, and every process it starts, runs torch on one thread: on a shared 2-core machine
two OpenMP threads that wait for each other made a tiny training step 10 to 30 times slower.
"""
import math
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import import_recipe_file, recipe_command, recipe_job_dir, resume_refusals
import torch
import torch.nn.functional as F
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "wide-resnet34"


train = import_recipe_file("wide-resnet34", "train.py", "wide_resnet34_train")
CLR_8GPU, CLR_1GPU = train.HYP["8gpu"]["clr"], train.HYP["1gpu"]["clr"]


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    pass


# ---------------------------------------------------------------------------------------------
# Schedule

def test_circular_lr_beta_spec_case_nb100_div50_pct12_5():
    nb, div, pct = 100, 50, 12.5
    lr = [train.clr_beta_lr(i, nb, 1.0, div, pct) for i in range(nb + 1)]
    assert train.cycle_nb(nb, pct) == 43                  # int(100 * 0.875 / 2)
    assert lr[0] == 1 / 50                                # starts at lr/div
    assert lr[43] == 1.0 and max(lr) == 1.0 and lr.index(1.0) == 43   # the peak, exactly
    assert lr[86] == 1 / 50                               # back to lr/div at 2 * 43
    for i in range(44):                                   # linear up, mirrored down
        assert lr[i] == pytest.approx((1 + i / 43 * 49) / 50, rel=1e-12)
        assert lr[86 - i] == pytest.approx(lr[i], rel=1e-12)
    anneal = lr[86:]
    assert anneal == sorted(anneal, reverse=True) and len(set(anneal)) == len(anneal)
    assert lr[99] == pytest.approx((1 - 13 / 14 * 0.99) / 50)     # the last trained iteration
    assert lr[100] == pytest.approx(1 / 5000) and min(lr[:100]) > 1 / 5000  # approached only
    assert train.clr_beta_lr(43, nb, 2.0, div, pct) == 2.0      # scales with the peak lr


def test_circular_lr_beta_momentum_cycle_and_its_one_step_lead():
    nb, pct = 100, 12.5
    mom = [train.clr_beta_mom(i, nb, pct, 0.95, 0.85) for i in range(nb + 1)]
    assert mom[0] == 0.95 and mom[43] == pytest.approx(0.85) and min(mom) == mom[43]
    assert mom[86] == pytest.approx(0.95) and all(m == 0.95 for m in mom[87:])
    assert mom[20] == pytest.approx(0.95 - 20 / 43 * 0.1)
    assert mom[60] == pytest.approx(0.85 + 17 / 43 * 0.1)
    # FA sets the momentum from the counter its lr computation already advanced: batch i
    # trains with lr(i) and momentum(i + 1); the last batch's counter wraps to 0.
    assert train.schedule(0, nb, 1.0, (50, pct, 0.95, 0.85)) == (1 / 50, mom[1])
    assert train.schedule(42, nb, 1.0, (50, pct, 0.95, 0.85))[1] == mom[43]
    assert train.schedule(99, nb, 1.0, (50, pct, 0.95, 0.85)) == (
        train.clr_beta_lr(99, nb, 1.0, 50, pct), 0.95)


def _defaults(*argv):
    return train.build_parser().parse_args(list(argv))


def test_8gpu_schedule_knots_in_steps_at_1024_global_batch():
    hyp = train.resolve_hyp(_defaults())
    assert (hyp["batch_size"], hyp["epochs"], hyp["lr"], hyp["wd"]) == (128, 40, 2.0, 2e-4)
    assert hyp["clr"] == (50, 12.5, 0.95, 0.85) and hyp["gpus"] == 8
    spe = train.steps_per_epoch(50_000, 8, 128)
    assert spe == 49                        # 6,250 images a rank; the last batch (106) is kept
    nb = spe * 40
    assert nb == 1960 and train.cycle_nb(nb, 12.5) == 857
    sched = [train.schedule(s, nb, 2.0, CLR_8GPU) for s in range(nb)]
    lrs, moms = [lr for lr, _ in sched], [m for _, m in sched]
    assert lrs[0] == pytest.approx(0.04) and lrs[857] == 2.0 and lrs.index(max(lrs)) == 857
    assert lrs[1714] == pytest.approx(0.04)
    assert lrs[1959] == pytest.approx(2.0 * (1 - 245 / 246 * 0.99) / 50)  # -> 4e-4 at nb
    assert 4e-4 < lrs[1959] < 6e-4
    assert min(moms) == moms[856] == pytest.approx(0.85) and moms[1713:] == [0.95] * 247


def test_1gpu_schedule_knots_in_steps_at_batch_512():
    hyp = train.resolve_hyp(_defaults("--variant", "1gpu"))
    assert (hyp["batch_size"], hyp["epochs"], hyp["lr"], hyp["wd"]) == (512, 30, 1.5, 1e-4)
    spe = train.steps_per_epoch(50_000, 1, 512)
    nb = spe * 30
    assert spe == 98 and nb == 2940 and train.cycle_nb(nb, 20) == 1176
    lr = lambda s: train.schedule(s, nb, 1.5, CLR_1GPU)[0]  # noqa: E731
    assert lr(0) == pytest.approx(0.075) and lr(1176) == 1.5 and lr(2352) == pytest.approx(0.075)
    assert lr(2939) == pytest.approx(1.5 * (1 - 587 / 588 * 0.99) / 20)
    # Overrides replace single knobs and keep the rest of the variant.
    hyp = train.resolve_hyp(_defaults("--lr", "0.4", "--clr", "10,25,0.9,0.8"))
    assert hyp["lr"] == 0.4 and hyp["clr"] == (10, 25, 0.9, 0.8) and hyp["batch_size"] == 128


# ---------------------------------------------------------------------------------------------
# Model

def test_wrn_22_6_parameter_count_and_logits():
    args = _defaults()
    assert (args.depth, args.widen) == (22, 6)
    model = train.build_model(args.depth, args.widen)
    assert train.count_params(model) == (9_658_458, 9_658_458)         # spec section 4
    assert model.fc.in_features == 384 and model.fc.bias is not None
    with torch.no_grad():
        logits = model.eval()(torch.randn(32, 3, 32, 32))
    assert logits.shape == (32, 10) and logits.dtype == torch.float32


@pytest.mark.parametrize("depth, widen, expected", [
    (22, 6, [(0, 0, 16, 96, 1), (1, 0, 96, 192, 2), (2, 0, 192, 384, 2)]),
    (34, 6, [(0, 0, 16, 96, 1), (1, 0, 96, 192, 2), (2, 0, 192, 384, 2)]),
    (10, 1, [(1, 0, 16, 32, 2), (2, 0, 32, 64, 2)]),   # 16 -> 16: no shortcut conv
])
def test_one_by_one_shortcut_only_where_the_width_changes(depth, widen, expected):
    model = train.build_model(depth, widen)
    n = (depth - 4) // 6
    assert [len(g) for g in model.groups] == [n, n, n]
    found = []
    for g, group in enumerate(model.groups):
        for i, block in enumerate(group):
            if block.shortcut is not None:
                sc = block.shortcut
                assert sc.kernel_size == (1, 1) and sc.bias is None
                found.append((g, i, sc.in_channels, sc.out_channels, sc.stride[0]))
            else:
                assert block.conv1.in_channels == block.conv2.out_channels
    assert found == expected


def test_block_preactivates_and_the_shortcut_reads_the_preactivated_input():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 8, 8) + 1.0  # not centred: relu(bn(x)) and x differ a lot
    for c_out, stride in ((8, 1), (16, 2)):
        block = train.Block(8, c_out, stride).train()
        with torch.no_grad():
            for bn in (block.bn1, block.bn2):
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)
        a = F.relu(F.batch_norm(x, None, None, block.bn1.weight, block.bn1.bias, True))
        h = F.relu(F.batch_norm(block.conv1(a), None, None, block.bn2.weight, block.bn2.bias,
                                True))
        residual = x if c_out == 8 else block.shortcut(a)
        assert torch.allclose(block(x), block.conv2(h) + residual, atol=1e-5)
        if c_out == 16:
            assert not torch.allclose(block(x), block.conv2(h) + block.shortcut(x), atol=1e-2)


def test_initialisation_statistics():
    torch.manual_seed(0)
    model = train.build_model(22, 6)
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Conv2d) and m.weight.numel() > 20_000:
            k = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            w = m.weight.detach()
            assert w.std().item() == pytest.approx(math.sqrt(2 / k), rel=0.05), name
            assert abs(w.mean().item()) < 0.05 * math.sqrt(2 / k), name
        elif isinstance(m, torch.nn.BatchNorm2d):
            assert torch.equal(m.weight, torch.ones_like(m.weight)), name
            assert torch.equal(m.bias, torch.zeros_like(m.bias)), name
    assert torch.equal(model.fc.bias, torch.zeros(10))
    bound = 1 / math.sqrt(384)  # torch's default Linear weight init, kept by FI
    assert model.fc.weight.abs().max() <= bound and model.fc.weight.std() > 0.4 * bound
    # The 3x3 stem (3 -> 16): std sqrt(2 / (9 * 16)), from only 432 weights.
    assert model.conv1.weight.std().item() == pytest.approx(math.sqrt(2 / 144), rel=0.15)


def test_bad_depth_is_a_one_line_error():
    proc = subprocess.run([sys.executable, str(RECIPE / "train.py"), "--depth", "23"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "wide-resnet34: depth must be 6n+4 with n >= 1 (10, 16, 22, 28, 34, ...), got 23"]
    with pytest.raises(SystemExit, match="depth must be 6n\\+4"):
        train.check_args(_defaults("--depth", "4"))
    train.check_args(_defaults("--depth", "34"))  # a real 34-layer WRN is fine


# ---------------------------------------------------------------------------------------------
# Optimiser: SGD on fp32 master weights

def test_train_step_is_sgd_momentum_with_l2_on_fp32_masters():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    w0, b0 = model.weight.detach().clone(), model.bias.detach().clone()
    master = train.MasterWeights(model)
    opt = train.make_optimizer(master, {"lr": 9.9, "wd": 0.01, "clr": (50, 12.5, 0.95, 0.85)})
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    ref = [w0.clone().requires_grad_(), b0.clone().requires_grad_()]
    bufs = None
    for lr, mom, scale in ((0.5, 0.9, 512.0), (0.25, 0.8, 1.0)):  # lr and momentum move
        train.train_step(model, opt, master, x, y, lr, mom, scale)
        loss = F.cross_entropy(x @ ref[0].T + ref[1], y)
        grads = torch.autograd.grad(loss, ref)
        with torch.no_grad():
            d = [g + 0.01 * p for g, p in zip(grads, ref)]          # L2 weight decay
            bufs = d if bufs is None else [mom * b + di for b, di in zip(bufs, d)]
            for p, b in zip(ref, bufs):
                p -= lr * b
        for m, r in zip(master.params, ref):
            assert torch.allclose(m, r, atol=1e-6)
        assert torch.equal(model.weight, master.params[0]) and model.weight.grad is None


def test_fp16_model_keeps_bn_float_and_masters_follow_an_fp32_step():
    torch.manual_seed(0)
    half = train.to_half_keep_bn_float(train.build_model(10, 1))
    for name, t in list(half.named_parameters()) + list(half.named_buffers()):
        if t.is_floating_point():
            expected = torch.float32 if ".bn" in f".{name}" else torch.float16
            assert t.dtype == expected, name
    ref = train.build_model(10, 1)
    ref.load_state_dict({k: v.float() if v.is_floating_point() else v
                         for k, v in half.state_dict().items()})
    initial = [p.detach().clone() for p in ref.parameters()]
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    steps = []
    for model, xb, scale in ((half, x.half(), 512.0), (ref, x, 1.0)):
        master = train.MasterWeights(model)
        assert all(p.dtype == torch.float32 for p in master.params)
        opt = train.make_optimizer(master, train.HYP["8gpu"])
        train.train_step(model, opt, master, xb, y, 0.1, 0.9, scale)
        for p, m in zip(model.parameters(), master.params):
            assert torch.equal(p, m.to(p.dtype))   # the model is its masters, rounded
        steps.append(master.params)
    moved = [(r - r0).abs().max().item() for r, r0 in zip(steps[1], initial)]
    assert max(moved) > 1e-3  # the step did something ...
    for h, r in zip(*steps):  # ... and fp16 with loss scale 512 follows the float32 step
        assert torch.allclose(h, r, rtol=2e-2, atol=2e-3)


# ---------------------------------------------------------------------------------------------
# Data and augmentation

def test_train_transforms_are_fis_in_order():
    tfm = train.train_transforms().transforms
    names = [type(t).__name__ for t in tfm]
    assert names == ["Pad", "RandomCrop", "ColorJitter", "RandomRotation",
                     "RandomHorizontalFlip", "ToTensor", "Normalize"]
    assert tfm[0].padding == 4 and tfm[0].padding_mode == "reflect"
    assert tuple(tfm[1].size) == (32, 32) and tfm[1].padding is None
    assert tfm[2].brightness == tfm[2].contrast == tfm[2].saturation == (0.75, 1.25)
    assert tfm[2].hue is None
    assert list(tfm[3].degrees) == [-2.0, 2.0] and tfm[4].p == 0.5
    assert tuple(tfm[6].mean) == (0.4914, 0.48216, 0.44653)
    assert tuple(tfm[6].std) == (0.24703, 0.24349, 0.26159)
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    padded = np.asarray(tfm[0](Image.fromarray(image)))
    assert np.array_equal(padded, np.pad(image, ((4, 4), (4, 4), (0, 0)), mode="reflect"))
    out = train.train_transforms()(Image.fromarray(image))
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32


def test_random_crops_stay_within_the_4px_padding():
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    pad, crop = train.train_transforms().transforms[:2]
    padded = np.asarray(pad(Image.fromarray(image)))
    windows = {(dy, dx): padded[dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)}
    torch.manual_seed(0)
    seen = set()
    for _ in range(600):
        out = np.asarray(crop(pad(Image.fromarray(image))))
        assert out.shape == (32, 32, 3)
        hits = [k for k, w in windows.items() if np.array_equal(w, out)]
        assert len(hits) == 1  # a 32x32 window of the reflect-padded 40x40 image
        seen.add(hits[0])
    assert len(seen) == 81  # every offset of +-4 px is used, and none beyond


def test_augmentation_is_a_function_of_seed_epoch_and_image():
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
    ds = train.AugmentedCifar(images, np.arange(8), seed=3)
    before = torch.get_rng_state()
    a, label = ds[5]
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is untouched
    assert label == 5 and a.shape == (3, 32, 32)
    torch.manual_seed(123)  # whatever the global RNG holds
    assert torch.equal(ds[5][0], a)
    ds.epoch = 1
    assert not torch.equal(ds[5][0], a)
    ds.epoch = 0
    assert not torch.equal(train.AugmentedCifar(images, np.arange(8), seed=4)[5][0], a)
    # The test set: ToTensor + Normalize, batched, bit for bit.
    x = train.normalise(images)
    plain = train.train_transforms().transforms[5:]
    for i in range(8):
        assert torch.equal(x[i], plain[1](plain[0](Image.fromarray(images[i]))))


# ---------------------------------------------------------------------------------------------
# Two processes with gloo

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dist_worker(rank: int, port: int, out: str) -> None:
    """Rank `rank` of 2 (spawned): initial weights, shards, and two DDP steps on B=8 each."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))
    world = train.distributed.setup("cpu")
    try:
        torch.manual_seed(100 + rank)  # different on purpose: DDP must make them equal
        model = train.build_model(10, 1)
        net = train.wrap(model, world)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        shards = {n: train.distributed.epoch_indices(n, world.world_size, world.rank, seed=5, epoch=3)
                  for n in (512, 37)}
        # BatchNorm in eval mode (running stats) makes the per-rank forward independent of the
        # batch split; gradients still flow through every parameter, BN's included.
        model.eval()
        master = train.MasterWeights(model)
        opt = train.make_optimizer(master, {"lr": 1.0, "wd": 5e-4, "clr": (1, 0, 0.9, 0.9)})
        gen = torch.Generator().manual_seed(7)
        x, y = torch.randn(16, 3, 32, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        for lr, mom in ((0.3, 0.9), (0.5, 0.85)):
            train.train_step(net, opt, master, x[8 * rank:8 * rank + 8], y[8 * rank:8 * rank + 8],
                             lr, mom, 1.0)
        torch.save({"world": (world.rank, world.world_size, world.backend), "initial": initial,
                    "shards": shards, "master": [p.detach().clone() for p in master.params]},
                   Path(out) / f"rank{rank}.pt")
    finally:
        world.close()


@pytest.mark.slow(seconds=30)
def test_two_gloo_processes_weights_shards_and_one_ddp_step(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_dist_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["world"] == (0, 2, "gloo") and r1["world"] == (1, 2, "gloo")

    # Identical initial weights: rank 0's, broadcast.
    torch.manual_seed(100)
    own0 = train.build_model(10, 1).state_dict()
    torch.manual_seed(101)
    own1 = train.build_model(10, 1).state_dict()
    assert not torch.equal(own0["conv1.weight"], own1["conv1.weight"])
    for k, v in own0.items():
        assert torch.equal(r0["initial"][k], v) and torch.equal(r1["initial"][k], v), k

    # DistributedSampler shards: disjoint, covering, equal-sized, deterministic.
    a, b = r0["shards"][512], r1["shards"][512]
    assert len(a) == len(b) == 256 and not set(a) & set(b) and sorted(a + b) == list(range(512))
    assert a == train.distributed.epoch_indices(512, 2, 0, seed=5, epoch=3)
    assert a != train.distributed.epoch_indices(512, 2, 0, seed=5, epoch=4)
    a, b = r0["shards"][37], r1["shards"][37]  # 37 does not divide: torch pads one duplicate
    assert len(a) == len(b) == 19 and set(a) | set(b) == set(range(37))

    # One (two, to exercise momentum) DDP step on 2 x 8 equals one process on the 16.
    torch.manual_seed(100)
    model = train.build_model(10, 1).eval()
    master = train.MasterWeights(model)
    opt = train.make_optimizer(master, {"lr": 1.0, "wd": 5e-4, "clr": (1, 0, 0.9, 0.9)})
    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(16, 3, 32, 32, generator=gen), torch.randint(0, 10, (16,), generator=gen)
    half = train.build_model(10, 1)
    half.load_state_dict(model.state_dict())
    half.eval()
    half_master = train.MasterWeights(half)
    half_opt = train.make_optimizer(half_master, {"lr": 1.0, "wd": 5e-4,
                                                  "clr": (1, 0, 0.9, 0.9)})
    for lr, mom in ((0.3, 0.9), (0.5, 0.85)):
        train.train_step(model, opt, master, x, y, lr, mom, 1.0)
        train.train_step(half, half_opt, half_master, x[:8], y[:8], lr, mom, 1.0)
    worst = 0.0
    for d0, d1, single, only_half in zip(r0["master"], r1["master"], master.params,
                                         half_master.params):
        assert torch.equal(d0, d1)  # every rank applied the same averaged gradient
        torch.testing.assert_close(d0, single.detach(), rtol=1e-6, atol=1e-7)
        worst = max(worst, (d0 - only_half).abs().max().item())
    assert worst > 1e-3  # rank 0's half alone gives other weights: the averaging mattered


TORCHRUN_TINY = ["--data", "synthetic", "--synthetic_train", "128", "--synthetic_test", "32",
                 "--depth", "10", "--widen", "1", "--batch_size", "16", "--epochs", "2",
                 "--lr", "0.4", "--workers", "0", "--device", "cpu"]  # 4 steps a rank an epoch


def _torchrun(tmp_path, job, *extra):
    env = {**os.environ, "CLOUDTRAIN_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(RECIPE / "train.py"), *TORCHRUN_TINY,
               "--job-dir", str(tmp_path / job), *extra]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow(seconds=60)
def test_two_process_run_stopped_mid_epoch_resumes_exactly(tmp_path):
    straight = _torchrun(tmp_path, "straight")
    assert straight.returncode == 0, straight.stdout + straight.stderr
    assert "processes=2" in straight.stdout and "batch=16/process (32 global)" in straight.stdout
    stopped = _torchrun(tmp_path, "resumed", "--stop_at_step", "6")
    assert stopped.returncode != 0  # torchrun reports its workers' exit 143 as a failure
    assert "stopped at step 6 (run 0, epoch 2, batch 2)" in stopped.stdout, stopped.stdout
    assert re.search(r"exitcode\s*:\s*143", stopped.stdout + stopped.stderr)
    assert _final(tmp_path, "resumed")["step"] == 6
    resumed = _torchrun(tmp_path, "resumed", "--resume", "true")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming run 0 from epoch 1 (step 6)" in resumed.stdout
    _assert_same_training(tmp_path, "straight", "resumed", steps=8, world_size=2)


# ---------------------------------------------------------------------------------------------
# Training, end to end, one process

TINY = ["--data", "synthetic", "--synthetic_train", "128", "--synthetic_test", "32",
        "--depth", "10", "--widen", "1", "--batch_size", "32", "--epochs", "2", "--lr", "0.4",
        "--workers", "0", "--device", "cpu"]  # 4 steps per epoch


def _run(tmp_path, job, *extra):
    return train.main(TINY + ["--job-dir", str(tmp_path / job),
                              "--data-dir", str(tmp_path / "data"), *extra])


def _final(tmp_path, job):
    return torch.load(tmp_path / job / "checkpoints" / "last.pt", weights_only=True)


def _rows(tmp_path, job, event=None):
    rows = train.metrics.read_metrics(tmp_path / job / "metrics.jsonl")
    return [r for r in rows if r.get("event") == event]


def _assert_same_training(tmp_path, reference_job, job, steps, world_size):
    reference, resumed = _final(tmp_path, reference_job), _final(tmp_path, job)
    assert reference["step"] == resumed["step"] == steps and resumed["epoch"] == 2
    assert resumed["world_size"] == world_size
    for k, v in reference["model"].items():
        assert torch.equal(v, resumed["model"][k]), k
    for a, b in zip(reference["master"], resumed["master"]):
        assert torch.equal(a, b)
    ref_state, state = reference["optimizer"]["state"], resumed["optimizer"]["state"]
    assert ref_state.keys() == state.keys()
    for k in ref_state:
        assert torch.equal(ref_state[k]["momentum_buffer"], state[k]["momentum_buffer"]), k
    ref_rows, rows = _rows(tmp_path, reference_job), _rows(tmp_path, job)
    assert [r["epoch"] for r in rows] == [1, 2]
    for key in ("step", "lr", "momentum", "train_loss", "train_acc", "test_acc", "test_loss"):
        assert [r[key] for r in rows] == [r[key] for r in ref_rows], key


@pytest.mark.slow(seconds=15)
def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    assert _run(tmp_path, "straight") == 0
    assert _final(tmp_path, "straight")["train_time"] > 0
    for job, stop in (("mid-epoch", 6), ("epoch-boundary", 4)):
        assert _run(tmp_path, job, "--stop-at-step", str(stop)) == 143
        assert _final(tmp_path, job)["step"] == stop
        assert _run(tmp_path, job, "--resume", "true") == 0
        _assert_same_training(tmp_path, "straight", job, steps=8, world_size=1)


def test_resume_refuses_a_checkpoint_from_other_arguments(tmp_path):
    assert _run(tmp_path, "j", "--stop-at-step", "1") == 143
    with pytest.raises(SystemExit, match="widen=1, this run has 2"):
        _run(tmp_path, "j", "--widen", "2", "--resume", "true")
    with pytest.raises(SystemExit, match="hyperparameters"):
        _run(tmp_path, "j", "--wd", "1e-3", "--resume", "true")


def test_resume_refuses_a_damaged_checkpoint_or_counts_past_the_schedule_F46(tmp_path):
    """F46: a step past the run's last (TINY: 8), an epoch past its epochs, more completed
    runs than this one's place: one line; before, `step >= nb` ended the run at once with the
    checkpoint's weights and accuracy. An empty checkpoint is one line too."""
    assert _run(tmp_path, "j", "--stop-at-step", "1") == 143
    path = tmp_path / "j" / "checkpoints" / "last.pt"
    saved = _final(tmp_path, "j")
    said = resume_refusals(lambda: _run(tmp_path, "j", "--resume", "true"), path, [
        {**saved, "step": 10 ** 18}, {**saved, "epoch": 5}, {**saved, "accs": [0.9]}])
    refused = f"{train.NAME}: {path}: refused to resume: its "
    assert said[:-1] == [
        refused + "step is 1000000000000000000, outside this run's schedule (0 to 8)",
        refused + "epoch is 5, outside this run's schedule (0 to 2)",
        refused + "completed_runs is 1, outside this run's schedule (0 to 0)"]
    assert said[-1].startswith(f"{path}: refused to load the checkpoint: it is damaged")


def test_runs_repeat_with_their_own_seeds_and_summarise(tmp_path, capsys):
    assert _run(tmp_path, "j", "--runs", "2", "--epochs", "1") == 0
    rows = _rows(tmp_path, "j")
    assert [(r["run"], r["epoch"]) for r in rows] == [(0, 1), (1, 1)]
    assert rows[0]["train_loss"] != rows[1]["train_loss"]  # seeds 0 and 1
    (summary,) = _rows(tmp_path, "j", event="runs_summary")
    assert summary["runs"] == 2 and summary["target"] == 0.94
    assert summary["mean_acc"] == pytest.approx((rows[0]["test_acc"] + rows[1]["test_acc"]) / 2)
    assert "2 runs: mean" in capsys.readouterr().out
    # Run 0 of a multi-run job is exactly a single run with the same seed.
    assert _run(tmp_path, "single", "--epochs", "1") == 0
    assert _rows(tmp_path, "single")[0]["train_loss"] == rows[0]["train_loss"]


def _env(tmp_path, job):
    return {**os.environ, "CLOUDTRAIN_JOB_DIR": str(job), "OMP_NUM_THREADS": "1",
            "CLOUDTRAIN_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow(seconds=25)
def test_smoke_profile_as_the_orchestrator_runs_it(tmp_path):
    job = recipe_job_dir(tmp_path, "wide-resnet34")
    proc = subprocess.run(recipe_command("wide-resnet34"), cwd=job, env=_env(tmp_path, job),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith(
        "wide-resnet34: starting (variant=1gpu, WRN-10-1")
    # its time against the goal (< 60 s): benchmarks/smoke_profiles.py

    rows = train.metrics.read_metrics(job / "metrics.jsonl")
    epochs = [r for r in rows if "event" not in r]
    required = {"time", "run", "epoch", "epochs", "step", "steps", "lr", "momentum",
                "train_loss", "train_acc", "test_acc", "test_loss", "train_time",
                "fastai_time", "wall_time"}
    assert [r["epoch"] for r in epochs] == [1, 2]
    for r in epochs:
        assert required <= set(r), set(r)
        assert r["epochs"] == 2 and r["step"] == 8 * r["epoch"] and r["steps"] == 16
        assert 0 <= r["train_acc"] <= 1 and 0 <= r["test_acc"] <= 1
        assert 0 < r["train_time"] < r["fastai_time"] < r["wall_time"]
    assert epochs[1]["train_time"] > epochs[0]["train_time"]
    # The loss must clearly fall: ln(10) = 2.30 at the start; no learning keeps both near it.
    assert epochs[0]["train_loss"] < math.log(10) + 0.05
    assert epochs[1]["train_loss"] < epochs[0]["train_loss"] - 0.1, epochs
    assert rows[-1]["event"] == "runs_summary" and rows[-1]["runs"] == 1
    # issue 17: what came before the first step
    assert rows[0]["event"] == "startup" and rows[0]["device"] == "cpu", rows[0]
    assert 0 < rows[0]["import"] <= rows[0]["to_first_step"] < epochs[0]["wall_time"]
    assert "wide-resnet34: startup: import" in proc.stdout
    ckpt = torch.load(job / "checkpoints" / "last.pt", weights_only=True)
    assert {"model", "master", "optimizer", "epoch", "step", "train_time", "fastai_time",
            "target_reached", "rng", "args", "hyp", "world_size", "run"} <= set(ckpt)
    assert ckpt["epoch"] == 2 and ckpt["step"] == 16 and ckpt["args"]["widen"] == 1


@pytest.mark.slow(seconds=25)
def test_sigusr1_checkpoints_at_a_step_boundary_and_exits_143(tmp_path):
    job = recipe_job_dir(tmp_path, "wide-resnet34")
    command = recipe_command("wide-resnet34")
    command[command.index("--epochs") + 1] = "50"
    proc = subprocess.Popen(command, cwd=job, env=_env(tmp_path, job), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:  # wait until epoch 1 is done: training is under way
            if line.startswith("           0           1 "):
                break
        proc.send_signal(signal.SIGUSR1)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out
    assert "SIGUSR1 received" in out and "checkpoint saved" in out
    ckpt = torch.load(job / "checkpoints" / "last.pt", weights_only=True)
    assert 8 <= ckpt["step"] < 400 and ckpt["epoch"] >= 1
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["checkpoint-info.json",
                                                                        "last.pt"]


def test_the_project_loader_accepts_the_recipe():
    from cloudtrain import recipes

    recipe = recipes.load("wide-resnet34")
    assert recipe.launcher == "torchrun" and recipe.gpus == 8 and recipe.gpu_request({}) == "A100:8"  # RA2
    smoke = recipe.resolve("smoke")
    assert smoke["depth"] == 10 and smoke["workers"] == 0 and smoke["data"] == "synthetic"
    assert recipe.resolve(None, ("depth=34",))["depth"] == 34
    # The orchestrator starts one process per GPU the variant was published on, by default.
    assert recipe.gpus_needed(recipe.resolve(None)) == 8
    assert recipe.gpus_needed(recipe.resolve(None, ("variant=1gpu",))) == 1
    assert recipe.gpus_needed(smoke) == 1 and not recipe.gpus_exact(smoke)
    by_variant = {p["variant"]: p for p in recipe.published}
    assert by_variant["8gpu"]["seconds"] == 173.95 and by_variant["8gpu"]["gpus"] == 8
    assert by_variant["8gpu"]["accuracy"] == 0.9403 and by_variant["8gpu"]["cost_usd"] == 1.18
    assert by_variant["1gpu"]["seconds"] == pytest.approx(0.11225 * 3600)
    assert by_variant["1gpu"]["cost_usd"] == 0.26 and by_variant["1gpu"]["gpus"] == 1
    assert set(recipe.arguments) >= {"variant", "depth", "widen", "workers", "seed", "runs",
                                     "resume", "fp16", "loss_scale", "clr"}


@pytest.mark.slow(seconds=90)
def test_compile_true_compiles_once_and_trains_exactly_as_eager_on_the_cpu(tmp_path, capsys,
                                                                          monkeypatch):
    """issue 17: compile=true compiles the training forward before run 0 (its seconds in the
    startup row), run 1 reuses the graphs (one startup row, one compile), and on the CPU the
    compiled float32 model gives the eager run's figures."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # so that what the run sets is undone
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    # 120 images in batches of 32: the loader keeps a last batch of 24, a second shape that
    # the warm-up must compile too (else it compiles in the first epoch, on the clock)
    common = ["--runs", "2", "--epochs", "1", "--synthetic_train", "120"]
    counters = torch._dynamo.utils.counters["stats"]
    seen = {}
    real_warm_up = train.compiling.warm_up

    def warm_up(*args, **kwargs):
        real_warm_up(*args, **kwargs)
        seen["graphs after the warm-up"] = counters["unique_graphs"]

    monkeypatch.setattr(train.compiling, "warm_up", warm_up)
    assert _run(tmp_path, "compiled", *common, "--compile", "true") == 0
    assert counters["unique_graphs"] == seen["graphs after the warm-up"] > 0
    assert _run(tmp_path, "eager", *common) == 0
    (start,) = _rows(tmp_path, "compiled", event="startup")
    assert start["compile"] > 0 and start["to_first_step"] >= start["compile"]
    assert "warm_up" not in _rows(tmp_path, "eager", event="startup")[0]
    compiled, eager = _rows(tmp_path, "compiled"), _rows(tmp_path, "eager")
    assert [(r["run"], r["epoch"]) for r in compiled] == [(0, 1), (1, 1)]
    assert compiled[0]["step"] == 4  # 3 batches of 32 and one of 24
    for a, b in zip(compiled, eager):
        for key in ("train_loss", "train_acc", "test_acc"):
            assert a[key] == pytest.approx(b[key], abs=1e-3), key
    assert "compile" in capsys.readouterr().out
    assert list((tmp_path / "data" / "inductor-cache").iterdir())
