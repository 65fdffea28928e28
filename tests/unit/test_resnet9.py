"""recipes/resnet9/train.py: the facts of spec section 1A, checked on the CPU.

Schedules at named steps, parameter counts, the layers that differ from stock PyTorch
(GhostBatchNorm, whitening, label smoothing, Page's Nesterov update, EMA), the augmentation
invariants, and training end to end: the smoke profile as the orchestrator runs it, resume,
SIGTERM.
"""
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import import_recipe_file, recipe_command, recipe_job_dir, resume_refusals
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "resnet9"


train = import_recipe_file("resnet9", "train.py", "resnet9_train")
BOT, DAWN = train.HYP["bag-of-tricks"], train.HYP["dawn"]
APPLE = train.HYP["apple-8gpu"]
SPE = 50_000 // 512  # steps per epoch on CIFAR-10 at batch 512 (drop_last): 97
AP_SPE = 24          # apple-8gpu: 6,250 images per GPU at 256 per GPU (drop_last)


# ---------------------------------------------------------------------------------------------
# Schedules

def test_bag_of_tricks_lr_at_named_steps():
    lr = lambda step, epochs=10: train.lr_at(step, SPE, BOT, epochs, 512)  # noqa: E731
    assert lr(0) == 0.0
    assert lr(1) == pytest.approx(1.0 / 2 / SPE / 512)  # CF: the first update already moves
    assert lr(SPE) == pytest.approx(0.5 / 512)
    assert lr(2 * SPE) == 1.0 / 512                     # the peak, exactly
    assert lr(5 * SPE) == pytest.approx(0.55 / 512)     # halfway down 1.0 -> 0.1
    for step in (8 * SPE, 8 * SPE + 1, 9 * SPE, 10 * SPE):
        assert lr(step) == 0.1 / 512                    # held flat for the last 2 epochs
    # The knots scale with --epochs: at 20 epochs the peak moves to epoch 4.
    assert lr(4 * SPE, epochs=20) == 1.0 / 512 and lr(2 * SPE, epochs=20) == 0.5 / 512


def test_dawn_lr_at_named_steps():
    lr = lambda step: train.lr_at(step, SPE, DAWN, 24, 512)  # noqa: E731
    assert lr(0) == 0.0
    assert lr(5 * SPE) == 0.4 / 512
    assert lr(24 * SPE) == 0.0
    assert lr(int(14.5 * SPE) + 1) == pytest.approx(0.4 * (24 - (int(14.5 * SPE) + 1) / SPE)
                                                    / 19 / 512)
    up = [lr(s) for s in range(0, 5 * SPE + 1)]
    down = [lr(s) for s in range(5 * SPE, 24 * SPE + 1)]
    assert up == sorted(up) and down == sorted(down, reverse=True)


def test_ema_steps_and_bias_groups():
    assert [s for s in range(1, 17) if train.is_ema_step(s, 5)] == [1, 6, 11, 16]
    assert not any(train.is_ema_step(s, 0) for s in range(1, 10))
    model = train.build_model("bag-of-tricks", width_div=16, ghost_splits=4)
    weights, biases = train.param_groups(model, BOT, 512)
    assert weights["lr_mult"] == 1 and weights["wd"] == 5e-4 * 512
    assert biases["lr_mult"] == 64 and biases["wd"] == 5e-4 * 512 / 64
    assert len(biases["params"]) == 8  # the bias of each of the 8 BNs, nothing else
    assert all(p.dim() == 1 for p in biases["params"])
    assert all(p.dim() > 1 for p in weights["params"])  # conv and linear weights only
    (only,) = train.param_groups(train.build_model("dawn", 16), DAWN, 512)
    assert len(only["params"]) == 8 + 2 * 8 + 1  # dawn: convs, BN weight and bias, linear


def test_apple_lr_at_named_steps():
    lr = lambda step: train.lr_at(step, AP_SPE, APPLE, 18, 256)  # noqa: E731
    assert train.epoch_steps(50_000, 8, 256) == AP_SPE and 18 * AP_SPE == 432
    assert lr(0) == 0.0
    assert lr(1) == pytest.approx(1.5 / 86.4 / 256)       # AP's counter: the first step moves
    assert lr(72) == pytest.approx(1.5 * 3 / 3.6 / 256)   # epoch 3, on the way up
    # The peak knot is epoch 3.6 = step 86.4, between two steps: neither reaches 1.5/256.
    assert lr(86) < lr(87) < 1.5 / 256 and lr(88) < lr(87)
    assert max(lr(s) for s in range(433)) == lr(87)
    assert train.lr_at(86.4, AP_SPE, APPLE, 18, 256) == pytest.approx(1.5 / 256)
    assert lr(240) == pytest.approx((1.5 - 1.35 * (10 - 3.6) / 12.4) / 256)  # epoch 10
    floor = 1.5 * 0.1 / 256
    for step in (384, 385, 17 * AP_SPE, 431, 432):      # epochs 16-18: held at 0.15
        assert lr(step) == pytest.approx(floor, rel=1e-12)
    assert lr(383) > floor
    # On the global mean loss (8 x 256, gradients averaged) the peak is 1.5: lr * 256.
    assert train.lr_at(86.4, AP_SPE, APPLE, 18, 256) * 256 == pytest.approx(1.5)


def test_apple_weight_decay_and_bias_groups():
    model = train.build_model("apple-8gpu", width_div=16, ghost_splits=16)
    weights, biases = train.param_groups(model, APPLE, 256)
    assert weights["wd"] == pytest.approx(0.192) and weights["lr_mult"] == 1
    assert biases["wd"] == pytest.approx(0.003) and biases["lr_mult"] == 64
    assert len(biases["params"]) == 8 and all(p.dim() == 1 for p in biases["params"])
    assert all(p.dim() > 1 for p in weights["params"])
    peak = train.lr_at(86.4, AP_SPE, APPLE, 18, 256)
    assert peak * weights["wd"] == pytest.approx(1.125e-3)            # lr * wd per step
    assert peak * biases["lr_mult"] == pytest.approx(96 / 256)        # bias lr peak
    assert peak * biases["lr_mult"] * biases["wd"] == pytest.approx(1.125e-3)  # x64, /64
    # The rest of Page's network, without the EMA.
    assert APPLE["ema_every"] == 0 and APPLE["tta_flip"] and APPLE["label_smoothing"] == 0.2
    assert APPLE["whiten_eps"] == 1e-2 and APPLE["head_scale"] == 1 / 16 and APPLE["cutout"] == 0
    assert APPLE["max_options"] == 200 and APPLE["momentum"] == 0.9
    assert model.scale == 1 / 16 and isinstance(model.layer2.bn, train.GhostBatchNorm)
    assert train.count_params(train.build_model("apple-8gpu")) == \
        train.count_params(train.build_model("bag-of-tricks"))


def test_apple_strided_shards_for_8_gpus():
    shards = [train.shard_indices(50_000, r, 8) for r in range(8)]
    assert [len(s) for s in shards] == [6_250] * 8
    flat = [i for s in shards for i in s]
    assert len(set(flat)) == 50_000 == len(flat) and set(flat) == set(range(50_000))
    assert list(shards[3][:3]) == [3, 11, 19]
    assert all(len(s) // 256 == 24 for s in shards)  # 24 steps of 256, 106 images dropped
    # Shards of unequal size still give every rank the same number of steps.
    assert [len(train.shard_indices(1000, r, 3)) for r in range(3)] == [334, 333, 333]
    assert train.epoch_steps(1000, 3, 111) == 3


def test_epoch_batches_of_each_rank_are_their_own():
    x = torch.randn(128, 3, 40, 40)
    y = torch.arange(128)
    kw = dict(hyp=APPLE, seed=0, batch_size=32, device=torch.device("cpu"), dtype=torch.float32)
    order = lambda rank, epoch=0, steps=None: torch.cat([  # noqa: E731
        yb for _, yb in train.epoch_batches(x, y, epoch, rank=rank, steps=steps, **kw)])
    assert torch.equal(order(0), order(0)) and not torch.equal(order(0), order(1))
    assert torch.equal(order(0), torch.cat([yb for _, yb in train.epoch_batches(x, y, 0, **kw)]))
    assert len(order(1, steps=2)) == 64 and torch.equal(order(1, steps=2), order(1)[:64])


# ---------------------------------------------------------------------------------------------
# Command line: variant from gpus, launch checks


def _args(*argv):
    return train.resolve_defaults(train.build_parser().parse_args(list(argv)))


def test_gpus_selects_the_variant_and_its_batch():
    a = _args()
    assert (a.variant, a.batch_size, a.gpus, a.runs) == ("bag-of-tricks", 512, 1, 1)
    a = _args("--gpus", "8")
    assert (a.variant, a.batch_size) == ("apple-8gpu", 256)
    assert _args("--variant", "dawn").batch_size == 512
    assert _args("--variant", "apple-8gpu").batch_size == 256
    assert _args("--gpus", "8", "--batch_size", "128").batch_size == 128


def test_launch_problem_names_what_to_run():
    env1, env8 = {}, {"RANK": "0", "WORLD_SIZE": "8"}
    assert train.launch_problem(_args(), env1) is None
    assert train.launch_problem(_args("--gpus", "8"), env8) is None
    msg = train.launch_problem(_args("--gpus", "8"), env1)
    assert "gpus=8" in msg and "--nproc_per_node=8" in msg and "\n" not in msg
    msg = train.launch_problem(_args(), env8)
    assert "8 processes" in msg and "gpus=8" in msg and "\n" not in msg
    assert "single-GPU" in train.launch_problem(_args("--variant", "dawn", "--gpus", "2"),
                                               {"RANK": "0", "WORLD_SIZE": "2"})
    assert train.launch_problem(_args("--runs", "0"), env1)


def test_wrong_world_size_exits_2_with_one_line(tmp_path, capsys):
    base = [sys.executable, str(RECIPE / "train.py"), "--device", "cpu", "--job-dir",
            str(tmp_path / "j"), "--data-dir", str(tmp_path / "d")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    cases = [(["--gpus", "2"], {}, "--nproc_per_node=2"),
             ([], {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "gpus=1")]
    for argv, extra, needle in cases:
        proc = subprocess.run(base + argv, env={**env, **extra}, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("resnet9: ")
        assert proc.stdout == ""  # not even the "starting" line
    # Ranks other than 0 leave quietly: one line per job, not one per process.
    proc = subprocess.run(base, env={**env, "RANK": "1", "WORLD_SIZE": "2"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == "" and proc.stdout == ""
    # In-process callers get the same: status 2, nothing trained.
    assert train.main(["--gpus", "2", "--job-dir", str(tmp_path / "j")]) == 2
    assert "--nproc_per_node=2" in capsys.readouterr().err
    assert not (tmp_path / "j").exists()


# ---------------------------------------------------------------------------------------------
# Model

def test_parameter_counts_full_width():
    dawn = train.count_params(train.build_model("dawn"))
    assert dawn == (6_573_120, 6_573_120)  # 6,568,640 weights + 4,480 BN (spec 1A)
    total, trainable = train.count_params(train.build_model("bag-of-tricks"))
    # 3x3x3x27 frozen whitening (+729); 1x1 27->64 (1,728) replaces 3x3 3->64 (also 1,728);
    # the 2,240 BN weights are frozen at 1.
    assert total == 6_573_120 + 729 == 6_573_849
    assert trainable == 6_573_849 - 729 - 2_240 == 6_570_880


@pytest.mark.parametrize("variant", ["bag-of-tricks", "dawn"])
def test_logits_shape_and_dtype(variant):
    model = train.build_model(variant)
    x = torch.randn(32, 3, 32, 32)
    for mode in (True, False):
        model.train(mode)
        with torch.no_grad():
            logits = model(x)
        assert logits.shape == (32, 10) and logits.dtype == torch.float32


def test_block_order_and_head_scale():
    torch.manual_seed(0)
    x = torch.randn(8, 4, 8, 8)
    bot = train.ConvBN(4, 8, BOT, ghost_splits=2, pool=True).train()
    manual = F.celu(F.batch_norm(F.max_pool2d(bot.conv(x), 2).reshape(4, 16, 4, 4), None, None,
                                 torch.ones(16), bot.bn.bias.repeat(2), True, 0.1, 1e-5)
                    .view(8, 8, 4, 4), 0.3)
    assert torch.allclose(bot(x), manual, atol=1e-6)
    dawn = train.ConvBN(4, 8, DAWN, ghost_splits=1, pool=True).train()
    manual = F.max_pool2d(F.relu(F.batch_norm(dawn.conv(x), None, None, dawn.bn.weight,
                                              dawn.bn.bias, True, 0.1, 1e-5)), 2)
    assert torch.allclose(dawn(x), manual, atol=1e-6)
    assert train.build_model("dawn", 16).scale == 0.125
    assert train.build_model("bag-of-tricks", 16, 4).scale == 1 / 16


def test_ghost_batchnorm_train_splits_and_eval_averages():
    torch.manual_seed(0)
    bn = train.GhostBatchNorm(3, splits=4)
    assert not bn.weight.requires_grad and bn.bias.requires_grad
    with torch.no_grad():
        bn.bias.copy_(torch.tensor([0.5, -1.0, 2.0]))
    # Each ghost batch (images i % 4 == s) gets its own offset so the split stats differ.
    x = torch.randn(16, 3, 5, 5) + torch.arange(16).remainder(4).view(16, 1, 1, 1).float()
    out = bn.train()(x)
    means, varis = [], []
    for s in range(4):
        xs = x[s::4]
        mean = xs.mean(dim=(0, 2, 3))
        var = xs.var(dim=(0, 2, 3), unbiased=False)
        expected = (xs - mean.view(1, 3, 1, 1)) / torch.sqrt(var.view(1, 3, 1, 1) + 1e-5)
        assert torch.allclose(out[s::4], expected + bn.bias.view(1, 3, 1, 1), atol=1e-5)
        means.append(mean)
        varis.append(xs.var(dim=(0, 2, 3), unbiased=True))
    running_mean = 0.1 * torch.stack(means)
    running_var = 0.9 + 0.1 * torch.stack(varis)
    assert torch.allclose(bn.running_mean.view(4, 3), running_mean, atol=1e-6)
    assert torch.allclose(bn.running_var.view(4, 3), running_var, atol=1e-6)
    y = torch.randn(6, 3, 5, 5)  # eval: any batch size, averaged split stats
    m, v = running_mean.mean(0).view(1, 3, 1, 1), running_var.mean(0).view(1, 3, 1, 1)
    expected = (y - m) / torch.sqrt(v + 1e-5) + bn.bias.view(1, 3, 1, 1)
    assert torch.allclose(bn.eval()(y), expected, atol=1e-5)
    assert torch.allclose(bn.running_mean.view(4, 3), running_mean)  # eval does not rewrite them


def test_whitening_filters_whiten_their_source_patches():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 32, 32, generator=gen)
    x = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), 3, stride=1)  # correlated patches
    x[:, 2] = x[:, 1] + 0.01 * x[:, 2]  # and a few near-zero directions for eps to damp
    eps = 1e-2
    filters, evals = train.whitening_filters(x, eps)
    assert filters.shape == (27, 3, 3, 3) and list(evals) == sorted(evals, reverse=True)
    z = F.conv2d(x, filters).permute(0, 2, 3, 1).reshape(-1, 27).double()  # each 3x3 patch
    cov = z.T @ z / (len(z) - 1)  # uncentred, normalised by n - 1, as the filters were made
    big = evals > 100 * eps
    assert 0 < big.sum() < 27 and (evals < eps).any()
    assert torch.allclose(cov, torch.diag(evals / (evals + eps)).double(), atol=1e-4)
    assert torch.allclose(cov[big][:, big], torch.eye(int(big.sum())).double(), atol=1.1e-2)
    assert (torch.diagonal(cov)[evals < eps] < 0.5).all()  # damped, not blown up
    # Few patches (2 images of 4x4: 8 patches), where n - 1 and n differ by 14%.
    x = torch.randn(2, 3, 4, 4, generator=gen)
    filters, evals = train.whitening_filters(x, eps)
    z = F.conv2d(x, filters).permute(0, 2, 3, 1).reshape(-1, 27).double()
    cov = z.T @ z / (len(z) - 1)
    assert torch.allclose(cov, torch.diag(evals / (evals + eps)).double(), atol=1e-4)


def test_half_precision_keeps_batchnorm_in_float32():
    model = train.to_half_keep_bn_float(train.build_model("bag-of-tricks", 16, 4))
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if ".bn." in name and tensor.is_floating_point():
            assert tensor.dtype == torch.float32, name
        elif tensor.is_floating_point():
            assert tensor.dtype == torch.float16, name


# ---------------------------------------------------------------------------------------------
# Loss, optimiser, EMA

def test_label_smoothing_formula():
    torch.manual_seed(0)
    logits, targets = torch.randn(32, 10) * 3, torch.randint(0, 10, (32,))
    log_p = F.log_softmax(logits, -1)
    ce = -log_p[torch.arange(32), targets]
    expected = 0.8 * ce + 0.2 * (-log_p.mean(-1))
    assert torch.allclose(train.per_sample_loss(logits, targets, 0.2), expected, atol=1e-6)
    assert torch.allclose(train.per_sample_loss(logits, targets, 0.2),
                          F.cross_entropy(logits, targets, label_smoothing=0.2, reduction="none"),
                          atol=1e-5)
    assert torch.allclose(train.per_sample_loss(logits, targets, 0.0), ce, atol=1e-6)


def test_nesterov_update_is_pages_not_torch_sgd():
    torch.manual_seed(0)
    w0, g1, g2 = torch.randn(5), torch.randn(5), torch.randn(5)
    w = torch.nn.Parameter(w0.clone())
    opt = train.NesterovSGD([{"params": [w], "lr_mult": 2.0, "wd": 0.1}], momentum=0.9)
    ref_w, ref_v = w0.clone(), torch.zeros(5)
    for g, lr in ((g1, 0.5), (g2, 0.25)):  # the lr changes between steps
        w.grad = g.clone()
        opt.step(lr)
        d = -(lr * 2.0) * (g + 0.1 * ref_w)
        ref_v = 0.9 * ref_v + d
        ref_w = ref_w + d + 0.9 * ref_v
        assert torch.allclose(w.detach(), ref_w, atol=1e-6)
    torch_w = torch.nn.Parameter(w0.clone())
    sgd = torch.optim.SGD([torch_w], lr=1.0, momentum=0.9, nesterov=True, weight_decay=0.1)
    for g, lr in ((g1, 0.5), (g2, 0.25)):
        sgd.param_groups[0]["lr"] = lr * 2.0
        torch_w.grad = g.clone()
        sgd.step()
    assert not torch.allclose(torch_w.detach(), ref_w, atol=1e-4)  # differs once lr moves


def test_ema_update_covers_weights_and_bn_buffers():
    torch.manual_seed(0)
    ema = train.build_model("bag-of-tricks", 16, 4)
    model = train.build_model("bag-of-tricks", 16, 4)
    model.train()(torch.randn(8, 3, 32, 32))  # move the running stats away from their init
    before = {k: v.clone() for k, v in ema.state_dict().items()}
    train.ema_update(ema, model, 0.99 ** 5)
    rho = 0.99 ** 5
    for k, v in ema.state_dict().items():
        if v.is_floating_point():
            assert torch.allclose(v, rho * before[k] + (1 - rho) * model.state_dict()[k],
                                  atol=1e-6), k
        else:
            assert torch.equal(v, before[k]), k  # num_batches_tracked: left alone
    assert not torch.equal(ema.state_dict()["layer2.bn.running_mean"],
                           before["layer2.bn.running_mean"])


# ---------------------------------------------------------------------------------------------
# Augmentation

def test_per_sample_crop_flip_cutout_invariants():
    gen = torch.Generator().manual_seed(0)
    offsets, flips, corners = train.per_sample_choices(5000, gen, pad=4, cutout=8)
    translation = offsets - 4
    assert translation.min() == -4 and translation.max() == 4  # +-4 px, all reached
    assert len(torch.unique(offsets[:, 0] * 9 + offsets[:, 1])) == 81
    assert corners.min() == 0 and corners.max() == 32 - 8  # windows fully inside
    assert 0.45 < flips.float().mean() < 0.55

    n = 40
    x_pad = torch.randn(n, 3, 40, 40) + 10  # no zeros of its own
    out = train.augment(x_pad, offsets[:n], flips[:n], corners[:n], cutout=8)
    assert out.shape == (n, 3, 32, 32)
    for i in range(n):
        dy, dx = offsets[i].tolist()
        expected = x_pad[i, :, dy:dy + 32, dx:dx + 32]
        if flips[i]:
            expected = expected.flip(-1)
        cy, cx = corners[i].tolist()
        expected = expected.clone()
        expected[:, cy:cy + 8, cx:cx + 8] = 0
        assert torch.equal(out[i], expected), i
        assert (out[i] == 0).sum() == 3 * 8 * 8  # exactly one 8x8 window, all channels


def test_grouped_choices_give_each_option_an_evenly_sized_group():
    gen = torch.Generator().manual_seed(0)
    offsets, flips, corners = train.grouped_choices(512, gen, pad=4, max_options=200)
    assert corners is None
    keys, counts = torch.unique(offsets[:, 0] * 9 + offsets[:, 1], return_counts=True)
    assert len(keys) == 81 and set(counts.tolist()) == {6, 7}  # 512 = 26*7 + 55*6
    assert offsets.min() == 0 and offsets.max() == 8
    assert flips.sum() == 256
    offsets, flips, _ = train.grouped_choices(513, gen, pad=4, max_options=10)
    _, counts = torch.unique(offsets[:, 0] * 9 + offsets[:, 1], return_counts=True)
    assert len(counts) == 10 and set(counts.tolist()) <= {51, 52}  # at most max_options groups
    assert flips.sum() in (256, 257)


def test_epoch_batches_depend_only_on_seed_and_epoch():
    x = torch.randn(300, 3, 40, 40)
    y = torch.arange(300)

    def labels(epoch, seed=0, hyp=BOT):
        batches = train.epoch_batches(x, y, epoch, hyp, seed, 64, torch.device("cpu"),
                                      torch.float32)
        return torch.cat([yb for _, yb in batches])

    assert len(labels(0)) == 256  # 4 full batches, the rest dropped
    assert torch.equal(labels(3), labels(3)) and not torch.equal(labels(3), labels(4))
    assert not torch.equal(labels(3), labels(3, seed=1))
    assert len(labels(0, hyp=DAWN)) == 256  # the DataLoader path


# ---------------------------------------------------------------------------------------------
# Training, end to end

TINY = ["--data", "synthetic", "--synthetic_train", "256", "--synthetic_test", "64",
        "--width_div", "16", "--ghost_splits", "4", "--batch_size", "64", "--epochs", "2",
        "--device", "cpu"]  # 4 steps per epoch


def _run(tmp_path, job, *extra):
    return train.main(TINY + ["--job-dir", str(tmp_path / job),
                              "--data-dir", str(tmp_path / "data"), *extra])


def _final(tmp_path, job):
    return torch.load(tmp_path / job / "checkpoints" / "last.pt", weights_only=True)


def _rows(tmp_path, job):
    return [r for r in train.metrics.read_metrics(tmp_path / job / "metrics.jsonl")
            if "event" not in r]


@pytest.mark.slow(seconds=20)
@pytest.mark.parametrize("variant", ["bag-of-tricks", "dawn"])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, variant):
    assert _run(tmp_path, "straight", "--variant", variant) == 0
    reference = _final(tmp_path, "straight")
    assert reference["step"] == 8 and reference["epoch"] == 2
    # Stopped after epoch 1 (step 4), and in the middle of epoch 2 (step 6), then resumed.
    for job, stop in (("epoch-boundary", 4), ("mid-epoch", 6)):
        assert _run(tmp_path, job, "--variant", variant, "--stop-at-step", str(stop)) == 143
        assert _final(tmp_path, job)["step"] == stop
        assert _run(tmp_path, job, "--variant", variant, "--resume", "true") == 0
        resumed = _final(tmp_path, job)
        assert resumed["step"] == 8 and resumed["epoch"] == 2
        for part in ("model", "ema"):
            if reference[part] is None:
                assert resumed[part] is None and variant == "dawn"
                continue
            for k, v in reference[part].items():
                assert torch.equal(v, resumed[part][k]), (job, part, k)
        for a, b in zip(reference["optimizer"]["velocity"], resumed["optimizer"]["velocity"]):
            assert all(torch.equal(u, w) for u, w in zip(a, b)), job
        ref_rows, rows = _rows(tmp_path, "straight"), _rows(tmp_path, job)
        assert [r["epoch"] for r in rows] == [1, 2]
        for key in ("step", "lr", "train_loss", "train_acc", "test_acc"):
            assert [r[key] for r in rows] == [r[key] for r in ref_rows], (job, key)
    assert reference["train_time"] > 0
    assert _summary(tmp_path, "straight") == []  # one run: no runs_summary row


def test_resume_without_a_checkpoint_starts_fresh_with_a_warning(tmp_path, capsys):
    assert _run(tmp_path, "j", "--epochs", "1", "--resume", "true") == 0
    err = capsys.readouterr().err
    assert "warning" in err and "no checkpoint" in err and "starting from scratch" in err
    assert _final(tmp_path, "j")["epoch"] == 1


def test_resume_refuses_a_checkpoint_from_other_arguments(tmp_path):
    assert _run(tmp_path, "j", "--stop-at-step", "1") == 143
    with pytest.raises(SystemExit, match="width_div=16, this run has 8"):
        train.main(TINY + ["--width_div", "8", "--resume", "true", "--job-dir",
                           str(tmp_path / "j"), "--data-dir", str(tmp_path / "data")])


def test_resume_refuses_a_damaged_checkpoint_or_counts_past_the_schedule_F46(tmp_path):
    """F46: a checkpoint whose step, epoch, run or completed runs lie past this run's schedule
    (the 2-epoch, 8-step TINY run) is refused in one line, as is an empty one; before, a step
    of 10^18 ended the training at once and the job succeeded."""
    assert _run(tmp_path, "j", "--stop-at-step", "1") == 143
    path = tmp_path / "j" / "checkpoints" / "last.pt"
    saved = _final(tmp_path, "j")
    said = resume_refusals(lambda: _run(tmp_path, "j", "--resume", "true"), path, [
        {**saved, "step": 10 ** 18}, {**saved, "step": 9}, {**saved, "epoch": 3},
        {**saved, "run": 1}, {**saved, "run_accs": [0.99, 0.99]}])
    refused = f"resnet9: {path}: refused to resume: its "
    assert said[:-1] == [
        refused + "step is 1000000000000000000, outside this run's schedule (0 to 8)",
        refused + "step is 9, outside this run's schedule (0 to 8)",
        refused + "epoch is 3, outside this run's schedule (0 to 2)",
        refused + "run is 1, outside this run's schedule (0 to 0)",
        refused + "completed_runs is 2, outside this run's schedule (0 to 1)"]
    assert said[-1].startswith(f"{path}: refused to load the checkpoint: it is damaged")


def _summary(tmp_path, job):
    return [r for r in train.metrics.read_metrics(tmp_path / job / "metrics.jsonl")
            if r.get("event") == "runs_summary"]


@pytest.mark.slow(seconds=25)
def test_runs_summarise_and_compose_with_resume(tmp_path, capsys):
    assert _run(tmp_path, "straight", "--runs", "2") == 0
    rows = _rows(tmp_path, "straight")
    assert [(r["run"], r["epoch"]) for r in rows] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    finals = [rows[1]["test_acc"], rows[3]["test_acc"]]
    (summary,) = _summary(tmp_path, "straight")
    assert summary["runs"] == 2 and summary["mean_acc"] == pytest.approx(sum(finals) / 2)
    assert summary["min_acc"] == min(finals) and summary["max_acc"] == max(finals)
    assert summary["target"] == 0.94 and summary["reached"] == sum(a >= 0.94 for a in finals)
    assert 0 < summary["median_train_time"] <= summary["max_train_time"]
    out = capsys.readouterr().out
    assert train.runs.describe(summary) in out
    assert rows[1]["train_loss"] != rows[3]["train_loss"]  # run 1 has seed + 1: its own run
    reference = _final(tmp_path, "straight")
    assert reference["run"] == 1 and reference["run_accs"] == finals
    assert len(reference["run_times"]) == 2

    # Stopped inside run 0 (step 6), and between run 0 and run 1 (step 8, the end of run 0),
    # then resumed: the same runs, the same summary, the same final weights.
    for job, stop in (("in-run-0", 6), ("between", 8)):
        assert _run(tmp_path, job, "--runs", "2", "--stop-at-step", str(stop)) == 143
        stopped = _final(tmp_path, job)
        assert stopped["run"] == 0 and stopped["step"] == stop
        assert stopped["run_accs"] == finals[:1 if stop == 8 else 0]
        assert _run(tmp_path, job, "--runs", "2", "--resume", "true") == 0
        resumed = _final(tmp_path, job)
        assert resumed["run"] == 1 and resumed["run_accs"] == finals
        for k, v in reference["model"].items():
            assert torch.equal(v, resumed["model"][k]), (job, k)
        assert _summary(tmp_path, job)[0]["mean_acc"] == summary["mean_acc"]
        assert [(r["run"], r["step"], r["train_loss"], r["test_acc"])
                for r in _rows(tmp_path, job)] == \
            [(r["run"], r["step"], r["train_loss"], r["test_acc"]) for r in rows]


def _env(tmp_path, job):
    return {**os.environ, "CLOUDTRAIN_JOB_DIR": str(job),
            "CLOUDTRAIN_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow(seconds=30)
def test_smoke_profile_as_the_orchestrator_runs_it(tmp_path):
    job = recipe_job_dir(tmp_path, "resnet9")
    proc = subprocess.run(recipe_command("resnet9"), cwd=job, env=_env(tmp_path, job),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith("resnet9: starting (variant=bag-of-tricks")
    # its time against the goal (< 60 s): benchmarks/smoke_profiles.py

    rows = train.metrics.read_metrics(job / "metrics.jsonl")
    epochs = [r for r in rows if "event" not in r]
    required = {"time", "epoch", "epochs", "step", "lr", "train_loss", "train_acc", "test_acc",
                "train_time", "wall_time"}
    assert [r["epoch"] for r in epochs] == [1, 2, 3]
    # issue 17: what came before the first step, first of the rows
    assert rows[0]["event"] == "startup" and rows[0]["device"] == "cpu", rows[0]
    assert 0 < rows[0]["import"] <= rows[0]["to_first_step"] < epochs[0]["wall_time"]
    assert "warm_up" not in rows[0] and "compile" not in rows[0]  # no warm-up on the CPU
    assert "resnet9: startup: import" in proc.stdout
    for r in epochs:
        assert required <= set(r), set(r)
        assert r["epochs"] == 3 and r["step"] == 16 * r["epoch"]
        assert 0 <= r["train_acc"] <= 1 and 0 <= r["test_acc"] <= 1
        assert 0 < r["train_time"] < r["wall_time"]
    assert epochs[1]["train_time"] > epochs[0]["train_time"]
    # The loss must clearly fall: ln(10) = 2.30 at the start; no learning keeps both near it.
    assert epochs[0]["train_loss"] < math.log(10) + 0.05
    assert epochs[1]["train_loss"] < epochs[0]["train_loss"] - 0.03, epochs
    for line in ("       epoch", "           1", "           2"):
        assert any(out.startswith(line) for out in proc.stdout.splitlines()), proc.stdout

    ckpt = torch.load(job / "checkpoints" / "last.pt", weights_only=True)
    assert {"model", "ema", "optimizer", "epoch", "step", "train_time", "target_reached", "rng",
            "args"} <= set(ckpt)
    assert ckpt["epoch"] == 3 and ckpt["step"] == 48 and ckpt["args"]["width_div"] == 8
    assert {"python", "numpy", "torch", "cuda"} <= set(ckpt["rng"])
    assert (tmp_path / "data" / "synthetic-cifar10-512-256-0" / "cifar-10-batches-py"
            / "data_batch_1").is_file()


@pytest.mark.slow(seconds=25)
def test_d10_smoke_profile_ends_well_above_chance(tmp_path, one_torch_thread):
    """D10: the README's first command used to end at chance (test acc 0.1055 at both epochs,
    train acc 0.25): its 8 steps gave the evaluated EMA model (Page's 0.99 per step, a ~100
    step average) two updates, so it was still ~90% the random initialisation, and BatchNorm's
    running stats (momentum 0.1, ~10 steps) lagged the weights. Shorter averages then gave
    0.38-0.91 over seeds 0-4 in 2 epochs (seed 0, the default, 0.38 with torch 2.14.1); 3
    epochs give 0.56-0.97. The profile, run here in process on the CPU exactly as
    recipe.yaml sets it, must show learning."""
    profile_args = recipe_command("resnet9")[2:]
    assert train.main(profile_args + ["--device", "cpu", "--job-dir", str(tmp_path / "job"),
                                      "--data-dir", str(tmp_path / "data")]) == 0
    rows = _rows(tmp_path, "job")
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert rows[-1]["test_acc"] >= 0.5, rows  # chance is 0.1; seeds 0-4 reach 0.56-0.97
    assert rows[-1]["train_acc"] >= 0.4, rows


def test_d10_defaults_keep_every_published_variant_exactly(tmp_path):
    """The smoke profile's bn_momentum and ema_momentum are arguments: left at their defaults,
    every variant's hyperparameters and layers are the published ones (BN momentum 0.1,
    bag-of-tricks' EMA 0.99 per step); set, they change only those two numbers."""
    for variant in train.HYP:
        args = train.resolve_defaults(train.build_parser().parse_args(["--variant", variant]))
        assert train.variant_hyp(args) == train.HYP[variant]
        assert train.HYP[variant]["bn_momentum"] == 0.1
        bns = [m for m in train.build_model(variant, 16, 4, train.variant_hyp(args)).modules()
               if isinstance(m, torch.nn.BatchNorm2d)]
        assert bns and {m.momentum for m in bns} == {0.1}
    assert BOT["ema_momentum"] == 0.99 and BOT["ema_every"] == 5
    smoke = train.build_parser().parse_args(["--bn_momentum", "0.4", "--ema_momentum", "0.9"])
    hyp = train.variant_hyp(train.resolve_defaults(smoke))
    assert {k for k in hyp if hyp[k] != BOT[k]} == {"bn_momentum", "ema_momentum"}
    assert hyp["bn_momentum"] == 0.4 and hyp["ema_momentum"] == 0.9
    bns = [m for m in train.build_model("bag-of-tricks", 16, 4, hyp).modules()
           if isinstance(m, torch.nn.BatchNorm2d)]
    assert {m.momentum for m in bns} == {0.4}
    dawn = train.resolve_defaults(train.build_parser().parse_args(
        ["--variant", "dawn", "--ema_momentum", "0.9"]))
    assert train.variant_hyp(dawn)["ema_momentum"] is None  # no EMA to set
    for flags, problem in ((["--bn_momentum", "0"], "bn_momentum must be in (0, 1], got 0.0"),
                           (["--ema_momentum", "1"], "ema_momentum must be in [0, 1), got 1.0")):
        args = train.resolve_defaults(train.build_parser().parse_args(flags))
        assert train.launch_problem(args, {}) == f"resnet9: {problem}"


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_signal_checkpoints_at_a_step_boundary_and_exits_143(tmp_path, sig):
    job = recipe_job_dir(tmp_path, "resnet9")
    command = recipe_command("resnet9")
    command[command.index("--epochs") + 1] = "50"
    proc = subprocess.Popen(command, cwd=job, env=_env(tmp_path, job), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:  # wait until epoch 1 is done: training is under way
            if line.startswith("           1 "):
                break
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out
    assert f"{sig.name} received" in out and "checkpoint saved" in out
    ckpt = torch.load(job / "checkpoints" / "last.pt", weights_only=True)
    assert 4 <= ckpt["step"] < 200 and ckpt["epoch"] >= 1
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["checkpoint-info.json",
                                                                        "last.pt"]


@pytest.mark.slow(seconds=120)
def test_compile_true_compiles_once_off_the_clock_and_trains_as_eager(tmp_path):
    """issue 17: compile=true (torch.compile's default mode on the CPU) compiles the training
    forward before the clock starts, says how long in the startup row, keeps the graphs for
    run 2 (no second compile, no second startup row) and in the data dir's inductor cache,
    and trains the same model as eager: the checkpoint's keys are the bare model's."""
    rows, here = {}, recipe_job_dir(tmp_path, "resnet9")
    for compiled in ("true", "false"):
        job = tmp_path / f"job-{compiled}"
        proc = subprocess.run(
            recipe_command("resnet9") + ["--compile", compiled, "--runs", "2"], cwd=here,
            env={k: v for k, v in _env(tmp_path, job).items() if "INDUCTOR" not in k},
            capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows[compiled] = train.metrics.read_metrics(job / "metrics.jsonl")
    starts = [r for r in rows["true"] if r.get("event") == "startup"]
    assert len(starts) == 1 and starts[0]["compile"] > 0, starts
    assert starts[0]["to_first_step"] >= starts[0]["compile"]
    assert list((tmp_path / "data" / "inductor-cache").iterdir())
    compiled = [r for r in rows["true"] if "event" not in r]
    eager = [r for r in rows["false"] if "event" not in r]
    assert [(r["run"], r["epoch"]) for r in compiled] == [(r["run"], r["epoch"]) for r in eager]
    for a, b in zip(compiled, eager):
        assert a["train_time"] < a["wall_time"] - starts[0]["compile"]
    # Fused float32 kernels round differently, and training amplifies it, by how much
    # depends on the CPU's vector units (compiled against eager, first epoch: on an AVX2
    # machine seed 0 2.1011 against 2.1010, seed 1 2.213 against 2.218; on an AVX-512/AMX
    # Xeon, the same torch, seed 0 2.1635 against 2.1091, seed 1 2.2216 against 2.2131):
    # close in the first epoch, where a wrong model (a lost layer, other weights) is far.
    first = [(a["train_loss"], b["train_loss"]) for a, b in zip(compiled, eager)
             if a["epoch"] == 1]
    assert len(first) == 2 and all(abs(a - b) < 0.08 for a, b in first), first
    assert compiled[-1]["train_loss"] < compiled[-3]["train_loss"] - 0.3  # run 2 learns
    ckpt = torch.load(tmp_path / "job-true" / "checkpoints" / "last.pt", weights_only=True)
    assert not [k for k in ckpt["model"] if "_orig_mod" in k]
