"""`prepare_imagenet(max_sides=(500,))`: FFCV's copies (max/500, what `write_imagenet.sh 500
0.50 90` writes, JPEG-only), on real JPEGs in the official layout, some larger than 500 px and
some smaller, grayscale and CMYK among them. The sizes are checked against FFCV's rule written
out here, the pixels against OpenCV's INTER_AREA, the quality against the JPEG standard's
quantization tables scaled to 90 (read back from the files)."""
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
from common import imagenet_files as inf  # noqa: E402

cv2 = pytest.importorskip("cv2", reason="opencv-python-headless (the recipes extra)")

SIDE = 500
# classes 3 x (4 train + 2 val); sides 200..640 px: 9 of the 18 are longer than 500 px
OFFICIAL = dict(classes=3, train_per_class=4, val_per_class=2, seed=5, min_side=200,
                max_side=640)

# ITU T.81 Annex K, tables K.1 and K.2 (row-major), and libjpeg's jpeg_quality_scaling
LUMA = [16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
        14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
        18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
        49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99]
CHROMA = [17, 18, 24, 47, 99, 99, 99, 99, 18, 21, 26, 66, 99, 99, 99, 99,
          24, 26, 56, 99, 99, 99, 99, 99, 47, 66, 99, 99, 99, 99, 99, 99] + [99] * 32


def ijg_table(base: list[int], quality: int) -> list[int]:
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return [min(255, max(1, (b * scale + 50) // 100)) for b in base]


def ffcv_size(width: int, height: int) -> tuple[int, int]:
    """ffcv/fields/rgb_image.py resizer, written out: (ratio * size).astype(int) if ratio < 1."""
    ratio = SIDE / np.array([width, height]).max()
    if ratio >= 1:
        return width, height
    new = (ratio * np.array([width, height])).astype(int)
    return int(new[0]), int(new[1])


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("official")
    inf.write_synthetic_official(root, **OFFICIAL)
    return root


@pytest.fixture(scope="module")
def prepared(official, tmp_path_factory):
    dest = tmp_path_factory.mktemp("prepared") / "imagenet"
    return dest, inf.prepare_imagenet(official, dest, sizes=(160,), max_sides=(SIDE,), workers=2)


def _pairs(dest: Path):
    """(full-size file, its max/500 copy) for every prepared image."""
    for split in ("train", "val"):
        for rel, _ in inf.list_images(dest / split)[0]:
            yield dest / split / rel, dest / inf.capped_source(SIDE) / split / rel


def test_capped_copies_have_ffcvs_sizes_and_are_all_rgb_jpegs(prepared):
    dest, report = prepared
    assert inf.capped_source(SIDE) == "max/500"
    assert report.counts["max/500/train"] == 12 and report.counts["max/500/val"] == 6
    assert report.max_sides == (500,) and report.capped_resample == "OpenCV INTER_AREA"
    larger = smaller = 0
    for full, copy in _pairs(dest):
        with Image.open(full) as a, Image.open(copy) as b:
            b.load()
            assert b.size == ffcv_size(*a.size) == inf.capped_size(*a.size, SIDE), full.name
            assert (b.format, b.mode) == ("JPEG", "RGB")
            assert not copy.samefile(full)  # every image re-encoded, the small ones too
            larger += max(a.size) > SIDE
            smaller += max(a.size) <= SIDE
            assert max(b.size) <= SIDE
    assert larger >= 3 and smaller >= 3
    # FFCV truncates: 760 x 333 -> 500 x 219 (219.07), 333 x 761 -> 218 x 500 (218.79)
    assert inf.capped_size(760, 333, 500) == (500, 219)
    assert inf.capped_size(333, 761, 500) == (218, 500)
    assert inf.capped_size(500, 20, 500) == (500, 20) and inf.capped_size(9000, 5, 500) == (500, 1)


def test_capped_copies_are_quality_90_with_4_2_0_chroma(prepared):
    dest, _ = prepared
    for _, copy in _pairs(dest):
        with Image.open(copy) as b:
            tables = {k: list(v) for k, v in b.quantization.items()}
            assert tables == {0: ijg_table(LUMA, 90), 1: ijg_table(CHROMA, 90)}, copy.name
            assert tables[0] != ijg_table(LUMA, 89) and tables[0] != ijg_table(LUMA, 91)
            assert JpegImagePlugin.get_sampling(b) == 2  # 4:2:0, cv2.imencode's default


def test_capped_files_are_ffcvs_encoding_of_inter_area_byte_for_byte(prepared):
    """Each copy is, byte for byte, FFCV's rgb_image.py steps done here by hand: PIL's RGB
    conversion (ImageFolder's loader), cv2.resize INTER_AREA to FFCV's truncated size where
    the longer side exceeds 500, RGB -> BGR, cv2.imencode at quality 90."""
    dest, _ = prepared
    resized = 0
    for full, copy in _pairs(dest):
        with Image.open(full) as a:
            rgb = np.asarray(a.convert("RGB"))
        size = ffcv_size(rgb.shape[1], rgb.shape[0])
        if size != (rgb.shape[1], rgb.shape[0]):
            rgb = cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)
            resized += 1
        ok, ref = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                               [int(cv2.IMWRITE_JPEG_QUALITY), 90])
        assert ok and copy.read_bytes() == ref.tobytes(), copy.name
    assert resized == 9


def test_grayscale_and_cmyk_sources_become_rgb_copies(official, prepared):
    dest, _ = prepared
    odd = [p.name for p in sorted(official.rglob("*.JPEG")) if Image.open(p).mode != "RGB"]
    assert len(odd) == 4
    names = {p.name: p for p in (dest / "max/500").rglob("*.JPEG")}
    assert all(Image.open(names[n]).mode == "RGB" for n in odd)


def test_a_second_run_writes_nothing_and_a_killed_one_is_finished(official, prepared, tmp_path):
    dest = tmp_path / "dest"
    shutil.copytree(prepared[0], dest)
    again = inf.prepare_imagenet(official, dest, sizes=(160,), max_sides=(SIDE,), workers=1)
    assert (again.written, again.bytes_written) == (0, 0)
    assert again.skipped == prepared[1].written and again.counts == prepared[1].counts
    # a run killed mid-way: two copies missing, one half-written temp file left
    copies = sorted((dest / "max/500").rglob("*.JPEG"))
    gone = [copies[0], copies[-1]]
    reference = {p: p.read_bytes() for p in gone}
    for p in gone:
        p.unlink()
    (gone[0].parent / (gone[0].name + ".tmp")).write_bytes(b"\xff\xd8 half")
    resumed = inf.prepare_imagenet(official, dest, sizes=(160,), max_sides=(SIDE,), workers=1)
    assert resumed.written == 2 and resumed.skipped == prepared[1].written - 2
    assert {p: p.read_bytes() for p in gone} == reference
    assert not list(dest.rglob("*.tmp"))


def test_the_capped_tree_can_be_added_to_an_existing_one(official, tmp_path):
    """A tree prepared without max/500 gains it on a later run; nothing else is rewritten."""
    dest = tmp_path / "dest"
    first = inf.prepare_imagenet(official, dest, sizes=(160,), workers=1)
    stamps = {p: p.stat().st_mtime_ns for p in dest.rglob("*.JPEG")}
    second = inf.prepare_imagenet(official, dest, sizes=(160,), max_sides=(SIDE,), workers=1)
    assert second.written == 18 and second.skipped == first.written
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


def test_bad_max_sides_are_one_line_and_write_nothing(official, tmp_path):
    with pytest.raises(ValueError, match=r"^max_sides must be positive pixel counts, got "
                                         r"\(0, 500\)$"):
        inf.prepare_imagenet(official, tmp_path / "d", max_sides=(500, 0))
    assert not (tmp_path / "d").exists()
