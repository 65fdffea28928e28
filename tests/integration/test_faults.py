"""Fault injection over the AWS path (issue 10): nothing is left billing after the documented
cleanup, whatever happens to the launch, the network or the local state.

The real CLI runs as a separate process against moto's EC2 server (in this process, so its
backend can be slowed down or made to fail) and a real sshd as the instance. Each scenario
ends by counting what still bills in moto: live instances, volumes of live instances and open
spot requests. Every scenario is a row of the table printed at the end of the run
(conftest.py: FAULT_TABLE).

Scenarios (audit F4, F12, F13, F14, F15, F26):
- a launch hit by SIGINT, SIGTERM, SIGHUP or SIGKILL while RunInstances is answering (the
  instance exists, the launcher does not know its id yet) and while syncing;
- the same with --keep (F14), and with the launcher's lease seen from another machine (F13);
- a second Ctrl-C while the first one's cleanup terminates the instance (F15);
- `down` while SSH fails: connection refused, a changed host key, an agent that hangs (F4, F26);
- `down --all` with the local state lost (F12).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from moto.ec2.models.instances import InstanceBackend

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from conftest import FAULT_TABLE, REPO
from labs.polling import wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")

SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP,
           "SIGKILL": signal.SIGKILL}


def billing(aws) -> dict:
    """What still bills (or could) in moto."""
    live = [i for i in aws.instances() if i["State"]["Name"] not in ("terminated", "shutting-down")]
    spot = [r for r in aws.ec2.describe_spot_instance_requests()["SpotInstanceRequests"]
            if r["State"] in ("open", "active")]
    volumes = [v for v in aws.ec2.describe_volumes()["Volumes"]
               if any(a.get("InstanceId") in {i["InstanceId"] for i in live}
                      for a in v.get("Attachments", []))]
    return {"instances": [i["InstanceId"] for i in live], "volumes": len(volumes),
            "spot_requests": len(spot)}


@pytest.fixture(autouse=True)
def _rows_in_the_report(request):
    """The table's rows a test adds go with its report, so that the summary has them also
    when a pytest-xdist worker ran the test (conftest.fault_rows)."""
    before = len(FAULT_TABLE)
    yield
    for row in FAULT_TABLE[before:]:
        request.node.user_properties.append(("fault_table", list(row)))


def record(scenario: str, after_fault: dict, after_cleanup: dict, cleanup: str) -> None:
    FAULT_TABLE.append((scenario, len(after_fault["instances"]), cleanup,
                        len(after_cleanup["instances"]) + after_cleanup["volumes"]
                        + after_cleanup["spot_requests"]))


def _db(ct_home):
    db = sqlite3.connect(ct_home / "state.db")
    db.row_factory = sqlite3.Row
    return db


def _job_row(ct_home):
    try:
        db = _db(ct_home)
        row = db.execute("SELECT * FROM jobs ORDER BY created_at DESC LIMIT 1").fetchone()
        n = db.execute("SELECT COUNT(*) FROM instances").fetchone()[0]
        db.close()
    except sqlite3.OperationalError:
        return None, 0
    return (dict(row) if row else None), n


@pytest.fixture
def slow_run_instances(monkeypatch):
    """moto answers RunInstances 3 s after creating the instance: the window in which it
    exists (and bills) but the launcher does not know its id."""
    original = InstanceBackend.run_instances

    def run_instances(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        time.sleep(3)
        return result

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)


def _launch(big_workdir, *extra) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cloudtrain", "launch", "--instance", "g5.xlarge", "--workdir",
         str(big_workdir), *extra, "--", "sleep", "60"],
        cwd=REPO, env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_point(aws, ct_home, point: str) -> str:
    def reached():
        job, recorded = _job_row(ct_home)
        if job is None:
            return None
        if point == "in RunInstances":
            return job["id"] if aws.instances() and recorded == 0 else None
        return job["id"] if job["state"] == point else None

    return wait_for(reached, timeout=60, interval=0.02, what=point)


def _cleanup_status(cli, job_id) -> str:
    cli("status")
    return "status"


LAUNCH_POINTS = ["in RunInstances", "syncing"]


@pytest.mark.parametrize("point", LAUNCH_POINTS)
@pytest.mark.parametrize("signame", list(SIGNALS))
def test_F13_F15_a_launch_killed_at_any_point_leaves_nothing_billing(
        cli, aws, ct_home, big_workdir, point, signame, request):
    if point == "in RunInstances":
        request.getfixturevalue("slow_run_instances")
    proc = _launch(big_workdir)
    job_id = _wait_point(aws, ct_home, point)
    proc.send_signal(SIGNALS[signame])
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    after_fault = billing(aws)
    if signame != "SIGKILL":
        # Ctrl-C, SIGTERM and SIGHUP clean up before the launcher exits: nothing to do after.
        assert proc.returncode == 130, err
        assert after_fault["instances"] == [], err
        job = cli.job(job_id)
        assert job["state"] == "cancelled", job
        assert job["reason"].startswith("interrupted during launch"), job
        cleanup = "none needed"
    else:
        cleanup = _cleanup_status(cli, job_id)
        assert cli.job(job_id)["state"] == "failed"
    after = billing(aws)
    record(f"launch {point}, {signame}", after_fault, after, cleanup)
    assert after == {"instances": [], "volumes": 0, "spot_requests": 0}


def test_F14_a_keep_launch_whose_launcher_died_is_terminated(cli, aws, ct_home, big_workdir):
    proc = _launch(big_workdir, "--keep")
    job_id = _wait_point(aws, ct_home, "syncing")
    proc.kill()
    proc.wait()
    after_fault = billing(aws)
    _cleanup_status(cli, job_id)
    job = cli.job(job_id)
    assert job["state"] == "failed" and "died during syncing" in job["reason"]
    after = billing(aws)
    record("--keep launch, SIGKILL while syncing", after_fault, after, "status")
    assert after["instances"] == []


def test_F13_a_launch_abandoned_on_another_machine_is_found_by_its_lease(
        cli, aws, ct_home, big_workdir):
    """The launcher ran in a container that is gone: its hostname is not ours, so only the
    lease can tell. Once it has expired, any status fails the job and terminates its
    instance."""
    proc = _launch(big_workdir)
    job_id = _wait_point(aws, ct_home, "syncing")
    proc.kill()
    proc.wait()
    db = _db(ct_home)
    db.execute("UPDATE jobs SET launcher = 'ct-container-7f3a:12345', lease_until = ? "
               "WHERE id = ?", (time.time() + 60, job_id))
    db.commit()
    cli("status")
    assert cli.job(job_id)["state"] == "syncing"  # its lease still runs: it may be working
    assert billing(aws)["instances"]
    db.execute("UPDATE jobs SET lease_until = ? WHERE id = ?", (time.time() - 1, job_id))
    db.commit()
    db.close()
    after_fault = billing(aws)
    cli("status")
    job = cli.job(job_id)
    assert job["state"] == "failed" and "lease expired" in job["reason"], job
    after = billing(aws)
    record("launch SIGKILL on another host (lease)", after_fault, after, "status")
    assert after["instances"] == []


def test_F15_a_second_ctrl_c_does_not_stop_the_termination(cli, aws, ct_home, big_workdir,
                                                            monkeypatch):
    """Termination is slowed down (moto sleeps 2 s in TerminateInstances) and a second
    SIGINT arrives while it runs: the launcher still finishes the job's cleanup."""
    original = InstanceBackend.terminate_instances

    def slow_terminate(self, instance_ids):
        time.sleep(2)
        return original(self, instance_ids)

    monkeypatch.setattr(InstanceBackend, "terminate_instances", slow_terminate)
    proc = _launch(big_workdir)
    job_id = _wait_point(aws, ct_home, "syncing")
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)  # inside the slowed TerminateInstances
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    after_fault = billing(aws)
    assert "cannot be interrupted" in err, err
    job = cli.job(job_id)
    assert job["state"] == "cancelled", job
    record("double Ctrl-C during cleanup", after_fault, after_fault, "none needed")
    assert after_fault["instances"] == []


# -- down while SSH fails -------------------------------------------------------------------------


def _running_job(cli, aws, ct_home) -> str:
    job_id = cli.launch("--instance", "g5.xlarge", "--", "sleep", "120")
    assert cli.job(job_id)["state"] == "running"
    return job_id


def _break_ssh(ct_home, job_id, how: str, aws) -> None:
    db = _db(ct_home)
    host = json.loads(db.execute("SELECT host FROM jobs WHERE id = ?", (job_id,)).fetchone()[0])
    if how == "connection refused":  # e.g. the laptop's address changed: the /32 rule no longer
        host["port"] = 1                # matches (a timeout on AWS, refused here)
    elif how == "host key changed":
        host["host_key"] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOWHk1h3d4OR0eNgtq6Vz7z0h6mG1e3C"
    db.execute("UPDATE jobs SET host = ? WHERE id = ?", (json.dumps(host), job_id))
    db.commit()
    db.close()
    if how == "agent hangs":  # a rogue job (or a stuck disk) makes the agent never answer
        for agent in (aws.work / "remote").glob("agent-*/agent.py"):
            agent.write_text("import time\ntime.sleep(100000)\n")


@pytest.mark.parametrize("how", ["connection refused", "host key changed", "agent hangs"])
def test_F4_F26_down_terminates_whatever_ssh_does(cli, aws, ct_home, how):
    job_id = _running_job(cli, aws, ct_home)
    _break_ssh(ct_home, job_id, how, aws)
    after_fault = billing(aws)
    started = time.monotonic()
    proc = cli("down", job_id, timeout=150)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{job_id}: cancelled" in proc.stdout
    job = cli.job(job_id)
    assert job["state"] == "cancelled"
    after = billing(aws)
    record(f"down, SSH: {how} ({took:.0f} s)", after_fault, after, "down")
    assert after["instances"] == []


def test_F4_down_all_goes_on_past_a_job_it_cannot_reach(cli, aws, ct_home):
    first = _running_job(cli, aws, ct_home)
    second = _running_job(cli, aws, ct_home)
    _break_ssh(ct_home, first, "connection refused", aws)
    after_fault = billing(aws)
    proc = cli("down", "--all", "-y", timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {cli.job(first)["state"], cli.job(second)["state"]} == {"cancelled"}
    after = billing(aws)
    record("down --all, one job unreachable", after_fault, after, "down --all")
    assert after["instances"] == []


def _lose_the_state(ct_home) -> None:
    """Another machine, or a deleted $CLOUDTRAIN_HOME: the store knows nothing."""
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (ct_home / name).unlink(missing_ok=True)


def test_F12_down_all_with_the_state_lost_terminates_tagged_instances(cli, aws, ct_home):
    _running_job(cli, aws, ct_home)
    _lose_the_state(ct_home)
    after_fault = billing(aws)
    assert after_fault["instances"]
    refreshed = cli.ok("status", "--refresh").stdout
    assert "cloudtrain down --all" in refreshed  # says how to end what it cannot track
    proc = cli("down", "--all", "-y")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not in this store: terminated" in proc.stdout
    after = billing(aws)
    record("down --all, local state lost", after_fault, after, "down --all")
    assert after["instances"] == []


def test_F12_down_by_id_of_a_job_known_only_from_its_tags(cli, aws, ct_home):
    job_id = _running_job(cli, aws, ct_home)
    _lose_the_state(ct_home)
    after_fault = billing(aws)
    proc = cli("down", job_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = billing(aws)
    record("down JOB, local state lost", after_fault, after, "down JOB")
    assert after["instances"] == []


def test_F11_a_concurrent_status_never_kills_a_launched_job(cli, aws, ct_home):
    """Many `status` calls while a job launches: the launcher finishing (and exiting) between
    a status's listing and its check must not make that status fail the job."""
    stop = threading.Event()
    seen = []

    def poll():
        while not stop.is_set():
            seen.append(subprocess.run([sys.executable, "-m", "cloudtrain", "status"],
                                       cwd=REPO, env=os.environ, capture_output=True).returncode)

    pollers = [threading.Thread(target=poll) for _ in range(3)]
    for t in pollers:
        t.start()
    try:
        # Long enough to outlast three launches beside three pollers on a loaded machine
        # (30 s did not: the first job had ended by the check); `down --all` ends them.
        ids = [cli.launch("--instance", "g5.xlarge", "--", "sleep", "600") for _ in range(3)]
    finally:
        stop.set()
        for t in pollers:
            t.join()
    assert seen and set(seen) == {0}
    assert [cli.job(j)["state"] for j in ids] == ["running"] * 3
    assert len(billing(aws)["instances"]) == 3
    cli.ok("down", "--all", "-y")
    assert billing(aws)["instances"] == []
