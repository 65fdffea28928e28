"""The S3 job store against moto's server on 127.0.0.1: the bucket's settings read back,
the agent's uploader POSTing through a presigned grant, and fetch treating the bucket as
untrusted. Where moto is weaker than S3 it is said where it matters.

moto does not check a presigned POST's policy (signature, expiry, key prefix, size range):
what S3 would refuse there is tested against the policy itself (tests/unit) and, for the
uploader's handling of S3's answers, against a small HTTP server that answers as S3 does.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import time
from pathlib import Path

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from labs.aws import moto_endpoint  # noqa: F401  (fixture)
from cloudtrain.host import agent_upload
from cloudtrain.providers.aws import jobstore, jobstore_fetch
from cloudtrain.errors import CloudtrainError
from labs.credentials import CLIENT_CREDS
from labs.loopback import serve
from labs.aws import reset_moto

REGION = "eu-west-1"
ACCOUNT = "123456789012"  # moto's default account
OWNER = f"arn:aws:iam::{ACCOUNT}:user/tester"
JOB = "ab12cd34"
KEY = "AIDAJQABLZS4A3QDU576Q"  # the caller's aws:userid: its own prefix jobs/<KEY>/ (F32)
PREFIX = f"jobs/{KEY}/{JOB}/"
CREDS = CLIENT_CREDS


def _client(endpoint: str, region: str = REGION):
    return jobstore.s3_client(boto3.Session(region_name=region, **CREDS), region, endpoint)


@pytest.fixture
def s3(moto_endpoint):  # noqa: F811
    reset_moto(moto_endpoint)
    return _client(moto_endpoint)


@pytest.fixture
def bucket(s3):
    name = jobstore.bucket_name(ACCOUNT, REGION)
    jobstore.ensure_bucket(s3, name, REGION, OWNER, owner_key=KEY)
    # moto evaluates a Deny whose condition it cannot evaluate (aws:SecureTransport) as a
    # deny of every object read, TLS or not (moto/s3/models.py get_permission is given no
    # condition values): the TLS-only policy is checked by reading it back, not enforced here.
    s3.delete_bucket_policy(Bucket=name)
    return name


def _calls(s3) -> list[str]:
    seen: list[str] = []
    s3.meta.events.register("before-call.s3", lambda model, **kw: seen.append(model.name))
    return seen


def _answer(s3, operation: str, status: int, code: str):
    """Make `operation` answer as S3 would with `status`/`code` (a botocore hook; the other
    calls still reach moto)."""
    def handler(**kwargs):
        return (AWSResponse("https://s3", status, {}, None),
                {"Error": {"Code": code, "Message": code},
                 "ResponseMetadata": {"HTTPStatusCode": status}})
    s3.meta.events.register(f"before-call.s3.{operation}", handler)


def _job(root: Path, checkpoint_bytes: int = 3 << 20) -> Path:
    job = root / "job"
    (job / "checkpoints" / "epoch_2").mkdir(parents=True)
    (job / "status.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0}))
    (job / "job.json").write_text(json.dumps({"job_id": JOB}))
    (job / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e}) + "\n" for e in range(9)))
    (job / "output.log").write_bytes(b"line\n" * 20000)
    (job / "checkpoints" / "epoch_2" / "model.pt").write_bytes(os.urandom(checkpoint_bytes))
    (job / "checkpoints" / "empty.txt").write_bytes(b"")
    (job / "checkpoints" / "passwd").symlink_to("/etc/passwd")
    return job


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _upload(s3, bucket, job: Path, max_bytes: int = 1 << 30, timeout_s: float = 30.0) -> dict:
    grant = jobstore.upload_grant(s3, bucket, JOB, expires_s=600, max_bytes=max_bytes,
                                  owner_key=KEY)
    return agent_upload.upload_job(str(job), json.loads(json.dumps(grant)), timeout_s=timeout_s)


# -- the bucket ------------------------------------------------------------------------------


def test_new_bucket_is_private_encrypted_tls_only_expiring_and_tagged(s3):
    """RF4 (confirmed correct by the review of our AWS assumptions): the job store's bucket,
    named for the account and region, is private (Block Public Access), encrypted (SSE-S3
    with a bucket key), TLS only, expiring, and tagged; the owner check on every call is the
    defence against a squatted name."""
    name = jobstore.bucket_name(ACCOUNT, REGION)
    assert jobstore.ensure_bucket(s3, name, REGION, OWNER, expire_days=14, owner_key=KEY) is True

    assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] == REGION
    block = s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
    assert block == {"BlockPublicAcls": True, "IgnorePublicAcls": True,
                     "BlockPublicPolicy": True, "RestrictPublicBuckets": True}
    [rule] = s3.get_bucket_encryption(Bucket=name)[
        "ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    assert rule["BucketKeyEnabled"] is True
    tags = {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=name)["TagSet"]}
    assert tags == {"cloudtrain:owner": OWNER, "Name": name}
    [statement] = json.loads(s3.get_bucket_policy(Bucket=name)["Policy"])["Statement"]
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*"
    assert statement["Action"] == "s3:*"
    assert sorted(statement["Resource"]) == [f"arn:aws:s3:::{name}", f"arn:aws:s3:::{name}/*"]
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    rules = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]}
    expire, abort = rules["expire-jobs"], rules["abort-incomplete-multipart-uploads"]
    assert expire["Status"] == abort["Status"] == "Enabled"
    assert expire["Filter"] == {"Prefix": "jobs/"} and expire["Expiration"] == {"Days": 14}
    assert abort["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}


def test_later_calls_cost_one_listing_of_the_callers_own_prefix(s3):
    """F32: HeadBucket needs s3:ListBucket on the whole bucket, which the policy no longer
    gives; a listing of the caller's own prefix (one key) says as much."""
    name = jobstore.bucket_name(ACCOUNT, REGION)
    assert jobstore.ensure_bucket(s3, name, REGION, OWNER, owner_key=KEY) is True
    calls, asked = _calls(s3), []
    s3.meta.events.register("provide-client-params.s3.ListObjectsV2",
                            lambda params, **kw: asked.append(params["Prefix"]))
    assert jobstore.ensure_bucket(s3, name, REGION, OWNER, owner_key=KEY) is False
    assert calls == ["ListObjectsV2"] and asked == [f"jobs/{KEY}/"]


def test_creating_the_bucket_without_the_admin_policy_says_it_is_an_admin_step_F32(s3):
    """F32: creating and locking down the bucket is a one-time administrator's step
    (infra/iam-policy-store-admin.json); an everyday user is told so, not given AccessDenied."""
    name = jobstore.bucket_name(ACCOUNT, REGION)
    _answer(s3, "CreateBucket", 403, "AccessDenied")
    with pytest.raises(CloudtrainError) as err:
        jobstore.ensure_bucket(s3, name, REGION, OWNER, owner_key=KEY)
    assert err.value.message == (f"the job store bucket {name} does not exist, and creating it "
                                 "is a one-time administrator's step")
    assert "infra/README.md" in err.value.hint
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_us_east_1_bucket_is_created_without_a_location_constraint(moto_endpoint):  # noqa: F811
    reset_moto(moto_endpoint)
    s3 = _client(moto_endpoint, "us-east-1")
    name = jobstore.bucket_name(ACCOUNT, "us-east-1")
    assert jobstore.ensure_bucket(s3, name, "us-east-1", OWNER, owner_key=KEY) is True
    assert s3.get_bucket_location(Bucket=name)["LocationConstraint"] in (None, "")


def test_a_racing_creator_of_our_own_is_fine(s3):
    name = jobstore.bucket_name(ACCOUNT, REGION)
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    _answer(s3, "ListObjectsV2", 404, "NoSuchBucket")  # it did not exist a moment ago
    # BucketAlreadyOwnedByYou
    assert jobstore.ensure_bucket(s3, name, REGION, OWNER, owner_key=KEY) is False
    assert s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]


def _squat(endpoint: str, name: str) -> None:
    """Create bucket `name` in another account (111111111111), as a squatter would."""
    sts = boto3.client("sts", region_name=REGION, endpoint_url=endpoint, **CREDS)
    creds = sts.assume_role(RoleArn="arn:aws:iam::111111111111:role/squatter",
                            RoleSessionName="squat")["Credentials"]
    theirs = boto3.client("s3", region_name=REGION, endpoint_url=endpoint,
                          aws_access_key_id=creds["AccessKeyId"],
                          aws_secret_access_key=creds["SecretAccessKey"],
                          aws_session_token=creds["SessionToken"])
    theirs.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})


def test_bucket_name_taken_by_another_account_is_a_clear_error(s3, moto_endpoint):  # noqa: F811
    name = jobstore.bucket_name(ACCOUNT, REGION)
    _squat(moto_endpoint, name)
    # S3 answers ListObjectsV2 with ExpectedBucketOwner=<our account> on their bucket with
    # 403; moto ignores ExpectedBucketOwner, so that answer is given here by hook.
    _answer(s3, "ListObjectsV2", 403, "AccessDenied")
    with pytest.raises(CloudtrainError, match=f"{name} belongs to another AWS account"):
        jobstore.ensure_bucket(s3, name, REGION, OWNER, owner_key=KEY)


def test_bucket_already_exists_on_create_is_a_clear_error(s3, moto_endpoint):  # noqa: F811
    name = jobstore.bucket_name(ACCOUNT, REGION)
    _squat(moto_endpoint, name)
    _answer(s3, "ListObjectsV2", 404, "NoSuchBucket")
    with pytest.raises(CloudtrainError, match="belongs to another AWS account") as err:
        jobstore.ensure_bucket(s3, name, REGION, OWNER, owner_key=KEY)
    assert "BucketAlreadyExists" in repr(err.value.__cause__)


def test_a_bucket_left_half_configured_is_deleted_so_the_next_call_starts_again(s3):
    name = jobstore.bucket_name(ACCOUNT, REGION)
    hook = s3.meta.events.register
    failing = []

    def refuse(**kwargs):
        failing.append(1)
        return (AWSResponse("https://s3", 403, {}, None),
                {"Error": {"Code": "AccessDenied", "Message": "no s3:PutLifecycleConfiguration"},
                 "ResponseMetadata": {"HTTPStatusCode": 403}})

    hook("before-call.s3.PutBucketLifecycleConfiguration", refuse, unique_id="refuse")
    with pytest.raises(Exception, match="AccessDenied"):
        jobstore.ensure_bucket(s3, name, REGION, OWNER, owner_key=KEY)
    assert failing and name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.meta.events.unregister("before-call.s3.PutBucketLifecycleConfiguration",
                              unique_id="refuse")
    assert jobstore.ensure_bucket(s3, name, REGION, OWNER, owner_key=KEY) is True
    assert s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]


# -- upload and fetch ------------------------------------------------------------------------


def test_round_trip_brings_back_identical_bytes_and_a_complete_manifest(s3, bucket, tmp_path):
    job = _job(tmp_path)
    expected = _tree(job)
    # Over the 5 GB a POST can carry: skipped (sparse, so nothing is read or written).
    with open(job / "checkpoints" / "huge.bin", "wb") as f:
        f.truncate(agent_upload.POST_MAX_BYTES + 1)
    result = _upload(s3, bucket, job)
    assert result["ok"] is True and result["error"] is None, result
    assert result["files"] == len(expected)
    assert result["bytes"] == sum(len(v) for v in expected.values())

    stored = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert stored == {f"{PREFIX}{rel}" for rel in expected} | {f"{PREFIX}manifest.json"}
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{PREFIX}manifest.json")[
        "Body"].read())
    assert {f["path"] for f in manifest["files"]} == set(expected)
    assert {s["path"] for s in manifest["skipped"]} == {"checkpoints/passwd",
                                                        "checkpoints/huge.bin"}

    out = tmp_path / "fetched"
    fetched = jobstore_fetch.fetch(s3, bucket, JOB, out, limit_bytes=1 << 30, owner_key=KEY)
    assert fetched.complete and fetched.found
    assert sorted(fetched.skipped) == [
        ("checkpoints/huge.bin", "not uploaded: larger than the 1073741824-byte upload limit"),
        ("checkpoints/passwd", "not uploaded: not a regular file")]
    assert fetched.uploaded_at == manifest["uploaded_at"]
    assert _tree(out) == expected
    assert sorted(fetched.files) == sorted(expected) and fetched.bytes == result["bytes"]
    assert fetched.files[:4] == ["job.json", "metrics.jsonl", "output.log", "status.json"]

    only = jobstore_fetch.fetch(s3, bucket, JOB, tmp_path / "status", limit_bytes=1 << 20,
                          only=("status.json", "output.log"), owner_key=KEY)
    assert sorted(only.files) == ["output.log", "status.json"]


def test_a_job_stored_before_owner_prefixes_still_reads_from_its_own_F32(s3, bucket, tmp_path):
    """F32: a job recorded before owner prefixes (owner_key None) stored under jobs/<id>/;
    reading it there still works, and neither layout sees the other's files."""
    job = _job(tmp_path)
    grant = jobstore.upload_grant(s3, bucket, JOB, expires_s=600, max_bytes=1 << 30,
                                  owner_key=None)
    assert grant["prefix"] == f"jobs/{JOB}/"
    assert agent_upload.upload_job(str(job), json.loads(json.dumps(grant)), timeout_s=30)["ok"]
    old = jobstore_fetch.fetch(s3, bucket, JOB, tmp_path / "old", limit_bytes=1 << 30, owner_key=None)
    assert old.complete and _tree(tmp_path / "old") == _tree(job)
    assert not jobstore_fetch.fetch(s3, bucket, JOB, tmp_path / "new", limit_bytes=1 << 30,
                              owner_key=KEY).found
    _upload(s3, bucket, job)  # the same job id under the owner's prefix
    assert jobstore.delete_job(s3, bucket, JOB, owner_key=KEY) == len(_tree(job)) + 1
    assert jobstore_fetch.fetch(s3, bucket, JOB, tmp_path / "old2", limit_bytes=1 << 30,
                          owner_key=None).complete


def test_nothing_stored_is_an_empty_result(s3, bucket, tmp_path):
    fetched = jobstore_fetch.fetch(s3, bucket, JOB, tmp_path / "out", limit_bytes=1 << 20, owner_key=KEY)
    assert not fetched.found and not fetched.complete and fetched.files == []
    missing = jobstore_fetch.fetch(s3, "cloudtrain-999999999999-eu-west-1", JOB, tmp_path / "o",
                             limit_bytes=1 << 20, owner_key=KEY)
    assert not missing.found


def test_upload_without_its_manifest_is_reported_incomplete(s3, bucket, tmp_path):
    job = _job(tmp_path)
    assert _upload(s3, bucket, job)["ok"]
    s3.delete_object(Bucket=bucket, Key=f"{PREFIX}manifest.json")  # cut before the end
    fetched = jobstore_fetch.fetch(s3, bucket, JOB, tmp_path / "out", limit_bytes=1 << 30, owner_key=KEY)
    assert fetched.found and not fetched.complete and fetched.uploaded_at is None
    assert "status.json" in fetched.files  # what is there still comes home, unverified


def test_contents_that_differ_from_the_manifest_are_not_kept(s3, bucket, tmp_path):
    job = _job(tmp_path)
    assert _upload(s3, bucket, job)["ok"]
    log = (job / "output.log").read_bytes()
    s3.put_object(Bucket=bucket, Key=f"{PREFIX}output.log", Body=b"X" * len(log))
    s3.put_object(Bucket=bucket, Key=f"{PREFIX}extra.sh", Body=b"rm -rf ~")
    out = tmp_path / "out"
    out.mkdir()
    (out / "output.log").write_bytes(b"the copy fetched earlier")
    fetched = jobstore_fetch.fetch(s3, bucket, JOB, out, limit_bytes=1 << 30, owner_key=KEY)
    assert fetched.complete
    assert ("output.log", "sha256 differs from the manifest") in fetched.skipped
    assert ("extra.sh", "not in the manifest") in fetched.skipped
    assert not (out / "extra.sh").exists() and (out / "status.json").exists()
    # The bad object neither replaced the good local copy nor left a partial file.
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "job.json",
                                                     "metrics.jsonl", "output.log", "status.json"]
    assert (out / "output.log").read_bytes() == b"the copy fetched earlier"


def test_hostile_keys_are_skipped_and_nothing_lands_outside(s3, bucket, tmp_path):
    prefix = PREFIX
    hostile = ["../../escaped", "..", "a/../../../escaped2", "/etc/passwd_copy", "//abs",
               "ctl\x01name", "tab\tname", "back\\..\\slash", "./dot", "dir//double",
               "linked/owned"]
    for rel in hostile:
        s3.put_object(Bucket=bucket, Key=prefix + rel, Body=b"pwned")
    s3.put_object(Bucket=bucket, Key=prefix + "status.json", Body=b"{}")
    box = tmp_path / "box"
    out = box / "out"
    out.mkdir(parents=True)
    (out / "linked").symlink_to(tmp_path)  # a link already in the folder leads out of it

    fetched = jobstore_fetch.fetch(s3, bucket, JOB, out, limit_bytes=1 << 20, owner_key=KEY)
    assert fetched.files == ["status.json"] and not fetched.complete
    assert sorted(rel for rel, _ in fetched.skipped) == sorted(hostile)
    assert {why for _, why in fetched.skipped} == {"unsafe path"}
    written = [p for p in tmp_path.rglob("*") if p.is_file() and b"pwned" in p.read_bytes()]
    assert written == []
    assert [p.relative_to(box).as_posix() for p in box.rglob("*")] == \
        ["out", "out/linked", "out/status.json"]
    assert jobstore.delete_job(s3, bucket, JOB, owner_key=KEY) == len(hostile) + 1
    assert s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["KeyCount"] == 0


def test_checkpoint_over_the_limit_is_not_downloaded(s3, bucket, tmp_path):
    job = _job(tmp_path, checkpoint_bytes=2 << 20)
    assert _upload(s3, bucket, job)["ok"]
    out = tmp_path / "out"
    fetched = jobstore_fetch.fetch(s3, bucket, JOB, out, limit_bytes=1 << 20, owner_key=KEY)
    assert fetched.complete and fetched.bytes <= 1 << 20
    [(rel, why)] = [s for s in fetched.skipped if not s[1].startswith("not uploaded")]
    assert rel == "checkpoints/epoch_2/model.pt" and "limit" in why
    assert not (out / "checkpoints" / "epoch_2" / "model.pt").exists()
    assert (out / "status.json").exists() and (out / "output.log").exists()


def test_an_object_that_grows_after_listing_is_stopped_while_downloading(s3, bucket, tmp_path):
    prefix = PREFIX
    s3.put_object(Bucket=bucket, Key=prefix + "output.log", Body=b"x" * 1000)
    other = _client(s3.meta.endpoint_url)

    def grow(**kwargs):  # between our listing and the download
        other.put_object(Bucket=bucket, Key=prefix + "output.log", Body=b"y" * (3 << 20))
    s3.meta.events.register("before-call.s3.HeadObject", grow)
    out = tmp_path / "out"
    fetched = jobstore_fetch.fetch(s3, bucket, JOB, out, limit_bytes=1 << 30, owner_key=KEY)
    assert fetched.files == [] and fetched.skipped[0][0] == "output.log"
    assert "more than the 1000 bytes listed" in fetched.skipped[0][1]
    assert list(out.iterdir()) == []


def test_grant_for_a_missing_bucket_fails_readably_without_raising(s3, tmp_path):
    grant = jobstore.upload_grant(s3, "cloudtrain-999999999999-eu-west-1", JOB, 60, 1 << 20,
                                  owner_key=KEY)
    result = agent_upload.upload_job(str(_job(tmp_path)), grant, timeout_s=10)
    assert result["ok"] is False and result["files"] == 0
    assert "HTTP 404" in result["error"] and "NoSuchBucket" in result["error"]


# -- the uploader against S3's answers that moto does not give ---------------------------------


class _S3Like(http.server.BaseHTTPRequestHandler):
    """Answers POSTs from a script of (status, body); records what came."""

    script: list = []
    seen: list = []

    def do_POST(self):
        length = int(self.headers["Content-Length"])
        body = self.rfile.read(length)
        self.seen.append(body)
        status, text = self.script.pop(0) if self.script else (204, b"")
        self.send_response(status)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args):
        pass


@pytest.fixture
def s3_like(monkeypatch):
    monkeypatch.setattr(agent_upload, "BACKOFF_S", 0.1)  # the schedule, faster
    url, server = serve(_S3Like)
    _S3Like.script, _S3Like.seen = [], []
    yield f"{url}/", _S3Like
    server.close()


EXPIRED = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>"
           b"<Message>Invalid according to Policy: Policy expired.</Message></Error>")


def test_expired_grant_is_reported_once_not_retried(s3_like, tmp_path):
    url, server = s3_like
    server.script = [(403, EXPIRED)]
    grant = {"url": url, "fields": {"policy": "p"}, "prefix": f"jobs/{JOB}/"}
    result = agent_upload.upload_job(str(_job(tmp_path)), grant, timeout_s=10)
    assert result["ok"] is False and len(server.seen) == 1
    assert "403 AccessDenied: Invalid according to Policy: Policy expired." in result["error"]
    assert "expired" in result["error"] and "no manifest" in result["error"]


def test_server_errors_are_retried_with_backoff_then_the_upload_goes_on(s3_like, tmp_path):
    url, server = s3_like
    slow_down = (b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate."
                 b"</Message></Error>")
    server.script = [(503, slow_down), (500, b"")]
    job = _job(tmp_path, checkpoint_bytes=1000)
    grant = {"url": url, "fields": {"policy": "p"}, "prefix": f"jobs/{JOB}/"}
    result = agent_upload.upload_job(str(job), grant, timeout_s=20)
    assert result["ok"] is True, result
    files = len(agent_upload.job_files(str(job))[0])
    assert len(server.seen) == files + 2 + 1  # two retries of the first file, the manifest
    first = server.seen[0]
    # The same request again, from the file's start (each with a boundary of its own).
    assert [_unbound(body) for body in server.seen[:3]] == [_unbound(first)] * 3
    assert b'name="key"\r\n\r\njobs/ab12cd34/status.json\r\n' in first
    assert first.index(b'name="policy"') < first.index(b'name="key"') < first.index(b'name="file"')
    assert b'name="key"\r\n\r\njobs/ab12cd34/manifest.json\r\n' in server.seen[-1]


def _unbound(body: bytes) -> bytes:
    boundary = body.split(b"\r\n", 1)[0]
    return body.replace(boundary, b"--BOUNDARY")


def test_persistent_server_errors_stop_after_three_tries(s3_like, tmp_path):
    url, server = s3_like
    server.script = [(503, b"")] * 5
    grant = {"url": url, "fields": {}, "prefix": f"jobs/{JOB}/"}
    result = agent_upload.upload_job(str(_job(tmp_path)), grant, timeout_s=20)
    assert result["ok"] is False and len(server.seen) == agent_upload.TRIES
    assert "HTTP 503" in result["error"]


def test_time_limit_stops_the_upload_without_a_manifest(s3_like, tmp_path):
    url, server = s3_like
    grant = {"url": url, "fields": {}, "prefix": f"jobs/{JOB}/"}
    result = agent_upload.upload_job(str(_job(tmp_path)), grant, timeout_s=0.0)
    assert result["ok"] is False and result["files"] == 0 and result["seconds"] < 2
    assert "ran out of time" in result["error"] and "no manifest" in result["error"]
    assert not any(b"manifest.json" in body for body in server.seen)


def test_named_outputs_go_up_after_the_checkpoints_and_come_back(s3, bucket, tmp_path):
    """issue 16 (D39): a job's named outputs (files and directories below its working
    directory) travel through the job store when nobody watched; one that is not there, or
    that is not a path inside the job, is said in the manifest, never silently skipped."""
    job = _job(tmp_path)
    (job / "work" / "results" / "sub").mkdir(parents=True)
    (job / "work" / "results" / "sub" / "a.csv").write_text("x,y\n1,2\n")
    (job / "work" / "model.bin").write_bytes(os.urandom(3000))
    (job / "work" / "ignored.txt").write_text("not an output")
    grant = jobstore.upload_grant(s3, bucket, JOB, expires_s=600, max_bytes=1 << 30, owner_key=KEY)
    result = agent_upload.upload_job(str(job), json.loads(json.dumps(grant)), timeout_s=30,
                                     outputs=["work/results", "work/model.bin",
                                              "work/results/sub", "work/absent",
                                              "../escape", "checkpoints"])
    assert result["ok"] is True, result
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{PREFIX}manifest.json")[
        "Body"].read())
    paths = [f["path"] for f in manifest["files"]]
    assert paths.count("work/results/sub/a.csv") == 1  # an output inside another: once
    assert paths.index("work/model.bin") > max(i for i, p in enumerate(paths)
                                               if p.startswith("checkpoints/"))
    skipped = {s["path"]: s["reason"] for s in manifest["skipped"]}
    assert skipped["work/absent"] == "not found"
    assert skipped["../escape"] == "not a path inside the job directory"
    assert "checkpoints" not in skipped  # brought home anyway, once
    out = tmp_path / "fetched"
    jobstore_fetch.fetch(s3, bucket, JOB, out, limit_bytes=1 << 30, owner_key=KEY)
    assert (out / "work" / "results" / "sub" / "a.csv").read_text() == "x,y\n1,2\n"
    assert (out / "work" / "model.bin").read_bytes() == (job / "work" / "model.bin").read_bytes()
    assert not (out / "work" / "ignored.txt").exists()


# -- a job on its own IAM role (issue 36): PUTs signed with the role's renewed credentials ----


@pytest.fixture
def puts(monkeypatch):
    """(key path, the Authorization header) of every object PUT moto's S3 carries out."""
    from moto.s3.responses import S3Response

    seen: list[tuple[str, str]] = []
    original = S3Response.put_object

    def put_object(self):
        seen.append((str(getattr(self, "path", "")), self.headers.get("Authorization") or ""))
        return original(self)

    monkeypatch.setattr(S3Response, "put_object", put_object)
    return seen


def _role_grant(bucket, endpoint, imds) -> dict:
    from cloudtrain.providers.aws.results import role_grant
    from cloudtrain.config import Settings
    from types import SimpleNamespace

    aws = SimpleNamespace(settings=Settings(imds_url=imds.url))
    grant = role_grant(aws, bucket, REGION, PREFIX)
    return json.loads(json.dumps({**grant, "endpoint": endpoint}))


def test_RF1_a_job_on_its_role_stores_its_files_with_puts_signed_by_the_role(
        s3, bucket, tmp_path, moto_endpoint, puts, monkeypatch):  # noqa: F811
    """RF1: every write of an instance rode on one presigned POST signed with the user's
    credentials, dead with their session (an SSO hour). A job on its own role stores the
    same files, manifest last, each a PUT signed (SigV4, with the session token) with the
    role's credentials from the metadata service (IMDSv2), none of the user's."""
    from labs.imds import FakeIMDS

    monkeypatch.setattr(agent_upload, "_ROLES", {})
    imds = FakeIMDS(creds={"AccessKeyId": "ASIAJOBROLE1", "SecretAccessKey": "role/secret/1",
                           "Token": "session-1"})
    try:
        job = _job(tmp_path)
        expected = _tree(job)
        result = agent_upload.upload_job(str(job), _role_grant(bucket, moto_endpoint, imds),
                                         timeout_s=30)
    finally:
        imds.close()
    assert result["ok"] is True and result["error"] is None, result
    stored = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert stored == {f"{PREFIX}{rel}" for rel in expected} | {f"{PREFIX}manifest.json"}
    assert [p.rsplit("/", 1)[-1] for p, _ in puts][-1] == "manifest.json"
    assert len(puts) == len(stored)
    assert all(auth.startswith("AWS4-HMAC-SHA256 Credential=ASIAJOBROLE1/") for _, auth in puts)
    fetched = jobstore_fetch.fetch(s3, bucket, JOB, tmp_path / "back", limit_bytes=1 << 30,
                                   owner_key=KEY)
    assert fetched.complete and _tree(tmp_path / "back") == expected


def test_RF1_the_role_s_credentials_are_renewed_as_they_near_their_end(
        s3, bucket, tmp_path, moto_endpoint, puts, monkeypatch):  # noqa: F811
    """Days-long jobs: the metadata service hands out new role credentials before the old
    ones end, and each write asks for them again when fewer than five minutes remain: the
    writes after a renewal carry the new key."""
    from labs.imds import FakeIMDS

    monkeypatch.setattr(agent_upload, "_ROLES", {})
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
    imds = FakeIMDS(creds={"AccessKeyId": "ASIAJOBROLE1", "SecretAccessKey": "s1",
                           "Token": "t1"}, expiration=soon)
    grant = _role_grant(bucket, moto_endpoint, imds)
    try:
        agent_upload.post_json(grant, PREFIX + "attempts/1.json", {"attempt": 1})
        imds.creds = {"AccessKeyId": "ASIAJOBROLE2", "SecretAccessKey": "s2", "Token": "t2"}
        imds.expiration = "2099-01-01T00:00:00Z"
        agent_upload.post_json(grant, PREFIX + "final.json", {"state": "succeeded"})
        agent_upload.post_json(grant, PREFIX + "attempts/2.json", {"attempt": 2})
    finally:
        imds.close()
    assert [auth.split("/", 1)[0].rsplit("=", 1)[-1] for _, auth in puts] == [
        "ASIAJOBROLE1", "ASIAJOBROLE2", "ASIAJOBROLE2"]
    # asked for once more at the renewal, not at every write once renewed
    asked = [p for method, p, _ in imds.seen if method == "GET" and p.endswith("/")]
    assert len(asked) == 2
    assert json.loads(s3.get_object(Bucket=bucket, Key=PREFIX + "final.json")["Body"].read()) \
        == {"state": "succeeded"}


def test_RF1_without_a_role_on_the_instance_the_write_fails_in_one_line(
        bucket, tmp_path, moto_endpoint, monkeypatch):  # noqa: F811
    """An instance launched without the job's profile (or whose metadata service is off)
    has no credentials to sign with: upload_job says so in its error, never a traceback."""
    from labs.imds import FakeIMDS

    monkeypatch.setattr(agent_upload, "_ROLES", {})
    monkeypatch.setattr(agent_upload, "BACKOFF_S", 0.01)
    imds = FakeIMDS(role=None)
    try:
        result = agent_upload.upload_job(str(_job(tmp_path)),
                                         _role_grant(bucket, moto_endpoint, imds), timeout_s=10)
    finally:
        imds.close()
    assert result["ok"] is False
    assert "no credentials of the job's role" in result["error"]
    assert "no instance profile" in result["error"]


# -- RF2: a file over S3's largest PUT, written with the job's role as a multipart upload -----


@pytest.fixture
def small_parts(monkeypatch):
    """S3's limits scaled down (a PUT over 6 MiB goes in parts of 5 MiB, S3's smallest), so a
    13 MiB checkpoint takes the path a 13 GB one would; moto holds parts to S3's 5 MiB."""
    monkeypatch.setattr(agent_upload, "PUT_MAX_BYTES", 6 << 20)
    monkeypatch.setattr(agent_upload, "PART_BYTES", 5 << 20)
    monkeypatch.setattr(agent_upload, "_ROLES", {})
    monkeypatch.setattr(agent_upload, "BACKOFF_S", 0.01)


@pytest.fixture
def parts(monkeypatch):
    """The part numbers moto's S3 stored, in order; `parts.fail` holds part numbers whose
    next upload fails with a 500 (once each)."""
    from moto.s3.models import S3Backend

    seen: list[int] = []
    fail: set[int] = set()
    original = S3Backend.upload_part

    def upload_part(self, bucket_name, multipart_id, part_id, value):
        if int(part_id) in fail:
            fail.discard(int(part_id))
            raise RuntimeError("a part lost on the way (the lab's fault)")
        seen.append(int(part_id))
        return original(self, bucket_name, multipart_id, part_id, value)

    monkeypatch.setattr(S3Backend, "upload_part", upload_part)
    return type("Parts", (), {"seen": seen, "fail": fail})()


def test_RF2_a_checkpoint_over_s3_s_largest_put_goes_in_parts_signed_by_the_role(
        s3, bucket, tmp_path, moto_endpoint, small_parts, parts):  # noqa: F811
    """RF2: one checkpoint file over 5 GB could not be stored at all (one POST or PUT carries
    5 GB), and was skipped: an LLM-sized checkpoint lost. On the job's role it goes as a
    multipart upload: the object whole, its sha256 in the manifest, a part that failed once
    tried again alone, no upload left open."""
    from labs.imds import FakeIMDS

    size = (13 << 20) + 3
    job = _job(tmp_path, checkpoint_bytes=size)
    expected = _tree(job)
    parts.fail.add(2)
    imds = FakeIMDS(creds={"AccessKeyId": "ASIAJOBROLE1", "SecretAccessKey": "s1", "Token": "t"})
    try:
        result = agent_upload.upload_job(str(job), _role_grant(bucket, moto_endpoint, imds),
                                         timeout_s=60)
    finally:
        imds.close()
    assert result["ok"] is True and result["error"] is None, result
    assert parts.seen == [1, 2, 3] and not parts.fail  # part 2 again, not the whole file
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=PREFIX + "manifest.json")["Body"]
                          .read())
    assert all(s["path"] != "checkpoints/epoch_2/model.pt" for s in manifest["skipped"])
    model = next(f for f in manifest["files"] if f["path"] == "checkpoints/epoch_2/model.pt")
    assert model["size"] == size
    assert model["sha256"] == hashlib.sha256(expected["checkpoints/epoch_2/model.pt"]).hexdigest()
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=bucket)
    fetched = jobstore_fetch.fetch(s3, bucket, JOB, tmp_path / "back", limit_bytes=1 << 30,
                                   owner_key=KEY)
    assert fetched.complete and _tree(tmp_path / "back") == expected


def test_RF2_a_multipart_upload_that_cannot_be_completed_is_aborted(
        s3, bucket, tmp_path, moto_endpoint, small_parts, parts, monkeypatch):  # noqa: F811
    """S3 refusing the completion (here InvalidPart, a 400: not worth another try) leaves no
    open upload whose parts would bill until the bucket's rule ends them: the agent aborts it
    and says why, and the manifest is not written (the reader trusts nothing without it)."""
    from moto.s3.exceptions import InvalidPart
    from moto.s3.models import S3Backend
    from labs.imds import FakeIMDS

    def refuse(self, *args, **kwargs):
        raise InvalidPart()

    monkeypatch.setattr(S3Backend, "complete_multipart_upload", refuse)
    imds = FakeIMDS(creds={"AccessKeyId": "ASIAJOBROLE1", "SecretAccessKey": "s1", "Token": "t"})
    try:
        result = agent_upload.upload_job(str(_job(tmp_path, checkpoint_bytes=11 << 20)),
                                         _role_grant(bucket, moto_endpoint, imds), timeout_s=60)
    finally:
        imds.close()
    assert result["ok"] is False and "InvalidPart" in result["error"], result
    assert parts.seen == [1, 2, 3]
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=bucket)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert PREFIX + "manifest.json" not in keys
    assert PREFIX + "checkpoints/epoch_2/model.pt" not in keys


def test_RF2_a_presigned_post_still_skips_a_file_over_5_gb_and_says_why(tmp_path):
    """Without the job's role there is no multipart upload (a POST carries one object of at
    most 5 GB): the limit each grant carries, and the grant's own max_bytes below it."""
    post = {"url": "https://b.s3.amazonaws.com/", "prefix": PREFIX, "fields": {}}
    role = {"signer": "role", "bucket": "b", "region": REGION, "prefix": PREFIX}
    assert agent_upload.upload_limit(post) == 5 * 1024 ** 3
    # the grant a job on its role is given carries no POST's limit
    assert agent_upload.upload_limit(_role_grant("b", None, type("I", (), {"url": "x"}))) \
        == 10000 * 5 * 1024 ** 3
    assert agent_upload.upload_limit(role) == 10000 * 5 * 1024 ** 3
    assert agent_upload.upload_limit({**role, "max_bytes": 7}) == 7
    assert agent_upload.upload_limit({**post, "max_bytes": "junk"}) == 5 * 1024 ** 3
