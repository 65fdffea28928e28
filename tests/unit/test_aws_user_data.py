"""user-data's power-off timers and the re-arm script it installs (F16), run with bash in a
temporary directory: the environment overrides user-data documents, a recorder instead of
`shutdown`, and a directory standing in for /run/systemd/system."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cloudtrain.config import Settings
from cloudtrain.errors import MissingDependency
from cloudtrain.hosts import Result
from cloudtrain.providers.aws import AWSProvider, instances
from cloudtrain.providers.aws.session import AwsSession
from cloudtrain.spec import JobSpec
from cloudtrain.state import Job

RECORDER = """#!/bin/bash
echo "$*" >> {log}
"""


def _job():
    return Job(id="abcd1234", name=None, kind="command", recipe=None, command="true",
               backend="aws", state="provisioning", created_at=0.0, started_at=None,
               ended_at=None, exit_code=None, reason=None, spec={}, host=None, jobdir=None,
               metrics=None, cost=None)


def _spec(**fields):
    return JobSpec.of(kind="command", backend="aws", command="true", instance_type="g5.xlarge",
                   max_runtime_s=3600, **fields)


class Box:
    """A fake instance's filesystem: state dir, log, rearm path, systemd dir, a `shutdown`
    on PATH that records its arguments, and a power-off command that records the power-off."""

    def __init__(self, root: Path):
        self.root = root
        self.state = root / "state"
        self.rearm = root / "bin" / "cloudtrain-rearm"
        (root / "systemd").mkdir()
        fake_bin = root / "fakebin"
        fake_bin.mkdir()
        self.shutdown_calls = root / "shutdown-calls"
        self.poweroffs = root / "poweroffs"
        for name, log in (("shutdown", self.shutdown_calls), ("poweroff", self.poweroffs)):
            (fake_bin / name).write_text(RECORDER.format(log=log))
            (fake_bin / name).chmod(0o755)
        self.env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}",
                    "CLOUDTRAIN_UD_STATE_DIR": str(self.state),
                    "CLOUDTRAIN_UD_LOG": str(root / "user-data.log"),
                    "CLOUDTRAIN_UD_REARM": str(self.rearm),
                    "CLOUDTRAIN_UD_SYSTEMD_DIR": str(root / "systemd")}
        self.started: list[int] = []

    def user_data(self, **env) -> subprocess.CompletedProcess:
        script = instances.user_data(AwsSession(Settings(
            shutdown_command=f"sudo {self.root}/fakebin/poweroff now")), _job(), _spec())
        (self.root / "ud.sh").write_text(script)
        return self._run(["bash", str(self.root / "ud.sh")], env)

    def run_rearm(self, *args: str, **env) -> subprocess.CompletedProcess:
        return self._run([str(self.rearm), *args], env)

    def _run(self, argv, env):
        proc = subprocess.run(argv, env={**self.env, **env}, capture_output=True, text=True,
                              timeout=60)
        pid = self.watchdog_pid()
        if pid and pid not in self.started:
            self.started.append(pid)
        return proc

    def watchdog_pid(self) -> int | None:
        marker = self.state / "user-data-ran"
        lines = [l for l in marker.read_text().splitlines() if l.startswith("watchdog_pid=")] \
            if marker.exists() else []
        return int(lines[-1].split("=")[1]) if lines else None

    def calls(self) -> list[str]:
        return self.shutdown_calls.read_text().splitlines() if self.shutdown_calls.exists() else []

    def stop(self):
        for pid in self.started:  # only the watchdogs these tests started, by pid
            for target in (pid, -pid):
                try:
                    os.kill(target, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _watchdog_alive(pid: int) -> bool:
    try:
        return b"cloudtrain-watchdog" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.fixture
def box(tmp_path):
    b = Box(tmp_path)
    yield b
    b.stop()


def test_F16_user_data_installs_rearm_and_arms_both_timers(box):
    proc = box.user_data()
    assert proc.returncode == 0, proc.stderr
    assert os.access(box.rearm, os.X_OK)
    marker = (box.state / "user-data-ran").read_text()
    assert "job_id=abcd1234\n" in marker and "max_runtime_minutes=90\n" in marker
    assert (box.state / "shutdown-command").read_text().strip() == \
        f"{box.root}/fakebin/poweroff now"  # user-data runs as root: no sudo
    assert box.calls() == ["-c", "-h +90 cloudtrain: power-off in 90 min"]
    assert _watchdog_alive(box.watchdog_pid())
    assert (box.state / "user-data-done").exists()


def test_F16_rearm_moves_the_power_off_and_ends_the_old_watchdog(box):
    box.user_data()
    first = box.watchdog_pid()
    proc = box.run_rearm("45")
    assert proc.returncode == 0, proc.stderr
    second = box.watchdog_pid()
    assert second != first and _watchdog_alive(second)
    deadline = time.monotonic() + 5
    while _watchdog_alive(first) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _watchdog_alive(first)
    assert box.calls()[-2:] == ["-c", "-h +45 cloudtrain: power-off in 45 min"]
    marker = (box.state / "user-data-ran").read_text()
    assert marker.count("watchdog_pid=") == 1 and "job_id=abcd1234" in marker
    assert f"cancelled watchdog pid {first}" in (box.root / "user-data.log").read_text()


def test_F16_the_rearmed_watchdog_powers_off_and_the_old_one_never_does(box):
    box.user_data(CLOUDTRAIN_UD_WATCHDOG_SECONDS="2")  # the first job's timer: 2 s
    box.run_rearm("1", CLOUDTRAIN_UD_WATCHDOG_SECONDS="4")  # moved to 4 s from now
    time.sleep(3)
    assert not box.poweroffs.exists()  # the first timer was cancelled
    deadline = time.monotonic() + 10
    while not box.poweroffs.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert box.poweroffs.read_text().splitlines() == ["now"]


def test_RD7_on_a_group_instance_the_watchdog_runs_its_command_and_systemd_waits_5_min(box):
    """RD7: where the boot script of a group's instance wrote watchdog-command (end the group,
    then power off), the re-armed watchdog runs that, and systemd's power-off, which cannot
    run a command first, is scheduled 5 minutes later as the backstop."""
    box.user_data()
    ended = box.root / "group-ended"
    (box.state / "watchdog-command").write_text(
        f"touch {ended}; {box.root}/fakebin/poweroff now\n")
    proc = box.run_rearm("1", CLOUDTRAIN_UD_WATCHDOG_SECONDS="1")
    assert proc.returncode == 0, proc.stderr
    assert box.calls()[-2:] == ["-c", "-h +6 cloudtrain: power-off in 6 min"]
    deadline = time.monotonic() + 10
    while not box.poweroffs.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ended.exists() and box.poweroffs.read_text().splitlines() == ["now"]


def test_F16_rearm_refuses_a_bad_argument_and_changes_nothing(box):
    box.user_data()
    before = box.watchdog_pid()
    for bad in ([], ["abc"], ["-5"], ["10; reboot"]):
        proc = box.run_rearm(*bad)
        assert proc.returncode == 2 and "usage: cloudtrain-rearm MINUTES" in proc.stderr
    assert box.watchdog_pid() == before and _watchdog_alive(before)


def test_F16_rearm_never_kills_a_process_that_is_not_its_watchdog(box):
    box.user_data()
    other = subprocess.Popen(["sleep", "60"])
    try:
        marker = box.state / "user-data-ran"
        marker.write_text(marker.read_text().replace(f"watchdog_pid={box.watchdog_pid()}",
                                                     f"watchdog_pid={other.pid}"))
        assert box.run_rearm("30").returncode == 0
        time.sleep(0.3)
        assert other.poll() is None  # pid reuse: a stranger's process survives
    finally:
        other.kill()
        other.wait()


def test_F16_agent_settings_say_how_and_when_to_rearm():
    p = AWSProvider(Settings())
    s = p.agent_settings(_spec())
    assert s == {"rearm": {"argv": ["sudo", "-n", "/usr/local/bin/cloudtrain-rearm"],
                           "start_minutes": 90, "idle_minutes": None}}
    assert p.agent_settings(_spec(keep=True, idle_minutes=7.5))["rearm"]["idle_minutes"] == 8
    # U40: a kept instance without --idle-minutes had no idle power-off (only the start's
    # max runtime + 30 min); it has keep_idle_minutes' (60 unless config.yaml says)
    assert p.agent_settings(_spec(keep=True))["rearm"]["idle_minutes"] == 60
    assert AWSProvider(Settings(keep_idle_minutes=0.2)).agent_settings(
        _spec(keep=True))["rearm"]["idle_minutes"] == 1
    assert "imds_url" in p.agent_settings(_spec(market="spot"))


class ScriptedHost:
    """Answers the tool probe from a script, runs everything else with bash here."""

    name = "test-host"

    def __init__(self, probes):
        self.probes = list(probes)
        self.python = "python3"
        self.commands = []

    def run(self, command, check=True, timeout=None):
        self.commands.append(command)
        if command.startswith("command -v /opt/pytorch/bin/python"):
            return Result(command, 0, self.probes.pop(0), "")
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                              timeout=timeout)
        return Result(command, proc.returncode, proc.stdout, proc.stderr)


def test_F16_setup_waits_for_user_data_when_tmux_is_missing(tmp_path, monkeypatch):
    import cloudtrain.providers.aws.host_setup as provider_module

    done = tmp_path / "user-data-done"
    monkeypatch.setattr(provider_module, "USER_DATA_DONE", str(done))
    monkeypatch.setattr(provider_module, "USER_DATA_WAIT_S", 20.0)
    host = ScriptedHost(["/usr/bin/python3\ntmux:", "/usr/bin/python3\ntmux:/usr/bin/tmux"])
    timer = threading.Timer(1.0, done.touch)
    timer.start()
    started = time.monotonic()
    AWSProvider(Settings()).setup(host)
    assert time.monotonic() - started >= 0.9  # it waited for user-data, then found tmux
    assert host.python == "/usr/bin/python3" and len(host.commands) == 4
    assert host.commands[-1].startswith("/usr/bin/python3 -c ")  # what its Python carries (RA4)


def test_F16_setup_gives_up_after_the_bounded_wait(tmp_path, monkeypatch):
    import cloudtrain.providers.aws.host_setup as provider_module

    monkeypatch.setattr(provider_module, "USER_DATA_DONE", str(tmp_path / "never"))
    monkeypatch.setattr(provider_module, "USER_DATA_WAIT_S", 2.0)
    host = ScriptedHost(["/usr/bin/python3\ntmux:"])
    with pytest.raises(MissingDependency, match="user-data had not finished after 2 s"):
        AWSProvider(Settings()).setup(host)
