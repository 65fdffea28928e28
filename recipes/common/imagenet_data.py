"""ImageNet loading for the imagenet recipe: training crops, the three validation transforms,
the batch layout of distributed validation, and the pieces around them (collate, normalise on
the device, top-k counts). FI is fastai/imagenet-fast `imagenet_nv` (3A), DX is DIU's
imagenet18 `training/` (3B), FF is FFCV's `train_imagenet.py` (3C); shared/recipes-spec.md
sections 3 and 4 hold the facts this file must match.

Training (all three sources): RandomResizedCrop(size, scale=(min_scale, 1), ratio=(3/4, 4/3))
and a horizontal flip with p = 0.5, decoded with PIL (FI and DX installed pillow-simd, a faster
build of the same operations), collated as uint8 (FI/DX `fast_collate`) and normalised on the
GPU in fp16. Where this file had to choose:
  * The crop is drawn by `crop_box`, today's torchvision algorithm (which FF's decoder also
    follows): up to 10 tries of an area fraction uniform in [min_scale, 1] and an aspect
    log-uniform in [3/4, 4/3], then a centred crop with the aspect clamped to that range.
    FI and DX ran torchvision 0.2, which drew the aspect uniformly, swapped w and h with
    p = 0.5, and fell back to the centred square of the shorter side: the same support, a
    slightly different density of aspects, and a different fallback for extreme images.
  * Every image's random choices come from its own torch.Generator seeded with
    sample_seed(seed, epoch, index) (the sources drew from the workers' global RNGs,
    unseeded). So any worker count, any rank and a resumed run see identical crops. A private
    generator touches no global RNG, so no fork_rng is needed.
  * PIL decodes the whole image (never Image.draft, which decodes at 1/2, 1/4 or 1/8 scale and
    changes the pixels), converts grayscale and CMYK to RGB, crops, resizes bilinearly (PIL's
    resize is antialiased, as torchvision's on PIL images) and flips.
  * decode="gpu" (nvjpeg; none of the sources did this): the workers read the JPEG bytes and
    draw the same crop box and flip from the JPEG header's size; `GpuDecoder` decodes the
    batch on the device, crops, resizes with torch's antialiased bilinear interpolation and
    flips. The crops are the CPU path's; the pixels differ by resize rounding (see the tests
    for the measured bound). Files that are not RGB or grayscale JPEGs (ImageNet's CMYK JPEGs
    and its one PNG named .JPEG) are decoded by PIL in the worker and sent re-encoded as
    quality-95 JPEGs: their pixels differ a little more.
    torchvision 0.29 warns that its decode_jpeg is deprecated in favour of TorchCodec; it is
    the one call to replace when it goes.

Validation, `ValSet(mode=...)`:
  * 'center' (FI, DX at 128 and 224 px): Resize(int(1.14 * size)) on the shorter side, then
    CenterCrop(size): torchvision's functions on PIL images, bilinear.
  * 'rect' (DX rect_val at 288 px): images sorted by aspect ratio w/h (rounded to 5
    decimals); each chunk of batch_size consecutive images shares the chunk's mean ratio; each
    image is resized as in 'center', then centre-cropped to `rect_crop_size` (size on the
    short side, the long side from the ratio, down to a multiple of 8). Every batch of
    `val_batches` is one chunk, so its images stack. A crop wider than the resized image is
    padded with zeros (torchvision's center_crop; 2018 PIL crops filled black the same way).
  * 'ffcv' (FF CenterCropRGBImageDecoder(ratio=224/256) at 256 px): the centred square of side
    c = int(224/256 * shorter side) at top (h - c) // 2, left (w - c) // 2 (FF's
    get_center_crop), resized to size x size. FF resizes with OpenCV INTER_AREA; we use PIL's
    BOX filter when shrinking (INTER_AREA's area average) and bilinear when enlarging.
  * `val_batches` is DX's DistValSampler: every rank the same number of batches, contiguous
    slices of the evaluation order, trailing batches short or empty; the ranks all-reduce
    (correct1, correct5, count), which is exact however the set divides. FI validated with a
    DistributedSampler, which pads with duplicates; we use DX's layout for every recipe.

Images are listed by `common.imagenet_files.list_images` (ImageFolder's order). The listing is
kept as numpy arrays, not a list of Python tuples: a forked worker that touches Python objects
copies their memory pages, 1.28 million tuples times workers times GPUs.
"""
from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from common.imagenet_files import list_images
from common.stopping import ignore_stop_signals

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)  # per RGB channel, 0-255 scale
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
RATIO = (3 / 4, 4 / 3)       # RandomResizedCrop's aspect range (w / h)
CROP_TRIES = 10              # random boxes tried before the centred fallback
FLIP_P = 0.5
VAL_RESIZE = 1.14            # FI/DX: Resize(int(1.14 * size)) before the centre crop
FFCV_RATIO = 224 / 256       # FF CenterCropRGBImageDecoder(ratio=224/256)
VAL_MODES = ("center", "rect", "ffcv")
DECODES = ("cpu", "gpu")


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one image's augmentation in one epoch of one run."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, np.uint64)[0])


# =============================================================================================
# Training crops


def crop_box(width: int, height: int, min_scale: float, generator: torch.Generator) -> tuple:
    """RandomResizedCrop's box (top, left, height, width) in a width x height image, drawn from
    `generator`: an area fraction uniform in [min_scale, 1] and an aspect log-uniform in
    [3/4, 4/3], kept if the rounded box fits; after 10 misses, the centred box of the whole
    image with its aspect clamped to [3/4, 4/3]."""
    area = width * height
    log_lo, log_hi = math.log(RATIO[0]), math.log(RATIO[1])
    for _ in range(CROP_TRIES):
        u = torch.rand(2, generator=generator, dtype=torch.float64).tolist()
        target = area * (min_scale + (1 - min_scale) * u[0])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[1])
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            return top, left, h, w
    return fallback_box(width, height)


def fallback_box(width: int, height: int) -> tuple:
    """The centred box crop_box returns when no random box fits: the whole image, trimmed on
    its long side to an aspect of 3/4 or 4/3 if it is more elongated than that."""
    aspect = width / height
    w, h = width, height
    if aspect < RATIO[0]:
        h = round(width / RATIO[0])
    elif aspect > RATIO[1]:
        w = round(height * RATIO[1])
    return (height - h) // 2, (width - w) // 2, h, w


def augment_params(width: int, height: int, min_scale: float, seed: int) -> tuple:
    """(top, left, h, w, flip) of one image: the crop box, then the flip, from a generator
    seeded with `seed` (both decode paths draw through here)."""
    g = torch.Generator().manual_seed(seed)
    box = crop_box(width, height, min_scale, g)
    return (*box, bool(torch.rand(1, generator=g).item() < FLIP_P))


def load_rgb(path: Path) -> Image.Image:
    """The whole image decoded at full resolution, as RGB (grayscale and CMYK converted)."""
    with Image.open(path) as image:
        image.load()
        return image if image.mode == "RGB" else image.convert("RGB")


def reencoded(image: Image.Image) -> np.ndarray:
    """An RGB JPEG (quality 95) of an image the GPU decoder may not take: ImageNet's train set
    holds CMYK JPEGs and a PNG named .JPEG; the decode="gpu" path sends those re-encoded
    (no chroma subsampling)."""
    out = io.BytesIO()
    image.convert("RGB").save(out, format="JPEG", quality=95, subsampling=0)
    return np.frombuffer(out.getbuffer(), dtype=np.uint8).copy()


class _Listing:
    """An ImageFolder listing as numpy arrays (see the module docstring)."""

    def _list(self, folder: Path, listing: tuple | None = None) -> None:
        """`listing`: list_images(folder) already read by the caller (1.28 M entries for
        ImageNet's train split: not listed twice)."""
        self.folder = Path(folder)
        samples, self.classes = listing if listing is not None else list_images(self.folder)
        if not samples:
            raise ValueError(f"{self.folder}: no images (expected <class>/<image>.JPEG)")
        self._paths = np.array([rel.encode() for rel, _ in samples])
        self._labels = np.array([label for _, label in samples], dtype=np.int64)

    @property
    def samples(self) -> list:
        """[(relative path, class index)] in ImageFolder order."""
        return [(p.decode(), int(c)) for p, c in zip(self._paths, self._labels)]

    def path(self, index: int) -> Path:
        return self.folder / self._paths[index].decode()

    def __len__(self) -> int:
        return len(self._labels)


class TrainSet(_Listing, Dataset):
    """The images of one ImageFolder, each through RandomResizedCrop(size, scale=(min_scale,
    1), ratio=(3/4, 4/3)) and a horizontal flip with p = 0.5; an item is (uint8 HWC RGB array
    size x size x 3, label), or with decode="gpu" (JPEG bytes as a uint8 1-D tensor, crop box
    (top, left, h, w), flip, label) for `GpuDecoder`. Each image's random choices are seeded
    with sample_seed(seed, epoch, index). Set `epoch` (and `size`, `min_scale` at a phase
    change) before building an epoch's loader: the workers copy the dataset when it starts."""

    def __init__(self, folder: Path, size: int, min_scale: float, seed: int,
                 decode: str = "cpu", listing: tuple | None = None):
        if decode not in DECODES:
            raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
        if not 0 < min_scale <= 1:
            raise ValueError(f"min_scale must be in (0, 1], got {min_scale}")
        self._list(folder, listing)
        self.size, self.min_scale, self.seed, self.decode, self.epoch = (
            size, min_scale, seed, decode, 0)

    def __getitem__(self, index: int):
        path, label = self.path(index), int(self._labels[index])
        seed = sample_seed(self.seed, self.epoch, index)
        if self.decode == "gpu":
            with Image.open(path) as image:  # the header only, unless the file is odd
                width, height = image.size
                data = (np.fromfile(path, dtype=np.uint8) if image.format == "JPEG"
                        and image.mode in ("RGB", "L") else reencoded(image))
            top, left, h, w, flip = augment_params(width, height, self.min_scale, seed)
            return torch.from_numpy(data), (top, left, h, w), flip, label
        image = load_rgb(path)
        top, left, h, w, flip = augment_params(image.width, image.height, self.min_scale, seed)
        image = TF.resized_crop(image, top, left, h, w, [self.size, self.size],
                                InterpolationMode.BILINEAR, antialias=True)
        if flip:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.asarray(image), label


def fast_collate(batch) -> tuple:
    """[(uint8 HWC array, label)] -> (uint8 NCHW contiguous tensor, int64 labels); the images
    of a batch share a shape. An empty batch gives shapes (0, 3, 0, 0) and (0,)."""
    if not batch:
        return torch.empty((0, 3, 0, 0), dtype=torch.uint8), torch.empty(0, dtype=torch.int64)
    images = torch.from_numpy(np.stack([image for image, _ in batch]))
    labels = torch.tensor([label for _, label in batch], dtype=torch.int64)
    return images.permute(0, 3, 1, 2).contiguous(), labels


def bytes_collate(batch) -> tuple:
    """TrainSet(decode="gpu") items -> ((all the JPEG bytes in one uint8 tensor, int64 byte
    counts N, int64 boxes N x 4 (top, left, h, w), bool flips N), int64 labels N): the first
    part is what GpuDecoder takes, so a batch is (x, y) as in fast_collate. One tensor of
    bytes, not N: a worker hands every tensor of a batch over in a shared-memory segment of
    its own, which cost more than reading the files (measured)."""
    jpegs = (torch.cat([data for data, _, _, _ in batch]) if batch
             else torch.empty(0, dtype=torch.uint8),
             torch.tensor([len(data) for data, _, _, _ in batch], dtype=torch.int64),
             torch.tensor([box for _, box, _, _ in batch], dtype=torch.int64).view(-1, 4),
             torch.tensor([flip for _, _, flip, _ in batch], dtype=torch.bool))
    return jpegs, torch.tensor([label for _, _, _, label in batch], dtype=torch.int64)


class GpuDecoder:
    """The first part of a bytes_collate batch -> a uint8 NCHW size x size batch on
    `device`: decode_jpeg on the device (nvjpeg on CUDA; libjpeg-turbo with device="cpu"),
    crop, resize (bilinear, antialiased), flip. Set `size` at a phase change, as TrainSet's."""

    def __init__(self, device, size: int):
        self.device, self.size = torch.device(device), size

    def __call__(self, jpegs) -> torch.Tensor:
        data, lengths, boxes, flips = jpegs
        out = torch.empty((len(lengths), 3, self.size, self.size), dtype=torch.uint8,
                          device=self.device)
        if not len(lengths):
            return out
        images = decode_jpeg(list(data.split(lengths.tolist())),  # views, no copies
                             mode=ImageReadMode.RGB, device=self.device)
        for k, (image, (top, left, h, w), flip) in enumerate(
                zip(images, boxes.tolist(), flips.tolist())):
            crop = image[:, top:top + h, left:left + w].unsqueeze(0).float()
            resized = F.interpolate(crop, size=(self.size, self.size), mode="bilinear",
                                    align_corners=False, antialias=True)[0]
            out[k] = (resized.flip(-1) if flip else resized).round_().clamp_(0, 255)
        return out


class Normaliser:
    """uint8 NCHW batch -> (x - mean) / std on `device` in `dtype` (FI/DX: float16 on the GPU,
    in float16 arithmetic as theirs; float32 on the CPU), optionally channels_last (FF)."""

    def __init__(self, device, dtype: torch.dtype, channels_last: bool = False):
        self.device, self.dtype, self.channels_last = torch.device(device), dtype, channels_last
        self.mean = torch.tensor(IMAGENET_MEAN, dtype=dtype, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD, dtype=dtype, device=self.device).view(1, 3, 1, 1)

    def __call__(self, x_uint8: torch.Tensor) -> torch.Tensor:
        x = x_uint8.to(self.device, non_blocking=True)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x.to(self.dtype).sub_(self.mean).div_(self.std)


# =============================================================================================
# Validation


def val_sizes(folder: Path) -> list:
    """(width, height) of every image of `folder` in list_images order, from the JPEG headers.
    Cached in folder.parent / ".sizes-<folder name>.json" as {relpath: [file size, mtime_ns,
    w, h]}; entries whose file changed are read again and the cache rewritten atomically."""
    folder = Path(folder)
    cache = folder.parent / f".sizes-{folder.name}.json"
    try:
        cached = json.loads(cache.read_text())
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    fresh, sizes = {}, []
    for rel, _ in list_images(folder)[0]:
        st = (folder / rel).stat()
        entry = cached.get(rel)
        if (isinstance(entry, list) and len(entry) == 4 and all(type(v) is int for v in entry)
                and entry[:2] == [st.st_size, st.st_mtime_ns]):
            w, h = entry[2:]
        else:
            with Image.open(folder / rel) as image:
                w, h = image.size
        fresh[rel] = [st.st_size, st.st_mtime_ns, w, h]
        sizes.append((w, h))
    if fresh != cached:
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(fresh))
            os.replace(tmp, cache)
        except OSError:  # a read-only data folder: no cache, the headers are read each time
            tmp.unlink(missing_ok=True)
    return sizes


def rect_targets(sizes, batch_size: int) -> tuple:
    """DX rect_val: image indices sorted (stably) by aspect ratio w/h rounded to 5 decimals,
    and {index: the mean ratio of its chunk, rounded to 5 decimals}, chunks being batch_size
    consecutive images of that order."""
    ratios = [round(w / h, 5) for w, h in sizes]
    order = sorted(range(len(ratios)), key=ratios.__getitem__)
    targets = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        mean = round(float(np.mean([ratios[i] for i in chunk])), 5)
        targets.update((i, mean) for i in chunk)
    return order, targets


def rect_crop_size(ratio: float, size: int) -> tuple:
    """(height, width) of a 'rect' centre crop: `size` on the short side, the long side
    size / ratio (portrait) or size * ratio, truncated and rounded down to a multiple of 8."""
    if ratio < 1:
        return int(size / ratio) // 8 * 8, size
    return size, int(size * ratio) // 8 * 8


def ffcv_crop_box(width: int, height: int) -> tuple:
    """(top, left, side) of FF's centre square: side int(224/256 * shorter side)."""
    side = int(FFCV_RATIO * min(width, height))
    return (height - side) // 2, (width - side) // 2, side


class ValSet(_Listing, Dataset):
    """The images of one ImageFolder through one of the validation transforms (module
    docstring): mode 'center', 'rect' or 'ffcv'; an item is (uint8 HWC RGB array, label).
    `order` is the evaluation order for val_batches: sorted by aspect ratio for 'rect' (whose
    chunks follow batch_size), else 0..n-1."""

    def __init__(self, folder: Path, size: int, mode: str, batch_size: int):
        if mode not in VAL_MODES:
            raise ValueError(f"mode must be one of {VAL_MODES}, got {mode!r}")
        self._list(folder)
        self.size, self.mode, self.batch_size = size, mode, batch_size
        self.order, self.ratios = list(range(len(self))), None
        if mode == "rect":
            self.order, self.ratios = rect_targets(val_sizes(self.folder), batch_size)

    def __getitem__(self, index: int):
        image = load_rgb(self.path(index))
        if self.mode == "ffcv":
            top, left, side = ffcv_crop_box(image.width, image.height)
            resample = Image.Resampling.BOX if side >= self.size else Image.Resampling.BILINEAR
            image = image.crop((left, top, left + side, top + side)).resize(
                (self.size, self.size), resample)
        else:
            image = TF.resize(image, int(VAL_RESIZE * self.size), InterpolationMode.BILINEAR,
                              antialias=True)
            crop = ([self.size, self.size] if self.mode == "center"
                    else list(rect_crop_size(self.ratios[index], self.size)))
            image = TF.center_crop(image, crop)
        return np.asarray(image), int(self._labels[index])


def val_batches(n: int, batch_size: int, world_size: int, rank: int, order=None) -> list:
    """DX DistValSampler: rank `rank`'s batches of the n images in `order` (default 0..n-1).
    Every rank gets ceil(n / world_size / batch_size) batches, cut from the contiguous slice
    order[rank * per_rank:(rank + 1) * per_rank], per_rank = batches * batch_size; trailing
    batches may be short or empty. Over the ranks every index appears exactly once, and every
    batch starts at a multiple of batch_size of the order (so 'rect' chunks are batches)."""
    order = list(range(n)) if order is None else list(order)
    if len(order) != n:
        raise ValueError(f"order has {len(order)} indices, expected {n}")
    batches = -(-n // (world_size * batch_size))
    per_rank = batches * batch_size
    mine = order[rank * per_rank:(rank + 1) * per_rank]
    return [mine[i * batch_size:(i + 1) * batch_size] for i in range(batches)]


def top_k_correct(logits: torch.Tensor, labels: torch.Tensor, ks=(1, 5)) -> list:
    """For each k in ks, how many rows have their label among the k largest logits (k capped
    at the number of classes), as 0-d int64 tensors on the logits' device: a training loop
    can add them up every step without waiting for the GPU."""
    if len(labels) == 0:
        return [torch.zeros((), dtype=torch.int64, device=logits.device) for _ in ks]
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    hits = top.eq(labels.view(-1, 1).to(top.device))
    return [hits[:, :k].sum() for k in ks]


# =============================================================================================
# Loaders


def train_loader(dataset: TrainSet, indices, batch_size: int, workers: int, drop_last: bool,
                 pin_memory: bool, start_batch: int = 0) -> DataLoader:
    """Batches of `indices` (this rank's order for the epoch) from batch `start_batch` on: a
    resumed run skips the batches it trained on without loading them. Collates with
    fast_collate, or bytes_collate for decode="gpu"; workers=0 loads in this process."""
    return DataLoader(
        dataset, batch_size=batch_size, sampler=list(indices)[start_batch * batch_size:],
        drop_last=drop_last, num_workers=workers, pin_memory=pin_memory,
        collate_fn=bytes_collate if dataset.decode == "gpu" else fast_collate,
        worker_init_fn=ignore_stop_signals if workers else None, persistent_workers=False)


def val_loader(dataset: ValSet, batches: list, workers: int, pin_memory: bool) -> DataLoader:
    """The given batches (val_batches; empty ones give empty tensors), fast_collate."""
    return DataLoader(dataset, batch_sampler=batches, num_workers=workers,
                      pin_memory=pin_memory, collate_fn=fast_collate,
                      worker_init_fn=ignore_stop_signals if workers else None)


def default_workers(local_world_size: int, cores: int | None = None) -> int:
    """Loader processes per GPU process: this host's usable cores (its CPU affinity) shared
    by the local processes, less one for each main process; at least 1."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    return max(1, cores // max(1, local_world_size) - 1)
