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
  max/<N>/train/..., max/<N>/val/...        longer side at most N, every image re-encoded as
                                            an RGB JPEG: what FFCV's writer stores (max/500 is
                                            `write_imagenet.sh 500 0.50 90`'s, JPEG-only)
fast.ai (DAWNBench) and DIU (imagenet18) train the 128 px phase from the 160 px copy; DIU's 4-
and 8-machine schedules train the 224 px phase from a 352 px copy, and DIU validates from the
folder it trains from, so val gets resized copies too. FFCV (ffcv-imagenet) trains and
validates its ResNet-50s from copies whose longer side is at most 500 px: the ffcv-rn50-*
variants read max/500 where it exists.

stdlib, numpy and PIL only (and OpenCV, imported when max/<N> copies are written): no torch,
so the CLI can import this without paying for torch.
"""
from __future__ import annotations

import colorsys
import errno
import fcntl
import json
import os
import random
import shlex
import shutil
import signal
import tarfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

TRAIN = "train"
VAL = "val"
RESIZED = "sz"  # dest/sz/<N>/{train,val}
CAPPED = "max"  # dest/max/<N>/{train,val}
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
VAL_SOLUTION = "LOC_val_solution.csv"
VAL_NAME = "ILSVRC2012_val_%08d.JPEG"


def resized_source(size: int) -> str:
    """The source name of the copy resized to `size` on the shorter side: 160 -> "sz/160"."""
    return f"{RESIZED}/{int(size)}"


def capped_source(side: int) -> str:
    """The source name of the copy whose longer side is at most `side`: 500 -> "max/500"."""
    return f"{CAPPED}/{int(side)}"


def prepare_command(dest: Path, sources) -> str:
    """The `cloudtrain data prepare` line that makes `sources` ("" full size, "sz/N",
    "max/N") in `dest`: `--sizes` names exactly the resized copies (`''`: none, where the
    default would make 160 and 352), `--max-sides` the capped ones."""
    sizes = [s.split("/")[1] for s in sources if s.startswith(RESIZED + "/")]
    sides = [s.split("/")[1] for s in sources if s.startswith(CAPPED + "/")]
    line = (f"cloudtrain data prepare imagenet SRC {shlex.quote(str(dest))} "
            f"--sizes {','.join(sizes) or repr('')}")
    return line + (f" --max-sides {','.join(sides)}" if sides else "")


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


# ---------------------------------------------------------------------------------------------
# prepare: the official layout -> train/<wnid>, val/<wnid> and resized copies sz/<N>

RESAMPLE = "bicubic"  # Pillow's bicubic widens its support when it shrinks: antialiased
CAPPED_RESAMPLE = "OpenCV INTER_AREA"  # the max/<N> copies: FFCV's writer's (see capped_size)
DEFAULT_SIZES = (160, 352)
DEFAULT_QUALITY = 90
_STATE = ".prepare"  # dest/.prepare: the lock and the per-tar "extracted" markers
_CHUNK = 64  # images per worker task: few enough futures for 1.3 M images, even progress


@dataclass
class PrepareReport:
    """What `prepare_imagenet` did. File counts include full-size and resized outputs."""

    dest: Path
    classes: int
    counts: dict[str, int]  # images in each prepared folder: "train", "val", "sz/160/train", ...
    written: int  # files this run put in place (extracted, linked, copied or resized)
    skipped: int  # outputs an earlier run had already written
    linked: int  # of `written`, hard links to the source (no bytes written)
    extracted: int  # of `written`, images unpacked from per-class tars
    bytes_written: int  # bytes of the files this run wrote (links add none)
    seconds: float
    sizes: tuple[int, ...]
    quality: int  # JPEG quality of the resized copies (full-size files are never re-encoded)
    resample: str
    blacklisted: int  # validation images left out (blacklist=)
    max_sides: tuple[int, ...] = ()  # the max/<N> copies (FFCV's): longer side at most N
    capped_resample: str = CAPPED_RESAMPLE
    links_skipped: int = 0  # links in src (images, class folders, tars): never carried


def _fail(message: str):
    raise ValueError(message)


def _names_list(names: list[str]) -> str:
    shown = ", ".join(names[:5])
    return shown + (f" (and {len(names) - 5} more)" if len(names) > 5 else "")


def _read_labels(path: Path) -> dict[str, str]:
    """{val image stem: wnid} from Kaggle's LOC_val_solution.csv or a two-column text file."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"cannot read the label file {path}: {exc.__class__.__name__}")
    kaggle = bool(lines) and lines[0].startswith("ImageId,")
    expected = "'ImageId,<wnid> <box> ...'" if kaggle else "'<image> <wnid>'"
    labels = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip() or (kaggle and number == 1):
            continue
        if kaggle:  # ILSVRC2012_val_00000001,n01751748 1 2 3 4 [n01751748 5 6 7 8 ...]
            image, _, boxes = line.partition(",")
            fields = [image.strip()] + boxes.split()[:1]
        else:  # ILSVRC2012_val_00000001.JPEG n01751748
            fields = line.split()
        if len(fields) != 2 or not fields[0]:
            _fail(f"{path} line {number}: expected {expected}, got {line.strip()[:60]!r}")
        labels[Path(fields[0]).stem if fields[0].lower().endswith(IMAGE_EXTENSIONS)
               else fields[0]] = fields[1]
    return labels


def _read_blacklist(path: Path) -> set[str]:
    """The devkit's blacklist (1-based validation image numbers) as val image stems."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"cannot read the blacklist {path}: {exc.__class__.__name__}")
    stems = set()
    for number, line in enumerate(lines, start=1):
        if line.strip():
            if not (line.strip().isascii() and line.strip().isdigit()) or int(line) < 1:
                _fail(f"{path} line {number}: {line.strip()[:30]!r} is not an image number")
            stems.add(Path(VAL_NAME % int(line)).stem)
    return stems


def _files(folder: Path, links: set[str] | None = None) -> list[str]:
    """The image files in `folder`: regular files only. A link is never one (audit F48: a
    link `x.JPEG -> ~/.ssh/id_ed25519` in SRC became the same link in DEST, and a copy
    would have held the key): those named like images go to `links` when given."""
    with os.scandir(folder) as it:
        entries = [(e.name, e.is_symlink(), e.is_file(follow_symlinks=False)) for e in it
                   if _is_image(e.name)]
    if links is not None:
        links.update(str(Path(folder) / name) for name, link, _ in entries if link)
    return sorted(name for name, link, regular in entries if regular and not link)


def _folders(folder: Path, links: set[str]) -> list[tuple[str, bool]]:
    """(name, is a folder) of the entries of `folder`, hidden ones left out; a link (to a
    folder or a file) is never one of them, and goes to `links`."""
    with os.scandir(folder) as it:
        entries = sorted((e.name, e.is_symlink(), e.is_dir(follow_symlinks=False))
                         for e in it if not e.name.startswith("."))
    links.update(str(Path(folder) / name) for name, link, _ in entries if link)
    return [(name, is_dir) for name, link, is_dir in entries if not link]


# What decoding one image costs a worker per pixel, at most: the decoded image (4 bytes in
# RGBA, CMYK or 32-bit modes), its RGB conversion, NumPy's copy and OpenCV's colour-converted
# one (3 bytes each), and the resize's output and intermediates.
BYTES_PER_PIXEL = 16


def max_pixels(workers: int) -> int:
    """The most pixels one worker decodes: Pillow's own warning bound (89.5 Mpx: above it
    Pillow only warns, and refuses only twice as many), less where this machine's memory
    shared by `workers` holds fewer at BYTES_PER_PIXEL."""
    from PIL import Image

    bound = Image.MAX_IMAGE_PIXELS or 1024 * 1024 * 1024 // 4 // 3
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on this platform: Pillow's bound
        return int(bound)
    return int(min(bound, memory // max(workers, 1) // BYTES_PER_PIXEL))


def _check_member(member: tarfile.TarInfo, tar: Path) -> str | None:
    """The member's file name, None for a directory entry; refuses everything else."""
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts or "\\" in member.name:
        _fail(f"{tar}: member {member.name!r} would be written outside its class folder")
    if member.isdir():
        return None
    if not member.isreg():
        _fail(f"{tar}: member {member.name!r} is not a regular file (links are refused)")
    parts = [p for p in name.parts if p != "."]
    if len(parts) != 1:  # ILSVRC2012's per-class tars hold plain file names
        _fail(f"{tar}: member {member.name!r} is not a plain file name")
    return parts[0]


def _extract_tar(tar: str, out: str) -> tuple[list[str], int, int]:
    """Unpack one per-class tar into `out` (checked first: nothing is written for a hostile
    one). Returns (image names, files written, bytes written)."""
    tar_path, out_dir = Path(tar), Path(out)
    written = size = 0
    with tarfile.open(tar_path) as archive:
        members = archive.getmembers()
        names = [(m, _check_member(m, tar_path)) for m in members]
        for member, name in names:
            if name is None or not _is_image(name):
                continue
            target = out_dir / name
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            with archive.extractfile(member) as f, open(tmp, "wb") as g:
                shutil.copyfileobj(f, g, 1 << 20)
            os.replace(tmp, target)
            written, size = written + 1, size + member.size
    return sorted(n for _, n in names if n and _is_image(n)), written, size


def _link_or_copy(source: Path, target: Path) -> tuple[bool, int]:
    """Hard-link `target` to `source`; copy (via a temp file) where links cannot be made.
    Returns (linked, bytes written). A source that is a link is refused (link() would link
    the link itself, and a copy would follow it)."""
    if source.is_symlink():
        raise ValueError("a link, never carried into the prepared folder")
    try:
        os.link(source, target)
        return True, 0
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP,
                             errno.EOPNOTSUPP, errno.EACCES):
            raise
    tmp = target.with_name(target.name + ".tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return False, target.stat().st_size


def resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """(width, height) with the shorter side `size` and the aspect ratio kept (rounded)."""
    if width <= height:
        return size, max(1, round(height * size / width))
    return max(1, round(width * size / height)), size


# FFCV's copies (max/<N>). What FFCV's writer does, read in its source:
#   libffcv/ffcv-imagenet@4dd291a122096a2032ec9fd19633e1b9aff3577d write_imagenet.sh and
#   write_imagenet.py: `./write_imagenet.sh 500 0.50 90` (its README: "the dataset used for the
#   results above") passes max_resolution=500, write_mode=proportion, compress_probability=0.50,
#   jpeg_quality=90 to RGBImageField, over torchvision's ImageFolder (PIL, .convert("RGB")).
#   libffcv/ffcv@3a12966b3afe3a81733a732e633317d747bfaac7 ffcv/fields/rgb_image.py: `resizer`
#   takes ratio = max_resolution / max(width, height) and, only if ratio < 1, resizes to
#   (ratio * (width, height)).astype(int) (truncated) with cv2.INTER_AREA; `encode` then stores
#   the image as a JPEG with probability 0.5 (`encode_jpeg`: RGB -> BGR, cv2.imencode('.jpg',
#   IMWRITE_JPEG_QUALITY 90): libjpeg's 4:2:0 default) and as raw RGB pixels otherwise, and
#   an image already small enough goes the same way, unresized.
# We store every image as the JPEG half does (the raw half is the choice we do not follow:
# data prepare --help and the README say why, with the figure), with OpenCV's own INTER_AREA
# and encoder: Pillow has no filter that equals INTER_AREA (its BOX samples pixel centres,
# INTER_AREA weighs partial pixels; on 40 generated 520-1400 px images Pillow's closest,
# HAMMING, differs by 0.9 levels on average and up to 18), so the copies need OpenCV
# (opencv-python-headless, in the recipes extra).


def capped_size(width: int, height: int, side: int) -> tuple[int, int]:
    """FFCV's resizer: (width, height) scaled by side / the longer side, truncated to whole
    pixels, when that ratio is below 1; else unchanged. At least 1 pixel a side (FFCV would
    hand OpenCV a 0, which it refuses)."""
    ratio = side / max(width, height)
    if ratio >= 1:
        return width, height
    return max(1, int(ratio * width)), max(1, int(ratio * height))


def _require_cv2():
    try:
        import cv2
    except ImportError:
        _fail("the max/<N> copies (FFCV's) need OpenCV, which this Python does not have; "
              "install it with: pip install opencv-python-headless")
    return cv2


def encode_capped(rgb, side: int, quality: int) -> bytes:
    """One max/<side> file: the RGB uint8 array (height, width, 3) resized as FFCV's writer
    resizes, encoded as its JPEG half encodes (see above)."""
    cv2 = _require_cv2()
    height, width = rgb.shape[:2]
    size = capped_size(width, height, side)
    if size != (width, height):
        rgb = cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)
    ok, data = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                            [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)])
    if not ok:
        raise ValueError("OpenCV could not encode the image as JPEG")
    return data.tobytes()


def _process_chunk(items: list[tuple[str, str]], dest: str, sizes: tuple[int, ...],
                   quality: int, max_sides: tuple[int, ...] = (),
                   pixel_limit: int | None = None) -> dict:
    """For each (source file, "split/wnid/name"): the full-size file in dest (link or copy),
    then every resized copy missing in dest/sz/<N> and every capped copy missing in
    dest/max/<N>. Decodes an image only when a copy is missing, and only of at most
    `pixel_limit` pixels (max_pixels). Errors are returned per image, never raised, so one bad
    file stops no pool."""
    from PIL import Image

    if pixel_limit is not None:  # Pillow refuses past twice its bound; ours is checked below
        Image.MAX_IMAGE_PIXELS = pixel_limit

    stats = {"written": 0, "skipped": 0, "linked": 0, "bytes": 0, "errors": []}
    root = Path(dest)

    def put(linked_bytes):
        stats["written"] += 1
        stats["linked"] += linked_bytes[0]
        stats["bytes"] += linked_bytes[1]

    for source, rel in items:
        full = root / rel
        try:
            if full.exists():
                stats["skipped"] += full != Path(source)  # an extracted file is no output here
            else:
                put(_link_or_copy(Path(source), full))
            missing = [n for n in sizes if not (root / resized_source(n) / rel).exists()]
            capped = [n for n in max_sides if not (root / capped_source(n) / rel).exists()]
            stats["skipped"] += len(sizes) - len(missing) + len(max_sides) - len(capped)
            if not missing and not capped:
                continue
            with Image.open(full) as image:  # reads the header only
                width, height = image.size
                if pixel_limit is not None and width * height > pixel_limit:
                    raise ValueError(f"{width * height / 1e6:.1f} Mpx, more than the "
                                     f"{pixel_limit / 1e6:.1f} Mpx a worker may decode here")
                image.load()
                rgb = image.convert("RGB")
            for n in capped:
                target = root / capped_source(n) / rel
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_bytes(encode_capped(np.asarray(rgb), n, quality))
                os.replace(tmp, target)
                put((False, target.stat().st_size))
            for n in missing:
                target = root / resized_source(n) / rel
                if min(width, height) <= n:  # already small enough: the file as it is
                    put(_link_or_copy(full, target))
                    continue
                tmp = target.with_name(target.name + ".tmp")
                rgb.resize(resized_size(width, height, n), Image.BICUBIC).save(
                    tmp, format="JPEG", quality=quality)
                os.replace(tmp, target)
                put((False, target.stat().st_size))
        except Exception as exc:  # noqa: BLE001 - a corrupt file is reported, not raised
            stats["errors"].append(f"{rel} ({exc.__class__.__name__}: {str(exc)[:80]})")
    return stats


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _lock(dest: Path):
    state = dest / _STATE
    state.mkdir(parents=True, exist_ok=True)
    handle = open(state / "lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        _fail(f"another prepare is writing {dest}; wait for it to finish")
    return handle


def prepare_imagenet(src: Path, dest: Path, sizes=DEFAULT_SIZES, quality: int = DEFAULT_QUALITY,
                     workers: int | None = None, blacklist: Path | None = None,
                     labels: Path | None = None, progress=None,
                     max_sides=(), pixel_limit: int | None = None) -> PrepareReport:
    """Turn the extracted official archives at `src` into the prepared layout at `dest`.

    src: train/<wnid>/*.JPEG or train/<wnid>.tar (ILSVRC2012_img_train.tar's per-class tars;
    member names are checked: no absolute paths, no `..`, regular files only), and val/ either
    flat (ILSVRC2012_val_*.JPEG, labels from `labels=` or src/LOC_val_solution.csv; `labels=`
    may also be a two-column `<image> <wnid>` text file) or already sorted into val/<wnid>/.

    dest: train/<wnid>/ and val/<wnid>/ full size, hard links to src where src and dest share
    a filesystem, else copies, never re-encoded (tars are unpacked into dest/train); and for
    each N in `sizes`, sz/N/train and sz/N/val: the shorter side resized to N, the aspect kept
    (rounded to the pixel), Pillow's bicubic filter (antialiased when shrinking), converted to
    RGB, JPEG at `quality` (90 by default, Pillow's default 4:2:0 chroma subsampling), EXIF
    orientation ignored as the training loaders ignore it. An image whose shorter side is
    already <= N is put there unchanged (linked or copied). For each N in `max_sides`,
    max/N/train and max/N/val: FFCV's writer's copies (see CAPPED_RESAMPLE's comment): the
    longer side scaled to N and truncated to the pixel where it is longer than N, OpenCV's
    INTER_AREA, and every image, resized or not, an RGB JPEG at `quality` from OpenCV's
    encoder (needs opencv-python-headless). Every class folder exists in every
    split, even empty, so ImageFolder class indices agree between train and val.

    Every file appears whole (temp file + os.replace, or a single link), so a killed run
    leaves no truncated JPEG; a rerun skips what exists (a second run writes nothing) and one
    run at a time holds dest/.prepare/lock. `workers` processes (default os.cpu_count()) do the
    work; `progress(done, total, stage)` is called from this process, stage "extract" (only
    when there are tars to unpack) then "images". `blacklist`: the devkit's ILSVRC2012_validation_blacklist.txt (1-based val
    image numbers); those images are left out of every val folder. A link in src (an image,
    a class folder, a tar) is skipped and counted (`links_skipped`): nothing in dest is a link
    or comes through one. An image of more than `pixel_limit` pixels (default max_pixels()
    for `workers`) is not decoded: it counts as unreadable. Bad input raises
    ValueError with a one-line message; unreadable images are all reported at the end (up to
    5 named).
    """
    started = time.monotonic()
    src, dest = Path(src), Path(dest)
    sizes = tuple(sorted({int(n) for n in sizes}))
    if any(n < 1 for n in sizes):
        _fail(f"sizes must be positive pixel counts, got {sizes}")
    max_sides = tuple(sorted({int(n) for n in max_sides}))
    if any(n < 1 for n in max_sides):
        _fail(f"max_sides must be positive pixel counts, got {max_sides}")
    if max_sides:
        _require_cv2()
    if not 1 <= int(quality) <= 100:
        _fail(f"quality must be 1..100, got {quality}")
    workers = (os.cpu_count() or 1) if workers is None else int(workers)
    if workers < 1:
        _fail(f"workers must be at least 1, got {workers}")
    if not src.is_dir():
        _fail(f"{src}: no such folder")
    if not (src / TRAIN).is_dir():
        _fail(f"{src} has no {TRAIN}/ folder (expected train/<wnid>/*.JPEG or train/<wnid>.tar)")
    real_src, real_dest = src.resolve(), dest.resolve()
    if real_dest == real_src or real_src in real_dest.parents:
        _fail(f"dest {dest} is inside src {src}; choose a folder outside it")
    progress = progress or (lambda done, total, stage: None)
    pixel_limit = max_pixels(workers) if pixel_limit is None else int(pixel_limit)
    links: set[str] = set()  # what src holds as links: skipped, said in the report

    # Train classes: folders and per-class tars (a folder wins over a tar of the same wnid).
    entries = _folders(src / TRAIN, links)
    folders = [name for name, is_dir in entries if is_dir]
    tars = {name[:-4]: src / TRAIN / name for name, is_dir in entries
            if not is_dir and name.endswith(".tar") and name[:-4] not in folders}
    wnids = sorted(set(folders) | set(tars))
    if not wnids:
        _fail(f"{src / TRAIN} holds no class folders or per-class tars")

    # Validation: sorted by wnid already, or flat with a label file.
    skip = _read_blacklist(Path(blacklist)) if blacklist else set()
    val_items: list[tuple[str, str]] = []  # (source file, "val/<wnid>/<name>")
    blacklisted = 0
    val_dir = src / VAL
    if val_dir.is_dir():
        val_folders = [name for name, is_dir in _folders(val_dir, links) if is_dir]
        if val_folders:
            unknown = [w for w in val_folders if w not in wnids]
            if unknown:
                _fail(f"{val_dir} has class folders with no train class: {_names_list(unknown)}")
            pairs = [(name, w, val_dir / w / name) for w in val_folders
                     for name in _files(val_dir / w, links)]
        else:
            label_file = Path(labels) if labels else src / VAL_SOLUTION
            if not label_file.is_file():
                _fail(f"{val_dir} is flat but there is no label file {label_file} (give --labels)")
            by_stem = _read_labels(label_file)
            names = _files(val_dir, links)
            unlabelled = [n for n in names if Path(n).stem not in by_stem]
            if unlabelled:
                _fail(f"val images with no label in {label_file}: {_names_list(unlabelled)}")
            pairs = [(n, by_stem[Path(n).stem], val_dir / n) for n in names]
            unknown = sorted({w for _, w, _ in pairs if w not in wnids})
            if unknown:
                _fail(f"{label_file} names wnids with no train class: {_names_list(unknown)}")
        for name, wnid, path in pairs:
            if Path(name).stem in skip:
                blacklisted += 1
            else:
                val_items.append((str(path), f"{VAL}/{wnid}/{name}"))
    elif blacklist or labels:
        _fail(f"{src} has no {VAL}/ folder for the labels or blacklist given")

    lock = _lock(dest)
    try:
        bases = ([dest] + [dest / resized_source(n) for n in sizes]
                 + [dest / capped_source(n) for n in max_sides])
        for split in (TRAIN, VAL):
            for base in bases:
                for wnid in wnids:
                    (base / split / wnid).mkdir(parents=True, exist_ok=True)
        if skip:  # stale blacklisted images from an earlier run without the blacklist go
            for base in bases:
                for wnid in wnids:
                    for name in _files(base / VAL / wnid):
                        if Path(name).stem in skip:
                            (base / VAL / wnid / name).unlink()
        totals = {"written": 0, "skipped": 0, "linked": 0, "bytes": 0, "extracted": 0}
        errors: list[str] = []
        # Workers ignore SIGINT: Ctrl-C reaches this process, which cancels what has not
        # started and waits for the chunks under way (each is short) before it raises.
        pool = ProcessPoolExecutor(max_workers=workers, initializer=_ignore_sigint)
        try:
            train_items = [(str(src / TRAIN / w / name), f"{TRAIN}/{w}/{name}")
                           for w in folders for name in _files(src / TRAIN / w, links)]
            todo = {}
            for wnid, tar in tars.items():
                marker = dest / _STATE / f"{wnid}.extracted"
                stamp = f"{tar.stat().st_size} {tar.stat().st_mtime_ns}"
                if marker.is_file() and marker.read_text() == stamp:
                    train_items += [(str(dest / TRAIN / wnid / name), f"{TRAIN}/{wnid}/{name}")
                                    for name in _files(dest / TRAIN / wnid)]
                else:
                    todo[pool.submit(_extract_tar, str(tar), str(dest / TRAIN / wnid))] = \
                        (wnid, marker, stamp)
            if todo:
                progress(0, len(todo), "extract")
            for done, future in enumerate(as_completed(todo), start=1):
                wnid, marker, stamp = todo[future]
                try:
                    names, written, size = future.result()
                except (ValueError, OSError, tarfile.TarError) as exc:
                    errors.append(str(exc) if isinstance(exc, ValueError)
                                  else f"{tars[wnid]}: {exc.__class__.__name__}: {exc}")
                    progress(done, len(todo), "extract")
                    continue
                marker.write_text(stamp)
                totals["written"] += written
                totals["extracted"] += written
                totals["bytes"] += size
                train_items += [(str(dest / TRAIN / wnid / n), f"{TRAIN}/{wnid}/{n}")
                                for n in names]
                progress(done, len(todo), "extract")
            if errors:
                _fail(f"{len(errors)} per-class tars refused: {errors[0]}"
                      + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))

            items = sorted(train_items, key=lambda item: item[1]) + val_items
            step = max(1, min(_CHUNK, len(items) // (8 * workers)))  # small runs: 8 per worker
            chunks = [items[i:i + step] for i in range(0, len(items), step)]
            futures = {pool.submit(_process_chunk, chunk, str(dest), sizes, int(quality),
                                   max_sides, pixel_limit): len(chunk) for chunk in chunks}
            done = 0
            progress(0, len(items), "images")
            for future in as_completed(futures):
                stats = future.result()
                for key in ("written", "skipped", "linked", "bytes"):
                    totals[key] += stats[key]
                errors += stats["errors"]
                done += futures[future]
                progress(done, len(items), "images")
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if errors:
            _fail(f"{len(errors)} unreadable images: {_names_list(sorted(errors))}")
    finally:
        lock.close()

    counts = {TRAIN: len(items) - len(val_items), VAL: len(val_items)}
    for source in [resized_source(n) for n in sizes] + [capped_source(n) for n in max_sides]:
        counts[f"{source}/{TRAIN}"] = counts[TRAIN]
        counts[f"{source}/{VAL}"] = counts[VAL]
    return PrepareReport(
        dest=dest, classes=len(wnids), counts=counts, written=totals["written"],
        skipped=totals["skipped"], linked=totals["linked"], extracted=totals["extracted"],
        bytes_written=totals["bytes"], seconds=round(time.monotonic() - started, 3),
        sizes=sizes, quality=int(quality), resample=RESAMPLE, blacklisted=blacklisted,
        max_sides=max_sides, links_skipped=len(links))
