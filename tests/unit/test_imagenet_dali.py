"""recipes/common/imagenet_dali.py: the DALI loader, run on DALI's CPU-only pipeline
(device_id=None) against the PIL loader of recipes/common/imagenet_data.py on real JPEG trees.
Skipped only where DALI does not import (.ci/run installs the `dali` extra).

With DALI_TEST_DEVICE=<cuda device id> the same tests run DALI on that GPU (nvJPEG "mixed"
decoding, GPU operators; benchmarks/device_gpu_figures.sh does this on a lent GPU), plus one
that compares the GPU pipeline with the CPU one."""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
from common import distributed  # noqa: E402
from common import imagenet_dali as DD  # noqa: E402
from common import imagenet_data as D  # noqa: E402
from test_imagenet_data import tree  # noqa: E402,F401  (3 x 4 images: grey, CMYK)

SIZE = 32
DEVICE = int(os.environ["DALI_TEST_DEVICE"]) if os.environ.get("DALI_TEST_DEVICE") else None

needs_dali = pytest.mark.skipif(not DD.available(), reason="NVIDIA DALI is not installed "
                                "(pip install '.[dali]')")


# ---------------------------------------------------------------------------------------------
# The choice of decode path (no DALI needed)


def test_auto_is_dali_on_cuda_only_where_it_imports_and_cpu_and_gpu_keep_their_meaning(
        monkeypatch):
    monkeypatch.setattr(DD, "available", lambda: True)
    assert DD.choose_decode("auto", cuda=True) == "dali"
    assert DD.choose_decode("auto", cuda=False) == "cpu"
    assert DD.choose_decode("cpu", cuda=True) == "cpu"
    assert DD.choose_decode("gpu", cuda=True) == "gpu"
    assert DD.choose_decode("dali", cuda=False) == "dali"  # DALI's CPU pipeline
    monkeypatch.setattr(DD, "available", lambda: False)
    assert DD.choose_decode("auto", cuda=True) == "cpu"
    with pytest.raises(ValueError, match="pip install 'cloudtrain\\[dali\\]'"):
        DD.choose_decode("dali", cuda=True)
    with pytest.raises(ValueError, match="decode must be one of"):
        DD.choose_decode("nvjpeg", cuda=True)


@settings(max_examples=200, deadline=None)
@given(width=st.integers(8, 900), height=st.integers(8, 900),
       size=st.sampled_from([32, 128, 224, 288]))
def test_val_resize_is_torchvisions_resize_of_the_shorter_side(width, height, size):
    """The resize DALI is given is the size torchvision's Resize(int(1.14 * size)) produces."""
    _, (rw, rh), _ = DD.val_geometry(width, height, size, "center", None)
    out = TF.resize(Image.new("RGB", (width, height)), int(D.VAL_RESIZE * size),
                    InterpolationMode.BILINEAR, antialias=True)
    assert (rw, rh) == out.size


# ---------------------------------------------------------------------------------------------
# Training: order, sharding, resume, labels (DALI's CPU pipeline)


@needs_dali
def test_train_batches_carry_the_pil_loaders_labels_in_its_order_and_shapes(tree):
    ds = D.TrainSet(tree, SIZE, 0.35, seed=0)
    order = distributed.epoch_indices(len(ds), 1, 0, seed=0, epoch=0)
    pil = list(D.train_loader(ds, order, 5, 0, drop_last=False, pin_memory=False))
    dali = list(DD.TrainPipelines(ds, DEVICE, 1).batches(order, 0, 0, 5, drop_last=False))
    assert [len(y) for _, y in dali] == [5, 5, 2]
    for (x, y), (px, py) in zip(dali, pil, strict=True):
        assert x.dtype == torch.uint8 and x.shape == px.shape == (len(y), 3, SIZE, SIZE)
        assert x.is_cuda == (DEVICE is not None)
        assert y.dtype == torch.int64 and y.tolist() == py.tolist()
    dropped = list(DD.TrainPipelines(ds, DEVICE, 1).batches(order, 0, 0, 5, drop_last=True))
    assert [len(y) for _, y in dropped] == [5, 5]


@needs_dali
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_share_out_every_image_exactly_once_per_epoch(tree, world_size):
    ds = D.TrainSet(tree, SIZE, 0.35, seed=0)
    n = len(ds)  # 12: divides by 2 and 3, so the sampler pads nothing
    seen = []
    for rank in range(world_size):
        order = distributed.epoch_indices(n, world_size, rank, seed=0, epoch=1)
        got = [i for _, _, idx in DD.TrainPipelines(ds, DEVICE, 1).batches(
            order, 1, rank, 4, drop_last=False, with_indices=True) for i in idx.tolist()]
        assert got == order  # the PIL loader's sampler, in its order
        seen += got
    assert sorted(seen) == list(range(n))


@needs_dali
def test_a_resumed_epoch_starts_at_the_sample_after_the_last_trained_batch(tree):
    ds = D.TrainSet(tree, SIZE, 0.35, seed=0)
    order = distributed.epoch_indices(len(ds), 1, 0, seed=0, epoch=2)
    tp = DD.TrainPipelines(ds, DEVICE, 1)
    whole = [idx.tolist() for _, _, idx in tp.batches(order, 2, 0, 3, False, with_indices=True)]
    resumed = [idx.tolist() for _, y, idx in tp.batches(order, 2, 0, 3, False, start_batch=2,
                                                          with_indices=True)]
    assert resumed == whole[2:] and len(whole) == 4


@needs_dali
def test_crops_repeat_for_a_seed_and_change_with_the_epoch(tree):
    ds = D.TrainSet(tree, SIZE, 0.08, seed=5)
    order = list(range(len(ds)))
    tp = DD.TrainPipelines(ds, DEVICE, 2)
    first = torch.cat([x for x, _ in tp.batches(order, 0, 0, 4, False)])
    again = torch.cat([x for x, _ in tp.batches(order, 0, 0, 4, False)])
    other = torch.cat([x for x, _ in tp.batches(order, 1, 0, 4, False)])
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@needs_dali
@pytest.mark.skipif(DEVICE is None, reason="DALI_TEST_DEVICE: a GPU to compare with")
def test_the_gpu_pipeline_draws_the_cpu_pipelines_crops_for_a_seed(tree):
    """nvJPEG against libjpeg-turbo: the same windows and flips give pixels a few levels apart;
    other windows would differ by tens."""
    ds = D.TrainSet(tree, SIZE, 0.08, seed=3)
    order = list(range(len(ds)))
    gpu = torch.cat([x for x, _ in DD.TrainPipelines(ds, DEVICE, 2).batches(order, 0, 0, 4,
                                                                              False)])
    cpu = torch.cat([x for x, _ in DD.TrainPipelines(ds, None, 2).batches(order, 0, 0, 4,
                                                                            False)])
    diff = (gpu.cpu().float() - cpu.float()).abs().mean(dim=(1, 2, 3))
    assert diff.max() < 4, diff.tolist()


# ---------------------------------------------------------------------------------------------
# Training: crop geometry, measured from the pixels


def _coordinate_image(path: Path, width: int, height: int) -> None:
    """R rises with x, G with y (0..255 over the image), B flat: a crop's box and flip can be
    read back from its pixels."""
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    rgb = np.stack([x, y, np.full_like(x, 128)], -1).round().astype(np.uint8)
    Image.fromarray(rgb).save(path, quality=98, subsampling=0)


def _measured(batch: torch.Tensor, width: int, height: int) -> list:
    """(area fraction, aspect w/h, flipped) of each crop of the coordinate image, from the
    pixels of the outermost columns and rows (0.5 px in from the edge after resize)."""
    out = []
    for image in batch.double():
        r, g = image[0], image[1]
        left, right = r[:, 0].mean().item(), r[:, -1].mean().item()
        top, bottom = g[0].mean().item(), g[-1].mean().item()
        w = abs(right - left) / 255 * (width - 1) * SIZE / (SIZE - 1)
        h = abs(bottom - top) / 255 * (height - 1) * SIZE / (SIZE - 1)
        out.append((w * h / (width * height), w / h, right < left))
    return out


@needs_dali
def test_dali_crops_keep_the_recipes_area_aspect_and_flip_as_the_pil_loader_does(tmp_path):
    """The same 120 draws of both loaders on a 400x300 coordinate image: every crop's area
    fraction in [min_scale, 1] and aspect in [3/4, 4/3] (within the measurement's 4 %), about
    half of them flipped, the areas spread over the range with the PIL loader's mean. The
    measurement is checked on the PIL loader's crops, whose boxes are known (augment_params)."""
    width, height, n, min_scale = 400, 300, 120, 0.35
    folder = tmp_path / "train"
    (folder / "n0").mkdir(parents=True)
    for k in range(n):  # the same picture n times: n draws in one epoch
        _coordinate_image(folder / "n0" / f"{k:03d}.JPEG", width, height)
    ds = D.TrainSet(folder, SIZE, min_scale, seed=0)
    order = list(range(n))
    pil = torch.cat([x for x, _ in D.train_loader(ds, order, 40, 0, False, False)])
    for k, (area, aspect, flipped) in enumerate(_measured(pil, width, height)):
        top, left, h, w, flip = D.augment_params(width, height, min_scale,
                                                 D.sample_seed(0, 0, k))
        assert area == pytest.approx(w * h / (width * height), rel=0.05)
        assert aspect == pytest.approx(w / h, rel=0.05) and flipped == flip
    dali = torch.cat([x for x, _ in DD.TrainPipelines(ds, DEVICE, 2).batches(order, 0, 0, 40,
                                                                             False)])
    measured = _measured(dali.cpu(), width, height)
    areas = [a for a, _, _ in measured]
    assert all(min_scale * 0.96 <= a <= 1.04 for a in areas)
    assert all(0.75 * 0.96 <= asp <= 4 / 3 * 1.04 for _, asp, _ in measured)
    assert 35 <= sum(f for _, _, f in measured) <= 85
    assert min(areas) < min_scale + 0.1 and max(areas) > 0.9
    # Boxes that do not fit are drawn again, which favours small areas: both loaders alike.
    pil_areas = [a for a, _, _ in _measured(pil, width, height)]
    assert np.mean(areas) == pytest.approx(np.mean(pil_areas), abs=0.06)


# ---------------------------------------------------------------------------------------------
# Validation: ValSet's geometry, exactly


@needs_dali
@pytest.mark.parametrize("mode,size,mean_diff", [("center", SIZE, 1.0), ("rect", SIZE, 1.0),
                                                 ("ffcv", 40, 4.0)])
def test_val_batches_have_valsets_shapes_labels_and_pixels_within_the_filters_difference(
        tree, mode, size, mean_diff):
    """Two ranks: every batch the PIL val loader's shape (rect: its chunk's crop; padded where
    wider than the image) with its labels; pixels within the stated mean difference (decoder
    and resize rounding; 'ffcv': DALI's antialiased linear filter against PIL's BOX)."""
    vs = D.ValSet(tree, size, mode, 4)
    for rank in range(2):
        batches = D.val_batches(len(vs), 4, 2, rank, vs.order)
        pil = list(D.val_loader(vs, batches, 0, False))
        dali = list(DD.val_batches_dali(vs, batches, DEVICE, 1))
        assert len(dali) == len(pil)
        for (x, y), (px, py) in zip(dali, pil):
            assert x.shape == px.shape and y.tolist() == py.tolist()
            if len(y):
                assert (x.cpu().float() - px.float()).abs().mean() < mean_diff


# ---------------------------------------------------------------------------------------------
# train.py with decode=dali (DALI's CPU pipeline)

SMALL = ["--variant", "tiny", "--arch", "resnet18", "--data", "synthetic",
         "--synthetic_classes", "4", "--synthetic_train", "8", "--synthetic_val", "3",
         "--workers", "0", "--device", "cpu"]


@pytest.fixture(scope="module")
def train():
    from conftest import import_recipe_file
    return import_recipe_file("imagenet", "train.py", "imagenet_train_dali")


def _rows(job_dir):
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "event" not in r]


@pytest.mark.slow(seconds=30)
@needs_dali
def test_the_tiny_schedule_trains_on_dali_through_every_phase_and_resumes_at_the_step(
        train, tmp_path, capsys, one_torch_thread):
    def run(job, *extra):
        return train.main(SMALL + ["--decode", "dali", "--job-dir", str(tmp_path / job),
                                   "--data-dir", str(tmp_path / "data"), *extra])

    assert run("straight") == 0
    assert "workers=0 decode=dali data=" in capsys.readouterr().out  # the choice, said
    rows = _rows(tmp_path / "straight")
    assert [(r["epoch"], r["step"], r["size"], r["val_mode"], r["val_images"]) for r in rows] \
        == [(1, 4, 32, "center", 12), (2, 6, 32, "center", 12), (3, 10, 56, "center", 12),
            (4, 14, 72, "rect", 12)]
    assert run("resumed", "--stop-at-step", "5") == 143
    assert run("resumed", "--resume", "true") == 0
    out = capsys.readouterr().out
    assert "resuming at step 5 (epoch 2, batch 1)" in out
    assert [r["step"] for r in _rows(tmp_path / "resumed")][-3:] == [6, 10, 14]


def test_auto_on_the_cpu_is_the_pil_loader_and_says_so(train, tmp_path, capsys,
                                                       one_torch_thread):
    assert train.main(SMALL + ["--epochs", "1", "--job-dir", str(tmp_path / "j"),
                               "--data-dir", str(tmp_path / "data")]) == 0
    assert "workers=0 decode=cpu (auto)" in capsys.readouterr().out
