"""recipes/common/imagenet_files.py: the synthetic ImageNet in the official archives' layout,
ImageFolder listing, and `prepare_imagenet` (official layout -> train/val by wnid + resized
copies), on real JPEG files written by PIL."""
import csv
import io
import json
import shutil
import sys
import tarfile
import tempfile
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


# ---------------------------------------------------------------------------------------------
# prepare_imagenet

SIZES = (20, 64)  # 20 is below every side (all resized); 64 leaves the smaller images as they are


def _copy(official: Path, to: Path) -> Path:
    shutil.copytree(official, to)
    return to


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and inf._STATE not in p.parts}


@pytest.fixture(scope="module")
def prepared(official, tmp_path_factory) -> tuple[Path, inf.PrepareReport]:
    """`official` prepared once with SIZES (read-only for the tests that use it)."""
    dest = tmp_path_factory.mktemp("prepared") / "imagenet"
    calls = []
    report = inf.prepare_imagenet(official, dest, sizes=SIZES, workers=2,
                                  progress=lambda *a: calls.append(a))
    report.calls = calls
    return dest, report


def test_prepare_sorts_flat_val_by_the_kaggle_csv_and_keeps_train(official, prepared):
    dest, report = prepared
    labels = _val_labels(official)
    wnids = sorted(p.name for p in (official / "train").iterdir())
    assert inf.list_images(dest / "val") == (
        sorted(((f"{labels[n]}/{n}", wnids.index(labels[n])) for n in labels),
               key=lambda s: (s[1], s[0])), wnids)
    assert inf.list_images(dest / "train") == inf.list_images(official / "train")
    for source in ["", "sz/20", "sz/64"]:
        for split in ("train", "val"):
            folder = inf.source_root(dest, source) / split
            assert sorted(p.name for p in folder.iterdir()) == wnids, folder
            assert len(inf.list_images(folder)[0]) == {"train": 24, "val": 12}[split]
    assert report.counts == {"train": 24, "val": 12, "sz/20/train": 24, "sz/20/val": 12,
                             "sz/64/train": 24, "sz/64/val": 12}
    assert (report.classes, report.sizes, report.quality, report.resample) == \
        (4, (20, 64), 90, "bicubic")
    assert report.written + report.skipped == 36 * 3 and report.skipped == 0
    assert report.calls[0] == (0, 36, "images") and report.calls[-1] == (36, 36, "images")
    assert [c[0] for c in report.calls] == sorted(c[0] for c in report.calls)


def test_prepare_full_size_files_are_hard_links_to_the_source(official, prepared):
    dest, report = prepared
    for rel, _ in inf.list_images(dest / "train")[0]:
        assert (dest / "train" / rel).stat().st_ino == (official / "train" / rel).stat().st_ino
    for name, wnid in _val_labels(official).items():
        assert (dest / "val" / wnid / name).samefile(official / "val" / name)
    small = sum(1 for p in (dest / "sz/64").rglob("*.JPEG") if p.stat().st_nlink > 1)
    assert report.linked == 36 + small and report.extracted == 0


def test_prepare_copies_full_size_files_across_filesystems(official, tmp_path):
    """/dev/shm (tmpfs) is another filesystem than tmp_path here: os.link fails with EXDEV."""
    if not Path("/dev/shm").is_dir() or Path("/dev/shm").stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a filesystem other than tmp_path's")
    dest = Path(tempfile.mkdtemp(dir="/dev/shm")) / "imagenet"
    try:
        report = inf.prepare_imagenet(official, dest, sizes=(64,), workers=2)
        full = sorted(dest.glob("[tv]*/*/*.JPEG"))
        assert len(full) == 36
        for rel, _ in inf.list_images(dest / "train")[0]:
            copy, source = dest / "train" / rel, official / "train" / rel
            assert copy.read_bytes() == source.read_bytes() and not copy.samefile(source)
        resized = [p for p in dest.glob("sz/64/*/*/*.JPEG")
                   if not p.samefile(dest / p.relative_to(dest / "sz/64"))]
        assert report.linked == 36 - len(resized)  # the small ones, linked within dest
        assert report.bytes_written == sum(p.stat().st_size for p in full + resized)
    finally:
        shutil.rmtree(dest.parent)


def test_prepare_resizes_the_shorter_side_exactly_and_keeps_small_images(prepared):
    dest, _ = prepared
    kept = resized = 0
    for split in ("train", "val"):
        for rel, _ in inf.list_images(dest / split)[0]:
            with Image.open(dest / split / rel) as im:
                w, h, mode = *im.size, im.mode
            for n in SIZES:
                out = dest / "sz" / str(n) / split / rel
                with Image.open(out) as small:
                    small.load()
                    if min(w, h) <= n:  # the file as it is: same bytes, same inode
                        assert out.samefile(dest / split / rel)
                        assert (small.size, small.mode) == ((w, h), mode)
                        kept += 1
                        continue
                    sw, sh = small.size
                    assert min(sw, sh) == n and small.mode == "RGB" and small.format == "JPEG"
                    assert (sw < sh) == (w < h) and (sw == sh) == (w == h)
                    assert abs(max(sw, sh) - max(w, h) * n / min(w, h)) <= 1
                    resized += 1
    small = sum(1 for p in dest.glob("[tv]*/*/*.JPEG") if min(Image.open(p).size) <= 64)
    assert kept == small and resized == 36 + 36 - small and 0 < small < 36


def test_prepare_keeps_an_image_whose_shorter_side_is_n_and_resizes_one_pixel_more(official,
                                                                                   tmp_path):
    src = _copy(official, tmp_path / "src")
    wnid = sorted(p.name for p in (src / "train").iterdir())[0]
    for name, size in (("edge.JPEG", (90, 64)), ("above.JPEG", (65, 90)), ("tiny.png", (9, 9))):
        Image.new("RGB", size, (200, 10, 10)).save(src / "train" / wnid / name)
    dest = tmp_path / "dest"
    inf.prepare_imagenet(src, dest, sizes=(64,), workers=1)
    out = dest / "sz/64/train" / wnid
    assert (out / "edge.JPEG").samefile(src / "train" / wnid / "edge.JPEG")
    assert (out / "tiny.png").samefile(src / "train" / wnid / "tiny.png")
    assert Image.open(out / "above.JPEG").size == (64, 89)  # 90 * 64 / 65 = 88.6
    assert inf.resized_size(65, 90, 64) == (64, 89) and inf.resized_size(90, 65, 64) == (89, 64)
    assert inf.resized_size(500, 375, 160) == (213, 160) and inf.resized_size(7, 7, 3) == (3, 3)


def test_prepare_converts_grayscale_and_cmyk_to_rgb_in_resized_copies(official, prepared):
    dest, _ = prepared
    odd = [p.relative_to(official) for p in sorted(official.rglob("*.JPEG"))
           if Image.open(p).mode != "RGB"]
    assert len(odd) == 4
    names = {p.name: p for p in (dest / "sz/20").rglob("*.JPEG")}
    for rel in odd:
        assert Image.open(names[rel.name]).mode == "RGB"


def test_prepare_second_run_writes_nothing(official, prepared, tmp_path):
    dest = tmp_path / "dest"
    first = inf.prepare_imagenet(official, dest, sizes=SIZES, workers=2)
    stamps = {p: p.stat().st_mtime_ns for p in dest.rglob("*.JPEG")}
    second = inf.prepare_imagenet(official, dest, sizes=SIZES, workers=2)
    assert (second.written, second.linked, second.bytes_written) == (0, 0, 0)
    assert second.skipped == first.written == 108 and second.counts == first.counts
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*.JPEG")} == stamps
    assert _tree(dest) == _tree(prepared[0])  # and the same files as the shared run's


def test_prepare_resumes_after_a_kill_and_leaves_no_temp_files(official, prepared, tmp_path):
    dest = tmp_path / "dest"
    shutil.copytree(prepared[0], dest, copy_function=shutil.copy2)
    gone = sorted(dest.glob("sz/20/train/*/*"))[:5] + sorted(dest.glob("val/*/*"))[:2] \
        + sorted(dest.glob("sz/64/val/*/*"))[-3:]
    for p in gone:
        p.unlink()
    # Killed between writing a temp file and its rename: a truncated JPEG under a temp name.
    stray = gone[0].with_name(gone[0].name + ".tmp")
    stray.write_bytes(prepared[0].joinpath(gone[0].relative_to(dest)).read_bytes()[:100])
    report = inf.prepare_imagenet(official, dest, sizes=SIZES, workers=2)
    assert report.written == 10 and report.skipped == 108 - 10
    assert _tree(dest) == _tree(prepared[0])
    assert not list(dest.rglob("*.tmp"))


def _tarred(official: Path, to: Path) -> Path:
    """The official layout with train/ as per-class tars (as in ILSVRC2012_img_train.tar)."""
    src = _copy(official, to)
    for folder in sorted((src / "train").iterdir()):
        with tarfile.open(folder.with_name(folder.name + ".tar"), "w") as tar:
            for f in sorted(folder.iterdir()):
                tar.add(f, arcname=f.name)
        shutil.rmtree(folder)
    return src


def test_prepare_unpacks_per_class_tars_once(official, prepared, tmp_path):
    src = _tarred(official, tmp_path / "src")
    dest = tmp_path / "dest"
    report = inf.prepare_imagenet(src, dest, sizes=SIZES, workers=2)
    assert report.extracted == 24 and report.counts == prepared[1].counts
    assert _tree(dest) == _tree(prepared[0])
    again = inf.prepare_imagenet(src, dest, sizes=SIZES, workers=2)
    assert (again.written, again.extracted, again.skipped) == (0, 0, 12 + 36 * 2)


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink", "hardlink", "nested"])
def test_prepare_refuses_a_hostile_tar_member_and_writes_nothing_outside(official, tmp_path,
                                                                        kind):
    src = _tarred(official, tmp_path / "src")
    outside = tmp_path / "outside" / "evil.JPEG"
    wnid = sorted(p.name[:-4] for p in (src / "train").iterdir())[1]
    good = (official / "train" / wnid / f"{wnid}_0.JPEG").read_bytes()
    names = {"dotdot": "../../../outside/evil.JPEG", "absolute": str(outside),
             "symlink": "link.JPEG", "hardlink": "hard.JPEG", "nested": "sub/evil.JPEG"}
    with tarfile.open(src / "train" / f"{wnid}.tar", "w") as tar:
        info = tarfile.TarInfo(f"{wnid}_0.JPEG")  # a good member first: not written either
        info.size = len(good)
        tar.addfile(info, io.BytesIO(good))
        info = tarfile.TarInfo(names[kind])
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, str(outside)
        elif kind == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, f"{wnid}_0.JPEG"
        info.size = 0 if kind in ("symlink", "hardlink") else len(good)
        tar.addfile(info, None if kind in ("symlink", "hardlink") else io.BytesIO(good))
    expected = {"dotdot": "would be written outside its class folder",
                "absolute": "would be written outside its class folder",
                "symlink": r"is not a regular file \(links are refused\)",
                "hardlink": r"is not a regular file \(links are refused\)",
                "nested": "is not a plain file name"}[kind]
    with pytest.raises(ValueError, match=rf"^1 per-class tars refused: .*{wnid}\.tar: member "
                                         rf"'.*' {expected}$") as caught:
        inf.prepare_imagenet(src, tmp_path / "dest", sizes=SIZES, workers=2)
    assert "\n" not in str(caught.value)
    assert not outside.exists() and not (tmp_path / "outside").exists()
    assert list((tmp_path / "dest" / "train" / wnid).iterdir()) == []
    allowed = (src, tmp_path / "dest", tmp_path / "ct-home")
    assert [p for p in tmp_path.rglob("*") if not any(p.is_relative_to(a) for a in allowed)
            and p not in allowed] == []


def test_prepare_blacklist_leaves_out_exactly_those_val_images(official, prepared, tmp_path):
    dest = tmp_path / "dest"
    shutil.copytree(prepared[0], dest)  # an earlier run without the blacklist: they go too
    blacklist = tmp_path / "ILSVRC2012_validation_blacklist.txt"
    blacklist.write_text("2\n7\n\n11\n")
    report = inf.prepare_imagenet(official, dest, sizes=SIZES, workers=2, blacklist=blacklist)
    assert report.blacklisted == 3 and report.counts["val"] == 9
    assert report.counts["sz/20/val"] == report.counts["sz/64/val"] == 9
    left_out = {"ILSVRC2012_val_00000002.JPEG", "ILSVRC2012_val_00000007.JPEG",
                "ILSVRC2012_val_00000011.JPEG"}
    for source in ["", "sz/20", "sz/64"]:
        names = {p.name for p in (inf.source_root(dest, source) / "val").rglob("*.JPEG")}
        assert names == set(_val_labels(official)) - left_out, source


def test_prepare_reads_two_column_labels_and_already_sorted_val(official, prepared, tmp_path):
    src = _copy(official, tmp_path / "flat")
    (src / inf.VAL_SOLUTION).unlink()
    labels = tmp_path / "val_labels.txt"
    labels.write_text("".join(f"{n} {w}\n" for n, w in sorted(_val_labels(official).items())))
    dest = tmp_path / "a"
    inf.prepare_imagenet(src, dest, sizes=SIZES, workers=1, labels=labels)
    assert _tree(dest) == _tree(prepared[0])
    # val/ already sorted into wnid folders needs no label file.
    for name, wnid in _val_labels(official).items():
        (src / "val" / wnid).mkdir(exist_ok=True)
        (src / "val" / name).rename(src / "val" / wnid / name)
    inf.prepare_imagenet(src, tmp_path / "b", sizes=SIZES, workers=2)
    assert _tree(tmp_path / "b") == _tree(prepared[0])


def test_prepare_reports_every_unreadable_image_after_doing_the_rest(official, tmp_path):
    src = _copy(official, tmp_path / "src")
    wnid = sorted(p.name for p in (src / "train").iterdir())[2]
    truncated = src / "train" / wnid / f"{wnid}_3.JPEG"
    truncated.write_bytes(truncated.read_bytes()[:300])
    (src / "train" / wnid / f"{wnid}_4.JPEG").write_bytes(b"not a jpeg")
    with pytest.raises(ValueError) as caught:
        inf.prepare_imagenet(src, tmp_path / "dest", sizes=SIZES, workers=2)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"2 unreadable images: train/{wnid}/{wnid}_3.JPEG (OSError: ")
    assert f", train/{wnid}/{wnid}_4.JPEG (UnidentifiedImageError: " in message
    assert len(list((tmp_path / "dest" / "sz/20").rglob("*.JPEG"))) == 36 - 2


def test_prepare_never_carries_a_link_from_src_into_dest_F48(official, tmp_path):
    """F48: a symlink `x.JPEG -> ~/.ssh/id_ed25519` in SRC ended up as the same link in DEST
    (os.link linked the link; the copy fallback would have copied the key's bytes). Links in
    SRC, to a file or as a class folder, in train and in val, are skipped: none reaches DEST,
    and the report counts them."""
    src = _copy(official, tmp_path / "src")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\nPRIVATE-F48\n")
    (home / "photos").mkdir()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(home / "photos" / "me.JPEG")
    wnids = sorted(p.name for p in (src / "train").iterdir())
    (src / "train" / wnids[0] / "x.JPEG").symlink_to(key)
    (src / "train" / wnids[1] / "y.JPEG").symlink_to(src / "train" / wnids[0] / f"{wnids[0]}_1.JPEG")
    (src / "train" / "n99999999").symlink_to(home / "photos", target_is_directory=True)
    (src / "val" / "ILSVRC2012_val_00000999.JPEG").symlink_to(key)
    dest = tmp_path / "dest"
    report = inf.prepare_imagenet(src, dest, sizes=(20,), workers=2)
    assert report.links_skipped == 4 and report.classes == 4
    assert report.counts["train"] == 24 and report.counts["val"] == 12
    links = [p for p in dest.rglob("*") if p.is_symlink()]
    assert links == []
    for path in dest.rglob("*"):
        if path.is_file():
            assert b"PRIVATE-F48" not in path.read_bytes(), path
            assert not path.samefile(home / "photos" / "me.JPEG")
    from cloudtrain.catalog_views import prepare_report

    said = prepare_report(report)
    assert "4 links in the source skipped (a link is never carried into the prepared " \
           "folder)" in said, said


def test_prepare_refuses_to_decode_more_pixels_than_a_worker_may_hold_F48(official, tmp_path):
    """F48: a 144 Mpx PNG of a few hundred KB decoded with only Pillow's warning (about
    0.5 GB as RGB, then NumPy's and OpenCV's copies, in every worker). An image of more
    pixels than the bound (at most Pillow's own 89 Mpx, less where a worker's share of this
    machine's memory is smaller) is counted unreadable before it is decoded, and said so."""
    src = _copy(official, tmp_path / "src")
    wnid = sorted(p.name for p in (src / "train").iterdir())[1]
    big = src / "train" / wnid / f"{wnid}_big.JPEG"  # a PNG named .JPEG, as in the audit
    Image.new("1", (12000, 12000)).save(big, format="PNG")
    assert big.stat().st_size < 1_000_000
    bound = inf.max_pixels(workers=2)
    assert 16_000_000 <= bound <= Image.MAX_IMAGE_PIXELS
    with pytest.raises(ValueError) as caught:
        inf.prepare_imagenet(src, tmp_path / "dest", sizes=(20,), workers=2)
    message = str(caught.value)
    assert message == (f"1 unreadable images: train/{wnid}/{wnid}_big.JPEG (ValueError: 144.0 "
                       f"Mpx, more than the {bound / 1e6:.1f} Mpx a worker may decode here)")
    # a smaller bound, as on a machine with less memory per worker: larger images go too
    with pytest.raises(ValueError, match=r"^\d+ unreadable images: .* Mpx, more than the 0.0 "
                                         r"Mpx a worker may decode here\)"):
        inf.prepare_imagenet(src, tmp_path / "dest2", sizes=(20,), workers=2,
                             pixel_limit=1000)


def _error(tmp_path, official, case):
    """Set up one bad input; returns the prepare_imagenet kwargs."""
    src = _copy(official, tmp_path / "src")
    kwargs = dict(src=src, dest=tmp_path / "dest")
    if case == "src missing":
        kwargs["src"] = tmp_path / "nope"
    elif case == "no train folder":
        shutil.rmtree(src / "train")
    elif case == "val image with no label":
        lines = (src / inf.VAL_SOLUTION).read_text().splitlines()
        (src / inf.VAL_SOLUTION).write_text("\n".join(
            line for line in lines if not line.startswith("ILSVRC2012_val_00000005,")) + "\n")
    elif case == "unknown wnid":
        labels = tmp_path / "labels.txt"
        rows = sorted(_val_labels(official).items())
        rows[3] = (rows[3][0], "n99999999")
        labels.write_text("".join(f"{n} {w}\n" for n, w in rows))
        kwargs["labels"] = labels
    elif case == "dest inside src":
        kwargs["dest"] = src / "prepared"
    elif case == "no label file":
        (src / inf.VAL_SOLUTION).unlink()
    elif case == "bad blacklist":
        (tmp_path / "bl.txt").write_text("12\nseven\n\u00b2\n")
        kwargs["blacklist"] = tmp_path / "bl.txt"
    return kwargs


@pytest.mark.parametrize("case, message", [
    ("src missing", r".*/nope: no such folder"),
    ("no train folder", r".*/src has no train/ folder \(expected train/<wnid>/\*\.JPEG or "
                        r"train/<wnid>\.tar\)"),
    ("val image with no label", r"val images with no label in .*/src/LOC_val_solution\.csv: "
                                r"ILSVRC2012_val_00000005\.JPEG"),
    ("unknown wnid", r".*/labels\.txt names wnids with no train class: n99999999"),
    ("dest inside src", r"dest .*/src/prepared is inside src .*/src; choose a folder outside it"),
    ("no label file", r".*/src/val is flat but there is no label file "
                      r".*/src/LOC_val_solution\.csv \(give --labels\)"),
    ("bad blacklist", r".*/bl\.txt line 2: 'seven' is not an image number"),
])
def test_prepare_bad_input_is_a_one_line_value_error_and_writes_nothing(official, tmp_path,
                                                                        case, message):
    kwargs = _error(tmp_path, official, case)
    with pytest.raises(ValueError, match=rf"^{message}$") as caught:
        inf.prepare_imagenet(**kwargs, sizes=SIZES, workers=1)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "dest").exists() and not (tmp_path / "src" / "prepared").exists()
