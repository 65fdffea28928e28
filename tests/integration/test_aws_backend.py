"""The AWS backend end to end against moto, with a real sshd at the instance's private IP."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys

import pytest
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models.instances import InstanceBackend

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from conftest import REPO, error_line
from labs.polling import wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")


def _instance_rows(ct_home, job_id):
    db = sqlite3.connect(ct_home / "state.db")
    db.row_factory = sqlite3.Row
    return [dict(r) for r in db.execute("SELECT * FROM instances WHERE job_id = ?", (job_id,))]


def test_recipe_runs_on_an_instance_and_nothing_is_left(cli, aws, ct_home, toy_recipes):
    proc = cli("launch", "--recipe", "toy", "--instance", "g5.xlarge", "--name", "cloudy",
               "--follow", "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.splitlines()[0]
    assert "args {'epochs': 2" in proc.stdout

    job = cli.job(job_id)
    assert job["state"] == "succeeded" and job["backend"] == "aws"
    assert job["metrics"]["epoch"] == 2
    phases = [p["name"] for p in job["timeline"]]
    assert phases[:3] == ["pending", "provisioning", "instance"] and phases[-1] == "succeeded"
    # RA4: the instance's torch, its CUDA build and the driver, read at setup (here the lab
    # host's Python: this venv's torch, no NVIDIA driver), in the timeline
    import importlib.metadata

    db = sqlite3.connect(ct_home / "state.db")
    (software,) = [r[0] for r in db.execute(
        "SELECT detail FROM events WHERE job_id = ? AND phase = 'software'", (job_id,))]
    assert f"torch {importlib.metadata.version('torch')} built for CUDA " in software
    assert software.endswith("; no NVIDIA driver loaded")
    # Logs and metrics came home before the instance went.
    local = ct_home / "jobs" / job_id
    assert "args {" in (local / "output.log").read_text()
    assert len((local / "metrics.jsonl").read_text().splitlines()) == 2
    assert cli.ok("logs", job_id).stdout.startswith("args {")

    (raw,) = aws.instances(**{"tag:cloudtrain:job": job_id})
    assert raw["State"]["Name"] == "terminated"
    tags = aws.tags(raw)
    assert tags["cloudtrain:recipe"] == "toy" and tags["Name"] == f"cloudtrain-{job_id}-cloudy"
    assert tags["cloudtrain:owner"].startswith("arn:aws:")
    assert raw["MetadataOptions"]["HttpTokens"] == "required"
    assert raw["ImageId"] == aws.ami  # the DLAMI, resolved through its SSM parameter
    assert raw["PrivateIpAddress"].startswith("127.0.1.")  # the first AZ had capacity
    attr = aws.ec2.describe_instance_attribute(InstanceId=raw["InstanceId"],
                                               Attribute="instanceInitiatedShutdownBehavior")
    assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    # The agent powered the host off after the job (the shutdown behaviour terminated it).
    assert [s["job"] for s in aws.shutdowns()] == [job_id]
    (row,) = _instance_rows(ct_home, job_id)
    assert row["state"] == "terminated" and row["zone"] == "us-east-1a"
    # One SSH connection for the whole launch-and-follow, every step over it.
    assert aws.sshd.connections() == 1
    assert row["market"] == "on-demand" and row["price_per_hour"] == pytest.approx(1.006)


def test_RH3_a_launch_says_whom_it_opened_the_ssh_port_to(cli, aws, ct_home):
    """RH3: the launch opened SSH to this machine's address (or `ssh_cidr:`'s networks)
    without a word; it now says which, once, before the instance is asked for."""
    proc = cli("launch", "--instance", "g5.xlarge", "--follow", "--", "echo", "hi",
               timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "SSH port" in line]
    assert said == ["SSH port open to 127.0.0.1/32 only"], said


def test_spot_launch(cli, aws, toy_recipes, ct_home):
    proc = cli("launch", "--recipe", "toy", "--instance", "g5.xlarge", "--spot",
               "--max-price", "0.5", "--follow", "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    (raw,) = aws.instances(**{"tag:cloudtrain:job": job_id})
    assert raw.get("InstanceLifecycle") == "spot"
    (row,) = _instance_rows(ct_home, job_id)
    assert row["market"] == "spot"


def _fail_in(zones, code, message="no"):
    original = InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        subnet = kwargs.get("subnet_id")
        zone = self.get_subnet(subnet).availability_zone if subnet else None
        if zone in zones or zones == "all":
            raise EC2ClientError(code, message)
        return original(self, image_id, count, user_data, security_group_names, **kwargs)

    return run_instances


@pytest.mark.parametrize("code, message", [
    ("InsufficientInstanceCapacity", "We currently do not have sufficient g5.xlarge capacity"),
    # RC2: a subnet out of addresses is the AZ's trouble too; the next AZ's subnet has its own
    ("InsufficientFreeAddressesInSubnet", "There are not enough free addresses in subnet "
                                          "'subnet-1' to satisfy the requested number of "
                                          "instances.")])
def test_capacity_error_in_first_az_then_success_in_the_second(cli, aws, ct_home, monkeypatch,
                                                               code, message):
    monkeypatch.setattr(InstanceBackend, "run_instances",
                        _fail_in({"us-east-1a"}, code, message))
    proc = cli("launch", "--instance", "g5.xlarge", "--follow", "--quiet", "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    (row,) = _instance_rows(ct_home, job_id)
    assert row["zone"] == "us-east-1b"
    assert json.loads(row["details"])["attempts"][0]["zone"] == "us-east-1a"
    (raw,) = aws.instances(**{"tag:cloudtrain:job": job_id})
    assert raw["PrivateIpAddress"].startswith("127.0.2.")


def test_no_capacity_anywhere_names_every_az(cli, aws, monkeypatch):
    monkeypatch.setattr(InstanceBackend, "run_instances",
                        _fail_in("all", "InsufficientInstanceCapacity", "no capacity"))
    proc = cli("launch", "--instance", "g5.xlarge", "--", "true")
    assert proc.returncode == 1
    first = error_line(proc.stderr)
    assert "no capacity for g5.xlarge (on-demand) in us-east-1, every AZ tried" in first
    assert "us-east-1a: InsufficientInstanceCapacity" in first and "us-east-1b:" in first
    assert "--spot" in proc.stderr
    assert aws.instances() == []
    job = json.loads(cli.ok("status", "--json").stdout)[0]
    assert job["state"] == "failed" and "no capacity" in job["reason"]


def test_RC1_a_gpus_job_takes_another_type_of_its_gpus_where_no_az_has_its_own(
        cli, aws, ct_home, monkeypatch):
    """RC1: a job whose type --gpus chose (g5.xlarge) tries it in every AZ, then the types
    of the same GPUs it may also run on (g5.2xlarge, ...), in the same AZ order: here no AZ
    has g5.xlarge, and the instance is a g5.2xlarge, recorded (and priced) as one; the
    timeline says why. A job given --instance keeps its one type and fails naming it."""
    original = InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        if kwargs.get("instance_type") == "g5.xlarge":
            raise EC2ClientError("InsufficientInstanceCapacity",
                                 "We currently do not have sufficient g5.xlarge capacity")
        return original(self, image_id, count, user_data, security_group_names, **kwargs)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)
    proc = cli("launch", "--gpus", "A10G:1", "--region", "us-east-1", "--follow", "--quiet",
               "--", "echo", "hi")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    (row,) = _instance_rows(ct_home, job_id)
    assert row["instance_type"] == "g5.2xlarge"
    tried = json.loads(row["details"])["attempts"]
    assert [a["error"].split(":")[0] for a in tried] == ["InsufficientInstanceCapacity"] * 2
    (raw,) = aws.instances(**{"tag:cloudtrain:job": job_id})
    assert raw["InstanceType"] == "g5.2xlarge"
    said = [p["detail"] for p in cli.job(job_id)["timeline"] if p["name"] == "instance"]
    assert "(g5.2xlarge: no capacity for g5.xlarge in any AZ)" in said[0], said
    proc = cli("launch", "--instance", "g5.xlarge", "--", "true")
    assert proc.returncode == 1
    assert "no capacity for g5.xlarge (on-demand) in us-east-1" in error_line(proc.stderr)


def test_quota_error_stops_at_once(cli, aws, monkeypatch):
    monkeypatch.setattr(InstanceBackend, "run_instances",
                        _fail_in("all", "VcpuLimitExceeded", "You have requested more vCPU"))
    proc = cli("launch", "--instance", "g5.xlarge", "--spot", "--", "true")
    assert proc.returncode == 1
    import re

    assert "VcpuLimitExceeded" in proc.stderr
    assert re.search(r"AZs tried: us-east-1[a-f]\)", proc.stderr)  # one AZ, no more
    assert "Service Quotas" in proc.stderr


def test_throttling_is_retried(cli, aws, monkeypatch):
    from moto.ec2.models.instances import InstanceBackend as IB

    original = IB.describe_instances
    state = {"left": 2}

    def flaky(self, *args, **kwargs):
        if state["left"] > 0:
            state["left"] -= 1
            raise EC2ClientError("RequestLimitExceeded", "Request limit exceeded.")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(IB, "describe_instances", flaky)
    proc = cli("launch", "--instance", "g5.xlarge", "--follow", "--", "echo", "ok")
    assert proc.returncode == 0, proc.stderr
    assert state["left"] == 0


def test_ssh_never_answering_terminates_the_instance(cli, aws, ct_home):
    aws.sshd.stop()
    proc = cli("launch", "--instance", "g5.xlarge", "--", "true", timeout=60)
    assert proc.returncode == 1
    first = error_line(proc.stderr)
    assert "SSH to i-" in first and "did not answer in 5 s" in first
    assert "get-console-output --instance-id i-" in proc.stderr
    (raw,) = aws.instances()
    assert raw["State"]["Name"] == "terminated"
    job = json.loads(cli.ok("status", "--json").stdout)[0]
    assert job["state"] == "failed"
    assert all(r["state"] == "terminated" for r in _instance_rows(ct_home, job["id"]))


def test_failing_job_is_failed_and_its_instance_gone(cli, aws):
    proc = cli("launch", "--instance", "g5.xlarge", "--follow", "--", "bash", "-c",
               "echo about to fail; exit 3", timeout=60)
    assert proc.returncode == 1
    assert "about to fail" in proc.stdout and "failed: exited with code 3" in proc.stderr
    (raw,) = aws.instances()
    assert raw["State"]["Name"] == "terminated"


def test_ctrl_c_while_waiting_for_ssh_leaves_no_instance(cli, aws, ct_home):
    aws.sshd.stop()
    aws.write_config(ssh_wait_seconds=60.0)
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "launch", "--instance",
                             "g5.xlarge", "--", "true"], cwd=REPO, env=os.environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: aws.instances(), timeout=30, what="instance started")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    (raw,) = aws.instances()
    assert raw["State"]["Name"] == "terminated"
    job = json.loads(cli.ok("status", "--json").stdout)[0]
    assert job["state"] == "cancelled" and job["reason"] == "interrupted during launch"


def test_keep_then_down_terminates_and_cleans_up(cli, aws, ct_home):
    job_id = cli.launch("--instance", "g5.xlarge", "--keep", "--", "bash", "-c",
                        "echo kept; sleep 60")
    wait_for(lambda: "kept" in cli.ok("logs", job_id).stdout, timeout=30, what="remote output")
    assert cli.job(job_id)["state"] == "running"
    assert len(aws.ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["cloudtrain"]}])["SecurityGroups"]) == 1
    out = cli.ok("down", job_id).stdout
    assert f"{job_id}: cancelled" in out
    (raw,) = aws.instances()
    assert raw["State"]["Name"] == "terminated"
    assert aws.ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["cloudtrain"]}])["SecurityGroups"] == []
    assert aws.ec2.describe_key_pairs()["KeyPairs"] == []
    assert aws.shutdowns() == []  # --keep: the agent did not power the host off
    assert "kept" in (ct_home / "jobs" / job_id / "output.log").read_text()


def test_status_refresh_shows_instances_the_store_does_not_know(cli, aws):
    aws.ec2.run_instances(ImageId=aws.ami, MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
                          TagSpecifications=[{"ResourceType": "instance", "Tags": [
                              {"Key": "cloudtrain:job", "Value": "lostjob1"}]}])
    out = cli.ok("status", "--refresh").stdout
    line = [l for l in out.splitlines() if "lostjob1" in l][0]
    assert "NO: not in the local store" in line and "g5.xlarge" in line


def test_dry_run_creates_nothing_and_checks_permissions(cli, aws):
    proc = cli("launch", "--instance", "g5.xlarge", "--spot", "--dry-run", "--", "true")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "g5.xlarge: 1x A10G" in out and "market       spot" in out
    # spot: EC2 scores both AZs alike (the lab's default), so the AZ whose id the catalog's
    # snapshot prices lowest comes first
    assert re.search(r"AZs to try   us-east-1b use1-az1 \(score 5, \$[0-9.]+/h\), us-east-1a "
                     r"use1-az6 \(score 5, \$[0-9.]+/h\); by EC2's spot placement score", out), out
    assert f"AMI          {aws.ami}" in out
    assert "RunInstances allowed (EC2 DryRun)" in out
    assert aws.instances() == []
    assert json.loads(cli.ok("status", "--json").stdout) == []


def test_RC5_the_dry_run_says_the_azs_a_spot_job_tries_first_by_score(cli, aws, monkeypatch):
    """RC5: the plan asks EC2 for the spot placement scores (the job's node count, three
    types of its GPUs) and lists the AZs by score, then price, each with both: here the AZ
    the catalog prices higher is scored 9 and comes first."""
    from labs.moto_spot_scores import SpotScores

    lab = SpotScores().install(monkeypatch)
    lab.scores.update({"use1-az6": 9, "use1-az1": 3})  # us-east-1a, us-east-1b
    out = cli.ok("launch", "--instance", "g5.xlarge", "--spot", "--nodes", "2", "--dry-run",
                 "--", "true").stdout
    assert re.search(r"AZs to try   us-east-1a use1-az6 \(score 9, \$[0-9.]+/h\), "
                     r"us-east-1b use1-az1 \(score 3, \$[0-9.]+/h\); by EC2's spot placement "
                     r"score for 3 types of the same GPUs \(g5.xlarge, g5.2xlarge, g5.4xlarge\)"
                     r", then price", out), out
    assert [c["TargetCapacity"] for c in lab.calls] == [2]
    assert aws.instances() == []


def test_RC5_a_spot_launch_tries_the_best_scored_az_and_keeps_its_score(cli, aws, ct_home,
                                                                       monkeypatch):
    """RC5: the launch goes to the AZ EC2 scores highest (not the catalog's cheapest,
    us-east-1b), the instance's record keeps the score and the types scored, and the
    timeline says the order and why."""
    from labs.moto_spot_scores import SpotScores

    lab = SpotScores().install(monkeypatch)
    lab.scores.update({"use1-az6": 9, "use1-az1": 3})
    proc = cli("launch", "--instance", "g5.xlarge", "--spot", "--follow", "--quiet", "--",
               "echo", "hi", timeout=120)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.splitlines()[0]
    (row,) = _instance_rows(ct_home, job_id)
    details = json.loads(row["details"])
    assert row["zone"] == "us-east-1a" and details["placement_score"] == 9
    assert details["placement_score_types"] == ["g5.xlarge", "g5.2xlarge", "g5.4xlarge"]
    zones = [p for p in cli.job(job_id)["timeline"] if p["name"] == "zones"]
    assert len(zones) == 1 and zones[0]["detail"].startswith(
        "us-east-1a use1-az6 (score 9, "), zones


def test_RC5_the_dry_run_without_credentials_says_the_scores_come_at_launch(tmp_path):
    """RC5: the dry run needs no credentials: for a spot job it asks EC2 nothing, lists the
    AZs by the catalog's price and says the placement scores are asked at launch; for a type
    with no two others of its GPUs, that the order will stay the price's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               CLOUDTRAIN_HOME=str(tmp_path / "home"))

    def plan(instance: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "cloudtrain", "launch", "--instance",
                               instance, "--spot", "--region", "us-east-1", "--dry-run", "--",
                               "true"], cwd=REPO, capture_output=True, text=True, env=env,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out = plan("g5.xlarge")
    assert "not checked: no AWS credentials" in out
    assert re.search(r"AZs to try   use1-az\d \(\$[0-9.]+/h\), ", out), out
    assert "by the catalog's price for now; EC2's spot placement scores for 1 instance of "         "g5.xlarge, g5.2xlarge, g5.4xlarge are asked at launch" in " ".join(out.split())
    assert "by price: placement scores need 3 types of the same GPUs and the catalog has 1 "         "(p4d.24xlarge)" in " ".join(plan("p4d.24xlarge").split())


def test_missing_credentials_is_one_line(cli, aws):
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "launch", "--instance",
                           "g5.xlarge", "--", "true"], cwd=REPO, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    assert proc.returncode == 1
    assert error_line(proc.stderr) == "Error: no AWS credentials found"
    assert "aws configure" in proc.stderr and "Traceback" not in proc.stderr
    # U21: a launch's own way on without credentials
    assert proc.stderr.splitlines()[-1].endswith("; `cloudtrain launch --dry-run` works "
                                                 "without")


def test_keep_then_launch_on_reuses_the_instance(cli, aws, ct_home, tmp_path):
    work = tmp_path / "proj"
    work.mkdir()
    for i in range(5):
        (work / f"m{i}.py").write_text(f"X = {i}\n")
    first = cli("launch", "--instance", "g5.xlarge", "--keep", "--workdir", str(work),
                "--follow", "--quiet", "--", "python", "m0.py")
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.splitlines()[0]
    (raw,) = aws.instances()
    assert raw["State"]["Name"] == "running"  # kept after the job
    assert aws.shutdowns() == []
    assert _timeline_detail(cli, first_id, "setting-up") == "5 files sent"

    (work / "m4.py").write_text("X = 'changed'\n")
    # --no-keep: without it the second job keeps the instance (U39, test_lifecycle_kept.py)
    proc = cli("launch", "--on", first_id, "--no-keep", "--workdir", str(work), "--follow",
               "--quiet", "--", "python", "-c", "import m4; print('second', m4.X)")
    assert proc.returncode == 0, proc.stderr
    second_id = proc.stdout.splitlines()[0]
    assert "second changed" in proc.stdout
    assert len(aws.instances()) == 1  # no new instance
    assert _timeline_detail(cli, second_id, "setting-up") == "1 files sent"
    rows = _instance_rows(ct_home, second_id)
    assert [r["id"] for r in rows] == [raw["InstanceId"]] and rows[0]["state"] == "terminated"
    assert aws.instances()[0]["State"]["Name"] == "terminated"  # --no-keep: powered off

    proc = cli("launch", "--on", first_id, "--", "true")
    assert proc.returncode == 2 and "its instance is gone" in proc.stderr


def _timeline_detail(cli, job_id, phase):
    return [p for p in cli.job(job_id)["timeline"] if p["name"] == phase][0].get("detail")


def test_spot_interruption_shows_as_preempted(cli, aws, ct_home):
    # --keep: the agent must not power the host off itself when its session is killed below.
    # --no-recover: the job ends as preempted (recovery is tests/e2e/test_spot_recovery.py).
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--no-recover", "--keep", "--",
                        "bash", "-c",
                        "echo working; sleep 60")
    wait_for(lambda: "working" in cli.ok("logs", job_id).stdout, timeout=30, what="job output")
    # EC2 takes the spot instance back: the host vanishes, EC2 says why.
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    backend = ec2_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    (raw,) = aws.instances()
    instance = backend.get_instance(raw["InstanceId"])
    aws.sshd.stop()
    subprocess.run(["tmux", "-L", os.environ["CLOUDTRAIN_TMUX_SOCKET"], "kill-session", "-t",
                    f"ct-{job_id}"], capture_output=True)
    backend.terminate_instances([raw["InstanceId"]])
    from moto.ec2.models.instances import StateReason

    instance.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance "
                                        "termination", "Server.SpotInstanceTermination")
    job = cli.job(job_id)
    assert job["state"] == "preempted" and job["reason"] == "spot instance interrupted", job["reason"]
    assert all(r["state"] == "terminated" for r in _instance_rows(ct_home, job_id))


def test_expired_credentials_say_what_to_do(cli, aws, monkeypatch):
    from moto.ec2.models.key_pairs import KeyPairBackend

    def expired(self, *args, **kwargs):
        raise EC2ClientError("AuthFailure", "AWS was not able to validate the provided access "
                                            "credentials")

    monkeypatch.setattr(KeyPairBackend, "describe_key_pairs", expired)
    proc = cli("launch", "--instance", "g5.xlarge", "--", "true")
    assert proc.returncode == 1
    assert error_line(proc.stderr).startswith("Error: AWS refused the credentials (AuthFailure)")
    assert "aws sso login" in proc.stderr


def test_ssh_and_attach_reach_the_instance_with_the_pinned_key(cli, aws, ct_home):
    """`cloudtrain ssh` and `attach` run the system ssh client in an outer tmux (a terminal)."""
    from conftest import TMUX_SOCKET

    job_id = cli.launch("--instance", "g5.xlarge", "--", "bash", "-c", "echo on-instance; sleep 60")
    wait_for(lambda: "on-instance" in cli.ok("logs", job_id).stdout, timeout=30, what="output")
    env = {**os.environ, "TMUX": ""}
    terminals = {name: f"{TMUX_SOCKET}-{name}" for name in ("ssh", "attach")}

    def open_terminal(name):
        subprocess.run(["tmux", "-L", terminals[name], "new-session", "-d", "-s", "o", "-x",
                        "150", "-y", "40",
                        f"cd {REPO} && {sys.executable} -m cloudtrain {name} {job_id}"],
                       check=True, env=env)

    def pane(name):
        return subprocess.run(["tmux", "-L", terminals[name], "capture-pane", "-p", "-t", "o"],
                              capture_output=True, text=True).stdout

    try:
        open_terminal("ssh")
        subprocess.run(["tmux", "-L", terminals["ssh"], "send-keys", "-t", "o",
                        "echo via-ssh-$((6*7))", "Enter"], check=True)
        wait_for(lambda: "via-ssh-42" in pane("ssh"), timeout=20, what="a shell over ssh")
        assert "Host key verification failed" not in pane("ssh")
        open_terminal("attach")
        wait_for(lambda: "on-instance" in pane("attach"), timeout=20,
                 what="the job's pane over ssh")
    finally:
        for socket_name in terminals.values():
            subprocess.run(["tmux", "-L", socket_name, "kill-server"], capture_output=True)
        cli.ok("down", job_id)
    known = (ct_home / "known_hosts").read_text()
    assert f"[{aws.sshd.host}]" in known or "127.0." in known


def test_dry_run_with_no_aws_account_at_all(cli, tmp_path):
    """No credentials, no config, no endpoint: the plan still comes, priced from the catalog;
    g6.xlarge is accepted (moto lacks it, real AWS has it). p3.2xlarge, whose V100 no current
    Deep Learning AMI runs, is planned on Ubuntu with the driver and torch installed at boot
    (RA2), and says so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "launch", "--recipe", "resnet9",
                           "--instance", "g6.xlarge", "--region", "us-east-1", "--dry-run"],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "g6.xlarge: 1x L4, 4 vCPU, 16 GiB" in proc.stdout
    assert "$0.8048/h (on-demand list price" in proc.stdout
    assert "at most      $1.22: one instance of up to 90 min (the max runtime of 60 min + 30 " \
        "until user-data powers it off), with its 60 GB gp3 disk ($0.0066/h)" in proc.stdout
    assert "not checked: no AWS credentials" in proc.stdout
    volta = subprocess.run([sys.executable, "-m", "cloudtrain", "launch", "--recipe", "resnet9",
                            "--instance", "p3.2xlarge", "--dry-run"], cwd=REPO,
                           capture_output=True, text=True, env=env, timeout=60)
    assert volta.returncode == 0, volta.stderr
    assert "p3.2xlarge's V100 (Volta) runs on no current Deep Learning AMI; the job gets " \
        "Ubuntu 24.04" in volta.stdout
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "launch", "--instance",
                           "g6.xlarge", "--dry-run", "--", "true"], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=60)
    # D1: no region anywhere is the default region, said as such (the plan and the launch
    # resolve it the same way), not a refusal whose hint did not work.
    assert proc.returncode == 0, proc.stderr
    assert ("us-east-1 (the default: no --region, `region:` in config.yaml, AWS_REGION, "
            "AWS_DEFAULT_REGION") in proc.stdout


def test_checkpoints_come_home_and_resume_on_a_new_instance(cli, aws, ct_home, toy_recipes):
    first = cli("launch", "--recipe", "toy", "--set", "epochs=2", "--instance", "g5.xlarge",
                "--follow", "--quiet", timeout=120)
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.splitlines()[0]
    local = ct_home / "jobs" / first_id / "checkpoints" / "last.json"
    assert json.loads(local.read_text()) == {"epoch": 2}
    assert aws.instances()[0]["State"]["Name"] == "terminated"

    proc = cli("launch", "--recipe", "toy", "--set", "epochs=3", "--instance", "g5.xlarge",
               "--resume-from", first_id, "--follow", "--quiet", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "resuming from epoch 2" in proc.stdout
    assert len(aws.instances()) == 2


def test_RA4_the_dry_run_says_the_image_its_torch_driver_and_the_disk(cli, aws, toy_recipes):
    """RA4, issue 37: with credentials the plan names the image it resolved, what its name
    says of its software (the DLAMI's torch, where its Python is, NVIDIA's open driver and
    the GPUs it runs), that this machine's torch differs, and the disk."""
    import importlib.metadata

    proc = cli("launch", "--recipe", "toy", "--instance", "g5.xlarge", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert f"AMI {aws.ami} Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.9 (Ubuntu 24.04)" \
        in text, proc.stdout
    assert ("torch 2.9 at /opt/pytorch/bin/python, built for the CUDA of NVIDIA's open driver "
            "it carries (Turing and newer GPUs); this machine has torch "
            f"{importlib.metadata.version('torch')}; the exact torch, CUDA and driver are read "
            "at setup") in text, proc.stdout
    assert re.search(r"disk \d+ GB gp3", text), proc.stdout
