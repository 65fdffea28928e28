"""ImageNet (ILSVRC2012) on disk: the prepared layout, a synthetic stand-in in the official
archives' layout, and the prepare step that turns one into the other.

The official archives, extracted (what `prepare_imagenet` reads):
  train/<wnid>/<wnid>_<k>.JPEG      1000 class folders (or train/<wnid>.tar: the per-class tars
                                    inside ILSVRC2012_img_train.tar, not yet unpacked)
  val/ILSVRC2012_val_00000001.JPEG  50,000 images in one flat folder, numbered from 1
  LOC_val_solution.csv              the labels (Kaggle's copy): `ImageId,PredictionString`,
                                    a row `ILSVRC2012_val_00000001,n01751748 1 2 3 4 ...` names
                                    the wnid and the boxes; or a two-column text file
                                    `ILSVRC2012_val_00000001.JPEG n01751748` given as `labels=`

The prepared layout (what the imagenet recipe reads; one folder, so it copies as one):
  train/<wnid>/*.JPEG, val/<wnid>/*.JPEG    full size, hard links to the source where possible
  sz/<N>/train/..., sz/<N>/val/...          shorter side resized to N (fast.ai and DIU kept
                                            these in a sibling folder `<root>-sz/<N>`)
fast.ai (DAWNBench) and DIU (imagenet18) train the 128 px phase from the 160 px copy; DIU's 4-
and 8-machine schedules train the 224 px phase from a 352 px copy, and DIU validates from the
folder it trains from, so val gets resized copies too.

stdlib, numpy and PIL only: no torch, so the CLI can import this without paying for torch.
"""
from __future__ import annotations

import colorsys
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np

TRAIN = "train"
VAL = "val"
RESIZED = "sz"  # dest/sz/<N>/{train,val}
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
VAL_SOLUTION = "LOC_val_solution.csv"
VAL_NAME = "ILSVRC2012_val_%08d.JPEG"


def resized_source(size: int) -> str:
    """The source name of the copy resized to `size` on the shorter side: 160 -> "sz/160"."""
    return f"{RESIZED}/{int(size)}"


def source_root(root: Path, source: str) -> Path:
    """The folder holding train/ and val/ for a source: "" -> root, "sz/160" -> root/sz/160."""
    return Path(root).joinpath(*[p for p in source.split("/") if p]) if source else Path(root)


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def list_images(folder: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """ImageFolder's view of `folder`: (samples, classes).

    classes are the sorted subfolder names (the wnids); samples are (relative path
    "wnid/file.JPEG", class index), sorted by class then path, for files ending .jpeg, .jpg or
    .png (any case), found by walking each class folder. Reads directory entries only.
    """
    folder = Path(folder)
    try:
        with os.scandir(folder) as it:
            classes = sorted(e.name for e in it if e.is_dir() and not e.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(f"{folder}: no such folder") from None
    samples: list[tuple[str, int]] = []
    for index, wnid in enumerate(classes):
        found = []
        stack = [wnid]
        while stack:
            rel = stack.pop()
            with os.scandir(folder / rel) as it:
                for e in it:
                    if e.is_dir():
                        stack.append(f"{rel}/{e.name}")
                    elif _is_image(e.name) and e.is_file():
                        found.append(f"{rel}/{e.name}")
        samples.extend((rel, index) for rel in sorted(found))
    return samples, classes


# ---------------------------------------------------------------------------------------------
# A synthetic ImageNet in the official layout: small, learnable, with the awkward cases

SYNTHETIC_MARKER = ".complete"
_SYNTHETIC_BUSY = ".generating"


def _wnids(classes: int, seed: int) -> list[str]:
    rng = random.Random(f"wnids-{seed}")
    return sorted(f"n{v:08d}" for v in rng.sample(range(1_000_000, 15_000_000), classes))


def _shape(rng: random.Random, k: int, min_side: int, max_side: int) -> tuple[int, int]:
    """(width, height) with both sides in [min_side, max_side] and aspect 0.5..2: k % 3 picks
    landscape, portrait or square so every class has each."""
    if k % 3 == 2:
        side = rng.randint(min_side, max_side)
        return side, side
    aspect = rng.uniform(1.15, min(2.0, max_side / min_side))
    short = rng.randint(min_side, max(min_side, int(max_side / aspect)))
    long = min(max_side, max(short, round(short * aspect)))
    return (long, short) if k % 3 == 0 else (short, long)


def _pixels(label: int, classes: int, size: tuple[int, int], rng: np.random.Generator):
    """Class `label`'s signal: a hue of its own, stripes at an angle and period of its own (in
    units of the image, so they survive resizing), a random phase, brightness jitter, noise."""
    w, h = size
    rgb = np.array(colorsys.hsv_to_rgb(label / classes, 0.75, 0.85), dtype=np.float32) * 255
    angle = np.pi * label / classes
    periods = 3.0 + label % 4
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    u = (xx / w) * np.cos(angle) + (yy / h) * np.sin(angle)
    stripes = np.sin(2 * np.pi * periods * u + rng.uniform(0, 2 * np.pi))
    img = (0.7 * rgb + 30.0 * stripes[..., None] + rng.normal(0, 12, size=3)
           + rng.normal(0, 20, size=(h, w, 3)))
    return np.clip(img, 0, 255).round().astype(np.uint8)


def _save_jpeg(array: np.ndarray, path: Path, mode: str) -> None:
    from PIL import Image

    image = Image.fromarray(array, "RGB")
    if mode != "RGB":
        image = image.convert(mode)  # "L" and "CMYK" JPEGs exist in the real train and val sets
    tmp = path.with_name(path.name + ".tmp")
    image.save(tmp, format="JPEG", quality=90)
    os.replace(tmp, path)


def write_synthetic_official(root: Path, classes: int = 10, train_per_class: int = 16,
                             val_per_class: int = 4, seed: int = 0, min_side: int = 48,
                             max_side: int = 400) -> dict:
    """Write a learnable synthetic ImageNet in the official archives' layout under `root`.

    root/train/<wnid>/<wnid>_<k>.JPEG, root/val/ILSVRC2012_val_%08d.JPEG (numbered 1..N over a
    shuffled class order) and root/LOC_val_solution.csv (rows in shuffled order, some with two
    boxes, trailing space, as in Kaggle's file). Real JPEGs at quality 90, sides in
    [min_side, max_side], aspect 0.5..2 (landscape, portrait and square in every class); the
    first train image of the first class is grayscale ("L") and of the second class CMYK, and
    so are val images 1 and 2. Deterministic for the arguments. A second call with the same
    arguments does nothing (marker root/.complete); with other arguments, or after an
    interrupted call, it rewrites train/, val/ and the CSV. It refuses a root holding train/ or
    val/ it did not write. Returns {"classes", "train", "val", "wnids"}.
    """
    if not (1 <= classes and train_per_class >= 1 and val_per_class >= 1):
        raise ValueError("classes, train_per_class and val_per_class must be at least 1")
    if not (8 <= min_side <= max_side):
        raise ValueError(f"need 8 <= min_side <= max_side, got {min_side} and {max_side}")
    root = Path(root)
    params = {"classes": classes, "train_per_class": train_per_class,
              "val_per_class": val_per_class, "seed": seed, "min_side": min_side,
              "max_side": max_side}
    wnids = _wnids(classes, seed)
    counts = {"classes": classes, "train": classes * train_per_class,
              "val": classes * val_per_class, "wnids": wnids}
    marker, busy = root / SYNTHETIC_MARKER, root / _SYNTHETIC_BUSY
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == params:
                return counts
        except ValueError:
            pass
    elif not busy.exists() and ((root / TRAIN).exists() or (root / VAL).exists()):
        raise ValueError(f"{root} holds train/ or val/ that write_synthetic_official did not "
                         "write; refusing to overwrite it")
    root.mkdir(parents=True, exist_ok=True)
    busy.write_text(json.dumps(params))
    marker.unlink(missing_ok=True)
    for name in (TRAIN, VAL):
        shutil.rmtree(root / name, ignore_errors=True)
    (root / VAL_SOLUTION).unlink(missing_ok=True)

    shapes = random.Random(f"shapes-{seed}")
    noise = np.random.default_rng(seed)
    special = {0: "L", 1: "CMYK"}  # which class (train) or val number - 1 gets the odd mode
    for c, wnid in enumerate(wnids):
        (root / TRAIN / wnid).mkdir(parents=True)
        for k in range(train_per_class):
            mode = special.get(c, "RGB") if k == 0 else "RGB"
            size = _shape(shapes, k, min_side, max_side)
            _save_jpeg(_pixels(c, classes, size, noise), root / TRAIN / wnid / f"{wnid}_{k}.JPEG",
                       mode)
    labels = [c for c in range(classes) for _ in range(val_per_class)]
    random.Random(f"val-{seed}").shuffle(labels)
    (root / VAL).mkdir()
    rows = []
    for i, c in enumerate(labels):
        size = _shape(shapes, i, min_side, max_side)
        _save_jpeg(_pixels(c, classes, size, noise), root / VAL / (VAL_NAME % (i + 1)),
                   special.get(i, "RGB"))
        w, h = size
        boxes = f"{wnids[c]} {w // 8} {h // 8} {w - 1 - w // 8} {h - 1 - h // 8} "
        if i % 3 == 0:
            boxes += f"{wnids[c]} 0 0 {w // 2} {h // 2} "
        rows.append(f"{(VAL_NAME % (i + 1))[:-5]},{boxes}")
    random.Random(f"rows-{seed}").shuffle(rows)
    (root / VAL_SOLUTION).write_text("ImageId,PredictionString\n" + "\n".join(rows) + "\n")
    marker.write_text(json.dumps(params))
    busy.unlink()
    return counts
