#!/usr/bin/env python3
"""ResNet-50 on ImageNet with progressive resizing: fast.ai's DAWNBench run (one p3.16xlarge,
about 3 h), DIU + fast.ai's "ImageNet in 18 minutes" schedules (1, 4, 8 and 16 machines) and
FFCV's ResNet-50 configs, on one code path.

Read it top to bottom: command line, data, model and optimiser, evaluation, the training loop.
The tables are in phases.py, the models in model.py, the loaders in
recipes/common/imagenet_data.py (PIL; decode=cpu and gpu) and recipes/common/imagenet_dali.py
(NVIDIA DALI; decode=dali, and auto on CUDA where it is installed), the on-disk layout in
recipes/common/imagenet_files.py.
The facts this recipe must match are in shared/recipes-spec.md sections 3 and 4.

Variants (`--variant`; phases.py has every table)
  dawn-1x8       FI imagenet_nv/main.py: 45 epochs, 128 px from 160 px copies, 224, then 288
  (default)      (min_scale 0.5); 128 images per GPU x 8; lr 0.4; fp16 with fp32 master
                 weights, loss scale 128; weight decay on every parameter. Published: 93.002%
                 top-5 at TSV row 41, 2.9575 h on a p3.16xlarge ($72.40 on demand).
  machines-N     DX train.py schedules for N = 1, 4, 8, 16 machines of 8 GPUs: bn0 init, no
                 weight decay on BatchNorm, loss scale 1024, rectangular validation at 288;
                 machines-8 as its published run logged it (phases.py says which copy each
                 table follows). `cloudtrain launch` starts them on N machines by default;
                 on fewer (`--nodes K`, or one host by hand) they keep the published per-GPU
                 batch, scale the lr to the smaller global batch, and say so.
  ffcv-rn50-E    FF rn50 configs, E in 16, 24, 32, 40, 56, 88: 160 -> 192 px ramp, BlurPool,
                 label smoothing 0.1, AMP, 512 per GPU, validation at 256 with the 224/256 crop
                 ratio and flip TTA; train and val from FFCV's data, the max/500 copies
                 (`data prepare --max-sides 500`), where the dataset has them, else full size.
  tiny           a test table with DX's structure at 1/4 size (the smoke profile).

Where this file had to choose (each is equivalent to the source or says how it is not)
  * Launch: torchrun, one process per GPU (NCCL on CUDA, gloo on the CPU), env://. FI used its
    multiproc.py with a file:// rendezvous, DX torch.distributed.launch.
  * Data-parallelism: torch DistributedDataParallel (gradients averaged over ranks, rank 0's
    weights broadcast at the start, BatchNorm buffers broadcast from rank 0 every forward, the
    torch default). DX and FI used their own DDP wrappers that averaged the same way.
  * Training order: torch's DistributedSampler (shuffle, seed, set_epoch), as both sources.
    Each image's RandomResizedCrop and flip are drawn from a generator seeded by (seed, epoch,
    image index): any worker count, any rank, and a resumed run crop identically (the sources
    drew from unseeded global RNGs).
  * Validation is exact on any number of ranks: DX's DistValSampler batching (contiguous
    slices, the same number of batches on every rank, some short or empty) and one all-reduce
    of the counts. FI validated with a DistributedSampler (which repeats images to even the
    shards) and every GPU validated the whole set at 288 px: the same numbers, here exact.
  * Precision. `master` variants (FI, DX) on CUDA: an fp16 model with fp32 BatchNorm, fp32
    master weights that SGD steps, and a static loss scale (DX network_to_half,
    prep_param_lists; FI the same by hand). `amp` variants (FF): autocast + GradScaler,
    channels_last. On the CPU every variant trains in float32 through the same code (the
    master copies then equal the model's weights; the scale is 1).
  * The loss is the batch-mean cross-entropy in float32 from the logits (the sources: in the
    model's precision).
  * Timers. DAWNBench counts training and excludes validation and checkpoints (spec section
    0). `train_time` is that: the epochs' data loading and steps. `loop_time` is DX's timer:
    from the start of the first epoch (after the loaders are built) including validation and
    checkpoints. `wall_time` counts from the process start. The DAWNBench TSV
    (`dawnbench.tsv`: epoch, hours, top1Accuracy, top5Accuracy in percent, epoch 0-based as
    in the sources) uses train_time; metrics.jsonl rows carry all three. On resume
    train_time and loop_time continue from the checkpoint. DAWNBench also counts initial
    preprocessing: here that is `cloudtrain data prepare` (the resized copies), done once per
    dataset and timed by that command, not by this script.
  * A checkpoint is written after every epoch and at a step boundary on SIGTERM or SIGUSR1
    (agreed by all ranks, exit 143): model, master weights, optimizer (momentum), loss scaler,
    the global step (epoch and position follow from the schedule), RNG states, the epoch's
    partial sums per rank and the timers. On the CPU a resumed run ends bit-for-bit where an
    uninterrupted one ends, also when stopped inside a phase or just before a phase switch.
  * Workers: `workers` null = the host's cores per GPU process minus one (at least one).

Outputs, under $CLOUDTRAIN_JOB_DIR (default ./cloudtrain-run) or --job-dir (rank 0 writes)
  metrics.jsonl          one row per epoch: epoch, epochs, step, steps, phase, size, batch,
                         global_batch, source, min_scale, val_mode, val_size, lr, train_loss,
                         train_acc, test_acc (top-1), top5, test_loss, images_per_s,
                         data_wait, train_time, loop_time, val_time, wall_time; an
                         {"event": "target_reached"} row the first time the variant's
                         target is met (top5 >= 0.93; ffcv-rn50-E: FFCV's top-1, phases.py);
                         first, an {"event": "startup"} row (common.startup: import, data,
                         to_first_step seconds; for the ffcv variants `tree`, max/500 or
                         full, the folders read, and `tree_why`)
  dawnbench.tsv          the DAWNBench table (see Timers)
  checkpoints/last.pt    see above
Data: a prepared tree (`cloudtrain data prepare imagenet SRC DEST`) at --data-dir, default
$CLOUDTRAIN_DATA_DIR/imagenet; `--data synthetic` writes generated JPEGs in the official
layout and prepares them first (the same loaders as the real run).

Examples
  python recipes/imagenet/train.py --variant tiny --arch resnet18 --data synthetic --workers 1
  python -m torch.distributed.run --standalone --nproc_per_node=8 recipes/imagenet/train.py \\
      --variant dawn-1x8 --data-dir /data/imagenet
"""
import argparse
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the recipes/ folder: `common`
sys.path.insert(0, str(HERE))         # phases, model
from common import arguments  # noqa: E402  (stdlib only: before the slow imports)
from common.arguments import parse_bool  # noqa: E402
from phases import DEFAULT_VARIANT, VARIANTS  # noqa: E402

T_START = time.time()  # wall_time is measured from here
NAME = "imagenet"
ARCHS = ("resnet50", "resnet18")
TSV = "dawnbench.tsv"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="recipes/imagenet/train.py",
        description="ResNet-50 on ImageNet with progressive resizing (fast.ai DAWNBench 2018, "
                    "DIU imagenet18, FFCV).",
        epilog="example: python recipes/imagenet/train.py --variant tiny --arch resnet18 "
               "--data synthetic --workers 1")
    arg = arguments.adder(p)
    arg("variant", choices=sorted(VARIANTS), default=DEFAULT_VARIANT)
    arg("arch", choices=ARCHS, default="resnet50",
        help="resnet50 is the recipe; resnet18 only for quick CPU runs")
    arg("epochs", type=int, default=None, help="default: the variant's published run length")
    arg("batch_div", type=int, default=1,
        help="divide every per-GPU batch by this (GPUs with less memory); the lr follows the "
             "global batch; must divide the variant's batches")
    arg("workers", type=int, default=None,
        help="DataLoader processes per GPU process; default: cores per process minus one")
    arg("decode", choices=["auto", "cpu", "gpu", "dali"], default="auto",
        help="auto: dali on CUDA where NVIDIA DALI is installed, else cpu; cpu: PIL in the "
             "workers; gpu: nvjpeg through torchvision.io.decode_jpeg; dali: DALI's pipeline "
             "(common.imagenet_dali; on the CPU without CUDA)")
    arg("fp16", type=parse_bool, default=True,
        help="CUDA only: the variant's half precision (master weights or AMP)")
    arg("loss_scale", type=float, default=None, help="static loss scale; default the variant's")
    arg("data", choices=["imagenet", "synthetic"], default="imagenet")
    arg("synthetic_classes", type=int, default=10)
    arg("synthetic_train", type=int, default=16, help="training images per class (synthetic)")
    arg("synthetic_val", type=int, default=4, help="validation images per class (synthetic)")
    arg("seed", type=int, default=0)
    arg("resume", type=parse_bool, default=False, help="continue from checkpoints/last.pt")
    arg("device", choices=["auto", "cpu", "cuda"], default="auto")
    arg("job_dir", default=None, help="default: $CLOUDTRAIN_JOB_DIR or ./cloudtrain-run")
    arg("data_dir", default=None,
        help="the prepared dataset; default $CLOUDTRAIN_DATA_DIR/imagenet (synthetic: "
             "$CLOUDTRAIN_DATA_DIR/imagenet-synthetic-...)")
    arg("stop_at_step", type=int, default=None,
        help="testing aid: act as if SIGTERM arrived after this many steps")
    return p


def check_args(args) -> None:
    """One-line errors for values that would otherwise fail deep inside torch."""
    if args.epochs is not None and args.epochs < 1:
        raise SystemExit(f"{NAME}: epochs must be at least 1, got {args.epochs}")
    if args.batch_div < 1:
        raise SystemExit(f"{NAME}: batch_div must be at least 1, got {args.batch_div}")
    if args.workers is not None and args.workers < 0:
        raise SystemExit(f"{NAME}: workers must be >= 0, got {args.workers}")
    if args.loss_scale is not None and not (args.loss_scale > 0 and math.isfinite(args.loss_scale)):
        raise SystemExit(f"{NAME}: loss_scale must be a positive number, got {args.loss_scale}")
    for key in ("synthetic_classes", "synthetic_train", "synthetic_val"):
        if getattr(args, key) < 1:
            raise SystemExit(f"{NAME}: {key} must be at least 1, got {getattr(args, key)}")
    if args.synthetic_classes > 1000:
        raise SystemExit(f"{NAME}: synthetic_classes is at most 1000")


if __name__ == "__main__":
    ARGS = build_parser().parse_args()
    check_args(ARGS)
    # First line out before the slow imports: the orchestrator times launch-to-first-output.
    if os.environ.get("RANK", "0") == "0":
        print(f"{NAME}: starting (variant={ARGS.variant}, arch={ARGS.arch}, "
              f"device={ARGS.device}, data={ARGS.data})", flush=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from common import checkpoint, distributed, imagenet_dali, imagenet_data  # noqa: E402
from common import imagenet_files  # noqa: E402
from common import metrics, startup, stopping  # noqa: E402
from common.training import MasterWeights, TrainClock, count_params  # noqa: E402
from common.training import to_half_keep_bn_float  # noqa: E402
from model import build_model, param_groups  # noqa: E402
from phases import Schedule, lr_scale_for, reading, with_batch_div, with_epochs  # noqa: E402

# =============================================================================================
# Data


def default_data_dir() -> Path:
    return Path(os.environ.get("CLOUDTRAIN_DATA_DIR") or "~/.cloudtrain/data").expanduser()


def synthetic_root(args, variant) -> Path:
    """Generate JPEGs in the official layout and prepare them like the real set: node-local
    rank 0 writes (both steps skip work already done), the others wait."""
    base = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    tag = f"c{args.synthetic_classes}-t{args.synthetic_train}-v{args.synthetic_val}-s{args.seed}"
    return base / f"imagenet-synthetic-{tag}-src", base / f"imagenet-synthetic-{tag}"


def prepare_synthetic(args, variant, world) -> Path:
    src, root = synthetic_root(args, variant)
    sizes = sorted(int(s.split("/")[1]) for s in variant.sources() if s)
    if world.local_rank == 0:
        imagenet_files.write_synthetic_official(
            src, classes=args.synthetic_classes, train_per_class=args.synthetic_train,
            val_per_class=args.synthetic_val, seed=args.seed)
        imagenet_files.prepare_imagenet(src, root, sizes=sizes, workers=1)
    world.barrier()
    return root


def choose_tree(root: Path, variant) -> tuple:
    """(the variant as it will read, {"tree", "tree_why"} for the startup row): a variant
    that prefers a copy (the ffcv-rn50-* variants: max/500, FFCV's data) reads it where the
    prepared dataset has both its train/ and val/, else the full-size JPEGs; {} for the
    others, which read what their tables say."""
    if not variant.prefers:
        return variant, {}
    base = imagenet_files.source_root(root, variant.prefers)
    if (base / imagenet_files.TRAIN).is_dir() and (base / imagenet_files.VAL).is_dir():
        return reading(variant, variant.prefers), {
            "tree": variant.prefers,
            "tree_why": f"{variant.prefers} is there: FFCV's data (longer side at most 500 px, "
                        "q90 JPEGs)"}
    return variant, {
        "tree": "full",
        "tree_why": f"no {variant.prefers} in the dataset: the full-size JPEGs (`cloudtrain "
                    f"data prepare imagenet SRC DEST --max-sides 500` writes FFCV's copies)"}


def check_tree(root: Path, variant) -> dict:
    """Every folder the variant reads exists, has images, and lists the same classes and the
    same files as the full-size one (the loaders index every folder by position, so a copy
    that lacks a file would shift the labels): {source: (train samples, classes)}. One line
    naming what is wrong and how to fix it otherwise."""
    fix = f"run `{imagenet_files.prepare_command(root, variant.sources())}`"
    lacking = [s for s in variant.sources()
               if not all((imagenet_files.source_root(root, s) / split).is_dir()
                          for split in (imagenet_files.TRAIN, imagenet_files.VAL))]
    found, reference = {}, None
    for source in variant.sources():
        base = imagenet_files.source_root(root, source)
        lists = {}
        for split in (imagenet_files.TRAIN, imagenet_files.VAL):
            if not (base / split).is_dir():
                raise SystemExit(
                    f"{NAME}: no {base / split}; variant {variant.name} reads "
                    + ", ".join(s or "full-size" for s in variant.sources())
                    + f": run `{imagenet_files.prepare_command(root, lacking)}`")
            try:
                samples, classes = imagenet_files.list_images(base / split)
            except ValueError as exc:
                raise SystemExit(f"{NAME}: {exc}") from None
            if not samples:
                raise SystemExit(f"{NAME}: no images under {base / split}: {fix}")
            lists[split] = (samples, classes)
        (train, classes), (val, val_classes) = lists[imagenet_files.TRAIN], \
            lists[imagenet_files.VAL]
        if val_classes != classes:
            raise SystemExit(f"{NAME}: {base / imagenet_files.VAL} has {len(val_classes)} class "
                             f"folders, {base / imagenet_files.TRAIN} has {len(classes)} (or "
                             f"other names): the labels would not match; {fix}")
        names = ([p for p, _ in train], [p for p, _ in val])
        if reference is None:
            reference = (source, names)
        elif names != reference[1]:
            raise SystemExit(f"{NAME}: {source or 'full-size'} and {reference[0] or 'full-size'} "
                             f"do not hold the same files; {fix}")
        found[source] = (train, classes)
    return found


class Loaders:
    """The datasets of the phase in force, rebuilt only when what they depend on changes:
    a train set per source folder (its size and min_scale set per epoch), a val set per
    (source, size, mode, batch)."""

    def __init__(self, root: Path, seed: int, decode: str, listings: dict):
        self.root, self.seed, self.decode = root, seed, decode
        self.listings = listings  # check_tree's {source: (train samples, classes)}
        self.train_sets: dict = {}
        self.val_key, self.val_set = None, None

    def train(self, plan):
        folder = imagenet_files.source_root(self.root, plan.source) / imagenet_files.TRAIN
        ds = self.train_sets.get(plan.source)
        if ds is None:
            ds = self.train_sets[plan.source] = imagenet_data.TrainSet(
                folder, plan.size, plan.min_scale, self.seed,
                decode="gpu" if self.decode == "gpu" else "cpu",
                listing=self.listings.get(plan.source))
        ds.size, ds.min_scale = plan.size, plan.min_scale
        return ds

    def val(self, plan):
        key = (plan.source, plan.val_size, plan.val_mode, plan.val_batch)
        if key != self.val_key:
            folder = imagenet_files.source_root(self.root, plan.source) / imagenet_files.VAL
            self.val_set = imagenet_data.ValSet(folder, plan.val_size, plan.val_mode,
                                                plan.val_batch)
            self.val_key = key
        return self.val_set


# =============================================================================================
# Model and optimiser


def make_model(args, variant, n_classes: int, device, half: bool, amp: bool) -> nn.Module:
    torch.manual_seed(args.seed)
    model = build_model(args.arch, bn0=variant.bn0, fc_init_std=variant.fc_init_std,
                        blurpool=variant.blurpool, num_classes=n_classes).to(device)
    if half:
        to_half_keep_bn_float(model)
    if amp or (variant.precision == "amp" and device.type == "cuda"):
        model = model.to(memory_format=torch.channels_last)
    return model


def wrap(model: nn.Module, world) -> nn.Module:
    if world.world_size == 1:
        return model
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[world.device.index] if world.device.type == "cuda" else None)


def make_optimizer(model: nn.Module, master: MasterWeights, variant) -> torch.optim.SGD:
    """SGD (momentum 0.9, not Nesterov) over the fp32 master weights, grouped by the
    variant's weight-decay rule (model.param_groups); the lr is set at every step."""
    groups = param_groups(model, variant.weight_decay, variant.wd_rule, masters=master.params)
    return torch.optim.SGD(groups, lr=0.0, momentum=variant.momentum, nesterov=False)


class Stepper:
    """One update in the variant's precision. master: loss x scale backward through the
    (half) model, gradients to the fp32 masters / scale, SGD on the masters, copy back.
    amp: autocast forward, GradScaler step (FF). The CPU: float32, scale 1, no autocast."""

    def __init__(self, net, model, master, opt, variant, loss_scale: float, amp: bool):
        self.net, self.model, self.master, self.opt = net, model, master, opt
        self.loss_scale, self.amp = loss_scale, amp
        self.smoothing = variant.label_smoothing
        self.scaler = torch.amp.GradScaler(master.params[0].device.type, enabled=amp)

    def __call__(self, x, y, lr: float):
        for group in self.opt.param_groups:
            group["lr"] = lr
        with torch.autocast(x.device.type, dtype=torch.float16, enabled=self.amp):
            logits = self.net(x)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=self.smoothing)
        if self.amp:
            self.model.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            # The optimizer steps the masters: with AMP they are fp32 copies of fp32 weights,
            # so the grads move over and the scaler unscales and steps them there.
            self.master.pull_grads(1.0)
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            (loss * self.loss_scale).backward()
            self.master.pull_grads(self.loss_scale)
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.master.push()
        return loss.detach(), logits.detach()


# =============================================================================================
# Evaluation


@torch.no_grad()
def evaluate(model, loader, prep, world, tta: bool, amp: bool) -> dict:
    """top-1, top-5 and mean loss over the whole validation set, exact on any world size:
    each rank sums its batches (some may be empty), one all-reduce adds the ranks up."""
    was = model.training
    model.eval()
    device = world.device
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top-1, top-5, images
    for xb, yb in loader:
        if len(yb) == 0:
            continue
        x, y = prep(xb), yb.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
            logits = model(x).float()
            if tta:  # FF lr_tta: the logits of the image plus those of its mirror
                logits = logits + model(torch.flip(x, dims=[3])).float()
        sums += batch_sums(F.cross_entropy(logits, y), logits, y)
    world.all_reduce_sum(sums)
    model.train(was)
    loss, c1, c5, n = sums.tolist()
    if n == 0:
        raise SystemExit(f"{NAME}: the validation folder has no images")
    return {"top1": c1 / n, "top5": c5 / n, "loss": loss / n, "n": int(n)}


# =============================================================================================
# Training

MUST_MATCH_ON_RESUME = ("variant", "arch", "epochs", "batch_div", "fp16", "loss_scale", "data",
                        "synthetic_classes", "synthetic_train", "synthetic_val", "seed",
                        "decode")


def _load_checkpoint(args, world, path: Path):
    if not path.exists():
        if world.main:
            print(f"{NAME}: warning: --resume true but no checkpoint at {path}; starting from "
                  f"scratch", file=sys.stderr, flush=True)
        return None
    ckpt = checkpoint.load(path)
    saved = ckpt.get("args", {})
    for key in MUST_MATCH_ON_RESUME:
        if saved.get(key) != getattr(args, key):
            raise SystemExit(f"{NAME}: {path} was written with {key}={saved.get(key)!r}, this "
                             f"run has {getattr(args, key)!r}; rerun with the same arguments "
                             f"or remove the checkpoint")
    if ckpt["world_size"] != world.world_size:
        raise SystemExit(f"{NAME}: {path} was written by {ckpt['world_size']} processes, this "
                         f"run has {world.world_size}; the data shards and step count differ")
    return ckpt


def _write_tsv(job_dir: Path, rows: list) -> None:
    """The DAWNBench table, rewritten whole (a resumed run drops rows it will redo)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    path = job_dir / TSV
    tmp = path.with_name(f".{TSV}.tmp")
    lines = ["epoch\thours\ttop1Accuracy\ttop5Accuracy"]
    lines += [f"{e}\t{h:.5f}\t{t1:.3f}\t{t5:.3f}" for e, h, t1, t5 in rows]
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


def main(argv=None, args=None) -> int:
    args = args or build_parser().parse_args(argv)
    check_args(args)
    world = distributed.setup(args.device)
    try:
        with stopping.StopRequest(NAME) as stop:
            return _train(args, world, stop)
    finally:
        world.close()


def _train(args, world, stop) -> int:
    marks = startup.Startup(T_START)
    marks.mark("import")
    variant = VARIANTS[args.variant]
    if args.epochs is not None:
        variant = with_epochs(variant, args.epochs)
    if args.batch_div != 1:
        try:
            variant = with_batch_div(variant, args.batch_div)
        except ValueError as exc:
            raise SystemExit(f"{NAME}: {exc}") from None
    device = world.device
    cuda = device.type == "cuda"
    half = cuda and args.fp16 and variant.precision == "master"
    amp = cuda and args.fp16 and variant.precision == "amp"
    loss_scale = (args.loss_scale or variant.loss_scale) if half else 1.0
    if cuda:
        torch.backends.cudnn.benchmark = True
    job_dir = metrics.job_dir(args.job_dir)
    ckpt_path = checkpoint.last_checkpoint_path(job_dir)

    if args.data == "synthetic":
        root = prepare_synthetic(args, variant, world)
    else:
        root = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir() / NAME
    variant, tree = choose_tree(root, variant)
    folders = check_tree(root, variant)
    samples, classes = folders[variant.sources()[0]]
    n_train = len(samples)
    lr_scale = lr_scale_for(variant, world.world_size)
    try:
        sched = Schedule(variant, n_train, world.world_size, variant.epochs, lr_scale)
    except ValueError as exc:
        raise SystemExit(f"{NAME}: {exc}; use more images, fewer processes or --batch-div")\
            from None
    workers = (args.workers if args.workers is not None
               else imagenet_data.default_workers(int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    marks.pin_threads(workers)
    try:
        decode = imagenet_dali.choose_decode(args.decode, cuda)
    except ValueError as exc:
        raise SystemExit(f"{NAME}: {exc}") from None
    dali_device = (device.index if device.index is not None else torch.cuda.current_device()
                   ) if cuda else None
    loaders = Loaders(root, args.seed, decode, folders)
    dtype = torch.float16 if half or amp else torch.float32
    prep = imagenet_data.Normaliser(device, dtype, channels_last=variant.precision == "amp"
                                    and cuda)
    gpu_decoder = None

    model = make_model(args, variant, len(classes), device, half, amp)
    net = wrap(model, world)
    master = MasterWeights(model)
    opt = make_optimizer(model, master, variant)
    stepper = Stepper(net, model, master, opt, variant, loss_scale, amp)

    ckpt = _load_checkpoint(args, world, ckpt_path) if args.resume else None
    if ckpt:
        checkpoint.check_schedule(ckpt_path, NAME, step=(ckpt.get("step"), sched.total_steps))
    step, target_reached, tsv_rows = 0, False, []
    clock, loop_base = TrainClock(0.0, cuda), 0.0
    partial = torch.zeros(world.world_size, 4, dtype=torch.float64)  # loss, top1, top5, seen
    wait_partial = epoch_partial = 0.0
    if ckpt:
        model.load_state_dict(ckpt["model"])
        master.load(ckpt["master"])
        opt.load_state_dict(ckpt["optimizer"])
        stepper.scaler.load_state_dict(ckpt["scaler"])
        checkpoint.restore_rng_states(ckpt["rng"])
        was, now = (ckpt.get("tree") or {}).get("tree"), tree.get("tree")
        if was != now:
            raise SystemExit(f"{NAME}: {ckpt_path} was trained from {was or 'the tables'} "
                             f"folders, this run would read {now or 'the tables'}; put the "
                             f"dataset back as it was or remove the checkpoint")
        step, target_reached = ckpt["step"], ckpt["target_reached"]
        clock.total, loop_base = ckpt["train_time"], ckpt["loop_time"]
        partial, wait_partial = ckpt["partial"], ckpt["data_wait"]
        epoch_partial = ckpt["epoch_time"]
        tsv_rows = [r for r in ckpt["tsv"]]
        if world.main:
            e, i = sched.locate(step)
            print(f"{NAME}: resuming at step {step} (epoch {e + 1}, batch {i}) from "
                  f"{ckpt_path}", flush=True)
    if world.main:
        params = count_params(model)[0]
        precision = ("float16, fp32 BatchNorm and master weights, loss scale "
                     f"{loss_scale:g}" if half else "AMP float16" if amp else "float32")
        print(f"{NAME}: variant={variant.name} ({variant.title}) arch={args.arch} "
              f"params={params:,} device={device.type} precision={precision} "
              f"processes={world.world_size} train={n_train:,} classes={len(classes)} "
              f"epochs={variant.epochs} steps={sched.total_steps} workers={workers} "
              f"decode={decode}{' (auto)' if args.decode == 'auto' else ''} "
              f"data={root}" + (f" ({tree['tree_why']})" if tree else ""), flush=True)
        if world.world_size != variant.gpus or variant.batch_div != 1:
            batches = ("the published per-GPU batches" if variant.batch_div == 1 else
                       f"per-GPU batches 1/{variant.batch_div} of the published")
            print(f"{NAME}: note: {variant.name} was published on {variant.nodes} machine(s) "
                  f"x {variant.gpus_per_node} GPU(s) ({variant.gpus} processes); this run has "
                  f"{world.world_size} process(es) with {batches}: global batch and lr "
                  f"x{lr_scale:g}", flush=True)
        _write_tsv(job_dir, tsv_rows)
    # The rectangular validation's image sizes (DX sorted_idxar.p) are read before the clock
    # starts, as DX did, by one process a node; they are cached next to the folder.
    if world.local_rank == 0:
        for source in sorted({sched.plan(e).source for e in range(variant.epochs)
                              if sched.plan(e).val_mode == "rect"}):
            imagenet_data.val_sizes(imagenet_files.source_root(root, source)
                                    / imagenet_files.VAL)
    world.barrier()
    marks.mark("data")  # the folders indexed (synthetic: written), the model built
    writer = metrics.MetricsWriter(job_dir / metrics.METRICS_FILE) if world.main else None
    if world.main:  # issue 17; the first batch's wait is the first epoch's data_wait
        row = {**marks.row(device), **tree}
        writer.write(**row)
        print(f"{NAME}: {startup.describe(row)}", flush=True)
    loop_t0 = time.perf_counter()

    def loop_time() -> float:
        return loop_base + time.perf_counter() - loop_t0

    def gather(local: torch.Tensor) -> torch.Tensor:
        table = torch.zeros(world.world_size, 4, dtype=torch.float64, device=device)
        table[world.rank] = local.to(device)
        return world.all_reduce_sum(table).cpu()

    def save(local: torch.Tensor, data_wait: float, epoch_time: float) -> None:
        table = gather(local)
        if world.main:
            checkpoint.save_atomic({
                "recipe": NAME, "args": vars(args), "variant": variant.name,
                "world_size": world.world_size, "step": step, "steps": sched.total_steps,
                "train_time": clock.total, "loop_time": loop_time(),
                "target_reached": target_reached, "partial": table, "data_wait": data_wait,
                "tree": tree,
                "epoch_time": epoch_time,
                "tsv": tsv_rows, "model": model.state_dict(),
                "master": [p.detach() for p in master.params], "optimizer": opt.state_dict(),
                "scaler": stepper.scaler.state_dict(), "rng": checkpoint.rng_states(),
            }, ckpt_path)
        world.barrier()

    def stop_requested() -> bool:
        at_limit = args.stop_at_step is not None and step >= args.stop_at_step
        return stop.agreed(world, extra=at_limit)

    val = None
    try:
        start_epoch, skip = sched.locate(step)
        for epoch in range(start_epoch, variant.epochs):
            plan = sched.plan(epoch)
            trainset = loaders.train(plan)
            trainset.epoch = epoch
            indices = distributed.epoch_indices(n_train, world.world_size, world.rank, args.seed,
                                                  epoch)
            if decode == "dali":  # workers: DALI's threads
                loader = imagenet_dali.TrainPipelines(trainset, dali_device, workers).batches(
                    indices, epoch, world.rank, plan.batch, variant.drop_last, start_batch=skip)
            else:
                loader = imagenet_data.train_loader(
                    trainset, indices, plan.batch, workers, drop_last=variant.drop_last,
                    pin_memory=cuda, start_batch=skip)
            if decode == "gpu":
                gpu_decoder = imagenet_data.GpuDecoder(device, plan.size)
            # This rank's (loss sum, top-1, top-5, images) of the epoch, on the device (no
            # host sync per step); a resumed epoch starts from the checkpoint's sums.
            mine = partial[world.rank].to(device)
            data_wait = wait_partial if skip else 0.0
            epoch_time = epoch_partial if skip else 0.0
            net.train()
            clock.start()
            clock_at_start = clock.total
            batches = sched.batches[epoch]
            it = iter(loader)
            for i in range(skip, batches):
                if stop_requested():
                    clock.stop()
                    save(mine, data_wait, epoch_time + clock.total - clock_at_start)
                    if world.main:
                        print(f"{NAME}: stopped at step {step} (epoch {epoch + 1}, batch {i}); "
                              f"checkpoint saved to {ckpt_path}", flush=True)
                    return stopping.EXIT_STOPPED
                t_wait = time.perf_counter()
                xb, yb = next(it)
                data_wait += time.perf_counter() - t_wait
                if gpu_decoder is not None:
                    xb = gpu_decoder(xb)
                x, y = prep(xb), yb.to(device, non_blocking=True)
                loss, logits = stepper(x, y, sched.lr(step))
                step += 1
                mine += batch_sums(loss, logits, y)
            del it, loader
            train_time = clock.stop()
            epoch_time += train_time - clock_at_start
            skip, wait_partial, epoch_partial = 0, 0.0, 0.0
            totals = gather(mine).sum(0)
            partial = torch.zeros(world.world_size, 4, dtype=torch.float64)

            if not math.isfinite(float(totals[0])):
                raise SystemExit(f"{NAME}: the training loss is {float(totals[0])} in epoch "
                                 f"{epoch + 1} (an fp16 overflow under the static loss scale "
                                 f"{loss_scale:g}?); the last good checkpoint is {ckpt_path}")
            t_val = time.perf_counter()
            # DDP broadcasts rank 0's BatchNorm statistics at the start of each forward, so
            # after the last step every rank holds its own: validate rank 0's model on all.
            world.broadcast_module(model)
            valset = loaders.val(plan)
            val_batches = imagenet_data.val_batches(len(valset), plan.val_batch,
                                                    world.world_size, world.rank, valset.order)
            val = evaluate(model, imagenet_dali.val_batches_dali(valset, val_batches,
                                                                dali_device, workers)
                           if decode == "dali" else
                           imagenet_data.val_loader(valset, val_batches, workers,
                                                    pin_memory=cuda),
                           prep, world, variant.val_tta, amp)
            val_time = time.perf_counter() - t_val
            tsv_rows.append((epoch, train_time / 3600, 100 * val["top1"], 100 * val["top5"]))
            if world.main:
                seen = totals[3].item()
                row = writer.write(
                    epoch=epoch + 1, epochs=variant.epochs, step=step, steps=sched.total_steps,
                    phase=plan.phase, size=plan.size, batch=plan.batch,
                    global_batch=plan.batch * world.world_size, source=plan.source or "full",
                    min_scale=plan.min_scale, val_mode=plan.val_mode, val_size=plan.val_size,
                    lr=sched.lr(step - 1), train_loss=totals[0].item() / seen,
                    train_acc=totals[1].item() / seen, train_top5=totals[2].item() / seen,
                    test_acc=val["top1"], top5=val["top5"], test_loss=val["loss"],
                    val_images=val["n"], images_per_s=round(seen / max(epoch_time, 1e-9), 2),
                    data_wait=round(data_wait, 4), train_time=round(train_time, 4),
                    loop_time=round(loop_time(), 4), val_time=round(val_time, 4),
                    wall_time=round(time.time() - T_START, 4))
                _write_tsv(job_dir, tsv_rows)
                print(f"{NAME}: epoch {epoch + 1}/{variant.epochs} {plan.size}px bs "
                      f"{plan.batch} lr {row['lr']:.5g} loss {row['train_loss']:.4f} "
                      f"top1 {val['top1']:.4f} top5 {val['top5']:.4f} "
                      f"{row['images_per_s']:.1f} img/s wait {data_wait:.2f}s train "
                      f"{train_time:.2f}s", flush=True)
                if reached(val, variant) and not target_reached:
                    writer.write(event="target_reached", epoch=epoch + 1, top5=val["top5"],
                                 test_acc=val["top1"], metric=variant.target_metric,
                                 target=variant.target, train_time=row["train_time"],
                                 loop_time=row["loop_time"], wall_time=row["wall_time"])
                    print(f"{NAME}: reached {target_text(variant)} at epoch "
                          f"{epoch + 1}: train time {train_time / 3600:.4f} h, loop time "
                          f"{row['loop_time'] / 3600:.4f} h", flush=True)
            if reached(val, variant):
                target_reached = True
            save(partial[world.rank], 0.0, 0.0)
            if stop_requested() and epoch + 1 < variant.epochs:
                if world.main:
                    print(f"{NAME}: stopped after epoch {epoch + 1}; checkpoint saved to "
                          f"{ckpt_path}", flush=True)
                return stopping.EXIT_STOPPED
        if world.world_size > 1:  # every rank must end with rank 0's weights
            agree = world.agreement(model)
            if world.main:
                writer.write(event="ranks", **agree)
                print(f"{NAME}: {agree['world_size']} ranks on {agree['nodes']} node(s) "
                      + ("agree: identical weights" if agree["identical"] else
                         "DISAGREE: their weights differ"), flush=True)
    finally:
        if writer is not None:
            writer.close()
    if world.main:
        last = (f"top1 {val['top1']:.4f} top5 {val['top5']:.4f}, " if val else
                "nothing left to train, ")
        print(f"{NAME}: done, {variant.epochs} epochs, {last}train time {clock.total:.2f} s, "
              f"loop time {loop_time():.2f} s, wall time {time.time() - T_START:.2f} s",
              flush=True)
    return 0


def reached(val: dict, variant) -> bool:
    """The variant's target (DAWNBench's 93% top-5; FFCV's top-1 of that config) is met."""
    return val[variant.target_metric] >= variant.target


def target_text(variant) -> str:
    """"93.0% top-5", or "73.8% top-1 (FFCV's README: top-5 90.8%, its logs: 91.84%)"."""
    names = {"top1": "top-1", "top5": "top-5"}
    text = f"{variant.target:.1%} {names[variant.target_metric]}"
    figures = dict(variant.second)
    if "top5" in figures:
        text += (f" (FFCV's README: top-5 {figures['top5']:.1%}"
                 + (f", its logs: {figures['top5_logs']:.2%}" if "top5_logs" in figures else "")
                 + ")")
    return text


def batch_sums(loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(loss x images, top-1 correct, top-5 correct, images) of one batch, float64 on the
    batch's device, without a host sync."""
    c1, c5 = imagenet_data.top_k_correct(logits, y, (1, 5))
    n = torch.tensor(float(len(y)), dtype=torch.float64, device=y.device)
    return torch.stack([loss.double() * n, c1.double(), c5.double(), n])


if __name__ == "__main__":
    sys.exit(main(args=ARGS))
