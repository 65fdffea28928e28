#!/usr/bin/env python3
"""WRN-22-6 on CIFAR-10: fast.ai's DAWNBench entries of April 2018 (8x V100 and 1x V100).

Read it top to bottom: hyperparameters, command line, the schedule, data, model, optimiser
with fp32 master weights, evaluation, the training loop. FI below is fastai/imagenet-fast,
FA is fastai 0.7 as FI pinned it (`e2415fe`, spring 2018: we read that era's sgdr.py,
learner.py, model.py, fp16.py and layer_optimizer.py); the facts this file must match are in
shared/recipes-spec.md section 2 (fast.ai CIFAR).

The name. fast.ai's blog calls the model a "wide-ish ResNet-34"; the code they submitted
(`-a wrn_22`) is WRN-22-6, `WideResNet(depth=22, widen_factor=6, dropRate=0)` in FI
cifar10/models/wideresnet.py (the Cutout-repo model, later kept as wideresnet_old.py), and so
is this file's default. `--depth 34` builds a true 34-layer WRN if you want one.

Provenance
  --variant 8gpu   FI@1bc5aee cifar10/dawn_mod.py, the DAWNBench entry `fastai_pytorch`:
  (default)        `python -m multiproc dawn_mod.py -a wrn_22 --epochs 1 --cycle-len 40 --fp16
                   --loss-scale 512 -b 128 --wd 2e-4 --lr 2.0 --use-clr 50,12.5,0.95,0.85 -j 8`,
                   one process per GPU, batch 128 per GPU (1,024 global), DistributedSampler,
                   gradients averaged over ranks, rank 0's weights broadcast at the start.
                   Published: 94.03% top-1 at TSV row 35 (0-based: after the 36th of 40
                   epochs), 0.04832 h = 2 min 54 s on 8x V100 (AWS p3.16xlarge, $24.48/h on
                   demand: $1.18).
  --variant 1gpu   FI@a2ff907 dawn_mod.py, the entry `fastai_pytorch_single_volta`: `--fp16
                   --loss-scale 512 --epochs 1 --cycle-len 30 --lr 1.5 --wd 1e-4 --use-clr
                   20,20,0.95,0.85`, batch 512 (the script's default). Published: 94.04% at row
                   26, 0.11225 h = 6 min 44 s on one Paperspace V100 ($2.30/h: $0.26).
  Timer            fast.ai's ImagenetLoggingCallback starts its clock before `fit`, so the
                   published times INCLUDE per-epoch validation (DAWNBench does not require
                   that). We log both: `train_time` (training steps and their data loading
                   only: DAWNBench rules) and `fastai_time` (the training loop with validation
                   and checkpoints: what fast.ai's rows measured); `wall_time` counts from the
                   process start (imports, data reading, model building included).
  This file        Not yet timed on a GPU. CPU float32 figures of the full-size model:
                   benchmarks/wide_resnet_cpu.py (9,658,458 parameters).

Where this file had to choose (each is equivalent to the source or says how it is not)
  * Launch: one process per GPU under torchrun (`python -m torch.distributed.run --standalone
    --nproc_per_node=N train.py ...`), or plain `python train.py` for one process (one GPU or
    the CPU). FI used its own `multiproc.py` with a file:// rendezvous; torchrun uses env://.
  * Data-parallelism: torch DistributedDataParallel, which averages gradients over ranks as
    FI's own DDP (cifar10/distributed.py) did. torch DDP multiplies each gradient by
    1/world_size before the all-reduce, FI divided after it: for 2, 4 or 8 ranks both are
    exact powers of two (barring fp16 underflow). No buffer sync after the start: FI
    broadcast BatchNorm running statistics only once, at the start, so each rank kept its
    own; rank 0 evaluates with its own. One process uses the bare model (DDP needs a
    process group). (FI's imagenet_nv/distributed.py, the only copy of FI's DDP we could
    read, also divides the initial *broadcast* by the world size, a bug of early NVIDIA
    examples; we could not read cifar10/distributed.py at 1bc5aee and do not reproduce it.)
  * Schedule: FA CircularLR_beta exactly, including two details of how FA drives it.
    (1) nb = len(train loader) * cycle_len with the loader NOT dropping its last partial
    batch: ceil(ceil(50,000 / world) / batch) = 49 batches a rank per epoch at 8x128, 98 at
    1x512. (2) FA sets the lr and then the momentum for the next batch from one counter that
    the lr computation has already advanced, so batch i (0-based) trains with lr(i) and
    momentum(i + 1). See `schedule`.
  * Optimiser: torch.optim.SGD (momentum, no Nesterov, dampening 0) with weight decay as L2
    on every parameter (BN and biases included), as FA's SGD_Momentum with `wds`.
  * fp16 (CUDA, --fp16 true): FA Learner.half(): the model in half precision with BatchNorm
    in fp32, input cast to half. FA's fp16 Stepper: keep fp32 master copies of all parameters
    (made from the half model, so they start fp16-rounded), backpropagate loss * 512 through
    the half model, copy its gradients to the masters, divide by 512, step SGD on the
    masters, copy them back into the model. `MasterWeights` does exactly that. The loss is
    computed in float32 from the half logits (FA: in half); static scale, no overflow check
    (as FA). On the CPU the model is float32 and the scale is 1, through the same code.
  * Data: CIFAR-10 from our reader of the python pickle format (recipes/common/cifar10.py),
    not the ImageFolder of PNGs FI downloaded from files.fast.ai; the pixels are the same.
    Train transforms are FI's, PIL-based torchvision: reflect pad 4 (FI padded with np.pad
    'reflect', torchvision's Pad with padding_mode='reflect' is that same call), RandomCrop 32,
    ColorJitter(.25, .25, .25), RandomRotation(2 degrees, nearest), RandomHorizontalFlip,
    ToTensor, Normalize. FI drew from the global RNGs unseeded; we seed each image's
    transforms with (seed, epoch, image index), so a resumed run, any worker count and any
    rank see the same augmented image (per image rather than per (seed, epoch, rank): finer,
    and resume does not depend on the loader's internals or on replaying skipped batches).
  * Order: torch's DistributedSampler (shuffle, seed = run seed, set_epoch every epoch, as FA
    fit() did), also for a single process (FI used shuffle=True there: the same distribution).
    Padding duplicates as in torch when 50,000 does not divide (it does for 1, 2, 4, 8 ranks).
  * Validation: the whole test set on rank 0 in batches of 2 x batch, no sampler, plain
    normalisation (FI: every rank validated the whole set; only rank 0 logged). TTA (FI's
    --use-tta, off in both entries) is not implemented.
  * Loader: DataLoader with `workers` processes (FI -j 8) and pinned memory; FI's CUDA-stream
    prefetcher is replaced by non_blocking copies. cudnn.benchmark on, as FI; no warm-up
    outside the clock (FI had none either).
  * train_loss is the mean over the epoch's images (FA printed a debiased moving average).
  * On resume, train_time and fastai_time continue from the checkpoint (the restart's
    imports and data reading are not added; wall_time, which restarts with the process,
    shows them).
  * --runs N trains N times in one process with seeds common.runs.run_seed(seed, r); every
    row carries `run`; a final runs_summary row summarises the final test accuracies.
  * Exactness: on the CPU a resumed run reproduces an uninterrupted one bit for bit
    (weights, lr, momentum, metrics), single- or multi-process. On CUDA the schedule, data and
    step count resume exactly, but cudnn.benchmark picks non-deterministic kernels.

Outputs, under $CLOUDTRAIN_JOB_DIR (default ./cloudtrain-run) or --job-dir (rank 0 writes)
  metrics.jsonl           one row per epoch: run, epoch, epochs, step, steps, lr, momentum
                          (of the epoch's last step), train_loss, train_acc, test_acc,
                          test_loss (fractions / per image), train_time, fastai_time,
                          wall_time (seconds; see Timer), time; once per run an
                          {"event": "target_reached"} row when test_acc first reaches 0.94;
                          at the end an {"event": "runs_summary"} row (common.runs.summarise);
                          first, an {"event": "startup"} row (common.startup: import, data,
                          compile seconds with compile=true, to_first_step)
  checkpoints/last.pt     written atomically after every epoch, and at a step boundary on
                          SIGTERM or SIGUSR1 (agreed by all ranks; then exit 143); every rank
                          reads it on --resume true
Data is cached under $CLOUDTRAIN_DATA_DIR (default ~/.cloudtrain/data) or --data-dir.

Examples
  # the smoke profile: seconds on 2 CPU cores
  python recipes/wide-resnet34/train.py --data synthetic --synthetic_train 512 \\
      --synthetic_test 256 --depth 10 --widen 1 --batch_size 64 --epochs 2 --lr 0.4 --workers 0
  # the 8-GPU entry on one 8-GPU host
  python -m torch.distributed.run --standalone --nproc_per_node=8 \\
      recipes/wide-resnet34/train.py --variant 8gpu
"""
import argparse
import inspect
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the recipes/ folder
from common import arguments  # noqa: E402  (stdlib only: before the slow imports)
from common.arguments import parse_bool  # noqa: E402
from common.compiling import MODES as COMPILE_MODES  # noqa: E402  (stdlib only, too)

T_START = time.time()  # wall_time is measured from here
NAME = "wide-resnet34"

# =============================================================================================
# Hyperparameters. lr and weight decay are per image of the batch-mean loss (FA's
# F.cross_entropy), per process: each rank's batch is `batch_size` images and DDP averages.

CIFAR_MEAN = (0.4914, 0.48216, 0.44653)  # per channel, 0-1 scale (FI torch_loader)
CIFAR_STD = (0.24703, 0.24349, 0.26159)
PAD = 4                                  # px of reflect padding before the 32x32 random crop
CROP = 32
JITTER = 0.25                            # ColorJitter brightness, contrast and saturation
ROTATE = 2                               # RandomRotation range, degrees either way
STEM = 16                                # channels of the first conv; groups: 16k, 32k, 64k
TARGET_ACC = 0.94                        # DAWNBench CIFAR-10 target, top-1 on the 10k test set

HYP = {
    "8gpu": {                        # FI@1bc5aee, DAWNBench `fastai_pytorch`
        "gpus": 8,                   # processes the entry ran (global batch 8 x 128 = 1,024)
        "epochs": 40,                # --epochs 1 --cycle-len 40: one 40-epoch cycle
        "batch_size": 128,           # images per process per step
        "lr": 2.0,                   # peak lr
        "wd": 2e-4,                  # L2, on every parameter
        "clr": (50, 12.5, 0.95, 0.85),  # CircularLR_beta (div, pct, mom_max, mom_min)
    },
    "1gpu": {                        # FI@a2ff907, DAWNBench `fastai_pytorch_single_volta`
        "gpus": 1,
        "epochs": 30,
        "batch_size": 512,
        "lr": 1.5,
        "wd": 1e-4,
        "clr": (20, 20, 0.95, 0.85),
    },
}
DEPTH, WIDEN = 22, 6                 # WRN-22-6: (22 - 4) / 6 = 3 blocks per group
LOSS_SCALE = 512                     # static fp16 loss scale (FI --loss-scale 512)
WORKERS = 8                          # DataLoader processes (FI -j 8)

# =============================================================================================
# Command line. Every argument recipe.yaml declares, plus --job-dir / --data-dir (override the
# environment) and --stop-at-step (a testing aid). Both --batch_size and --batch-size work.


def parse_clr(text: str) -> tuple:
    """'div,pct,mom_max,mom_min' (FI --use-clr) -> a tuple of 4 floats."""
    try:
        parts = tuple(float(v) for v in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"expected div,pct,mom_max,mom_min, got {text!r}")
    return parts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="recipes/wide-resnet34/train.py",
        description="WRN-22-6 on CIFAR-10: fast.ai's DAWNBench April 2018 entries.",
        epilog="example: python recipes/wide-resnet34/train.py --data synthetic --depth 10 "
               "--widen 2 --batch_size 64 --epochs 2 --workers 0",
    )

    arg = arguments.adder(p)
    arg("variant", choices=sorted(HYP), default="8gpu")
    arg("depth", type=int, default=DEPTH, help="WRN depth, 6n+4 (10, 16, 22, 28, 34, ...)")
    arg("widen", type=int, default=WIDEN, help="WRN widening factor k")
    arg("epochs", type=int, default=None, help="default: 40 (8gpu) or 30 (1gpu)")
    arg("batch_size", type=int, default=None, help="per process; default 128 (8gpu) or 512")
    arg("lr", type=float, default=None, help="peak lr; default 2.0 (8gpu) or 1.5 (1gpu)")
    arg("wd", type=float, default=None, help="L2 weight decay; default 2e-4 or 1e-4")
    arg("clr", type=parse_clr, default=None,
        help="div,pct,mom_max,mom_min; default 50,12.5,0.95,0.85 or 20,20,0.95,0.85")
    arg("fp16", type=parse_bool, default=True, help="CUDA only: half model, fp32 BN and masters")
    arg("loss_scale", type=float, default=LOSS_SCALE, help="static loss scale under fp16")
    arg("workers", type=int, default=WORKERS, help="DataLoader worker processes per rank")
    arg("data", choices=["cifar10", "synthetic"], default="cifar10")
    arg("synthetic_train", type=int, default=5000, help="images (with --data synthetic)")
    arg("synthetic_test", type=int, default=1000, help="images (with --data synthetic)")
    arg("seed", type=int, default=0)
    arg("runs", type=int, default=1, help="train this many times (seeds seed, seed+1, ...)")
    arg("resume", type=parse_bool, default=False, help="continue from checkpoints/last.pt")
    arg("device", choices=["auto", "cpu", "cuda"], default="auto")
    arg("compile", type=parse_bool, default=False,
        help="torch.compile the training forward (compiled off the clock, before run 0)")
    arg("compile_mode", choices=COMPILE_MODES, default="auto",
        help="torch.compile mode; auto = max-autotune on CUDA, default on the CPU")
    arg("job_dir", default=None, help="default: $CLOUDTRAIN_JOB_DIR or ./cloudtrain-run")
    arg("data_dir", default=None, help="default: $CLOUDTRAIN_DATA_DIR or ~/.cloudtrain/data")
    arg("stop_at_step", type=int, default=None,
        help="testing aid: act as if SIGTERM arrived after this many steps (of each run)")
    return p


def check_args(args) -> None:
    """One-line errors for values that would otherwise fail deep inside torch."""
    if args.depth < 10 or (args.depth - 4) % 6:
        raise SystemExit(f"{NAME}: depth must be 6n+4 with n >= 1 (10, 16, 22, 28, 34, ...), "
                         f"got {args.depth}")
    if args.widen < 1:
        raise SystemExit(f"{NAME}: widen must be at least 1, got {args.widen}")
    for key in ("batch_size", "epochs"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            raise SystemExit(f"{NAME}: {key} must be at least 1, got {getattr(args, key)}")
    if args.runs < 1 or args.workers < 0:
        raise SystemExit(f"{NAME}: runs must be >= 1 and workers >= 0")
    if args.clr is not None and not (0 <= args.clr[1] < 100 and args.clr[0] > 0):
        raise SystemExit(f"{NAME}: clr pct must be in [0, 100) and div > 0, got {args.clr}")


if __name__ == "__main__":
    ARGS = build_parser().parse_args()
    check_args(ARGS)
    # First line out before the slow imports: the orchestrator times launch-to-first-output.
    if os.environ.get("RANK", "0") == "0":
        print(f"{NAME}: starting (variant={ARGS.variant}, WRN-{ARGS.depth}-{ARGS.widen}, "
              f"device={ARGS.device}, data={ARGS.data})", flush=True)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torch import nn  # noqa: E402
from torchvision import transforms  # noqa: E402

from common import (checkpoint, cifar10, compiling, distributed, metrics, runs,  # noqa: E402
                    startup, stopping)
from common.training import (  # noqa: E402
    MasterWeights, TrainClock, count_params, to_half_keep_bn_float)

# =============================================================================================
# Schedule: FA CircularLR_beta as pure functions of the iteration. One cycle of nb iterations:
# the lr rises linearly from lr/div to lr over cycle_nb iterations, falls back to lr/div over
# as many, then falls linearly towards lr/(div*100), which iteration nb would reach; momentum
# falls from mom_max to mom_min while the lr rises, climbs back while it falls, then holds.


def cycle_nb(nb: int, pct: float) -> int:
    """Iterations of the rise (and of the fall): FA's int(nb * (1 - pct/100) / 2)."""
    return int(nb * (1 - pct / 100) / 2)


def clr_beta_lr(i: int, nb: int, lr: float, div: float, pct: float) -> float:
    """FA CircularLR_beta.calc_lr at cycle iteration i (0 <= i <= nb)."""
    c = cycle_nb(nb, pct)
    if i > 2 * c:  # the final anneal, lr/div -> lr/(div*100)
        frac = (i - 2 * c) / (nb - 2 * c)
        return lr * (1 + frac * (1 - 100) / 100) / div
    frac = 1 - (i - c) / c if i > c else i / c
    return lr * (1 + frac * (div - 1)) / div


def clr_beta_mom(i: int, nb: int, pct: float, mom_max: float, mom_min: float) -> float:
    """FA CircularLR_beta.calc_mom at cycle iteration i: mom_max -> mom_min -> mom_max, hold."""
    c = cycle_nb(nb, pct)
    if i > 2 * c:
        return mom_max
    frac = 1 - (i - c) / c if i > c else i / c
    return mom_max + frac * (mom_min - mom_max)


def schedule(step: int, nb: int, lr: float, clr: tuple) -> tuple:
    """(lr, momentum) that batch `step` (0-based, of nb in the cycle) trains with. FA's
    LR_Updater computes the lr, which advances the cycle counter, and then the momentum from
    the advanced counter; after the last batch the counter wraps to 0 (same momentum)."""
    div, pct, mom_max, mom_min = clr
    return (clr_beta_lr(step, nb, lr, div, pct),
            clr_beta_mom((step + 1) % nb, nb, pct, mom_max, mom_min))


def steps_per_epoch(n_images: int, world_size: int, batch_size: int) -> int:
    """Batches per rank per epoch: DistributedSampler's ceil(n / world) images a rank, in
    batches that keep the last partial one (FA/FI loaders do not drop it)."""
    return math.ceil(math.ceil(n_images / world_size) / batch_size)


def resolve_hyp(args) -> dict:
    """The variant's hyperparameters with any of epochs, batch_size, lr, wd, clr overridden."""
    hyp = dict(HYP[args.variant])
    for key in ("epochs", "batch_size", "lr", "wd", "clr"):
        if getattr(args, key) is not None:
            hyp[key] = getattr(args, key)
    hyp["clr"] = tuple(float(v) for v in hyp["clr"])
    return hyp


# =============================================================================================
# Data


def train_transforms() -> transforms.Compose:
    """FI torch_loader's train transforms, on a PIL image; output a normalised 3x32x32."""
    return transforms.Compose([
        transforms.Pad(PAD, padding_mode="reflect"),
        transforms.RandomCrop(CROP),
        transforms.ColorJitter(JITTER, JITTER, JITTER),
        transforms.RandomRotation(ROTATE),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(CIFAR_MEAN, CIFAR_STD),
    ])


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one image's augmentation in one epoch of one run."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, np.uint64)[0])


class AugmentedCifar(torch.utils.data.Dataset):
    """uint8 NHWC images through `train_transforms`, each image's random choices drawn from
    torch's CPU generator seeded with (seed, epoch, index) inside a forked RNG (the caller's
    RNG, main process or worker, is left as it was). Only the CPU generator: torch.manual_seed
    would also queue a seed for every GPU (about 1 ms an image here) and touch CUDA in workers
    forked from a CUDA process. Set `epoch` before building an epoch's loader."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, seed: int):
        self.images, self.labels, self.seed, self.epoch = images, labels, seed, 0
        self.tfm = train_transforms()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(
                sample_seed(self.seed, self.epoch, index))
            image = self.tfm(Image.fromarray(self.images[index]))
        return image, int(self.labels[index])


def epoch_loader(dataset: AugmentedCifar, world, epoch: int, batch_size: int, skip: int,
                 workers: int):
    """The rank's batches of an epoch, from batch `skip` on (a resumed run skips the batches
    it has trained on without loading them)."""
    dataset.epoch = epoch
    indices = distributed.epoch_indices(len(dataset), world.world_size, world.rank,
                                        dataset.seed, epoch)
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, sampler=indices[skip * batch_size:], drop_last=False,
        num_workers=workers, pin_memory=world.device.type == "cuda",
        worker_init_fn=stopping.ignore_stop_signals if workers else None)


def normalise(images: np.ndarray) -> torch.Tensor:
    """uint8 NHWC -> float32 NCHW, ToTensor then Normalize (the same float ops, batched)."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255)
    mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std)


def load_data(args, world) -> dict:
    """Rank 0 reads (and on first use downloads or writes) the data first, then the others:
    two processes never write the same cache."""
    root = cifar10.data_dir(args.data_dir)

    def read():
        if args.data == "synthetic":
            return cifar10.load_synthetic(root, args.synthetic_train, args.synthetic_test,
                                          args.seed)
        return cifar10.load_cifar10(root)

    ds = read() if world.main else None
    world.barrier()
    return ds if world.main else read()


# =============================================================================================
# Model: the pre-activation Wide ResNet of FI's wideresnet.py (Zagoruyko & Komodakis, via the
# Cutout repository). conv3x3 3->16, three groups of n = (depth-4)/6 blocks at 16k, 32k, 64k
# channels and strides 1, 2, 2, then BN-ReLU, global average pool, Linear(64k, 10).


def conv(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)


class Block(nn.Module):
    """BN-ReLU -> conv3x3 (stride) -> BN-ReLU -> conv3x3, plus the shortcut: the input itself
    where the width is unchanged, else a 1x1 conv (stride) of the *pre-activated* input."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = conv(c_in, c_out, 3, stride)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = conv(c_out, c_out, 3)
        self.shortcut = conv(c_in, c_out, 1, stride) if c_in != c_out else None

    def forward(self, x):
        a = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(a))))
        return out + (x if self.shortcut is None else self.shortcut(a))


class WideResNet(nn.Module):
    def __init__(self, depth: int = DEPTH, widen: int = WIDEN, num_classes: int = 10):
        super().__init__()
        n = (depth - 4) // 6
        widths = (STEM, 16 * widen, 32 * widen, 64 * widen)
        self.conv1 = conv(3, STEM, 3)
        self.groups = nn.Sequential(*[
            nn.Sequential(*[Block(widths[g] if i == 0 else widths[g + 1], widths[g + 1],
                                  (1 if g == 0 else 2) if i == 0 else 1) for i in range(n)])
            for g in range(3)])
        self.bn = nn.BatchNorm2d(widths[3])
        self.fc = nn.Linear(widths[3], num_classes)
        for m in self.modules():  # FI's init; the Linear weight keeps torch's default
            if isinstance(m, nn.Conv2d):
                k = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / k))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = F.relu(self.bn(self.groups(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def build_model(depth: int = DEPTH, widen: int = WIDEN) -> WideResNet:
    if depth < 10 or (depth - 4) % 6:
        raise ValueError(f"depth must be 6n+4 with n >= 1, got {depth}")
    return WideResNet(depth, widen)


def wrap(model: nn.Module, world) -> nn.Module:
    """DDP over the world (rank 0's parameters and buffers broadcast to every rank here), or
    the model itself in a world of one. BatchNorm buffers are not synchronised after that, as
    in FI (recent torch spells it forward_sync_buffers=False; older, broadcast_buffers=False,
    which also skips the initial buffer broadcast: the same here, every rank starts with BN's
    fresh 0/1 statistics)."""
    if world.world_size == 1:
        return model
    ddp = nn.parallel.DistributedDataParallel
    no_buffer_sync = ({"forward_sync_buffers": False}
                      if "forward_sync_buffers" in inspect.signature(ddp).parameters
                      else {"broadcast_buffers": False})
    return ddp(model, device_ids=[world.device.index] if world.device.type == "cuda" else None,
               **no_buffer_sync)


# =============================================================================================
# Optimiser: SGD on fp32 master weights (FA's fp16 Stepper, common.training.MasterWeights), the
# same code in float32.


def make_optimizer(master: MasterWeights, hyp: dict) -> torch.optim.SGD:
    return torch.optim.SGD(master.params, lr=hyp["lr"], momentum=hyp["clr"][2],
                           weight_decay=hyp["wd"], dampening=0.0, nesterov=False)


def train_step(net, opt, master: MasterWeights, xb, yb, lr: float, momentum: float,
               loss_scale: float):
    """One update; returns (per-image losses, number correct), both detached. `net` is the
    DDP wrapper in a multi-process run: its backward averages the gradients over ranks."""
    for group in opt.param_groups:
        group["lr"], group["momentum"] = lr, momentum
    logits = net(xb)
    losses = F.cross_entropy(logits.float(), yb, reduction="none")
    (losses.mean() * loss_scale).backward()
    master.pull_grads(loss_scale)
    opt.step()
    opt.zero_grad(set_to_none=True)
    master.push()
    return losses.detach(), (logits.detach().argmax(1) == yb).sum()


# =============================================================================================
# Evaluation


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple:
    """(accuracy, mean cross-entropy) of the bare model (not DDP) on x, y."""
    model.eval()
    correct, loss = 0, 0.0
    for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
        logits = model(xb).float()
        correct += (logits.argmax(1) == yb).sum().item()
        loss += F.cross_entropy(logits, yb, reduction="sum").item()
    model.train()
    return correct / len(y), loss / len(y)


# =============================================================================================
# Training


# A checkpoint may only be resumed by a run that would have produced it (the resolved
# hyperparameters and the world size are checked too).
MUST_MATCH_ON_RESUME = ("variant", "depth", "widen", "fp16", "loss_scale", "data",
                        "synthetic_train", "synthetic_test", "seed")


def _print_row(values, header=False):
    fmt = (lambda v: f"{v:>12s}") if header else (
        lambda v: f"{v:>12.4f}" if isinstance(v, float) else f"{v:>12}")
    print("".join(fmt(v) for v in values), flush=True)


def main(argv=None, args=None) -> int:
    args = args or build_parser().parse_args(argv)
    check_args(args)
    world = distributed.setup(args.device)
    try:
        with stopping.StopRequest(NAME) as stop:
            return _train(args, world, stop)
    finally:
        world.close()


def _load_checkpoint(args, hyp, world, path):
    if not path.exists():
        if world.main:
            print(f"{NAME}: warning: --resume true but no checkpoint at {path}; starting from "
                  f"scratch", file=sys.stderr, flush=True)
        return None
    ckpt = checkpoint.load(path)  # on the CPU; state_dicts copy to the device
    saved = ckpt["args"]
    for key in MUST_MATCH_ON_RESUME:
        if saved.get(key) != getattr(args, key):
            raise SystemExit(f"{NAME}: {path} was written with {key}={saved.get(key)!r}, this "
                             f"run has {getattr(args, key)!r}; rerun with the same arguments "
                             f"or remove the checkpoint")
    if ckpt["hyp"] != hyp:
        raise SystemExit(f"{NAME}: {path} was written with hyperparameters {ckpt['hyp']}, this "
                         f"run has {hyp}")
    if ckpt["run"] >= args.runs:
        raise SystemExit(f"{NAME}: {path} is from run {ckpt['run']} (0-based), this job asks "
                         f"for {args.runs} run(s)")
    if ckpt["world_size"] != world.world_size:
        raise SystemExit(f"{NAME}: {path} was written by {ckpt['world_size']} processes, this "
                         f"run has {world.world_size}; the data shards and step count differ")
    if world.main:
        print(f"{NAME}: resuming run {ckpt['run']} from epoch {ckpt['epoch']} (step "
              f"{ckpt['step']}) of {path}", flush=True)
    return ckpt


def _train(args, world, stop) -> int:
    marks = startup.Startup(T_START, loader_workers=args.workers)
    marks.mark("import")
    hyp = resolve_hyp(args)
    device = world.device
    cuda = device.type == "cuda"
    half = cuda and args.fp16
    loss_scale = args.loss_scale if half else 1.0
    job_dir = metrics.job_dir(args.job_dir)
    ckpt_path = checkpoint.last_checkpoint_path(job_dir)
    if cuda:
        torch.backends.cudnn.benchmark = True  # FI: "This is important for speed"

    # Data: read once; the test set normalised once (plain transforms, no randomness).
    ds = load_data(args, world)
    marks.mark("data")
    (x_train_u8, y_train_np), (x_test_u8, y_test_np) = ds["train"], ds["test"]
    x_test = normalise(x_test_u8).to(device, torch.float16 if half else torch.float32)
    y_test = torch.from_numpy(y_test_np).to(device)
    bs, epochs = hyp["batch_size"], hyp["epochs"]
    spe = steps_per_epoch(len(x_train_u8), world.world_size, bs)
    nb = spe * epochs  # FA: len(trn_dl) * cycle_len

    ckpt = _load_checkpoint(args, hyp, world, ckpt_path) if args.resume else None
    if ckpt:
        checkpoint.check_schedule(ckpt_path, NAME, step=(ckpt.get("step"), nb),
                                  epoch=(ckpt.get("epoch"), epochs),
                                  completed_runs=(checkpoint.count_of(ckpt.get("accs")),
                                                  args.runs - 1))
    accs = list(ckpt["accs"]) if ckpt else []  # final test accuracy of each finished run
    if cycle_nb(nb, hyp["clr"][1]) < 1:
        raise SystemExit(f"{NAME}: {nb} steps are too few for the lr cycle (pct "
                         f"{hyp['clr'][1]:g}); train longer or on more images")
    if world.main:
        params = count_params(build_model(args.depth, args.widen))[0]
        precision = (f"float16 (fp32 BatchNorm and master weights, loss scale {loss_scale:g})"
                     if half else "float32")
        print(f"{NAME}: variant={args.variant} WRN-{args.depth}-{args.widen} params={params:,} "
              f"device={device.type} dtype={precision} processes={world.world_size} "
              f"batch={bs}/process ({bs * world.world_size} global) train={len(x_train_u8)} "
              f"test={len(x_test_u8)} steps/epoch={spe} epochs={epochs} steps={nb} "
              f"lr peak {hyp['lr']:g} at step {cycle_nb(nb, hyp['clr'][1])}", flush=True)
        if world.world_size != hyp["gpus"]:
            print(f"{NAME}: note: variant {args.variant} is set up for {hyp['gpus']} "
                  f"process(es), {hyp['gpus'] * bs:,} images a step; this run has "
                  f"{world.world_size}, {world.world_size * bs:,} images a step",
                  flush=True)
    writer = metrics.MetricsWriter(job_dir / metrics.METRICS_FILE) if world.main else None
    models = Models(compile=args.compile, mode=args.compile_mode,
                    cache_root=cifar10.data_dir(args.data_dir), marks=marks)
    try:
        for run in range(ckpt["run"] if ckpt else 0, args.runs):
            code, acc = _train_run(args, hyp, world, stop, run, ckpt, accs, writer,
                                   (x_train_u8, y_train_np), (x_test, y_test), half,
                                   loss_scale, ckpt_path, models)
            ckpt = None
            if code:
                return code
            accs.append(acc)
        if world.main:
            summary = runs.summarise(accs, TARGET_ACC)
            writer.write(event="runs_summary", **summary)
            print(f"{NAME}: {runs.describe(summary)}", flush=True)
    finally:
        if writer is not None:
            writer.close()
    return 0


@dataclass
class Models:
    """What the runs of a job share: with compile=true, the first run's model and its compiled
    forward (later runs copy fresh weights into it: no second compile); the startup marks,
    written as a row before the first step (issue 17)."""
    compile: bool
    mode: str
    cache_root: Path
    marks: startup.Startup | None
    model: nn.Module | None = None
    net: object = None

    def build(self, depth: int, widen: int, world, half: bool, batch_size: int,
              rank_images: int) -> tuple:
        """(bare model, what the training steps call: DDP and/or compiled), warmed up on
        the full batch and on the epoch's last, smaller one (the loader keeps it)."""
        device = world.device
        model = build_model(depth, widen).to(device)
        if half:
            to_half_keep_bn_float(model)
        if self.model is not None:
            self.model.load_state_dict(model.state_dict())
            return self.model, self.net
        net = wrap(model, world)
        if self.compile:
            self.marks.mark("data")  # the test set's upload and the model: not the compile's
            net = compiling.compiled(net, self.cache_root, device.type == "cuda", self.mode)
            sizes = [batch_size] + ([rank_images % batch_size] if rank_images % batch_size
                                    else [])
            compiling.warm_up(NAME, net, model, [(n, 3, CROP, CROP) for n in sizes],
                              torch.float16 if half else torch.float32, device)
            self.marks.mark("compile")
            self.model, self.net = model, net
        return model, net

    def write_startup(self, writer, world) -> None:
        """Once, on rank 0, before the first step."""
        if self.marks is not None and world.main:
            row = self.marks.row(world.device)
            writer.write(**row)
            print(f"{NAME}: {startup.describe(row)}", flush=True)
        self.marks = None


def _train_run(args, hyp, world, stop, run, ckpt, accs_before, writer, train_data, test_data,
               half, loss_scale, ckpt_path, models: Models) -> tuple:
    """One training run (of --runs). Returns (exit code, final test accuracy)."""
    device, cuda = world.device, world.device.type == "cuda"
    bs, epochs, lr_peak, clr = hyp["batch_size"], hyp["epochs"], hyp["lr"], hyp["clr"]
    seed = runs.run_seed(args.seed, run)
    dataset = AugmentedCifar(*train_data, seed=seed)
    x_test, y_test = test_data
    spe = steps_per_epoch(len(dataset), world.world_size, bs)
    nb = spe * epochs

    # The model: the same seed on every rank, and DDP broadcasts rank 0's weights anyway.
    torch.manual_seed(seed)
    model, net = models.build(args.depth, args.widen, world, half, bs,
                              math.ceil(len(dataset) / world.world_size))
    master = MasterWeights(model)
    opt = make_optimizer(master, hyp)

    step, target_reached, test_acc = 0, False, None
    clock, fastai_base = TrainClock(0.0, cuda), 0.0
    partial = torch.zeros(world.world_size, 3, dtype=torch.float64)  # loss sum, correct, seen
    if ckpt:
        model.load_state_dict(ckpt["model"])
        master.load(ckpt["master"])
        opt.load_state_dict(ckpt["optimizer"])
        checkpoint.restore_rng_states(ckpt["rng"])
        step, target_reached, test_acc = ckpt["step"], ckpt["target_reached"], ckpt["test_acc"]
        clock.total, fastai_base = ckpt["train_time"], ckpt["fastai_time"]
        partial = ckpt["partial"]
    if step >= nb:  # the checkpoint is this run's last epoch
        return 0, test_acc
    loop_t0 = time.perf_counter()

    def fastai_time() -> float:
        return fastai_base + time.perf_counter() - loop_t0

    def gather(loss_sum, correct, seen) -> torch.Tensor:
        """Every rank's (loss sum, correct, seen), as a (world, 3) float64 table on each."""
        table = torch.zeros(world.world_size, 3, dtype=torch.float64, device=device)
        table[world.rank, 0] = loss_sum
        table[world.rank, 1] = correct.double()
        table[world.rank, 2] = float(seen)
        return world.all_reduce_sum(table).cpu()

    def save(epoch_done: int, table: torch.Tensor) -> None:
        if world.main:
            checkpoint.save_atomic({
                "recipe": NAME, "args": vars(args), "hyp": hyp, "world_size": world.world_size,
                "run": run, "accs": list(accs_before), "epoch": epoch_done, "step": step,
                "steps": nb, "train_time": clock.total, "fastai_time": fastai_time(),
                "target_reached": target_reached, "test_acc": test_acc, "partial": table,
                "model": model.state_dict(), "master": [p.detach() for p in master.params],
                "optimizer": opt.state_dict(), "rng": checkpoint.rng_states(),
            }, ckpt_path)
        world.barrier()  # nobody exits (and gets its siblings killed) before the file is there

    def stop_requested() -> bool:
        at_limit = args.stop_at_step is not None and step >= args.stop_at_step
        return stop.agreed(world, extra=at_limit)

    models.write_startup(writer, world)
    if world.main:
        _print_row(("run", "epoch", "lr", "train time", "train loss", "train acc", "test acc",
                    "fastai time"), header=True)
    for epoch in range(step // spe, epochs):
        skip = step - epoch * spe  # > 0 only when resuming mid-epoch
        mine = partial[world.rank]
        loss_sum = torch.tensor(float(mine[0]), dtype=torch.float64, device=device)
        correct = torch.tensor(int(mine[1]), dtype=torch.int64, device=device)
        seen = int(mine[2])
        net.train()
        clock.start()
        for i, (xb, yb) in enumerate(epoch_loader(dataset, world, epoch, bs, skip, args.workers),
                                     start=skip):
            if stop_requested():
                clock.stop()
                table = gather(loss_sum, correct, seen)
                save(epoch, table)
                if world.main:
                    print(f"{NAME}: stopped at step {step} (run {run}, epoch {epoch + 1}, batch "
                          f"{i}); checkpoint saved to {ckpt_path}", flush=True)
                return stopping.EXIT_STOPPED, None
            xb = xb.to(device, non_blocking=True)
            xb = xb.half() if half else xb
            yb = yb.to(device, non_blocking=True)
            lr, mom = schedule(step, nb, lr_peak, clr)
            losses, n_correct = train_step(net, opt, master, xb, yb, lr, mom, loss_scale)
            step += 1
            loss_sum += losses.sum().double()
            correct += n_correct
            seen += len(yb)
        train_time = clock.stop()
        table = gather(loss_sum, correct, seen)
        totals = table.sum(0)

        # Off the train clock (on fastai's): evaluation on rank 0, metrics, checkpoint.
        if world.main:
            test_acc, test_loss = evaluate(model, x_test, y_test, 2 * bs)
            row = writer.write(
                run=run, epoch=epoch + 1, epochs=epochs, step=step, steps=nb,
                lr=lr, momentum=mom,
                train_loss=float(totals[0] / totals[2]), train_acc=float(totals[1] / totals[2]),
                test_acc=test_acc, test_loss=test_loss, train_time=round(train_time, 4),
                fastai_time=round(fastai_time(), 4), wall_time=round(time.time() - T_START, 4))
            _print_row((run, row["epoch"], row["lr"], row["train_time"], row["train_loss"],
                        row["train_acc"], row["test_acc"], row["fastai_time"]))
            if test_acc >= TARGET_ACC and not target_reached:
                target_reached = True
                writer.write(event="target_reached", run=run, epoch=epoch + 1, test_acc=test_acc,
                             train_time=row["train_time"], fastai_time=row["fastai_time"],
                             wall_time=row["wall_time"])
                print(f"{NAME}: reached {TARGET_ACC:.0%} test accuracy at epoch {epoch + 1}, "
                      f"train time {train_time:.2f} s, fastai time {row['fastai_time']:.2f} s",
                      flush=True)
        partial = torch.zeros(world.world_size, 3, dtype=torch.float64)
        save(epoch + 1, partial)
        if stop_requested() and epoch + 1 < epochs:
            if world.main:
                print(f"{NAME}: stopped after epoch {epoch + 1} of run {run}; checkpoint saved "
                      f"to {ckpt_path}", flush=True)
            return stopping.EXIT_STOPPED, None
    final_acc = world.broadcast_object(test_acc)
    if world.main:
        print(f"{NAME}: run {run} done, {epochs} epochs, test acc {final_acc:.4f}, train time "
              f"{clock.total:.2f} s, fastai time {fastai_time():.2f} s, wall time "
              f"{time.time() - T_START:.2f} s", flush=True)
    return 0, final_acc


if __name__ == "__main__":
    sys.exit(main(args=ARGS))
