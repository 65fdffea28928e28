#!/usr/bin/env python3
"""The DALI path (recipes/common/imagenet_dali.py) on this machine's GPU against the PIL loader:
what tests/unit/test_imagenet_dali.py checks on DALI's CPU pipeline, here with the "mixed"
(nvJPEG) decoder and the GPU operators: every rank's order and labels, every image once over 2
ranks, repeatable crops for a seed, the GPU pipeline against the CPU one for the same seed, and
the three validation geometries' shapes and labels against ValSet, with the mean pixel
difference printed. Exits non-zero on the first mismatch. --cpu: DALI's CPU pipeline (a check
of the script itself on a machine without a GPU).

    python benchmarks/imagenet_dali_check.py
"""
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "recipes"))
from common import distributed  # noqa: E402
from common import imagenet_dali as DD  # noqa: E402
from common import imagenet_data as D  # noqa: E402
from common.imagenet_files import write_synthetic_official  # noqa: E402

CUDA = torch.cuda.is_available() and "--cpu" not in sys.argv
DEV = 0 if CUDA else None  # DALI's device_id
print("DALI available:", DD.available(), "cuda:", CUDA, flush=True)
if not DD.available():
    raise SystemExit("NVIDIA DALI does not import here")
print("auto on cuda ->", DD.choose_decode("auto", True), flush=True)
with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    write_synthetic_official(root, classes=3, train_per_class=8, val_per_class=2, min_side=48,
                             max_side=400)
    folder = root / "train"
    ds = D.TrainSet(folder, 64, 0.35, seed=0)
    n = len(ds)
    for world in (1, 2):
        seen = []
        for rank in range(world):
            order = distributed.epoch_indices(n, world, rank, 0, 0)
            got = list(DD.TrainPipelines(ds, DEV, 4).batches(order, 0, rank, 5, False,
                                                             with_indices=True))
            idx = [i for _, _, ix in got for i in ix.tolist()]
            assert idx == order, (idx, order)
            for x, y, ix in got:
                assert x.is_cuda == CUDA and x.dtype == torch.uint8, (x.device, x.dtype)
                assert x.shape[1:] == (3, 64, 64), x.shape
                assert y.tolist() == [int(ds._labels[i]) for i in ix.tolist()]
            seen += idx
        assert sorted(seen) == list(range(n)), world
        print(f"train, {world} rank(s): order, labels, shapes OK", flush=True)
    a = torch.cat([x for x, _ in DD.TrainPipelines(ds, DEV, 4).batches(list(range(n)), 0, 0, 8,
                                                                        False)])
    b = torch.cat([x for x, _ in DD.TrainPipelines(ds, DEV, 4).batches(list(range(n)), 0, 0, 8,
                                                                        False)])
    print("same seed, same crops:", torch.equal(a, b), flush=True)
    cpu = torch.cat([x for x, _ in DD.TrainPipelines(ds, None, 4).batches(list(range(n)), 0,
                                                                            0, 8, False)])
    print("GPU vs CPU pipeline, same seed: equal", torch.equal(a.cpu(), cpu),
          "mean abs diff", (a.cpu().float() - cpu.float()).abs().mean().item(), flush=True)
    for mode, size in (("center", 64), ("rect", 64), ("ffcv", 80)):
        vs = D.ValSet(folder, size, mode, 4)
        for rank in range(2):
            batches = D.val_batches(len(vs), 4, 2, rank, vs.order)
            pil = list(D.val_loader(vs, batches, 0, False))
            dali = list(DD.val_batches_dali(vs, batches, DEV, 4))
            assert len(pil) == len(dali)
            diffs = []
            for (x, y), (px, py) in zip(dali, pil):
                assert x.shape == px.shape and y.tolist() == py.tolist(), (x.shape, px.shape)
                if len(y):
                    assert x.is_cuda == CUDA
                    diffs.append((x.cpu().float() - px.float()).abs().mean().item())
            print(f"val {mode} rank {rank}: shapes, labels OK; mean abs diff per batch "
                  f"{[round(d, 2) for d in diffs]}", flush=True)
print("OK", flush=True)
