#!/usr/bin/env python3
"""Does the imagenet recipe's data path feed one GPU? Images per second of each decode path
into the GPU (loader alone, up to the normalised batch on the device), and the share of a
ResNet-50 training step spent waiting for data (issue 28's GPU figures).

On --images generated ImageNet-like JPEGs (benchmarks/imagenet_pipeline.py's generator,
prepared with the recipe's own step: full size plus the 160 px copies), at 128 px from the 160
px copies and 224 px from full size, for each decode path that runs here:
  pil   the recipe's PIL loader, --workers DataLoader processes (default: cores - 1), pinned;
  gpu   torchvision's nvjpeg one image at a time (decode=gpu; CUDA only);
  dali  common.imagenet_dali (nvJPEG "mixed" decode; --cpu: DALI's CPU pipeline), --workers
        threads; only where DALI imports.
Each figure is the steady state: one long pass (the images repeated to --steps batches), the
clock started at the second batch. The training step is torchvision's resnet50 (--arch), SGD,
channels_last and AMP float16 on CUDA (FFCV's setting), float32 on the CPU; data wait is the
time blocked on the loader, as train.py's data_wait.

    python benchmarks/imagenet_gpu_feed.py                    # on a GPU machine
    python benchmarks/imagenet_gpu_feed.py --cpu --images 24 --sizes 32,48 --batch 8 \
        --steps 4 --arch resnet18
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "recipes"))
from imagenet_pipeline import write_source  # noqa: E402

from common import imagenet_dali as DD  # noqa: E402
from common import imagenet_data as D  # noqa: E402
from common.imagenet_files import prepare_imagenet, resized_source, source_root  # noqa: E402


def batches_of(kind, ds, order, batch, workers, device, device_id):
    """(uint8 NCHW batch on `device`, labels) from one decode path."""
    if kind == "dali":
        yield from DD.TrainPipelines(ds, device_id, workers).batches(order, 0, 0, batch, False)
        return
    ds.decode = kind if kind == "gpu" else "cpu"
    decoder = D.GpuDecoder(device, ds.size) if kind == "gpu" else None
    for x, y in D.train_loader(ds, order, batch, workers, drop_last=False,
                               pin_memory=device.type == "cuda"):
        yield (decoder(x) if decoder else x.to(device, non_blocking=True)), y


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(kind, ds, order, args, device, device_id, prep, step=None) -> tuple:
    """(images per second, share of the time blocked on the loader) after the first batch,
    each normalised batch given to `step` (None: the loader alone)."""
    it = batches_of(kind, ds, order, args.batch, args.workers, device, device_id)
    wait = seen = 0.0
    start = None
    while True:
        t = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        if start is not None:
            wait += time.perf_counter() - t
        x = prep(x)
        if step is not None:
            step(x, y.to(device, non_blocking=True))
        if start is None:
            sync(device)
            start = time.perf_counter()
            continue
        seen += len(y)
    sync(device)
    total = time.perf_counter() - start
    return seen / total, wait / total


def train_step(model, opt, device):
    """One SGD step of `model` (AMP float16 on CUDA) on a normalised batch."""
    scaler = torch.amp.GradScaler(enabled=device.type == "cuda")

    def step(x, y):
        with torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y % 1000)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=512, help="train images generated (and val)")
    ap.add_argument("--batch", type=int, default=128, help="per GPU (FFCV/DIU: 128-512)")
    ap.add_argument("--steps", type=int, default=40, help="batches per figure")
    ap.add_argument("--sizes", default="128,224", help="px; the first from the 160 px copies")
    ap.add_argument("--workers", type=int, default=None, help="default: cores - 1")
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--cpu", action="store_true", help="the CPU (smoke): DALI's CPU pipeline")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--dir", default=None, help="keep the images here (default: temp)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if cuda else "cpu")
    device_id = torch.cuda.current_device() if cuda else None
    cores = len(os.sched_getaffinity(0))
    args.workers = args.workers if args.workers is not None else max(1, cores - 1)
    if cuda:
        torch.backends.cudnn.benchmark = True
    kinds = ["pil"] + (["gpu"] if cuda else []) + (["dali"] if DD.available() else [])
    sizes = [int(s) for s in args.sizes.split(",")]
    import torchvision
    model = torchvision.models.get_model(args.arch, num_classes=1000).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    prep = D.Normaliser(device, torch.float16 if cuda else torch.float32, channels_last=cuda)
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    print(f"# {name}; {cores} cores, workers/threads {args.workers}; torch {torch.__version__}; "
          f"DALI {'yes' if DD.available() else 'not installed'}; batch {args.batch}, "
          f"{args.steps} batches a figure, {args.arch}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.dir or tmp)
        t0 = time.perf_counter()
        kb = write_source(base / "src", args.images)
        copy = sizes[0] * 5 // 4  # 160 for 128
        prepare_imagenet(base / "src", base / "prepared", sizes=(copy,))
        print(f"# {args.images} JPEGs, mean {kb:.0f} KB, {copy} px copies: "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        print(f"{'path':<5} {'size':>4} {'source':<7} {'loader img/s':>12} {'train img/s':>11} "
              f"{'data wait':>9}", flush=True)
        for k, size in enumerate(sizes):
            source = resized_source(copy) if k == 0 else ""
            folder = source_root(base / "prepared", source) / "train"
            ds = D.TrainSet(folder, size, 0.08, seed=0)
            n = len(ds)
            order = [i % n for i in range((args.steps + 1) * args.batch)]
            for kind in kinds:
                try:
                    rate, _ = timed(kind, ds, order, args, device, device_id, prep)
                    train_rate, share = timed(kind, ds, order, args, device, device_id, prep,
                                              train_step(model, opt, device))
                except Exception as exc:  # a path that fails here is a figure, not a stop
                    print(f"{kind:<5} {size:>4} failed: {type(exc).__name__}: {exc}",
                          flush=True)
                    continue
                rows.append({"path": kind, "size": size, "source": source or "full",
                             "loader_img_s": round(rate, 1), "train_img_s": round(train_rate, 1),
                             "data_wait_share": round(share, 3), "device": name,
                             "workers": args.workers, "batch": args.batch})
                print(f"{kind:<5} {size:>4} {source or 'full':<7} {rate:>12.0f} "
                      f"{train_rate:>11.0f} {share:>9.1%}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
