"""The imagenet recipe's data on NVIDIA DALI (issue 28 part 1): decode, crop, resize and flip on
the GPU (nvJPEG, and the A100/H100 hardware JPEG decoder behind it), reading the same prepared
trees and the same per-rank sample order as the PIL loader of common.imagenet_data.

DALI is an optional extra (`pip install 'cloudtrain[dali]'`, the wheel nvidia-dali-cuda130:
CUDA 13 as the torch wheels). `decode="auto"` picks it on CUDA when it imports, else the PIL
loader; `decode="cpu"` and `decode="gpu"` keep their meaning (PIL in the workers; nvjpeg through
torchvision one image at a time). With device_id=None every operator runs on the CPU: the tests
run that pipeline on a machine without a GPU, and benchmarks/imagenet_pipeline.py times it.

Training, per epoch and rank (`train_batches`):
  * the file reader gets this rank's files for the epoch, in the order of
    distributed.epoch_indices (the PIL loader's sampler), from batch `start_batch` on, unshuffled:
    so the ranks share out every image exactly as the PIL loader does, a resumed epoch starts at
    the same sample, and the labels arrive in the PIL loader's order;
  * decoders.image_random_crop on the "mixed" device ("cpu" without a GPU) with the recipe's
    parameters: area fraction uniform in [min_scale, 1], aspect in [3/4, 4/3], 10 tries; then
    a bilinear antialiased resize to size x size and a flip with p = 0.5 (crop_mirror_normalize,
    CHW uint8). Normalisation stays in imagenet_data.Normaliser, on the GPU as for the other
    paths, so all three hand the training loop the same uint8 NCHW batch.
  * What cannot match the PIL loader: DALI draws the crops and flips with its own generator
    (seeded per run, epoch, rank and start batch), not with sample_seed per image, so the boxes
    have the same parameters and, as measured in the tests, the same spread, not the same
    values; DALI's fallback after 10 misses is its own. A resumed epoch sees the right images
    with fresh crops. The decoder is DALI's (libjpeg-turbo on the
    CPU, nvJPEG on the GPU), so pixels differ from PIL's by decoder and resize rounding.

Validation (`val_batches_dali`): the batches of imagenet_data.val_batches, in their order; for
each image the geometry of ValSet's mode is computed here from the header sizes (val_sizes)
and DALI decodes, resizes and crops to it: 'center' and 'rect' resize the shorter side to
int(1.14 * size) as torchvision (long side truncated) and crop the centre with torchvision's
rounding, padding with zeros where a 'rect' crop is wider than the image; 'ffcv' crops FF's
centred square (224/256 of the shorter side) and resizes it to size x size. The geometry is
exact; the pixels differ by decoder and filter ('ffcv' shrinks with an antialiased linear
filter where the PIL loader uses BOX).
"""
from __future__ import annotations

import numpy as np
import torch

from common.imagenet_data import (CROP_TRIES, FLIP_P, RATIO, VAL_RESIZE, ffcv_crop_box,
                                  rect_crop_size, val_sizes)

DECODES = ("auto", "cpu", "gpu", "dali")


def available() -> bool:
    """Whether DALI imports here (the optional extra is installed)."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def choose_decode(requested: str, cuda: bool) -> str:
    """The decode path a run uses: "auto" is DALI on CUDA where it imports, else "cpu" (the PIL
    loader); "dali" without DALI is an error the caller reports."""
    if requested not in DECODES:
        raise ValueError(f"decode must be one of {DECODES}, got {requested!r}")
    if requested == "auto":
        return "dali" if cuda and available() else "cpu"
    if requested == "dali" and not available():
        raise ValueError("decode=dali needs NVIDIA DALI: pip install 'cloudtrain[dali]' "
                         "(nvidia-dali-cuda130)")
    return requested


def pipeline_seed(seed: int, epoch: int, rank: int, start_batch: int) -> int:
    """DALI's seed for one rank's epoch (from `start_batch` on): int32 range, as DALI takes."""
    return int(np.random.SeedSequence([seed, epoch, rank, start_batch])
               .generate_state(1, np.uint32)[0] & 0x7FFFFFFF)


def _device(device_id):
    """(decoder device, device of the other operators) for a device_id (None: CPU only)."""
    return ("cpu", "cpu") if device_id is None else ("mixed", "gpu")


def _to_torch(tensor_list, device_id) -> torch.Tensor:
    """A DALI batch of equal shapes -> one torch tensor (a copy; on cuda:device_id for GPU)."""
    from nvidia.dali.plugin.pytorch import feed_ndarray
    dense = tensor_list.as_tensor()
    out = torch.empty(dense.shape(), dtype=torch.uint8,
                      device="cpu" if device_id is None else f"cuda:{device_id}")
    if device_id is None:
        feed_ndarray(dense, out)
    else:
        feed_ndarray(dense, out, cuda_stream=torch.cuda.current_stream(device_id))
    return out


class TrainPipelines:
    """Training batches from DALI for one ImageFolder listing (TrainSet's `_paths`, `_labels`
    and `folder`): build one pipeline per epoch (the file list is the epoch's order)."""

    def __init__(self, trainset, device_id: int | None, threads: int):
        self.trainset, self.device_id, self.threads = trainset, device_id, max(1, threads)

    def batches(self, indices, epoch: int, rank: int, batch_size: int, drop_last: bool,
                start_batch: int = 0, with_indices: bool = False):
        """(uint8 NCHW size x size batch, int64 labels) for `indices` (this rank's order for
        the epoch) from batch `start_batch` on; a short last batch unless drop_last; with
        `with_indices`, the batch's sample indices as a third item (the reader carries them in
        place of the labels). Crop parameters, size and seed are the trainset's at the call
        (set them as for the PIL loader)."""
        from nvidia.dali import fn, pipeline_def, types
        ds = self.trainset
        order = np.asarray(list(indices), dtype=np.int64)[start_batch * batch_size:]
        n = len(order) // batch_size * batch_size if drop_last else len(order)
        order = order[:n]
        if n == 0:
            return
        files = [str(ds.folder / p.decode()) for p in ds._paths[order]]
        decoder_device, device = _device(self.device_id)
        size, min_scale = ds.size, ds.min_scale

        @pipeline_def(batch_size=batch_size, num_threads=self.threads, device_id=self.device_id,
                      seed=pipeline_seed(ds.seed, epoch, rank, start_batch),
                      exec_dynamic=True)
        def pipe():
            jpegs, label = fn.readers.file(files=files, labels=order.tolist(), random_shuffle=False,
                                           pad_last_batch=True, name="reader")
            images = fn.decoders.image_random_crop(
                jpegs, device=decoder_device, output_type=types.RGB,
                random_area=[min_scale, 1.0], random_aspect_ratio=list(RATIO),
                num_attempts=CROP_TRIES)
            images = fn.resize(images, device=device, resize_x=size, resize_y=size,
                               interp_type=types.INTERP_LINEAR, antialias=True)
            images = fn.crop_mirror_normalize(images, device=device, dtype=types.UINT8,
                                              output_layout="CHW",
                                              mirror=fn.random.coin_flip(probability=FLIP_P))
            return images, label

        p = pipe()
        p.build()
        try:
            for start in range(0, n, batch_size):
                images, label = p.run()
                count = min(batch_size, n - start)  # the reader pads the last batch
                x = _to_torch(images, self.device_id)[:count]
                index = label.as_array().reshape(-1)[:count].astype(np.int64)
                y = torch.from_numpy(ds._labels[index])
                yield (x, y, torch.from_numpy(index)) if with_indices else (x, y)
        finally:
            del p


# =============================================================================================
# Validation


def val_geometry(width: int, height: int, size: int, mode: str, ratio: float | None) -> tuple:
    """ValSet's geometry for one image as (pre-crop (top, left, h, w) or None, resize (w, h),
    crop (top, left, h, w) of the resized image, negative where it pads)."""
    if mode == "ffcv":
        top, left, side = ffcv_crop_box(width, height)
        return (top, left, side, side), (size, size), (0, 0, size, size)
    short = int(VAL_RESIZE * size)  # torchvision Resize(int): the long side truncated
    if width <= height:
        rw, rh = short, int(short * height / width)
    else:
        rw, rh = int(short * width / height), short
    ch, cw = (size, size) if mode == "center" else rect_crop_size(ratio, size)
    # torchvision center_crop: pad to the crop (left (cw - w) // 2 ...) then crop at
    # int(round((H - ch) / 2)); as one window on the unpadded image:
    top = int(round((rh - ch) / 2.0)) if rh >= ch else -((ch - rh) // 2)
    left = int(round((rw - cw) / 2.0)) if rw >= cw else -((cw - rw) // 2)
    return None, (rw, rh), (top, left, ch, cw)


def val_batches_dali(valset, batches: list, device_id: int | None, threads: int):
    """(uint8 NCHW batch, int64 labels) per batch of `batches` (imagenet_data.val_batches of
    `valset`, an imagenet_data.ValSet), in order; an empty batch gives empty tensors."""
    from nvidia.dali import fn, pipeline_def, types
    sizes = val_sizes(valset.folder)
    max_batch = max((len(b) for b in batches), default=0)
    if max_batch == 0:
        for _ in batches:
            yield torch.empty((0, 3, 0, 0), dtype=torch.uint8), torch.empty(0, dtype=torch.int64)
        return
    decoder_device, device = _device(device_id)
    columns = ("data", "pre_anchor", "pre_shape", "resize", "anchor", "shape")

    @pipeline_def(batch_size=max_batch, num_threads=max(1, threads), device_id=device_id,
                  exec_dynamic=True, prefetch_queue_depth=1)
    def pipe():
        data, pre_anchor, pre_shape, resize, anchor, shape = (
            fn.external_source(name=name, dtype=types.UINT8 if name == "data" else
                               types.FLOAT if name == "resize" else types.INT32)
            for name in columns)
        images = fn.decoders.image_slice(data, pre_anchor, pre_shape, device=decoder_device,
                                         output_type=types.RGB, axis_names="HW",
                                         normalized_anchor=False, normalized_shape=False)
        images = fn.resize(images, device=device, size=resize,
                           interp_type=types.INTERP_LINEAR, antialias=True)
        images = fn.slice(images, anchor, shape, axis_names="HW", out_of_bounds_policy="pad",
                          fill_values=0, device=device)
        return fn.transpose(images, perm=[2, 0, 1], device=device)

    p = pipe()
    p.build()
    for batch in batches:
        if not batch:
            yield torch.empty((0, 3, 0, 0), dtype=torch.uint8), torch.empty(0, dtype=torch.int64)
            continue
        feed = {name: [] for name in columns}
        for index in batch:
            width, height = sizes[index]
            ratio = valset.ratios[index] if valset.ratios is not None else None
            pre, (rw, rh), (top, left, ch, cw) = val_geometry(width, height, valset.size,
                                                              valset.mode, ratio)
            pre = pre or (0, 0, height, width)
            feed["data"].append(np.fromfile(valset.path(index), dtype=np.uint8))
            feed["pre_anchor"].append(np.array(pre[:2], dtype=np.int32))
            feed["pre_shape"].append(np.array(pre[2:], dtype=np.int32))
            feed["resize"].append(np.array((rh, rw), dtype=np.float32))
            feed["anchor"].append(np.array((top, left), dtype=np.int32))
            feed["shape"].append(np.array((ch, cw), dtype=np.int32))
        for name in columns:
            p.feed_input(name, feed[name])
        (images,) = p.run()
        yield (_to_torch(images, device_id),
               torch.from_numpy(valset._labels[np.asarray(batch)].astype(np.int64)))
    del p
