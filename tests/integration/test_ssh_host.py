"""SSHHost against a real sshd on loopback: every verb over one connection."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cloudtrain.errors import HostError
from cloudtrain.hosts import CommandFailed
from cloudtrain.ssh_host import SSHHost
from cloudtrain.ssh import Endpoint, HostKeyMismatch
from conftest import TMUX_SOCKET
from labs.polling import wait_for
from labs.sshd import SSHD

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")


@pytest.fixture
def sshd(tmp_path):
    server = SSHD(tmp_path / "sshd").start()
    yield server
    server.stop()


@pytest.fixture
def host(sshd):
    h = SSHHost(Endpoint(sshd.host, sshd.port, sshd.user, str(sshd.client_key)), TMUX_SOCKET,
                python=shutil.which("python3") or "python3")
    yield h
    h.close()


def test_home_is_the_login_shells_HOME_not_the_sftp_start_directory(tmp_path):
    """The job directory lives under the HOME the login shell gets (the agent and every
    command run there), which may differ from the passwd home SFTP starts in: the namespace
    lab gives each host its own HOME with SetEnv, and two hosts with one passwd home once
    shared a job directory (two ranks 1, no rank 2: torchrun waited for ever)."""
    home = tmp_path / "its-own-home"
    home.mkdir()
    server = SSHD(tmp_path / "sshd")
    server.config.write_text(server.config.read_text() + f"SetEnv HOME={home}\n")
    server.start()
    h = SSHHost(Endpoint(server.host, server.port, server.user, str(server.client_key)),
                TMUX_SOCKET)
    try:
        assert h.home() == str(home)
    finally:
        h.close()
        server.stop()


def test_run_put_get_read_on_one_connection(host, sshd, tmp_path):
    assert host.run("echo hi; echo err >&2").stdout == "hi\n"
    with pytest.raises(CommandFailed) as info:
        host.run("echo last words >&2; exit 4")
    assert "exited with 4" in info.value.message and "last words" in info.value.message
    assert host.run("exit 4", check=False).exit_code == 4
    src = tmp_path / "f.bin"
    src.write_bytes(b"0123456789")
    remote = str(tmp_path / "remote" / "deep" / "f.bin")
    host.put(src, remote)
    assert host.read(remote, 3, 7) == b"3456"
    assert host.read(remote + ".missing") == b""
    host.get(remote, tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == b"0123456789"
    host.write_text(str(tmp_path / "remote" / "t.txt"), "text\n")
    assert host.tail(str(tmp_path / "remote" / "t.txt"), 5) == (b"text\n", 5)
    assert sshd.connections() == 1


@pytest.mark.parametrize("use_rsync", [True, False])
def test_sync_honours_gitignore_with_rsync_or_tar(host, sshd, tmp_path, use_rsync):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    (src / "run.sh").write_text("echo run\n")
    os.chmod(src / "run.sh", 0o755)
    (src / "big.ckpt").write_text("ignored")
    (src / ".gitignore").write_text("*.ckpt\n")
    host._has_rsync = use_rsync
    dest = tmp_path / "dest"
    assert host.sync(src, str(dest)) == 3
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == \
        [".gitignore", "pkg/a.py", "run.sh"]
    assert os.stat(dest / "run.sh").st_mode & 0o111
    if use_rsync:  # unchanged files are not sent again
        assert host.sync(src, str(dest)) == 0
        (src / "pkg" / "a.py").write_text("A = 222\n")  # rsync quick check: size or mtime
        assert host.sync(src, str(dest)) == 1
    assert sshd.connections() == 1


def test_host_key_is_pinned(sshd, tmp_path):
    ep = Endpoint(sshd.host, sshd.port, sshd.user, str(sshd.client_key))
    first = SSHHost(ep)
    first.run("true")
    pinned = first.describe()["host_key"]
    assert pinned.startswith("ssh-ed25519 ")
    first.close()
    again = SSHHost(Endpoint(sshd.host, sshd.port, sshd.user, str(sshd.client_key), pinned))
    assert again.run("echo ok").stdout == "ok\n"
    again.close()
    # The server's key changes (a different machine answers at that address): refused.
    sshd.stop()
    sshd.host_key.unlink()
    Path(str(sshd.host_key) + ".pub").unlink()
    replaced = SSHD(sshd.dir, sshd.host, sshd.port, sshd.client_key).start()
    try:
        with pytest.raises(HostKeyMismatch, match="changed since first contact"):
            SSHHost(Endpoint(sshd.host, sshd.port, sshd.user, str(sshd.client_key), pinned)).run("true")
    finally:
        replaced.stop()


def test_unreachable_and_bad_key(tmp_path, sshd):
    from labs.loopback import free_port

    with pytest.raises(HostError, match="cannot reach"):
        SSHHost(Endpoint("127.0.0.1", free_port(), "root", str(sshd.client_key))).run("true")
    other = tmp_path / "other_key"
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {other}")
    with pytest.raises(HostError, match="SSH to .* failed"):
        SSHHost(Endpoint(sshd.host, sshd.port, sshd.user, str(other))).run("true")


def test_agent_in_tmux_over_ssh(host, sshd, tmp_path):
    jobdir = str(tmp_path / "jobs" / "sshjob")
    host.install_agent(jobdir)
    host.write_text(f"{jobdir}/run.sh", "echo remote-$((6 * 7)); sleep 30\n")
    host.write_text(f"{jobdir}/job.json", json.dumps({"heartbeat_s": 0.2, "grace_s": 1}))
    host.start_agent("sshjob", jobdir)
    wait_for(lambda: b"remote-42" in host.read(f"{jobdir}/output.log"), what="remote output")
    report = host.probe_job(jobdir, 10)
    assert report["status"]["state"] == "running"
    assert host.session_alive("sshjob")
    final = host.stop_job(jobdir, 1)
    assert final["state"] == "cancelled"
    wait_for(lambda: not host.session_alive("sshjob"), what="session gone")
    assert sshd.connections() == 1


def test_U2_the_grace_of_a_stop_over_ssh_is_the_one_given(host, sshd, tmp_path):
    """job.json says 1 s (the launch's grace); a stop with 8 s gives the job's SIGTERM
    handler its 3 s, and a stop with 1 s of a job launched with 20 s kills it after ~1 s."""
    import time

    for name, trap, launched, grace in (("slowstop", "sleep 3; echo cleaned; exit 0", 1, 8),
                                        ("stubborn", "", 20, 1)):
        jobdir = str(tmp_path / "jobs" / name)
        host.install_agent(jobdir)
        host.write_text(f"{jobdir}/run.sh", f"trap '{trap}' TERM; echo ready; "
                                            "while true; do sleep 0.1; done\n")
        host.write_text(f"{jobdir}/job.json", json.dumps({"heartbeat_s": 0.2,
                                                          "grace_s": launched}))
        host.start_agent(name, jobdir)
        wait_for(lambda: b"ready" in host.read(f"{jobdir}/output.log"), what="job start")
        t0 = time.monotonic()
        final = host.stop_job(jobdir, grace)
        took = time.monotonic() - t0
        assert final["state"] == "cancelled", final
        if name == "slowstop":
            assert b"cleaned" in host.read(f"{jobdir}/output.log")
            assert final["exit_code"] == 0 and 3.0 <= took < grace + 5, took
        else:
            assert final["exit_code"] == 137 and 1.0 <= took < 6.0, took


def test_an_rsync_that_stalls_fails_once_nothing_moved_for_the_idle_bound(tmp_path,
                                                                         monkeypatch):
    """A sync whose other end hangs (the instance froze, the relay stalled) waited up to an
    hour for rsync; rsync now gets --timeout, STREAM_IDLE_S as the tar stream has it, and a
    stall is a HostError that says so, in that time."""
    import time

    from cloudtrain import ssh_host

    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "rsync").write_text("#!/bin/sh\nexec sleep 60\n")  # the far end: never answers
    (shims / "rsync").chmod(0o755)
    server = SSHD(tmp_path / "sshd")
    with open(server.config, "a") as f:
        f.write(f"SetEnv PATH={shims}:/usr/bin:/bin\n")
    server.start()
    monkeypatch.setattr(ssh_host, "STREAM_IDLE_S", 2.0)
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    h = SSHHost(Endpoint(server.host, server.port, server.user, str(server.client_key)),
                TMUX_SOCKET, python=shutil.which("python3") or "python3")
    try:
        h._has_rsync = True
        started = time.monotonic()
        with pytest.raises(HostError, match=r"rsync to .* stalled: nothing moved for 2 s"):
            h.sync(src, str(tmp_path / "dest"))
        assert time.monotonic() - started < 30
    finally:
        h.close()
        server.stop()
