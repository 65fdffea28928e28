"""recipes/common/airbench.py and recipes/airbench9x: the facts of spec section 1B, on the CPU.

Schedules and optimiser settings at named steps, parameter counts, the layers (whitening, BN,
identity init, airbench96's residual), the data pipeline's invariants (alternating flip,
translate, cutout), lookahead and TTA, and training end to end: the smoke profile as the
orchestrator runs it, resume after --stop_at_step and after SIGTERM / SIGUSR1 (bit-for-bit),
the whitening bias freezing after 3 epochs, and runs=2.
"""
import functools
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import recipe_command, recipe_job_dir, resume_refusals
import torch
import torch.nn.functional as F
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "recipes"))
from common import airbench as ab  # noqa: E402
from common import metrics  # noqa: E402

AB94, AB95, AB96 = ab.HYP["airbench94"], ab.HYP["airbench95"], ab.HYP["airbench96"]
VARIANTS = ("airbench94", "airbench95", "airbench96")


# ---------------------------------------------------------------------------------------------
# Schedules and optimiser settings

def test_total_steps_and_epochs():
    assert ab.total_steps(50_000, 1024, AB94["epochs"]) == 476 == math.ceil(48 * 9.9)
    assert ab.total_steps(50_000, 1024, AB95["epochs"]) == 720
    assert ab.total_steps(50_000, 1024, AB96["epochs"]) == 1776
    assert ab.total_steps(1024, 128, 2) == 16  # the smoke profile


def test_lr_factor_airbench94_and_95_at_named_steps():
    f = lambda s, total=476: ab.lr_factor(s, total, AB94)  # noqa: E731
    assert f(0) == 0.2
    assert f(109) == 1.0                          # int(0.23 * 476) = 109 warmup steps
    assert f(476) == 0.07
    assert f(54) == pytest.approx(0.2 + 0.8 * 54 / 109)
    assert f(108) < 1.0 and f(110) < 1.0
    assert f(292) == pytest.approx(1.0 - 0.93 * (292 - 109) / (476 - 109))
    up, down = [f(s) for s in range(110)], [f(s) for s in range(109, 477)]
    assert up == sorted(up) and down == sorted(down, reverse=True)
    g = lambda s: ab.lr_factor(s, 720, AB95)  # noqa: E731
    assert (g(0), g(165), g(720)) == (0.2, 1.0, 0.07)  # int(0.23 * 720) = 165
    assert g(164) < 1.0


def test_lr_factor_airbench96_at_named_steps():
    f = lambda s: ab.lr_factor(s, 1776, AB96)  # noqa: E731
    assert f(0) == 0.2
    assert f(177) == 1.0                          # int(0.1 * 1776) = 177
    assert f(1776) == 0.0                         # decays all the way to zero
    assert f(176) < 1.0
    assert f(976) == pytest.approx((1776 - 976) / (1776 - 177))


def test_lookahead_alpha_is_cubic_with_095_to_the_5():
    assert ab.lookahead_alpha(476, 476, AB94) == 0.95 ** 5
    assert ab.lookahead_alpha(0, 476, AB94) == 0.0
    assert ab.lookahead_alpha(238, 476, AB94) == pytest.approx(0.95 ** 5 / 8)
    assert ab.lookahead_alpha(1776, 1776, AB96) == 0.95 ** 5


def test_decoupled_lr_and_weight_decay():
    s = ab.sgd_settings(AB94, 1024)
    assert s["kilostep_scale"] == pytest.approx(1024 * (1 + 1 / 0.15))
    assert s["kilostep_scale"] == pytest.approx(7850.67, abs=0.01)
    assert s["lr"] == pytest.approx(1.465e-3, rel=1e-3)
    assert s["lr"] == pytest.approx(11.5 / 7850.6667)
    assert s["lr"] * 1024 == pytest.approx(1.5, rel=1e-3)  # on the batch-mean loss
    assert s["wd"] == pytest.approx(0.0153 * 1024 / 7850.6667)
    assert s["wd"] == pytest.approx(2.0e-3, rel=3e-3)
    assert s["lr_bias"] == 64 * s["lr"]
    # torch SGD decays lr * weight_decay * w per step: the same absolute decay for both groups.
    assert s["lr"] * s["weight_decay"] == pytest.approx(s["wd"])
    assert s["lr_bias"] * s["weight_decay_bias"] == pytest.approx(s["wd"])
    assert ab.sgd_settings(AB96, 1024)["lr"] == pytest.approx(9.0 / 7850.6667)
    assert ab.sgd_settings(AB94, 128)["wd"] == pytest.approx(s["wd"] / 8)  # wd follows the batch


def test_optimizer_groups_and_lambdalr():
    net = ab.build_net(AB94)
    opt = ab.make_optimizer(net, AB94, 1024)
    s = ab.sgd_settings(AB94, 1024)
    bn_group, other = opt.param_groups
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(bns) == 6 and [id(p) for p in bn_group["params"]] == [id(m.bias) for m in bns]
    assert bn_group["lr"] == s["lr_bias"] and bn_group["weight_decay"] == s["weight_decay_bias"]
    ids = {id(p) for p in other["params"]}
    assert id(net.whiten.bias) in ids and id(net.head.weight) in ids
    assert id(net.whiten.weight) not in ids and not ids & {id(m.weight) for m in bns}
    assert len(other["params"]) == 1 + 6 + 1  # whitening bias, 6 convs, head
    assert other["lr"] == s["lr"] and opt.defaults["nesterov"] and opt.defaults["momentum"] == 0.85
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: ab.lr_factor(k, 476, AB94))
    assert other["lr"] == pytest.approx(0.2 * s["lr"])
    for _ in range(109):
        opt.step()
        sched.step()
    assert other["lr"] == pytest.approx(s["lr"]) and bn_group["lr"] == pytest.approx(s["lr_bias"])


# ---------------------------------------------------------------------------------------------
# Model

def test_parameter_counts():
    counts = {v: ab.count_params(ab.build_net(ab.HYP[v])) for v in VARIANTS}
    assert counts["airbench94"][0] == 1_972_792  # frozen whitening weights and BN scales in
    assert counts["airbench95"][0] == 4_606_520
    assert counts["airbench96"][0] == 9_918_776
    assert round(counts["airbench95"][0] / 1e6, 2) == 4.61
    assert round(counts["airbench96"][0] / 1e6, 2) == 9.92
    # Trainable: less the 24x3x2x2 whitening weights and one frozen scale per BN channel.
    assert counts["airbench94"][1] == 1_972_792 - 288 - 2 * (64 + 256 + 256)
    assert counts["airbench96"][1] == 9_918_776 - 288 - 3 * (128 + 384 + 512)


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_shape_and_dtype(variant):
    torch.manual_seed(0)
    net = ab.build_net(ab.HYP[variant])
    x = torch.randn(32, 3, 32, 32)
    for mode in (True, False):
        net.train(mode)
        with torch.no_grad():
            logits = net(x)
        assert logits.shape == (32, 10) and logits.dtype == torch.float32


def test_layers_bn_identity_init_and_head():
    net = ab.build_net(AB94)
    assert net.whiten.kernel_size == (2, 2) and net.whiten.padding == (0, 0)
    assert net.whiten.out_channels == 24 and not net.whiten.weight.requires_grad
    assert net.whiten.bias.requires_grad and torch.equal(net.whiten.bias, torch.zeros(24))
    assert net.head.bias is None and net.scale == 1 / 9 and isinstance(net.pool, torch.nn.MaxPool2d)
    assert net.pool.kernel_size == 3
    convs = [m for m in net.groups.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 6 and all(c.bias is None and c.padding == "same" for c in convs)
    for conv in convs:  # the first c_in filters are the identity
        c_in = conv.in_channels
        expected = torch.zeros(c_in, c_in, 3, 3)
        expected[torch.arange(c_in), torch.arange(c_in), 1, 1] = 1
        assert torch.equal(conv.weight[:c_in], expected)
        if conv.out_channels > c_in:
            assert conv.weight[c_in:].abs().sum() > 0  # the rest keeps PyTorch's init
    for variant, momentum in (("airbench94", 0.4), ("airbench95", 0.4), ("airbench96", 0.1)):
        bns = [m for m in ab.build_net(ab.HYP[variant]).modules()
               if isinstance(m, torch.nn.BatchNorm2d)]
        assert all(b.eps == 1e-12 and b.momentum == momentum for b in bns)
        assert all(not b.weight.requires_grad and b.bias.requires_grad for b in bns)
    # The spatial path: 32 -> 31 (2x2 whitening) -> 15 -> 7 -> 3 -> 1.
    sizes = []
    for m in (net.whiten, *net.groups, net.pool):
        m.register_forward_hook(lambda m, i, o: sizes.append(tuple(o.shape[-2:])))
    net(torch.randn(2, 3, 32, 32))
    assert sizes == [(31, 31), (15, 15), (7, 7), (3, 3), (1, 1)]


def _manual_group(g, x, residual):
    def bn(i, v):
        n = g.norms[i]
        return F.batch_norm(v, None, None, n.weight, n.bias, True, 0.0, 1e-12)
    x = F.gelu(bn(0, F.max_pool2d(g.convs[0](x), 2)))
    if residual:  # airbench96: x0 + (conv-BN-GELU-conv-BN), then GELU
        y = bn(2, g.convs[2](F.gelu(bn(1, g.convs[1](x)))))
        return F.gelu(x + y)
    return F.gelu(bn(1, g.convs[1](x)))


def test_airbench96_residual_placement_and_plain_groups():
    torch.manual_seed(0)
    small96 = {**AB96, "widths": (8, 16, 16)}
    g96 = ab.ConvGroup(6, 8, small96).train()
    with torch.no_grad():  # move the weights off their identity init so the paths differ
        for c in g96.convs:
            c.weight.add_(0.1 * torch.randn_like(c.weight))
        for n in g96.norms:
            n.bias.add_(0.1 * torch.randn_like(n.bias))
    x = torch.randn(4, 6, 10, 10)
    assert len(g96.convs) == 3 and len(g96.norms) == 3
    assert torch.allclose(g96(x), _manual_group(g96, x, residual=True), atol=1e-5)
    # Not a residual around all three convs, nor around nothing:
    y0 = F.gelu(F.batch_norm(F.max_pool2d(g96.convs[0](x), 2), None, None, None,
                             g96.norms[0].bias, True, 0.0, 1e-12))
    assert not torch.allclose(g96(x), y0, atol=1e-3)
    g94 = ab.ConvGroup(6, 8, AB94).train()
    assert len(g94.convs) == 2 and not g94.residual
    assert torch.allclose(g94(x), _manual_group(g94, x, residual=False), atol=1e-5)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in ab.build_net(AB96).modules()) == 10


def test_half_precision_keeps_batchnorm_in_float32():
    net = ab.to_training_precision(ab.build_net({**AB94, "widths": (8, 16, 16)}), half=True)
    for name, tensor in list(net.named_parameters()) + list(net.named_buffers()):
        if not tensor.is_floating_point():
            continue
        expected = torch.float32 if ".norms." in name else torch.float16
        assert tensor.dtype == expected, name
    assert net.groups[0].convs[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_whitening_filters_whiten_their_source_patches():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 16, 16, generator=gen)
    x = F.avg_pool2d(F.pad(x, (1, 1, 1, 1), mode="reflect"), 3, stride=1)  # correlated patches
    x[:, 2] = x[:, 1] + 0.003 * x[:, 2]  # near-duplicate channel: tiny eigenvalues to damp
    eps = 5e-4
    filters, evals = ab.whitening_filters(x, 2, eps)
    assert filters.shape == (24, 3, 2, 2) and torch.equal(filters[12:], -filters[:12])
    assert list(evals) == sorted(evals, reverse=True)
    z = F.conv2d(x, filters[:12]).permute(0, 2, 3, 1).reshape(-1, 12).double()
    cov = z.T @ z / len(z)  # uncentred, over n, as the filters were made
    big, small = evals > 100 * eps, evals < eps
    assert 0 < big.sum() < 12 and small.any()
    assert torch.allclose(cov, torch.diag(evals / (evals + eps)), atol=1e-4)
    assert torch.allclose(cov[big][:, big], torch.eye(int(big.sum()), dtype=torch.float64),
                          atol=1.1e-2)
    assert (torch.diagonal(cov)[small] < 0.5).all()  # damped, not blown up to 1
    # The model's init reads the first whiten_images images, normalised.
    net = ab.build_net({**AB94, "widths": (8, 16, 16), "whiten_images": 40})
    images = torch.rand(50, 3, 32, 32, generator=gen)
    ab.init_whitening(net, images, {**AB94, "whiten_images": 40})
    expected, _ = ab.whitening_filters(ab.normalise(images[:40]), 2, 5e-4)
    assert torch.equal(net.whiten.weight, expected)


# ---------------------------------------------------------------------------------------------
# Data

def test_alternating_flip_sets_are_complementary():
    gen = torch.Generator().manual_seed(1)
    images = torch.rand(200, 3, 32, 32, generator=gen)
    hyp = {**AB94, "translate": 0}
    data = ab.TrainData(images, torch.zeros(200, dtype=torch.long), hyp, seed=3)
    data.prepare()
    flip0 = data.flip0
    assert 60 < flip0.sum() < 140
    norm = ab.normalise(images)
    views = [ab.epoch_views(data.base, e, hyp, gen)[0] for e in range(4)]
    for e, v in enumerate(views):
        mirrored = ab.flipped_in_epoch(flip0, e)
        expected = torch.where(mirrored.view(-1, 1, 1, 1), norm.flip(-1), norm)
        assert torch.equal(v, expected), e
    for e in range(3):  # every image is mirrored in exactly one of any two consecutive epochs
        assert torch.equal(ab.flipped_in_epoch(flip0, e) ^ ab.flipped_in_epoch(flip0, e + 1),
                           torch.ones(200, dtype=torch.bool))
    assert torch.equal(views[0], views[2]) and torch.equal(views[1], views[0].flip(-1))


@pytest.mark.parametrize("variant", ["airbench94", "airbench96"])
def test_crops_stay_within_the_padding(variant):
    hyp = ab.HYP[variant]
    pad = hyp["translate"]
    gen = torch.Generator().manual_seed(2)
    images = torch.rand(2000, 3, 32, 32, generator=gen) + 1  # no zeros of their own
    base = F.pad(images, (pad,) * 4, mode="reflect")
    x, shifts, corners = ab.epoch_views(base, 1, {**hyp, "cutout": 0}, gen)
    assert corners is None and x.shape == (2000, 3, 32, 32)
    assert shifts.min() == -pad and shifts.max() == pad  # every offset reached, none beyond
    assert len(torch.unique(shifts[:, 0] * 100 + shifts[:, 1])) == (2 * pad + 1) ** 2
    for i in range(0, 2000, 97):
        dy, dx = shifts[i].tolist()
        window = base[i, :, pad + dy:pad + dy + 32, pad + dx:pad + dx + 32]
        assert torch.equal(x[i], window.flip(-1)), i  # epoch 1: the whole set mirrored
    assert torch.equal(ab.crop(base, torch.zeros(2000, 2, dtype=torch.long)), images)


def test_cutout_windows_lie_fully_inside_the_image():
    gen = torch.Generator().manual_seed(3)
    n = 3000
    base = torch.rand(n, 3, 40, 40, generator=gen) + 1
    x, shifts, corners = ab.epoch_views(base, 0, AB96, gen)
    assert AB96["cutout"] == 12 and AB96["translate"] == 4 and shifts.abs().max() == 4
    assert corners.min() == 0 and corners.max() == 32 - 12  # both extremes, never beyond
    zeros = x == 0
    assert torch.equal(zeros.sum(dim=(1, 2, 3)), torch.full((n,), 3 * 12 * 12))
    for i in range(0, n, 131):
        cy, cx = corners[i].tolist()
        assert zeros[i, :, cy:cy + 12, cx:cx + 12].all(), i


def test_training_epochs_are_permutations_with_seeded_order():
    images = torch.rand(300, 3, 32, 32)
    labels = torch.arange(300)

    def epoch_order(seed, epoch_count=2):
        data = ab.TrainData(images, labels, AB94, seed)
        data.prepare()
        return [data.epoch(e)[1] for e in range(epoch_count)]

    a, b, c = epoch_order(0), epoch_order(0), epoch_order(1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # the seed decides
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], c[0])
    assert torch.equal(a[0].sort().values, torch.arange(300))


# ---------------------------------------------------------------------------------------------
# Lookahead, TTA, warm-up

def test_lookahead_lerps_then_copies_back_and_skips_integer_buffers():
    torch.manual_seed(0)
    net = ab.build_net({**AB94, "widths": (8, 16, 16)})
    look = ab.Lookahead(net)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    net(torch.randn(4, 3, 32, 32))  # moves BN running stats and num_batches_tracked
    moved = {k: v.clone() for k, v in net.state_dict().items()}
    look.update(net, 0.25)
    for k, v in net.state_dict().items():
        if v.is_floating_point():
            expected = before[k] + 0.75 * (moved[k] - before[k])
            assert torch.allclose(v, expected, atol=1e-6) and torch.equal(v, look.state[k]), k
        else:
            assert k not in look.state and torch.equal(v, moved[k]), k
    with torch.no_grad():
        net.head.weight.add_(5.0)
    look.update(net, 1.0)  # the final update: net <- ema, ema unchanged
    assert torch.equal(net.head.weight, look.state["head.weight"])


def test_tta_level_2_is_six_views_weighted_as_the_source():
    calls = []
    weights = torch.randn(3 * 8 * 8, 10, generator=torch.Generator().manual_seed(0))

    def fwd(v):
        calls.append(v.clone())
        return v.flatten(1) @ weights

    x = torch.randn(5, 3, 8, 8)
    out = ab.tta_logits(fwd, x, 2)
    assert len(calls) == 6
    pad = F.pad(x, (1, 1, 1, 1), mode="reflect")
    up_left, down_right = pad[:, :, :8, :8], pad[:, :, 2:, 2:]

    def mirror(v):
        return (fwd(v) + fwd(v.flip(-1))) / 2

    expected = 0.5 * mirror(x) + 0.25 * mirror(up_left) + 0.25 * mirror(down_right)
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.equal(up_left[:, :, 1:, 1:], x[:, :, :-1, :-1])  # shifted, not something else
    calls.clear()
    assert torch.allclose(ab.tta_logits(fwd, x, 1), mirror(x)) and len(calls) == 4
    assert torch.equal(ab.tta_logits(fwd, x, 0), fwd(x))


def test_warm_up_leaves_the_model_as_it_was_and_explains_a_failed_compile():
    torch.manual_seed(0)
    hyp = {**AB94, "widths": (8, 16, 16), "batch_size": 16, "eval_batch": 20}
    net = ab.build_net(hyp)
    x_train = torch.rand(40, 32, 32, 3).permute(0, 3, 1, 2)  # channels_last, as uploaded
    x_test, y_test = torch.rand(30, 32, 32, 3).permute(0, 3, 1, 2), torch.randint(0, 10, (30,))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    calls = []

    def counting(x):
        calls.append((x.shape, x.stride(), torch.is_grad_enabled(), net.training,
                      net.whiten.bias.requires_grad))
        return net(x)

    graphs = ab.Graphs(functools.partial(ab.forward_loss, counting, label_smoothing=0.2),
                       functools.partial(ab.eval_logits, counting), compiled=False)
    ab.warm_up(graphs, net, hyp, x_train, x_test, y_test)
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert net.training and net.whiten.bias.requires_grad
    assert all(p.grad is None for p in net.parameters())
    train_calls = {c for c in calls if c[3]}
    assert {c[4] for c in train_calls} == {True, False} and all(c[2] for c in train_calls)
    assert {c[0][0] for c in calls if not c[3]} == {20, 10}  # every eval batch size
    assert {c[4] for c in calls if not c[3]} == {True, False}
    # 2 batches x (1 view at the per-epoch level 0 + 6 at the final level 2), bias both ways
    assert len([c for c in calls if not c[3]]) == 2 * 2 * (1 + 6)

    def broken(x):
        raise RuntimeError("no working C++ compiler found")

    with pytest.raises(SystemExit, match="airbench94: compile=true failed.*no working C.. "
                                         "compiler.*compile=false"):
        ab.warm_up(ab.Graphs(functools.partial(ab.forward_loss, broken, label_smoothing=0.2),
                             functools.partial(ab.eval_logits, broken), compiled=True),
                   net, hyp, x_train, x_test, y_test, "airbench94")


@pytest.mark.parametrize("scope", ab.COMPILE_SCOPES)
def test_each_compile_scope_compiles_what_it_names(scope, tmp_path, monkeypatch):
    """issue 17: compile_scope model compiles the model's forward (used by training and
    evaluation); step also the training forward + loss as one function; eval also the whole
    TTA evaluation; all both. Inductor's cache goes to the data dir."""
    compiled = []
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # so that what build_graphs sets is undone
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append((fn, kw)) or fn)
    hyp = {**AB94, "widths": (8, 16, 16)}
    net = ab.build_net(hyp)
    args = ab.build_parser("airbench94").parse_args(
        ["--compile", "true", "--compile_scope", scope])
    graphs = ab.build_graphs(net, hyp, args, tmp_path, cuda=True)
    assert graphs.compiled and compiled[0] == (net, {"mode": "max-autotune"})
    functions = [getattr(fn, "func", None) for fn, _ in compiled[1:]]
    assert functions == {"model": [], "step": [ab.forward_loss], "eval": [ab.eval_logits],
                         "all": [ab.forward_loss, ab.eval_logits]}[scope]
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor-cache")
    x, y = torch.rand(4, 3, 32, 32), torch.randint(0, 10, (4,))
    loss, logits = graphs.train(x, y)  # every scope computes the same thing as eager
    eager_loss, eager_logits = ab.forward_loss(net, x, y, hyp["label_smoothing"])
    assert torch.equal(logits, eager_logits) and torch.equal(loss, eager_loss)
    net.eval()
    assert torch.equal(graphs.logits(x, 2), ab.tta_logits(net, ab.normalise(x), 2))


# ---------------------------------------------------------------------------------------------
# Training, end to end (in process: the tiny configuration; as a subprocess: the smoke profile)

# 320 images at batch 64: 5 steps per epoch, so lookahead updates land on epoch boundaries.
TINY = ["--data", "synthetic", "--synthetic_train", "320", "--synthetic_test", "64",
        "--widths", "8,16,16", "--batch_size", "64", "--epochs", "4", "--tta_level", "2",
        "--device", "cpu"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One synthetic data cache for the whole module (it is written once per size and seed)."""
    return tmp_path_factory.mktemp("data")


def _run(tmp_path, job, *extra, variant="airbench94", data=None):
    data = data or tmp_path / "data"
    return ab.main(variant, TINY + ["--job-dir", str(tmp_path / job), "--data-dir", str(data),
                                    *extra])


def _ckpt(tmp_path, job):
    return torch.load(tmp_path / job / "checkpoints" / "last.pt", weights_only=True)


def _rows(tmp_path, job):
    """The job's metrics rows, less the startup rows (one per process: a resumed job has
    two, each with its own timings)."""
    return [r for r in metrics.read_metrics(tmp_path / job / "metrics.jsonl")
            if r.get("event") != "startup"]


def _assert_same_final_state(reference, resumed, label):
    a, b = reference["run_state"], resumed["run_state"]
    assert b["done"] and b["step"] == a["step"], label
    for part in ("model", "ema"):
        assert a[part].keys() == b[part].keys()
        for k, v in a[part].items():
            assert torch.equal(v, b[part][k]), (label, part, k)
    for i, state in a["optimizer"]["state"].items():
        assert torch.equal(state["momentum_buffer"], b["optimizer"]["state"][i]["momentum_buffer"])
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"]
    assert resumed["accs"] == reference["accs"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_dir):
    """The uninterrupted tiny run: 4 epochs, 20 steps."""
    tmp = tmp_path_factory.mktemp("straight")
    assert _run(tmp, "straight", data=data_dir) == 0
    return tmp


def test_resume_after_stop_at_step_is_bit_for_bit(straight, tmp_path, data_dir):
    reference = _ckpt(straight, "straight")
    assert reference["run_state"]["step"] == 20 and reference["total_steps"] == 20
    ref_rows = _rows(straight, "straight")
    # Mid-epoch 3, at the epoch boundary where the whitening bias freezes, mid-epoch 4.
    for job, stop in (("mid-epoch", 13), ("boundary", 15), ("frozen", 17)):
        assert _run(tmp_path, job, "--stop-at-step", str(stop), data=data_dir) == 143
        assert _ckpt(tmp_path, job)["run_state"]["step"] == stop
        assert _run(tmp_path, job, "--resume", "true", data=data_dir) == 0
        _assert_same_final_state(reference, _ckpt(tmp_path, job), job)
        rows = _rows(tmp_path, job)
        assert [r.get("epoch") for r in rows] == [r.get("epoch") for r in ref_rows]
        for key in ("step", "lr", "lr_factor", "train_loss", "train_acc", "test_acc",
                    "final_test_acc", "mean_acc"):
            assert [r.get(key) for r in rows] == [r.get(key) for r in ref_rows], (job, key)


def test_whitening_bias_trains_for_3_epochs_then_freezes(straight, tmp_path, data_dir):
    assert _run(tmp_path, "j", "--stop-at-step", "13", data=data_dir) == 143
    mid = _ckpt(tmp_path, "j")["run_state"]
    assert _run(tmp_path, "j", "--resume", "true", "--stop-at-step", "15", data=data_dir) == 143
    after3 = _ckpt(tmp_path, "j")["run_state"]
    final = _ckpt(straight, "straight")["run_state"]
    assert mid["whiten_bias_trainable"] and not after3["whiten_bias_trainable"]
    assert after3["epoch"] == 3 and after3["step"] == 15
    bias = "whiten.bias"
    assert after3["model"][bias].abs().sum() > 0                   # it trained ...
    assert not torch.equal(mid["model"][bias], after3["model"][bias])
    assert torch.equal(after3["model"][bias], final["model"][bias])  # ... then never moved
    assert not torch.equal(after3["model"]["head.weight"], final["model"]["head.weight"])
    n_bn = len(after3["optimizer"]["param_groups"][0]["params"])
    bias_id = after3["optimizer"]["param_groups"][1]["params"][0]  # first of the other group
    assert torch.equal(after3["optimizer"]["state"][bias_id]["momentum_buffer"],
                       final["optimizer"]["state"][bias_id]["momentum_buffer"])
    assert bias_id == n_bn


def test_resume_refuses_a_damaged_checkpoint_or_counts_past_the_schedule_F46(tmp_path,
                                                                          data_dir):
    """F46: a run state whose step or epoch lies past the schedule (TINY: 20 steps in 4
    epochs), a run past --runs, more completed runs than --runs: one line each; so is an
    empty checkpoint."""
    assert _run(tmp_path, "j", "--stop-at-step", "3", data=data_dir) == 143
    path = tmp_path / "j" / "checkpoints" / "last.pt"
    saved = _ckpt(tmp_path, "j")
    state = saved["run_state"]
    said = resume_refusals(lambda: _run(tmp_path, "j", "--resume", "true", data=data_dir), path,
                           [{**saved, "run_state": {**state, "step": 10 ** 18}},
                            {**saved, "run_state": {**state, "epoch": 5}}, {**saved, "run": 3},
                            {**saved, "accs": [0.9, 0.9]}])
    refused = f"airbench94: {path}: refused to resume: its "
    assert said[:-1] == [
        refused + "step is 1000000000000000000, outside this run's schedule (0 to 20)",
        refused + "epoch is 5, outside this run's schedule (0 to 4)",
        refused + "run is 3, outside this run's schedule (0 to 0)",
        refused + "completed_runs is 2, outside this run's schedule (0 to 1)"]
    assert said[-1].startswith(f"{path}: refused to load the checkpoint: it is damaged")


@pytest.mark.slow(seconds=15)
def test_runs_write_a_summary_and_resume_between_runs(tmp_path, data_dir):
    one_epoch = ["--epochs", "1", "--runs", "2"]  # 5 steps per run
    assert _run(tmp_path, "two", *one_epoch, data=data_dir) == 0
    rows = _rows(tmp_path, "two")
    finals = [r for r in rows if "final_test_acc" in r]
    assert [r["run"] for r in finals] == [0, 1] and all(r["tta_level"] == 2 for r in finals)
    epochs = [r for r in rows if "train_loss" in r and "final_test_acc" not in r]
    assert [r["run"] for r in epochs] == [0, 1]
    assert epochs[0]["train_loss"] != epochs[1]["train_loss"]  # seeds 0 and 1
    (summary,) = [r for r in rows if r.get("event") == "runs_summary"]
    accs = [r["final_test_acc"] for r in finals]
    assert summary["runs"] == 2 and summary["mean_acc"] == pytest.approx(sum(accs) / 2)
    assert summary["target"] == 0.94 and summary["reached"] == sum(a >= 0.94 for a in accs)
    # Stopped in the middle of run 1 (job step 7 = run 1, step 2), then resumed.
    assert _run(tmp_path, "cut", *one_epoch, "--stop-at-step", "7", data=data_dir) == 143
    cut = _ckpt(tmp_path, "cut")
    assert cut["run"] == 1 and cut["accs"] == accs[:1] and cut["run_state"]["step"] == 2
    assert _run(tmp_path, "cut", *one_epoch, "--resume", "true", data=data_dir) == 0
    _assert_same_final_state(_ckpt(tmp_path, "two"), _ckpt(tmp_path, "cut"), "runs")
    (again,) = [r for r in _rows(tmp_path, "cut") if r.get("event") == "runs_summary"]
    assert again["mean_acc"] == summary["mean_acc"]


def test_resume_refuses_a_checkpoint_from_other_arguments(tmp_path, capsys, data_dir):
    assert _run(tmp_path, "j", "--stop-at-step", "1", data=data_dir) == 143
    with pytest.raises(SystemExit, match="widths=.8, 16, 16.*this run has .8, 16, 32"):
        _run(tmp_path, "j", "--widths", "8,16,32", "--resume", "true", data=data_dir)
    with pytest.raises(SystemExit, match="written by airbench94"):
        _run(tmp_path, "j", "--resume", "true", variant="airbench95", data=data_dir)
    assert _run(tmp_path, "fresh", "--epochs", "1", "--resume", "true", data=data_dir) == 0
    assert "no checkpoint" in capsys.readouterr().err


@pytest.mark.slow(seconds=25)
@pytest.mark.parametrize("variant", ["airbench95", "airbench96"])
def test_smoke_configuration_learns(tmp_path, variant, data_dir):
    doc = yaml.safe_load((REPO / "recipes" / variant / "recipe.yaml").read_text())
    argv = []
    for key, value in doc["profiles"]["smoke"]["set"].items():
        argv += [f"--{key}", str(value)]
    argv += ["--device", "cpu", "--job-dir", str(tmp_path / "job"), "--data-dir", str(data_dir)]
    assert ab.main(variant, argv) == 0
    rows = [r for r in _rows(tmp_path, "job") if "train_loss" in r and "final_test_acc" not in r]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert rows[1]["train_loss"] < rows[0]["train_loss"] - 0.03, rows


# The smoke profile exactly as the orchestrator runs it: recipe and common copied into a job
# dir, every declared argument with a value after the profile, from the job dir.

def _env(job, data_dir):
    return {**os.environ, "CLOUDTRAIN_JOB_DIR": str(job), "CLOUDTRAIN_DATA_DIR": str(data_dir),
            "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow(seconds=25)
def test_smoke_profile_as_the_orchestrator_runs_it(tmp_path, data_dir):
    job = recipe_job_dir(tmp_path, "airbench94")
    proc = subprocess.run(recipe_command("airbench94"), cwd=job, env=_env(job, data_dir),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].startswith("airbench94: starting (--epochs 2")
    # its time against the goal (< 60 s): benchmarks/smoke_profiles.py

    rows = metrics.read_metrics(job / "metrics.jsonl")
    epochs = [r for r in rows if "train_loss" in r and "final_test_acc" not in r]
    required = {"time", "epoch", "epochs", "step", "lr", "train_loss", "train_acc", "test_acc",
                "train_time", "wall_time"}
    assert [r["epoch"] for r in epochs] == [1, 2]
    for r in epochs:
        assert required <= set(r) and "run" not in r and "event" not in r, r
        assert r["epochs"] == 2 and r["step"] == 8 * r["epoch"]
        assert 0 <= r["train_acc"] <= 1 and 0 <= r["test_acc"] <= 1
        assert 0 < r["train_time"] < r["wall_time"]
    assert epochs[1]["train_time"] > epochs[0]["train_time"]
    assert epochs[0]["lr"] == pytest.approx(
        ab.lr_factor(7, 16, AB94) * ab.sgd_settings(AB94, 128)["lr"] * 128)
    # The loss must clearly fall (label smoothing 0.2 keeps it well above 0).
    assert epochs[1]["train_loss"] < epochs[0]["train_loss"] - 0.05, epochs
    (final,) = [r for r in rows if "final_test_acc" in r]
    assert final["tta_level"] == 0 and final["step"] == 16
    assert final["train_time"] >= epochs[1]["train_time"]
    assert [r["event"] for r in rows if "event" in r][-1] == "runs_summary"
    assert any(line.startswith("           0           2") for line in proc.stdout.splitlines())

    ckpt = torch.load(job / "checkpoints" / "last.pt", weights_only=True)
    state = ckpt["run_state"]
    assert {"model", "ema", "optimizer", "scheduler", "gen_state", "rng", "partial",
            "whiten_bias_trainable", "train_time", "epoch", "step", "done"} <= set(state)
    assert state["done"] and state["step"] == 16 and ckpt["accs"] == [final["final_test_acc"]]
    assert ckpt["args"]["widths"] == (16, 32, 32) and ckpt["total_steps"] == 16
    assert (data_dir / "synthetic-cifar10-1024-512-0" / "cifar-10-batches-py"
            / "data_batch_1").is_file()


LONG = "12"  # epochs: 60 tiny steps, so a signal sent after epoch 1 lands long before the end


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory, data_dir):
    tmp = tmp_path_factory.mktemp("long")
    assert ab.main("airbench94", TINY + ["--epochs", LONG, "--job-dir", str(tmp),
                                         "--data-dir", str(data_dir)]) == 0
    return torch.load(tmp / "checkpoints" / "last.pt", weights_only=True)


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_checkpoints_at_a_step_boundary_and_resumes_bit_for_bit(tmp_path, sig, data_dir,
                                                                        long_reference):
    job = recipe_job_dir(tmp_path, "airbench94")
    command = [sys.executable, "recipes/airbench94/train.py", *TINY, "--epochs", LONG]
    proc = subprocess.Popen(command, cwd=job, env=_env(job, data_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:  # wait until epoch 1 is done: training is under way
            if line.startswith("           0           1 "):
                break
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out
    assert signal.Signals(sig).name in out and "checkpoint saved" in out
    stopped = torch.load(job / "checkpoints" / "last.pt", weights_only=True)
    assert 5 <= stopped["run_state"]["step"] < 60 and not stopped["run_state"]["done"]
    assert ab.main("airbench94", TINY + ["--epochs", LONG, "--resume", "true", "--job-dir",
                                         str(job), "--data-dir", str(data_dir)]) == 0
    resumed = torch.load(job / "checkpoints" / "last.pt", weights_only=True)
    _assert_same_final_state(long_reference, resumed, signal.Signals(sig).name)


# ---------------------------------------------------------------------------------------------
# recipe.yaml

@pytest.mark.parametrize("variant", VARIANTS)
def test_recipe_yaml_loads_and_matches_the_script(variant):
    from cloudtrain import recipes

    recipe = recipes.load(variant)
    hyp = ab.HYP[variant]
    assert recipe.target == {"metric": "test_acc", "value": hyp["target"]}
    assert recipe.resources["gpus_per_node"] == 1 and recipe.resources["nodes"] == 1
    for pub in recipe.published:
        assert {"result", "time", "hardware", "source"} <= set(pub)
        # The catalog's names: the records ran on an A100-SXM4-80GB, the compiled one on 40GB.
        assert pub["gpu"] == ("A100-80GB" if "80GB" in pub["hardware"] else "A100")
        assert pub["gpus"] == 1 and pub["runs"] >= 200
        assert isinstance(pub["seconds"], float) and 0 < pub["seconds"] < 60
        assert abs(pub["accuracy"] - hyp["target"]) < 0.001
    # Every argument the orchestrator may pass is one the script accepts.
    values = recipe.resolve("smoke")
    args = ab.build_parser(variant).parse_args(recipe.script_args(values))
    assert args.widths == (16, 32, 32) and args.batch_size == 128 and args.epochs == 2.0
    assert args.tta_level == 0 and args.data == "synthetic" and args.synthetic_train == 1024
    defaults = ab.build_parser(variant).parse_args(
        recipe.script_args(recipe.resolve(None, ("compile=true", "runs=3"))))
    assert defaults.compile and defaults.runs == 3 and defaults.batch_size == hyp["batch_size"]
    assert ab.variant_hyp(variant, defaults)["widths"] == hyp["widths"]


@pytest.mark.slow(seconds=90)
def test_compile_scope_all_really_compiles_and_trains_as_eager(tmp_path, monkeypatch):
    """issue 17, with torch.compile itself (its default mode on the CPU): the `all` scope
    compiles the model, the training forward + loss (a functools.partial) and the whole TTA
    evaluation, off the clock (the startup row's `compile`), into the data dir's cache; the
    run then takes the eager run's steps to within float32 rounding."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # so that what the run sets is undone
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setattr(ab.compiling, "STARTED_WITH_CACHE_DIR", None)
    epochs = ["--epochs", "2"]
    assert _run(tmp_path, "compiled", *epochs, "--compile", "true",
                "--compile_scope", "all") == 0
    assert _run(tmp_path, "eager", *epochs) == 0
    start = [r for r in metrics.read_metrics(tmp_path / "compiled" / "metrics.jsonl")
             if r.get("event") == "startup"][0]
    assert start["compile"] > 0 and "warm_up" not in start
    assert list((tmp_path / "data" / "inductor-cache").iterdir())
    compiled, eager = _rows(tmp_path, "compiled"), _rows(tmp_path, "eager")
    assert [r.get("epoch") for r in compiled] == [r.get("epoch") for r in eager]
    for a, b in zip(compiled, eager):
        if "train_loss" in a and a.get("event") is None:
            assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-3), (a, b)
    final = [next(r["final_test_acc"] for r in rows if "final_test_acc" in r)
             for rows in (compiled, eager)]
    assert final[0] == pytest.approx(final[1], abs=0.05)  # 64 test images: 3 may flip
