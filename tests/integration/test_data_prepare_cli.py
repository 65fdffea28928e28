"""`cloudtrain data prepare imagenet SRC DEST`: the installed command in its own process, on a
small synthetic ImageNet in the official layout (real JPEG files)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "recipes"))
from common import imagenet_files  # noqa: E402

CLOUDTRAIN = Path(sys.executable).parent / "cloudtrain"  # the console script pip installed


def run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(CLOUDTRAIN), *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=120, cwd=REPO)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture
def official(tmp_path) -> tuple[Path, list[str]]:
    root = tmp_path / "ILSVRC2012"
    counts = imagenet_files.write_synthetic_official(root, classes=3, train_per_class=4,
                                                     val_per_class=2, seed=1, min_side=24,
                                                     max_side=64)
    return root, counts["wnids"]


def test_prepare_imagenet_writes_the_tree_and_a_second_run_writes_nothing(official, tmp_path):
    src, wnids = official
    dest = tmp_path / "imagenet"
    (tmp_path / "blacklist.txt").write_text("3\n")
    args = ["data", "prepare", "imagenet", str(src), str(dest), "--sizes", "32",
            "--workers", "2", "--quality", "75", "--blacklist", str(tmp_path / "blacklist.txt")]
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:6] == [f"prepared {dest}: 3 classes",
                         "FOLDER       IMAGES",
                         "train        12",
                         "val          5",
                         "sz/32/train  12",
                         "sz/32/val    5"]
    assert lines[6] == "1 blacklisted validation images left out"
    assert re.fullmatch(r"wrote 34 files \(\d+ hard links, 0 from tars, \d+\.\d MB\); 0 were "
                        r"already there; \d+\.\d\ds", lines[7]), lines[7]
    assert lines[8:] == ["resized copies: shorter side 32 px, bicubic, JPEG quality 75; smaller "
                         "images kept as they are"]
    for folder in ("train", "val", "sz/32/train", "sz/32/val"):
        samples, classes = imagenet_files.list_images(dest / folder)
        assert classes == wnids and len(samples) == (12 if folder.endswith("train") else 5)
    assert not list(dest.rglob("ILSVRC2012_val_00000003.JPEG"))

    again = run(*args)
    assert again.returncode == 0, again.stderr
    assert re.fullmatch(r"wrote 0 files \(0 hard links, 0 from tars, 0\.0 MB\); 34 were already "
                        r"there; \d+\.\d\ds", again.stdout.splitlines()[7])


@pytest.mark.parametrize("case", ["missing src", "unknown dataset", "no labels", "bad sizes"])
def test_prepare_bad_input_is_one_line_on_stderr(official, tmp_path, case):
    src, _ = official
    dest = tmp_path / "imagenet"
    args = {"missing src": ["imagenet", str(tmp_path / "nope"), str(dest)],
            "unknown dataset": ["cifar10", str(src), str(dest)],
            "no labels": ["imagenet", str(src), str(dest)],
            "bad sizes": ["imagenet", str(src), str(dest), "--sizes", "160,big"]}[case]
    if case == "no labels":
        (src / imagenet_files.VAL_SOLUTION).unlink()
    proc = run("data", "prepare", *args)
    expected = {
        "missing src": f"Error: {tmp_path / 'nope'}: no such folder",
        "unknown dataset": "Error: unknown dataset 'cifar10'; known datasets: imagenet",
        "no labels": f"Error: {src / 'val'} is flat but there is no label file "
                     f"{src / 'LOC_val_solution.csv'} (give --labels)",
        "bad sizes": "Error: --sizes: 'big' is not a size in pixels (1..4096); give e.g. "
                     "--sizes 160,352"}[case]
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", expected + "\n")
    assert not dest.exists()


def test_data_prepare_help_shows_an_example():
    proc = run("data", "prepare", "--help")
    assert proc.returncode == 0
    assert "cloudtrain data prepare imagenet ~/ILSVRC2012 /data/imagenet" in proc.stdout


def prepare_without(module: str, *args: str) -> subprocess.CompletedProcess:
    """`data prepare imagenet ARGS` through the real CLI entry point in a Python where
    `import <module>` fails."""
    code = (f"import sys; sys.modules[{module!r}] = None; from cloudtrain.cli import main; "
            f"main(['data', 'prepare', 'imagenet', *{list(args)!r}])")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def test_prepare_without_pillow_names_the_install_command(official, tmp_path):
    src, _ = official
    proc = prepare_without("PIL", str(src), str(tmp_path / "out"))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (f"Error: data prepare needs Pillow, which this Python "
                           f"({sys.executable}) does not have; install them with: pip install pillow "
                           "numpy\n")
    assert not (tmp_path / "out").exists()


def test_ctrl_c_stops_cleanly_and_the_next_run_finishes_the_job(tmp_path):
    """SIGINT mid-run: exit 130 with one line, every file already written is whole, no temp
    files; the same command again writes exactly what is missing."""
    from PIL import Image

    src, dest = tmp_path / "ILSVRC2012", tmp_path / "imagenet"
    imagenet_files.write_synthetic_official(src, classes=2, train_per_class=60, val_per_class=5,
                                            seed=2, min_side=200, max_side=400)
    args = ["data", "prepare", "imagenet", str(src), str(dest), "--sizes", "64,128,192",
            "--workers", "1"]
    proc = subprocess.Popen([str(CLOUDTRAIN), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 60
    while not any((dest / "sz/192/train").rglob("*.JPEG")) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err.strip()) == (130, "", "interrupted")
    made = list(dest.glob("sz/*/*/*/*.JPEG"))
    assert 0 < len(made) < 130 * 3 and not list(dest.rglob("*.tmp"))
    for path in made:
        with Image.open(path) as image:
            image.load()  # a truncated JPEG raises here
    there = len(made) + len(list(dest.glob("[tv]*/*/*.JPEG")))
    again = run(*args)
    assert again.returncode == 0, again.stderr
    wrote = re.search(r"^wrote (\d+) files .*; (\d+) were already there", again.stdout, re.M)
    assert (int(wrote[1]), int(wrote[2])) == (130 * 4 - there, there)
    assert len(list(dest.glob("sz/*/*/*/*.JPEG"))) == 130 * 3


def test_prepare_max_sides_writes_ffcvs_copies_and_says_how(official, tmp_path):
    pytest.importorskip("cv2", reason="opencv-python-headless (the recipes extra)")
    src, wnids = official
    dest = tmp_path / "imagenet"
    proc = run("data", "prepare", "imagenet", str(src), str(dest), "--sizes", "",
               "--max-sides", "40", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[4:6] == ["max/40/train  12", "max/40/val    6"]
    assert lines[-1] == ("FFCV's copies (max/): longer side at most 40 px, OpenCV INTER_AREA, "
                         "every image a JPEG at quality 90")
    assert imagenet_files.list_images(dest / "max/40/val")[1] == wnids


def test_prepare_max_sides_bad_value_or_no_opencv_is_one_line(official, tmp_path):
    src, _ = official
    dest = tmp_path / "imagenet"
    proc = run("data", "prepare", "imagenet", str(src), str(dest), "--max-sides", "500,big")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", "Error: --max-sides: 'big' is not a size in pixels (1..4096); give e.g. "
               "--max-sides 500\n")
    proc = prepare_without("cv2", str(src), str(dest), "--max-sides", "500")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (f"Error: data prepare needs OpenCV, which this Python "
                           f"({sys.executable}) does not have; install them with: pip install "
                           "pillow numpy opencv-python-headless\n")
    assert not dest.exists()
