#!/usr/bin/env python3
"""The imagenet recipe's input pipeline on the CPU: images per second per core, and the cores
an 8-GPU host needs to keep its GPUs fed.

Writes --images ImageNet-like JPEGs (500x375 mostly, some portrait, 500x333 and square;
quality 90; smooth shapes plus texture and noise, about 110 KB each, near ImageNet's mean of
about 140 GB / 1.28 M files) and as many val images, prepares them with the recipe's own
prepare step (common.imagenet_files.prepare_imagenet: full size plus 160 and 352 px copies),
then times recipes/common/imagenet_data.py through real DataLoaders with 1 and with 2 worker
processes, batch --batch: the train transform (decode, RandomResizedCrop, flip, fast_collate)
at 128, 224 and 288 px from each source, the decode="gpu" path's CPU part (header, file
bytes, bytes_collate: the decoding is then the GPU's), and validation ('center' at 128 and
224, 'rect' at 288, 'ffcv' at 256). Each figure is the steady state: the clock starts at the
first batch (worker start-up excluded) and runs over --passes passes of the images.

The decode="gpu" row is what the workers still do when the GPU decodes (read the header and
the file, draw the crop, hand the bytes over): about 4,800 items/s in one process here, but
through a worker about 1,100-1,400 img/s, bound by handing 3.5 MB batches between processes.

Beside the recipe's PIL loader, two more training pipelines on the same files (issue 28): plain
torchvision (ImageFolder, RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize: what
the recipe's uint8 hand-over saves) and DALI's CPU pipeline (common.imagenet_dali with
device_id=None: libjpeg-turbo decode with the random crop, resize, flip; the worker count is
its thread count), if DALI is installed, at 128 px from the 160 px copies, 192 px (FFCV's last
size) from full size and 224 px from full size. FFCV's own data (the max/500 copies, longer
side at most 500 px, `data prepare --max-sides 500`; needs OpenCV) gets rows of its own: the
PIL loader, torchvision and DALI at 160 and 192 px from them, beside the same from full size.

FFCV's writer stores half of its images as raw pixels; `data prepare` stores every max/500
image as a JPEG. The "FFCV storage" lines weigh that on the max/500 copies of these files: the
bytes on disk of the JPEGs against the raw RGB pixels (width x height x 3), and PIL's decode
of a JPEG (libjpeg-turbo, one core) against reading the raw pixels from a file.

img/s/core is img/s divided by the worker count. On this 2-core machine the main process
shares the cores with 2 workers, so the 1-worker figure is the cleaner per-core rate, and it
is the one the cores-needed table uses: cores = GPUs x GPU rate / (img/s/core). GPU rates are
an assumption (--gpu-rates, images per second per GPU, training): the defaults 1,400 / 560 /
340 img/s per V100 at 128 / 224 / 288 px make fast.ai's 3A phase table (18 epochs at 128, 23
at 224, 4 at 288 on 8 V100s) take 2.9 h, about its published 2.96 h; 760 at 192 px is the
224 px rate scaled by the pixels. Cores here are not a
p3.16xlarge's (Xeon E5-2686 v4, 2.3 GHz, 64 vCPUs = 32 cores) and Pillow is not the
pillow-simd fast.ai and DIU installed (faster resizing, the same decoder).

    python benchmarks/imagenet_pipeline.py
    python benchmarks/imagenet_pipeline.py --images 400 --gpu-rates 128:3000,224:1100,288:700
    python benchmarks/imagenet_pipeline.py --only ffcv   # FFCV's rows and the storage lines
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "recipes"))
from common import imagenet_dali as DD  # noqa: E402
from common import imagenet_data as D  # noqa: E402
from common.imagenet_files import capped_source, prepare_imagenet, resized_source  # noqa: E402
from common.imagenet_files import list_images, source_root  # noqa: E402

SHAPES = ((500, 375),) * 6 + ((375, 500),) * 2 + ((500, 333), (500, 500))
CLASSES = 10
SOURCES = {"full": "", "sz/160": resized_source(160), "sz/352": resized_source(352),
           "max/500": capped_source(500)}
HOST_VCPUS = {"p3.16xlarge (8x V100)": 64, "p4d.24xlarge (8x A100)": 96}


def realistic(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Smooth colour regions at four scales plus pixel noise: JPEG sizes like photographs."""
    out = np.zeros((height, width, 3), np.float32)
    for cells, amplitude in ((4, 60), (16, 35), (64, 25), (160, 35)):
        small = rng.normal(0, 1, (max(2, cells * height // width), cells, 3)).astype(np.float32)
        for c in range(3):
            out[..., c] += amplitude * np.asarray(
                Image.fromarray(small[..., c]).resize((width, height), Image.BICUBIC))
    out += rng.normal(0, 12, out.shape)
    return Image.fromarray(np.clip(out + 128, 0, 255).astype(np.uint8))


def write_source(src: Path, n: int, seed: int = 0) -> float:
    """n train and n val images in train/<wnid>/ and val/<wnid>/; returns the mean KB."""
    rng, total = np.random.default_rng(seed), 0
    for split in ("train", "val"):
        for i in range(n):
            folder = src / split / f"n{i % CLASSES:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{split}_{i}.JPEG"
            realistic(rng, *SHAPES[i % len(SHAPES)]).save(path, quality=90)
            total += path.stat().st_size
    return total / (2 * n) / 1e3


def steady_rate(loader_of, n_images: int, passes: int) -> float:
    """Images per second after the first batch, over `passes` passes of the loader."""
    seen, start = 0, None
    for _ in range(passes):
        for batch in loader_of():
            if start is None:
                start = time.perf_counter()
                continue
            seen += len(batch[-1])
    return seen / (time.perf_counter() - start)


def torchvision_loader(folder: Path, size: int, batch: int, workers: int):
    """Plain torchvision: ImageFolder, RandomResizedCrop(size), flip, ToTensor, Normalize."""
    from torchvision import datasets, transforms
    tf = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(),
                             transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    return torch.utils.data.DataLoader(datasets.ImageFolder(folder, tf), batch_size=batch,
                                       shuffle=True, num_workers=workers)


def storage_figures(folder: Path, reps: int = 3) -> dict:
    """FFCV's raw half against JPEG, on the files under `folder` (max/500/train): bytes on disk
    of the JPEGs and of their raw RGB pixels, and seconds per image to decode a JPEG with PIL
    (to an RGB array, as the loaders do) and to read the same pixels raw from a file (the
    median of `reps` passes each, after one pass that warms the page cache)."""
    samples, _ = list_images(folder)
    paths = [folder / rel for rel, _ in samples]
    jpeg_bytes = sum(p.stat().st_size for p in paths)
    raws = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, p in enumerate(paths):
            with Image.open(p) as image:
                pixels = np.asarray(image.convert("RGB"))
            raw = Path(tmp) / f"{i}.raw"
            pixels.tofile(raw)
            raws.append((raw, pixels.shape))
        raw_bytes = sum(r.stat().st_size for r, _ in raws)

        def decode_jpegs():
            for p in paths:
                with Image.open(p) as image:
                    np.asarray(image.convert("RGB"))

        def read_raws():
            for r, shape in raws:
                np.fromfile(r, np.uint8).reshape(shape)

        times = {}
        for name, fn in (("jpeg", decode_jpegs), ("raw", read_raws)):
            fn()
            runs = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                runs.append(time.perf_counter() - t0)
            times[name] = sorted(runs)[len(runs) // 2] / len(paths)
    return {"images": len(paths), "jpeg_bytes": jpeg_bytes, "raw_bytes": raw_bytes,
            "jpeg_s": times["jpeg"], "raw_s": times["raw"]}


def print_storage(fig: dict) -> None:
    n = fig["images"]
    print(f"\nFFCV storage, max/500 train copies ({n} images): JPEG q90 "
          f"{fig['jpeg_bytes'] / n / 1e3:.0f} KB/image, raw RGB {fig['raw_bytes'] / n / 1e3:.0f} "
          f"KB/image ({fig['raw_bytes'] / fig['jpeg_bytes']:.1f}x); PIL decode "
          f"{fig['jpeg_s'] * 1e3:.2f} ms/image ({1 / fig['jpeg_s']:.0f}/s on one core), raw read "
          f"{fig['raw_s'] * 1e3:.3f} ms/image; FFCV's 50% raw: "
          f"{(fig['raw_bytes'] + fig['jpeg_bytes']) / 2 / fig['jpeg_bytes']:.1f}x the bytes of "
          f"all-JPEG, {(fig['jpeg_s'] + fig['raw_s']) / 2 / fig['jpeg_s']:.0%} of its decode time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200, help="train images (and val)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--passes", type=int, default=3, help="passes over the images")
    parser.add_argument("--workers", default="1,2", help="DataLoader worker counts to time")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpu-rates", default="128:1400,192:760,224:560,288:340",
                        help="training img/s per GPU at each size (default: V100, see above)")
    parser.add_argument("--dir", default=None, help="keep the images here (default: temp)")
    parser.add_argument("--only", choices=["all", "ffcv"], default="all",
                        help="ffcv: only FFCV's rows (160 and 192 px from max/500 and full "
                             "size) and the storage lines")
    args = parser.parse_args()
    gpu_rates = {int(k): float(v) for k, v in (p.split(":") for p in args.gpu_rates.split(","))}
    worker_counts = [int(w) for w in args.workers.split(",")]
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.dir or tmp)
        t0 = time.perf_counter()
        kb = write_source(base / "src", args.images)
        prepare_imagenet(base / "src", base / "prepared", sizes=(160, 352), max_sides=(500,))
        print(f"{args.images} train + {args.images} val JPEGs, mean {kb:.0f} KB, with 160 and "
              f"352 px copies and max/500 (FFCV's): {time.perf_counter() - t0:.1f} s; cores here: "
              f"{len(os.sched_getaffinity(0))}, torch threads 1", flush=True)
        root = base / "prepared"
        rows = []

        def measure(kind, source, size, make_loader, passes=args.passes):
            for workers in worker_counts:
                rate = steady_rate(lambda: make_loader(workers), args.images, passes)
                rows.append((kind, source, size, workers, rate, rate / workers))
                print(f"{kind:<16} {source:<7} {size:>4} {workers:>7} {rate:>8.0f} "
                      f"{rate / workers:>10.0f}", flush=True)

        print(f"\n{'pipeline':<16} {'source':<7} {'size':>4} {'workers':>7} {'img/s':>8} "
              f"{'img/s/core':>10}")
        order = list(range(args.images))

        def ffcv_rows():
            # FFCV's training sizes, 160 -> 192 px, from its copies and from full size
            for size in (160, 192):
                for name in ("max/500", "full"):
                    folder = source_root(root, SOURCES[name]) / "train"
                    ds = D.TrainSet(folder, size, 0.08, seed=0)
                    measure("train", name, size, lambda w, ds=ds: D.train_loader(
                        ds, order, args.batch, w, drop_last=False, pin_memory=False))
                    measure("torchvision", name, size, lambda w, f=folder, s=size:
                            torchvision_loader(f, s, args.batch, w))
                    if DD.available():
                        measure("dali cpu", name, size, lambda w, ds=ds: DD.TrainPipelines(
                            ds, None, w).batches(order * args.passes, 0, 0, args.batch,
                                                 drop_last=False), passes=1)

        if args.only == "ffcv":
            ffcv_rows()
            print_storage(storage_figures(source_root(root, SOURCES["max/500"]) / "train"))
            return
        for size in (128, 224, 288):
            for name, source in SOURCES.items():
                ds = D.TrainSet(source_root(root, source) / "train", size, 0.08, seed=0)
                measure("train", name, size, lambda w, ds=ds: D.train_loader(
                    ds, order, args.batch, w, drop_last=False, pin_memory=False))
        for size, name in ((128, "sz/160"), (192, "full"), (224, "full")):
            folder = source_root(root, SOURCES[name]) / "train"
            measure("torchvision", name, size, lambda w, f=folder, s=size: torchvision_loader(
                f, s, args.batch, w))
            if DD.available():
                ds = D.TrainSet(folder, size, 0.08, seed=0)
                # one pipeline over all the passes (a new one is built per epoch)
                measure("dali cpu", name, size, lambda w, ds=ds: DD.TrainPipelines(
                    ds, None, w).batches(order * args.passes, 0, 0, args.batch,
                                         drop_last=False), passes=1)
        ffcv_rows()
        if not DD.available():
            print("dali cpu: NVIDIA DALI is not installed (pip install -e '.[dali]')")
        gpu = D.TrainSet(root / "train", 128, 0.08, seed=0, decode="gpu")
        measure("train gpu-decode", "full", "any", lambda w: D.train_loader(
            gpu, order, args.batch, w, drop_last=False, pin_memory=False))
        for mode, size, names in (("center", 128, ("sz/160", "full")),
                                  ("center", 224, ("full", "sz/352")),
                                  ("rect", 288, ("full",)), ("ffcv", 256, ("full",))):
            for name in names:
                ds = D.ValSet(source_root(root, SOURCES[name]) / "val", size, mode, args.batch)
                batches = D.val_batches(len(ds), args.batch, 1, 0, ds.order)
                measure(f"val {mode}", name, size,
                        lambda w, ds=ds, b=batches: D.val_loader(ds, b, w, pin_memory=False))
        storage = storage_figures(source_root(root, SOURCES["max/500"]) / "train")

    per_core = {(r[0], r[1], r[2]): r[5] for r in rows if r[3] == min(worker_counts)}
    print(f"\nWhat it means for {args.gpus} GPUs (training; img/s/core with "
          f"{min(worker_counts)} worker; GPU rates are the --gpu-rates assumption):")
    print(f"{'phase':<34} {'GPU img/s':>9} {'host img/s':>10} {'cores needed':>12}")
    phases = (("128 px from sz/160 (3A, DIU)", 128, "sz/160"),
              ("128 px from full size", 128, "full"),
              ("224 px from full size (3A, DIU 16)", 224, "full"),
              ("224 px from sz/352 (DIU 4, 8)", 224, "sz/352"),
              ("288 px from full size (3A, DIU)", 288, "full"),
              ("192 px from max/500 (FFCV)", 192, "max/500"),
              ("192 px from full size", 192, "full"))
    for label, size, source in phases:
        if size not in gpu_rates:
            continue
        host = args.gpus * gpu_rates[size]
        print(f"{label:<34} {gpu_rates[size]:>9.0f} {host:>10.0f} "
              f"{host / per_core[('train', source, size)]:>12.1f}")
    gpu_core = per_core[("train gpu-decode", "full", "any")]
    host = args.gpus * gpu_rates[128]
    print(f"{'128 px, decode=gpu (worker part)':<34} {gpu_rates[128]:>9.0f} {host:>10.0f} "
          f"{host / gpu_core:>12.1f}")
    print("hosts: " + ", ".join(f"{k}: {v} vCPUs" for k, v in HOST_VCPUS.items())
          + f"; each GPU process also needs a core of its own ({args.gpus} more)")
    print_storage(storage)
    print("load average at the end (1, 5, 15 min): %.1f %.1f %.1f; other processes on these "
          "cores lower the figures, the 2-worker ones most" % os.getloadavg())


if __name__ == "__main__":
    main()
