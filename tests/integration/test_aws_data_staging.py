"""Issue 12 on the AWS backend: a job's datasets staged onto the instance's disk before it
starts, through the real CLI, moto's EC2/S3/IAM server and a real sshd standing in for the
instance (tests/labs/aws.py). No real AWS.

- With `instance_profile:` the instance reads the bucket with its own role's credentials,
  fetched from IMDSv2 (a fake one here, at config.yaml's `imds_url`): the plan on the host has
  no presigned link and no credential of the user's; RunInstances carries the profile.
- Without one, each object gets a presigned link.
- A missing prefix stops the launch before anything is created; a corrupt shard fails the
  job with the stager's reason and the instance is terminated.
- Datasets of 10 GB or more get a faster root volume (provisioned gp3 throughput), priced.
- The dry run shows the data and the disk sized for it.

The local-backend version of these is tests/integration/test_data_staging.py.
"""

from __future__ import annotations

import json
import os

import boto3
import pytest

from labs.imds import FakeIMDS
from labs.aws import aws, moto_endpoint, stored_as
from labs.credentials import CLIENT_CREDS, REGION
from cloudtrain.providers.aws import datasets as s3_datasets
from cloudtrain.providers.aws import instances
from conftest import error_line, lying_manifest, tiny_prepared_imagenet
from labs.polling import wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"),
                                reason="needs openssh-server")
pytest.importorskip("torch")

__all__ = ["aws", "moto_endpoint", "stored_as"]  # the lab's fixtures
BUCKET = "datasets-aws-test"
PROFILE = "cloudtrain-instance"
TINY = ("--set", "variant=tiny", "--set", "arch=resnet18", "--set", "workers=0",
        "--set", "data=imagenet", "--set", "epochs=1")
ENV = {"OMP_NUM_THREADS": "1"}
# What the fake IMDS hands out as the role's credentials (never the user's "testing").
ROLE_KEY, ROLE_SECRET, ROLE_TOKEN = "ASIAFAKEROLEKEY00001", "role-secret-not-users", "role-token+/="
IMDS_TOKEN = "imds-v2-token-abc"
# An image of the user's own, of which nothing is known (RG5): the copy goes onto the root
# volume, sized and sped up for it, whatever local NVMe the type has.
OWN_IMAGE = ("--ami", "ami-0123456789abcdef0")


# -- a fake IMDSv2 --------------------------------------------------------------------------


@pytest.fixture
def imds():
    server = FakeIMDS(role="cloudtrain-instance-role", token=IMDS_TOKEN, creds={
        "AccessKeyId": ROLE_KEY, "SecretAccessKey": ROLE_SECRET, "Token": ROLE_TOKEN})
    yield server
    server.close()


# -- data --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A tiny prepared ImageNet tree (train/, val/, sz/40, sz/88), made once."""
    return tiny_prepared_imagenet(tmp_path_factory.mktemp("data"), seed=5)


@pytest.fixture
def s3(aws, moto_endpoint):
    """The dataset bucket in moto (the lab's region), and the user's client for it."""
    client = s3_datasets.client(boto3.Session(region_name=REGION), REGION, moto_endpoint, 8)
    client.create_bucket(Bucket=BUCKET)
    return client


def _push(cli, prepared, prefix="imagenet"):
    cli.ok("data", "push", str(prepared), f"s3://{BUCKET}/{prefix}", "--shard-mb", "1")


@pytest.fixture
def s3_gets(monkeypatch):
    """Every GET of an object that moto's S3 answers: (path, Authorization header, query)."""
    from moto.s3.responses import S3Response

    seen: list[tuple[str, str, str]] = []
    original = S3Response.get_object

    def get_object(self):
        seen.append((str(getattr(self, "path", "")), self.headers.get("Authorization") or "",
                     str(getattr(self, "querystring", ""))))
        return original(self)

    monkeypatch.setattr(S3Response, "get_object", get_object)
    return seen


@pytest.fixture
def run_requests(monkeypatch):
    """The keyword arguments of every RunInstances moto's EC2 carries out."""
    from moto.ec2.models.instances import InstanceBackend

    seen: list[dict] = []
    original = InstanceBackend.run_instances

    def run_instances(self, image_id, count, user_data, security_group_names, **kwargs):
        seen.append(dict(kwargs))
        return original(self, image_id, count, user_data, security_group_names, **kwargs)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)
    return seen


def _timeline(job: dict) -> dict:
    return {p["name"]: p for p in job["timeline"]}


# The job reads the staged copy (the imagenet recipe training on it is the local backend's
# test, test_data_staging.py; here the AWS path is the point, without a minute of training).
COUNT = "find \"$CLOUDTRAIN_DATA_DIR/imagenet\" -name '*.JPEG' | wc -l"


def _launch(cli, *extra, data=f"imagenet=s3://{BUCKET}/imagenet"):
    return cli("launch", "--data", data, "--instance", "g5.xlarge", "--follow", "--quiet",
               *extra, "--", "bash", "-c", COUNT, env=ENV, timeout=180)


def _jpegs(prepared) -> str:
    return str(sum(1 for _ in prepared.rglob("*.JPEG")))


def _terminated(aws, job_id):
    return [i for i in aws.instances(**{"tag:cloudtrain:job": job_id})
            if i["State"]["Name"] == "terminated"]


def _plan_on_host(aws, job_id) -> str:
    return (aws.work / "remote" / "jobs" / job_id / "staging.json").read_text()


# -- 1. the instance role ----------------------------------------------------------------------


def test_role_credentials_from_imdsv2_stage_the_data_and_no_user_secret_reaches_the_host(
        cli, aws, ct_home, prepared, s3, imds, s3_gets, run_requests):
    boto3.client("iam", endpoint_url=aws.endpoint, region_name=REGION,
                 **CLIENT_CREDS
                 ).create_instance_profile(InstanceProfileName=PROFILE)
    aws.write_config(instance_profile=PROFILE, imds_url=imds.url)
    _push(cli, prepared)
    proc = _launch(cli)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.splitlines()[0]
    job = cli.job(job_id)
    assert job["state"] == "succeeded", job["reason"]
    assert _jpegs(prepared) in proc.stdout.splitlines()  # the job found every image

    # IMDSv2: a token first, then the role and its credentials, each GET carrying the token.
    assert imds.seen and imds.seen[0] == ("PUT", "/latest/api/token", "21600")
    gets = [s for s in imds.seen if s[0] == "GET"]
    assert [p for _, p, _ in gets][:2] == [
        "/latest/meta-data/iam/security-credentials/",
        "/latest/meta-data/iam/security-credentials/cloudtrain-instance-role"]
    assert all(token == IMDS_TOKEN for _, _, token in gets), imds.seen
    # The host read every shard with the role's credentials (SigV4 with its session token),
    # not through a presigned link and not with the user's key.
    shard_gets = [g for g in s3_gets if "/shards/" in g[0]]
    assert shard_gets
    for path, auth, query in shard_gets:
        assert auth.startswith(f"AWS4-HMAC-SHA256 Credential={ROLE_KEY}/"), (path, auth)
        assert "X-Amz-Signature" not in query
    # The plan on the host: role auth, no presigned link, no secret of the user's.
    text = _plan_on_host(aws, job_id)
    plan = json.loads(text)
    (entry,) = plan["datasets"]
    assert entry["auth"] == "role" and entry["kind"] == "shards"
    assert plan["imds_url"] == imds.url
    assert "shard_urls" not in entry and "X-Amz-Signature" not in text \
        and "X-Amz-Credential" not in text
    assert "testing" not in text and ROLE_SECRET not in text
    # RunInstances asked for the instance profile (moto drops the association when the
    # instance terminates, so the request is what is checked).
    assert [r.get("iam_instance_profile_name") for r in run_requests] == [PROFILE]

    # The timeline: staging (what it copies), then running from the stager's end.
    phases = _timeline(job)
    assert "staging" in phases and "running" in phases
    assert phases["staging"]["start"] <= phases["running"]["start"]
    assert phases["staging"]["detail"].startswith(f"imagenet from s3://{BUCKET}/imagenet (")
    assert phases["running"]["detail"].startswith("data staged: imagenet ")
    # The bill splits staging out.
    by_phase = job["cost_detail"]["phases"]
    assert "staging" in by_phase and "training" in by_phase, by_phase
    assert all(v >= 0 for v in by_phase.values())
    assert "staging $" in cli.ok("status", job_id).stdout
    report = json.loads(cli.ok("cost-report", "--json").stdout)
    assert any(job_id == row["id"] for row in report["rows"])
    assert _terminated(aws, job_id)


# -- 2. presigned links ------------------------------------------------------------------------


def test_without_an_instance_profile_the_host_stages_through_presigned_links(
        cli, aws, ct_home, prepared, s3, s3_gets, run_requests):
    _push(cli, prepared)
    proc = _launch(cli)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.splitlines()[0]
    job = cli.job(job_id)
    assert job["state"] == "succeeded", job["reason"]
    assert _jpegs(prepared) in proc.stdout.splitlines()
    assert _timeline(job)["running"]["detail"].startswith("data staged: imagenet ")
    text = _plan_on_host(aws, job_id)
    (entry,) = json.loads(text)["datasets"]
    assert entry["auth"] == "presigned"
    assert len(entry["shard_urls"]) == len(entry["manifest"]["shards"]) >= 1
    assert all("X-Amz-Signature=" in u for u in entry["shard_urls"])
    # the links carry the user's key id (as any presigned link does), never the secret
    assert "testing" not in text.replace("X-Amz-Credential=testing", "")
    shard_gets = [g for g in s3_gets if "/shards/" in g[0]]
    assert shard_gets and all("X-Amz-Signature" in q for _, _, q in shard_gets)
    assert [r.get("iam_instance_profile_name") for r in run_requests] == [None]


# -- 3. a missing prefix -----------------------------------------------------------------------


def test_a_missing_prefix_stops_the_launch_before_any_instance_exists(
        cli, aws, ct_home, s3):
    proc = _launch(cli, data=f"imagenet=s3://{BUCKET}/nothing-here")
    assert proc.returncode != 0
    assert f"no dataset at s3://{BUCKET}/nothing-here" in proc.stderr
    assert aws.instances() == []
    assert "no jobs yet" in cli.ok("status").stdout
    # a bucket that does not exist either
    proc = _launch(cli, data="imagenet=s3://no-such-bucket-here/imagenet")
    assert proc.returncode != 0 and "no S3 bucket named no-such-bucket-here" in proc.stderr
    assert aws.instances() == [] and "no jobs yet" in cli.ok("status").stdout


# -- 4. a corrupt shard ------------------------------------------------------------------------


def test_a_corrupt_shard_fails_the_job_with_that_reason_and_terminates_the_instance(
        cli, aws, ct_home, prepared, s3):
    _push(cli, prepared)
    key = s3_datasets.shard_key("imagenet", "shard-00000.tar")
    body = bytearray(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    proc = _launch(cli)
    assert proc.returncode != 0
    job = cli.job(proc.stdout.splitlines()[0])
    assert job["state"] == "failed"
    assert job["reason"].startswith("data staging failed: "), job["reason"]
    assert "shard-00000.tar" in job["reason"] and "sha256" in job["reason"]
    assert "running" not in _timeline(job)  # the training never started
    # the instance powered itself off (shutdown behaviour: terminate); nothing bills
    wait_for(lambda: _terminated(aws, job["id"]), timeout=30, what="the instance terminated")
    assert [s["job"] for s in aws.shutdowns()] == [job["id"]]
    assert [i for i in aws.instances() if i["State"]["Name"] != "terminated"] == []
    assert "no instance tagged cloudtrain is running" in cli.ok("status", "--refresh").stdout


# -- 5. a faster root volume for a large copy, and its price ------------------------------------


def test_ten_gb_of_data_gets_a_faster_root_volume_up_to_the_instances_ebs_link_and_its_price(
        aws, s3, monkeypatch):
    """Issue 12, and RG4: a copy of 10 GB or more gets staging_disk_mbps of gp3 throughput,
    but never more than the instance's link to EBS carries (EC2's
    EbsOptimizedInfo.MaximumThroughputInMBps): what it could not use would be billed."""
    from cloudtrain import cost, datasets, ledger
    from cloudtrain.config import Settings
    from cloudtrain.providers.aws import AWSProvider
    from cloudtrain.spec import JobSpec
    from cloudtrain.state import Instance, Job

    settings = Settings.load()

    def spec_with(file_bytes):
        monkeypatch.setattr(s3_datasets, "contents", lambda c, b, p: s3_datasets.Contents(
            kind="objects", files=1, bytes=file_bytes, file_bytes=file_bytes,
            identity="ab" * 32, objects=[]))
        # RG5: --ami (nothing is known of its disks): the copy goes onto the root volume
        spec = JobSpec.of(kind="command", backend="aws", command=["true"],
                       instance_type="g5.xlarge", region=REGION, ami="ami-0123456789abcdef0",
                       datasets=[{
                           "name": "imagenet", "kind": "s3", "dir": "imagenet",
                           "location": f"s3://{BUCKET}/imagenet"}])
        sized, _ = datasets.preflight(spec, settings, AWSProvider(settings))
        return sized

    big, small = spec_with(12 * 10**9), spec_with(9 * 10**9)
    # RG4: g5.xlarge's link to EBS carries at most 437.5 MB/s (EC2's EbsOptimizedInfo): the
    # 1000 MB/s staging_disk_mbps asks would be billed and never used
    assert settings.staging_disk_mbps == 1000 and big.data.disk_mbps == 437
    # the copy, 5 % for the file system, the 100 GB margin (the AMI, checkpoints) and the
    # shards in flight: more than the default 100 GB
    # plain objects: no shards
    assert big.placement.disk_gb == datasets.disk_needed(12 * 10**9) > 100
    assert small.placement.disk_gb == datasets.disk_needed(9 * 10**9)
    assert small.data.disk_mbps is None

    provider = AWSProvider(settings)
    job = Job(id="0123abcd", name=None, kind="command", recipe=None, command="true",
              backend="aws", state="provisioning", created_at=0.0, started_at=None,
              ended_at=None, exit_code=None, reason=None, spec={}, host=None, jobdir=None,
              metrics=None, cost=None)

    def root(spec):
        request = instances.run_request(provider.aws, job, spec, "subnet-1", "sg-1", "ami-12345678", "key",
                                       "arn:aws:iam::1:user/me", 200, "/dev/sda1")
        (mapping,) = request["BlockDeviceMappings"]
        return mapping["Ebs"]

    fast = root(JobSpec.of(kind="command", backend="aws", command=["true"],
                        instance_type="g5.xlarge", disk_mbps=1000))
    assert fast["Throughput"] == 1000 and fast["Iops"] == 4000
    assert fast["VolumeType"] == "gp3" and fast["VolumeSize"] == 200
    plain = root(JobSpec.of(kind="command", backend="aws", command=["true"],
                         instance_type="g5.xlarge"))
    assert "Throughput" not in plain and "Iops" not in plain
    assert root(big)["Throughput"] == 437  # g5.xlarge takes no more (RG4)

    # The bill: the same instance for an hour, with and without the provisioned throughput.
    def billed(details):
        inst = Instance(id="i-1", job_id=job.id, provider="aws", region=REGION,
                        zone=f"{REGION}a", instance_type="g5.xlarge", market="on-demand",
                        state="terminated", launched_at=1_000_000.0,
                        terminated_at=1_000_000.0 + 3600, price_per_hour=1.006, details=details)
        return cost.instance_cost(ledger.run_of(inst)).dollars

    extra_per_hour = cost.gp3_performance_per_month(1000) / 730
    # 875 MB/s at $0.040 and 1,000 IOPS at $0.005 per month: $40/month, ~$0.0548/h
    assert extra_per_hour == pytest.approx((875 * 0.040 + 1000 * 0.005) / 730)
    with_perf = billed({"disk_gb": 200, "disk_mbps": 1000})
    without = billed({"disk_gb": 200})
    assert with_perf - without == pytest.approx(extra_per_hour, rel=1e-9)
    assert billed({"disk_gb": 200, "disk_mbps": None}) == pytest.approx(without)


# -- 6. the dry run ----------------------------------------------------------------------------


def test_the_dry_run_shows_the_data_and_a_disk_sized_to_hold_it(
        cli, aws, ct_home, prepared, s3):
    _push(cli, prepared)
    aws.write_config(disk_gb=8)  # smaller than the copy and its margin need
    dry = cli.ok("launch", "--recipe", "imagenet", *TINY, "--data",
                 f"imagenet=s3://{BUCKET}/imagenet", "--instance", "g5.xlarge", "--dry-run",
                 *OWN_IMAGE, env=ENV).stdout
    rows = {line.split()[0]: line.split(None, 1)[1] for line in dry.splitlines()[1:]
            if line.startswith("  ") and len(line.split()) > 1}
    assert rows["data"].startswith(f"imagenet from s3://{BUCKET}/imagenet (")
    assert "MB," in rows["data"] and "files, shards)" in rows["data"]
    # 8 GB asked for (config.yaml disk_gb): the copy and its margin (the OS, checkpoints,
    # shards in flight) need more, and the disk row says what the instance will get
    from cloudtrain.datasets import DISK_MARGIN_GB

    size = int(rows["disk"].split()[0])  # a 1 MB tree in 1 MB shards: the margin, and 1 GB
    assert DISK_MARGIN_GB < size <= DISK_MARGIN_GB + 1, rows["disk"]
    assert rows["disk"] == f"{size} GB gp3, encrypted, deleted with the instance"
    without = cli.ok("launch", "--recipe", "imagenet", *TINY[:-4], "--set", "data=synthetic",
                     "--instance", "g5.xlarge", "--dry-run", env=ENV).stdout
    assert "  disk " in without and "8 GB gp3" in without and "  data " not in without
    assert aws.instances() == [] and "no jobs yet" in cli.ok("status").stdout


def _rows(plan: str) -> dict:
    return {line.split()[0]: line.split(None, 1)[1] for line in plan.splitlines()[1:]
            if line.startswith("  ") and len(line.split()) > 1}


def _store_shards(s3, stored_as, prefix: str, entries: int, size: int) -> None:
    """A dataset S3 lists as `entries` shards of `size` bytes (held in a byte each) with a
    manifest that agrees."""
    for i in range(entries):
        key = f"{prefix}/shards/shard-{i:05d}.tar"
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
        stored_as[key] = size
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/manifest.json",
                  Body=lying_manifest(entries, size, shard_bytes=1 << 30))


def _big_manifest_dry_run(cli, s3, stored_as) -> dict:
    """The dry run's rows for a 12 GB dataset (twelve 1 GB shards as S3 lists them), with
    config.yaml's disk_gb 8, on an image of the user's own (onto the root volume: RG5)."""
    _store_shards(s3, stored_as, "big", 12, 10**9)
    dry = cli.ok("launch", "--recipe", "imagenet", *TINY, "--data", f"imagenet=s3://{BUCKET}/big",
                 "--instance", "g5.xlarge", "--dry-run", *OWN_IMAGE, env=ENV).stdout
    return dict(_rows(dry), text=" ".join(dry.split()))


def test_the_dry_run_of_a_12_gb_dataset_sizes_the_disk_for_the_copy(cli, aws, s3, stored_as):
    aws.write_config(disk_gb=8)
    rows = _big_manifest_dry_run(cli, s3, stored_as)
    # the copy gets time of its own: 10 min + 12 GB at 100 MB/s
    assert rows["data"] == (f"imagenet from s3://{BUCKET}/big (12.0 GB, 12 files, shards); "
                            "max runtime +12 min for it")
    # 11.99 GB of files, 5 % for the file system, the 100 GB margin and ten of the 1 GB
    # shards in flight (S3's size, not the 1 GiB the manifest's shard_bytes says): 123 GB,
    # not the 8
    assert rows["disk"].startswith("123 GB gp3"), rows["disk"]
    assert aws.instances() == [] and "no jobs yet" in cli.ok("status").stdout


def test_the_dry_run_states_the_faster_root_volume_a_large_copy_gets(cli, aws, s3,
                                                                     stored_as):
    aws.write_config(disk_gb=8)
    rows = _big_manifest_dry_run(cli, s3, stored_as)
    # launch would provision 437 MB/s (RG4: the most g5.xlarge's link to EBS carries, not
    # staging_disk_mbps's 1000) and bill $12.48/month more for it: the dry run, "what launch
    # would do", should say so, and why not the 1000
    assert "437 MB/s and 3000 IOPS provisioned for the data copy (+$0.0171/h)" in \
        rows["disk"], rows["disk"]
    assert ("takes the copy at 437 MB/s, not staging_disk_mbps's 1000: g5.xlarge's link to "
            "EBS takes no more, so more is not bought") in rows["text"], rows["text"]


def test_u41_a_pushed_tree_without_the_variant_s_folders_is_refused_before_any_instance(
        cli, aws, ct_home, s3, tmp_path):
    """U41, the finding's commands: a tree prepared with the default sizes, pushed, then the
    smoke profile on the real data on a g5.xlarge. The dry run read the manifest and passed,
    and the job would have failed on the instance after boot and the copy; now the dry run
    and the launch refuse it by the manifest's folder list, and nothing is created."""
    tree = tiny_prepared_imagenet(tmp_path, seed=4, sizes=(160, 352), classes=2)
    _push(cli, tree, "defaults")
    args = ("launch", "--recipe", "imagenet", "--profile", "smoke", "--set", "data=imagenet",
            "--data", f"imagenet=s3://{BUCKET}/defaults", "--instance", "g5.xlarge")
    for extra in (("--dry-run",), ("-y",)):
        proc = cli(*args, *extra)
        assert proc.returncode == 2, proc.stderr
        assert error_line(proc.stderr) == (
            f"Error: dataset imagenet at s3://{BUCKET}/defaults has no sz/40/train, sz/40/val, "
            "sz/88/train, sz/88/val, which recipe imagenet with variant=tiny reads")
        assert "--sizes 40,88, then cloudtrain data push DEST" in proc.stderr
    assert aws.instances() == [] and "no jobs yet" in cli.ok("status").stdout


# -- F29: the manifest is bucket content ------------------------------------------------------


def test_f29_the_audit_s_lying_manifests_stop_the_launch_before_anything_exists(
        cli, aws, ct_home, s3):
    """12 and 1,000 entries of 5 TiB, consistent sums, no shard objects behind them: they
    took the max runtime to 11,725 and 916,990 min, the power-off timer with it, and the disk
    to 124,345 GB and 5.8 PB. Now the launch stops in one line, and the dry run says why."""
    for prefix, entries in (("huge12", 12), ("huge", 1000)):
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/manifest.json",
                      Body=lying_manifest(entries, 5 << 40))
        said = (f"dataset s3://{BUCKET}/{prefix}: {entries:,} of the {entries:,} shards its "
                "manifest lists are not stored (shards/shard-00000.tar first)")
        proc = _launch(cli, data=f"imagenet=s3://{BUCKET}/{prefix}")
        assert proc.returncode == 1 and error_line(proc.stderr) == f"Error: {said}"
        assert len(proc.stderr.splitlines()) == 2, proc.stderr  # and its hint
        rows = _rows(cli.ok("launch", "--data", f"imagenet=s3://{BUCKET}/{prefix}",
                            "--instance", "g5.xlarge", "--dry-run", "--", "true").stdout)
        assert rows["data"] == f"cannot be read, the launch would stop: {said}"
        assert rows["disk"].startswith("100 GB gp3")
        assert rows["shutdown"].endswith("user-data after 750 min regardless")  # 720 + 30
    assert aws.instances() == [] and "no jobs yet" in cli.ok("status").stdout


def test_f29_data_past_the_week_or_past_gp3_s_64_tib_is_refused_in_one_line(
        cli, aws, ct_home, s3, stored_as):
    """Consistent datasets that S3 really lists that large: twelve 5 TiB shards take longer
    than the one-week limit to copy at the allowance's 100 MB/s; eight fit the week but not a
    gp3 root volume with the copies in flight beside them."""
    from cloudtrain import datasets

    _store_shards(s3, stored_as, "week", 12, 5 << 40)
    proc = _launch(cli, data=f"imagenet=s3://{BUCKET}/week")
    minutes = (600 + 12 * (5 << 40) / 1e8) / 60
    assert proc.returncode == 2 and error_line(proc.stderr) == (
        f"Error: the datasets ({12 * (5 << 40) / 1e9:,.0f} GB) take up to {minutes:,.0f} min "
        "to copy at the 100 MB/s the max runtime allows for: past the one-week limit "
        "(10,080 min)")
    _store_shards(s3, stored_as, "disk", 8, 5 << 40)
    proc = _launch(cli, data=f"imagenet=s3://{BUCKET}/disk")
    files = 8 * ((5 << 40) - 3 * 512)
    assert proc.returncode == 2 and error_line(proc.stderr) == (
        f"Error: the datasets take {files / 1e9:,.0f} GB on disk: with the system and the "
        f"copies in flight the root volume would be {datasets.disk_needed(files, 5 << 40, 8):,}"
        " GB, past gp3's largest (65,536 GiB)")
    assert aws.instances() == [] and "no jobs yet" in cli.ok("status").stdout


# -- nobody watching -----------------------------------------------------------------------------


def test_a_staging_job_that_ends_unwatched_still_splits_copy_and_training(
        cli, aws, ct_home, prepared, s3):
    """The launch returns while the data is still being copied; the job ends and the
    instance powers itself off with no CLI watching. Learnt afterwards from the job store,
    the timeline still has the staging phase end where the stager said (not at the job's
    end), so cost-report's data copy is the copy's share only."""
    import shutil

    aws.write_config(shutdown_delay_seconds=1.0)
    _push(cli, prepared)
    job_id = cli.launch("--instance", "g5.xlarge", "--data", f"mine=s3://{BUCKET}/imagenet",
                        "--", "bash", "-c", "sleep 3; ls $CLOUDTRAIN_DATA_DIR/mine/train | wc -l")
    wait_for(lambda: _terminated(aws, job_id), timeout=90, what="the agent's power-off")
    aws.sshd.stop()  # the instance is gone: what happened comes from the job store
    shutil.rmtree(aws.work / "remote")
    job = cli.job(job_id)
    assert job["state"] == "succeeded", job
    phases = [p["name"] for p in job["timeline"]]
    assert phases.index("staging") < phases.index("running") < phases.index("succeeded")
    timeline = _timeline(job)
    assert timeline["running"]["detail"].startswith("data staged: mine ")
    # the copy took well under the 3 s the command slept: the phases split there
    from datetime import datetime  # --json's times are ISO 8601 (U25)

    took = datetime.fromisoformat(timeline["succeeded"]["start"]) - \
        datetime.fromisoformat(timeline["running"]["start"])
    assert took.total_seconds() >= 3.0
    by_phase = job["cost_detail"]["phases"]
    assert by_phase["training"] > by_phase["staging"] >= 0


# -- RG5: the copy onto the local NVMe the Deep Learning AMI mounts -------------------------------


def _dry_run_150_gb(cli, s3, stored_as, instance_type: str, *extra: str) -> dict:
    """The dry run's rows for 150 GB of ImageNet (150 shards of 1 GB as S3 lists them) on
    `instance_type`."""
    if "imagenet150/shards/shard-00000.tar" not in stored_as:
        _store_shards(s3, stored_as, "imagenet150", 150, 10**9)
    dry = cli.ok("launch", "--data", f"imagenet=s3://{BUCKET}/imagenet150", "--instance",
                 instance_type, "--dry-run", *extra, "--", "true", env=ENV).stdout
    return dict(_rows(dry), text=" ".join(dry.split()))


@pytest.mark.parametrize("instance_type, disks", [
    ("g5.xlarge", "1 disk, 250 GB"), ("g6e.xlarge", "1 disk, 250 GB"),
    ("p4d.24xlarge", "8 disks, 8,000 GB")])
def test_RG5_the_dry_run_puts_a_150_gb_copy_on_the_local_nvme_and_buys_no_disk_for_it(
        cli, aws, s3, stored_as, instance_type, disks):
    """RG5: 150 GB of ImageNet on a type whose Deep Learning AMI mounts NVMe big enough: the
    dry run's root volume is the default's (not raised for the copy), no gp3 throughput is
    provisioned or noted, and its staging row says where the copy goes and why."""
    rows = _dry_run_150_gb(cli, s3, stored_as, instance_type)
    assert rows["disk"] == "100 GB gp3, encrypted, deleted with the instance", rows["disk"]
    assert rows["staging"].startswith(
        "the datasets are copied onto the local NVMe the Deep Learning AMI mounts at "
        f"/opt/dlami/nvme ({disks}; the copy needs 168 GB): free with {instance_type}, and "
        "lost with the instance as the root volume is"), rows["staging"]
    assert "provisioned" not in rows["text"] and "staging_disk_mbps" not in rows["text"]
    assert rows["data"].startswith(f"imagenet from s3://{BUCKET}/imagenet150 (150.0 GB, ")


def test_RG5_the_dry_run_says_why_a_copy_goes_onto_the_root_volume(cli, aws, s3, stored_as):
    """RG5: where the NVMe cannot take it (too small, none mounted by the image, an image of
    the user's own) the root volume is sized and sped up as before, and the plan says why."""
    too_big = _dry_run_150_gb(cli, s3, stored_as, "g4dn.xlarge")
    assert too_big["staging"] == (
        "the datasets are copied onto the root volume (sized for them above): g4dn.xlarge's "
        "local NVMe (125 GB at /opt/dlami/nvme) is smaller than the 168 GB the copy needs "
        "(the files, 5% for the file system, the shards in flight)")
    assert too_big["disk"].startswith("268 GB gp3, ") and "provisioned for the data copy" in \
        too_big["disk"]
    own = _dry_run_150_gb(cli, s3, stored_as, "g5.xlarge", *OWN_IMAGE)
    assert own["staging"] == ("the datasets are copied onto the root volume (sized for them "
                              "above): --ami: cloudtrain knows of no local NVMe your image "
                              "mounts")
    assert "437 MB/s and 3000 IOPS provisioned for the data copy" in own["disk"]
