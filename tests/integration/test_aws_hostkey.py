"""The first SSH contact checks the instance's host key against the fingerprints it printed
on its console (F5): the lab's sshd is the instance, moto's GetConsoleOutput is patched to
print its real fingerprint (verified), another one (refused), or none (trusted on first use)."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from conftest import error_line

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")


def _details(ct_home, job_id):
    db = sqlite3.connect(ct_home / "state.db")
    (row,) = db.execute("SELECT details FROM instances WHERE job_id = ?", (job_id,)).fetchall()
    return json.loads(row[0])


def _host_key_events(cli, job_id):
    return [p.get("detail") for p in cli.job(job_id)["timeline"] if p["name"] == "host-key"]


def test_F5_the_key_listed_on_the_console_is_verified(cli, aws, ct_home):
    proc = cli("launch", "--instance", "g5.xlarge", "--follow", "--quiet", "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    (event,) = _host_key_events(cli, job_id)
    assert event.startswith("verified SHA256:") and "console output" in event
    details = _details(ct_home, job_id)
    assert details["host_key_verified"] is True
    assert details["host_key"].split()[0] == "ssh-ed25519"


def test_F5_a_key_the_console_does_not_list_is_refused_and_the_instance_terminated(cli, aws, ct_home):
    aws.console_output(aws.fingerprint_block(fingerprints=("SHA256:" + "Q" * 43,)))
    proc = cli("launch", "--instance", "g5.xlarge", "--", "echo", "hi", timeout=60)
    assert proc.returncode == 1
    first = error_line(proc.stderr)
    assert "possible interception" in first and "refusing to connect" in first
    (raw,) = aws.instances()
    assert raw["State"]["Name"] == "terminated"
    job = json.loads(cli.ok("status", "--json").stdout)[0]
    assert job["state"] == "failed"
    (event,) = _host_key_events(cli, job["id"])
    assert event.startswith("REFUSED SHA256:")
    # Nothing was sent to the host that answered: no job directory was ever made there.
    assert not (aws.work / "remote" / "jobs").exists()


def test_F5_no_fingerprints_on_the_console_is_trust_on_first_use_recorded(cli, aws, ct_home):
    aws.console_output("Linux version 6.8.0-1015-aws\ncloud-init: still running\n")
    proc = cli("launch", "--instance", "g5.xlarge", "--follow", "--quiet", "--", "echo", "hi",
               timeout=90)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    (event,) = _host_key_events(cli, job_id)
    # The lab's SSH wait is 5 s: the wait for fingerprints is never longer than it.
    assert event.startswith("trusted on first use: SHA256:") and "after 5 s" in event
    assert _details(ct_home, job_id)["host_key_verified"] is False
    # F37: and the launch itself says so, not only the timeline
    (instance,) = [i["InstanceId"] for i in aws.instances()]
    assert f"WARNING: host key of {instance} trusted on first use (no fingerprints in its " \
           "console output after 5 s)" in proc.stderr


def test_F37_the_wait_for_fingerprints_counts_from_when_ssh_answers(cli, aws, ct_home):
    """sshd answers late (5 s into an 8 s SSH wait) and cloud-init prints the keys 5 s after
    that: counted from the start of the SSH wait the window had closed (trust on first use);
    counted from the answer, the key is verified."""
    import threading
    import time

    aws.write_config(ssh_wait_seconds=8.0)
    aws.console_output("Linux version 6.8.0-1015-aws\ncloud-init: still running\n")
    aws.sshd.stop()
    block = aws.fingerprint_block(aws.sshd.host_key)
    done = threading.Event()

    def boot():
        while not done.is_set() and not [i for i in aws.instances()
                                         if i["State"]["Name"] == "running"]:
            time.sleep(0.05)
        if done.wait(5.0):
            return
        aws.sshd.start()
        if not done.wait(5.0):
            aws.console_output(block)

    booting = threading.Thread(target=boot)
    booting.start()
    try:
        proc = cli("launch", "--instance", "g5.xlarge", "--follow", "--quiet", "--", "echo",
                   "hi", timeout=120)
    finally:
        done.set()
        booting.join()
    assert proc.returncode == 0, proc.stderr
    (event,) = _host_key_events(cli, proc.stdout.splitlines()[0])
    assert event.startswith("verified SHA256:"), event
    assert "WARNING" not in proc.stderr


def test_F37_strict_policy_refuses_a_key_it_cannot_check(cli, aws, ct_home):
    aws.write_config(host_key_policy="strict")
    aws.console_output("Linux version 6.8.0-1015-aws\ncloud-init: still running\n")
    proc = cli("launch", "--instance", "g5.xlarge", "--", "echo", "hi", timeout=90)
    assert proc.returncode == 1, proc.stderr
    (instance,) = aws.instances()
    assert error_line(proc.stderr) == (
        f"Error: host key of {instance['InstanceId']} not checked: no fingerprints in its "
        "console output after 5 s, and host_key_policy is strict")
    assert "trusted on first use" not in proc.stderr
    assert instance["State"]["Name"] == "terminated"
    job = json.loads(cli.ok("status", "--json").stdout)[0]
    assert job["state"] == "failed"
    (event,) = _host_key_events(cli, job["id"])
    assert event.startswith("REFUSED SHA256:") and "host_key_policy: strict" in event
    assert not (aws.work / "remote" / "jobs").exists()  # nothing was sent to that host


def test_F5_console_output_refused_is_trust_on_first_use_at_once(cli, aws, monkeypatch):
    """A policy without ec2:GetConsoleOutput: no point waiting for fingerprints."""
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses.general import General

    def refused(self):
        raise EC2ClientError("UnauthorizedOperation", "You are not authorized to perform this "
                             "operation. User: x is not authorized to perform: "
                             "ec2:GetConsoleOutput")

    monkeypatch.setattr(General, "get_console_output", refused)
    aws.write_config(ssh_wait_seconds=60.0)  # a wait for fingerprints would show
    proc = cli("launch", "--instance", "g5.xlarge", "--follow", "--quiet", "--", "echo", "hi",
               timeout=40)
    assert proc.returncode == 0, proc.stderr
    (event,) = _host_key_events(cli, proc.stdout.splitlines()[0])
    assert event.startswith("trusted on first use: SHA256:")
    assert "ec2:GetConsoleOutput refused" in event
    assert "WARNING: host key of i-" in proc.stderr and "GetConsoleOutput refused" in proc.stderr
