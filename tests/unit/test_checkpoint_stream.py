"""The checkpoint stream without S3: what a snapshot holds, when it is taken, where it goes,
what restore accepts. Uploads go to a small HTTP server on loopback that stores each POSTed
object (and serves it back for restore), as S3 would, and fails when told to."""

from __future__ import annotations

import ast
import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cloudtrain.host import agent_upload, checkpoint_manifest, checkpoint_restore
from cloudtrain.host import checkpoint_stream as cs
from cloudtrain.providers.aws import jobstore_fetch
from labs.loopback import QuietServer, serve
from labs.shipped_host import command

PREFIX = "jobs/ab12cd34/"


class Store(QuietServer):
    """POST: a multipart form as the uploader sends it -> objects[key]; GET /<key>: it back.
    `fail(key)`: a status to answer instead (None: store it); `bytes_per_s`: read the body
    at that rate (a slow link). Started by labs.loopback.serve."""

    def handle_error(self, request, client_address):
        pass  # a client that hung up mid-request (an upload cut short) is part of the test

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.objects: dict[str, bytes] = {}
        self.posts: list[str] = []
        self.history: list[tuple[str, bytes]] = []  # every object stored, in order
        self.fail = lambda key: None
        self.bytes_per_s = None

    @property
    def url(self) -> str:
        return super().url + "/"

    def grant(self) -> dict:
        return {"url": self.url, "fields": {"policy": "p"}, "prefix": PREFIX,
                "expires_at": time.time() + 600, "max_bytes": 1 << 30}

    def latest(self) -> dict:
        return json.loads(self.objects[PREFIX + "stream/latest.json"])

    def plan(self, manifest: dict | None = None, **extra) -> dict:
        manifest = manifest or self.latest()
        files = [dict(f, url=f"{self.url}{PREFIX}stream/{manifest['slot']}/{f['path']}")
                 for f in manifest["files"]]
        return dict(manifest, files=files, **extra)


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers["Content-Length"])
        rate = self.server.bytes_per_s
        chunks, left = [], length
        while left:
            chunk = self.rfile.read(min(left, 1 << 18))
            if not chunk:
                return
            chunks.append(chunk)
            left -= len(chunk)
            if rate:
                time.sleep(len(chunk) / rate)
        body = b"".join(chunks)
        boundary = self.headers["Content-Type"].split("boundary=")[1].encode()
        form = {}
        for part in body.split(b"--" + boundary)[1:-1]:
            head, _, data = part[2:].partition(b"\r\n\r\n")
            form[re.search(rb'name="([^"]+)"', head).group(1).decode()] = data[:-2]
        key = form["key"].decode()
        self.server.posts.append(key)
        status = self.server.fail(key)
        if status is None:
            self.server.objects[key] = form["file"]
            self.server.history.append((key, form["file"]))
            status = 204
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        data = self.server.objects.get(self.path[1:])
        self.send_response(200 if data is not None else 404)
        self.send_header("Content-Length", str(len(data or b"")))
        self.end_headers()
        self.wfile.write(data or b"")


@pytest.fixture
def store(monkeypatch):
    monkeypatch.setattr(agent_upload, "BACKOFF_S", 0.01)
    monkeypatch.setattr(checkpoint_restore, "RESTORE_BACKOFF_S", 0.01)
    _, server = serve(_Handler, server_class=Store)
    yield server
    server.close()


def _save(jobdir: Path, data: bytes, name: str = "last.pt", step=None, epoch=None) -> Path:
    """A checkpoint saved as checkpoint.save_atomic does: a hidden temporary file renamed."""
    folder = jobdir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, folder / name)
    if step is not None or epoch is not None:
        (folder / ".info.tmp").write_text(json.dumps({"step": step, "epoch": epoch, "file": name}))
        os.replace(folder / ".info.tmp", folder / checkpoint_manifest.INFO)
    return folder / name


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the module ships to hosts ------------------------------------------------------------------


@pytest.mark.parametrize("module, ours", [
    (cs, {"agent_upload", "safefile", "checkpoint_manifest", "checkpoint_restore"}),
    (checkpoint_restore, {"agent_upload", "awsapi", "safefile", "checkpoint_manifest"}),
    (checkpoint_manifest, {"agent_upload"}),
], ids=lambda m: getattr(m, "__name__", "").rpartition(".")[2] or None)
def test_runs_under_python38_with_the_standard_library_only(module, ours):
    source = Path(module.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree)  # from . import x
                 if isinstance(n, ast.ImportFrom) and n.level and not n.module for a in n.names}
    assert imported - set(sys.stdlib_module_names) == ours


def test_shipped_with_the_agent():
    from cloudtrain.hosts import HOST_PACKAGE, host_files

    shipped = [name for name, _ in host_files()]
    assert {f"{HOST_PACKAGE}/{m}.py" for m in ("checkpoint_stream", "checkpoint_manifest",
                                               "checkpoint_restore")} <= set(shipped)
    assert "checkpoint_stream.py" in shipped  # its command


# -- what a snapshot holds and when it is taken -----------------------------------------------


def test_signature_lists_regular_checkpoints_only_and_sees_a_rename(tmp_path):
    path = _save(tmp_path, b"one")
    ckpt = tmp_path / "checkpoints"
    (ckpt / ".last.pt.tmp-99").write_bytes(b"a save in progress")
    (ckpt / ".hidden").mkdir()
    (ckpt / ".hidden" / "x.pt").write_bytes(b"x")
    (ckpt / "run").mkdir()
    (ckpt / "run" / "opt.pt").write_bytes(b"opt")
    (ckpt / "passwd").symlink_to("/etc/passwd")
    (ckpt / "linked").symlink_to(tmp_path)
    os.mkfifo(ckpt / "fifo")
    sig = checkpoint_manifest.signature(str(tmp_path))
    assert [s[0] for s in sig] == ["checkpoints/last.pt", "checkpoints/run/opt.pt"]
    st = path.stat()
    assert sig[0] == ("checkpoints/last.pt", 3, st.st_mtime_ns, st.st_ino)
    assert checkpoint_manifest.signature(str(tmp_path)) == sig
    _save(tmp_path, b"two")  # same size, maybe the same mtime: a new inode all the same
    assert checkpoint_manifest.signature(str(tmp_path)) != sig
    assert checkpoint_manifest.signature(str(tmp_path / "nowhere")) == ()


def test_a_whole_checkpoint_is_taken_at_the_first_look_and_only_once(tmp_path, store):
    streamer = cs.Streamer(str(tmp_path), store.grant(), settle_s=2.0)
    assert streamer.poll_once(now=100.0) is None  # nothing there
    _save(tmp_path, b"ckpt-1", step=10)  # renamed into place: nobody writes to it any more
    rec = streamer.poll_once(now=100.1)
    assert rec["ok"] is True and rec["error"] is None, rec
    assert (rec["seq"], rec["slot"], rec["step"], rec["final"]) == (1, "a", 10, False)
    assert streamer.last == rec and streamer.uploads == 1
    assert streamer.poll_once(now=200.0) is None  # unchanged since: nothing more
    _save(tmp_path, b"ckpt-22", step=20)
    assert streamer.poll_once(now=200.1)["step"] == 20
    assert len([k for k in store.posts if k.endswith("latest.json")]) == 2
    # A removed checkpoint folder is nothing to upload either.
    for p in (tmp_path / "checkpoints").iterdir():
        p.unlink()
    assert streamer.poll_once(now=300.0) is None and streamer.poll_once(now=400.0) is None


def test_a_file_open_for_writing_is_not_taken_until_its_writer_closes_it(tmp_path, store):
    """A recipe that saves in place (torch.save(obj, path)): while it has the file open, a
    look takes nothing, however long it has been since the file last changed."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    writer = open(folder / "model.pt", "wb")
    writer.write(b"half of it")
    writer.flush()
    fd = os.open(folder / "model.pt", os.O_RDONLY)
    try:
        assert cs.open_for_writing(fd) is True
    finally:
        os.close(fd)
    streamer = cs.Streamer(str(tmp_path), store.grant(), settle_s=0.0)
    assert streamer.poll_once() is None and streamer.last is None
    writer.write(b" and the rest")
    writer.close()
    rec = streamer.poll_once()
    assert rec["ok"], rec
    assert store.objects[PREFIX + "stream/a/checkpoints/model.pt"] == b"half of it and the rest"


def test_where_writers_cannot_be_seen_a_file_must_be_still_for_settle_s(tmp_path, store,
                                                                        monkeypatch):
    """A file system without leases (NFS, FUSE): a file written to within settle_s may be
    being written; older ones are taken."""
    monkeypatch.setattr(cs, "open_for_writing", lambda fd: None)
    path = _save(tmp_path, b"ckpt", step=1)
    streamer = cs.Streamer(str(tmp_path), store.grant(), settle_s=30.0)
    assert streamer.poll_once() is None and streamer.last is None
    old = time.time() - 31
    for p in (tmp_path / "checkpoints").iterdir():
        os.utime(p, (old, old))
    assert streamer.poll_once()["ok"]
    assert store.objects[PREFIX + "stream/a/checkpoints/last.pt"] == path.read_bytes()


def _version(k: int, size: int) -> bytes:
    """Checkpoint version k: a header, a body, and the sha256 of both (whole or not)."""
    body = b"version %d\n" % k + os.urandom(size)
    return body + hashlib.sha256(body).digest()


def _whole(data: bytes) -> int | None:
    """The version a stored file is, when it is one whole; else None."""
    body, digest = data[:-32], data[-32:]
    if len(data) < 40 or hashlib.sha256(body).digest() != digest:
        return None
    return int(body.split(b"\n", 1)[0].split()[1])


class Writer(threading.Thread):
    """A job that writes checkpoint version 1, 2, ... every 0.2-1 s, with its
    checkpoint-info.json: renamed into place (recipes/common/checkpoint.py) or written in place
    in 64 KiB blocks over a while (torch.save(obj, path))."""

    def __init__(self, jobdir: Path, in_place: bool, seconds: float, size: int = 1 << 20):
        super().__init__(daemon=True)
        self.jobdir, self.in_place, self.seconds, self.size = jobdir, in_place, seconds, size
        self.versions: dict[int, float] = {}  # k -> when it was whole on disk
        self.rnd = __import__("random").Random(7)

    def run(self):
        folder = self.jobdir / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        end, k = time.time() + self.seconds, 0
        while time.time() < end:
            k += 1
            data = _version(k, self.size)
            if self.in_place:
                with open(folder / "last.pt", "wb") as f:
                    for i in range(0, len(data), 1 << 16):
                        f.write(data[i:i + (1 << 16)])
                        f.flush()
                        time.sleep(0.005)
            else:
                (folder / ".last.pt.tmp").write_bytes(data)
                os.replace(folder / ".last.pt.tmp", folder / "last.pt")
            (folder / ".info.tmp").write_text(json.dumps({"step": k, "epoch": None}))
            os.replace(folder / ".info.tmp", folder / checkpoint_manifest.INFO)
            self.versions[k] = time.time()
            time.sleep(self.rnd.uniform(0.2, 1.0))


@pytest.mark.parametrize("in_place", [False, True], ids=["renamed", "in-place"])
def test_C1_a_checkpoint_rewritten_every_fraction_of_a_second_is_streamed_while_written(
        tmp_path, store, in_place):
    """C1: a job that writes a checkpoint every 0.2-1 s, with the stream as the launch sets it
    (settle_s 2, poll_s 1): the checkpoints are uploaded while they are written, one upload
    at a time, each stored snapshot whole (never half of a file being written), and the stored
    one is never far behind the newest. Before, none was uploaded until the writes stopped."""
    uploads = []
    original = cs.Streamer._send

    def recorded(self, snap, final, deadline, rec):
        uploads.append(("start", time.time()))
        try:
            return original(self, snap, final, deadline, rec)
        finally:
            uploads.append(("end", time.time()))

    cs.Streamer._send = recorded
    writer = Writer(tmp_path, in_place, seconds=8.0)
    streamer = cs.Streamer(str(tmp_path), store.grant(), settle_s=2.0, poll_s=1.0)
    lags = []
    try:
        writer.start()
        streamer.start()
        while writer.is_alive():
            time.sleep(0.25)
            if PREFIX + "stream/latest.json" in store.objects and writer.versions:
                lags.append(max(writer.versions) - store.latest()["step"])
        writer.join()
        stored_while_writing = streamer.uploads
        time.sleep(1.0)
        streamer.stop(5)
    finally:
        cs.Streamer._send = original
    assert stored_while_writing >= 4, (stored_while_writing, len(writer.versions))
    assert max(lags) <= 3, lags  # the stored checkpoint trails the newest by a few at most
    assert store.latest()["step"] == max(writer.versions)  # the last one, once it is still
    # one upload at a time: every start is followed by its end before the next start
    kinds = [kind for kind, _ in uploads]
    assert kinds == ["start", "end"] * (len(kinds) // 2), kinds
    # every manifest POSTed names a whole version, and the info beside it says that one
    for key, data in store.history:
        if key.endswith("latest.json"):
            doc = json.loads(data)
            files = {f["path"]: f["sha256"] for f in doc["files"]}
            ckpt = [d for k, d in store.history
                    if k == f"{PREFIX}stream/{doc['slot']}/checkpoints/last.pt"
                    and _sha(d) == files["checkpoints/last.pt"]]
            assert ckpt and _whole(ckpt[-1]) is not None, "a torn checkpoint was named"
            assert doc["step"] <= _whole(ckpt[-1])  # its info is never ahead of the file


def test_the_manifest_names_the_slot_once_every_file_is_stored(tmp_path, store):
    data = os.urandom(300_000)
    _save(tmp_path, data, step=7, epoch=2)
    (tmp_path / "checkpoints" / "run").mkdir()
    (tmp_path / "checkpoints" / "run" / "opt.pt").write_bytes(b"optimizer")
    (tmp_path / "metrics.jsonl").write_text('{"epoch": 1, "step": 5}\n')
    (tmp_path / "output.log").write_bytes(b"log\n")
    streamer = cs.Streamer(str(tmp_path), store.grant(), attempt=1)
    rec = streamer.flush(30)
    assert rec["ok"] is True and rec["final"] is True, rec
    assert store.posts[-1] == PREFIX + "stream/latest.json"  # last, after every file
    latest = store.latest()
    assert checkpoint_manifest.check_manifest(latest) is None
    assert latest["seq"] == 1 and latest["slot"] == "a" and latest["final"] is True
    assert (latest["step"], latest["epoch"], latest["step_source"]) == (7, 2, "checkpoint")
    assert latest["job_id"] == "ab12cd34" and latest["attempt"] == 1
    files = {f["path"]: f for f in latest["files"]}
    assert set(files) == {"checkpoints/checkpoint-info.json", "checkpoints/last.pt",
                          "checkpoints/run/opt.pt", "metrics.jsonl", "output.log"}
    for path, f in files.items():
        stored = store.objects[f"{PREFIX}stream/a/{path}"]
        assert f["size"] == len(stored) and f["sha256"] == _sha(stored)
        assert stored == (tmp_path / path).read_bytes()
    assert latest["bytes"] == rec["bytes"] == sum(f["size"] for f in files.values())
    assert latest["taken_at"] <= latest["uploaded_at"]


def test_step_from_the_metrics_when_there_is_no_checkpoint_info(tmp_path, store):
    _save(tmp_path, b"ckpt")
    rows = [{"epoch": 1, "step": 100}, {"epoch": 2, "step": 200, "test_acc": 0.9},
            {"event": "target_reached", "epoch": 9, "step": 999}, {"lr": 0.1}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows)
                                            + '{"epoch": 3, "st')  # a row being written
    rec = cs.Streamer(str(tmp_path), store.grant()).flush(30)
    latest = store.latest()
    assert (rec["step"], rec["epoch"]) == (200, 2)
    assert (latest["step"], latest["epoch"], latest["step_source"]) == (200, 2, "metrics")
    # An unusable checkpoint-info.json falls back to the metrics too; none at all: null.
    (tmp_path / "checkpoints" / checkpoint_manifest.INFO).write_text('{"step": "many"}')
    assert cs.Streamer(str(tmp_path), store.grant()).flush(30)["step"] == 200
    (tmp_path / "metrics.jsonl").unlink()
    cs.Streamer(str(tmp_path), store.grant()).flush(30)
    assert (store.latest()["step"], store.latest()["step_source"]) == (None, None)


def test_step_readers():
    assert checkpoint_manifest.step_from_info(b'{"step": 12, "epoch": 3.0, "file": "last.pt"}') == (12, 3)
    assert checkpoint_manifest.step_from_info(b'{"step": null, "epoch": 4}') == (None, 4)
    for junk in (b"", b"[]", b'{"step": -1}', b'{"step": true}', b'{"step": 1.5}', b"\xff",
                 b'{"a":' * 5000 + b"1" + b"}" * 5000):
        assert checkpoint_manifest.step_from_info(junk) is None
    assert checkpoint_manifest.step_from_metrics(b'{"step": 3}\n{"event": "x", "step": 9}\n[1]\n7\n') == (3, None)
    assert checkpoint_manifest.step_from_metrics(b'{"loss": 1}\n') is None


def test_slots_alternate_and_a_restored_attempt_continues_the_sequence(tmp_path, store):
    streamer = cs.Streamer(str(tmp_path), store.grant(), start_seq=7, start_slot="a", attempt=2)
    got = []
    for i in range(3):
        _save(tmp_path, b"ckpt-%d" % i, step=i)
        rec = streamer.flush(30, final=False)
        assert rec["ok"], rec
        latest = store.latest()
        assert (latest["seq"], latest["slot"]) == (rec["seq"], rec["slot"])
        got.append((rec["seq"], rec["slot"]))
        assert store.objects[f"{PREFIX}stream/{rec['slot']}/checkpoints/last.pt"] == b"ckpt-%d" % i
    assert got == [(8, "b"), (9, "a"), (10, "b")]
    assert streamer.uploads == 3
    fresh = cs.Streamer(str(tmp_path), store.grant())
    _save(tmp_path, b"x")
    assert (fresh.flush(30)["seq"], store.latest()["slot"]) == (1, "a")


def test_flush_with_nothing_new_returns_the_stored_checkpoint(tmp_path, store):
    streamer = cs.Streamer(str(tmp_path), store.grant())
    empty = streamer.flush(5)
    assert empty["ok"] is True and empty["seq"] is None and empty["bytes"] == 0
    assert store.posts == []
    _save(tmp_path, b"ckpt", step=3)
    first = streamer.flush(5, final=False)
    posts = len(store.posts)
    again = streamer.flush(5, final=True)
    assert len(store.posts) == posts  # nothing sent twice
    assert again["ok"] and again["final"] is True
    assert {k: again[k] for k in ("seq", "slot", "step", "bytes", "at", "seconds")} == \
        {k: first[k] for k in ("seq", "slot", "step", "bytes", "at", "seconds")}


def test_a_snapshot_cut_short_leaves_the_named_slot_alone(tmp_path, store):
    streamer = cs.Streamer(str(tmp_path), store.grant())
    _save(tmp_path, b"good-1", step=1)
    assert streamer.flush(10)["ok"]
    before = store.latest()
    _save(tmp_path, b"newer-2", step=2)
    (tmp_path / "checkpoints" / "extra.pt").write_bytes(b"extra")
    store.fail = lambda key: 503 if key.endswith("last.pt") else None  # mid-snapshot
    rec = streamer.flush(10)
    assert rec["ok"] is False and "HTTP 503" in rec["error"]
    assert (rec["seq"], rec["slot"]) == (2, "b")
    assert store.latest() == before  # still names slot a, untouched
    assert store.objects[f"{PREFIX}stream/a/checkpoints/last.pt"] == b"good-1"
    store.fail = lambda key: None
    rec = streamer.flush(10)
    assert rec["ok"] and (rec["seq"], rec["slot"]) == (2, "b")  # the same slot, tried again


def test_a_lost_manifest_answer_is_resolved_before_any_slot_is_written(tmp_path, store):
    """S3 may have stored a latest.json whose answer never came: either slot may be named.
    The same manifest goes up again before anything else, then the other slot is used."""
    streamer = cs.Streamer(str(tmp_path), store.grant())
    _save(tmp_path, b"one", step=1)
    store.fail = lambda key: 500 if key.endswith("latest.json") else None
    rec = streamer.flush(10)
    assert rec["ok"] is False and "latest.json" not in store.objects
    store.fail = lambda key: None
    _save(tmp_path, b"two", step=2)
    posts = len(store.posts)
    rec = streamer.flush(10)
    assert rec["ok"] and (rec["seq"], rec["slot"], rec["step"]) == (2, "b", 2)
    assert store.posts[posts] == PREFIX + "stream/latest.json"  # seq 1 (slot a) first
    assert store.posts[posts + 1].startswith(PREFIX + "stream/b/")
    assert streamer.uploads == 2


def test_a_checkpoint_over_the_upload_limit_is_an_error_before_anything_is_sent(tmp_path, store):
    _save(tmp_path, b"x" * 2000)
    grant = dict(store.grant(), max_bytes=1000)
    rec = cs.Streamer(str(tmp_path), grant).flush(10)
    assert rec["ok"] is False and "over the 1000-byte upload limit" in rec["error"]
    assert store.posts == []


def test_a_file_written_in_place_during_the_upload_is_not_named(tmp_path, store):
    path = _save(tmp_path, os.urandom(2 << 20))
    store.bytes_per_s = 4 << 20  # half a second for the file

    def scribble():
        time.sleep(0.2)
        with open(path, "r+b") as f:  # a recipe that saves without a rename
            f.write(b"torn")
    threading.Thread(target=scribble).start()
    rec = cs.Streamer(str(tmp_path), store.grant()).flush(10)
    assert rec["ok"] is False and "written to while it was uploaded" in rec["error"]
    assert PREFIX + "stream/latest.json" not in store.objects


def test_the_thread_uploads_and_never_raises(tmp_path, store):
    dead = dict(store.grant(), url="http://127.0.0.1:9/")  # nothing listens there
    broken = cs.Streamer(str(tmp_path), dead, settle_s=0.05, poll_s=0.02)
    good = cs.Streamer(str(tmp_path), store.grant(), settle_s=0.05, poll_s=0.02)
    broken.start()
    good.start()
    _save(tmp_path, b"ckpt", step=1)
    deadline = time.time() + 10
    while not (good.last and broken.last):
        assert time.time() < deadline
        time.sleep(0.02)
    broken.stop(5)
    good.stop(5)
    assert good.last["ok"] and store.latest()["seq"] == 1
    assert broken.last["ok"] is False and "cannot reach" in broken.last["error"]
    assert not broken._thread.is_alive() and not good._thread.is_alive()


def test_stop_cuts_short_an_upload_of_a_replaced_checkpoint(tmp_path, store):
    _save(tmp_path, os.urandom(8 << 20), step=1)
    store.bytes_per_s = 2 << 20  # four seconds for it
    streamer = cs.Streamer(str(tmp_path), store.grant(), settle_s=0.0, poll_s=0.02)
    streamer.start()
    deadline = time.time() + 5
    while streamer._inflight is None:
        assert time.time() < deadline
        time.sleep(0.01)
    _save(tmp_path, b"the newest", step=2)  # written on SIGTERM
    t0 = time.monotonic()
    streamer.stop(timeout_s=10)
    assert time.monotonic() - t0 < 2
    assert streamer.last["ok"] is False and "cut short" in streamer.last["error"]
    store.bytes_per_s = None
    rec = streamer.flush(10)
    assert rec["ok"] and rec["step"] == 2 and rec["seq"] == 1
    assert store.objects[PREFIX + "stream/a/checkpoints/last.pt"] == b"the newest"


# -- restore ------------------------------------------------------------------------------------


def _stored(tmp_path, store, files: dict[str, bytes], step=5) -> dict:
    """Upload `files` (relative paths) with a Streamer; returns the plan for them."""
    src = tmp_path / "src"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    (src / "checkpoints" / checkpoint_manifest.INFO).write_text(json.dumps({"step": step, "epoch": 1}))
    assert cs.Streamer(str(src), store.grant()).flush(30)["ok"]
    return store.plan()


def _restore(tmp_path, plan: dict, jobdir: Path) -> dict:
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return checkpoint_restore.restore(str(tmp_path / "plan.json"), str(jobdir))


def test_restore_brings_back_identical_files_and_appends_the_logs_in_place(tmp_path, store):
    files = {"checkpoints/last.pt": os.urandom(100_000), "checkpoints/run/o.pt": b"o",
             "metrics.jsonl": b'{"step": 1}\n', "output.log": b"attempt 1 said this\n"}
    plan = _stored(tmp_path, store, files)
    job = tmp_path / "job"
    job.mkdir()
    log = open(job / "output.log", "ab")  # the agent's, open before run.sh restores
    log.write(b"cloudtrain agent: starting\n")
    log.flush()
    status = _restore(tmp_path, plan, job)
    assert status["ok"] is True and status["error"] is None, status
    assert (status["seq"], status["step"], status["epoch"]) == (1, 5, 1)
    assert status["files"] == 5 and status["bytes"] == plan["bytes"]
    log.write(b"attempt 2 goes on\n")
    log.close()
    for rel in ("checkpoints/last.pt", "checkpoints/run/o.pt", "metrics.jsonl"):
        assert (job / rel).read_bytes() == files[rel]
    assert (job / "output.log").read_bytes() == (b"cloudtrain agent: starting\n"
                                                 b"attempt 1 said this\nattempt 2 goes on\n")
    assert json.loads((job / checkpoint_manifest.RESTORE_STATUS).read_text())["ok"] is True
    assert not [p for p in job.rglob(".*")]  # no temporary file left


def _good_job(tmp_path) -> Path:
    job = tmp_path / "job"
    (job / "checkpoints").mkdir(parents=True)
    (job / "checkpoints" / "last.pt").write_bytes(b"the good copy")
    return job


@pytest.mark.parametrize("change, why", [
    (lambda f: f.update(size=f["size"] + 1), "bytes downloaded"),
    (lambda f: f.update(size=f["size"] - 1), "more than the"),
    (lambda f: f.update(sha256="0" * 64), "sha256 differs"),
    (lambda f: f.update(url=f["url"] + "-missing"), "HTTP 404"),
], ids=["short", "long", "sha256", "missing"])
def test_restore_refuses_what_does_not_match_and_replaces_nothing(tmp_path, store, change, why):
    plan = _stored(tmp_path, store, {"checkpoints/last.pt": b"stored checkpoint",
                                     "checkpoints/z.pt": b"z"})
    [target] = [f for f in plan["files"] if f["path"] == "checkpoints/z.pt"]  # the last one
    change(target)
    plan["bytes"] = sum(f["size"] for f in plan["files"])
    job = _good_job(tmp_path)
    status = _restore(tmp_path, plan, job)
    assert status["ok"] is False and why in status["error"], status
    assert (job / "checkpoints" / "last.pt").read_bytes() == b"the good copy"
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["last.pt"]


def test_restore_retries_server_errors(tmp_path, store):
    plan = _stored(tmp_path, store, {"checkpoints/last.pt": b"abc"})
    answers = [500, 503]
    original = _Handler.do_GET

    def flaky(self):
        if answers:
            self.send_response(answers.pop(0))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        original(self)
    _Handler.do_GET = flaky
    try:
        status = _restore(tmp_path, plan, tmp_path / "job")
    finally:
        _Handler.do_GET = original
    assert status["ok"], status
    assert (tmp_path / "job" / "checkpoints" / "last.pt").read_bytes() == b"abc"


@pytest.mark.parametrize("path", ["../escaped", "/etc/x", "checkpoints/../../x",
                                  "checkpoints//x", "run.sh", "job.json", "checkpoints/a\nb"])
def test_restore_refuses_unsafe_or_foreign_paths(tmp_path, store, path):
    plan = _stored(tmp_path, store, {"checkpoints/last.pt": b"new"})
    plan["files"][0]["path"] = path
    job = _good_job(tmp_path)
    status = _restore(tmp_path, plan, job)
    assert status["ok"] is False and "not a valid manifest" in status["error"]
    assert (job / "checkpoints" / "last.pt").read_bytes() == b"the good copy"
    assert store.posts and not (tmp_path / "escaped").exists()


def test_restore_does_not_follow_a_link_in_the_job_directory(tmp_path, store):
    plan = _stored(tmp_path, store, {"checkpoints/last.pt": b"new", "checkpoints/b.pt": b"b"})
    outside = tmp_path / "outside"
    outside.mkdir()
    job = tmp_path / "job"
    job.mkdir()
    (job / "checkpoints").symlink_to(outside)
    status = _restore(tmp_path, plan, job)
    assert status["ok"] is False and "unsafe path" in status["error"]
    assert list(outside.iterdir()) == []
    (job / "checkpoints").unlink()
    (job / "checkpoints").mkdir()
    (job / "checkpoints" / "b.pt").symlink_to(outside / "b.pt")  # a link as the file itself
    status = _restore(tmp_path, plan, job)
    assert status["ok"] is False and list(outside.iterdir()) == []


def test_restore_command_prints_one_line_and_exits_1_on_failure(tmp_path, store):
    plan = _stored(tmp_path, store, {"checkpoints/last.pt": b"x" * 2_500_000}, step=42)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    run = [sys.executable, command("checkpoint_stream"), "restore", str(tmp_path / "plan.json")]
    ok = subprocess.run(run + [str(tmp_path / "job")], capture_output=True, text=True,
                        timeout=30)
    assert ok.returncode == 0, ok.stderr
    assert re.fullmatch(r"cloudtrain: restored checkpoint 1 \(step 42, 2\.5 MB\) from the job "
                        r"store in \d+\.\d s\n", ok.stdout), ok.stdout
    plan["files"][0]["sha256"] = "f" * 64
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    bad = subprocess.run(run + [str(tmp_path / "job2")], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("cloudtrain: checkpoint restore failed: ")
    assert bad.stderr.count("\n") == 1
    assert json.loads((tmp_path / "job2" / checkpoint_manifest.RESTORE_STATUS).read_text())["ok"] is False


def test_a_restored_checkpoint_is_not_uploaded_again(tmp_path, store):
    plan = _stored(tmp_path, store, {"checkpoints/last.pt": b"restored"})
    job = tmp_path / "job"
    streamer = cs.Streamer(str(job), store.grant(), settle_s=0.0, start_seq=plan["seq"],
                           start_slot=plan["slot"])  # the agent starts it before run.sh
    assert _restore(tmp_path, plan, job)["ok"]
    posts = len(store.posts)
    assert streamer.poll_once(now=1.0) is None and streamer.poll_once(now=2.0) is None
    rec = streamer.flush(5)
    assert rec["ok"] and rec["seq"] == 1 and len(store.posts) == posts
    _save(job, b"trained further", step=9)
    rec = streamer.flush(5)
    assert (rec["seq"], rec["slot"], rec["step"]) == (2, "b", 9)


# -- the manifest is untrusted ---------------------------------------------------------------


def _valid() -> dict:
    return {"version": 1, "job_id": "ab12cd34", "seq": 3, "slot": "b",
            "files": [{"path": "checkpoints/last.pt", "size": 4, "sha256": "a" * 64},
                      {"path": "output.log", "size": 2, "sha256": "b" * 64}],
            "step": 10, "epoch": None, "step_source": "checkpoint", "taken_at": 1.0,
            "uploaded_at": 2.0, "upload_seconds": 1.0, "bytes": 6, "attempt": None,
            "final": False}


def test_parse_manifest_accepts_a_valid_one_and_names_what_is_wrong():
    assert jobstore_fetch.parse_manifest(json.dumps(_valid()).encode(), "ab12cd34") == _valid()
    cases = [({"seq": 0}, "seq"), ({"seq": True}, "seq"), ({"slot": "c"}, "slot"),
             ({"version": 2}, "version"), ({"bytes": 7}, "bytes"), ({"final": 1}, "final"),
             ({"step": -1}, "step"), ({"step_source": "guess"}, "step_source"),
             ({"taken_at": float("nan")}, "taken_at"), ({"job_id": "other"}, "other")]
    for change, word in cases:
        with pytest.raises(jobstore_fetch.StreamError, match=word):
            jobstore_fetch.parse_manifest(json.dumps(dict(_valid(), **change)).encode(), "ab12cd34")
    twice = _valid()
    twice["files"].append(dict(twice["files"][0]))
    twice["bytes"] = 10
    with pytest.raises(jobstore_fetch.StreamError, match="listed twice"):
        jobstore_fetch.parse_manifest(json.dumps(twice).encode(), "ab12cd34")
    nested = _valid()
    nested["files"].append({"path": "checkpoints/last.pt/x", "size": 0, "sha256": "c" * 64})
    with pytest.raises(jobstore_fetch.StreamError, match="a file and as a folder"):
        jobstore_fetch.parse_manifest(json.dumps(nested).encode(), "ab12cd34")


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_parse_manifest_raises_only_stream_error_on_anything(data):
    kind = data.draw(st.sampled_from(["bytes", "json", "mutated"]))
    if kind == "bytes":
        raw = data.draw(st.binary(max_size=200))
    elif kind == "json":
        raw = json.dumps(data.draw(_json)).encode()
    else:
        doc = _valid()
        key = data.draw(st.sampled_from(sorted(doc) + ["files.path", "files.size",
                                                       "files.sha256", "files"]))
        value = data.draw(_json)
        if key.startswith("files."):
            doc["files"][data.draw(st.integers(0, 1))][key[6:]] = value
        else:
            doc[key] = value
        raw = json.dumps(doc).encode()
    try:
        manifest = jobstore_fetch.parse_manifest(raw, "ab12cd34")
    except jobstore_fetch.StreamError as exc:
        assert "\n" not in exc.message
        return
    assert checkpoint_manifest.check_manifest(manifest) is None  # what comes back is a valid manifest


# -- recipes/common/checkpoint.py ------------------------------------------------------------


def test_save_atomic_writes_checkpoint_info_beside_the_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
    from common import checkpoint

    path = checkpoint.last_checkpoint_path(tmp_path)
    checkpoint.save_atomic({"step": torch.tensor(12), "epoch": 3, "w": torch.ones(2)}, path)
    info = json.loads((path.parent / "checkpoint-info.json").read_text())
    assert info == {"step": 12, "epoch": 3, "file": "last.pt"}
    assert checkpoint_manifest.step_from_info((path.parent / "checkpoint-info.json").read_bytes()) == (12, 3)
    checkpoint.save_atomic({"epoch": 4.5, "w": 1}, path)
    assert json.loads((path.parent / "checkpoint-info.json").read_text()) == \
        {"step": None, "epoch": None, "file": "last.pt"}
    with pytest.raises(Exception):
        checkpoint.save_atomic({"step": 99, "bad": lambda: None}, path)  # does not pickle
    assert json.loads((path.parent / "checkpoint-info.json").read_text())["file"] == "last.pt"
    assert checkpoint.load(path)["epoch"] == 4.5
    other = checkpoint.save_atomic({"model": 1}, tmp_path / "other" / "model.pt")
    assert sorted(p.name for p in other.parent.iterdir()) == ["model.pt"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint-info.json", "last.pt"]
