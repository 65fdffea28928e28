"""End to end through the real AWS code path: moto for EC2, an instance that is a network
namespace whose sshd listens on the private IP moto assigned, ResNet9's smoke profile run to
`succeeded`, the host asking to power itself off, and `down` leaving nothing running."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from labs.aws import moto_lab
from labs.netns import GATEWAY, SUBNET, NetnsLab, lab_ip, netns_available

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd")]
pytest.importorskip("torch")

HOST_IP = lab_ip(4)  # the first address moto hands out in the lab's subnet


def test_resnet9_smoke_through_the_aws_path_on_a_namespace_host(cli, ct_home, tmp_path,
                                                                monkeypatch):
    tmux_socket = f"ct-e2e-{os.getpid()}"
    monkeypatch.setenv("CLOUDTRAIN_TMUX_SOCKET", tmux_socket)
    # moto listens on the bridge, so the host's shutdown shim can reach it too.
    with NetnsLab(tmp_path / "netns") as net, \
            moto_lab(str(GATEWAY), ct_home, tmp_path / "lab", monkeypatch, "10.200.0.0/16", {"us-east-1a": str(SUBNET)}) as lab:
        host = net.add_host(HOST_IP)
        try:
            sshd = host.start_sshd(client_key=lab.key)
            # The instance's console prints its host key's fingerprint (F5: checked before
            # anything is uploaded).
            lab.serve_hosts(sshd)
            lab.write_config(ssh_port=22, ssh_wait_seconds=20.0)

            # --no-recover: no supervisor, so the one SSH login counted below is the launch's
            # (recovery end to end: test_spot_recovery.py).
            proc = cli("launch", "--recipe", "resnet9", "--profile", "smoke", "--instance",
                       "g5.xlarge", "--spot", "--no-recover", "--follow", "--quiet",
                       timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            job_id = proc.stdout.splitlines()[0]
            assert "resnet9: done, 3 epochs" in proc.stdout
            job = cli.job(job_id)
            assert job["state"] == "succeeded" and job["metrics"]["epoch"] == 3

            (raw,) = lab.instances(**{"tag:cloudtrain:job": job_id})
            assert raw["PrivateIpAddress"] == HOST_IP
            assert raw["State"]["Name"] == "terminated"
            # The host itself asked to power off (the shim terminated it in moto).
            assert [s["job"] for s in lab.shutdowns()] == [job_id]
            # The job ran inside the namespace: its sshd logged cloudtrain's one login.
            assert sshd.connections() == 1
            remote = json.loads((lab.work / "remote" / "jobs" / job_id / "status.json").read_text())
            assert remote["state"] == "succeeded"
            assert "resnet9: done" in (ct_home / "jobs" / job_id / "output.log").read_text()

            cli.ok("down", "--all", "-y")
            running = [i for i in lab.instances() if i["State"]["Name"] != "terminated"]
            assert running == []
        finally:
            subprocess.run(["tmux", "-L", tmux_socket, "kill-server"], capture_output=True)
