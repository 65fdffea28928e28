"""cloudtrain/hosts.py: what the Host interface brings back, over a real sshd and locally.

A host that lies, stalls or plants things: what comes back from it is untrusted (audit F2,
F3, F7, F19, F26). Real sshd on loopback and real files; a hostile host is played by code in
the job directory, or (for names no real filesystem can hold) by a host whose listing lies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from cloudtrain import hosts, ssh_host
from cloudtrain.errors import HostError
from cloudtrain.local_host import LocalHost
from cloudtrain.ssh_host import SSHHost
from cloudtrain.ssh import Endpoint
from conftest import TMUX_SOCKET
from labs.polling import wait_for
from test_ssh_host import host, sshd  # noqa: F401  (fixtures: a real sshd and an SSHHost on it)

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")


@pytest.fixture(params=["local", "ssh"])
def any_host(request, tmp_path):
    """The same checks for this machine and for a host over a real sshd."""
    if request.param == "local":
        yield LocalHost(TMUX_SOCKET)
    else:
        yield request.getfixturevalue("host")


def _hostile_tree(root: Path, outside: Path) -> None:
    """What code on an instance can leave in its checkpoints directory."""
    (root / "deep" / "er").mkdir(parents=True)
    (root / "last.pt").write_bytes(b"A" * 100)
    (root / "deep" / "er" / "ok.bin").write_bytes(b"B" * 10)
    # F2 (a): a directory whose name forges a second `find` listing line, with an absolute path
    forged = root / f"a\n4 {outside}"  # `mkdir -p "a<newline>4 $T"`, as in the audit
    forged.mkdir(parents=True)
    (forged / "PWNED_ABS").write_text("x")
    (root / "name\rwith\x1bescape").write_text("x")
    # An "absolute-looking" tree: only ever below the destination.
    (root / "tmp" / "aud").mkdir(parents=True)
    (root / "tmp" / "aud" / "PWNED_ABS").write_text("inside")
    os.symlink(outside / "secret.txt", root / "link_to_secret")
    os.symlink(outside, root / "link_dir")
    os.symlink("../../../../../../../../etc/passwd", root / "rel_link")
    os.mkfifo(root / "fifo")


def test_F2_pull_tree_keeps_a_hostile_tree_inside_the_destination(any_host, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET")
    remote = tmp_path / "remote" / "checkpoints"
    _hostile_tree(remote, outside)
    local = tmp_path / "home" / "checkpoints"

    result = any_host.pull_tree(str(remote), local, 1e6)

    got = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    assert got == ["deep/er/ok.bin", "last.pt", "tmp/aud/PWNED_ABS"]
    assert (result.files, result.bytes, result.over_limit) == (3, 100 + 10 + 6, False)
    reasons = dict(result.skipped)
    assert reasons["link_to_secret"] == "symlink" and reasons["link_dir"] == "symlink"
    assert reasons["rel_link"] == "symlink" and reasons["fifo"] == "not a regular file"
    assert reasons["a\\n4 "] == "control characters in the name"
    assert reasons["name\\rwith\\x1bescape"] == "control characters in the name"
    assert result.skipped_count == 6
    assert not (outside / "PWNED_ABS").exists()
    assert all(not p.is_symlink() for p in local.rglob("*"))


def test_F2_pull_tree_stops_at_the_limit_on_bytes_read_and_removes_the_partial_file(any_host, tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "a_small").write_bytes(b"s" * 300)
    (remote / "b_big").write_bytes(b"b" * 5000)  # the listing's size is never trusted: bytes are
    (remote / "c_after").write_bytes(b"c" * 10)
    local = tmp_path / "home"
    result = any_host.pull_tree(str(remote), local, 1000)
    assert result.over_limit
    assert (result.files, result.bytes) == (1, 300)
    assert sorted(p.name for p in local.iterdir()) == ["a_small"]
    assert "over the limit" in dict(result.skipped)["b_big"]


def test_F2_a_file_growing_while_it_is_pulled_is_cut_at_the_limit(host, tmp_path):
    """The size when listed says 10 bytes; the file then grows without end. The copy reads
    only up to the limit and never trusts the listed size."""
    remote = tmp_path / "remote"
    remote.mkdir()
    growing = remote / "grows.log"
    growing.write_bytes(b"x" * 10)
    stop = threading.Event()

    def grow():
        with open(growing, "ab") as f:
            while not stop.is_set():
                f.write(b"y" * 65536)
                f.flush()

    writer = threading.Thread(target=grow, daemon=True)
    writer.start()
    try:
        wait_for(lambda: growing.stat().st_size > 300_000, what="the file to grow")
        result = host.pull_tree(str(remote), tmp_path / "home", 200_000)
    finally:
        stop.set()
        writer.join()
    assert result.over_limit and result.bytes == 0 and result.files == 0
    assert list((tmp_path / "home").iterdir()) == []


class LyingHost(LocalHost):
    """A compromised host: its listing names whatever it likes (what no real filesystem can
    hold, as a hostile SFTP server would send them)."""

    names = ["..", ".", "", "/etc/passwd", "../../escape", "a/../../b", "x\0y", "é" * 200, "fine"]

    def _listdir(self, path):
        if path.endswith("/fine"):
            return []
        return [(n, stat.S_IFREG | 0o644) for n in self.names[:-1]] + [("fine", stat.S_IFDIR)]


def test_F2_names_no_filesystem_holds_are_refused_from_a_lying_host(tmp_path):
    local = tmp_path / "home"
    result = LyingHost(TMUX_SOCKET).pull_tree(str(tmp_path / "nowhere"), local, 1e9)
    assert result.files == 0 and list(local.iterdir()) == []
    reasons = dict(result.skipped)
    assert (reasons[".."], reasons["."], reasons[""]) == ("the name '..'", "the name '.'",
                                                          "the name ''")
    assert reasons["/etc/passwd"] == reasons["../../escape"] == "a '/' or NUL in the name"
    assert reasons["x\\x00y"] == "a '/' or NUL in the name"
    assert reasons["\\xe9" * 200] == "a name longer than 255 bytes"
    assert result.skipped_count == 8


def test_F2_a_symlink_planted_in_the_destination_is_not_written_through(any_host, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    remote = tmp_path / "remote"
    (remote / "sub").mkdir(parents=True)
    (remote / "sub" / "authorized_keys").write_text("ssh-ed25519 attacker")
    local = tmp_path / "home"
    local.mkdir()
    os.symlink(outside, local / "sub")  # left there by an earlier run, say
    result = any_host.pull_tree(str(remote), local, 1e6)
    assert dict(result.skipped)["sub/authorized_keys"] == "resolves outside the destination"
    assert list(outside.iterdir()) == []


def test_F2_missing_remote_tree_is_an_empty_result(any_host, tmp_path):
    result = any_host.pull_tree(str(tmp_path / "none"), tmp_path / "home", 1e6)
    assert (result.files, result.bytes, result.skipped) == (0, 0, [])


# -- F3 ---------------------------------------------------------------------------------------


def test_F3_rsync_sends_a_newline_name_whole_and_never_a_gitignored_file(host, tmp_path):
    if shutil.which("rsync") is None:
        pytest.skip("needs rsync")
    src = tmp_path / "wd"
    src.mkdir()
    (src / ".gitignore").write_text("secret.txt\n")
    (src / "secret.txt").write_text("SECRET")
    (src / "ok\nsecret.txt").write_text("fine")
    (src / "-e not an option").write_text("dash")
    host._has_rsync = True
    dest = tmp_path / "dest"
    host.sync(src, str(dest))
    assert sorted(p.name for p in dest.iterdir()) == ["-e not an option", ".gitignore",
                                                      "ok\nsecret.txt"]
    assert (dest / "ok\nsecret.txt").read_text() == "fine"


# -- F7 ---------------------------------------------------------------------------------------


def test_F7_failed_connects_leave_no_threads_and_print_nothing(sshd, tmp_path, capfd, caplog):
    """paramiko's transport thread logs "Socket exception: Bad file descriptor (9)" when its
    socket is closed under it; outside pytest that reaches stderr (no logging configured)."""
    other = tmp_path / "other_key"
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {other}")
    before = threading.active_count()
    for _ in range(3):
        with pytest.raises(HostError, match="SSH to .* failed"):
            SSHHost(Endpoint(sshd.host, sshd.port, sshd.user, str(other))).run("true")
        with pytest.raises(HostError, match="changed since first contact"):
            SSHHost(Endpoint(sshd.host, sshd.port, sshd.user, str(sshd.client_key),
                             "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherKeyOtherKeyOtherKeyOther")
                    ).run("true")
    wait_for(lambda: threading.active_count() <= before, timeout=5, what="transport threads to end")
    time.sleep(0.5)  # a leaked transport thread logs when it next reads its closed socket
    assert not [r for r in caplog.records if "Socket exception" in r.getMessage()]
    assert capfd.readouterr().err == ""


class Freezer:
    """Stops a real sshd's session processes (SIGSTOP) and resumes them: a host that stops
    answering without closing anything, as one stuck in D state or behind a dropped route."""

    def __init__(self, sshd):
        from cloudtrain.host.job_processes import descendants

        self.session = descendants(sshd.proc.pid)

    def _send(self, sig) -> None:
        for pid in self.session:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # a command that was just ending
                pass

    def freeze(self) -> None:
        self._send(signal.SIGSTOP)

    def thaw(self) -> None:
        self._send(signal.SIGCONT)


# -- F26 and F19: a hostile or hung agent -----------------------------------------------------------


def _installed(host, tmp_path) -> str:
    jobdir = str(tmp_path / "jobs" / "hostile1")
    host.install_agent(jobdir)
    return jobdir


def _replace_agent(host, jobdir, source: str) -> None:
    """What a rogue job (or a compromised host) can do to the agent it runs under."""
    Path(host.agent_path(jobdir)).write_text(source)


@pytest.mark.parametrize("call, bound", [
    (lambda host, jobdir: host.probe_job(jobdir, 10), ("PROBE_TIMEOUT_S", 2.0)),
    (lambda host, jobdir: host.stop_job(jobdir, 1.0), ("STOP_EXTRA_S", 1.0)),  # grace + 1 s
], ids=["probe", "stop"])
def test_F26_an_agent_that_never_answers_raises_within_its_bound(host, tmp_path, monkeypatch,
                                                                  call, bound):
    monkeypatch.setattr(hosts, *bound)
    jobdir = _installed(host, tmp_path)
    _replace_agent(host, jobdir, "import time\ntime.sleep(100000)\n")
    t0 = time.monotonic()
    with pytest.raises(HostError, match="did not finish in 2 s"):
        call(host, jobdir)
    assert time.monotonic() - t0 < 5
    assert host.run("echo still usable").stdout == "still usable\n"


def test_F26_a_dead_connection_fails_fast(host, tmp_path):
    host.run("true")
    host.conn.transport.close()  # what a lost peer leaves behind
    t0 = time.monotonic()
    with pytest.raises(HostError, match="connection .* was lost|lost"):
        host.probe_job(str(tmp_path / "jobs" / "x"), 10)
    with pytest.raises(HostError, match="lost"):
        host.read(str(tmp_path / "anything"))
    assert time.monotonic() - t0 < 2


def test_F26_a_frozen_host_fails_every_call_within_its_bound(host, sshd, tmp_path, monkeypatch):
    """SFTP and commands both give up in time on a frozen host, and the connection serves
    again once the host is back."""
    from cloudtrain import ssh

    monkeypatch.setattr(ssh, "SFTP_TIMEOUT_S", 1.0)
    monkeypatch.setattr(hosts, "PROBE_TIMEOUT_S", 1.0)
    (tmp_path / "f").write_text("data")
    jobdir = _installed(host, tmp_path)
    host.conn._drop_sftp()  # frozen before the first SFTP call of this connection
    host_state = Freezer(sshd)
    host_state.freeze()
    try:
        for call in (lambda: host.read(str(tmp_path / "f")), lambda: host.probe_job(jobdir, 10)):
            t0 = time.monotonic()
            with pytest.raises(HostError):
                call()
            assert time.monotonic() - t0 < 4
    finally:
        host_state.thaw()
    assert host.read(str(tmp_path / "f")) == b"data"
    assert host.run("echo back").stdout == "back\n"


def test_F26_a_host_that_freezes_after_opening_the_channel_still_times_out(host, sshd, monkeypatch):
    """The narrowest window: the channel is open, then the host stops answering before it
    replies to the exec request (paramiko waits for that reply with no timeout)."""
    host.run("true")
    conn = host.conn
    chan = conn._open_channel(5)
    monkeypatch.setattr(conn, "_open_channel", lambda timeout=None: chan)
    host_state = Freezer(sshd)
    host_state.freeze()
    raised = []

    def call():
        try:
            host.run("echo hi", timeout=1)
        except HostError as exc:
            raised.append(exc.message)

    caller = threading.Thread(target=call, daemon=True)  # a hang fails the test, not the run
    try:
        caller.start()
        caller.join(3)
        assert not caller.is_alive(), "exec waited past its deadline"
        assert raised and "did not finish in 1 s" in raised[0]
    finally:
        host_state.thaw()


def test_F26_a_tar_sync_into_a_frozen_host_gives_up(host, sshd, tmp_path, monkeypatch):
    monkeypatch.setattr(ssh_host, "STREAM_IDLE_S", 1.0)
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(8 << 20))  # more than the channel's window
    host._has_rsync = False
    host.run(f"mkdir -p {tmp_path}/dest")
    host_state = Freezer(sshd)
    monkeypatch.setattr(host, "run", lambda *a, **k: None)  # sync's mkdir: done above
    opened = host.conn.open_exec

    def open_then_freeze(command):  # tar starts, then the host stops taking bytes
        chan = opened(command)
        host_state.freeze()
        return chan

    monkeypatch.setattr(host.conn, "open_exec", open_then_freeze)
    try:
        t0 = time.monotonic()
        with pytest.raises(HostError, match="stalled or broke"):
            host.sync(src, str(tmp_path / "dest"))
        assert time.monotonic() - t0 < 5
    finally:
        host_state.thaw()


def test_F26_a_run_without_a_timeout_gets_the_default_deadline(host, monkeypatch):
    monkeypatch.setattr(ssh_host, "RUN_TIMEOUT_S", 1.0)
    with pytest.raises(HostError, match="did not finish in 1 s"):
        host.run("sleep 30")


@pytest.mark.parametrize("printed, message", [
    ("print('not json')", "did not answer with JSON"),
    ("import sys; sys.stdout.buffer.write(b'{\"status\": \"\\xff\\xfe\"}')", "not UTF-8"),
    ("print('[' * 100000 + ']' * 100000)", "nested too deeply"),
    ("print('[1, 2]')", "a list, not an object"),
    ("print('1' * 5000)", "did not answer with JSON"),
])
def test_F19_an_agent_answering_garbage_is_one_host_error(host, tmp_path, printed, message):
    jobdir = _installed(host, tmp_path)
    _replace_agent(host, jobdir, printed + "\n")
    with pytest.raises(HostError, match=message) as info:
        host.probe_job(jobdir, 10)
    assert "\n" not in info.value.message


def test_F19_an_agent_answer_with_wrong_types_is_cut_to_the_schema(host, tmp_path):
    jobdir = _installed(host, tmp_path)
    answer = {"status": {"state": "running", "agent_pid": "abc", "pid": -3, "started_at": "x",
                         "exit_code": 10 ** 30, "reason": "line\nbreak\x1b[31m", "extra": [1]},
              "now": "later", "metrics": [1, 2], "target": {"epoch": 1, "deep": {"a": 1}},
              "runs": None}
    _replace_agent(host, jobdir, f"import json\nprint(json.dumps({answer!r}))\n")
    report = host.probe_job(jobdir, 10)
    assert report["status"] == {"state": "running", "agent_pid": None, "pid": None, "pgid": None,
                                "started_at": None, "ended_at": None, "heartbeat_at": None,
                                "shutdown_requested_at": None, "exit_code": None,
                                "reason": "line break[31m"}
    assert report["now"] is None and report["metrics"] is None
    assert report["target"] == {"epoch": 1}
    _replace_agent(host, jobdir, "print('{\"state\": \"cancelled\", \"exit_code\": 143}')\n")
    assert host.stop_job(jobdir, 1)["state"] == "cancelled"


# -- the agent outside the job directory --------------------------------------------------------


def test_agent_lives_outside_the_jobdir_and_is_installed_once(host, sshd, tmp_path):
    jobdir = str(tmp_path / "jobs" / "abc123")
    host.install_agent(jobdir)
    where = Path(host.agent_path(jobdir))
    assert where.parent.parent == tmp_path and where.parent.name.startswith("agent-")
    assert len(where.parent.name) == len("agent-") + 12
    mtime = where.stat().st_mtime_ns
    host.install_agent(str(tmp_path / "jobs" / "other"))  # same files there: nothing sent
    assert where.stat().st_mtime_ns == mtime
    assert not list(where.parent.rglob(".*.tmp"))
    module = where.parent / hosts.HOST_PACKAGE / "agent.py"
    for path in (where, module):  # a different file there: replaced
        path.write_text("# tampered\n")
    host.install_agent(jobdir)
    shipped = dict(hosts.host_files())
    assert where.read_bytes() == shipped["agent.py"]
    assert module.read_bytes() == shipped[f"{hosts.HOST_PACKAGE}/agent.py"]


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_F19_a_job_overwriting_agent_py_in_its_jobdir_changes_nothing(kind, request, tmp_path):
    host = LocalHost(TMUX_SOCKET) if kind == "local" else request.getfixturevalue("host")
    jobdir = tmp_path / "jobs" / f"tamper{kind}"
    jobdir.mkdir(parents=True)
    host.install_agent(str(jobdir))
    (jobdir / "run.sh").write_text(
        'printf "print(\\"not json\\")\\n" > "$CLOUDTRAIN_JOB_DIR/agent.py"; echo done; sleep 30\n')
    (jobdir / "job.json").write_text(json.dumps({"heartbeat_s": 0.2, "grace_s": 1}))
    host.start_agent(f"tamper{kind}", str(jobdir))
    wait_for(lambda: (jobdir / "agent.py").exists() and b"done" in host.read(f"{jobdir}/output.log"),
             what="the job to plant its agent.py")
    assert host.probe_job(str(jobdir), 10)["status"]["state"] == "running"
    assert host.stop_job(str(jobdir), 1)["state"] == "cancelled"
    wait_for(lambda: not host.session_alive(f"tamper{kind}"), what="session gone")


def _probes_of(jobdir: Path) -> list[str]:
    """`agent.py probe JOBDIR` processes still running on this machine (the lab's hosts)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"probe" in argv and str(jobdir).encode() in argv:
            found.append(proc.name)
    return found


@pytest.mark.parametrize("plant", ["mkfifo", "ln -s /dev/zero"])
@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_F34_a_job_planting_a_fifo_or_dev_zero_as_metrics_does_not_slow_status(
        kind, plant, request, tmp_path):
    """F34: a running job replaces its metrics.jsonl with a FIFO or a link to /dev/zero. The
    probe (what `status` runs) answers at once with the job still running, reading the file
    is a one-line refusal, and no probe process is left waiting on the host."""
    host = LocalHost(TMUX_SOCKET) if kind == "local" else request.getfixturevalue("host")
    name = f"plant{kind}{'fifo' if plant == 'mkfifo' else 'zero'}"
    jobdir = tmp_path / "jobs" / name
    jobdir.mkdir(parents=True)
    host.install_agent(str(jobdir))
    (jobdir / "run.sh").write_text(
        'm="$CLOUDTRAIN_JOB_DIR/metrics.jsonl"; echo \'{"epoch": 1}\' > "$m"; rm -f "$m"; '
        f'{plant} "$m"; echo planted; sleep 30\n')
    (jobdir / "job.json").write_text(json.dumps({"heartbeat_s": 0.2, "grace_s": 1}))
    host.start_agent(name, str(jobdir))
    try:
        wait_for(lambda: b"planted" in host.read(f"{jobdir}/output.log"),
                 what="the job to plant its metrics.jsonl")
        started = time.monotonic()
        report = host.probe_job(str(jobdir), 10)
        assert report["status"]["state"] == "running" and report["metrics"] is None
        with pytest.raises(HostError, match="not a regular file"):
            host.read(f"{jobdir}/metrics.jsonl")
        assert time.monotonic() - started < 10  # before: 20 s, the probe's deadline
        assert _probes_of(jobdir) == []
    finally:
        host.stop_job(str(jobdir), 1)
        wait_for(lambda: not host.session_alive(name), what="session gone")
