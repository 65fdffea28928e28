"""Issue 12: a job's datasets staged onto the host's disk before it starts, through the real
CLI on the local backend: `data push` of a prepared ImageNet-format tree to moto's S3 server,
then `launch --recipe imagenet --data imagenet=s3://...` whose host copies it (presigned links:
no credentials reach the job) and trains on it; the timeline shows the staging phase. The
failure paths stop before anything is created (a missing prefix, no declared source) or fail
the job with the staging's own reason (a corrupt shard), leaving nothing running."""

from __future__ import annotations

import json

import boto3
import pytest

from labs.aws import moto_endpoint
from cloudtrain.providers.aws import datasets as s3_datasets
from conftest import error_line, tiny_prepared_imagenet
from labs import credentials
from labs.aws import reset_moto

pytest.importorskip("torch")

REGION = "eu-west-1"
BUCKET = "datasets-test"
__all__ = ["moto_endpoint"]
TINY = ("--set", "variant=tiny", "--set", "arch=resnet18", "--set", "workers=0",
        "--set", "data=imagenet")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return tiny_prepared_imagenet(tmp_path_factory.mktemp("data"), seed=5)


@pytest.fixture
def aws_env(moto_endpoint, monkeypatch):
    reset_moto(moto_endpoint)
    env = {**credentials.aws_env(REGION), "AWS_ENDPOINT_URL_S3": moto_endpoint,
           "OMP_NUM_THREADS": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s3 = s3_datasets.client(boto3.Session(region_name=REGION), REGION, moto_endpoint, 8)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    return env, s3


COUNT = "find -L \"$CLOUDTRAIN_DATA_DIR/imagenet\" -name '*.JPEG' | wc -l"


def _jpegs(prepared) -> str:
    return str(sum(1 for _ in prepared.rglob("*.JPEG")))


def _timeline(cli, job_id):
    return {p["name"]: p for p in json.loads(cli.ok("status", job_id, "--json").stdout)
            ["timeline"]}


def test_push_then_launch_stages_the_tree_and_trains_on_it(cli, ct_home, prepared, aws_env):
    env, s3 = aws_env
    cli.ok("data", "push", str(prepared), f"s3://{BUCKET}/imagenet", "--shard-mb", "1",
           env=env)
    proc = cli("launch", "--recipe", "imagenet", *TINY, "--data",
               f"imagenet=s3://{BUCKET}/imagenet", "--follow", "--quiet", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.splitlines()[0]
    staged = ct_home / "data" / "imagenet"
    for folder in ("train", "val", "sz/40/train", "sz/88/val"):
        assert sorted(p.name for p in (staged / folder).rglob("*.JPEG")) == \
            sorted(p.name for p in (prepared / folder).rglob("*.JPEG")), folder
    marker = json.loads((staged / ".cloudtrain-staged.json").read_text())
    rows = [json.loads(line) for line in
            (ct_home / "jobs" / job_id / "metrics.jsonl").read_text().splitlines()]
    assert [r["source"] for r in rows if "event" not in r] == ["sz/40", "sz/40", "sz/88", "full"]
    # the timeline: staging, then running from the stager's own end, with what it copied
    phases = _timeline(cli, job_id)
    assert "staging" in phases and "running" in phases
    assert phases["staging"]["start"] <= phases["running"]["start"]
    assert phases["staging"]["detail"].startswith(f"imagenet from s3://{BUCKET}/imagenet (")
    assert phases["running"]["detail"].startswith("data staged: imagenet ")
    shown = cli.ok("status", job_id).stdout
    assert "data      imagenet:" in shown and "(shards)" in shown
    log = (ct_home / "jobs" / job_id / "output.log").read_text()
    assert "cloudtrain staging imagenet:" in log
    # no credential of the user's reached the job: only presigned links, in the plan
    plan = (ct_home / "jobs" / job_id / "staging.json").read_text()
    assert "testing" not in plan.replace("AWSAccessKeyId=testing", "").replace(
        "Credential=testing", "") and "X-Amz-Signature" in plan

    # a second job finds the same copy (its identity matches) and skips the download
    again = cli("launch", "--data", f"imagenet=s3://{BUCKET}/imagenet", "--follow", "--quiet",
                "--", "bash", "-c", COUNT, env=env, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    second = again.stdout.splitlines()[0]
    assert "already on the host" in _timeline(cli, second)["running"]["detail"]
    assert json.loads((staged / ".cloudtrain-staged.json").read_text()) == marker


def test_declared_in_config_listed_by_data_ls_and_shown_by_the_dry_run(cli, ct_home, prepared,
                                                                      aws_env):
    env, s3 = aws_env
    (ct_home / "config.yaml").write_text(f"datasets:\n  imagenet: s3://{BUCKET}/imagenet\n")
    before = cli.ok("data", "ls", env=env).stdout
    assert "imagenet" in before and "never" in before and "not read yet" in before
    missing = cli.ok("data", "ls", "--check", env=env).stdout
    assert "unreadable: no dataset at s3://datasets-test/imagenet" in missing
    cli.ok("data", "push", str(prepared), f"s3://{BUCKET}/imagenet", env=env)
    dry = cli.ok("launch", "--recipe", "imagenet", *TINY, "--dry-run", env=env).stdout
    assert f"imagenet from s3://{BUCKET}/imagenet" in dry and "files, shards)" in dry
    # your own command stages the declared dataset with `--data imagenet`
    proc = cli.ok("launch", "--data", "imagenet", "--follow", "--quiet", "--", "bash", "-c",
                  COUNT, env=env, timeout=300)
    job_id = proc.stdout.splitlines()[0]
    assert cli.job(job_id)["state"] == "succeeded"
    assert _jpegs(prepared) in proc.stdout.splitlines()
    rows = json.loads(cli.ok("data", "ls", "--json", env=env).stdout)
    assert rows[0]["name"] == "imagenet" and rows[0]["last_staged"]["job"] == job_id
    assert rows[0]["size"]["kind"] == "shards" and rows[0]["size"]["files"] > 0


def test_no_source_missing_prefix_and_unknown_dataset_stop_before_anything_exists(
        cli, ct_home, aws_env):
    env, _ = aws_env
    no_source = cli("launch", "--recipe", "imagenet", *TINY, env=env)
    assert no_source.returncode != 0
    assert "reads dataset imagenet, which has no source" in no_source.stderr
    assert "datasets:" in no_source.stderr and "--data imagenet=s3://" in no_source.stderr
    missing = cli("launch", "--recipe", "imagenet", *TINY, "--data",
                  f"imagenet=s3://{BUCKET}/nothing-here", env=env)
    assert missing.returncode != 0
    assert f"no dataset at s3://{BUCKET}/nothing-here" in missing.stderr
    wrong = cli("launch", "--recipe", "resnet9", "--profile", "smoke", "--data",
                f"imagenet=s3://{BUCKET}/x", env=env)
    assert wrong.returncode != 0 and "--data imagenet: recipe resnet9" in wrong.stderr
    bad = cli("launch", "--recipe", "imagenet", *TINY, "--data", "imagenet=ftp://x", env=env)
    assert bad.returncode != 0 and "is not s3://BUCKET/PREFIX" in bad.stderr
    # none of them created a job
    assert "no jobs yet" in cli.ok("status").stdout


def test_a_corrupt_shard_fails_the_job_with_that_reason(cli, ct_home, prepared, aws_env):
    env, s3 = aws_env
    cli.ok("data", "push", str(prepared), f"s3://{BUCKET}/imagenet", "--shard-mb", "1",
           env=env)
    key = s3_datasets.shard_key("imagenet", "shard-00000.tar")
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    proc = cli("launch", "--recipe", "imagenet", *TINY, "--data",
               f"imagenet=s3://{BUCKET}/imagenet", "--follow", "--quiet", env=env, timeout=300)
    assert proc.returncode != 0
    job = cli.job(proc.stdout.splitlines()[0])
    assert job["state"] == "failed"
    assert job["reason"].startswith("data staging failed: ") and "shard-00000.tar" in \
        job["reason"] and "sha256" in job["reason"]
    # the training never started, and the half-staged tree has no marker
    assert not (ct_home / "jobs" / job["id"] / "metrics.jsonl").exists() or \
        "epoch" not in (ct_home / "jobs" / job["id"] / "metrics.jsonl").read_text()
    assert not (ct_home / "data" / "imagenet" / ".cloudtrain-staged.json").exists()
    assert not (ct_home / "data" / "imagenet" / ".staging").exists()


def test_a_path_source_on_this_machine_is_linked_not_copied(cli, ct_home, prepared):
    proc = cli.ok("launch", "--data", f"imagenet={prepared}", "--follow", "--quiet", "--",
                  "bash", "-c", COUNT, timeout=300)
    assert cli.job(proc.stdout.splitlines()[0])["state"] == "succeeded"
    assert _jpegs(prepared) in proc.stdout.splitlines()
    link = ct_home / "data" / "imagenet"
    assert link.is_symlink() and link.resolve() == prepared.resolve()
    # U60: the log said `staging imagenet: 0.0 of 0.0 GB (100%), 0 of 0 files, 0 MB/s`
    job_id = proc.stdout.splitlines()[0]
    log = cli.ok("logs", job_id).stdout
    assert f"cloudtrain staging imagenet: linked {prepared}" in log and "0.0 of 0.0" not in log
    assert _timeline(cli, job_id)["running"]["detail"] == \
        "data staged: imagenet linked, not copied"
    gone = cli("launch", "--recipe", "imagenet", *TINY, "--data", "imagenet=/no/such/folder")
    assert gone.returncode != 0 and "/no/such/folder is not a folder" in gone.stderr


def test_u41_a_tree_without_the_variant_s_folders_stops_launch_and_dry_run(
        cli, ct_home, aws_env, tmp_path):
    """U41: `data prepare` with its default sizes (sz/160, sz/352), then the tiny variant
    (sz/40, sz/88), as a path here and pushed to S3: the dry run passed and the job failed
    on the host. Now the dry run and the launch refuse it in one line, before anything is
    created, with the command that makes the missing folders; run, it makes them."""
    env, _ = aws_env
    tree = tiny_prepared_imagenet(tmp_path, seed=2, sizes=(160, 352), classes=2)
    said = (f"has no sz/40/train, sz/40/val, sz/88/train, sz/88/val, which recipe imagenet "
            "with variant=tiny reads")
    for extra in (("--dry-run",), ()):
        proc = cli("launch", "--recipe", "imagenet", *TINY, "--data", f"imagenet={tree}",
                   *extra, env=env)
        assert proc.returncode == 2, proc.stderr
        assert error_line(proc.stderr) == f"Error: dataset imagenet at {tree} {said}"
        assert f"Hint: cloudtrain data prepare imagenet SRC {tree} --sizes 40,88" in \
            proc.stderr
    cli.ok("data", "push", str(tree), f"s3://{BUCKET}/defaults", "--shard-mb", "1", env=env)
    for extra in (("--dry-run",), ()):
        proc = cli("launch", "--recipe", "imagenet", *TINY, "--data",
                   f"imagenet=s3://{BUCKET}/defaults", *extra, env=env)
        assert proc.returncode == 2, proc.stderr
        assert error_line(proc.stderr) == \
            f"Error: dataset imagenet at s3://{BUCKET}/defaults {said}"
        assert ("Hint: cloudtrain data prepare imagenet SRC DEST --sizes 40,88, then "
                f"cloudtrain data push DEST s3://{BUCKET}/defaults") in proc.stderr
    assert "no jobs yet" in cli.ok("status").stdout
    # the hint's command makes the folders; the same dry runs then pass
    cli.ok("data", "prepare", "imagenet", str(tmp_path / "src"), str(tree), "--sizes", "40,88",
           "--workers", "1", env=env, timeout=120)
    cli.ok("data", "push", str(tree), f"s3://{BUCKET}/defaults", "--shard-mb", "1", env=env)
    for data in (str(tree), f"s3://{BUCKET}/defaults"):
        plan = cli.ok("launch", "--recipe", "imagenet", *TINY, "--data", f"imagenet={data}",
                      "--dry-run", env=env).stdout
        assert "data" in plan and "no jobs yet" in cli.ok("status").stdout
