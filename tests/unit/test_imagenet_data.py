"""recipes/common/imagenet_data.py: the imagenet recipe's loaders, on real JPEG trees.

Trees are written by common.imagenet_files.write_synthetic_official (real JPEGs at quality 90,
sides 24..96 px, aspect 0.5..2; the first image of class 0 is grayscale, of class 1 CMYK);
its train/ folder is an ImageFolder, so it serves as train and as val folder here. Loaders run
real DataLoader worker processes, and distributed validation runs in 2 gloo processes.
"""
import io
import json
import math
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from labs.loopback import free_port
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
from common import imagenet_data as D  # noqa: E402
from common.imagenet_files import write_synthetic_official  # noqa: E402

SIZE = 32  # the smoke stand-in for 128 px


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """An ImageFolder of 3 classes x 4 images (RGB, one grayscale, one CMYK)."""
    root = tmp_path_factory.mktemp("imagenet")
    write_synthetic_official(root, classes=3, train_per_class=4, val_per_class=1, min_side=24,
                             max_side=96)
    return root / "train"


def _mode_of(folder: Path, index: int) -> str:
    rel = D.TrainSet(folder, SIZE, 0.08, 0).samples[index][0]
    with Image.open(folder / rel) as image:
        return image.mode


# ---------------------------------------------------------------------------------------------
# crop_box: properties over image shapes and scales


@settings(max_examples=300, deadline=None)
@given(width=st.integers(1, 2000), height=st.integers(1, 2000),
       min_scale=st.sampled_from([0.08, 0.087, 0.35, 0.5, 1.0]), seed=st.integers(0, 2**63))
def test_crop_box_is_inside_with_scale_and_aspect_in_range_or_the_centred_fallback(
        width, height, min_scale, seed):
    top, left, h, w = D.crop_box(width, height, min_scale, torch.Generator().manual_seed(seed))
    assert 0 <= top and 0 <= left and 1 <= h and 1 <= w
    assert top + h <= height and left + w <= width
    if (top, left, h, w) == D.fallback_box(width, height):
        return
    # A random box: w, h are the rounded sqrt(target * aspect), sqrt(target / aspect) with
    # target in [min_scale, 1] x area and aspect in [3/4, 4/3], so within half a pixel each.
    assert (w + 0.5) * (h + 0.5) >= min_scale * width * height
    assert (w - 0.5) / (h + 0.5) <= 4 / 3 and (w + 0.5) / (h - 0.5 or 1e-9) >= 3 / 4


def test_crop_box_fallback_values_for_elongated_and_ordinary_images():
    assert D.fallback_box(100, 10) == (0, 43, 10, 13)     # wide: w = round(10 * 4/3) = 13
    assert D.fallback_box(30, 100) == (30, 0, 40, 30)     # tall: h = round(30 / 0.75) = 40
    assert D.fallback_box(120, 100) == (0, 0, 100, 120)   # aspect 1.2 is in range: the whole
    # A 1 x 1000 strip: no random box with aspect >= 3/4 fits, so the fallback it is.
    assert D.crop_box(1000, 1, 0.08, torch.Generator().manual_seed(0)) == (0, 499, 1, 1)


def test_crop_box_draws_span_the_scale_range_with_aspects_symmetric_in_log():
    """2,000 draws in a 1000 px square: area fractions from min_scale (no lower) to nearly 1
    (large boxes of aspect far from 1 do not fit and are redrawn, so the mean is below
    (1 + min_scale) / 2), and log(w / h) symmetric about 0 (the square rejects both alike)."""
    g = torch.Generator().manual_seed(1)
    for min_scale in (0.08, 0.5):
        boxes = [D.crop_box(1000, 1000, min_scale, g) for _ in range(2000)]
        fractions = np.array([h * w / 1e6 for _, _, h, w in boxes])
        assert fractions.min() >= min_scale - 0.002 and fractions.max() > 0.97
        assert (fractions < min_scale + 0.05).mean() > 0.02
        log_aspect = np.log([w / h for _, _, h, w in boxes])
        # the mean of 2,000 has a standard deviation of 0.0034 (measured over 20 seeds)
        assert abs(log_aspect.mean()) < 0.015 and log_aspect.max() > 0.27  # log(4/3) = 0.288


def test_augment_params_flip_half_the_images_independently_of_the_box():
    draws = [D.augment_params(400, 300, 0.08, D.sample_seed(0, 0, i)) for i in range(4000)]
    flips = np.array([d[4] for d in draws])
    assert abs(flips.mean() - 0.5) < 0.03  # 4,000 fair coins: standard deviation 0.008
    lefts = np.array([d[1] for d in draws])  # the box does not depend on the flip
    assert abs(lefts[flips].mean() - lefts[~flips].mean()) < 0.1 * lefts.mean()


# ---------------------------------------------------------------------------------------------
# TrainSet and the train loader


def test_trainset_items_are_uint8_hwc_rgb_of_the_size_with_imagefolder_labels(tree):
    ds = D.TrainSet(tree, SIZE, 0.08, seed=0)
    assert len(ds) == 12 and len(ds.classes) == 3
    assert [label for _, label in ds.samples] == [0] * 4 + [1] * 4 + [2] * 4
    assert {_mode_of(tree, 0), _mode_of(tree, 4)} == {"L", "CMYK"}  # the odd ones are there
    for i in range(len(ds)):
        image, label = ds[i]
        assert image.shape == (SIZE, SIZE, 3) and image.dtype == np.uint8
        assert label == ds.samples[i][1]
    # Grayscale comes out with three equal channels; CMYK as colour (not all channels equal).
    gray = ds[0][0] if _mode_of(tree, 0) == "L" else ds[4][0]
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()


def test_trainset_item_is_the_seeded_crop_and_flip_of_the_full_decode(tree):
    """One item rebuilt by hand: PIL decode (no draft), the box and flip drawn from
    sample_seed(seed, epoch, index), torchvision's resized_crop (bilinear), flip."""
    ds = D.TrainSet(tree, SIZE, 0.35, seed=7)
    ds.epoch = 3
    for index in (1, 5):
        image = Image.open(tree / ds.samples[index][0]).convert("RGB")
        top, left, h, w, flip = D.augment_params(image.width, image.height, 0.35,
                                                 D.sample_seed(7, 3, index))
        expected = transforms.functional.resized_crop(image, top, left, h, w, [SIZE, SIZE])
        if flip:
            expected = expected.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        assert np.array_equal(ds[index][0], np.asarray(expected))


def test_trainset_is_deterministic_per_seed_epoch_index_and_epochs_differ(tree):
    a, b = D.TrainSet(tree, SIZE, 0.08, seed=3), D.TrainSet(tree, SIZE, 0.08, seed=3)
    assert all(np.array_equal(a[i][0], b[i][0]) for i in range(len(a)))
    b.epoch = 1
    assert sum(np.array_equal(a[i][0], b[i][0]) for i in range(len(a))) == 0
    c = D.TrainSet(tree, SIZE, 0.08, seed=4)
    assert sum(np.array_equal(a[i][0], c[i][0]) for i in range(len(a))) == 0


def test_train_loader_batches_are_identical_with_0_and_2_workers_and_resume_skips(tree):
    ds = D.TrainSet(tree, SIZE, 0.08, seed=0)
    ds.epoch = 2
    indices = [5, 0, 11, 3, 7, 1, 9, 2, 10]
    inline = list(D.train_loader(ds, indices, 4, workers=0, drop_last=False, pin_memory=False))
    forked = list(D.train_loader(ds, indices, 4, workers=2, drop_last=False, pin_memory=False))
    assert [len(y) for _, y in inline] == [4, 4, 1]
    assert len(forked) == 3
    for (x0, y0), (x2, y2) in zip(inline, forked):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)
    assert inline[0][1].tolist() == [ds.samples[i][1] for i in indices[:4]]
    resumed = list(D.train_loader(ds, indices, 4, workers=0, drop_last=False,
                                  pin_memory=False, start_batch=1))
    assert len(resumed) == 2 and all(torch.equal(r[0], i[0]) for r, i in zip(resumed, inline[1:]))
    dropped = list(D.train_loader(ds, indices, 4, workers=0, drop_last=True, pin_memory=False))
    assert [len(y) for _, y in dropped] == [4, 4]


def test_train_loader_workers_ignore_sigterm_and_sigusr1(tree):
    ds = D.TrainSet(tree, SIZE, 0.08, seed=0)
    it = iter(D.train_loader(ds, list(range(12)), 2, workers=1, drop_last=False,
                             pin_memory=False))
    first = next(it)
    (worker,) = it._workers  # the DataLoader's worker process (private attribute)
    os.kill(worker.pid, signal.SIGTERM)
    os.kill(worker.pid, signal.SIGUSR1)
    rest = list(it)
    assert len(first[1]) + sum(len(y) for _, y in rest) == 12
    assert worker.exitcode == 0  # it finished its work and left normally


def test_gpu_decode_path_on_cpu_gives_the_cpu_path_boxes_and_close_pixels(tree):
    """decode="gpu" run with torchvision's CPU decoder: the same crop boxes and flips as the
    CPU path (drawn from the JPEG header's size), and pixels within resize rounding: PIL's
    fixed-point bilinear vs torch's float antialiased bilinear (both decoders are
    libjpeg-turbo and agree exactly). The CMYK image goes through a quality-95 re-encode
    (reencoded), on noisy synthetic pixels: a larger difference."""
    cpu = D.TrainSet(tree, SIZE, 0.08, seed=5)
    gpu = D.TrainSet(tree, SIZE, 0.08, seed=5, decode="gpu")
    cpu.epoch = gpu.epoch = 1
    items = [gpu[i] for i in range(len(gpu))]
    for i, (data, box, flip, label) in enumerate(items):
        assert data.dtype == torch.uint8 and data.dim() == 1
        if _mode_of(tree, i) != "CMYK":  # the file's bytes as they are (CMYK: re-encoded)
            assert torch.equal(data, torch.from_numpy(np.fromfile(tree / gpu.samples[i][0],
                                                                  dtype=np.uint8)))
        with Image.open(tree / cpu.samples[i][0]) as image:
            expected = D.augment_params(image.width, image.height, 0.08, D.sample_seed(5, 1, i))
        assert (*box, flip) == expected and label == cpu.samples[i][1]
    batch = next(iter(D.train_loader(gpu, list(range(12)), 12, workers=0, drop_last=False,
                                     pin_memory=False)))
    (data, lengths, boxes, flips), labels = batch
    assert torch.equal(data, torch.cat([item[0] for item in items]))
    assert lengths.tolist() == [len(item[0]) for item in items]
    assert boxes.tolist() == [list(item[1]) for item in items]
    assert flips.tolist() == [item[2] for item in items] and flips.dtype == torch.bool
    x, y = D.GpuDecoder("cpu", SIZE)(batch[0]), labels
    x_cpu, y_cpu = D.fast_collate([cpu[i] for i in range(12)])
    assert x.shape == (12, 3, SIZE, SIZE) and x.dtype == torch.uint8 and torch.equal(y, y_cpu)
    diff = (x.int() - x_cpu.int()).abs()
    cmyk = [_mode_of(tree, i) == "CMYK" for i in range(12)]
    for i in range(12):  # measured: mean 0.12 to 0.22 and max 1; the CMYK one 1.9 and 13
        mean, top = diff[i].float().mean(), diff[i].max()
        assert (mean < 4 and top <= 40) if cmyk[i] else (mean < 0.5 and top <= 2)
    jpegs, labels = D.bytes_collate([])
    assert D.GpuDecoder("cpu", SIZE)(jpegs).shape == (0, 3, SIZE, SIZE) and labels.shape == (0,)


def test_gpu_decode_path_sends_cmyk_and_png_named_jpeg_re_encoded_as_rgb_jpeg(tmp_path, tree):
    odd = tmp_path / "odd" / "n000"
    odd.mkdir(parents=True)
    rgb = np.asarray(Image.open(tree / D.TrainSet(tree, SIZE, 0.08, 0).samples[1][0]))
    Image.fromarray(rgb).save(odd / "a_png.JPEG", format="PNG")  # as n02105855_2933.JPEG
    Image.fromarray(rgb).convert("CMYK").save(odd / "b_cmyk.JPEG", quality=90)
    Image.fromarray(rgb).save(odd / "c_rgb.JPEG", quality=90)
    gpu = D.TrainSet(odd.parent, SIZE, 0.08, seed=0, decode="gpu")
    items = [gpu[i] for i in range(3)]
    assert [bytes(data[:2].tolist()) for data, _, _, _ in items] == [b"\xff\xd8"] * 3
    assert torch.equal(items[2][0], torch.from_numpy(np.fromfile(odd / "c_rgb.JPEG", np.uint8)))
    for data, _, _, _ in items[:2]:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as image:
            assert (image.format, image.mode, image.size) == ("JPEG", "RGB", rgb.shape[1::-1])
    x = D.GpuDecoder("cpu", SIZE)(D.bytes_collate(items)[0])
    cpu = D.TrainSet(odd.parent, SIZE, 0.08, seed=0)
    x_cpu, _ = D.fast_collate([cpu[i] for i in range(3)])
    diff = (x.int() - x_cpu.int()).abs().float().mean((1, 2, 3))
    assert diff[2] < 0.5 and diff[0] < 4 and diff[1] < 4  # re-encoded at quality 95: more


# ---------------------------------------------------------------------------------------------
# Collate, normalise, counts


def test_fast_collate_is_uint8_nchw_contiguous_and_empty_batches_have_zero_shapes():
    a = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    b = 255 - a
    x, y = D.fast_collate([(a, 4), (b, 9)])
    assert x.shape == (2, 3, 2, 3) and x.dtype == torch.uint8 and x.is_contiguous()
    assert x[0, 2, 1, 0] == a[1, 0, 2] and x[1, 0, 0, 2] == b[0, 2, 0]
    assert torch.equal(x[1].permute(1, 2, 0), torch.from_numpy(b))
    assert y.dtype == torch.int64 and y.tolist() == [4, 9]
    x, y = D.fast_collate([])
    assert x.shape == (0, 3, 0, 0) and x.dtype == torch.uint8 and y.shape == (0,)


def test_normaliser_matches_the_formula_in_float32_float16_and_channels_last():
    x = torch.randint(0, 256, (2, 3, 5, 7), dtype=torch.uint8, generator=torch.Generator()
                      .manual_seed(0))
    mean = torch.tensor(D.IMAGENET_MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(D.IMAGENET_STD, dtype=torch.float64).view(1, 3, 1, 1)
    exact = (x.double() - mean) / std
    out = D.Normaliser("cpu", torch.float32)(x)
    assert out.dtype == torch.float32 and out.shape == x.shape
    assert torch.equal(out, (x.float() - mean.float()) / std.float())
    assert (out.double() - exact).abs().max() < 1e-6
    half = D.Normaliser("cpu", torch.float16, channels_last=True)(x)
    assert half.dtype == torch.float16 and half.is_contiguous(memory_format=torch.channels_last)
    assert (half.double() - exact).abs().max() < 0.01  # fp16 arithmetic, as FI and DX
    assert x.dtype == torch.uint8  # the input is left alone
    assert D.IMAGENET_MEAN[0] == 0.485 * 255 and D.IMAGENET_STD[2] == 0.225 * 255


def test_top_k_correct_counts_and_caps_k_at_the_class_count():
    logits = torch.tensor([[0.1, 0.9, 0.0, 0.5],    # order 1, 3, 0, 2
                           [0.8, 0.1, 0.2, 0.3],    # order 0, 3, 2, 1
                           [0.0, 0.1, 0.7, 0.2]])   # order 2, 3, 1, 0
    labels = torch.tensor([3, 0, 0])
    assert [int(c) for c in D.top_k_correct(logits, labels, ks=(1, 2, 3))] == [1, 2, 2]
    # top-5 of 4 classes: all of them
    assert [int(c) for c in D.top_k_correct(logits, labels)] == [1, 3]
    assert [int(c) for c in D.top_k_correct(logits[:0], labels[:0])] == [0, 0]


def test_default_workers_shares_cores_less_one_for_each_main_process():
    assert D.default_workers(8, cores=96) == 11
    assert D.default_workers(8, cores=64) == 7
    assert D.default_workers(1, cores=16) == 15
    assert D.default_workers(8, cores=8) == 1   # 8 // 8 - 1 = 0: at least 1
    assert D.default_workers(1) >= 1


# ---------------------------------------------------------------------------------------------
# Validation: sizes cache, rect targets, transforms, batches


def test_val_sizes_reads_headers_caches_them_and_rereads_changed_files(tree):
    cache = tree.parent / ".sizes-train.json"
    cache.unlink(missing_ok=True)
    ds = D.ValSet(tree, SIZE, "center", 4)
    sizes = D.val_sizes(tree)
    truth = []
    for rel, _ in ds.samples:
        with Image.open(tree / rel) as image:
            truth.append(image.size)
    assert sizes == truth
    stored = json.loads(cache.read_text())
    rel0 = ds.samples[0][0]
    st0 = (tree / rel0).stat()
    assert stored[rel0] == [st0.st_size, st0.st_mtime_ns, *truth[0]]
    assert not list(tree.parent.glob(".sizes-train.json.*"))  # no temporary file left
    # The cache is used: an entry whose key matches is believed.
    stored[rel0][2:] = [1, 2]
    cache.write_text(json.dumps(stored))
    assert D.val_sizes(tree)[0] == (1, 2)
    # A changed file (mtime) is read again and the cache rewritten.
    os.utime(tree / rel0, ns=(st0.st_atime_ns, st0.st_mtime_ns + 10**9))
    assert D.val_sizes(tree) == truth
    assert json.loads(cache.read_text())[rel0][1] == st0.st_mtime_ns + 10**9
    cache.write_text("not json")  # a damaged cache is rebuilt
    assert D.val_sizes(tree) == truth and json.loads(cache.read_text())[rel0][2:] == [*truth[0]]


def test_rect_targets_sort_stably_by_rounded_ratio_and_share_chunk_means():
    sizes = [(200, 100), (100, 200), (100, 100), (300, 200), (300, 400), (50, 50), (1, 3)]
    order, targets = D.rect_targets(sizes, 2)
    # ratios 2, 0.5, 1, 1.5, 0.75, 1, 0.33333; the two 1.0s keep their index order (2, 5)
    assert order == [6, 1, 4, 2, 5, 3, 0]
    assert targets == {6: 0.41667, 1: 0.41667,      # round((0.33333 + 0.5) / 2, 5)
                       4: 0.875, 2: 0.875, 5: 1.25, 3: 1.25, 0: 2.0}
    order, targets = D.rect_targets(sizes, 3)
    assert targets[6] == targets[1] == targets[4] == round((0.33333 + 0.5 + 0.75) / 3, 5)
    assert D.rect_targets([], 4) == ([], {})


def test_rect_crop_size_short_side_is_size_long_side_a_multiple_of_8():
    assert D.rect_crop_size(0.625, 224) == (352, 224)   # int(358.4) = 358 -> 352
    assert D.rect_crop_size(1.25, 224) == (224, 280)
    assert D.rect_crop_size(1.0, 288) == (288, 288)
    assert D.rect_crop_size(4 / 3, 128) == (128, 168)   # int(170.67) = 170 -> 168
    assert D.rect_crop_size(0.75, 288) == (384, 288)
    assert D.rect_crop_size(1.996, 100) == (100, 192)   # int(199.6) = 199, not rounded to 200
    assert D.rect_crop_size(0.501, 100) == (192, 100)   # int(199.60...) = 199
    for ratio in (0.41667, 0.8, 1.33, 1.9):
        h, w = D.rect_crop_size(ratio, 288)
        assert h % 8 == 0 and w % 8 == 0 and min(h, w) == 288


def test_ffcv_crop_box_is_int_224_256_of_the_shorter_side_centred():
    assert D.ffcv_crop_box(500, 375) == (23, 86, 328)   # int(328.125), (375-328)//2, (500-328)//2
    assert D.ffcv_crop_box(375, 500) == (86, 23, 328)
    assert D.ffcv_crop_box(256, 256) == (16, 16, 224)


def test_valset_center_is_torchvision_resize_then_center_crop(tree):
    ds = D.ValSet(tree, SIZE, "center", 4)
    assert ds.order == list(range(12))
    reference = transforms.Compose([transforms.Resize(int(1.14 * SIZE)),
                                    transforms.CenterCrop(SIZE)])
    for i in range(len(ds)):
        image, label = ds[i]
        expected = reference(Image.open(tree / ds.samples[i][0]).convert("RGB"))
        assert np.array_equal(image, np.asarray(expected)) and label == ds.samples[i][1]


def test_valset_ffcv_outputs_size_squares_of_the_centre_crop(tree):
    ds = D.ValSet(tree, SIZE, "ffcv", 4)
    for i in range(len(ds)):
        image, _ = ds[i]
        assert image.shape == (SIZE, SIZE, 3) and image.dtype == np.uint8
    source = Image.open(tree / ds.samples[2][0]).convert("RGB")
    top, left, side = D.ffcv_crop_box(*source.size)
    crop = source.crop((left, top, left + side, top + side))
    expected = crop.resize((SIZE, SIZE), Image.Resampling.BOX if side >= SIZE
                           else Image.Resampling.BILINEAR)
    assert np.array_equal(ds[2][0], np.asarray(expected))


def test_valset_rect_batches_stack_with_their_chunk_shape(tree):
    bs = 5
    ds = D.ValSet(tree, SIZE, "rect", bs)
    order, targets = D.rect_targets(D.val_sizes(tree), bs)
    assert ds.order == order
    shapes = []
    for rank in range(2):
        for batch in D.val_batches(len(ds), bs, 2, rank, ds.order):
            x, y = D.fast_collate([ds[i] for i in batch])  # np.stack fails on mixed shapes
            assert len({targets[i] for i in batch}) <= 1
            if batch:
                assert tuple(x.shape[2:]) == D.rect_crop_size(targets[batch[0]], SIZE)
                shapes.append(tuple(x.shape[2:]))
    assert len(set(shapes)) > 1  # the tree has portrait, square and landscape chunks


def test_valset_and_trainset_reject_bad_modes_and_empty_folders(tmp_path, tree):
    with pytest.raises(ValueError, match="mode must be one of"):
        D.ValSet(tree, SIZE, "middle", 4)
    with pytest.raises(ValueError, match="decode must be one of"):
        D.TrainSet(tree, SIZE, 0.08, 0, decode="tpu")
    (tmp_path / "empty" / "n000").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images"):
        D.TrainSet(tmp_path / "empty", SIZE, 0.08, 0)


def test_val_batches_n37_batch4_on_2_and_3_ranks_exactly():
    two = [D.val_batches(37, 4, 2, r) for r in range(2)]
    # ceil(37 / 2 / 4) = 5 batches a rank, 20 images a rank: rank 1 gets 20..36
    assert two[0] == [list(range(i, i + 4)) for i in range(0, 20, 4)]
    assert two[1] == [[20, 21, 22, 23], [24, 25, 26, 27], [28, 29, 30, 31], [32, 33, 34, 35],
                      [36]]
    three = [D.val_batches(37, 4, 3, r) for r in range(3)]
    # ceil(37 / 3 / 4) = 4 batches, 16 images a rank: rank 2 gets 32..36 and two empty batches
    assert [len(b) for b in three] == [4, 4, 4]
    assert three[2] == [[32, 33, 34, 35], [36], [], []]
    order = list(range(36, -1, -1))
    assert D.val_batches(37, 4, 3, 2, order) == [[4, 3, 2, 1], [0], [], []]


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 300), batch=st.integers(1, 20), world=st.integers(1, 9),
       seed=st.integers(0, 1000))
def test_val_batches_every_index_once_equal_batch_counts_and_chunk_aligned(n, batch, world,
                                                                          seed):
    order = list(np.random.default_rng(seed).permutation(n))
    ranks = [D.val_batches(n, batch, world, r, order) for r in range(world)]
    expected_batches = math.ceil(n / world / batch)
    assert all(len(b) == expected_batches for b in ranks)
    flat = [i for batches in ranks for b in batches for i in b]
    assert flat == order  # each index once, in order, rank by rank
    offset = 0
    for batches in ranks:
        for b in batches:
            assert len(b) <= batch
            if b:
                assert offset % batch == 0  # a 'rect' chunk is a batch
            offset += len(b)


# ---------------------------------------------------------------------------------------------
# Distributed validation: 2 gloo processes, exact global counts

VAL_BS = 5


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(8, 7)).eval()


def _evaluate(folder: Path, world: int, rank: int, workers: int) -> tuple:
    """(correct1, correct5, count, this rank's batch sizes) over this rank's val_batches."""
    ds = D.ValSet(folder, SIZE, "rect", VAL_BS)
    batches = D.val_batches(len(ds), VAL_BS, world, rank, ds.order)
    model, norm = _tiny_model(), D.Normaliser("cpu", torch.float32)
    counts = torch.zeros(3, dtype=torch.int64)
    with torch.no_grad():
        for x, y in D.val_loader(ds, batches, workers, pin_memory=False):
            logits = model(norm(x)) if len(y) else torch.empty(0, 7)
            counts += torch.tensor([*(int(c) for c in D.top_k_correct(logits, y)), len(y)])
    return counts, [len(b) for b in batches]


def _val_worker(rank: int, port: int, folder: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        # Rank 1's batches end in an empty one; it loads them through a worker process.
        counts, sizes = _evaluate(Path(folder), 2, rank, workers=rank)
        dist.all_reduce(counts)
        torch.save({"counts": counts, "sizes": sizes}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_all_reduce_exactly_the_single_process_counts(tmp_path):
    import torch.multiprocessing as mp

    root = tmp_path / "val21"
    write_synthetic_official(root, classes=7, train_per_class=3, val_per_class=1, min_side=24,
                             max_side=96, seed=1)
    folder = root / "train"  # 21 images: 21 = 2 x 2 x 5 + 1
    single, single_sizes = _evaluate(folder, 1, 0, workers=0)
    assert single_sizes == [5, 5, 5, 5, 1] and single[2] == 21
    assert single[0] <= single[1] <= 21 and single[1] > 0
    # Forked, not spawned: a spawned child would import this module (torch, torchvision,
    # hypothesis) again, about 10 s on 2 shared cores; nothing here has touched CUDA.
    mp.start_processes(_val_worker, args=(free_port(), str(folder), str(tmp_path)), nprocs=2,
                       join=True, start_method="fork")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["sizes"] == [5, 5, 5] and r1["sizes"] == [5, 1, 0]
    assert r0["counts"].tolist() == r1["counts"].tolist() == single.tolist()
