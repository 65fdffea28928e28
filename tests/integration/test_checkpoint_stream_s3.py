"""The checkpoint stream against moto's S3 server: the agent's Streamer POSTing through the
job's presigned grant, the orchestrator's latest_checkpoint and restore_plan reading it back,
and checkpoint_restore.restore downloading through presigned GETs into a fresh job directory.

moto does not check a presigned POST's policy (tests/integration/test_jobstore_s3.py says
where that is covered). Failures mid-snapshot come from a small proxy in front of moto that
stops forwarding, as S3 or the network would.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
import requests

from labs.aws import moto_endpoint  # noqa: F401  (fixture)
from cloudtrain.host import agent_store, agent_upload, checkpoint_manifest, checkpoint_restore
from cloudtrain.host import job_status
from cloudtrain.host import checkpoint_stream as cs
from cloudtrain.providers.aws import jobstore, jobstore_fetch
from labs.credentials import CLIENT_CREDS
from labs.imds import FakeIMDS
from labs.loopback import QuietServer, serve
from labs.polling import wait_for
from labs.aws import reset_moto

REGION = "eu-west-1"
ACCOUNT = "123456789012"
OWNER = f"arn:aws:iam::{ACCOUNT}:user/tester"
JOB = "cs12ab34"
KEY = "AIDAJQABLZS4A3QDU576Q"  # the caller's aws:userid: its own prefix jobs/<KEY>/ (F32)
PREFIX = f"jobs/{KEY}/{JOB}/"
CREDS = CLIENT_CREDS
STREAM = f"{PREFIX}stream/"


@pytest.fixture
def s3(moto_endpoint, monkeypatch):  # noqa: F811
    reset_moto(moto_endpoint)
    monkeypatch.setattr(agent_upload, "BACKOFF_S", 0.01)
    monkeypatch.setattr(checkpoint_restore, "RESTORE_BACKOFF_S", 0.01)
    return jobstore.s3_client(boto3.Session(region_name=REGION, **CREDS), REGION, moto_endpoint)


@pytest.fixture
def bucket(s3):
    name = jobstore.bucket_name(ACCOUNT, REGION)
    jobstore.ensure_bucket(s3, name, REGION, OWNER, owner_key=KEY)
    s3.delete_bucket_policy(Bucket=name)  # moto cannot evaluate aws:SecureTransport (see there)
    return name


@pytest.fixture
def grant(s3, bucket):
    return json.loads(json.dumps(jobstore.upload_grant(s3, bucket, JOB, 600, 1 << 30,
                                                       owner_key=KEY)))


def _save(jobdir: Path, files: dict[str, bytes], step: int) -> None:
    """The step's log lines, then checkpoint files renamed into place, then
    checkpoint-info.json, as save_atomic does. The logs come first: checkpoint-info.json is what
    starts a snapshot, and lines appended after it may or may not be in that one (under load
    the upload can begin first), which is right, but would make the comparison below a race."""
    jobdir.mkdir(parents=True, exist_ok=True)
    with open(jobdir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step}) + "\n")
    with open(jobdir / "output.log", "a") as f:
        f.write(f"saved step {step}\n")
    for rel, data in {**files, checkpoint_manifest.INFO: json.dumps({"step": step, "epoch": step // 10}
                                                   ).encode()}.items():
        path = jobdir / "checkpoints" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name("." + path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def _tree(root: Path, under: str = "") -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith(".")
            and p.relative_to(root).as_posix().startswith(under)
            and p.name != checkpoint_manifest.RESTORE_STATUS}


def _restore_into(s3, bucket, target: Path, tmp_path: Path) -> dict:
    manifest = jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY)
    plan = jobstore_fetch.restore_plan(s3, bucket, JOB, manifest, expires_s=600, owner_key=KEY)
    plan_path = tmp_path / f"plan-{target.name}.json"
    plan_path.write_text(json.dumps(plan))
    return checkpoint_restore.restore(str(plan_path), str(target))


def test_streamed_checkpoints_restore_byte_identical_and_alternate_slots(s3, bucket, grant,
                                                                         tmp_path):
    job = tmp_path / "job"
    first = {"last.pt": os.urandom(3 << 20), "run/optimizer.pt": os.urandom(1000)}
    _save(job, first, step=10)
    streamer = cs.Streamer(str(job), grant, settle_s=0.1, poll_s=0.02, attempt=1)
    streamer.start()
    try:
        rec = wait_for(lambda: streamer.last, 15.0, 0.02, "the first upload")
        assert rec["ok"] and (rec["seq"], rec["slot"], rec["step"]) == (1, "a", 10), rec
        manifest = jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY)
        assert (manifest["seq"], manifest["slot"], manifest["step_source"]) == (1, "a",
                                                                                "checkpoint")
        expected = _tree(job)
        assert _restore_into(s3, bucket, tmp_path / "new1", tmp_path)["ok"]
        assert _tree(tmp_path / "new1") == expected

        second = {"last.pt": os.urandom(2 << 20), "run/optimizer.pt": os.urandom(999)}
        _save(job, second, step=20)
        rec = wait_for(lambda: streamer.uploads == 2 and streamer.last, 15.0, 0.02,
                       "the second upload")
        assert (rec["seq"], rec["slot"], rec["step"]) == (2, "b", 20)
    finally:
        streamer.stop(10)
    assert jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY)["slot"] == "b"
    expected = _tree(job)
    status = _restore_into(s3, bucket, tmp_path / "new2", tmp_path)
    assert status["ok"] and (status["seq"], status["step"]) == (2, 20)
    assert _tree(tmp_path / "new2") == expected
    # Slot a still holds the first snapshot whole.
    body = s3.get_object(Bucket=bucket, Key=STREAM + "a/checkpoints/last.pt")["Body"].read()
    assert body == first["last.pt"]


class _Proxy(QuietServer):
    """Forwards POSTs to `upstream` (moto); `fail(n)` (n: the POST's number, from 1) answers 500
    instead; `delay_s` before each forward (a slow link)."""

    def handle_error(self, request, client_address):
        pass  # a client that hung up mid-request (an upload cut short) is part of the test

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.upstream, self.count, self.delay_s = "", 0, 0.0
        self.fail = lambda n: False

    def grant(self, grant: dict) -> dict:
        path = grant["url"].split("/", 3)[3]
        return dict(grant, url=f"http://127.0.0.1:{self.server_address[1]}/{path}")


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.count += 1
        time.sleep(self.server.delay_s)
        if self.server.fail(self.server.count):
            status, text = 500, b"<Error><Code>InternalError</Code></Error>"
        else:
            resp = requests.post(self.server.upstream + self.path, data=body, timeout=30,
                                 headers={"Content-Type": self.headers["Content-Type"]})
            status, text = resp.status_code, resp.content
        self.send_response(status)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)


@pytest.fixture
def proxy(moto_endpoint):  # noqa: F811
    _, server = serve(_ProxyHandler, server_class=_Proxy)
    server.upstream = moto_endpoint
    yield server
    server.close()


@pytest.mark.parametrize("cut", ["server-fails", "deadline"])
def test_a_partial_upload_is_never_used(s3, bucket, grant, proxy, tmp_path, cut):
    job = tmp_path / "job"
    old = {"last.pt": os.urandom(1 << 20), "model.pt": os.urandom(5000)}
    _save(job, old, step=1)
    streamer = cs.Streamer(str(job), proxy.grant(grant))
    assert streamer.flush(30)["ok"]
    expected = _tree(job)

    _save(job, {"last.pt": os.urandom(1 << 20), "model.pt": os.urandom(6000)}, step=2)
    sent = proxy.count
    if cut == "server-fails":  # the second file of the snapshot on: 500s, every retry too
        proxy.fail = lambda n: n > sent + 1
        rec = streamer.flush(30)
        assert "HTTP 500" in rec["error"]
    else:
        proxy.delay_s = 0.3
        rec = streamer.flush(0.5)
        assert "ran out of time" in rec["error"]
    assert rec["ok"] is False and (rec["seq"], rec["slot"]) == (2, "b")
    stored = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=STREAM + "b/")
              .get("Contents", [])]
    assert stored  # the other slot holds part of the new snapshot...
    manifest = jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY)
    assert (manifest["seq"], manifest["slot"], manifest["step"]) == (1, "a", 1)  # ...unnamed
    status = _restore_into(s3, bucket, tmp_path / "new", tmp_path)
    assert status["ok"] and status["step"] == 1
    assert _tree(tmp_path / "new") == expected


def test_tampered_objects_are_refused(s3, bucket, grant, tmp_path):
    job = tmp_path / "job"
    _save(job, {"last.pt": b"the real checkpoint"}, step=5)
    assert cs.Streamer(str(job), grant).flush(30)["ok"]
    key = STREAM + "a/checkpoints/last.pt"
    s3.put_object(Bucket=bucket, Key=key, Body=b"the fake checkpoint")  # same size
    new = tmp_path / "new"
    (new / "checkpoints").mkdir(parents=True)
    (new / "checkpoints" / "last.pt").write_bytes(b"a good local copy")
    status = _restore_into(s3, bucket, new, tmp_path)
    assert status["ok"] is False and "sha256 differs" in status["error"]
    assert (new / "checkpoints" / "last.pt").read_bytes() == b"a good local copy"
    assert sorted(p.name for p in (new / "checkpoints").iterdir()) == ["last.pt"]

    s3.put_object(Bucket=bucket, Key=key, Body=b"shorter")
    with pytest.raises(jobstore_fetch.StreamError, match="stored with 7 bytes, not 19"):
        jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY)
    s3.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(jobstore_fetch.StreamError, match="is not stored in slot a"):
        jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY)
    s3.put_object(Bucket=bucket, Key=STREAM + "latest.json", Body=b"{not json")
    with pytest.raises(jobstore_fetch.StreamError, match="not JSON"):
        jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY)
    s3.put_object(Bucket=bucket, Key=STREAM + "latest.json", Body=b" " * (2 << 20))
    with pytest.raises(jobstore_fetch.StreamError, match="bytes"):
        jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY)
    s3.delete_object(Bucket=bucket, Key=STREAM + "latest.json")
    assert jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY) is None
    assert jobstore_fetch.latest_checkpoint(s3, "cloudtrain-999999999999-eu-west-1", JOB,
                                      owner_key=KEY) is None


def test_fetch_ignores_the_stream_and_delete_removes_it(s3, bucket, grant, tmp_path):
    job = tmp_path / "job"
    _save(job, {"last.pt": b"ckpt"}, step=1)
    assert cs.Streamer(str(job), grant).flush(30)["ok"]
    (job / "status.json").write_text("{}")
    assert agent_upload.upload_job(str(job), grant, timeout_s=30)["ok"]
    out = tmp_path / "out"
    fetched = jobstore_fetch.fetch(s3, bucket, JOB, out, limit_bytes=1 << 30, owner_key=KEY)
    assert fetched.complete and fetched.skipped == [] and fetched.streamed is None
    assert not [f for f in fetched.files if "stream" in f]
    assert _tree(out) == _tree(job, "") and not (out / "stream").exists()
    # Only the stream stored (the job still runs): nothing to fetch, nothing skipped.
    s3.delete_object(Bucket=bucket, Key=f"{PREFIX}manifest.json")
    for rel in _tree(job):
        s3.delete_object(Bucket=bucket, Key=f"{PREFIX}{rel}")
    assert not jobstore_fetch.fetch(s3, bucket, JOB, tmp_path / "o2", limit_bytes=1 << 30,
                              owner_key=KEY).found
    # latest.json and 4 files in slot a
    assert jobstore.delete_job(s3, bucket, JOB, owner_key=KEY) == 5
    assert s3.list_objects_v2(Bucket=bucket, Prefix=PREFIX)["KeyCount"] == 0


# -- the agent, end to end ----------------------------------------------------------------------

JOB_SCRIPT = r"""
import json, os, signal, sys, time
d = os.environ["CLOUDTRAIN_JOB_DIR"]
ck = os.path.join(d, "checkpoints")
os.makedirs(ck, exist_ok=True)

def put(name, data):
    tmp = os.path.join(ck, "." + name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(ck, name))

def save(step):
    put("last.pt", os.urandom(400000) + b"step %d" % step)
    put("checkpoint-info.json", json.dumps({"step": step, "epoch": step // 5,
                                            "file": "last.pt"}).encode())
    with open(os.path.join(d, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": step, "epoch": step // 5}) + "\n")

stopping = []
signal.signal(signal.SIGTERM, lambda *a: stopping.append(1))
step = 0
while not stopping:
    step += 1
    save(step)
    print("saved", step, flush=True)
    time.sleep(0.3)
step += 1
save(step)
print("final checkpoint", step, flush=True)
sys.exit(143)
"""


@contextlib.contextmanager
def _agent(tmp_path, grant, settle_s: float, poll_s: float):
    """The agent as a host runs it (the shipped files), on JOB_SCRIPT, streaming with these
    settings: (its process, the job directory, the fake IMDS whose spot notice it reads);
    killed at the end if it still runs."""
    home = tmp_path / "agent-x"
    home.mkdir()
    from cloudtrain.hosts import write_host_files

    write_host_files(home)  # what a host gets
    jobdir = tmp_path / "jobs" / JOB
    jobdir.mkdir(parents=True)
    (jobdir / "job.py").write_text(JOB_SCRIPT)
    (jobdir / "run.sh").write_text(f"exec {sys.executable} job.py\n")
    imds = FakeIMDS(role=None)  # spot/instance-action is a 404 until announced
    (jobdir / "job.json").write_text(json.dumps({
        "job_id": JOB, "heartbeat_s": 0.1, "grace_s": 10, "imds_url": imds.url,
        "spot_poll_s": 0.1, "results_store": grant,
        "checkpoint_stream": {"settle_s": settle_s, "poll_s": poll_s, "start_seq": 0,
                              "start_slot": None, "attempt": 1}}))
    proc = subprocess.Popen([sys.executable, str(home / "agent.py"), "run", str(jobdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc, jobdir, imds
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        imds.close()


def test_agent_streams_checkpoints_and_flushes_the_one_written_on_the_spot_notice(
        s3, bucket, grant, tmp_path):
    with _agent(tmp_path, grant, 0.1, 0.05) as (proc, jobdir, imds):
        def streamed():
            status = job_status.read_json(str(jobdir / "status.json")) or {}
            record = status.get("checkpoint_stream") or {}
            return record if record.get("uploads", 0) >= 2 else None
        running = wait_for(streamed, 15.0, 0.02, "two streamed checkpoints")
        assert running["ok"] and running["final"] is False and running["error"] is None
        imds.announce("127.0.0.1")
        assert proc.wait(timeout=30) == 0, proc.stderr.read()

    status = json.loads((jobdir / "status.json").read_text())
    assert status["state"] == "preempted"
    final = status["checkpoint_stream"]
    log = (jobdir / "output.log").read_text()
    last_step = int(log.split("final checkpoint ")[1].split()[0])
    assert final["final"] is True and final["ok"] is True and final["error"] is None, final
    assert final["step"] == last_step and final["uploads"] >= 3
    assert final["seconds"] < agent_store.SPOT_UPLOAD_S and final["bytes"] > 400000
    assert f"checkpoint {final['seq']} (step {last_step}," in log

    manifest = jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY)
    assert (manifest["seq"], manifest["slot"], manifest["step"]) == \
        (final["seq"], final["slot"], last_step)
    files = {f["path"]: f for f in manifest["files"]}
    local = (jobdir / "checkpoints" / "last.pt").read_bytes()
    assert files["checkpoints/last.pt"]["sha256"] == hashlib.sha256(local).hexdigest()

    # Then the results, without the checkpoint a second time; their status.json has the flush.
    assert status["results_stored"]["ok"] is True
    results = json.loads(s3.get_object(Bucket=bucket, Key=f"{PREFIX}manifest.json")[
        "Body"].read())
    assert results["checkpoints_in_stream"] is True
    assert not [f for f in results["files"] if f["path"].startswith("checkpoints/")]
    stored_status = json.loads(s3.get_object(Bucket=bucket, Key=f"{PREFIX}status.json")[
        "Body"].read())
    assert stored_status["checkpoint_stream"]["final"] is True
    assert stored_status["checkpoint_stream"]["seq"] == final["seq"]

    # `fetch` brings the job home with the streamed checkpoint in its place.
    out = tmp_path / "home"
    fetched = jobstore_fetch.fetch(s3, bucket, JOB, out, limit_bytes=1 << 30, owner_key=KEY)
    assert fetched.complete and fetched.streamed == final["seq"], fetched.skipped
    assert (out / "checkpoints" / "last.pt").read_bytes() == local
    assert "checkpoints/checkpoint-info.json" in fetched.files


def test_C1_the_agent_streams_a_checkpoint_written_every_0_3_s_with_the_launchs_settings(
        s3, bucket, grant, tmp_path):
    """C1: a job that saves a checkpoint every 0.3 s, its stream as the launch sets it
    (settle_s 2 from checkpoint_settle_seconds, poll_s 1): the checkpoints reach S3 while the
    job writes them, the stored one a few steps behind the newest at most. Before, nothing
    was stored until the job stopped writing (a reclaim without notice went back to the
    start)."""
    def newest_saved(jobdir) -> int:
        said = [line for line in (jobdir / "output.log").read_text().splitlines()
                if line.startswith("saved ")]
        return int(said[-1].split()[1]) if said else 0

    with _agent(tmp_path, grant, 2.0, 1.0) as (proc, jobdir, imds):
        seen = []
        deadline = time.time() + 20
        while len({s for s, _ in seen}) < 4:
            assert time.time() < deadline, seen
            manifest = jobstore_fetch.latest_checkpoint(s3, bucket, JOB, owner_key=KEY)
            if manifest is not None:
                seen.append((manifest["step"], newest_saved(jobdir)))
            time.sleep(0.3)
        assert proc.poll() is None  # still writing: nothing of this came from the end
        stored = [s for s, _ in seen]
        assert stored == sorted(stored)
        assert all(newest - step <= 4 for step, newest in seen), seen
        status = job_status.read_json(str(jobdir / "status.json"))
        assert status["state"] == "running" and status["checkpoint_stream"]["ok"]
        imds.announce("127.0.0.1")
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
