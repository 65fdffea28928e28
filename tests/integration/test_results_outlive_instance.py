"""A job's results outlive its instance (issue 10): launch, return, let the job end and the
instance power itself off with nobody watching; afterwards `status` and `logs` show the true
outcome, the whole log, the metrics and the checkpoint, read from the S3 job store.

Through the real AWS path: moto's EC2 and S3 server, a real sshd as the instance, the real
agent uploading through its presigned POST. The instance's disk going with it is the lab's
remote root being removed after the power-off.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from labs.credentials import CLIENT_CREDS, REGION
from labs.polling import wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")

JOB = r"""
set -e
for e in 1 2 3; do
  echo "epoch $e of 3"
  printf '{"epoch": %d, "epochs": 3, "train_loss": 0.5, "test_acc": 0.9}\n' $e >> "$CLOUDTRAIN_JOB_DIR/metrics.jsonl"
done
mkdir -p "$CLOUDTRAIN_JOB_DIR/checkpoints/run"
head -c 300000 /dev/urandom > "$CLOUDTRAIN_JOB_DIR/checkpoints/run/last.pt"
echo "sha256 $(sha256sum "$CLOUDTRAIN_JOB_DIR/checkpoints/run/last.pt" | cut -d' ' -f1)"
echo "the last line"
"""


@pytest.fixture
def job_script(tmp_path):
    work = tmp_path / "wd"
    work.mkdir()
    (work / "job.sh").write_text(JOB)
    return work


def _the_instance_is_gone(aws) -> None:
    """Its disk went with it, and nothing answers SSH at its address any more."""
    aws.sshd.stop()
    shutil.rmtree(aws.work / "remote")


def _launch_and_let_it_end_alone(cli, aws, job_script, *extra) -> str:
    aws.write_config(shutdown_delay_seconds=3.0)
    job_id = cli.launch("--instance", "g5.xlarge", "--workdir", str(job_script), *extra,
                        "--", "bash", "-c", "sleep 2; bash job.sh")
    # The agent powers the host off after the job (shutdown behaviour: terminate).
    wait_for(lambda: [i for i in aws.instances(**{"tag:cloudtrain:job": job_id})
                      if i["State"]["Name"] == "terminated"], timeout=60,
             what="the agent's power-off")
    assert [s["job"] for s in aws.shutdowns()] == [job_id]
    _the_instance_is_gone(aws)
    return job_id


def test_results_come_home_from_the_job_store_after_the_instance_is_gone(
        cli, aws, ct_home, job_script):
    job_id = _launch_and_let_it_end_alone(cli, aws, job_script)

    job = cli.job(job_id)
    assert job["state"] == "succeeded", job
    assert job["exit_code"] == 0
    assert job["metrics"]["epoch"] == 3
    phases = [p["name"] for p in job["timeline"]]
    assert "results" in phases and phases[-1] == "succeeded", phases

    log = cli.ok("logs", job_id).stdout
    assert log.splitlines()[0] == "epoch 1 of 3" and log.splitlines()[-1] == "the last line"
    local = ct_home / "jobs" / job_id
    rows = [json.loads(l) for l in (local / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    checkpoint = local / "checkpoints" / "run" / "last.pt"
    assert checkpoint.stat().st_size == 300000
    (written,) = [l.split()[1] for l in log.splitlines() if l.startswith("sha256 ")]
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == written
    # and nothing bills
    (raw,) = aws.instances(**{"tag:cloudtrain:job": job_id})
    assert raw["State"]["Name"] == "terminated"


def test_results_are_kept_under_the_owners_prefix_and_a_job_from_before_reads_its_own_F32(
        cli, aws, ct_home, job_script):
    """F32: the job store keeps a job under jobs/<aws:userid>/<id>/ (the prefix the IAM
    policy scopes to its owner), and the job's record keeps that owner key. A job recorded
    before owner prefixes (no owner kept, its objects under jobs/<id>/) still comes home."""
    import boto3

    from cloudtrain.state import Store

    job_id = _launch_and_let_it_end_alone(cli, aws, job_script)
    creds = {**CLIENT_CREDS,
             "region_name": REGION, "endpoint_url": aws.endpoint}
    user_id = boto3.client("sts", **creds).get_caller_identity()["UserId"]
    s3 = boto3.client("s3", **creds)
    (bucket,) = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    own = f"jobs/{user_id}/{job_id}/"
    assert f"{own}manifest.json" in keys and all(k.startswith(own) for k in keys), keys
    with Store(ct_home / "state.db") as store:
        job = store.job(job_id)
        assert job.facts.store_owner == user_id
        store.update_job(job_id, details={k: v for k, v in job.details.items()
                                          if k != "store_owner"})
    for key in keys:  # where a job launched before F32 stored the same files
        s3.copy_object(Bucket=bucket, Key=f"jobs/{job_id}/{key[len(own):]}",
                       CopySource={"Bucket": bucket, "Key": key})
        s3.delete_object(Bucket=bucket, Key=key)

    job = cli.job(job_id)
    assert job["state"] == "succeeded" and job["metrics"]["epoch"] == 3, job
    assert cli.ok("logs", job_id).stdout.splitlines()[-1] == "the last line"
    assert (ct_home / "jobs" / job_id / "checkpoints" / "run" / "last.pt").stat().st_size == \
        300000


def test_follow_survives_the_connection_dropping_as_the_job_ends(cli, aws, ct_home, job_script):
    """`launch --follow` while the connection to the instance drops as the job ends (every
    sshd session process of the lab's instance is killed): the whole log and the true
    outcome, not `internal error: OSError: Socket is closed`."""
    aws.write_config(shutdown_delay_seconds=0.0)
    (job_script / "drop.sh").write_text(
        f"bash job.sh; pkill -P {aws.sshd.proc.pid} || true; sleep 1\n")
    proc = cli("launch", "--instance", "g5.xlarge", "--workdir", str(job_script), "--follow",
               "--", "bash", "-c", "sleep 1; bash drop.sh", timeout=120)
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "epoch 1 of 3" and lines[-1] == "the last line", proc.stdout
    assert aws.sshd.connections() >= 2  # the first connection did drop; a new one was made


def test_logs_first_then_resume_from_a_job_whose_instance_went_unseen(
        cli, aws, ct_home, toy_recipes):
    """Nobody ran `status`: `logs` is the first command after the instance is gone, and a new
    job resumes from the checkpoint that only the job store still has."""
    aws.write_config(shutdown_delay_seconds=1.0)
    job_id = cli.launch("--recipe", "toy", "--instance", "g5.xlarge")
    wait_for(lambda: [i for i in aws.instances(**{"tag:cloudtrain:job": job_id})
                      if i["State"]["Name"] == "terminated"], timeout=60,
             what="the agent's power-off")
    _the_instance_is_gone(aws)

    assert "args {'epochs': 2" in cli.ok("logs", job_id).stdout
    assert cli.job(job_id)["state"] == "succeeded"
    report = json.loads(cli.ok("cost-report", "--json").stdout)
    assert job_id in json.dumps(report)

    aws.sshd.start()  # the next instance answers at the same loopback addresses
    proc = cli("launch", "--recipe", "toy", "--instance", "g5.xlarge", "--resume-from", job_id,
               "--set", "epochs=3", "--follow", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resuming from epoch 2" in proc.stdout


def test_without_a_job_store_the_launch_says_what_is_lost_and_the_power_off_waits(
        cli, aws, ct_home, job_script):
    """job_store: false (or no S3 permission): the launch says so; the instance waits
    collect_wait_minutes for the CLI, and a `status` in that window brings everything home."""
    aws.write_config(job_store=False, collect_wait_minutes=1.0, shutdown_delay_seconds=0.0)
    proc = cli("launch", "--instance", "g5.xlarge", "--workdir", str(job_script), "--quiet",
               "--", "bash", "job.sh")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    assert "no S3 job store (job_store: false)" in proc.stderr
    assert "waits up to 1 min (billed)" in proc.stderr
    job_json = json.loads((aws.work / "remote" / "jobs" / job_id / "job.json").read_text())
    assert job_json["results_store"] is None and job_json["collect_wait_s"] == 60.0
    wait_for(lambda: json.loads((aws.work / "remote" / "jobs" / job_id / "status.json")
                                .read_text())["state"] == "succeeded", timeout=30)
    assert not aws.shutdowns()  # it waits for the CLI (up to a minute), not 0 s
    job = cli.job(job_id)
    assert job["state"] == "succeeded"
    assert (ct_home / "jobs" / job_id / "checkpoints" / "run" / "last.pt").exists()
    (raw,) = aws.instances(**{"tag:cloudtrain:job": job_id})
    assert raw["State"]["Name"] == "terminated"  # the CLI released it once it had collected


def test_a_fifo_planted_as_metrics_does_not_keep_the_rest_from_coming_home_F34(
        cli, aws, ct_home, job_script):
    """F34: a job that leaves a FIFO where its metrics.jsonl was: the CLI's collection over
    SSH (no job store) skips that file at once and brings the rest home."""
    aws.write_config(job_store=False, collect_wait_minutes=1.0, shutdown_delay_seconds=0.0)
    (job_script / "fifo.sh").write_text(
        'bash job.sh; rm -f "$CLOUDTRAIN_JOB_DIR/metrics.jsonl"; '
        'mkfifo "$CLOUDTRAIN_JOB_DIR/metrics.jsonl"\n')
    job_id = cli.launch("--instance", "g5.xlarge", "--workdir", str(job_script), "--",
                        "bash", "fifo.sh")
    wait_for(lambda: json.loads((aws.work / "remote" / "jobs" / job_id / "status.json")
                                .read_text())["state"] == "succeeded", timeout=30)
    job = cli.job(job_id)
    assert job["state"] == "succeeded", job
    local = ct_home / "jobs" / job_id
    assert (local / "output.log").read_text().splitlines()[-1] == "the last line"
    assert not (local / "metrics.jsonl").exists()
    assert (local / "checkpoints" / "run" / "last.pt").stat().st_size == 300000


def test_the_dry_run_says_where_results_go_or_what_waiting_costs(cli, aws):
    plan = cli.ok("launch", "--instance", "g5.xlarge", "--dry-run", "--", "true").stdout
    assert ("s3://cloudtrain-<account>-us-east-1/jobs/<your user id>/<job>/ before the "
            "power-off") in plan
    aws.write_config(job_store=False, collect_wait_minutes=30)
    plan = cli.ok("launch", "--instance", "g5.xlarge", "--dry-run", "--", "true").stdout
    assert "waits up to 30 min after the job for the CLI to collect (billed, up to $0.50)" in plan


def test_results_come_home_after_ec2_has_forgotten_the_instance(cli, aws, ct_home, job_script,
                                                                monkeypatch):
    """EC2 lists a terminated instance for about an hour only: a job looked at later is
    still read from the job store, not left 'host unreachable' for ever."""
    from moto.ec2.models.instances import InstanceBackend

    job_id = _launch_and_let_it_end_alone(cli, aws, job_script)
    monkeypatch.setattr(InstanceBackend, "describe_instances", lambda self, *a, **k: [])
    job = cli.job(job_id)
    assert job["state"] == "succeeded", job["reason"]
    assert "the last line" in cli.ok("logs", job_id).stdout


def test_a_job_store_that_cannot_be_read_now_is_asked_again_later(cli, aws, ct_home,
                                                                  job_script, monkeypatch):
    """A throttled or refused read of the job store decides nothing: the job keeps its
    state, says why, and the next status reads the results."""
    from moto.iam.access_control import PermissionResult
    from moto.s3.models import FakeBucket

    job_id = _launch_and_let_it_end_alone(cli, aws, job_script)
    allowed = FakeBucket.get_permission
    monkeypatch.setattr(FakeBucket, "get_permission",
                        lambda self, action, resource: PermissionResult.DENIED)
    job = cli.job(job_id)
    assert job["state"] == "running" and "job store could not be read" in job["reason"], job
    monkeypatch.setattr(FakeBucket, "get_permission", allowed)
    assert cli.job(job_id)["state"] == "succeeded"


def test_logs_of_a_job_that_ended_before_its_files_were_stored_reads_them_once_stored(
        cli, aws, ct_home, job_script):
    """A job whose end was recorded while its files were not in the job store yet (the
    instance gone, the upload not landed: seen once in the Auto Scaling lab, where the
    attempt's end is stored before its files) kept its instance's address as where its log
    is; `logs` then failed for ever with `cannot reach ...`. Now `logs` of an ended job whose
    files are not home reads the job store again, and until they are there it says so."""
    import boto3

    job_id = _launch_and_let_it_end_alone(cli, aws, job_script)
    s3 = boto3.client("s3", **CLIENT_CREDS, region_name=REGION, endpoint_url=aws.endpoint)
    (bucket,) = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    for key in keys:  # not there yet
        s3.copy_object(Bucket=bucket, Key=f"aside/{key}", CopySource={"Bucket": bucket,
                                                                       "Key": key})
        s3.delete_object(Bucket=bucket, Key=key)
    job = cli.job(job_id)
    assert job["state"] == "failed", job  # nothing said how it ended

    early = cli("logs", job_id)
    assert early.returncode == 1, early.stderr
    assert early.stderr.startswith(f"Error: job {job_id} has ended and its instance is gone; "
                                   "its files are not in the job store (yet)"), early.stderr

    for key in keys:  # the upload lands
        s3.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket,
                                                           "Key": f"aside/{key}"})
    log = cli.ok("logs", job_id).stdout
    assert log.splitlines()[0] == "epoch 1 of 3" and log.splitlines()[-1] == "the last line"
    assert (ct_home / "jobs" / job_id / "output.log").read_text() == log
    assert cli.ok("logs", job_id, "--tail", "1").stdout == "the last line\n"
