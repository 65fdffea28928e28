"""recipes/common: the metrics log, atomic checkpoints, and CIFAR-10 in its on-disk format."""
import json
import os
import pickle
import random
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
from common import checkpoint, cifar10, metrics  # noqa: E402


# ---------------------------------------------------------------------------------------------
# metrics

def test_job_dir_flag_then_env_then_default(monkeypatch, tmp_path):
    monkeypatch.delenv("CLOUDTRAIN_JOB_DIR", raising=False)
    assert metrics.job_dir() == Path("./cloudtrain-run")
    monkeypatch.setenv("CLOUDTRAIN_JOB_DIR", str(tmp_path / "env"))
    assert metrics.job_dir() == tmp_path / "env"
    assert metrics.job_dir(tmp_path / "flag") == tmp_path / "flag"


def test_metrics_rows_are_flushed_json_lines_with_time(tmp_path):
    path = tmp_path / "job" / "metrics.jsonl"
    writer = metrics.MetricsWriter(path)
    writer.write(epoch=1, test_acc=np.float32(0.5), step=torch.tensor(7))
    # Readable before close: every line is flushed as it is written.
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 1 and abs(rows[0].pop("time") - time.time()) < 60
    assert rows == [{"epoch": 1, "test_acc": 0.5, "step": 7}]
    writer.close()
    with metrics.MetricsWriter(path) as again:  # appends, never truncates
        again.write(epoch=2)
    assert [r["epoch"] for r in metrics.read_metrics(path)] == [1, 2]


def test_read_metrics_skips_a_partial_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1}\n{"epoch": 2}\n{"epo')
    assert metrics.read_metrics(path) == [{"epoch": 1}, {"epoch": 2}]


def test_metrics_refuses_what_json_cannot_hold(tmp_path):
    with metrics.MetricsWriter(tmp_path / "m.jsonl") as writer, pytest.raises(TypeError):
        writer.write(bad=object())


# ---------------------------------------------------------------------------------------------
# checkpoint

def test_save_atomic_round_trip_leaves_no_temp_files(tmp_path):
    path = checkpoint.last_checkpoint_path(tmp_path)
    assert path == tmp_path / "checkpoints" / "last.pt"
    checkpoint.save_atomic({"w": torch.arange(5.0), "epoch": 3}, path)
    checkpoint.save_atomic({"w": torch.arange(6.0), "epoch": 4}, path)
    loaded = checkpoint.load(path)
    assert loaded["epoch"] == 4 and torch.equal(loaded["w"], torch.arange(6.0))
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint-info.json", "last.pt"]


def test_failed_save_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoints" / "last.pt"
    checkpoint.save_atomic({"epoch": 1}, path)
    with pytest.raises(Exception):
        checkpoint.save_atomic({"epoch": 2, "bad": lambda: None}, path)  # lambdas do not pickle
    assert checkpoint.load(path) == {"epoch": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint-info.json", "last.pt"]


def test_rng_states_restore_every_generator(tmp_path):
    states = checkpoint.rng_states()
    path = checkpoint.save_atomic({"rng": states}, tmp_path / "rng.pt")
    first = (random.random(), np.random.rand(), torch.rand(3))
    checkpoint.restore_rng_states(checkpoint.load(path)["rng"])
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == second[0] and first[1] == second[1] and torch.equal(first[2], second[2])


def test_checkpoints_round_trip_as_plain_data_F32(tmp_path):
    """F32: a checkpoint may come from the job store, which other principals (or a compromised
    instance) can write: it is loaded with weights_only=True, so everything a recipe saves
    (RNG states included) must be tensors, numbers, strings, lists and dicts."""
    path = checkpoint.save_atomic({"rng": checkpoint.rng_states(), "step": 3,
                                   "args": {"lr": 0.1, "name": "x", "flag": None}},
                                  tmp_path / "last.pt")
    loaded = torch.load(path, weights_only=True)  # raises on anything but plain data
    assert loaded["step"] == 3 and loaded["args"] == {"lr": 0.1, "name": "x", "flag": None}
    checkpoint.restore_rng_states(loaded["rng"])
    assert np.random.get_state()[1].dtype == np.uint32


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_would_run_code_is_refused_in_one_line_F32(tmp_path, capsys):
    """F32: a pickled object whose reduce runs a command is refused, and nothing runs."""
    marker = tmp_path / "ran"
    path = tmp_path / "last.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "step": 1, "evil": _RunsCode(marker)}, path)
    with pytest.raises(SystemExit) as stopped:
        checkpoint.load(path)
    message = str(stopped.value.code)
    assert "\n" not in message and str(path) in message and "refus" in message
    assert "system" in message  # names what it would have called
    assert not marker.exists()


def _rewritten(src: Path, dst: Path, edit) -> Path:
    """A copy of torch's zip checkpoint `src` with its pickle's bytes passed through edit()."""
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                changed = edit(data)
                assert changed != data, "the edit did not apply"
                data = changed
            zout.writestr(info.filename, data)
    return dst


def _damaged_checkpoints(tmp_path: Path) -> dict[str, Path]:
    """The audit's damaged checkpoints (F46), built with torch: an empty file, a truncated
    one, one whose storage claims 1 GB over 16 bytes, a view of 10^12 elements on 4 floats,
    a stride-0 view of 10^14 elements, a file that is a list."""
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(4), "step": 1}, good)
    data = good.read_bytes()
    out = {"empty": tmp_path / "empty.pt", "truncated": tmp_path / "truncated.pt",
           "cut at the end": tmp_path / "cut.pt", "a list": tmp_path / "list.pt"}
    out["empty"].write_bytes(b"")
    out["truncated"].write_bytes(data[:len(data) // 2])
    out["cut at the end"].write_bytes(data[:-30])
    torch.save([torch.zeros(2)], out["a list"])
    size, stride = b"K\x04\x85", b"K\x01\x85"  # (4,) and (1,) in the pickle
    out["1 GB storage over 16 bytes"] = _rewritten(
        good, tmp_path / "storage.pt", lambda p: p.replace(b"cpuq\x06K\x04t", b"cpuq\x06J"
                                                           + (1 << 28).to_bytes(4, "little") + b"t"))
    out["10^12 elements on 4 floats"] = _rewritten(
        good, tmp_path / "view.pt", lambda p: p.replace(size, b"\x8a\x06" + (10 ** 12).to_bytes(
            6, "little") + b"\x85"))
    out["stride-0 view of 10^14"] = _rewritten(
        good, tmp_path / "stride0.pt", lambda p: p.replace(size, b"\x8a\x06" + (10 ** 14).to_bytes(
            6, "little") + b"\x85").replace(stride, b"K\x00\x85"))
    return out


def test_damaged_checkpoints_are_refused_in_one_line_F46(tmp_path):
    """F46: only UnpicklingError was one line; an empty, truncated or inconsistent checkpoint
    ended the training script in a raw traceback (EOFError, RuntimeError from the zip reader,
    a record size that does not match, an allocator asked for 400 TB by the first copy of a
    stride-0 view). Each is now the same one-line refusal, naming the file."""
    for what, path in _damaged_checkpoints(tmp_path).items():
        with pytest.raises(SystemExit) as stopped:
            checkpoint.load(path)
        message = str(stopped.value.code)
        assert isinstance(stopped.value.code, str), what
        assert "\n" not in message and message.startswith(f"{path}: refused to load the "
                                                          "checkpoint: "), (what, message)
    assert checkpoint.load(tmp_path / "good.pt")["step"] == 1


@pytest.mark.parametrize("saved, most, refused", [
    (0, 10, False), (10, 10, False), (11, 10, True), (10 ** 18, 10, True), (-1, 10, True),
    ("5", 10, True), (None, 10, True), (True, 10, True), (2.5, 10, True),
    (torch.tensor(4), 10, False)])
def test_a_step_past_the_schedule_is_refused_F46(tmp_path, saved, most, refused):
    """F46: a checkpoint whose step is 10^18 loaded fine, and a recipe that resumes from it
    ends its training at once with the checkpoint's weights. Counts outside the run's
    schedule (or not whole numbers) are refused in one line."""
    path = checkpoint.save_atomic({"step": saved}, tmp_path / "last.pt")
    step = checkpoint.load(path)["step"]
    if not refused:
        checkpoint.check_schedule(path, "resnet9", step=(step, most))
        return
    with pytest.raises(SystemExit) as stopped:
        checkpoint.check_schedule(path, "resnet9", step=(step, most))
    assert str(stopped.value.code).startswith(f"resnet9: {path}: refused to resume: its step "
                                              "is "), stopped.value.code
    assert f"outside this run's schedule (0 to {most})" in str(stopped.value.code)


# ---------------------------------------------------------------------------------------------
# cifar10: the real on-disk format

def _random_set(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8),
            rng.integers(0, 10, size=n).astype(np.int64))


def test_data_dir_flag_then_env_then_default(monkeypatch, tmp_path):
    monkeypatch.delenv("CLOUDTRAIN_DATA_DIR", raising=False)
    assert cifar10.data_dir() == Path("~/.cloudtrain/data").expanduser()
    monkeypatch.setenv("CLOUDTRAIN_DATA_DIR", str(tmp_path))
    assert cifar10.data_dir() == tmp_path
    assert cifar10.data_dir(tmp_path / "x") == tmp_path / "x"


def test_writer_produces_the_real_pickle_layout(tmp_path):
    train, test = _random_set(23, 0), _random_set(7, 1)
    folder = cifar10.write_cifar10(tmp_path / "cifar-10-batches-py", train, test)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["batches.meta", "test_batch"] + [f"data_batch_{i}" for i in range(1, 6)])

    with open(folder / "data_batch_1", "rb") as f:
        d = pickle.load(f, encoding="bytes")
    assert set(d) == {b"data", b"labels", b"batch_label", b"filenames"}
    assert d[b"batch_label"] == b"training batch 1 of 5"
    data = d[b"data"]
    assert data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == 3072
    n = len(data)
    assert isinstance(d[b"labels"], list) and d[b"labels"] == train[1][:n].tolist()
    assert len(d[b"filenames"]) == n and all(isinstance(x, bytes) for x in d[b"filenames"])
    # Row layout: red plane, green plane, blue plane, each 32x32 row-major.
    img = train[0][0]
    for c, y, x in [(0, 0, 0), (0, 3, 17), (1, 31, 2), (2, 5, 31)]:
        assert data[0, c * 1024 + y * 32 + x] == img[y, x, c]

    sizes = []
    for i in range(1, 6):
        with open(folder / f"data_batch_{i}", "rb") as f:
            sizes.append(len(pickle.load(f, encoding="bytes")[b"labels"]))
    assert sum(sizes) == 23 and max(sizes) - min(sizes) <= 1

    with open(folder / "batches.meta", "rb") as f:
        meta = pickle.load(f, encoding="bytes")
    assert meta[b"label_names"][0] == b"airplane" and len(meta[b"label_names"]) == 10
    assert meta[b"num_vis"] == 3072


def test_write_then_read_round_trip(tmp_path):
    train, test = _random_set(23, 0), _random_set(7, 1)
    folder = cifar10.write_cifar10(tmp_path / "cifar-10-batches-py", train, test)
    ds = cifar10.read_cifar10(folder)
    for split, (x, y) in (("train", train), ("test", test)):
        x2, y2 = ds[split]
        assert x2.shape == x.shape and x2.dtype == np.uint8 and np.array_equal(x2, x)
        assert y2.dtype == np.int64 and np.array_equal(y2, y)
    assert ds["classes"] == list(cifar10.LABEL_NAMES)


def test_reader_accepts_str_keys_too(tmp_path):
    folder = cifar10.write_cifar10(tmp_path / "c", _random_set(10, 0), _random_set(3, 1))
    with open(folder / "test_batch", "rb") as f:
        d = pickle.load(f, encoding="bytes")
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({k.decode(): v for k, v in d.items()}, f)
    x, _ = cifar10.read_cifar10(folder)["test"]
    assert x.shape == (3, 32, 32, 3)


def test_reader_rejects_a_malformed_batch(tmp_path):
    folder = cifar10.write_cifar10(tmp_path / "c", _random_set(10, 0), _random_set(3, 1))
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((3, 100), np.uint8), b"labels": [0, 1, 2]}, f)
    with pytest.raises(ValueError, match="3072"):
        cifar10.read_cifar10(folder)


def test_synthetic_is_written_once_in_the_real_format(tmp_path):
    root = tmp_path / "data"
    ds = cifar10.load_synthetic(root, 300, 100, seed=3)
    folder = root / "synthetic-cifar10-300-100-3" / "cifar-10-batches-py"
    assert (folder / "data_batch_5").is_file() and (folder / "batches.meta").is_file()
    assert ds["train"][0].shape == (300, 32, 32, 3) and ds["test"][0].shape == (100, 32, 32, 3)
    assert np.array_equal(cifar10.read_cifar10(folder)["train"][0], ds["train"][0])
    stamp = (folder / "test_batch").stat().st_mtime_ns
    again = cifar10.load_synthetic(root, 300, 100, seed=3)
    assert (folder / "test_batch").stat().st_mtime_ns == stamp  # reused, not rewritten
    assert np.array_equal(again["test"][0], ds["test"][0])
    assert [p.name for p in root.iterdir()] == ["synthetic-cifar10-300-100-3"]  # no temp left
    other = cifar10.load_synthetic(root, 300, 100, seed=4)
    assert not np.array_equal(other["train"][0], ds["train"][0])


def test_synthetic_classes_are_learnable():
    # A nearest-class-mean classifier on raw pixels must beat chance (10%) by far, so a small
    # convnet has something to learn in an epoch; pixel noise keeps it from being trivial.
    x, y = cifar10.make_synthetic(2000, seed=0)
    x = x.reshape(len(x), -1).astype(np.float32)
    means = np.stack([x[:1000][y[:1000] == c].mean(0) for c in range(10)])
    pred = ((x[1000:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (pred == y[1000:]).mean() > 0.5
    assert np.bincount(y, minlength=10).min() > 100


def test_real_cifar10_goes_through_torchvision_download_then_our_reader(tmp_path, monkeypatch):
    monkeypatch.delenv(cifar10.URL_ENV, raising=False)
    calls = []

    class FakeCIFAR10:  # stands in for torchvision.datasets.CIFAR10 (no network here)
        def __init__(self, root, train=True, download=False):
            calls.append((root, train, download))
            cifar10.write_cifar10(Path(root) / "cifar-10-batches-py",
                                  _random_set(20, 0), _random_set(5, 1))

    fake = types.ModuleType("torchvision")
    fake.datasets = types.SimpleNamespace(CIFAR10=FakeCIFAR10)
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    ds = cifar10.load_cifar10(tmp_path)
    assert calls == [(str(tmp_path), True, True)]
    assert ds["train"][0].shape == (20, 32, 32, 3)


# A local address where nothing listens (the discard port): the download is refused at once.
UNREACHABLE = "http://127.0.0.1:9/cifar-10-python.tar.gz"


def test_d17_a_refused_download_is_one_line_saying_why_and_what_to_do(tmp_path, monkeypatch):
    """D17: the real torchvision downloader against an unreachable mirror ends in
    DownloadFailed, a SystemExit whose code is the one line a recipe prints (exit status 1)."""
    pytest.importorskip("torchvision")
    monkeypatch.setenv(cifar10.URL_ENV, UNREACHABLE)
    with pytest.raises(cifar10.DownloadFailed) as caught:
        cifar10.load_cifar10(tmp_path / "data")
    assert caught.value.code == (
        f"could not download CIFAR-10: connection refused; use --set data=synthetic to run on "
        f"generated data, or put cifar-10-python.tar.gz (or its cifar-10-batches-py/ folder) "
        f"in {tmp_path / 'data'}")
    assert isinstance(caught.value, SystemExit) and caught.value.__cause__ is None
    assert cifar10.socket.getdefaulttimeout() is None  # the download's timeout is not left set


def test_d17_download_failure_reasons_in_a_few_words():
    import socket
    import urllib.error

    reason = cifar10.download_failure_reason
    assert reason(urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name "
                                                           "resolution"))) == \
        "name resolution failed (no network or no DNS?)"
    assert reason(urllib.error.URLError(ConnectionRefusedError(111, "refused"))) == \
        "connection refused"
    assert reason(urllib.error.URLError(TimeoutError("timed out"))) == \
        f"no answer within {cifar10.DOWNLOAD_TIMEOUT_S} s"
    assert reason(TimeoutError("The read operation timed out")) == \
        f"no answer within {cifar10.DOWNLOAD_TIMEOUT_S} s"
    assert reason(urllib.error.HTTPError(UNREACHABLE, 404, "Not Found", {}, None)) == \
        "the server answered HTTP 404 Not Found"
    assert reason(RuntimeError("File not found or corrupted.")) == \
        "the archive failed its md5 check"
    assert reason(OSError(28, "No space left on device")) == "[Errno 28] No space left on device"
    long = reason(urllib.error.URLError("x\n" * 200))
    assert "\n" not in long and len(long) <= 120


def test_d17_missing_torchvision_is_one_line_too(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # `import torchvision` fails
    with pytest.raises(cifar10.DownloadFailed, match=r"^could not download CIFAR-10: "
                                                     r"torchvision is not installed"):
        cifar10.load_cifar10(tmp_path)


def test_the_ready_to_load_copy_is_what_the_folder_holds_and_a_bad_one_is_redone(tmp_path):
    """issue 17: the first read writes <folder>.ready.npz; later reads load it (the same
    arrays, no pickles); a truncated or wrong one is read past and rewritten."""
    train, test = _random_set(23, 0), _random_set(7, 1)
    folder = cifar10.write_cifar10(tmp_path / "cifar-10-batches-py", train, test)
    first = cifar10.read_cached(folder)
    ready = tmp_path / "cifar-10-batches-py.ready.npz"
    assert ready.is_file()
    again = cifar10.read_ready(folder)
    for split in ("train", "test"):
        assert np.array_equal(again[split][0], first[split][0])
        assert np.array_equal(again[split][1], first[split][1])
    assert again["classes"] == first["classes"]
    for junk in (ready.read_bytes()[:100], b"not numpy at all"):
        ready.write_bytes(junk)
        assert cifar10.read_ready(folder) is None
        assert np.array_equal(cifar10.read_cached(folder)["train"][0], train[0])
        assert cifar10.read_ready(folder) is not None  # rewritten whole
    np.savez(ready, source=np.array(cifar10._source(folder)),
             x_train=np.zeros((3, 8, 8, 3), np.uint8), y_train=np.zeros(3, np.int64),
             x_test=np.zeros((1, 32, 32, 3), np.uint8), y_test=np.zeros(1, np.int64),
             classes=np.array(["a"]))
    assert cifar10.read_ready(folder) is None  # not 32x32 images: not ours
    # the folder replaced by another set: the copy is stale, and read past
    other = _random_set(23, 5)
    cifar10.read_cached(folder)
    cifar10.write_cifar10(folder, other, test)
    assert cifar10.read_ready(folder) is None
    assert np.array_equal(cifar10.read_cached(folder)["train"][0], other[0])


COMPILE_CACHE_PROBE = """
import os, sys
sys.path.insert(0, sys.argv[1])
from common import compiling
from torch._inductor.runtime import cache_dir_utils
cache_dir_utils.cache_dir()  # what torchvision's import does: writes torch's default
compiling.compiled(lambda x: x, sys.argv[2], cuda=False)
print(os.environ["TORCHINDUCTOR_CACHE_DIR"])
"""


@pytest.mark.parametrize("started_with", [None, "/tmp/users-own-cache"])
def test_compiled_graphs_go_to_the_data_dir_even_after_torch_looked(tmp_path, started_with):
    """issue 17: inductor's cache is <data dir>/inductor-cache (a kept instance's next job
    reads it) even once torch has written its own default into the environment, as
    wide-resnet34's torchvision import does; a $TORCHINDUCTOR_CACHE_DIR the job was started
    with wins."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    if started_with:
        env["TORCHINDUCTOR_CACHE_DIR"] = started_with
    proc = subprocess.run([sys.executable, "-c", COMPILE_CACHE_PROBE,
                           str(Path(__file__).resolve().parents[2] / "recipes"),
                           str(tmp_path / "data")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (started_with or str(tmp_path / "data" / "inductor-cache"))


# ---------------------------------------------------------------------------------------------
# startup: torch's threads per process (issue 28)

from common import startup  # noqa: E402


@pytest.mark.parametrize("env, workers, expected", [
    # cloudtrain's run.sh counted 12 cores; torchrun says 8 processes here; 11 loader workers
    ({"OMP_NUM_THREADS": "12", "CLOUDTRAIN_CORES": "96", "LOCAL_WORLD_SIZE": "8"}, 11,
     {"threads": 1, "threads_from": "cores", "cores": 96, "procs": 8, "loader_workers": 11}),
    # the CIFAR recipes keep their data on the GPU: no workers, the whole share
    ({"OMP_NUM_THREADS": "12", "CLOUDTRAIN_CORES": "96", "LOCAL_WORLD_SIZE": "8"}, 0,
     {"threads": 12, "threads_from": "cores", "cores": 96, "procs": 8, "loader_workers": 0}),
    # the imagenet smoke on 2 cores with 1 worker: 1 thread (6 min 38 s -> 40.7 s in issue 28)
    ({"CLOUDTRAIN_CORES": "2"}, 1,
     {"threads": 1, "threads_from": "cores", "cores": 2, "procs": 1, "loader_workers": 1}),
    # more processes than cores: still one thread each
    ({"CLOUDTRAIN_CORES": "4", "LOCAL_WORLD_SIZE": "8"}, 0,
     {"threads": 1, "threads_from": "cores", "cores": 4, "procs": 8, "loader_workers": 0}),
    # the job's own OMP_NUM_THREADS (no CLOUDTRAIN_CORES: cloudtrain did not set it) wins
    ({"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "8"}, 11,
     {"threads": 3, "threads_from": "job"}),
])
def test_threads_are_the_cores_share_less_the_loader_or_the_jobs_own(env, workers, expected):
    assert startup.thread_choice(workers, env) == expected


def test_run_by_hand_the_threads_come_from_this_processes_affinity():
    got = startup.thread_choice(0, {"OMP_NUM_THREADS": "not a number"})
    assert got["threads_from"] == "cores" and got["cores"] == len(os.sched_getaffinity(0))


def test_the_startup_row_says_the_threads_torch_was_given(one_torch_thread):
    marks = startup.Startup(time.time(), env={"CLOUDTRAIN_CORES": "6", "LOCAL_WORLD_SIZE": "2"},
                            loader_workers=1)
    assert torch.get_num_threads() == 2
    marks.pin_threads(2)
    row = marks.row(torch.device("cpu"))
    assert torch.get_num_threads() == 1
    assert {k: row[k] for k in ("threads", "threads_from", "cores", "procs",
                                "loader_workers")} == {"threads": 1, "threads_from": "cores",
                                                       "cores": 6, "procs": 2,
                                                       "loader_workers": 2}
    assert startup.describe(row).endswith(
        "; torch threads 1 (6 cores / 2 processes, less 2 loader workers)")


# ---------------------------------------------------------------------------------------------
# distributed.pick_device

def test_RA4_a_gpu_host_whose_torch_sees_no_cuda_fails_instead_of_training_on_the_cpu(
        monkeypatch, tmp_path):
    """RA4: the instance runs the image's torch, not the one tested here; a torch whose CUDA
    build the driver does not run sees no device, and `device=auto` trained on the CPU at
    GPU prices without a word (SkyPilot's #9406). With GPUs paid for (CLOUDTRAIN_GPUS) and
    the driver's device node there, the recipe stops at once saying why; without either (this
    machine, the lab's hosts) auto is the CPU as before, and device=cpu is always the CPU."""
    from common import distributed

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: nothing to fall back from")
    node = tmp_path / "nvidia0"
    node.write_text("")
    monkeypatch.setattr(distributed, "NVIDIA_DEVICE", str(node))
    monkeypatch.setenv("CLOUDTRAIN_GPUS", "4")
    with pytest.raises(SystemExit) as info:
        distributed.pick_device("auto")
    said = str(info.value)
    assert said.startswith(f"this host has 4 GPU(s) and an NVIDIA device ({node}), but torch ")
    assert "sees no CUDA device" in said and "--set device=cpu" in said and "\n" not in said
    assert distributed.pick_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("CLOUDTRAIN_GPUS", "0")  # a CPU type (--cpu-only)
    assert distributed.pick_device("auto") == torch.device("cpu")
    monkeypatch.setenv("CLOUDTRAIN_GPUS", "4")
    node.unlink()  # no driver device: the lab's CPU hosts, a laptop
    assert distributed.pick_device("auto") == torch.device("cpu")
