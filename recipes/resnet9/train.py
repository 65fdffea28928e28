#!/usr/bin/env python3
"""ResNet9 on CIFAR-10: David Page's (myrtle.ai) two single-GPU recipes and Apple's 8-GPU
version of the bag of tricks, in one file.

Read it top to bottom: hyperparameters, command line, schedules, data, model, optimiser and
EMA, evaluation, the training loop. CF below is davidcpage/cifar10-fast, AP is
apple/ml-cifar-10-faster; the facts this file must match are in shared/recipes-spec.md
sections 1A and 1C.

Provenance
  --variant dawn            CF@d31ad8d dawn.py, the DAWNBench entry. 24 epochs, batch 512.
                            Published: 35 of 50 runs >= 94%, median 94.08%; 79 s wall, 74 s in
                            DAWNBench terms (preprocessing in, validation out) on 1x V100
                            (AWS p3.2xlarge, GPU clocks pinned with nvidia-smi -ac 877,1530).
  --variant bag-of-tricks   CF@f79e8b8 bag_of_tricks.ipynb cells 63-85 (and new_dawn.py), the
  (default with gpus=1)     final 10-epoch recipe of "How to train your ResNet 8: Bag of tricks".
                            Published: 94.1% mean test accuracy (flip TTA) in 26 s on 1x V100.
  --variant apple-8gpu      AP@0b8962a fast_cifar_10_distributed.py + utils.py (launched by
  (default with gpus>1)     train_cifar_parallel.sh, 8 workers): the bag-of-tricks network
                            without the EMA, 256 images per GPU x 8 = 2048, 18 epochs, lr x1.5.
                            Published: 50 runs, 41 >= 94%, median 94.19%, min 93.74%; median
                            7.82 s, max 10.32 s (the first run: no warm-up); DAWNBench: 94.2% at
                            row 15, 9.43 s, on 8x V100-SXM2 32 GB (no price given).
  This file                 Not yet timed on a GPU. CPU float32 throughput of the full-size
                            model: benchmarks/resnet9_cpu.py.

How the multi-GPU variant is selected and started
  `gpus` is the number of processes (one per GPU) the arguments are set up for: the shard
  count, and with it the global batch gpus x batch_size. gpus=1 (the default) selects
  bag-of-tricks unless --variant says otherwise; gpus > 1 selects apple-8gpu, the only
  multi-GPU recipe here (dawn and bag-of-tricks refuse gpus > 1). The published recipe is
  gpus=8. The job must be started with exactly `gpus` processes:
      python recipes/resnet9/train.py ...                                            (gpus=1)
      python -m torch.distributed.run --standalone --nproc_per_node=8 \\
          recipes/resnet9/train.py --gpus 8 ...                                      (gpus=8)
  Any other WORLD_SIZE stops at once with a one-line message and exit status 2. Under torchrun
  rank r uses cuda:LOCAL_RANK and NCCL (gloo on the CPU: the tests run gpus=2 that way).

Where this file had to choose (each is equivalent to the source or says how it is not)
  * lr knots scale with --epochs: knot_epochs * epochs / default_epochs. At the default epochs
    they are exactly CF's ([0, 2, 8] of 10; [0, 5, 24] of 24) and AP's ([0, 3.6, 16] of 18).
    CF's notebook writes [0, epochs/5, epochs-2] and AP [0, epochs/5, epochs-2] too, which
    agree with ours at the default epochs only.
  * CF's and AP's optimisers increment the step counter before reading the schedule, so update
    k (1-based) uses lr(k / steps_per_epoch): the first step has a small non-zero lr and the
    last dawn step has lr 0. We do the same, with Page's update written out in `NesterovSGD`.
  * The EMA counter is CF's: an update after steps 1, 6, 11, ... (0-based batch count % 5 == 0).
  * GhostBatchNorm splits a batch into interleaved ghost batches (sample i in split i % splits),
    as CF's reshape does. Eval uses the running stats averaged over the splits (spec 1A), at
    every evaluation, without writing them back. CF instead averages them in place on a
    train->eval switch and then reads split 0; its EMA model switches to eval once, so from the
    second evaluation on CF reads split 0 of the EMA stats (still blended with the first
    average). AP's per-epoch eval model has the same quirk (from epoch 2 on it reads split 0
    of rank 0's stats). We follow the documented intent, not that quirk.
  * GPUBatches-style augmentation: for each transform, shuffle the dataset, split it into
    min(#options, 200) groups whose sizes differ by at most one, give each group one option
    (81 crop offsets, 2 flip choices) drawn in shuffled order, then shuffle for batching. We
    draw the choices as per-image tables and apply them in one pass, which yields the same
    distribution over augmented epochs as CF's sequence of torch.cat's.
  * The whitening covariance (CF: uncentred X^T X / (n-1) of 3x3 patches of the first 10,000
    training images, centre 32x32) is accumulated in float64 chunks and eigendecomposed in
    float64; CF used float32 `symeig`. Whitening counts as timed preprocessing for Page's
    variants; AP does not time it (see the timer below).
  * apple-8gpu whitening comes from rank 0's shard: AP computes it on each rank from the first
    10,000 images of that rank's shard (all 6,250 of them at 8 GPUs: images 0, 8, 16, ...),
    and rank 0's filters reach every rank with its initial state_dict. So do we (the spec's
    summary says "10k images"; the code gives 6,250).
  * The loss is computed in float32 from the (fp16 on CUDA) logits; CF computed it in fp16.
  * dawn: the per-image random choices for a whole epoch are drawn and applied up front on the
    CPU (CF: per image inside Dataset.__getitem__); batches then come from a DataLoader with
    num_workers=0 and pinned memory, as in CF.
  * Randomness of an epoch's augmentation and order comes from a generator seeded with
    (seed, epoch, rank), so a resumed run sees the same batches as an uninterrupted one.
  * On resume, train_time continues from the checkpoint; the repeated preprocessing is not
    added again (wall_time, which restarts with the process, shows it).
  * apple-8gpu, distributed: rank r seeds torch with seed + r (AP: seed = rank; the same at
    seed 0), then every rank takes rank 0's initial weights by broadcast (AP saves rank 0's
    state_dict to initialized.model and every rank loads it). Rank r trains on the fixed
    strided shard range(r, 50000, gpus) (6,250 images, 24 steps of 256 at gpus=8), shuffled and
    augmented on the rank, the same shard every epoch. The steps per epoch come from the
    smallest shard (n // gpus), so every rank takes the same number.
  * Gradients are averaged by an explicit all-reduce after backward, not torch DDP: each
    gradient is divided by world_size and summed over ranks (DDP's arithmetic), one flat
    buffer per dtype in a fixed order. Same update as AP's DDP; it gives up DDP's overlap of
    communication with backward (about 13 MB of fp16 gradients per step, a fraction of a
    millisecond on NVLink), and gains the same reduction layout at every step, so a resumed
    run reduces exactly as the uninterrupted one did (DDP rebuilds its buckets after the first
    step of each process, which can change NCCL's summation order). DDP's per-step
    broadcast of rank 0's BN buffers is not needed: rank 0's running stats, the only ones
    evaluated, see rank 0's batches either way.
  * apple-8gpu timer (AP's): the upload of the raw train and test sets to the device and, per
    run, the initial weight broadcast and the training steps. Not timed: normalise/pad/fp16 and
    the whitening statistics (AP times neither), evaluation, checkpoints. Rank 0's clock is
    reported. Page's variants keep CF's timer (preprocessing and whitening in). AP reports the
    upload time in every run's time; with runs=N every run's train_time likewise starts from
    the one preprocessing (Page) or upload (AP) time of the job.
  * apple-8gpu evaluation runs on rank 0 only, on its own weights (identical on every rank),
    with flip TTA; AP evaluates the whole test set on every rank and prints rank 0's.
  * No cuDNN warm-up for apple-8gpu (AP has none: its first run is the slowest).
  * Stop requests (SIGTERM, SIGUSR1: common.stopping) are agreed across ranks at every step
    boundary over the CPU (common.distributed's gloo control group under NCCL), so the check
    never waits for the GPU. Rank 0 writes the checkpoint; every rank's RNG states and partial-epoch sums are
    gathered into it (one file, one atomic rename) and each rank restores its own on resume.
  * runs=N repeats the training in one process with the data loaded and preprocessed once; run
    r uses seed common.runs.run_seed(seed, r) for its weights, augmentation and order.
  * --bn_momentum (default 0.1, every variant's) and --ema_momentum (default: bag-of-tricks'
    0.99 per step) exist for short runs only. Evaluation reads two averages over recent
    training: the BN running stats (about the last 1/0.1 = 10 steps) and Page's EMA model
    (about the last 1/(1 - 0.99) = 100 steps, updated every 5). Over Page's 970 steps both are
    the end of training; over a few dozen steps they are mostly the random initialisation. The
    smoke profile once ran 8 steps: the EMA had 2 updates (0.99**10 = 90% initial weights),
    and the test accuracy was chance (0.1055) whatever the training did. It now runs 32 steps
    of 32 images (one ghost batch, Page's 32-image size) with bn_momentum 0.4 and
    ema_momentum 0.9, and ends at 0.5-0.9 test accuracy by seed.

Outputs, under $CLOUDTRAIN_JOB_DIR (default ./cloudtrain-run) or --job-dir (rank 0 writes)
  metrics.jsonl           one row per epoch: run, epoch, epochs, step, lr (non-bias group, on
                          the batch-mean loss: 1.0 at the bag-of-tricks peak, 1.5 for
                          apple-8gpu), train_loss, train_acc (over every rank's images),
                          test_acc, test_loss (fractions / per image), train_time, wall_time
                          (seconds) and time; an {"event": "target_reached"} row when a run's
                          test_acc first reaches 0.94; with runs > 1 a final
                          {"event": "runs_summary"} row (common.runs.summarise of the runs'
                          final test_acc, plus their median and max train_time); first, an
                          {"event": "startup"} row (common.startup: import, data, warm_up or
                          compile seconds, to_first_step)
  checkpoints/last.pt     written atomically after every epoch, and at a step boundary on
                          SIGTERM or SIGUSR1 (then exit 143); --resume true continues from it,
                          bit-for-bit, also across runs and ranks
Data is cached under $CLOUDTRAIN_DATA_DIR (default ~/.cloudtrain/data) or --data-dir.

Example (the smoke profile: a few seconds on 2 CPU cores):
  python recipes/resnet9/train.py --data synthetic --synthetic_train 512 --synthetic_test 256 \\
      --width_div 8 --ghost_splits 1 --batch_size 32 --epochs 2 --bn_momentum 0.4 \\
      --ema_momentum 0.9
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the recipes/ folder
from common import arguments  # noqa: E402  (stdlib only: before the slow imports)
from common.arguments import parse_bool  # noqa: E402
from common.compiling import MODES as COMPILE_MODES  # noqa: E402  (stdlib only, too)

T_START = time.time()  # wall_time is measured from here

# =============================================================================================
# Hyperparameters. lr and weight decay are given on the batch-*mean* loss, as papers state
# them; the loss below is *summed* over the (per-GPU) batch, as in CF and AP, so the update
# divides lr by the batch size and multiplies the weight decay by it: lr/512 and 5e-4*512 at
# batch 512. With several GPUs the gradients are then averaged over ranks, so the lr applies
# to the mean loss over the global batch (AP: 1.5 on 2048 images).

CIFAR_MEAN = (125.31, 122.95, 113.87)  # per channel, 0-255 scale (CF)
CIFAR_STD = (62.99, 62.09, 66.70)
PAD = 4                                # px of reflect padding; 32x32 crops = +-4 px translation
CROP = 32
WIDTHS = (64, 128, 256, 512)           # channels of prep, layer1, layer2, layer3 (width_div 1)
BN_EPS = 1e-5
BN_MOMENTUM = 0.1                      # PyTorch convention: weight of the newest batch's stats
TARGET_ACC = 0.94                      # DAWNBench CIFAR-10 target, top-1 on the 10k test set
APPLE_LR_SCALER = 1.5                  # AP --lr_scaler: Page's lr values (and wd) x1.5

HYP = {
    "dawn": {
        "epochs": 24,
        "batch_size": 512,
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
        "bn_momentum": BN_MOMENTUM,
        "whiten": False,               # prep is conv_bn 3->64
        "head_scale": 0.125,
        "label_smoothing": 0.0,
        "ema_every": 0,                # steps; 0 = no EMA
        "ema_momentum": None,
        "tta_flip": False,
        "augment": "per-sample",       # independent crop, flip, cutout choice per image
        "cutout": 8,                   # px square, fully inside the image, filled with 0
        "data_on_device": False,       # CPU tensors through a DataLoader, pinned memory
        "timed_prep": "preprocess",    # the clock covers preprocessing (CF)
        "cuda_warmup": True,           # CF warms cuDNN up off the clock
    },
    "bag-of-tricks": {
        "epochs": 10,
        "batch_size": 512,
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
        "bn_momentum": BN_MOMENTUM,
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
        "timed_prep": "preprocess",
        "cuda_warmup": True,
    },
    "apple-8gpu": {                    # the bag of tricks as AP changed it (spec 1C)
        "epochs": 18,
        "batch_size": 256,             # per GPU; x gpus (8) = 2048 per step
        "lr_knots": (0, 3.6, 16),      # epochs: [0, epochs/5, epochs-2]; flat 16 -> 18
        "lr_vals": tuple(APPLE_LR_SCALER * v for v in (0.0, 1.0, 0.1)),  # 0, 1.5, 0.15
        "momentum": 0.9,
        "weight_decay": 5e-4 * APPLE_LR_SCALER,  # x256 per GPU = 0.192; lr*wd peaks at 1.125e-3
        "bias_lr_mult": 64,            # peak 96/256
        "bias_wd_div": 64,             # 0.192/64 = 0.003
        "block": "conv-pool-bn-act",
        "act": "celu",
        "celu_alpha": 0.3,
        "ghost_bn": True,              # 16 splits of 256: 16-image ghost batches
        "bn_momentum": BN_MOMENTUM,
        "whiten": True,
        "whiten_eps": 1e-2,
        "whiten_images": 10_000,       # first N images of the rank's shard; rank 0's are used
        "head_scale": 1 / 16,
        "label_smoothing": 0.2,
        "ema_every": 0,                # AP removed the EMA model
        "ema_momentum": None,
        "tta_flip": True,
        "augment": "grouped",
        "max_options": 200,
        "cutout": 0,
        "data_on_device": True,
        "timed_prep": "upload",        # the clock covers the upload only (AP)
        "cuda_warmup": False,          # AP: none
    },
}
SINGLE_GPU_VARIANTS = ("bag-of-tricks", "dawn")

# =============================================================================================
# Command line. Every argument recipe.yaml declares, plus --job-dir / --data-dir (override the
# environment) and --stop-at-step (a testing aid). Both --batch_size and --batch-size work.


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="recipes/resnet9/train.py",
        description="ResNet9 on CIFAR-10: Page's bag-of-tricks or DAWNBench recipe (1 GPU), or "
                    "Apple's 8-GPU version (--gpus 8, under torchrun).",
        epilog="example (the smoke profile): python recipes/resnet9/train.py --data synthetic "
               "--width_div 8 --ghost_splits 1 --batch_size 32 --epochs 2 --bn_momentum 0.4 "
               "--ema_momentum 0.9",
    )

    arg = arguments.adder(p)
    arg("variant", choices=sorted(HYP), default=None,
        help="default: bag-of-tricks with --gpus 1, apple-8gpu with --gpus > 1")
    arg("gpus", type=int, default=1,
        help="processes (one per GPU) the run is set up for: the shard count; must equal "
             "torchrun's WORLD_SIZE (1 without torchrun)")
    arg("epochs", type=int, default=None, help="default: 10 (bag-of-tricks), 24 (dawn), 18 (apple)")
    arg("batch_size", type=int, default=None,
        help="images per step per GPU; default: 512 (Page), 256 (apple-8gpu)")
    arg("width_div", type=int, default=1, help="divide every channel count by this (smoke: 8)")
    arg("ghost_splits", type=int, default=16, help="ghost batches per batch (bag-of-tricks, apple)")
    arg("bn_momentum", type=float, default=BN_MOMENTUM,
        help="weight of the newest batch in the BatchNorm running stats that evaluation reads "
             "(0.1 in every published variant; the smoke profile's 32-step run uses 0.4)")
    arg("ema_momentum", type=float, default=None,
        help="per-step momentum of the evaluated EMA model (bag-of-tricks only; default: "
             "Page's 0.99, applied as 0.99**5 every 5 steps; the smoke profile uses 0.9)")
    arg("data", choices=["cifar10", "synthetic"], default="cifar10")
    arg("synthetic_train", type=int, default=5000, help="images (with --data synthetic)")
    arg("synthetic_test", type=int, default=1000, help="images (with --data synthetic)")
    arg("seed", type=int, default=0)
    arg("runs", type=int, default=1, help="train this many times (run r: seed + r), data once")
    arg("resume", type=parse_bool, default=False, help="continue from checkpoints/last.pt")
    arg("device", choices=["auto", "cpu", "cuda"], default="auto")
    arg("compile", type=parse_bool, default=False,
        help="torch.compile the training forward (compiled off the clock, before run 1)")
    arg("compile_mode", choices=COMPILE_MODES, default="auto",
        help="torch.compile mode; auto = max-autotune on CUDA, default on the CPU")
    arg("job_dir", default=None, help="default: $CLOUDTRAIN_JOB_DIR or ./cloudtrain-run")
    arg("data_dir", default=None, help="default: $CLOUDTRAIN_DATA_DIR or ~/.cloudtrain/data")
    arg("stop_at_step", type=int, default=None,
        help="testing aid: act as if SIGTERM arrived after this many steps (of a run)")
    return p


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """In place: the variant from gpus, the batch size from the variant."""
    if args.variant is None:
        args.variant = "apple-8gpu" if args.gpus > 1 else "bag-of-tricks"
    if args.batch_size is None:
        args.batch_size = HYP[args.variant]["batch_size"]
    return args


def variant_hyp(args: argparse.Namespace) -> dict:
    """The variant's hyperparameters with this run's --bn_momentum and --ema_momentum. Both
    set how many recent steps an evaluated average spans: about 1/m = 10 for the BN running
    stats at momentum m = 0.1, about 1/(1 - rho) = 100 for Page's EMA at rho = 0.99. Against
    Page's 970 steps that is the end of training; against an 8-step run it is mostly the
    random initialisation (see the smoke profile in recipe.yaml)."""
    hyp = dict(HYP[args.variant])
    hyp["bn_momentum"] = args.bn_momentum
    if hyp["ema_every"] and args.ema_momentum is not None:
        hyp["ema_momentum"] = args.ema_momentum
    return hyp


def environment_world_size(env) -> int:
    """The number of processes torchrun started (common.distributed's rule), else 1."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["WORLD_SIZE"])
    return 1


def launch_problem(args: argparse.Namespace, env) -> str | None:
    """One line saying why these arguments cannot run in this launch, or None."""
    if args.gpus < 1 or args.runs < 1:
        return f"resnet9: gpus and runs must be at least 1 (gpus={args.gpus}, runs={args.runs})"
    if not 0 < args.bn_momentum <= 1:
        return f"resnet9: bn_momentum must be in (0, 1], got {args.bn_momentum}"
    if args.ema_momentum is not None and not 0 <= args.ema_momentum < 1:
        return f"resnet9: ema_momentum must be in [0, 1), got {args.ema_momentum}"
    if args.gpus > 1 and args.variant in SINGLE_GPU_VARIANTS:
        return (f"resnet9: variant {args.variant} is a single-GPU recipe; gpus={args.gpus} is "
                f"apple-8gpu (leave variant unset, or set it to apple-8gpu)")
    world = environment_world_size(env)
    if world == args.gpus:
        return None
    if args.gpus == 1:
        return (f"resnet9: {world} processes were started but gpus=1: run one process "
                f"(python recipes/resnet9/train.py ...), or set gpus={world} for apple-8gpu "
                f"on {world} GPUs")
    return (f"resnet9: gpus={args.gpus} needs {args.gpus} processes but {world} "
            f"{'was' if world == 1 else 'were'} started: run python -m torch.distributed.run "
            f"--standalone --nproc_per_node={args.gpus} recipes/resnet9/train.py "
            f"--gpus {args.gpus} ...")


def is_rank0(env=os.environ) -> bool:
    return env.get("RANK", "0") == "0"


if __name__ == "__main__":
    ARGS = resolve_defaults(build_parser().parse_args())
    _PROBLEM = launch_problem(ARGS, os.environ)
    if _PROBLEM:  # before the slow imports, and no traceback: one line, exit status 2
        if is_rank0():
            print(_PROBLEM, file=sys.stderr, flush=True)
        sys.exit(2)
    # First line out before the slow imports: the orchestrator times launch-to-first-output.
    if is_rank0():
        print(f"resnet9: starting (variant={ARGS.variant}, gpus={ARGS.gpus}, "
              f"device={ARGS.device}, data={ARGS.data})", flush=True)

import copy  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from common import (checkpoint, cifar10, compiling, distributed, metrics, runs,  # noqa: E402
                    startup, stopping)
from common.training import TrainClock, count_params, to_half_keep_bn_float  # noqa: E402

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


def preprocess(images_nhwc, device, dtype, pad: int) -> torch.Tensor:
    """uint8 NHWC (numpy or tensor) -> normalised, reflect-padded NCHW in dtype on device."""
    x = torch.as_tensor(images_nhwc).to(device).permute(0, 3, 1, 2).float()
    mean = torch.tensor(CIFAR_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD, device=device).view(1, 3, 1, 1)
    x = (x - mean) / std
    if pad:
        x = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    return x.to(dtype).contiguous()


def epoch_generator(seed: int, epoch: int, rank: int = 0) -> torch.Generator:
    """Rank 0 seeds as a single-process run always has; other ranks mix (seed, epoch, rank)
    into 32 bits (torch's CPU generator keeps only the low 32 bits of a seed)."""
    if rank == 0:
        return torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    mixed = np.random.SeedSequence([seed % 2 ** 32, epoch, rank]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(mixed))


def shard_indices(n: int, rank: int, world_size: int) -> range:
    """AP: rank r trains on the fixed strided shard r, r + world_size, r + 2 world_size, ..."""
    return range(rank, n, world_size)


def epoch_steps(n: int, world_size: int, batch_size: int) -> int:
    """Full batches per epoch, the same on every rank: those of the smallest shard."""
    return (n // world_size) // batch_size


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


def epoch_batches(x_pad, y, epoch: int, hyp: dict, seed: int, batch_size: int, device, dtype,
                  rank: int = 0, steps: int | None = None):
    """This epoch's augmented batches (drop_last; at most `steps` of them) of a rank's shard,
    fully determined by (seed, epoch, rank)."""
    gen = epoch_generator(seed, epoch, rank)
    n = len(x_pad)
    if hyp["augment"] == "grouped":
        offsets, flips, corners = grouped_choices(n, gen, max_options=hyp["max_options"])
    else:
        offsets, flips, corners = per_sample_choices(n, gen, cutout=hyp["cutout"])
    x_aug = augment(x_pad, offsets, flips, corners, hyp["cutout"])
    order = torch.randperm(n, generator=gen)
    steps = n // batch_size if steps is None else min(steps, n // batch_size)
    if hyp["data_on_device"]:
        order = order.to(x_aug.device)
        for i in range(steps):
            idx = order[i * batch_size:(i + 1) * batch_size]
            yield x_aug[idx], y[idx]
        return
    # CF dawn.py: a DataLoader with num_workers=0 and pinned memory feeds the GPU.
    sampler = torch.utils.data.BatchSampler(order[:steps * batch_size].tolist(), batch_size,
                                            drop_last=True)
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

    def __init__(self, channels: int, splits: int, momentum: float = BN_MOMENTUM):
        super().__init__(channels, eps=BN_EPS, momentum=momentum)
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
            self.bn = GhostBatchNorm(c_out, ghost_splits, hyp["bn_momentum"])
        else:
            self.bn = nn.BatchNorm2d(c_out, eps=BN_EPS, momentum=hyp["bn_momentum"])
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


def build_model(variant: str, width_div: int = 1, ghost_splits: int = 16,
                hyp: dict | None = None) -> ResNet9:
    """hyp: the variant's, as variant_hyp adjusts it for a run (default HYP[variant])."""
    hyp = hyp or HYP[variant]
    if WIDTHS[0] % width_div:
        raise ValueError(f"width_div must divide {WIDTHS[0]}, got {width_div}")
    return ResNet9(hyp, width_div, ghost_splits if hyp["ghost_bn"] else 1)


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


# =============================================================================================
# Distributed: gradient averaging, the stop flag, gathering per-rank state


def average_gradients(params, world) -> None:
    """Every rank ends with the mean of the ranks' gradients: each gradient is divided by
    world_size, then summed over ranks (DDP's arithmetic), through one flat buffer per dtype
    whose layout is the same at every step."""
    if world.world_size == 1:
        return
    by_dtype = {}
    for p in params:
        by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads]).div_(world.world_size)
        world.all_reduce_sum(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def init_model(variant: str, width_div: int, ghost_splits: int, seed: int, world, device,
               filters=None, half: bool = False, hyp: dict | None = None) -> nn.Module:
    """Rank r seeds torch with seed + r and builds the model; then every rank takes rank 0's
    parameters and buffers (AP: rank 0's initialized.model, loaded by every rank)."""
    torch.manual_seed(seed + world.rank)
    np.random.seed(seed)
    model = build_model(variant, width_div, ghost_splits, hyp).to(device)
    if half:
        to_half_keep_bn_float(model)
    if filters is not None:
        model.set_whitening(filters.to(device))
    world.broadcast_module(model)
    return model


def train_step(fwd, opt: NesterovSGD, xb, yb, lr: float, alpha: float, world=None):
    """One update on a batch (a rank's share of it, when world has several ranks: the gradients
    are then averaged over ranks before the update); returns (per-image losses, number
    correct) of this rank's images, both detached. fwd: the model, or torch.compile(model)."""
    logits = fwd(xb)
    losses = per_sample_loss(logits, yb, alpha)
    losses.sum().backward()
    if world is not None and world.world_size > 1:
        average_gradients([p for g in opt.groups for p in g["params"]], world)
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


# A checkpoint may only be resumed by a run that would have produced it (runs may change).
MUST_MATCH_ON_RESUME = ("variant", "gpus", "batch_size", "width_div", "ghost_splits",
                        "bn_momentum", "ema_momentum", "data", "synthetic_train",
                        "synthetic_test", "seed")
# What a checkpoint from before an argument existed meant.
SAVED_DEFAULTS = {"gpus": 1, "bn_momentum": BN_MOMENTUM, "ema_momentum": None}


def _print_row(values, header=False):
    fmt = (lambda v: f"{v:>12s}") if header else (
        lambda v: f"{v:>12.4f}" if isinstance(v, float) else f"{v:>12}")
    print("".join(fmt(v) for v in values), flush=True)


def main(argv=None, args=None) -> int:
    args = resolve_defaults(args or build_parser().parse_args(argv))
    problem = launch_problem(args, os.environ)
    if problem:
        if is_rank0():
            print(problem, file=sys.stderr, flush=True)
        return 2
    with stopping.StopRequest("resnet9") as stop:
        world = distributed.setup(args.device)
        try:
            return _train(args, world, stop)
        finally:
            world.close()


def _train(args, world, stop: stopping.StopRequest) -> int:
    marks = startup.Startup(T_START)
    marks.mark("import")
    hyp = variant_hyp(args)
    epochs = args.epochs or hyp["epochs"]
    bs, gpus, rank = args.batch_size, args.gpus, world.rank
    device = world.device
    cuda = device.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    job_dir = metrics.job_dir(args.job_dir)
    ckpt_path = checkpoint.last_checkpoint_path(job_dir)
    if hyp["ghost_bn"] and bs % args.ghost_splits:
        raise SystemExit(f"resnet9: --ghost_splits {args.ghost_splits} must divide "
                         f"--batch_size {bs}")

    # Read the raw data (download / disk: not timed, as in CF, AP and DAWNBench). Rank 0 first:
    # it may download or write the files the others then read.
    data_root = cifar10.data_dir(args.data_dir)
    if not world.main:
        world.barrier()
    if args.data == "synthetic":
        ds = cifar10.load_synthetic(data_root, args.synthetic_train, args.synthetic_test, args.seed)
    else:
        ds = cifar10.load_cifar10(data_root)
    if world.main:
        world.barrier()
    marks.mark("data")
    (x_train_u8, y_train_np), (x_test_u8, y_test_np) = ds["train"], ds["test"]
    spe = epoch_steps(len(x_train_u8), gpus, bs)
    if spe == 0:
        per = f"{len(x_train_u8) // gpus} training images per GPU" if gpus > 1 else \
            f"{len(x_train_u8)} training images"
        raise SystemExit(f"resnet9: {per} < one batch of {bs}")

    ckpt = None
    if args.resume:
        if ckpt_path.exists():
            ckpt = checkpoint.load(ckpt_path)  # on the CPU; state_dicts copy to the device
            saved = ckpt["args"]
            for key in MUST_MATCH_ON_RESUME:
                value = saved.get(key, SAVED_DEFAULTS.get(key))
                if value != getattr(args, key):
                    raise SystemExit(f"resnet9: {ckpt_path} was written with {key}="
                                     f"{value!r}, this run has {getattr(args, key)!r}; "
                                     f"rerun with the same arguments or remove the checkpoint")
            if ckpt["epochs"] != epochs:
                raise SystemExit(f"resnet9: {ckpt_path} is for {ckpt['epochs']} epochs, "
                                 f"this run asks for {epochs}")
            checkpoint.check_schedule(
                ckpt_path, "resnet9", step=(ckpt.get("step"), spe * epochs),
                epoch=(ckpt.get("epoch"), epochs), run=(ckpt.get("run", 0), args.runs - 1),
                completed_runs=(checkpoint.count_of(ckpt.get("run_accs", [])), args.runs))
            if world.main:
                print(f"resnet9: resuming from run {ckpt.get('run', 0)}, epoch {ckpt['epoch']} "
                      f"(step {ckpt['step']}) of {ckpt_path}", flush=True)
        elif world.main:
            print(f"resnet9: warning: --resume true but no checkpoint at {ckpt_path}; "
                  f"starting from scratch", file=sys.stderr, flush=True)

    # Preprocessing, once for all runs. Page: the clock covers normalise, pad, NCHW and the
    # whitening filters. AP: it covers the upload of the raw sets to the device only.
    upload_only = hyp["timed_prep"] == "upload"
    clock = TrainClock(0.0, cuda)
    world.barrier()  # AP: all ranks start timing together
    clock.start()
    data_device = device if hyp["data_on_device"] else torch.device("cpu")
    x_train_raw = torch.from_numpy(x_train_u8).to(data_device)
    y_train = torch.from_numpy(y_train_np).to(data_device)
    x_test_raw = torch.from_numpy(x_test_u8).to(device) if upload_only else x_test_u8
    if upload_only:
        prep_time = clock.stop()
    shard = shard_indices(len(x_train_raw), rank, gpus)
    shard = slice(shard.start, shard.stop, shard.step)
    x_train = preprocess(x_train_raw[shard], data_device,
                         dtype if hyp["data_on_device"] else torch.float32, PAD)
    y_train = y_train[shard]
    del x_train_raw
    filters = None
    if hyp["whiten"]:  # from this rank's shard; rank 0's reach every rank with its weights
        n = min(hyp["whiten_images"], len(x_train))
        filters, _ = whitening_filters(x_train[:n, :, PAD:-PAD, PAD:-PAD], hyp["whiten_eps"])
    if not upload_only:
        prep_time = clock.stop()
    x_test = y_test = None
    if world.main:  # only rank 0 evaluates
        x_test = preprocess(x_test_raw, device, dtype, 0)
        y_test = torch.from_numpy(y_test_np).to(device)
    del x_test_raw

    params_total = params_trainable = None
    if world.main:
        params_total, params_trainable = count_params(
            build_model(args.variant, args.width_div, args.ghost_splits, hyp))
        global_batch = f"{bs} per GPU x {gpus} = {bs * gpus}" if gpus > 1 else f"{bs}"
        print(f"resnet9: variant={args.variant} device={device.type} dtype={str(dtype)[6:]} "
              f"params={params_total:,} (trainable {params_trainable:,}) "
              f"train={len(x_train_u8)}{f' ({len(x_train)} per GPU)' if gpus > 1 else ''} "
              f"test={len(x_test)} batch={global_batch} steps/epoch={spe} epochs={epochs}"
              f"{f' runs={args.runs}' if args.runs > 1 else ''}", flush=True)

    writer = metrics.MetricsWriter(job_dir / metrics.METRICS_FILE) if world.main else None
    run_accs = list(ckpt.get("run_accs", [])) if ckpt else []
    run_times = list(ckpt.get("run_times", [])) if ckpt else []
    first_run = len(run_accs)
    # A checkpoint of an unfinished run resumes it; one written at the end of run r starts r + 1.
    resume_from = ckpt if ckpt is not None and ckpt.get("run", 0) == first_run else None

    def stop_agreed(step: int) -> bool:
        return stop.agreed(world, extra=args.stop_at_step is not None
                           and step >= args.stop_at_step)

    compiled = {}  # compile=true: the first run's model and its compiled forward, kept

    def one_run(run: int, ckpt) -> int:
        seed = runs.run_seed(args.seed, run)
        if cuda:
            torch.backends.cudnn.benchmark = True
        model = init_model(args.variant, args.width_div, args.ghost_splits, seed, world, device,
                           filters, half=cuda, hyp=hyp)  # untimed: AP builds its model off the clock
        fwd = model
        if args.compile and compiled:  # later runs: the fresh weights into the compiled model
            compiled["model"].load_state_dict(model.state_dict())
            model, fwd = compiled["model"], compiled["fwd"]
        elif args.compile:
            marks.mark("data")  # the preprocessing and the model: not the compile's
            fwd = compiling.compiled(model, data_root, cuda, args.compile_mode)
            # epoch_batches drops the last partial batch: one shape
            compiling.warm_up("resnet9", fwd, model, [(bs, 3, CROP, CROP)], dtype, device)
            compiled.update(model=model, fwd=fwd)
            marks.mark("compile")
        elif cuda and hyp["cuda_warmup"] and run == first_run:
            marks.mark("data")
            cuda_warmup(model, hyp, bs, device, dtype)
            marks.mark("warm_up")
        # AP times its DDP wrap and the broadcast of rank 0's weights; ours was just done, and
        # takes its time again on the clock (a second broadcast changes nothing).
        clock = TrainClock(ckpt["train_time"] if ckpt else prep_time, cuda)
        world.barrier()
        clock.start()
        world.broadcast_module(model)
        if ckpt:
            clock.discard()
        else:
            clock.stop()

        ema = copy.deepcopy(model) if hyp["ema_every"] else None
        opt = NesterovSGD(param_groups(model, hyp, bs), hyp["momentum"])
        step, target_reached = 0, False
        partial = {"loss_sum": 0.0, "correct": 0, "seen": 0}
        if ckpt:
            model.load_state_dict(ckpt["model"])
            if ema is not None:
                ema.load_state_dict(ckpt["ema"])
            opt.load_state_dict(ckpt["optimizer"])
            mine = ckpt["ranks"][rank] if "ranks" in ckpt else ckpt
            checkpoint.restore_rng_states(mine["rng"])
            step, target_reached = ckpt["step"], ckpt["target_reached"]
            partial = mine["partial"]

        def save(epoch_done: int) -> None:
            """Rank 0 writes one file holding every rank's RNG states and partial sums."""
            ranks = world.gather_objects({"rng": checkpoint.rng_states(), "partial": partial})
            if world.main:
                checkpoint.save_atomic({
                    "recipe": "resnet9", "args": vars(args), "epochs": epochs,
                    "run": run, "run_accs": run_accs, "run_times": run_times,
                    "world_size": world.world_size,
                    "epoch": epoch_done, "step": step, "train_time": clock.total,
                    "target_reached": target_reached, "partial": partial,
                    "model": model.state_dict(),
                    "ema": ema.state_dict() if ema is not None else None,
                    "optimizer": opt.state_dict(), "rng": ranks[0]["rng"], "ranks": ranks,
                }, ckpt_path)

        def stopped(message: str) -> int:
            world.barrier()  # the checkpoint is on disk before any rank leaves
            if world.main:
                print(f"resnet9: stopped {message}; checkpoint saved to {ckpt_path}", flush=True)
            return stopping.EXIT_STOPPED

        if world.main:
            if run == first_run:  # what came before the first step (issue 17)
                row = marks.row(device)
                writer.write(**row)
                print(f"resnet9: {startup.describe(row)}", flush=True)
            if args.runs > 1:
                print(f"resnet9: run {run + 1} of {args.runs} (seed {seed})", flush=True)
            _print_row(("epoch", "lr", "train time", "train loss", "train acc", "test acc",
                        "wall time"), header=True)
        rho = hyp["ema_momentum"] ** hyp["ema_every"] if hyp["ema_every"] else None
        for epoch in range(step // spe, epochs):
            skip = step - epoch * spe  # > 0 only when resuming mid-epoch
            loss_sum = torch.tensor(partial["loss_sum"], dtype=torch.float64, device=device)
            correct = torch.tensor(partial["correct"], dtype=torch.int64, device=device)
            seen = partial["seen"]
            clock.start()
            batches = epoch_batches(x_train, y_train, epoch, hyp, seed, bs, device, dtype,
                                    rank=rank, steps=spe)
            for i, (xb, yb) in enumerate(batches):
                if i < skip:
                    continue
                if stop_agreed(step):
                    clock.stop()
                    partial = {"loss_sum": loss_sum.item(), "correct": int(correct.item()),
                               "seen": seen}
                    save(epoch)
                    return stopped(f"at step {step} (epoch {epoch + 1}, batch {i}"
                                   f"{f', run {run + 1}' if args.runs > 1 else ''})")
                step += 1
                lr = lr_at(step, spe, hyp, epochs, bs)
                losses, n_correct = train_step(fwd, opt, xb, yb, lr, hyp["label_smoothing"],
                                               world)
                loss_sum += losses.sum().double()
                correct += n_correct
                seen += len(yb)
                if ema is not None and is_ema_step(step, hyp["ema_every"]):
                    ema_update(ema, model, rho)
            train_time = clock.stop()

            # Off the clock: the sums over ranks, evaluation (rank 0), metrics, checkpoint.
            totals = world.all_reduce_sum(torch.stack([
                loss_sum, correct.double(), torch.tensor(float(seen), dtype=torch.float64,
                                                         device=device)]))
            loss_total, correct_total, seen_total = totals.tolist()
            test_acc = None
            if world.main:
                test_acc, test_loss = evaluate(ema if ema is not None else model, x_test,
                                               y_test, bs, hyp["tta_flip"])
                row = writer.write(
                    run=run, epoch=epoch + 1, epochs=epochs, step=step, lr=lr * bs,
                    train_loss=loss_total / seen_total, train_acc=correct_total / seen_total,
                    test_acc=test_acc, test_loss=test_loss,
                    train_time=round(train_time, 4), wall_time=round(time.time() - T_START, 4))
                _print_row((row["epoch"], row["lr"], row["train_time"], row["train_loss"],
                            row["train_acc"], row["test_acc"], row["wall_time"]))
            test_acc = world.broadcast_object(test_acc)
            if test_acc >= TARGET_ACC and not target_reached:
                target_reached = True
                if world.main:
                    writer.write(event="target_reached", run=run, epoch=epoch + 1,
                                 test_acc=test_acc, train_time=row["train_time"],
                                 wall_time=row["wall_time"])
                    print(f"resnet9: reached {TARGET_ACC:.0%} test accuracy at epoch "
                          f"{epoch + 1}, train time {train_time:.2f} s", flush=True)
            partial = {"loss_sum": 0.0, "correct": 0, "seen": 0}
            last_epoch = epoch + 1 == epochs
            if last_epoch:
                run_accs.append(test_acc)
                run_times.append(round(train_time, 4))
            save(epoch + 1)
            if (not last_epoch or run + 1 < args.runs) and stop_agreed(step):
                where = f"after epoch {epoch + 1}" + (f" of run {run + 1}" if args.runs > 1
                                                      else "")
                return stopped(where)
        if world.main and args.runs > 1 and len(run_accs) > run:
            print(f"resnet9: run {run + 1} done: test acc {run_accs[run]:.4f}, train time "
                  f"{run_times[run]:.2f} s", flush=True)
        if world.world_size > 1:  # every rank must end with rank 0's weights
            agree = world.agreement(model)
            if world.main:
                writer.write(event="ranks", run=run, **agree)
                print(f"resnet9: {agree['world_size']} ranks on {agree['nodes']} node(s) "
                      + ("agree: identical weights" if agree["identical"] else
                         "DISAGREE: their weights differ"), flush=True)
        return 0

    try:
        for run in range(first_run, args.runs):
            code = one_run(run, resume_from if run == first_run else None)
            if code:
                return code
        if world.main and args.runs > 1:
            summary = runs.summarise(run_accs, TARGET_ACC)
            writer.write(event="runs_summary", **summary,
                         median_train_time=float(np.median(run_times)),
                         max_train_time=float(max(run_times)))
            print(f"resnet9: {runs.describe(summary)}; train time median "
                  f"{np.median(run_times):.2f} s, max {max(run_times):.2f} s", flush=True)
    finally:
        if writer is not None:
            writer.close()
    if world.main:
        total = run_times[-1] if run_times else 0.0
        print(f"resnet9: done, {epochs} epochs{f' x {args.runs} runs' if args.runs > 1 else ''}"
              f", train time {total:.2f} s{' (last run)' if args.runs > 1 else ''}, "
              f"wall time {time.time() - T_START:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(args=ARGS))
