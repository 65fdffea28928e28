"""recipes/common/imagenet_files.py: the synthetic ImageNet in the official archives' layout,
ImageFolder listing, and `prepare_imagenet` (official layout -> train/val by wnid + resized
copies), on real JPEG files written by PIL."""
import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
from common import imagenet_files as inf  # noqa: E402

SMALL = dict(classes=4, train_per_class=6, val_per_class=3, seed=3, min_side=24, max_side=80)


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> Path:
    """One small synthetic dataset in the official layout, shared (read-only) by the module."""
    root = tmp_path_factory.mktemp("official")
    inf.write_synthetic_official(root, **SMALL)
    return root


def _val_labels(root: Path) -> dict[str, str]:
    with open(root / inf.VAL_SOLUTION, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["ImageId", "PredictionString"]
    return {image_id + ".JPEG": boxes.split()[0] for image_id, boxes in rows[1:]}


# ---------------------------------------------------------------------------------------------
# layout helpers

def test_source_names_map_to_folders_inside_the_dataset_root():
    assert inf.resized_source(160) == "sz/160"
    assert inf.source_root(Path("/d/imagenet"), "") == Path("/d/imagenet")
    assert inf.source_root(Path("/d/imagenet"), "sz/160") == Path("/d/imagenet/sz/160")
    assert inf.source_root(Path("/d"), inf.resized_source(352)) == Path("/d/sz/352")


def test_list_images_is_imagefolder_order_and_skips_other_files(tmp_path):
    tmp_path = tmp_path / "folder"
    for rel in ["b/2.JPEG", "b/1.jpg", "a/z.PNG", "a/y.jpeg", "a/notes.txt", "a/sub/x.JPEG",
                "c/readme", ".hidden/q.JPEG"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    (tmp_path / "stray.JPEG").write_bytes(b"")  # a file at the top is no class
    samples, classes = inf.list_images(tmp_path)
    assert classes == ["a", "b", "c"]
    assert samples == [("a/sub/x.JPEG", 0), ("a/y.jpeg", 0), ("a/z.PNG", 0),
                       ("b/1.jpg", 1), ("b/2.JPEG", 1)]


def test_list_images_of_a_missing_folder_is_a_one_line_value_error(tmp_path):
    with pytest.raises(ValueError, match=r"^.*nope: no such folder$"):
        inf.list_images(tmp_path / "nope")


# ---------------------------------------------------------------------------------------------
# the synthetic generator

def test_synthetic_official_layout_names_and_counts(official):
    counts = inf.write_synthetic_official(official, **SMALL)  # marker present: returns at once
    wnids = counts["wnids"]
    assert counts == {"classes": 4, "train": 24, "val": 12, "wnids": wnids}
    assert wnids == sorted(wnids) and len(set(wnids)) == 4
    assert all(len(w) == 9 and w[0] == "n" and w[1:].isdigit() for w in wnids)
    assert sorted(p.name for p in (official / "train").iterdir()) == wnids
    for w in wnids:
        assert sorted(p.name for p in (official / "train" / w).iterdir()) == \
            sorted(f"{w}_{k}.JPEG" for k in range(6))
    assert sorted(p.name for p in (official / "val").iterdir()) == \
        [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 13)]
    labels = _val_labels(official)
    assert sorted(labels) == sorted(p.name for p in (official / "val").iterdir())
    assert sorted(labels.values()) == sorted(wnids * 3)  # 3 per class
    assert list(labels.values()) != sorted(labels.values())  # classes shuffled over numbers


def test_synthetic_jpegs_are_valid_varied_and_include_grayscale_and_cmyk(official):
    sizes, modes = [], {"train": [], "val": []}
    for split in ("train", "val"):
        for path in sorted((official / split).rglob("*.JPEG")):
            with Image.open(path) as im:
                assert im.format == "JPEG"
                im.load()  # decodes the whole file: a truncated one raises here
                modes[split].append(im.mode)
                sizes.append(im.size)
    for split in ("train", "val"):
        assert modes[split].count("L") == 1 and modes[split].count("CMYK") == 1
        assert modes[split].count("RGB") == len(modes[split]) - 2
    assert all(24 <= min(s) and max(s) <= 80 for s in sizes)
    assert all(0.5 <= w / h <= 2.0 for w, h in sizes)
    assert any(w > h for w, h in sizes) and any(w < h for w, h in sizes)
    assert any(w == h for w, h in sizes)
    assert len(set(sizes)) > len(sizes) // 2


def test_synthetic_classes_are_separable_by_mean_colour(official):
    """Learnable: the nearest per-class mean colour (from train) labels every val image."""
    def mean_rgb(path):
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"), dtype=np.float64).mean(axis=(0, 1))

    samples, wnids = inf.list_images(official / "train")
    means = np.zeros((len(wnids), 3))
    for rel, c in samples:
        means[c] += mean_rgb(official / "train" / rel) / 6
    assert np.linalg.norm(means[:, None] - means[None], axis=2)[~np.eye(4, dtype=bool)].min() > 40
    labels = _val_labels(official)
    rgb_val = [n for n in sorted(labels) if Image.open(official / "val" / n).mode == "RGB"]
    guesses = [wnids[int(np.argmin(np.linalg.norm(means - mean_rgb(official / "val" / n),
                                                  axis=1)))] for n in rgb_val]
    assert guesses == [labels[n] for n in rgb_val]


def test_synthetic_is_deterministic_and_a_rerun_writes_nothing(tmp_path, official):
    again = tmp_path / "again"
    assert inf.write_synthetic_official(again, **SMALL)["wnids"] == \
        inf.write_synthetic_official(official, **SMALL)["wnids"]
    files = sorted(p.relative_to(official) for p in official.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for rel in files:
        assert (again / rel).read_bytes() == (official / rel).read_bytes(), rel
    stamps = {p: p.stat().st_mtime_ns for p in again.rglob("*.JPEG")}
    inf.write_synthetic_official(again, **SMALL)
    assert {p: p.stat().st_mtime_ns for p in again.rglob("*.JPEG")} == stamps
    assert json.loads((again / ".complete").read_text())["seed"] == 3


def test_synthetic_other_parameters_rewrite_and_an_interrupted_run_is_redone(tmp_path):
    root = tmp_path / "d"
    first = inf.write_synthetic_official(root, **{**SMALL, "classes": 3})
    second = inf.write_synthetic_official(root, **SMALL)
    assert len(list((root / "train").iterdir())) == 4 and first["wnids"] != second["wnids"]
    # A run killed mid-way leaves .generating and no .complete: the next call starts over.
    (root / ".complete").rename(root / ".generating")
    (root / "train" / second["wnids"][0] / f"{second['wnids'][0]}_0.JPEG").unlink()
    inf.write_synthetic_official(root, **SMALL)
    assert len(list((root / "train").rglob("*.JPEG"))) == 24 and (root / ".complete").exists()
    assert not (root / ".generating").exists()


def test_synthetic_refuses_a_root_with_data_it_did_not_write(tmp_path):
    (tmp_path / "train" / "n00000001").mkdir(parents=True)
    with pytest.raises(ValueError, match="did not write; refusing to overwrite it$"):
        inf.write_synthetic_official(tmp_path, **SMALL)
    assert (tmp_path / "train" / "n00000001").is_dir()
