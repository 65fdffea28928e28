"""The mission's own command, `cloudtrain launch --recipe resnet9 --instance p3.2xlarge --spot`,
end to end in the lab (RA2): a Volta type's job gets Canonical's Ubuntu 24.04 (by its SSM
parameter), and its instance, one of the job's Auto Scaling group (tests/labs/asg.py), installs
at boot NVIDIA's proprietary driver and a torch built for CUDA 12.6, against the lab's stand-ins
for Ubuntu's archive, the kernel and PyTorch's index (tests/labs/ubuntu_image.py); the job then
trains on that torch, and nothing is left.
"""

from __future__ import annotations

import os
import sqlite3

import pytest

from labs.asg import CLOUD_INIT_PATH
from labs.cloud import autoscaled_lab
from labs.netns import netns_available
from labs.polling import wait_for
from labs.ubuntu_image import UbuntuImage

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd"),
              pytest.mark.slow]
pytest.importorskip("torch")

PROFILE = "ct-instance"
RESNET9 = ("--recipe", "resnet9", "--profile", "smoke")


@pytest.fixture
def lab(cli, ct_home, tmp_path, monkeypatch):
    # The job's Python is the one the instance installs, not this machine's: no
    # remote_python (the lab's other tests set it).
    with autoscaled_lab(cli, ct_home, tmp_path, monkeypatch, "ct-e2e-volta", PROFILE,
                        drop=("remote_python:",)) as lab:
        lab.ubuntu = UbuntuImage(tmp_path / "ubuntu")
        lab.asg.user_data_env.update(lab.ubuntu.env(CLOUD_INIT_PATH))
        yield lab


def test_RA2_the_missions_p3_command_runs_on_the_volta_image_end_to_end(lab, cli, ct_home):
    """RA2: the dry run names the image and what its instance installs; the launch takes
    Canonical's Ubuntu image by its SSM parameter into the job's group; the instance's
    user-data installs the 580 driver's modules for its running kernel and torch 2.14.1 of
    the CUDA 12.6 build into /opt/cloudtrain/torch; setup waits for that, the job trains
    there (the timeline's software line says so) and succeeds; nothing is left."""
    plan = cli.ok("launch", *RESNET9, "--instance", "p3.2xlarge", "--spot", "--dry-run").stdout
    ami_row = next(line for line in plan.splitlines() if line.strip().startswith("AMI"))
    assert lab.aws.ubuntu_ami in ami_row and "ubuntu-noble-24.04" in ami_row, ami_row
    assert "NVIDIA's proprietary driver 580-server" in ami_row and "CUDA 12.6" in ami_row

    job_id = cli.launch(*RESNET9, "--instance", "p3.2xlarge", "--spot", timeout=400)
    (inst,) = lab.asg.wait_for_group(f"cloudtrain-{job_id}", 1)  # its user-data has ended
    installed = inst.path("/var/lib/lab-apt/installed").read_text().split()
    assert installed == [f"linux-modules-nvidia-580-server-{os.uname().release}",
                         "nvidia-headless-no-dkms-580-server", "nvidia-utils-580-server",
                         "python3-venv"]
    job = cli.wait(job_id, timeout=300, interval=1.0)
    assert job["state"] == "succeeded", cli("logs", job_id).stdout[-3000:]
    template = lab.aws.ec2.describe_launch_templates(
        Filters=[{"Name": "tag:cloudtrain:job", "Values": [job_id]}])["LaunchTemplates"]
    assert not template  # gone with the job; the instance it launched was Ubuntu's
    (reservation,) = lab.aws.ec2.describe_instances(InstanceIds=[inst.id])["Reservations"]
    assert reservation["Instances"][0]["ImageId"] == lab.aws.ubuntu_ami
    db = sqlite3.connect(ct_home / "state.db")
    software = [r[0] for r in db.execute(
        "SELECT detail FROM events WHERE job_id = ? AND phase = 'software'", (job_id,))]
    assert len(software) == 1
    assert software[0].startswith("/opt/cloudtrain/torch/bin/python: torch 2.14.1+cu126")
    wait_for(lambda: not any(lab.asg.leftovers().values()), timeout=120,
             what="nothing of the job left")
