#!/usr/bin/env python3
"""ResNet9 on CIFAR-10: David Page's (myrtle.ai) two single-GPU recipes, in one file.

Read it top to bottom: hyperparameters, command line, schedules, data, model, optimiser and
EMA, evaluation, the training loop. CF below is davidcpage/cifar10-fast; the facts this file
must match are in shared/recipes-spec.md section 1A.

Provenance
  --variant dawn            CF@d31ad8d dawn.py, the DAWNBench entry. 24 epochs, batch 512.
                            Published: 35 of 50 runs >= 94%, median 94.08%; 79 s wall, 74 s in
                            DAWNBench terms (preprocessing in, validation out) on 1x V100
                            (AWS p3.2xlarge, GPU clocks pinned with nvidia-smi -ac 877,1530).
  --variant bag-of-tricks   CF@f79e8b8 bag_of_tricks.ipynb cells 63-85 (and new_dawn.py), the
  (default)                 final 10-epoch recipe of "How to train your ResNet 8: Bag of tricks".
                            Published: 94.1% mean test accuracy (flip TTA) in 26 s on 1x V100.
  This file                 Not yet timed on a GPU. CPU float32 throughput of the full-size
                            model: benchmarks/resnet9_cpu.py.

Where this file had to choose (each is equivalent to the source or says how it is not)
  * lr knots scale with --epochs: knot_epochs * epochs / default_epochs. At the default epochs
    they are exactly CF's ([0, 2, 8] of 10; [0, 5, 24] of 24). CF's own notebook writes
    [0, epochs/5, epochs-2], which agrees at 10 epochs only.
  * CF's optimiser increments its step counter before reading the schedule, so update k
    (1-based) uses lr(k / steps_per_epoch): the first step has a small non-zero lr and the last
    dawn step has lr 0. We do the same, with Page's update written out in `NesterovSGD`.
  * The EMA counter is CF's: an update after steps 1, 6, 11, ... (0-based batch count % 5 == 0).
  * GhostBatchNorm splits a batch into interleaved ghost batches (sample i in split i % splits),
    as CF's reshape does. Eval uses the running stats averaged over the splits (spec 1A), at
    every evaluation, without writing them back. CF instead averages them in place on a
    train->eval switch and then reads split 0; its EMA model switches to eval once, so from the
    second evaluation on CF reads split 0 of the EMA stats (still blended with the first
    average). We follow the documented intent, not that quirk.
  * GPUBatches-style augmentation: for each transform, shuffle the dataset, split it into
    min(#options, 200) groups whose sizes differ by at most one, give each group one option
    (81 crop offsets, 2 flip choices) drawn in shuffled order, then shuffle for batching. We
    draw the choices as per-image tables and apply them in one pass, which yields the same
    distribution over augmented epochs as CF's sequence of torch.cat's.
  * The whitening covariance (CF: uncentred X^T X / (n-1) of 3x3 patches of the first 10,000
    training images, centre 32x32) is accumulated in float64 chunks and eigendecomposed in
    float64; CF used float32 `symeig`. Whitening counts as timed preprocessing.
  * The loss is computed in float32 from the (fp16 on CUDA) logits; CF computed it in fp16.
  * dawn: the per-image random choices for a whole epoch are drawn and applied up front on the
    CPU (CF: per image inside Dataset.__getitem__); batches then come from a DataLoader with
    num_workers=0 and pinned memory, as in CF.
  * Randomness of an epoch's augmentation and order comes from a generator seeded with
    (seed, epoch), so a resumed run sees the same batches as an uninterrupted one.
  * On resume, train_time continues from the checkpoint; the repeated preprocessing is not
    added again (wall_time, which restarts with the process, shows it).

Outputs, under $CLOUDTRAIN_JOB_DIR (default ./cloudtrain-run) or --job-dir
  metrics.jsonl           one row per epoch: epoch, epochs, step, lr (non-bias group, on the
                          batch-mean loss: 1.0 at the bag-of-tricks peak), train_loss,
                          train_acc, test_acc, test_loss (fractions / per image), train_time,
                          wall_time (seconds) and time; once, an {"event": "target_reached"}
                          row when test_acc first reaches 0.94
  checkpoints/last.pt     written atomically after every epoch, and at a step boundary on
                          SIGTERM (then exit 143); --resume true continues from it
Data is cached under $CLOUDTRAIN_DATA_DIR (default ~/.cloudtrain/data) or --data-dir.

Example (the smoke profile: a few seconds on 2 CPU cores):
  python recipes/resnet9/train.py --data synthetic --synthetic_train 512 --synthetic_test 256 \
      --width_div 8 --ghost_splits 4 --batch_size 128 --epochs 2
"""
import argparse
import os
import sys
import time

T_START = time.time()  # wall_time is measured from here

# =============================================================================================
# Hyperparameters. lr and weight decay are given on the batch-*mean* loss, as papers state
# them; the loss below is *summed* over the batch (as in CF), so the update divides lr by the
# batch size and multiplies the weight decay by it: lr/512 and 5e-4*512 at batch 512.

CIFAR_MEAN = (125.31, 122.95, 113.87)  # per channel, 0-255 scale (CF)
CIFAR_STD = (62.99, 62.09, 66.70)
PAD = 4                                # px of reflect padding; 32x32 crops = +-4 px translation
CROP = 32
WIDTHS = (64, 128, 256, 512)           # channels of prep, layer1, layer2, layer3 (width_div 1)
BN_EPS = 1e-5
BN_MOMENTUM = 0.1                      # PyTorch convention: weight of the newest batch's stats
TARGET_ACC = 0.94                      # DAWNBench CIFAR-10 target, top-1 on the 10k test set

HYP = {
    "dawn": {
        "epochs": 24,
        "lr_knots": (0, 5, 24),        # epochs
        "lr_vals": (0.0, 0.4, 0.0),    # lr on the batch-mean loss at the knots (linear between)
        "momentum": 0.9,               # Nesterov, CF's update
        "weight_decay": 5e-4,          # on every trainable tensor, BN included
        "bias_lr_mult": None,          # None: one parameter group
        "bias_wd_div": None,
        "block": "conv-bn-act-pool",   # MaxPool2 after the activation
        "act": "relu",
        "celu_alpha": None,
        "ghost_bn": False,             # plain BatchNorm2d, trainable weight (init 1) and bias (0)
        "whiten": False,               # prep is conv_bn 3->64
        "head_scale": 0.125,
        "label_smoothing": 0.0,
        "ema_every": 0,                # steps; 0 = no EMA
        "ema_momentum": None,
        "tta_flip": False,
        "augment": "per-sample",       # independent crop, flip, cutout choice per image
        "cutout": 8,                   # px square, fully inside the image, filled with 0
        "data_on_device": False,       # CPU tensors through a DataLoader, pinned memory
    },
    "bag-of-tricks": {
        "epochs": 10,
        "lr_knots": (0, 2, 8),         # epochs; held at the last value until the end (8 -> 10)
        "lr_vals": (0.0, 1.0, 0.1),
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "bias_lr_mult": 64,            # BN biases: lr x64 ...
        "bias_wd_div": 64,             # ... and weight decay /64
        "block": "conv-pool-bn-act",   # MaxPool2 before the BN
        "act": "celu",
        "celu_alpha": 0.3,
        "ghost_bn": True,              # GhostBatchNorm, --ghost_splits (16: 32-image ghost batches)
        "whiten": True,                # frozen 3x3 PCA whitening conv 3->27, then 1x1 conv 27->64
        "whiten_eps": 1e-2,
        "whiten_images": 10_000,       # first N training images (all, if fewer)
        "head_scale": 1 / 16,
        "label_smoothing": 0.2,
        "ema_every": 5,                # steps between EMA updates
        "ema_momentum": 0.99,          # per step; applied as 0.99**5 per update
        "tta_flip": True,              # average logits of image and mirror
        "augment": "grouped",          # CF GPUBatches: one choice per group of images
        "max_options": 200,            # at most 200 groups per transform per epoch
        "cutout": 0,
        "data_on_device": True,        # whole dataset preprocessed on the GPU (fp16)
    },
}

# =============================================================================================
# Command line. Every argument recipe.yaml declares, plus --job-dir / --data-dir (override the
# environment) and --stop-at-step (a testing aid). Both --batch_size and --batch-size work.


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="recipes/resnet9/train.py",
        description="ResNet9 on CIFAR-10 (David Page): the bag-of-tricks or the DAWNBench recipe.",
        epilog="example: python recipes/resnet9/train.py --data synthetic --width_div 8 "
               "--ghost_splits 4 --batch_size 128 --epochs 2",
    )

    def arg(name, **kw):
        flags = [f"--{name.replace('_', '-')}"] + ([f"--{name}"] if "_" in name else [])
        p.add_argument(*flags, dest=name, **kw)

    arg("variant", choices=sorted(HYP), default="bag-of-tricks")
    arg("epochs", type=int, default=None, help="default: 10 (bag-of-tricks) or 24 (dawn)")
    arg("batch_size", type=int, default=512)
    arg("width_div", type=int, default=1, help="divide every channel count by this (smoke: 8)")
    arg("ghost_splits", type=int, default=16, help="ghost batches per batch (bag-of-tricks)")
    arg("data", choices=["cifar10", "synthetic"], default="cifar10")
    arg("synthetic_train", type=int, default=5000, help="images (with --data synthetic)")
    arg("synthetic_test", type=int, default=1000, help="images (with --data synthetic)")
    arg("seed", type=int, default=0)
    arg("resume", type=parse_bool, default=False, help="continue from checkpoints/last.pt")
    arg("device", choices=["auto", "cpu", "cuda"], default="auto")
    arg("job_dir", default=None, help="default: $CLOUDTRAIN_JOB_DIR or ./cloudtrain-run")
    arg("data_dir", default=None, help="default: $CLOUDTRAIN_DATA_DIR or ~/.cloudtrain/data")
    arg("stop_at_step", type=int, default=None,
        help="testing aid: act as if SIGTERM arrived after this many steps")
    return p


if __name__ == "__main__":
    ARGS = build_parser().parse_args()
    # First line out before the slow imports: the orchestrator times launch-to-first-output.
    print(f"resnet9: starting (variant={ARGS.variant}, device={ARGS.device}, data={ARGS.data})",
          flush=True)

import copy  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the recipes/ folder
from common import checkpoint, cifar10, metrics  # noqa: E402

# =============================================================================================
# Schedules: pure functions of the step.


def piecewise_linear(x: float, knots, vals) -> float:
    """Linear between knots, held at the end values outside them (CF's PiecewiseLinear)."""
    return float(np.interp(x, knots, vals))


def lr_at(step: int, steps_per_epoch: int, hyp: dict, epochs: int, batch_size: int) -> float:
    """lr of the non-bias group for update number `step` (1-based), per *summed* loss."""
    knots = [k * epochs / hyp["epochs"] for k in hyp["lr_knots"]]
    return piecewise_linear(step / steps_per_epoch, knots, hyp["lr_vals"]) / batch_size


def is_ema_step(step: int, every: int) -> bool:
    """CF updates the EMA after steps 1, 6, 11, ... (every 5 steps, counting from the first)."""
    return every > 0 and (step - 1) % every == 0


# =============================================================================================
# Data: preprocessing (normalise, reflect-pad, NCHW) and augmentation.


def preprocess(images_nhwc: np.ndarray, device, dtype, pad: int) -> torch.Tensor:
    x = torch.from_numpy(images_nhwc).to(device).permute(0, 3, 1, 2).float()
    mean = torch.tensor(CIFAR_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, device=device).view(1, 3, 1, 1)
    x = (x - mean) / std
    if pad:
        x = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    return x.to(dtype).contiguous()


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def even_splits(n: int, k: int) -> list:
    """Boundaries of k consecutive groups of n items whose sizes differ by at most one."""
    sizes = [n // k + 1] * (n % k) + [n // k] * (k - n % k)
    return np.cumsum([0] + sizes).tolist()


def per_sample_choices(n: int, gen: torch.Generator, pad: int = PAD, cutout: int = 0):
    """Independent choices per image: offsets (n, 2) as (dy, dx) in [0, 2*pad], flips (n,)
    bool, cutout corners (n, 2) in [0, 32 - cutout] or None."""
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=gen)
    flips = torch.randint(0, 2, (n,), generator=gen).bool()
    corners = torch.randint(0, CROP - cutout + 1, (n, 2), generator=gen) if cutout else None
    return offsets, flips, corners


def grouped_choices(n: int, gen: torch.Generator, pad: int = PAD, max_options: int = 200):
    """CF GPUBatches: each transform gives one randomly drawn option to each of up to
    `max_options` evenly sized groups of a shuffled dataset. Returns per-image tables."""
    offsets = torch.empty(n, 2, dtype=torch.long)
    options = torch.tensor([(dy, dx) for dx in range(2 * pad + 1) for dy in range(2 * pad + 1)])
    perm = torch.randperm(n, generator=gen)
    picks = torch.randperm(len(options), generator=gen)[:max_options]
    bounds = even_splits(n, len(picks))
    for k, option in enumerate(picks):
        offsets[perm[bounds[k]:bounds[k + 1]]] = options[option]
    flips = torch.empty(n, dtype=torch.bool)
    perm = torch.randperm(n, generator=gen)
    picks = torch.randperm(2, generator=gen)[:max_options]  # options (True, False), shuffled
    bounds = even_splits(n, len(picks))
    for k, option in enumerate(picks):
        flips[perm[bounds[k]:bounds[k + 1]]] = bool(option == 0)
    return offsets, flips, None


def augment(x_pad: torch.Tensor, offsets, flips, corners=None, cutout: int = 0) -> torch.Tensor:
    """Crop 32x32 at the per-image offsets, mirror where flips, zero a cutout square."""
    n, c, height, width = x_pad.shape
    span = height - CROP + 1
    out = torch.empty(n, c, CROP, CROP, dtype=x_pad.dtype, device=x_pad.device)
    keys = offsets[:, 0] * span + offsets[:, 1]
    order = torch.argsort(keys, stable=True)
    counts = torch.bincount(keys, minlength=span * span).tolist()
    start = 0
    for key, count in enumerate(counts):  # one slice per distinct offset (at most 81)
        if count:
            idx = order[start:start + count].to(x_pad.device)
            dy, dx = divmod(key, span)
            out[idx] = x_pad[idx, :, dy:dy + CROP, dx:dx + CROP]
            start += count
    idx = flips.nonzero().squeeze(1).to(x_pad.device)
    out[idx] = out[idx].flip(-1)
    if cutout and corners is not None:
        r = torch.arange(CROP, device=x_pad.device)
        cy, cx = corners[:, 0:1].to(x_pad.device), corners[:, 1:2].to(x_pad.device)
        rows = (r >= cy) & (r < cy + cutout)  # (n, 32)
        cols = (r >= cx) & (r < cx + cutout)
        out.masked_fill_((rows[:, :, None] & cols[:, None, :])[:, None], 0.0)
    return out


def epoch_batches(x_pad, y, epoch: int, hyp: dict, seed: int, batch_size: int, device, dtype):
    """This epoch's augmented batches (drop_last), fully determined by (seed, epoch)."""
    gen = epoch_generator(seed, epoch)
    n = len(x_pad)
    if hyp["augment"] == "grouped":
        offsets, flips, corners = grouped_choices(n, gen, max_options=hyp["max_options"])
    else:
        offsets, flips, corners = per_sample_choices(n, gen, cutout=hyp["cutout"])
    x_aug = augment(x_pad, offsets, flips, corners, hyp["cutout"])
    order = torch.randperm(n, generator=gen)
    steps = n // batch_size
    if hyp["data_on_device"]:
        order = order.to(x_aug.device)
        for i in range(steps):
            idx = order[i * batch_size:(i + 1) * batch_size]
            yield x_aug[idx], y[idx]
        return
    # CF dawn.py: a DataLoader with num_workers=0 and pinned memory feeds the GPU.
    sampler = torch.utils.data.BatchSampler(order.tolist(), batch_size, drop_last=True)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_aug, y), sampler=sampler, batch_size=None,
        num_workers=0, pin_memory=device.type == "cuda")
    for xb, yb in loader:
        yield xb.to(device, non_blocking=True).to(dtype), yb.to(device, non_blocking=True)


def whitening_filters(x: torch.Tensor, eps: float) -> tuple:
    """27 PCA-whitening 3x3 filters from the 3x3 patches of images x (N, 3, 32, 32): filter k is
    eigenvector k / sqrt(eigenvalue k + eps) of the uncentred patch covariance X^T X / (n - 1)
    (CF's `cov`), in descending eigenvalue order. Returns (filters (27, 3, 3, 3), eigenvalues)."""
    acc = torch.zeros(27, 27, dtype=torch.float64, device=x.device)
    n = 0
    for chunk in x.split(1000):
        patches = chunk.float().unfold(2, 3, 1).unfold(3, 3, 1)         # (B, 3, 30, 30, 3, 3)
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, 27)    # (c, h, w) per patch
        acc += (patches.T @ patches).double()
        n += len(patches)
    evals, evecs = torch.linalg.eigh((acc / (n - 1)).cpu())            # ascending
    evals, evecs = evals.flip(0), evecs.flip(1)
    filters = evecs.T / torch.sqrt(evals + eps)[:, None]
    return filters.reshape(27, 3, 3, 3).float(), evals.float()


# =============================================================================================
# Model


class GhostBatchNorm(nn.BatchNorm2d):
    """BatchNorm over `splits` interleaved ghost batches (image i in split i % splits), each
    with its own running stats; eval uses the stats averaged over the splits. The weight
    (scale) is frozen at 1: only the bias trains."""

    def __init__(self, channels: int, splits: int):
        super().__init__(channels, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.splits = splits
        self.running_mean = torch.zeros(channels * splits)
        self.running_var = torch.ones(channels * splits)
        self.weight.requires_grad_(False)

    def forward(self, x):
        n, c, h, w = x.shape
        s = self.splits
        if self.training:
            return F.batch_norm(
                x.reshape(n // s, c * s, h, w), self.running_mean, self.running_var,
                self.weight.repeat(s), self.bias.repeat(s), True, self.momentum, self.eps,
            ).view(n, c, h, w)
        mean = self.running_mean.view(s, c).mean(0)
        var = self.running_var.view(s, c).mean(0)
        return F.batch_norm(x, mean, var, self.weight, self.bias, False, 0.0, self.eps)


class ConvBN(nn.Module):
    """conv (no bias) -> BN -> activation, with MaxPool2 either after the activation (dawn)
    or between conv and BN (bag of tricks)."""

    def __init__(self, c_in, c_out, hyp, ghost_splits, pool=False, kernel=3):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2, bias=False)
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()
        if hyp["ghost_bn"]:
            self.bn = GhostBatchNorm(c_out, ghost_splits)
        else:
            self.bn = nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = nn.CELU(hyp["celu_alpha"]) if hyp["act"] == "celu" else nn.ReLU(inplace=True)
        self.pool_first = hyp["block"] == "conv-pool-bn-act"

    def forward(self, x):
        x = self.conv(x)
        if self.pool_first:
            return self.act(self.bn(self.pool(x)))
        return self.pool(self.act(self.bn(x)))


class Residual(nn.Module):
    """x + conv_bn(conv_bn(x)); no activation after the add."""

    def __init__(self, c, hyp, ghost_splits):
        super().__init__()
        self.res1 = ConvBN(c, c, hyp, ghost_splits)
        self.res2 = ConvBN(c, c, hyp, ghost_splits)

    def forward(self, x):
        return x + self.res2(self.res1(x))


class ResNet9(nn.Module):
    def __init__(self, hyp: dict, width_div: int = 1, ghost_splits: int = 1):
        super().__init__()
        c0, c1, c2, c3 = (w // width_div for w in WIDTHS)
        if hyp["whiten"]:
            self.whiten = nn.Conv2d(3, 27, 3, padding=1, bias=False)  # set by set_whitening
            self.whiten.weight.requires_grad_(False)
            self.prep = ConvBN(27, c0, hyp, ghost_splits, kernel=1)
        else:
            self.whiten = nn.Identity()
            self.prep = ConvBN(3, c0, hyp, ghost_splits)
        self.layer1 = nn.Sequential(ConvBN(c0, c1, hyp, ghost_splits, pool=True),
                                    Residual(c1, hyp, ghost_splits))
        self.layer2 = ConvBN(c1, c2, hyp, ghost_splits, pool=True)
        self.layer3 = nn.Sequential(ConvBN(c2, c3, hyp, ghost_splits, pool=True),
                                    Residual(c3, hyp, ghost_splits))
        self.pool = nn.MaxPool2d(4)
        self.linear = nn.Linear(c3, 10, bias=False)
        self.scale = hyp["head_scale"]

    def set_whitening(self, filters: torch.Tensor) -> None:
        with torch.no_grad():
            self.whiten.weight.copy_(filters)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.prep(self.whiten(x)))))
        return self.linear(self.pool(x).flatten(1)) * self.scale


def build_model(variant: str, width_div: int = 1, ghost_splits: int = 16) -> ResNet9:
    hyp = HYP[variant]
    if WIDTHS[0] % width_div:
        raise ValueError(f"width_div must divide {WIDTHS[0]}, got {width_div}")
    return ResNet9(hyp, width_div, ghost_splits if hyp["ghost_bn"] else 1)


def to_half_keep_bn_float(model: nn.Module) -> nn.Module:
    """CF `Network.half`: fp16 everywhere except BatchNorm, which stays fp32."""
    model.half()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.float()
    return model


def count_params(model: nn.Module) -> tuple:
    """(all parameters, trainable parameters); buffers such as running stats are not counted."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


# =============================================================================================
# Loss, optimiser, EMA


def per_sample_loss(logits, targets, alpha: float):
    """(1 - alpha) * CE + alpha * mean over classes of -log p (CF's label smoothing)."""
    log_probs = F.log_softmax(logits.float(), dim=-1)
    ce = -log_probs.gather(1, targets[:, None])[:, 0]
    if not alpha:
        return ce
    return (1 - alpha) * ce + alpha * (-log_probs.mean(dim=-1))


def param_groups(model: nn.Module, hyp: dict, batch_size: int) -> list:
    """Trainable tensors with their lr multiplier and weight decay (per summed loss)."""
    wd = hyp["weight_decay"] * batch_size
    named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
    if hyp["bias_lr_mult"] is None:
        return [{"params": [p for _, p in named], "lr_mult": 1.0, "wd": wd}]
    return [
        {"params": [p for k, p in named if not k.endswith("bias")], "lr_mult": 1.0, "wd": wd},
        {"params": [p for k, p in named if k.endswith("bias")],
         "lr_mult": float(hyp["bias_lr_mult"]), "wd": wd / hyp["bias_wd_div"]},
    ]


class NesterovSGD:
    """CF's `nesterov_update`, per tensor w with gradient g and velocity v:
        d = -lr * (g + wd * w);  v = momentum * v + d;  w = w + d + momentum * v
    The velocity holds lr-scaled steps, so this differs from torch.optim.SGD(nesterov=True)
    whenever lr changes between steps."""

    def __init__(self, groups: list, momentum: float):
        self.groups = groups
        self.momentum = momentum
        self.velocity = [[torch.zeros_like(p) for p in g["params"]] for g in groups]

    @torch.no_grad()
    def step(self, lr: float) -> None:
        for group, velocity in zip(self.groups, self.velocity):
            group_lr = lr * group["lr_mult"]
            for w, v in zip(group["params"], velocity):
                d = w.grad
                d.add_(w, alpha=group["wd"]).mul_(-group_lr)
                v.mul_(self.momentum).add_(d)
                w.add_(d.add_(v, alpha=self.momentum))

    def zero_grad(self) -> None:
        for group in self.groups:
            for p in group["params"]:
                p.grad = None

    def state_dict(self) -> dict:
        return {"velocity": self.velocity}

    def load_state_dict(self, state: dict) -> None:
        for mine, saved in zip(self.velocity, state["velocity"]):
            for v, s in zip(mine, saved):
                v.copy_(s)


@torch.no_grad()
def ema_update(ema: nn.Module, model: nn.Module, rho: float) -> None:
    """ema <- rho * ema + (1 - rho) * model over all float state (weights and BN buffers)."""
    for e, v in zip(ema.state_dict().values(), model.state_dict().values()):
        if e.dtype.is_floating_point:
            e.mul_(rho).add_(v, alpha=1 - rho)


def train_step(model, opt: NesterovSGD, xb, yb, lr: float, alpha: float):
    """One update on a batch; returns (per-image losses, number correct), both detached."""
    logits = model(xb)
    losses = per_sample_loss(logits, yb, alpha)
    losses.sum().backward()
    opt.step(lr)
    opt.zero_grad()
    return losses.detach(), (logits.detach().argmax(1) == yb).sum()


# =============================================================================================
# Evaluation


@torch.no_grad()
def evaluate(model, x, y, batch_size: int, tta_flip: bool) -> tuple:
    """(accuracy, mean cross-entropy) on x, y; tta_flip averages the logits of image and mirror."""
    was_training = model.training
    model.eval()
    correct, loss = 0, 0.0
    for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
        logits = model(xb).float()
        if tta_flip:
            logits = (logits + model(xb.flip(-1)).float()) / 2
        correct += (logits.argmax(1) == yb).sum().item()
        loss += F.cross_entropy(logits, yb, reduction="sum").item()
    model.train(was_training)
    return correct / len(y), loss / len(y)


# =============================================================================================
# Training


class TrainClock:
    """Seconds of training, DAWNBench style: timed preprocessing and training steps count,
    evaluation and checkpoints do not. Synchronises CUDA before every reading."""

    def __init__(self, total: float, cuda: bool):
        self.total, self.cuda, self._t0 = total, cuda, None

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self) -> None:
        self._t0 = self._now()

    def stop(self) -> float:
        self.total += self._now() - self._t0
        self._t0 = None
        return self.total

    def discard(self) -> None:
        self._t0 = None


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("resnet9: --device cuda but torch sees no CUDA device")
    return torch.device(name)


def cuda_warmup(model, hyp, batch_size: int, device, dtype) -> None:
    """CF warms cuDNN up on random data before the clock starts; cudnn.benchmark then has its
    algorithms picked. A throwaway copy of the model keeps the real one untouched."""
    scratch = copy.deepcopy(model)
    opt = NesterovSGD(param_groups(scratch, hyp, batch_size), hyp["momentum"])
    gen = torch.Generator(device=device).manual_seed(0)
    for _ in range(3):
        xb = torch.randn(batch_size, 3, CROP, CROP, device=device, generator=gen).to(dtype)
        yb = torch.randint(0, 10, (batch_size,), device=device, generator=gen)
        train_step(scratch, opt, xb, yb, 0.0, hyp["label_smoothing"])
    evaluate(scratch, xb, yb, batch_size, hyp["tta_flip"])
    torch.cuda.synchronize()
    del scratch, opt
    torch.cuda.empty_cache()


# A checkpoint may only be resumed by a run that would have produced it.
MUST_MATCH_ON_RESUME = ("variant", "batch_size", "width_div", "ghost_splits", "data",
                        "synthetic_train", "synthetic_test", "seed")

STOP = {"signal": None}  # set by the SIGTERM handler, read at step boundaries


def _on_sigterm(signum, frame):
    STOP["signal"] = signum
    os.write(1, b"resnet9: SIGTERM received; checkpointing at the next step boundary\n")


def _print_row(values, header=False):
    fmt = (lambda v: f"{v:>12s}") if header else (
        lambda v: f"{v:>12.4f}" if isinstance(v, float) else f"{v:>12}")
    print("".join(fmt(v) for v in values), flush=True)


def main(argv=None, args=None) -> int:
    args = args or build_parser().parse_args(argv)
    previous_handler = None
    try:
        previous_handler = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (e.g. imported into a worker): no handler
        pass
    STOP["signal"] = None
    try:
        return _train(args)
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)


def _train(args) -> int:
    hyp = HYP[args.variant]
    epochs = args.epochs or hyp["epochs"]
    bs = args.batch_size
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    job_dir = metrics.job_dir(args.job_dir)
    ckpt_path = checkpoint.last_checkpoint_path(job_dir)
    if hyp["ghost_bn"] and bs % args.ghost_splits:
        raise SystemExit(f"resnet9: --ghost_splits {args.ghost_splits} must divide "
                         f"--batch_size {bs}")

    # Read the raw data (download / disk: not timed, as in CF and DAWNBench).
    data_root = cifar10.data_dir(args.data_dir)
    if args.data == "synthetic":
        ds = cifar10.load_synthetic(data_root, args.synthetic_train, args.synthetic_test, args.seed)
    else:
        ds = cifar10.load_cifar10(data_root)
    (x_train_u8, y_train_np), (x_test_u8, y_test_np) = ds["train"], ds["test"]
    steps_per_epoch = len(x_train_u8) // bs
    if steps_per_epoch == 0:
        raise SystemExit(f"resnet9: {len(x_train_u8)} training images < one batch of {bs}")

    # The model, seeded. CUDA: fp16 with fp32 BN, cuDNN autotuned and warmed up off the clock.
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    model = build_model(args.variant, args.width_div, args.ghost_splits).to(device)
    if cuda:
        to_half_keep_bn_float(model)
        torch.backends.cudnn.benchmark = True
        cuda_warmup(model, hyp, bs, device, dtype)
    total_params, trainable_params = count_params(model)

    ckpt = None
    if args.resume:
        if ckpt_path.exists():
            ckpt = checkpoint.load(ckpt_path)  # on the CPU; state_dicts copy to the device
            saved = ckpt["args"]
            for key in MUST_MATCH_ON_RESUME:
                if saved.get(key) != getattr(args, key):
                    raise SystemExit(f"resnet9: {ckpt_path} was written with {key}="
                                     f"{saved.get(key)!r}, this run has {getattr(args, key)!r}; "
                                     f"rerun with the same arguments or remove the checkpoint")
            if ckpt["epochs"] != epochs:
                raise SystemExit(f"resnet9: {ckpt_path} is for {ckpt['epochs']} epochs, "
                                 f"this run asks for {epochs}")
            print(f"resnet9: resuming from epoch {ckpt['epoch']} (step {ckpt['step']}) "
                  f"of {ckpt_path}", flush=True)
        else:
            print(f"resnet9: warning: --resume true but no checkpoint at {ckpt_path}; "
                  f"starting from scratch", file=sys.stderr, flush=True)

    # Timed preprocessing: normalise, pad, NCHW (and the whitening filters).
    clock = TrainClock(ckpt["train_time"] if ckpt else 0.0, cuda)
    clock.start()
    data_device = device if hyp["data_on_device"] else torch.device("cpu")
    x_train = preprocess(x_train_u8, data_device, dtype if hyp["data_on_device"] else torch.float32,
                         PAD)
    y_train = torch.from_numpy(y_train_np).to(data_device)
    if hyp["whiten"]:
        n = min(hyp["whiten_images"], len(x_train))
        filters, _ = whitening_filters(x_train[:n, :, PAD:-PAD, PAD:-PAD], hyp["whiten_eps"])
        model.set_whitening(filters.to(device))
    if ckpt:
        clock.discard()  # the run that wrote the checkpoint already counted preprocessing
    else:
        clock.stop()
    x_test = preprocess(x_test_u8, device, dtype, 0)
    y_test = torch.from_numpy(y_test_np).to(device)

    ema = copy.deepcopy(model) if hyp["ema_every"] else None
    opt = NesterovSGD(param_groups(model, hyp, bs), hyp["momentum"])
    step, target_reached = 0, False
    partial = {"loss_sum": 0.0, "correct": 0, "seen": 0}
    if ckpt:
        model.load_state_dict(ckpt["model"])
        if ema is not None:
            ema.load_state_dict(ckpt["ema"])
        opt.load_state_dict(ckpt["optimizer"])
        checkpoint.restore_rng_states(ckpt["rng"])
        step, target_reached = ckpt["step"], ckpt["target_reached"]
        partial = ckpt["partial"]

    def save(epoch_done: int) -> None:
        checkpoint.save_atomic({
            "recipe": "resnet9", "args": vars(args), "epochs": epochs,
            "epoch": epoch_done, "step": step, "train_time": clock.total,
            "target_reached": target_reached, "partial": partial,
            "model": model.state_dict(), "ema": ema.state_dict() if ema is not None else None,
            "optimizer": opt.state_dict(), "rng": checkpoint.rng_states(),
        }, ckpt_path)

    def stop_requested() -> bool:
        return STOP["signal"] is not None or (args.stop_at_step is not None
                                             and step >= args.stop_at_step)

    print(f"resnet9: variant={args.variant} device={device.type} dtype={str(dtype)[6:]} "
          f"params={total_params:,} (trainable {trainable_params:,}) train={len(x_train)} "
          f"test={len(x_test)} batch={bs} steps/epoch={steps_per_epoch} epochs={epochs}",
          flush=True)
    columns = ("epoch", "lr", "train time", "train loss", "train acc", "test acc", "wall time")
    _print_row(columns, header=True)

    writer = metrics.MetricsWriter(job_dir / metrics.METRICS_FILE)
    rho = hyp["ema_momentum"] ** hyp["ema_every"] if hyp["ema_every"] else None
    try:
        for epoch in range(step // steps_per_epoch, epochs):
            skip = step - epoch * steps_per_epoch  # > 0 only when resuming mid-epoch
            loss_sum = torch.tensor(partial["loss_sum"], dtype=torch.float64, device=device)
            correct = torch.tensor(partial["correct"], dtype=torch.int64, device=device)
            seen = partial["seen"]
            clock.start()
            batches = epoch_batches(x_train, y_train, epoch, hyp, args.seed, bs, device, dtype)
            for i, (xb, yb) in enumerate(batches):
                if i < skip:
                    continue
                if stop_requested():
                    clock.stop()
                    partial = {"loss_sum": loss_sum.item(), "correct": int(correct.item()),
                               "seen": seen}
                    save(epoch)
                    print(f"resnet9: stopped at step {step} (epoch {epoch + 1}, batch {i}); "
                          f"checkpoint saved to {ckpt_path}", flush=True)
                    return 143
                step += 1
                lr = lr_at(step, steps_per_epoch, hyp, epochs, bs)
                losses, n_correct = train_step(model, opt, xb, yb, lr, hyp["label_smoothing"])
                loss_sum += losses.sum().double()
                correct += n_correct
                seen += len(yb)
                if ema is not None and is_ema_step(step, hyp["ema_every"]):
                    ema_update(ema, model, rho)
            train_time = clock.stop()

            # Off the clock: evaluation, metrics, checkpoint.
            test_acc, test_loss = evaluate(ema if ema is not None else model, x_test, y_test,
                                           bs, hyp["tta_flip"])
            row = writer.write(
                epoch=epoch + 1, epochs=epochs, step=step, lr=lr * bs,
                train_loss=loss_sum.item() / seen, train_acc=correct.item() / seen,
                test_acc=test_acc, test_loss=test_loss,
                train_time=round(train_time, 4), wall_time=round(time.time() - T_START, 4))
            _print_row((row["epoch"], row["lr"], row["train_time"], row["train_loss"],
                        row["train_acc"], row["test_acc"], row["wall_time"]))
            if test_acc >= TARGET_ACC and not target_reached:
                target_reached = True
                writer.write(event="target_reached", epoch=epoch + 1, test_acc=test_acc,
                             train_time=row["train_time"], wall_time=row["wall_time"])
                print(f"resnet9: reached {TARGET_ACC:.0%} test accuracy at epoch {epoch + 1}, "
                      f"train time {train_time:.2f} s", flush=True)
            partial = {"loss_sum": 0.0, "correct": 0, "seen": 0}
            save(epoch + 1)
            if stop_requested() and epoch + 1 < epochs:
                print(f"resnet9: stopped after epoch {epoch + 1}; checkpoint saved to "
                      f"{ckpt_path}", flush=True)
                return 143
    finally:
        writer.close()
    print(f"resnet9: done, {epochs} epochs, train time {clock.total:.2f} s, "
          f"wall time {time.time() - T_START:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(args=ARGS))
