"""airbench: Keller Jordan's fast CIFAR-10 trainings (airbench94, airbench95, airbench96), shared.

Each recipes/airbench9x/train.py is a thin entry that names its variant and calls `main`. This
file holds everything else, in reading order: hyperparameters, command line, schedules, data
(loaded once onto the device, alternating flip, translate, cutout), the network and its
whitening init, lookahead, test-time augmentation, and the training loop with checkpoints,
resume and repeated runs. The facts it must match are in shared/recipes-spec.md section 1B.

Sources (AB = KellerJordan/cifar10-airbench, snapshot f1c599c; the legacy files last changed in
1b8f794): AB legacy/airbench94.py, legacy/airbench95.py, legacy/airbench96.py, and for the
compiled variant legacy/airbench94_compiled.py; paper arXiv 2404.00498. Our own code, written
from those files; none of it is copied.

Where this file had to choose (each is equivalent to the source or says how it is not)
  * Randomness. AB draws everything from the global CUDA RNG. We draw the data's randomness
    (epoch-0 flip, each epoch's crops, cutouts and order) from one torch.Generator on the data's
    device, seeded with the run's seed, in the source's order (flip once; per epoch: crop
    shifts, cutout corners, randperm). The model is initialised after torch.manual_seed(seed).
    Same distributions, different streams: a given seed does not reproduce an AB run.
  * Whitening covariance. AB: uncentred X^T X / n of all 2x2 patches of the first 5,000
    normalised training images (not flipped, not padded), in float32, `eigh` on the GPU. We
    accumulate X^T X in float64 chunks and run `eigh` in float64 on the CPU (a 12x12 matrix),
    then cast the filters to the model's dtype. Same filters up to float32 rounding.
  * Lookahead start. AB snapshots the lookahead state *before* the whitening init, so the
    first update (step 5, alpha = 0.95^5 * (5/476)^3 = 9e-7) pulls the frozen whitening weights
    9e-7 of the way back to their random init, which fp16 cannot even represent. We snapshot
    after the whitening init, so the frozen weights stay exactly the whitening filters.
  * alpha(step) = 0.95^5 * (step/total)^3 is computed in float64 (AB: a float32 tensor table),
    so alpha(total) is exactly 0.95**5.
  * The loss (label smoothing 0.2, summed over the batch) is computed in float32 from the
    logits, which are fp16 on CUDA; AB computes it on the fp16 logits. TTA averages logits in
    float32 (AB: fp16).
  * The final lookahead step is AB's: at step == total, net <- ema without a last lerp, so the
    updates of the steps after the last multiple of 5 (476 % 5 = 1 step for airbench94) are
    discarded, as in AB.
  * Metrics: train_loss and train_acc are the means over all of the epoch's batches (AB prints
    the last batch's). lr is the non-bias group's lr on the batch-*mean* loss (torch lr x
    batch size: 1.5 at airbench94's peak), lr_factor the LambdaLR factor of the epoch's last
    step.
  * The target. AB's accuracies are TTA level 2 at the end of a run; per-epoch test_acc is
    TTA level 0 (as in AB). The {"event": "target_reached"} row is written the first time
    either reaches the recipe's target, with its tta_level.
  * Timing (AB: CUDA events around the whitening init, each epoch's training, and the final
    TTA eval). Ours is the same, with perf_counter on the CPU. The epoch-0 preprocessing
    (normalise, flip, pad) falls inside epoch 0's training as in AB. The upload of the uint8
    set to the device and its conversion to fp16/255 happen once, before the clock, as AB's
    loader construction does. On resume, train_time continues from the checkpoint and the
    preprocessing repeated by the resumed process is not added again.
  * Warm-up. On CUDA (and with compile=true) the real model, before the first run, takes
    forward+backward passes on a batch of an even and of an odd epoch (random labels), with
    the whitening bias trainable and frozen, and evaluates the test set at the final TTA level
    in both states; then its state is restored. No optimizer step is taken. This picks cuDNN
    algorithms (cudnn.benchmark, as AB) and compiles every graph the runs will need, off the
    clock. In AB only the first run of a process is cold: later runs find cuDNN tuned.
  * compile=true wraps the model in torch.compile: on CUDA with mode='max-autotune' as AB's
    compiled variant (the CPU: the default mode). AB compiles two copies for trainable vs
    frozen whitening bias: we let dynamo guard on requires_grad and compile both graphs during
    the warm-up instead. Inductor's caches live in <data dir>/inductor-cache, so runs=N and
    the next job on a kept instance load the compiled graphs rather than compile again.
  * Startup (issue 17): an {"event": "startup"} row says what came before the first step:
    import (from the agent's start of the job), data, warm-up or compile, to_first_step.
  * Crop, flip and cutout run on the whole set once per epoch, as AB, but our crop copies
    rows then columns for every translate (AB has a per-offset-pair path for translate <= 2;
    the results are identical).
  * Resume. A checkpoint is written after every epoch, after every run, and at a step boundary
    on SIGTERM/SIGUSR1 (exit 143). It holds the model, the lookahead state, the optimizer
    (momentum buffers) and LambdaLR state, the data generator's state at the start of the
    epoch in progress, the global RNG states, the whitening-bias trainable flag, the epoch's
    partial loss/accuracy sums, and the runs completed so far with their accuracies. A resumed
    run redraws the epoch-0 flip from its seed, restores the generator, rebuilds the epoch's
    views and skips the batches already taken: on the CPU it ends bit-for-bit where the
    uninterrupted run ends (tests/unit/test_airbench.py). On CUDA it takes the same steps with
    the same data and lr, but cuDNN's autotuned kernels are not bit-deterministic.
  * runs=N: run r trains with common.runs.run_seed(seed, r); the dataset is read and uploaded
    once; the model is built once and each run copies a freshly seeded initialisation into it
    (so compiled graphs and cuDNN choices carry over); one metrics row per epoch and one final
    row per run carry `run` (when N > 1); a runs_summary row closes the job (also for N = 1).
"""
from __future__ import annotations

import argparse
import copy
import functools
import math
import os
import sys
import time
from dataclasses import dataclass, field

from . import compiling  # noqa: I001  (before torch: it reads $TORCHINDUCTOR_CACHE_DIR)
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import checkpoint, cifar10, distributed, metrics, runs, startup, stopping
from .arguments import adder, parse_bool
from .training import count_params, to_half_keep_bn_float

# =============================================================================================
# Hyperparameters, one dict per variant. lr and weight decay are AB's "decoupled" values per
# 1024 examples; `sgd_settings` turns them into torch.optim.SGD's lr and weight_decay.

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)  # per channel, on the 0-1 scale
CIFAR_STD = (0.2470, 0.2435, 0.2616)
IMAGE = 32                             # px; CIFAR-10 images are 32x32

_COMMON = {
    "batch_size": 1024,        # images per step; the last partial batch of an epoch is dropped
    "momentum": 0.85,          # Nesterov
    "bias_scaler": 64.0,       # BatchNorm biases: lr x64, same absolute weight decay
    "label_smoothing": 0.2,    # loss summed over the batch
    "whiten_bias_epochs": 3,   # epochs the whitening conv's bias trains before it freezes
    "whiten_kernel": 2,        # px; 2x2 patches -> 12 filters, concatenated with negations: 24
    "whiten_eps": 5e-4,        # added to the eigenvalues before 1/sqrt
    "whiten_images": 5000,     # first N normalised training images feed the patch covariance
    "bn_eps": 1e-12,
    "head_scale": 1 / 9,       # logits = Linear(no bias)(features) * 1/9
    "lr_start": 0.2,           # LambdaLR factor at step 0, linear up to 1.0 over the warmup
    "ema_every": 5,            # steps between lookahead updates
    "ema_rho": 0.95,           # alpha(step) = rho**every * (step/total)**3
    "flip": True,              # alternating flip (epoch-0 random flip, odd epochs mirrored)
    "tta_level": 2,            # final eval: 0 none, 1 mirror, 2 mirror + 1-px translations
    "eval_batch": 2000,        # images per eval forward
}

HYP = {
    "airbench94": {
        **_COMMON,
        "target": 0.94,            # mean TTA test accuracy the recipe reaches (n=1000: 94.01%)
        "epochs": 9.9,             # passes; ceil(48 * 9.9) = 476 steps, the last epoch partial
        "lr": 11.5,                # per 1024 examples (decoupled)
        "weight_decay": 0.0153,    # per 1024 examples (decoupled from lr)
        "warmup": 0.23,            # fraction of the steps with the linear 0.2 -> 1.0 warmup
        "lr_end": 0.07,            # factor at the last step, linear from 1.0 after the warmup
        "widths": (64, 256, 256),  # channels of the three conv groups
        "convs_per_group": 2,
        "residual": False,
        "bn_momentum": 0.4,        # PyTorch convention (AB: batchnorm_momentum 0.6 = 1 - 0.4)
        "translate": 2,            # px of random translation (reflect padding)
        "cutout": 0,               # px square; 0 = none
    },
    "airbench95": {
        **_COMMON,
        "target": 0.95,            # n=200: 95.01%
        "epochs": 15,              # 720 steps
        "lr": 10.0,
        "weight_decay": 0.0153,
        "warmup": 0.23,
        "lr_end": 0.07,
        "widths": (128, 384, 384),
        "convs_per_group": 2,
        "residual": False,
        "bn_momentum": 0.4,
        "translate": 2,
        "cutout": 0,
    },
    "airbench96": {
        **_COMMON,
        "target": 0.96,            # n=400: 96.03%
        "epochs": 37,              # 1776 steps
        "lr": 9.0,
        "weight_decay": 0.012,
        "warmup": 0.1,
        "lr_end": 0.0,             # decays linearly to 0
        "widths": (128, 384, 512),
        "convs_per_group": 3,      # conv-pool-BN-GELU, then residual over conv-BN-GELU-conv-BN
        "residual": True,
        "bn_momentum": 0.1,        # PyTorch default (AB96 passes no momentum)
        "translate": 4,
        "cutout": 12,              # px, square fully inside the image, filled with 0 (the mean)
    },
}

# =============================================================================================
# Command line. Every argument the recipe.yaml files declare, plus --job-dir / --data-dir
# (override the environment) and --stop-at-step (a testing aid). --name and --name-with-dashes
# both work.


def parse_widths(text: str) -> tuple:
    try:
        widths = tuple(int(w) for w in text.replace("/", ",").split(","))
    except ValueError:
        widths = ()
    if len(widths) != 3 or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"expected three channel counts like 64,256,256, "
                                         f"got {text!r}")
    return widths


def build_parser(variant: str) -> argparse.ArgumentParser:
    hyp = HYP[variant]
    p = argparse.ArgumentParser(
        prog=f"recipes/{variant}/train.py",
        description=f"{variant}: CIFAR-10 to {hyp['target']:.0%} mean test accuracy "
                    f"(Keller Jordan's cifar10-airbench, legacy/{variant}.py).",
        epilog=f"example (the smoke profile): python recipes/{variant}/train.py --data synthetic "
               f"--synthetic_train 1024 --synthetic_test 512 --widths 16,32,32 --batch_size 128 "
               f"--epochs 2 --tta_level 0",
    )

    arg = adder(p)
    arg("epochs", type=float, default=None,
        help=f"passes over the training set, may be fractional (default {hyp['epochs']})")
    arg("batch_size", type=int, default=hyp["batch_size"])
    arg("widths", type=parse_widths, default=None,
        help="channels of the three conv groups, e.g. 16,32,32 (default "
             + ",".join(map(str, hyp["widths"])) + ")")
    arg("tta_level", type=int, choices=[0, 1, 2], default=None,
        help=f"final evaluation's test-time augmentation (default {hyp['tta_level']})")
    arg("data", choices=["cifar10", "synthetic"], default="cifar10")
    arg("synthetic_train", type=int, default=5000, help="images (with --data synthetic)")
    arg("synthetic_test", type=int, default=1000, help="images (with --data synthetic)")
    arg("seed", type=int, default=0)
    arg("runs", type=int, default=1, help="independent trainings, run r with seed + r")
    arg("resume", type=parse_bool, default=False, help="continue from checkpoints/last.pt")
    arg("device", choices=["auto", "cpu", "cuda"], default="auto")
    arg("compile", type=parse_bool, default=False, help="torch.compile (see compile_scope)")
    arg("compile_scope", choices=COMPILE_SCOPES, default="model",
        help="with compile=true, what is compiled: model (the model's forward, as AB's "
             "compiled variant), step (also the training forward and loss as one graph), "
             "eval (also the whole evaluation with its TTA views as one graph), all (both)")
    arg("compile_mode", choices=compiling.MODES, default="auto",
        help="torch.compile mode; auto = max-autotune on CUDA, default on the CPU")
    arg("job_dir", default=None, help="default: $CLOUDTRAIN_JOB_DIR or ./cloudtrain-run")
    arg("data_dir", default=None, help="default: $CLOUDTRAIN_DATA_DIR or ~/.cloudtrain/data")
    arg("stop_at_step", type=int, default=None,
        help="testing aid: act as if SIGTERM arrived after this many steps (counted over "
             "all runs of the job)")
    return p


def variant_hyp(variant: str, args: argparse.Namespace | None = None) -> dict:
    """The variant's hyperparameters with the command line's overrides applied."""
    hyp = dict(HYP[variant])
    if args is not None:
        for key in ("epochs", "batch_size", "widths", "tta_level"):
            if getattr(args, key, None) is not None:
                hyp[key] = getattr(args, key)
    return hyp


# =============================================================================================
# Schedules and optimiser settings: pure functions of the step.


def total_steps(n_train: int, batch_size: int, epochs: float) -> int:
    """ceil(steps per epoch * epochs): 476 for airbench94 (48 * 9.9), 720, 1776."""
    return math.ceil((n_train // batch_size) * epochs)


def lr_factor(step: int, total: int, hyp: dict) -> float:
    """LambdaLR factor for step (0-based): linear lr_start -> 1.0 over int(warmup * total)
    steps, then linear 1.0 -> lr_end at step `total`."""
    warm = int(total * hyp["warmup"])
    if step < warm:
        frac = step / warm
        return hyp["lr_start"] * (1 - frac) + 1.0 * frac
    frac = (step - warm) / (total - warm)
    return 1.0 * (1 - frac) + hyp["lr_end"] * frac


def lookahead_alpha(step: int, total: int, hyp: dict) -> float:
    """Weight the lookahead state keeps at a lookahead update after `step` steps."""
    return hyp["ema_rho"] ** hyp["ema_every"] * (step / total) ** 3


def sgd_settings(hyp: dict, batch_size: int) -> dict:
    """AB's decoupled lr and weight decay turned into torch.optim.SGD values (per summed loss).
    kilostep_scale = 1024 * (1 + 1/(1 - momentum)) is how much larger Nesterov steps are than
    the gradient of 1024 examples; wd is the per-step decay at factor 1.0, the same absolute
    decay for both groups (the SGD weight_decay parameter is wd / lr of its group)."""
    kilostep_scale = 1024 * (1 + 1 / (1 - hyp["momentum"]))
    lr = hyp["lr"] / kilostep_scale
    wd = hyp["weight_decay"] * batch_size / kilostep_scale
    lr_bias = lr * hyp["bias_scaler"]
    return {"kilostep_scale": kilostep_scale, "lr": lr, "wd": wd, "lr_bias": lr_bias,
            "weight_decay": wd / lr, "weight_decay_bias": wd / lr_bias}


# =============================================================================================
# Data: the whole set lives on the device; every epoch is one batched augmentation pass.


def to_device_images(images_nhwc: np.ndarray, device: torch.device, dtype) -> torch.Tensor:
    """uint8 NHWC -> (N, 3, 32, 32) in [0, 1], dtype, channels_last memory (a permuted view of
    the NHWC upload), on the device."""
    t = torch.from_numpy(images_nhwc).to(device)
    return (t.to(dtype) / 255).permute(0, 3, 1, 2)


def normalise(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(CIFAR_MEAN, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def crop(padded: torch.Tensor, shifts: torch.Tensor, size: int = IMAGE) -> torch.Tensor:
    """Image i's size x size window displaced by shifts[i] = (dy, dx) from the centre of its
    padded copy, |dy|, |dx| <= pad. Copies rows for each dy, then columns for each dx."""
    n, c, hp, wp = padded.shape
    pad = (hp - size) // 2
    rows = torch.empty((n, c, size, wp), dtype=padded.dtype, device=padded.device)
    for dy in range(-pad, pad + 1):
        chosen = shifts[:, 0] == dy
        rows[chosen] = padded[chosen, :, pad + dy:pad + dy + size, :]
    out = torch.empty((n, c, size, size), dtype=padded.dtype, device=padded.device,
                      memory_format=torch.channels_last)
    for dx in range(-pad, pad + 1):
        chosen = shifts[:, 1] == dx
        out[chosen] = rows[chosen, :, :, pad + dx:pad + dx + size]
    return out


def cutout(x: torch.Tensor, corners: torch.Tensor, size: int) -> torch.Tensor:
    """Zero a size x size square per image whose top-left corner is corners[i] = (y, x)."""
    h, w = x.shape[-2:]
    ys = torch.arange(h, device=x.device).view(1, h, 1)
    xs = torch.arange(w, device=x.device).view(1, 1, w)
    cy, cx = corners[:, 0].view(-1, 1, 1), corners[:, 1].view(-1, 1, 1)
    inside = (ys >= cy) & (ys < cy + size) & (xs >= cx) & (xs < cx + size)
    return x.masked_fill(inside[:, None], 0)


def flipped_in_epoch(flip0: torch.Tensor, epoch: int) -> torch.Tensor:
    """Alternating flip: whether each image is mirrored in `epoch`, given the epoch-0 draw."""
    return flip0 ^ bool(epoch % 2)


def epoch_views(base: torch.Tensor, epoch: int, hyp: dict, gen: torch.Generator) -> tuple:
    """One epoch's augmented copy of the (normalised, epoch-0-flipped, padded) set `base`:
    random translate crop, the whole set mirrored in odd epochs, then cutout. Returns
    (images, shifts (N, 2) or None, cutout corners (N, 2) or None)."""
    n, device = len(base), base.device
    pad = hyp["translate"]
    shifts = corners = None
    if pad:
        shifts = torch.randint(-pad, pad + 1, (n, 2), generator=gen, device=device)
        x = crop(base, shifts)
    else:
        x = base
    if hyp["flip"] and epoch % 2 == 1:
        x = x.flip(-1)
    if hyp["cutout"]:
        size = hyp["cutout"]
        corners = torch.randint(0, IMAGE - size + 1, (n, 2), generator=gen, device=device)
        x = cutout(x, corners, size)
    return x, shifts, corners


class TrainData:
    """The training set of one run: [0, 1] images on the device, a seeded generator, and the
    epoch-0 work (normalise, random flip, reflect pad) done once by `prepare`."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, hyp: dict, seed: int):
        self.images, self.labels, self.hyp = images, labels, hyp
        self.gen = torch.Generator(device=images.device)
        self.gen.manual_seed(seed)
        self.base = None
        self.flip0 = None

    def prepare(self) -> None:
        x = normalise(self.images)
        n = len(x)
        if self.hyp["flip"]:
            self.flip0 = torch.rand(n, generator=self.gen, device=x.device) < 0.5
            x = torch.where(self.flip0.view(-1, 1, 1, 1), x.flip(-1), x)
        else:
            self.flip0 = torch.zeros(n, dtype=torch.bool, device=x.device)
        pad = self.hyp["translate"]
        self.base = F.pad(x, (pad,) * 4, mode="reflect") if pad else x

    def epoch(self, epoch: int) -> tuple:
        """(augmented images, the epoch's order: a permutation of range(N))."""
        images, _, _ = epoch_views(self.base, epoch, self.hyp, self.gen)
        order = torch.randperm(len(images), generator=self.gen, device=images.device)
        return images, order

    def get_state(self) -> torch.Tensor:
        return self.gen.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.gen.set_state(state)


# =============================================================================================
# Model


def identity_conv(c_in: int, c_out: int) -> nn.Conv2d:
    """3x3 'same' conv without bias: PyTorch's default init, then the first c_in filters
    (all of them if fewer) set to the identity (dirac_)."""
    conv = nn.Conv2d(c_in, c_out, 3, padding="same", bias=False)
    with torch.no_grad():
        nn.init.dirac_(conv.weight[:c_in])
    return conv


def batchnorm(c: int, hyp: dict) -> nn.BatchNorm2d:
    """BN with eps 1e-12 whose weight (scale) stays frozen at 1: only the bias trains."""
    bn = nn.BatchNorm2d(c, eps=hyp["bn_eps"], momentum=hyp["bn_momentum"])
    bn.weight.requires_grad_(False)
    return bn


class ConvGroup(nn.Module):
    """conv -> MaxPool2 -> BN -> GELU, then convs_per_group - 1 more conv -> BN(-> GELU).
    Plain (94/95): every BN is followed by GELU. Residual (96): x0 = the first stage's
    output; out = GELU(x0 + BN(conv(GELU(BN(conv(x0))))))."""

    def __init__(self, c_in: int, c_out: int, hyp: dict):
        super().__init__()
        n = hyp["convs_per_group"]
        self.convs = nn.ModuleList([identity_conv(c_in, c_out)]
                                   + [identity_conv(c_out, c_out) for _ in range(n - 1)])
        self.norms = nn.ModuleList([batchnorm(c_out, hyp) for _ in range(n)])
        self.pool = nn.MaxPool2d(2)
        self.residual = hyp["residual"]

    def forward(self, x):
        x = F.gelu(self.norms[0](self.pool(self.convs[0](x))))
        if not self.residual:
            for conv, norm in zip(self.convs[1:], self.norms[1:]):
                x = F.gelu(norm(conv(x)))
            return x
        y = x
        last = len(self.convs) - 1
        for i in range(1, last + 1):
            y = self.norms[i](self.convs[i](y))
            if i < last:
                y = F.gelu(y)
        return F.gelu(x + y)


class AirbenchNet(nn.Module):
    """Whitening conv 2x2 (3 -> 24, no padding, bias) -> GELU -> three ConvGroups ->
    MaxPool(3) -> flatten -> Linear(no bias) -> x 1/9. Spatial size 32 -> 31 -> 15 -> 7 -> 3
    -> 1. The whitening weights are frozen (set by `init_whitening`); its bias starts at 0."""

    def __init__(self, hyp: dict):
        super().__init__()
        k = hyp["whiten_kernel"]
        w0 = 2 * 3 * k * k
        w1, w2, w3 = hyp["widths"]
        self.whiten = nn.Conv2d(3, w0, k, padding=0, bias=True)
        with torch.no_grad():
            self.whiten.bias.zero_()
        self.whiten.weight.requires_grad_(False)
        self.groups = nn.Sequential(ConvGroup(w0, w1, hyp), ConvGroup(w1, w2, hyp),
                                    ConvGroup(w2, w3, hyp))
        self.pool = nn.MaxPool2d(3)
        self.head = nn.Linear(w3, 10, bias=False)
        self.scale = hyp["head_scale"]

    def forward(self, x):
        x = self.groups(F.gelu(self.whiten(x)))
        return self.head(self.pool(x).flatten(1)) * self.scale


def build_net(hyp: dict) -> AirbenchNet:
    return AirbenchNet(hyp)


def to_training_precision(net: nn.Module, half: bool) -> nn.Module:
    """CUDA (half=True): fp16 and channels_last, BatchNorm kept in fp32 (AB). CPU: float32."""
    if half:
        to_half_keep_bn_float(net.to(memory_format=torch.channels_last))
    return net


def whitening_filters(x: torch.Tensor, kernel: int, eps: float) -> tuple:
    """PCA-whitening filters from every kernel x kernel patch of the images x (N, 3, H, W):
    filter k is eigenvector k / sqrt(eigenvalue k + eps) of the uncentred patch covariance
    X^T X / n, by descending eigenvalue, and the set is followed by its negation.
    Returns (filters (2 * 3k^2, 3, k, k) float32, eigenvalues float64, descending)."""
    c = x.shape[1]
    d = c * kernel * kernel
    acc = torch.zeros(d, d, dtype=torch.float64, device=x.device)
    n = 0
    for chunk in x.split(500):
        patches = chunk.unfold(2, kernel, 1).unfold(3, kernel, 1)      # (B, C, H', W', k, k)
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, d).double()  # (c, ky, kx)
        acc += patches.T @ patches
        n += len(patches)
    evals, evecs = torch.linalg.eigh((acc / n).cpu())                  # ascending
    evals, evecs = evals.flip(0), evecs.flip(1)
    filters = (evecs.T / torch.sqrt(evals + eps)[:, None]).reshape(d, c, kernel, kernel)
    return torch.cat([filters, -filters]).float(), evals


@torch.no_grad()
def init_whitening(net: AirbenchNet, images: torch.Tensor, hyp: dict) -> None:
    """Set the whitening conv from the first whiten_images [0, 1] training images."""
    filters, _ = whitening_filters(normalise(images[:hyp["whiten_images"]]),
                                   hyp["whiten_kernel"], hyp["whiten_eps"])
    net.whiten.weight.copy_(filters.to(net.whiten.weight.device))


def set_whiten_bias_trainable(net: AirbenchNet, trainable: bool) -> None:
    """AB sets requires_grad each epoch; a frozen bias gets no grad, so SGD skips it (no
    momentum, no weight decay)."""
    net.whiten.bias.requires_grad_(trainable)


# =============================================================================================
# Optimiser and lookahead


def make_optimizer(net: AirbenchNet, hyp: dict, batch_size: int):
    """Nesterov SGD, two groups: BN biases (lr x bias_scaler) and the other trainable tensors
    (conv weights, the whitening bias, the head). The whitening bias stays in its group after
    it freezes, so a checkpoint's optimizer state always has the same layout."""
    s = sgd_settings(hyp, batch_size)
    bn_biases = [m.bias for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    bn_ids = {id(p) for p in bn_biases}
    others = [p for p in net.parameters()
              if id(p) not in bn_ids and (p.requires_grad or p is net.whiten.bias)]
    return torch.optim.SGD(
        [{"params": bn_biases, "lr": s["lr_bias"], "weight_decay": s["weight_decay_bias"]},
         {"params": others, "lr": s["lr"], "weight_decay": s["weight_decay"]}],
        momentum=hyp["momentum"], nesterov=True)


class Lookahead:
    """AB's lookahead: every few steps ema <- lerp(ema, net, 1 - alpha), then net <- ema, over
    every float tensor of the state dict (weights and BN running stats)."""

    def __init__(self, net: nn.Module):
        self.state = {k: v.detach().clone() for k, v in net.state_dict().items()
                      if v.is_floating_point()}

    @torch.no_grad()
    def update(self, net: nn.Module, alpha: float) -> None:
        for k, v in net.state_dict().items():
            if k in self.state:
                self.state[k].lerp_(v, 1 - alpha)
                v.copy_(self.state[k])

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        for k, v in self.state.items():
            v.copy_(state[k])


# =============================================================================================
# Evaluation


def tta_logits(fwd, x: torch.Tensor, level: int) -> torch.Tensor:
    """Level 0: the image. 1: mean of image and mirror. 2: 0.5 * level 1 + 0.5 * the mean of
    level 1 on the image shifted one px up-left and one px down-right (reflect pad 1): six
    forward passes. In float32."""
    if level == 0:
        return fwd(x).float()

    def mirrored(v):
        return 0.5 * fwd(v).float() + 0.5 * fwd(v.flip(-1)).float()

    if level == 1:
        return mirrored(x)
    h, w = x.shape[-2:]
    padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
    up_left, down_right = padded[:, :, :h, :w], padded[:, :, 2:, 2:]
    return 0.5 * mirrored(x) + 0.5 * (mirrored(up_left) + mirrored(down_right)) / 2


@torch.no_grad()
def eval_logits(fwd, images: torch.Tensor, level: int) -> torch.Tensor:
    """The TTA logits of a batch of [0, 1] images (normalised here)."""
    return tta_logits(fwd, normalise(images), level)


def evaluate(logits, net: nn.Module, images: torch.Tensor, labels: torch.Tensor, level: int,
             batch: int = 2000) -> float:
    """Accuracy on [0, 1] images, batch by batch, BN in eval mode. `logits(images, level)`
    is Graphs.logits: eval_logits of the model, eager or compiled."""
    was_training = net.training
    net.eval()
    correct = torch.zeros((), dtype=torch.int64, device=labels.device)
    for xb, yb in zip(images.split(batch), labels.split(batch)):
        correct += (logits(xb, level).argmax(1) == yb).sum()
    net.train(was_training)
    return correct.item() / len(labels)


# =============================================================================================
# Training


def forward_loss(fwd, xb, yb, label_smoothing: float) -> tuple:
    """(summed label-smoothed cross-entropy, logits) of a batch."""
    logits = fwd(xb)
    return F.cross_entropy(logits.float(), yb, label_smoothing=label_smoothing,
                           reduction="none").sum(), logits


def train_step(forward, opt, sched, xb, yb) -> tuple:
    """One update; returns (summed loss, number correct), detached, on the device.
    `forward(xb, yb)` is Graphs.train: forward_loss of the model, eager or compiled."""
    loss, logits = forward(xb, yb)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    return loss.detach(), (logits.detach().argmax(1) == yb).sum()


class Clock:
    """Seconds of timed work: CUDA events on a GPU (AB), perf_counter on the CPU."""

    def __init__(self, cuda: bool, total: float = 0.0):
        self.cuda, self.total = cuda, total
        self._start = None

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            self.total += self._start.elapsed_time(end) / 1000
        else:
            self.total += time.perf_counter() - self._start
        self._start = None
        return self.total


COMPILE_SCOPES = ("model", "step", "eval", "all")


@dataclass
class Graphs:
    """What the runs call on the model, eager or compiled (compile=true, compile_scope):
    train(xb, yb) -> (summed loss, logits), and logits(images, level) -> TTA logits."""
    train: object
    logits: object
    compiled: bool


def build_graphs(net: AirbenchNet, hyp: dict, args, data_root, cuda: bool) -> Graphs:
    """compile_scope model: the model's forward compiled (AB's airbench94_compiled.py), used
    by training and evaluation. step: the training forward and its loss compiled as one
    graph. eval: the whole evaluation of a batch (normalise, the TTA views, their average)
    compiled as one graph. all: step and eval. Issue 17 asks which gains most: benchmarks/
    gpu.py --compile runs each scope on a GPU."""
    smoothing = hyp["label_smoothing"]
    if not args.compile:
        return Graphs(functools.partial(forward_loss, net, label_smoothing=smoothing),
                      functools.partial(eval_logits, net), False)
    scope = args.compile_scope

    def compile_(fn):
        return compiling.compiled(fn, data_root, cuda, args.compile_mode)

    fwd = compile_(net)
    train = functools.partial(forward_loss, fwd, label_smoothing=smoothing)
    logits = functools.partial(eval_logits, fwd)
    if scope in ("step", "all"):
        train = compile_(functools.partial(forward_loss, net, label_smoothing=smoothing))
    if scope in ("eval", "all"):
        logits = compile_(functools.partial(eval_logits, net))
    return Graphs(train, logits, True)


def warm_up(graphs: Graphs, net: AirbenchNet, hyp: dict, x_train: torch.Tensor,
            x_test: torch.Tensor, y_test: torch.Tensor, variant: str = "airbench") -> None:
    """Off the clock, before the first run: run every graph the runs will use, on tensors laid
    out exactly as theirs (a batch of an even and of an odd epoch's views of the training
    images, with random labels, with the whitening bias trainable and frozen; the test set at
    TTA level 0, as every epoch's evaluation, and at the final level, with the bias in both
    states), then put the model's state back. No optimizer step. Picks cuDNN algorithms; with
    compile, compiles (dynamo guards on strides, grad mode and requires_grad, so each case is
    its own graph)."""
    device = x_train.device
    saved = copy.deepcopy(net.state_dict())
    bias_trainable = net.whiten.bias.requires_grad
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    bs = hyp["batch_size"]
    try:
        data = TrainData(x_train, None, hyp, seed=0)
        data.prepare()
        net.train()
        for epoch in (0, 1):
            images, order = data.epoch(epoch)
            xb = images[order[:bs]]
            yb = torch.randint(0, 10, (bs,), generator=gen, device=device)
            del images
            for trainable in (True, False):
                set_whiten_bias_trainable(net, trainable)
                for _ in range(2):
                    graphs.train(xb, yb)[0].backward()
                    net.zero_grad(set_to_none=True)
        del data
        for trainable in (True, False):
            set_whiten_bias_trainable(net, trainable)
            for level in sorted({0, hyp["tta_level"]}):
                evaluate(graphs.logits, net, x_test, y_test, level, hyp["eval_batch"])
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:
        if not graphs.compiled:
            raise
        raise compiling.failure(variant, exc, device.type) from exc
    finally:
        net.load_state_dict(saved)
        set_whiten_bias_trainable(net, bias_trainable)
        net.zero_grad(set_to_none=True)
        net.train()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# A checkpoint may only be resumed by a run that would have produced it.
MUST_MATCH_ON_RESUME = ("epochs", "batch_size", "widths", "tta_level", "data",
                        "synthetic_train", "synthetic_test", "seed", "runs")


@dataclass
class Job:
    """What every run of a job shares: arguments, data on the device, the log."""
    variant: str
    args: argparse.Namespace
    hyp: dict
    device: torch.device
    x_train: torch.Tensor       # (N, 3, 32, 32) in [0, 1], fp16 on CUDA / float32 on CPU
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    net: AirbenchNet            # the model every run re-initialises in place
    graphs: Graphs              # what the runs call on net: eager or compiled
    writer: metrics.MetricsWriter
    stop: stopping.StopRequest
    ckpt_path: object
    t_start: float
    accs: list = field(default_factory=list)  # final TTA accuracy of each completed run
    target_reached: bool = False

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def wall(self) -> float:
        return round(time.time() - self.t_start, 4)

    def run_key(self, r: int) -> dict:
        return {"run": r} if self.args.runs > 1 else {}

    def check_target(self, r: int, acc: float, tta_level: int, epoch: int,
                     train_time: float) -> None:
        target = self.hyp["target"]
        if acc >= target and not self.target_reached:
            self.target_reached = True
            self.writer.write(event="target_reached", **self.run_key(r), epoch=epoch,
                              test_acc=acc, tta_level=tta_level,
                              train_time=round(train_time, 4), wall_time=self.wall())
            print(f"{self.variant}: reached {target:.0%} test accuracy (tta level {tta_level}) "
                  f"at epoch {epoch}, train time {train_time:.2f} s", flush=True)


COLUMNS = ("run", "epoch", "lr", "train loss", "train acc", "test acc", "train time",
           "wall time")


def _print_row(values, header=False) -> None:
    fmt = (lambda v: f"{v:>12s}") if header else (
        lambda v: f"{v:>12.4f}" if isinstance(v, float) else f"{v:>12}")
    print("".join(fmt(v) for v in values), flush=True)


def train_run(job: Job, r: int, saved: dict | None = None) -> float | None:
    """Run r of the job, from scratch or from `saved` (a checkpoint's run_state). Returns the
    final TTA accuracy, or None if a stop was requested (the checkpoint is then written)."""
    hyp, args = job.hyp, job.args
    seed = runs.run_seed(args.seed, r)
    bs = hyp["batch_size"]
    n_train = len(job.x_train)
    per_epoch = n_train // bs
    total = total_steps(n_train, bs, hyp["epochs"])
    n_epochs = math.ceil(total / per_epoch)

    # A fresh initialisation, copied into the job's one model (so a compiled model and its
    # graphs are reused by every run, as AB's compiled variant re-initialises in place).
    net, graphs = job.net, job.graphs
    torch.manual_seed(seed)
    net.load_state_dict(build_net(hyp).state_dict())
    set_whiten_bias_trainable(net, True)
    net.zero_grad(set_to_none=True)
    opt = make_optimizer(net, hyp, bs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, hyp))
    data = TrainData(job.x_train, job.y_train, hyp, seed)
    clock = Clock(job.cuda, saved["train_time"] if saved else 0.0)
    s = sgd_settings(hyp, bs)

    if saved:
        net.load_state_dict(saved["model"])
        lookahead = Lookahead(net)
        lookahead.load_state_dict(saved["ema"])
        opt.load_state_dict(saved["optimizer"])
        sched.load_state_dict(saved["scheduler"])
        data.prepare()  # redraws the epoch-0 flip from the seed; off the clock on resume
        data.set_state(saved["gen_state"])
        step, first_epoch, partial = saved["step"], saved["epoch"], saved["partial"]
        checkpoint.restore_rng_states(saved["rng"])
    else:
        clock.start()
        init_whitening(net, job.x_train, hyp)
        clock.stop()
        lookahead = Lookahead(net)
        step, first_epoch, partial = 0, 0, {"loss_sum": 0.0, "correct": 0, "seen": 0}

    def save(epoch: int, gen_state, done: bool = False) -> None:
        checkpoint.save_atomic({
            "recipe": job.variant, "args": vars(args), "total_steps": total,
            "accs": list(job.accs), "target_reached": job.target_reached, "run": r,
            "run_state": {
                "done": done, "epoch": epoch, "step": step, "train_time": clock.total,
                "partial": partial, "whiten_bias_trainable": epoch < hyp["whiten_bias_epochs"],
                "model": net.state_dict(), "ema": lookahead.state_dict(),
                "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "gen_state": gen_state, "rng": checkpoint.rng_states(),
            },
        }, job.ckpt_path)

    def stop_requested() -> bool:  # --stop_at_step counts the steps of all runs so far
        return job.stop.agreed(None, extra=args.stop_at_step is not None
                               and r * total + step >= args.stop_at_step)

    row = {}  # the last epoch's metrics row
    for epoch in range(first_epoch, n_epochs):
        set_whiten_bias_trainable(net, epoch < hyp["whiten_bias_epochs"])
        clock.start()
        if data.base is None:
            data.prepare()  # epoch 0 of a fresh run: inside the clock, as in AB
        epoch_state = data.get_state()
        images, order = data.epoch(epoch)
        loss_sum = torch.tensor(partial["loss_sum"], dtype=torch.float64, device=job.device)
        correct = torch.tensor(partial["correct"], dtype=torch.int64, device=job.device)
        seen = partial["seen"]
        net.train()
        for i in range(step - epoch * per_epoch, per_epoch):
            if stop_requested():
                clock.stop()
                partial = {"loss_sum": loss_sum.item(), "correct": int(correct.item()),
                           "seen": seen}
                save(epoch, epoch_state)
                print(f"{job.variant}: stopped at step {step} (run {r}, epoch {epoch + 1}, "
                      f"batch {i}); checkpoint saved to {job.ckpt_path}", flush=True)
                return None
            idx = order[i * bs:(i + 1) * bs]
            loss, n_correct = train_step(graphs.train, opt, sched, images[idx],
                                         job.y_train[idx])
            loss_sum += loss.double()
            correct += n_correct
            seen += len(idx)
            step += 1
            if step % hyp["ema_every"] == 0:
                lookahead.update(net, lookahead_alpha(step, total, hyp))
            if step >= total:
                lookahead.update(net, 1.0)  # net <- ema (AB: decay 1.0 keeps ema as it is)
                break
        train_time = clock.stop()

        # Off the clock: per-epoch accuracy (TTA level 0, as AB), metrics, checkpoint.
        test_acc = evaluate(graphs.logits, net, job.x_test, job.y_test, 0, hyp["eval_batch"])
        factor = lr_factor(step - 1, total, hyp)
        row = job.writer.write(
            **job.run_key(r), epoch=epoch + 1, epochs=n_epochs, step=step,
            lr=s["lr"] * factor * bs, lr_factor=factor,
            train_loss=loss_sum.item() / seen, train_acc=correct.item() / seen,
            test_acc=test_acc, train_time=round(train_time, 4), wall_time=job.wall())
        _print_row((r, row["epoch"], row["lr"], row["train_loss"], row["train_acc"],
                    row["test_acc"], row["train_time"], row["wall_time"]))
        job.check_target(r, test_acc, 0, epoch + 1, train_time)
        partial = {"loss_sum": 0.0, "correct": 0, "seen": 0}
        if step >= total:
            break
        save(epoch + 1, data.get_state())
        if stop_requested():
            print(f"{job.variant}: stopped after epoch {epoch + 1} of run {r}; checkpoint "
                  f"saved to {job.ckpt_path}", flush=True)
            return None

    # The final evaluation is timed (AB): TTA level 2 over the test set, batches of 2000.
    level = hyp["tta_level"]
    clock.start()
    acc = evaluate(graphs.logits, net, job.x_test, job.y_test, level, hyp["eval_batch"])
    train_time = clock.stop()
    # The run's result row: test_acc is the final (TTA) accuracy, the figure the records
    # report; the last epoch's training loss is repeated so the row reads on its own.
    job.writer.write(**job.run_key(r), epoch=n_epochs, epochs=n_epochs, step=step,
                     train_loss=row.get("train_loss"), test_acc=acc, final_test_acc=acc,
                     tta_level=level, train_time=round(train_time, 4), wall_time=job.wall())
    job.check_target(r, acc, level, n_epochs, train_time)
    job.accs.append(acc)
    save(n_epochs, data.get_state(), done=True)
    print(f"{job.variant}: run {r}: test accuracy {acc:.4f} (tta level {level}), "
          f"train time {train_time:.2f} s, wall time {job.wall():.2f} s", flush=True)
    return acc


def _load_resume(variant: str, args, ckpt_path) -> dict | None:
    if not args.resume:
        return None
    if not ckpt_path.exists():
        print(f"{variant}: warning: --resume true but no checkpoint at {ckpt_path}; starting "
              f"from scratch", file=sys.stderr, flush=True)
        return None
    ckpt = checkpoint.load(ckpt_path)  # on the CPU; state dicts copy to the device
    if ckpt.get("recipe") != variant:
        raise SystemExit(f"{variant}: {ckpt_path} was written by {ckpt.get('recipe')}; "
                         f"remove it or use another job dir")
    saved = ckpt["args"]
    for key in MUST_MATCH_ON_RESUME:
        if saved.get(key) != getattr(args, key):
            raise SystemExit(f"{variant}: {ckpt_path} was written with {key}="
                             f"{saved.get(key)!r}, this run has {getattr(args, key)!r}; "
                             f"rerun with the same arguments or remove the checkpoint")
    state = ckpt["run_state"]
    where = (f"run {ckpt['run']} step {state['step']}" if state and not state["done"]
             else f"{len(ckpt['accs'])} completed run(s)")
    print(f"{variant}: resuming from {ckpt_path} ({where})", flush=True)
    return ckpt


def main(variant: str, argv=None, t_start: float | None = None) -> int:
    """Parse the command line and train; returns the exit status (143 when stopped)."""
    args = build_parser(variant).parse_args(argv)
    with stopping.StopRequest(variant) as stop:
        return _train_job(variant, args, stop, time.time() if t_start is None else t_start)


def _train_job(variant: str, args, stop: stopping.StopRequest, t_start: float) -> int:
    hyp = variant_hyp(variant, args)
    device = distributed.pick_device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    if args.runs < 1:
        raise SystemExit(f"{variant}: runs must be at least 1, got {args.runs}")
    if cuda:
        torch.backends.cudnn.benchmark = True
    job_dir = metrics.job_dir(args.job_dir)
    ckpt_path = checkpoint.last_checkpoint_path(job_dir)

    marks = startup.Startup(t_start)
    marks.mark("import")
    # Read the data from disk (download on first use) and upload it once: off the clock.
    root = cifar10.data_dir(args.data_dir)
    if args.data == "synthetic":
        ds = cifar10.load_synthetic(root, args.synthetic_train, args.synthetic_test, args.seed)
    else:
        ds = cifar10.load_cifar10(root)
    (xtr, ytr), (xte, yte) = ds["train"], ds["test"]
    if len(xtr) < hyp["batch_size"]:
        raise SystemExit(f"{variant}: {len(xtr)} training images < one batch of "
                         f"{hyp['batch_size']}")
    ckpt = _load_resume(variant, args, ckpt_path)
    if ckpt:
        steps = total_steps(len(xtr), hyp["batch_size"], hyp["epochs"])
        state = ckpt.get("run_state") or {}
        checkpoint.check_schedule(
            ckpt_path, variant, step=(state.get("step", 0), steps),
            epoch=(state.get("epoch", 0), math.ceil(steps / (len(xtr) // hyp["batch_size"]))),
            run=(ckpt.get("run"), args.runs - 1),
            completed_runs=(checkpoint.count_of(ckpt.get("accs")), args.runs))

    x_train, y_train = to_device_images(xtr, device, dtype), torch.from_numpy(ytr).to(device)
    x_test, y_test = to_device_images(xte, device, dtype), torch.from_numpy(yte).to(device)
    marks.mark("data")
    net = to_training_precision(build_net(hyp).to(device), half=cuda)
    graphs = build_graphs(net, hyp, args, root, cuda)
    if cuda or args.compile:
        warm_up(graphs, net, hyp, x_train, x_test, y_test, variant)
        marks.mark("compile" if args.compile else "warm_up")
    job = Job(variant, args, hyp, device, x_train, y_train, x_test, y_test, net, graphs,
              metrics.MetricsWriter(job_dir / metrics.METRICS_FILE), stop, ckpt_path, t_start)
    saved = None
    if ckpt:
        job.accs, job.target_reached = list(ckpt["accs"]), ckpt["target_reached"]
        state = ckpt["run_state"]
        if state is not None and not state["done"] and ckpt["run"] == len(job.accs):
            saved = state

    total, trainable = count_params(net)
    steps = total_steps(len(xtr), hyp["batch_size"], hyp["epochs"])
    print(f"{variant}: device={device.type} dtype={str(dtype)[6:]} params={total:,} "
          f"(trainable {trainable:,}) widths={','.join(map(str, hyp['widths']))} "
          f"train={len(xtr)} test={len(xte)} batch={hyp['batch_size']} "
          f"steps={steps} ({len(xtr) // hyp['batch_size']}/epoch) epochs={hyp['epochs']} "
          f"tta_level={hyp['tta_level']} runs={args.runs} compile={args.compile}"
          + (f" ({args.compile_scope}, mode "
             f"{compiling.mode_for(args.compile_mode, cuda)})" if args.compile else ""),
          flush=True)
    row = marks.row(device)
    job.writer.write(**row)
    print(f"{variant}: {startup.describe(row)}", flush=True)
    _print_row(COLUMNS, header=True)
    try:
        for r in range(len(job.accs), args.runs):
            acc = train_run(job, r, saved)
            saved = None
            if acc is None:
                return stopping.EXIT_STOPPED
            if stop.agreed(None) and r + 1 < args.runs:
                print(f"{variant}: stopped after run {r}; checkpoint saved to {ckpt_path}",
                      flush=True)
                return stopping.EXIT_STOPPED
        summary = runs.summarise(job.accs, hyp["target"])
        job.writer.write(event="runs_summary", tta_level=hyp["tta_level"], **summary)
        print(f"{variant}: {runs.describe(summary)} (tta level {hyp['tta_level']}); wall "
              f"time {job.wall():.2f} s", flush=True)
    finally:
        job.writer.close()
    return 0
