"""user-data's power-off timers and the re-arm script it installs (F16), run with bash in a
temporary directory: the environment overrides user-data documents, a recorder instead of
`shutdown`, and a directory standing in for /run/systemd/system."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

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
    return JobSpec.of(**{"kind": "command", "backend": "aws", "command": "true",
                         "instance_type": "g5.xlarge", "max_runtime_s": 3600, **fields})


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

    def user_data(self, spec=None, **env) -> subprocess.CompletedProcess:
        script = instances.user_data(AwsSession(Settings(
            shutdown_command=f"sudo {self.root}/fakebin/poweroff now")), _job(), spec or _spec())
        (self.root / "ud.sh").write_text(script)
        return self._run(["bash", str(self.root / "ud.sh")], env)

    def run_rearm(self, *args: str, **env) -> subprocess.CompletedProcess:
        return self._run([str(self.rearm), *args], env)

    def _run(self, argv, env):
        proc = subprocess.run(argv, env={**self.env, **env}, capture_output=True, text=True,
                              timeout=180)
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
        self.ready_file = None
        self.commands = []

    def run(self, command, check=True, timeout=None):
        self.commands.append(command)
        if command.startswith("command -v /opt/cloudtrain/torch/bin/python"):
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
    assert host.python == "/usr/bin/python3" and len(host.commands) == 5
    assert host.commands[-2].startswith("/usr/bin/python3 -c ")  # what its Python carries (RA4)


def test_F16_setup_gives_up_after_the_bounded_wait(tmp_path, monkeypatch):
    import cloudtrain.providers.aws.host_setup as provider_module

    monkeypatch.setattr(provider_module, "USER_DATA_DONE", str(tmp_path / "never"))
    monkeypatch.setattr(provider_module, "USER_DATA_WAIT_S", 2.0)
    host = ScriptedHost(["/usr/bin/python3\ntmux:"])
    with pytest.raises(MissingDependency, match="user-data had not finished after 2 s"):
        AWSProvider(Settings()).setup(host)


# RA2: a Volta type's Ubuntu image installs the NVIDIA driver and torch at boot


@pytest.fixture
def ubuntu(tmp_path):
    """The outside world of a Volta instance's install, as the lab plays it."""
    from labs.ubuntu_image import UbuntuImage

    return UbuntuImage(tmp_path / "ubuntu")


def _volta(box, ubuntu, **env) -> subprocess.CompletedProcess:
    return box.user_data(_spec(instance_type="p3.2xlarge"), **{
        **ubuntu.env(box.env["PATH"]), "LAB_APT_ROOT": str(box.root / "apt"),
        "CLOUDTRAIN_UD_TORCH_VENV": str(box.root / "torch"), **env})


def test_RA2_a_volta_instance_installs_the_proprietary_driver_and_a_cuda_12_6_torch(box, ubuntu):
    """RA2: user-data of a p3 job (and only of a Volta type's) installs, after arming the
    power-off timers and before it says it is done: NVIDIA's driver branch 580 as Ubuntu's
    signed modules for the running kernel, its headless driver and nvidia-smi, loads the
    module, then torch 2.14.1 and torchvision 0.29.1 from PyTorch's CUDA 12.6 index into a
    virtual environment, which is then the job's Python (the software probe reads the
    CUDA 12.6 build there)."""
    from cloudtrain.providers.aws.host_setup import SOFTWARE_PROBE

    proc = _volta(box, ubuntu)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = (box.root / "user-data.log").read_text()
    assert "software: installed" in log and not (box.state / "software-failed").exists()
    assert (box.state / "user-data-done").exists()
    assert box.calls() == ["-c", "-h +90 cloudtrain: power-off in 90 min"]  # timers first
    kernel = os.uname().release
    assert (box.root / "apt" / "installed").read_text().split() == [
        f"linux-modules-nvidia-580-server-{kernel}", "nvidia-headless-no-dkms-580-server",
        "nvidia-utils-580-server", "python3-venv"]
    assert "nvidia-smi lists no GPU" in log  # no V100 here; the job's own check decides
    python = box.root / "torch" / "bin" / "python"
    probe = subprocess.run([str(python), "-c", SOFTWARE_PROBE], capture_output=True,
                           text=True, timeout=60)
    assert probe.returncode == 0 and '"torch": "2.14.1+cu126"' in probe.stdout, probe
    imports = subprocess.run([str(python), "-c", "import torch, torchvision, numpy, PIL"],
                             capture_output=True, text=True, timeout=120)
    assert imports.returncode == 0, imports.stderr
    # a type the DLAMI runs installs nothing
    (box.root / "g5").mkdir()
    again = Box(box.root / "g5")
    try:
        proc = again.user_data(**{**ubuntu.env(box.env["PATH"]),
                                  "LAB_APT_ROOT": str(box.root / "apt-g5")})
        assert proc.returncode == 0
        assert "cloudtrain-software" not in (again.root / "user-data.log").read_text()
        assert not (box.root / "apt-g5").exists()
    finally:
        again.stop()


@pytest.mark.parametrize("change, step", [
    ({"env": {"LAB_APT_FAIL": "update"}}, "apt-get update failed (exit 11)"),
    ({"driver": "590"}, "installing NVIDIA's driver 590-server failed (exit 12)"),
    ({"torch": ("torch==2.99.0",)}, "installing torch failed (exit 15)")])
def test_RA2_a_failed_install_is_kept_and_setup_names_the_step(box, ubuntu, monkeypatch,
                                                               change, step):
    """RA2: where the install fails (no mirror; a driver branch the archive lacks; a torch
    the index lacks), user-data still ends and the timers stand; the exit code is kept, and
    setup, which waits for the install before choosing the job's Python, fails the launch
    with the step that failed and the log's last line, never a job that trains on the CPU."""
    import cloudtrain.providers.aws.host_setup as host_setup
    from cloudtrain.providers.aws import images

    if "driver" in change:
        monkeypatch.setattr(images, "VOLTA_DRIVER", change["driver"])
    if "torch" in change:
        monkeypatch.setattr(images, "VOLTA_TORCH", change["torch"])
    proc = _volta(box, ubuntu, **change.get("env", {}))
    assert proc.returncode == 0 and (box.state / "user-data-done").exists()
    assert box.calls() == ["-c", "-h +90 cloudtrain: power-off in 90 min"]
    monkeypatch.setattr(host_setup, "SOFTWARE_FAILED", str(box.state / "software-failed"))
    monkeypatch.setattr(host_setup, "USER_DATA_LOG", str(box.root / "user-data.log"))
    host = ScriptedHost([])
    host.ready_file = str(box.state / "user-data-done")
    with pytest.raises(MissingDependency, match=re.escape(step)) as info:
        AWSProvider(Settings()).setup(host)
    assert "; its last line: " in str(info.value) and "\n" not in str(info.value)
    assert "cloudtrain-user-data: done" not in str(info.value)
    assert host.python == "python3"  # no Python chosen: the launch fails before the job


def test_RA2_setup_waits_for_the_boot_time_install_then_takes_its_python(tmp_path):
    """RA2: SSH answers long before user-data ends; a Volta instance's setup waits for it
    (bounded) and only then looks for the job's Python, finding the install's."""
    done = tmp_path / "user-data-done"
    host = ScriptedHost(["/opt/cloudtrain/torch/bin/python\ntmux:/usr/bin/tmux"])
    host.ready_file = str(done)
    timer = threading.Timer(1.0, done.touch)
    timer.start()
    started = time.monotonic()
    AWSProvider(Settings()).setup(host)
    assert time.monotonic() - started >= 0.9
    assert host.python == "/opt/cloudtrain/torch/bin/python"
    assert host.commands[0].startswith("i=0; while [ ! -e ")


def test_RB3_user_data_reads_the_images_shared_libraries_once_and_setup_says_how_long(box, tmp_path):
    """RB3: a root volume restored from the image's snapshot fetches each block from S3 the
    first time it is read, so the job's first `import torch` paid for torch's and CUDA's
    libraries on the clock. user-data reads the image's shared libraries (*.so*) once, in
    the background, and keeps how long that took and how much it read; setup's timeline
    line says it. Other files are not read; a record from the instance is untrusted."""
    from cloudtrain.providers.aws.host_setup import warm_said

    warm = tmp_path / "pytorch"
    (warm / "lib").mkdir(parents=True)
    (warm / "lib" / "libtorch_cuda.so").write_bytes(b"x" * 300_000)
    (warm / "lib" / "libcudnn.so.9").write_bytes(b"y" * 200_000)
    (warm / "lib" / "notes.txt").write_bytes(b"z" * 999_999)
    proc = box.user_data(CLOUDTRAIN_UD_WARM_DIR=str(warm))
    assert proc.returncode == 0, proc.stderr
    record = box.state / "warm-read"
    deadline = time.monotonic() + 30
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = record.read_text()
    assert "bytes=500000\n" in text and re.search(r"^seconds=\d+$", text, re.M), text
    said = warm_said(text)
    assert said.startswith("; its root volume's first reads (the image's shared libraries, "
                           "0.0 GB, fetched from the snapshot) took ")
    assert warm_said("") == "" and warm_said("seconds=1e9\nrm -rf /") == ""
    assert box.user_data(CLOUDTRAIN_UD_WARM_DIR=str(tmp_path / "none")).returncode == 0


def test_RA2_a_volta_type_s_user_data_fits_ec2s_16_kb_gzipped():
    """EC2 takes at most 16 KB of user-data; a Volta type's, with the driver and torch
    install, is close to that as text: it is sent gzipped (cloud-init unpacks it)."""
    import gzip

    text = instances.user_data(AwsSession(Settings()), _job(), _spec(instance_type="p3.2xlarge"))
    assert "cloudtrain-software" in text and len(text.encode()) > 14_000
    assert len(gzip.compress(text.encode(), 9, mtime=0)) < 16384 // 2


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_RB3_a_warm_read_record_from_the_instance_is_untrusted(answer):
    """Whatever the instance's warm-read holds, the timeline gets one bounded line or none."""
    from cloudtrain.providers.aws.host_setup import warm_said

    said = warm_said(answer)
    assert said == "" or (said.startswith("; its root volume's first reads") and
                          "\n" not in said and len(said) < 200)
