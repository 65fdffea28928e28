"""What `launch` shows while it works (D3), through the real AWS path: moto for EC2 and an
instance that is a network namespace with its own sshd. Driven once through a real pty (a
live display: the phases as lines, a spinner below them) and once piped (plain lines, no
carriage returns); in both the phases come in order and no library noise (paramiko's
tracebacks, D4) reaches the user."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from labs.aws import moto_lab
from labs.terminal import run_in_terminal
from conftest import REPO
from labs.netns import GATEWAY, SUBNET, NetnsLab, lab_ip, netns_available

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd")]

HOST_IPS = (lab_ip(4), lab_ip(5), lab_ip(6))  # moto hands these out first, in order
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def phases(job_id: str, instance: str, ip: str) -> list[str]:
    """The start of each phase line, in the order a launch says them."""
    return [f"launching job {job_id}: waiting until it starts (Ctrl-C cancels the launch)",
            "requesting spot g5.xlarge in us-east-1a",
            f"instance {instance} requested, waiting for it to run",
            f"instance {instance} running ({ip})",
            "waiting for SSH on ",
            f"checking {instance}'s host key",
            "syncing 3 files, 1.5 MB",
            "setting up the host",
            "starting the job in tmux",
            f"started job {job_id}"]


def in_order(text: str, expected: list[str]) -> None:
    at = 0
    for item in expected:
        found = text.find(item, at)
        assert found >= 0, f"{item!r} missing after position {at}:\n{text}"
        at = found + len(item)


def test_d3_launch_phases_in_a_terminal_and_piped(ct_home, tmp_path, monkeypatch):
    tmux_socket = f"ct-prog-{os.getpid()}"
    monkeypatch.setenv("CLOUDTRAIN_TMUX_SOCKET", tmux_socket)
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('trained')\n")
    (work / "a.bin").write_bytes(b"a" * 1_000_000)
    (work / "b.bin").write_bytes(b"b" * 500_000)
    with NetnsLab(tmp_path / "netns") as net, \
            moto_lab(str(GATEWAY), ct_home, tmp_path / "lab", monkeypatch, "10.200.0.0/16", {"us-east-1a": str(SUBNET)}) as lab:
        hosts = [net.add_host(ip) for ip in HOST_IPS]
        try:
            lab.serve_hosts(*[h.start_sshd(client_key=lab.key) for h in hosts])
            lab.write_config(ssh_port=22, ssh_wait_seconds=20.0)
            argv = [sys.executable, "-m", "cloudtrain", "launch", "--instance", "g5.xlarge",
                    "--spot", "--no-recover", "--yes", "--workdir", str(work), "--", "python",
                    "train.py"]

            # 1. In a terminal.
            code, raw = run_in_terminal(argv[3:], timeout=60)
            assert code == 0, raw
            text = ANSI.sub("", raw)
            job_id = re.search(r"launched job ([0-9a-f]{8})", text).group(1)
            (inst,) = lab.instances(**{"tag:cloudtrain:job": job_id})
            in_order(text, phases(job_id, inst["InstanceId"], HOST_IPS[0])
                     + [f"launched job {job_id}: python train.py on aws"])
            assert "Traceback" not in text and "Exception (client)" not in text, text
            assert "\r\x1b[2K" in raw  # a live line, redrawn in place (the spinner)

            # 2. Piped: the same phases as plain lines on stderr, the result on stdout.
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
            assert proc.returncode == 0, proc.stderr
            assert "\r" not in proc.stderr and "\x1b" not in proc.stderr, repr(proc.stderr)
            assert "Traceback" not in proc.stderr and "Exception (client)" not in proc.stderr
            job2 = re.search(r"launched job ([0-9a-f]{8})", proc.stdout).group(1)
            (inst2,) = lab.instances(**{"tag:cloudtrain:job": job2})
            expected = phases(job2, inst2["InstanceId"], HOST_IPS[1])
            lines = proc.stderr.splitlines()
            in_order(proc.stderr, expected)
            # each phase is one whole line of its own
            for item in expected:
                assert any(line.startswith(item) for line in lines), (item, lines)

            # -q: only the job id, no phase lines.
            quiet = subprocess.run([*argv[:4], "-q", *argv[4:]], capture_output=True,
                                   text=True, timeout=60, cwd=REPO)
            assert quiet.returncode == 0, quiet.stderr
            assert re.fullmatch(r"[0-9a-f]{8}\n", quiet.stdout), quiet.stdout
            assert "launching job" not in quiet.stderr and "syncing" not in quiet.stderr
        finally:
            subprocess.run([sys.executable, "-m", "cloudtrain", "down", "--all", "-y"],
                           capture_output=True, timeout=60, cwd=REPO)
            subprocess.run(["tmux", "-L", tmux_socket, "kill-server"], capture_output=True)
