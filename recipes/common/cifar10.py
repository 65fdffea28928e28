"""CIFAR-10 in its on-disk python format: a reader, a writer, and a learnable synthetic stand-in.

The format (https://www.cs.toronto.edu/~kriz/cifar.html), folder `cifar-10-batches-py/`:
  data_batch_1 .. data_batch_5, test_batch   pickles of dicts with bytes keys:
      b'data'        uint8 (N, 3072): per image the red, green, blue 32x32 planes, each row-major
      b'labels'      list of N ints in 0..9
      b'batch_label' bytes, e.g. b'training batch 1 of 5'
      b'filenames'   list of N bytes
  batches.meta      {b'label_names': [10 bytes], b'num_cases_per_batch': int, b'num_vis': 3072}

`read_cifar10` returns uint8 images as NHWC numpy arrays plus int64 labels. Real data comes
through torchvision's downloader (which checks the archive's md5) into the data dir and is then
read with the same reader; synthetic data is *written* in the same format first, so both paths
exercise the same code. A download that fails ends the recipe with one line saying why and what
to do instead (`DownloadFailed`), not a traceback.
"""
from __future__ import annotations

import os
import pickle
import shutil
import socket
import urllib.error
import zipfile
from pathlib import Path

import numpy as np

DATA_DIR_ENV = "CLOUDTRAIN_DATA_DIR"
DEFAULT_DATA_DIR = "~/.cloudtrain/data"
URL_ENV = "CLOUDTRAIN_CIFAR10_URL"  # a mirror of cifar-10-python.tar.gz (same md5), or a test's
ARCHIVE = "cifar-10-python.tar.gz"
DOWNLOAD_TIMEOUT_S = 60  # per connect or read: a network that drops packets fails, not hangs
FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
LABEL_NAMES = ("airplane", "automobile", "bird", "cat", "deer",
               "dog", "frog", "horse", "ship", "truck")


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """The dataset cache: the flag if given, else $CLOUDTRAIN_DATA_DIR, else ~/.cloudtrain/data."""
    return Path(override or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR).expanduser()


# ---------------------------------------------------------------------------------------------
# Reader and writer

def _get(d: dict, key: str):
    # The real files are Python 2 pickles: loaded with encoding='bytes' their keys are bytes.
    return d[key.encode()] if key.encode() in d else d[key]


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    flat = np.asarray(_get(d, "data"), dtype=np.uint8)
    if flat.ndim != 2 or flat.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: data has shape {flat.shape}, expected (N, 3072)")
    images = flat.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # planes -> NHWC
    labels = np.asarray(_get(d, "labels"), dtype=np.int64)
    if len(labels) != len(images):
        raise ValueError(f"{path}: {len(images)} images but {len(labels)} labels")
    return np.ascontiguousarray(images), labels


def read_cifar10(folder: str | os.PathLike) -> dict:
    """Read a `cifar-10-batches-py` folder: {'train': (x, y), 'test': (x, y), 'classes': [...]}."""
    folder = Path(folder)
    parts = [_read_batch(folder / name) for name in TRAIN_FILES]
    x_train = np.concatenate([x for x, _ in parts])
    y_train = np.concatenate([y for _, y in parts])
    x_test, y_test = _read_batch(folder / TEST_FILE)
    with open(folder / META_FILE, "rb") as f:
        meta = pickle.load(f, encoding="bytes")
    classes = [n.decode() if isinstance(n, bytes) else n for n in _get(meta, "label_names")]
    return {"train": (x_train, y_train), "test": (x_test, y_test), "classes": classes}


def _write_batch(path: Path, images: np.ndarray, labels: np.ndarray, batch_label: str, first: int):
    planes = np.ascontiguousarray(images.transpose(0, 3, 1, 2))  # NHWC -> N, RGB planes
    flat = planes.reshape(len(images), -1)
    d = {
        b"batch_label": batch_label.encode(),
        b"labels": [int(v) for v in labels],
        b"data": flat.astype(np.uint8),
        b"filenames": [f"synthetic_{first + i:06d}.png".encode() for i in range(len(images))],
    }
    with open(path, "wb") as f:
        pickle.dump(d, f, protocol=2)


def write_cifar10(folder: str | os.PathLike, train: tuple, test: tuple,
                  classes=LABEL_NAMES) -> Path:
    """Write NHWC uint8 images + labels as a `cifar-10-batches-py` folder (train split in 5)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    x_train, y_train = train
    bounds = np.linspace(0, len(x_train), len(TRAIN_FILES) + 1).round().astype(int)
    for i, name in enumerate(TRAIN_FILES):
        a, b = bounds[i], bounds[i + 1]
        _write_batch(folder / name, x_train[a:b], y_train[a:b],
                     f"training batch {i + 1} of {len(TRAIN_FILES)}", first=a)
    _write_batch(folder / TEST_FILE, test[0], test[1], "testing batch 1 of 1", first=len(x_train))
    meta = {b"label_names": [c.encode() for c in classes],
            b"num_cases_per_batch": int(bounds[1] - bounds[0]), b"num_vis": 3 * 32 * 32}
    with open(folder / META_FILE, "wb") as f:
        pickle.dump(meta, f, protocol=2)
    return folder


def _complete(folder: Path) -> bool:
    return all((folder / n).is_file() for n in (*TRAIN_FILES, TEST_FILE, META_FILE))


# ---------------------------------------------------------------------------------------------
# Real CIFAR-10

class DownloadFailed(SystemExit):
    """CIFAR-10 could not be fetched. A SystemExit whose code is the one-line message: a recipe
    that does not catch it ends as its other `raise SystemExit("...")` checks do, the line on
    stderr and exit status 1, with no traceback."""


def download_failure_reason(exc: BaseException) -> str:
    """A few words for why a download failed, from what urllib or torchvision raised."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"the server answered HTTP {exc.code} {exc.reason}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc  # str or an error
    if isinstance(reason, socket.gaierror):
        return "name resolution failed (no network or no DNS?)"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no answer within {DOWNLOAD_TIMEOUT_S} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, ConnectionError):
        return "the connection failed"
    if isinstance(exc, RuntimeError) and "corrupted" in str(exc):
        return "the archive failed its md5 check"
    text = " ".join(str(reason).split()) or type(reason).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def download_failed_message(reason: str, root: str | os.PathLike) -> str:
    return (f"could not download CIFAR-10: {reason}; use --set data=synthetic to run on "
            f"generated data, or put {ARCHIVE} (or its {FOLDER}/ folder) in {root}")


READY = ".ready.npz"  # <folder>.ready.npz beside a dataset's folder: its arrays (issue 17)


def _ready_path(folder: str | os.PathLike) -> Path:
    return Path(folder).with_name(Path(folder).name + READY)


def _source(folder: str | os.PathLike) -> list[str]:
    """What the folder holds now (name, size, mtime of each file): the ready copy's key."""
    out = []
    for name in sorted(os.listdir(folder)):
        st = os.stat(os.path.join(folder, name))
        out.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
    return out


def read_ready(folder: str | os.PathLike) -> dict | None:
    """The dataset read_cifar10(folder) returns, from the ready-to-load copy beside it (one
    uncompressed .npz: no pickles, no torchvision import), or None when there is none, the
    folder changed since it was written (files, sizes, times), or it does not hold what
    read_cifar10 would (then the caller reads the folder and writes it again)."""
    try:
        source = _source(folder)
        with np.load(_ready_path(folder), allow_pickle=False) as z:
            if [str(x) for x in z["source"]] != source:
                return None
            ds = {"train": (z["x_train"], z["y_train"]), "test": (z["x_test"], z["y_test"]),
                  "classes": [str(c) for c in z["classes"]]}
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    for x, y in (ds["train"], ds["test"]):
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (32, 32, 3) or \
                y.ndim != 1 or len(y) != len(x) or y.dtype.kind not in "iu":
            return None
    return ds


def write_ready(folder: str | os.PathLike, ds: dict) -> None:
    """Keep `ds` (read from `folder`) ready to load next time: written beside the folder
    under a temporary name, then renamed. A failure only costs the next job the slow read."""
    path = _ready_path(folder)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        source = _source(folder)
        with open(tmp, "wb") as f:
            np.savez(f, source=np.array(source, dtype=str),
                     x_train=ds["train"][0], y_train=ds["train"][1],
                     x_test=ds["test"][0], y_test=ds["test"][1],
                     classes=np.array(ds["classes"], dtype=str))
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def read_cached(folder: str | os.PathLike) -> dict:
    """read_cifar10(folder), from its ready-to-load copy when there is one (written on the
    first read)."""
    ds = read_ready(folder)
    if ds is None:
        ds = read_cifar10(folder)
        write_ready(folder, ds)
    return ds


def load_cifar10(root: str | os.PathLike) -> dict:
    """Download CIFAR-10 into `root` on first use (torchvision checks the md5), then read it;
    later jobs load the ready-to-load copy the first one wrote, without torchvision.
    The archive comes from $CLOUDTRAIN_CIFAR10_URL if set, else torchvision's own URL. A failed
    download raises DownloadFailed (one line, exit status 1)."""
    ready = read_ready(Path(root) / FOLDER)
    if ready is not None:
        return ready
    try:
        import torchvision  # only the real-data path needs it; it takes seconds to import
    except ImportError as exc:
        raise DownloadFailed(download_failed_message(
            f"torchvision is not installed ({exc.msg})", root)) from None
    dataset = torchvision.datasets.CIFAR10
    url = os.environ.get(URL_ENV)
    if url:
        dataset = type("CIFAR10Mirror", (dataset,), {"url": url})
    previous = socket.getdefaulttimeout()  # torchvision's urlopen calls pass no timeout
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        dataset(root=str(root), train=True, download=True)
    except (OSError, RuntimeError) as exc:  # URLError and HTTPError are OSErrors
        raise DownloadFailed(download_failed_message(download_failure_reason(exc), root)) \
            from None
    finally:
        socket.setdefaulttimeout(previous)
    return read_cached(Path(root) / FOLDER)


# ---------------------------------------------------------------------------------------------
# Synthetic CIFAR-10: class-dependent colour + oriented stripes + noise, learnable in an epoch

def make_synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n labelled 32x32 RGB images. Class c has a mean colour and a stripe orientation and
    frequency of its own; every image adds a random stripe phase, a brightness jitter and pixel
    noise, so a small convnet separates the classes but not instantly."""
    proto = np.random.default_rng(12345)  # class prototypes: the same for every seed and split
    colours = proto.uniform(50, 205, size=(10, 3)).astype(np.float32)
    angles = np.arange(10) * np.pi / 10
    freqs = 2.0 + (np.arange(10) % 3)

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n).astype(np.int64)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    images = np.empty((n, 32, 32, 3), dtype=np.uint8)
    for a in range(0, n, 4096):  # chunked to bound memory for large n
        lab = labels[a:a + 4096]
        m = len(lab)
        phase = rng.uniform(0, 2 * np.pi, size=(m, 1, 1)).astype(np.float32)
        u = (xx * np.cos(angles[lab])[:, None, None] + yy * np.sin(angles[lab])[:, None, None])
        stripes = np.sin(2 * np.pi * freqs[lab][:, None, None] * u / 32 + phase)
        img = (colours[lab][:, None, None, :] + 40.0 * stripes[..., None]
               + rng.normal(0, 15, size=(m, 1, 1, 3)) + rng.normal(0, 25, size=(m, 32, 32, 3)))
        images[a:a + m] = np.clip(img, 0, 255).round().astype(np.uint8)
    return images, labels


def synthetic_folder(root: str | os.PathLike, n_train: int, n_test: int, seed: int) -> Path:
    return Path(root) / f"synthetic-cifar10-{n_train}-{n_test}-{seed}" / FOLDER


def load_synthetic(root: str | os.PathLike, n_train: int, n_test: int, seed: int) -> dict:
    """Write a synthetic set in the real on-disk format (once per size and seed), then read it."""
    folder = synthetic_folder(root, n_train, n_test, seed)
    if not _complete(folder):
        x, y = make_synthetic(n_train + n_test, seed)
        # Write into a sibling temp folder and rename: a killed run never leaves half a dataset.
        tmp = folder.parent.with_name(folder.parent.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        write_cifar10(tmp / FOLDER, (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:]))
        if _complete(folder):  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            shutil.rmtree(folder.parent, ignore_errors=True)  # an incomplete earlier attempt
            try:
                os.replace(tmp, folder.parent)
            except OSError:  # lost a race to another writer: theirs is as good as ours
                shutil.rmtree(tmp, ignore_errors=True)
    return read_cached(folder)
