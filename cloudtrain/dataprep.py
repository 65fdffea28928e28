"""`cloudtrain data prepare`: datasets from their official archives into the layout recipes read.

The work is done by the bundled recipes' own code (recipes/common/imagenet_files.py), so the
layout the prepare step writes and the one the imagenet recipe reads are defined in one place.
This module finds that code, checks that Pillow and numpy are there (and OpenCV, for FFCV's
max/<N> copies), and turns its ValueError and OSError into cloudtrain's one-line errors.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from .errors import CloudtrainError, MissingDependency, NotFound, UsageError
from .recipes import BUNDLED

DATASETS = ("imagenet",)
INSTALL = "install them with: pip install pillow numpy"
CV2 = "opencv-python-headless"


def _imagenet_files(opencv: bool = False):
    """recipes/common/imagenet_files.py, imported as `common.imagenet_files` the way recipes
    import it (so the prepare step's worker processes can find its functions by name)."""
    missing = []
    needed = (("Pillow", "PIL"), ("numpy", "numpy")) + ((("OpenCV", "cv2"),) if opencv else ())
    for name, module in needed:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingDependency(f"data prepare needs {' and '.join(missing)}, which this Python "
                                f"({sys.executable}) does not have; {INSTALL}"
                                + (f" {CV2}" if "OpenCV" in missing else ""))
    if str(BUNDLED) not in sys.path:
        sys.path.insert(0, str(BUNDLED))
    from common import imagenet_files

    return imagenet_files


def _one_line(text: object) -> str:
    return (str(text).splitlines() or [""])[0]


def prepare(dataset: str, src, dest, *, sizes=(160, 352), quality: int = 90,
            workers: int | None = None, blacklist=None, labels=None, progress=None,
            max_sides=()):
    """Prepare `dataset` from the extracted official archives at `src` into `dest`; returns the
    dataset's report (for imagenet: imagenet_files.PrepareReport). Raises cloudtrain errors."""
    if dataset not in DATASETS:
        raise UsageError(f"unknown dataset {dataset!r}; known datasets: {', '.join(DATASETS)}")
    files = _imagenet_files(opencv=bool(max_sides))
    src, dest = Path(src).expanduser(), Path(dest).expanduser()
    if not src.is_dir():
        raise NotFound(f"{src}: no such folder")
    for what, path in (("--blacklist", blacklist), ("--labels", labels)):
        if path is not None and not Path(path).expanduser().is_file():
            raise NotFound(f"{what} {path}: no such file")
    try:
        return files.prepare_imagenet(
            src, dest, sizes=sizes, quality=quality, workers=workers,
            blacklist=Path(blacklist).expanduser() if blacklist else None,
            labels=Path(labels).expanduser() if labels else None, progress=progress,
            max_sides=max_sides)
    except ValueError as exc:
        raise UsageError(_one_line(exc)) from exc
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        raise CloudtrainError(f"{exc.strerror or _one_line(exc)}{where}",
                              hint="check the space and permissions of DEST, then run the "
                                   "same command again: it goes on where it stopped") from exc


def parse_sizes(text: str, option: str = "--sizes", example: str = "160,352"
                ) -> tuple[int, ...]:
    """--sizes "160,352" -> (160, 352); "" -> () (full size only)."""
    sizes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not part.isdigit() or not 1 <= int(part) <= 4096:
            raise UsageError(f"{option}: {part!r} is not a size in pixels (1..4096); "
                             f"give e.g. {option} {example}")
        sizes.append(int(part))
    return tuple(sizes)
