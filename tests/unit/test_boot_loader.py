"""host/boot_loader.py, the first thing an Auto Scaling instance of a job runs (issue 27): shipped
alone with the two modules it imports (what the user-data writes: group_launch.LOADER_MODULES)
into a folder of its own and run as a real process with no AWS keys, it reads `<prefix>boot.tar`
from moto's S3 with the fake IMDS's role credentials, checks the sha256 the user-data names,
unpacks plain files and execs bootstrap.py with the arguments after `--` (a stub here that
records its argv and pid). Whatever is wrong with the object (its sha256, a member that is not
a plain file with a plain name, no bootstrap.py, too large, missing) ends in one stderr line and
EXIT_BOOT, and nothing of it runs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time

import pytest

from cloudtrain.host import boot_loader
from cloudtrain.hosts import host_files, write_host_files
from cloudtrain.providers.aws.group_launch import LOADER_MODULES
from labs.aws import fresh_store, moto_endpoint
from labs.imds import FakeIMDS

__all__ = ["moto_endpoint"]  # the lab's fixture

REGION = "us-east-1"
BUCKET = "cloudtrain-123456789012-us-east-1"
KEY = "jobs/AIDAEXAMPLEOWNER0001/boot01/boot.tar"
REST = ["--bucket", BUCKET, "--jobdir", "/home/u/.cloudtrain/jobs/boot01", "a b", "--", "'$x'"]

STUB = """import json, os, sys
import helper
with open({out!r}, "w") as f:
    json.dump({{"argv": sys.argv[1:], "pid": os.getpid(), "file": os.path.abspath(__file__),
               "helper": helper.VALUE}}, f)
"""


@pytest.fixture
def lab(moto_endpoint, tmp_path, monkeypatch):
    s3 = fresh_store(moto_endpoint, monkeypatch, BUCKET, REGION)
    imds = FakeIMDS(role="ct-instance")
    shipped = tmp_path / "shipped"  # what the user-data wrote: the loader's three modules
    write_host_files(shipped, host_files(LOADER_MODULES))
    yield type("Lab", (), dict(s3=s3, imds=imds, endpoint=moto_endpoint, shipped=shipped,
                               tmp=tmp_path, out=tmp_path / "ran.json",
                               dir=tmp_path / "boot"))
    imds.close()


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = ""
           ) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def good_members(lab) -> list[tuple[tarfile.TarInfo, bytes]]:
    return [member("bootstrap.py", STUB.format(out=str(lab.out)).encode()),
            member("helper.py", b"VALUE = 42\n")]


def put(lab, data: bytes, key: str = KEY) -> str:
    lab.s3.put_object(Bucket=BUCKET, Key=key, Body=data)
    return hashlib.sha256(data).hexdigest()


def loader_argv(lab, digest: str, key: str = KEY) -> list[str]:
    return ["--bucket", BUCKET, "--key", key, "--sha256", digest, "--region", REGION,
            "--endpoint", lab.endpoint, "--imds", lab.imds.url, "--dir", str(lab.dir),
            "--", *REST]


def run_loader(lab, argv: list[str], code: str | None = None) -> subprocess.CompletedProcess:
    """The loader as the instance runs it (no AWS keys, no bytecode beside its files), or
    `code` run with its folder on sys.path (a module attribute changed first)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(lab.tmp), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, str(lab.shipped / "boot_loader.py"), *argv] if code is None else \
        [sys.executable, "-c", code, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120,
                          cwd=str(lab.shipped))


def one_line(proc: subprocess.CompletedProcess, words: str) -> None:
    assert proc.returncode == boot_loader.EXIT_BOOT, proc
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("boot_loader: "), proc.stderr
    assert words in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_good_tar_is_unpacked_and_bootstrap_runs_in_its_place_with_the_args(lab):
    data = tar_of(*good_members(lab))
    proc = run_loader(lab, loader_argv(lab, put(lab, data)))
    assert proc.returncode == 0, proc.stderr
    ran = json.loads(lab.out.read_text())
    assert ran["argv"] == REST  # the arguments after `--`, none of the loader's own
    assert ran["file"] == str(lab.dir / "bootstrap.py") and ran["helper"] == 42
    assert sorted(p.name for p in lab.dir.iterdir()) == ["bootstrap.py", "helper.py"]
    assert (lab.dir / "helper.py").read_bytes() == b"VALUE = 42\n"
    assert (lab.dir.stat().st_mode & 0o777) == 0o700
    # The role's credentials from IMDSv2, every metadata request with its token.
    assert lab.imds.seen and all(h for _, _, h in lab.imds.seen)


def test_bootstrap_replaces_the_loader_process_it_is_not_a_child(lab):
    """exec, not a subprocess: bootstrap.py has the loader's pid (the user-data's process
    tree is the job's)."""
    put(lab, data := tar_of(*good_members(lab)))
    digest = hashlib.sha256(data).hexdigest()
    proc = subprocess.Popen([sys.executable, str(lab.shipped / "boot_loader.py"),
                             *loader_argv(lab, digest)],
                            env={"PATH": os.environ["PATH"], "HOME": str(lab.tmp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(lab.out.read_text())["pid"] == proc.pid


def test_a_tar_whose_sha256_differs_from_the_user_data_s_is_not_unpacked(lab):
    data = tar_of(*good_members(lab))
    put(lab, data)
    proc = run_loader(lab, loader_argv(lab, hashlib.sha256(data + b"x").hexdigest()))
    one_line(proc, "sha256")
    assert not lab.out.exists() and list(lab.dir.iterdir()) == []


@pytest.mark.parametrize("bad", [
    member("../evil.py", b"x"), member("sub/evil.py", b"x"), member("/tmp/evil.py", b"x"),
    member(".hidden.py", b"x"), member("Evil.py", b"x"), member("a b.py", b"x"),
    member("evil\n.py", b"x"), member("sub", kind=tarfile.DIRTYPE),
    member("link.py", kind=tarfile.SYMTYPE, link="/etc/passwd"),
    member("hard.py", kind=tarfile.LNKTYPE, link="bootstrap.py"),
    member("fifo", kind=tarfile.FIFOTYPE),
], ids=["dotdot", "path", "absolute", "hidden", "upper", "space", "newline", "dir", "symlink",
        "hardlink", "fifo"])
def test_a_member_not_a_plain_file_with_a_plain_name_refuses_the_whole_tar(lab, bad):
    """The bad member comes after bootstrap.py: nothing of the tar runs all the same, and
    nothing lands outside the loader's folder."""
    data = tar_of(*good_members(lab), bad)
    proc = run_loader(lab, loader_argv(lab, put(lab, data)))
    one_line(proc, "not a plain file")
    assert not lab.out.exists()
    assert not (lab.tmp / "evil.py").exists() and not (lab.dir / "sub").exists()
    assert not (lab.dir / "link.py").is_symlink()


def test_a_tar_without_bootstrap_py_is_refused(lab):
    data = tar_of(member("helper.py", b"VALUE = 1\n"), member("agent.py", b"print(1)\n"))
    one_line(run_loader(lab, loader_argv(lab, put(lab, data))), "no bootstrap.py")
    assert not lab.out.exists()


def test_an_object_over_the_limit_is_refused_before_its_sha256(lab):
    """More than TAR_MAX_BYTES: refused as read (at most one byte over is read), even with
    the sha256 the user-data names."""
    body = tar_of(*good_members(lab))
    data = body + b"\0" * (boot_loader.TAR_MAX_BYTES + 1 - len(body))
    one_line(run_loader(lab, loader_argv(lab, put(lab, data))), "larger than")
    assert not lab.out.exists() and list(lab.dir.iterdir()) == []


def test_a_tar_that_is_not_a_tar_is_one_line(lab):
    one_line(run_loader(lab, loader_argv(lab, put(lab, os.urandom(3000)))), "boot_loader:")
    assert not lab.out.exists()


SHORT_WAIT = """import sys
from cloudtrain_host import boot_loader
boot_loader.FETCH_WAIT_S, boot_loader.RETRY_S = {wait}, 0.2
sys.exit(boot_loader.main(sys.argv[1:]))
"""


def test_a_missing_object_is_tried_until_the_wait_then_one_line(lab):
    """FETCH_WAIT_S, set short in the loader's own process: the 404 is tried again until
    then, and the line says where it looked and why."""
    wait = 1.5
    started = time.monotonic()
    proc = run_loader(lab, loader_argv(lab, "0" * 64), code=SHORT_WAIT.format(wait=wait))
    took = time.monotonic() - started
    one_line(proc, f"no boot files at {lab.endpoint}")
    assert "HTTP 404" in proc.stderr and KEY in proc.stderr
    assert wait <= took < wait + 20
    assert not lab.out.exists()


def test_an_object_that_appears_during_the_wait_is_fetched(lab, monkeypatch):
    """An upload not yet visible (404 first) is read once it is there: fetch() tries again
    every RETRY_S, within `wait_s`."""
    from cloudtrain.host.awsapi import RoleCredentials, object_url

    monkeypatch.setattr(boot_loader, "RETRY_S", 0.1)
    data = tar_of(*good_members(lab))
    timer = threading.Timer(0.8, put, (lab, data))
    timer.start()
    try:
        started = time.monotonic()
        got = boot_loader.fetch(object_url(BUCKET, KEY, REGION, lab.endpoint), REGION,
                                RoleCredentials(lab.imds.url), wait_s=30)
    finally:
        timer.join()
    assert got == data and 0.7 < time.monotonic() - started < 20


def test_fetch_gives_up_after_its_wait(lab, monkeypatch):
    from cloudtrain.host.awsapi import RoleCredentials, object_url

    monkeypatch.setattr(boot_loader, "RETRY_S", 0.1)
    started = time.monotonic()
    with pytest.raises(boot_loader.BootError, match="HTTP 404"):
        boot_loader.fetch(object_url(BUCKET, KEY, REGION, lab.endpoint), REGION,
                          RoleCredentials(lab.imds.url), wait_s=0.6)
    assert 0.6 <= time.monotonic() - started < 15


def test_no_role_on_the_instance_is_one_line(lab):
    """No instance profile: IMDS lists no role; the loader says so in one line (after its
    wait, short here) and runs nothing."""
    lab.imds.roles["127.0.0.1"] = None
    put(lab, data := tar_of(*good_members(lab)))
    proc = run_loader(lab, loader_argv(lab, hashlib.sha256(data).hexdigest()),
                      code=SHORT_WAIT.format(wait=0.5))
    one_line(proc, "no boot files")
    assert not lab.out.exists()


@pytest.mark.parametrize("argv", [[], ["--bucket", "b"], ["--dir", "/tmp/x", "--", "a"]])
def test_missing_arguments_are_argparse_s_usage_not_a_traceback(lab, argv):
    proc = run_loader(lab, argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "required" in proc.stderr and not lab.out.exists()
