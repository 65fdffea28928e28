"""cloudtrain/providers/aws/jobstore.py (and the host side's uploader) without a server: names,
untrusted paths, the grant's signed policy, credential expiry, and the uploader's file list and
request body."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import sys
import time

import boto3
import pytest
from hypothesis import given, strategies as st

from cloudtrain.host import agent_upload
from cloudtrain.providers.aws import jobstore
from cloudtrain.errors import UsageError

KEY = "AIDAJQABLZS4A3QDU576Q"  # an IAM user's aws:userid: its own prefix jobs/<KEY>/ (F32)


def test_bucket_name_is_one_per_account_and_region_and_a_valid_s3_name():
    assert jobstore.bucket_name("123456789012", "eu-west-1") == "cloudtrain-123456789012-eu-west-1"
    longest = jobstore.bucket_name("123456789012", "ap-southeast-4")
    assert len(longest) <= 63 and longest == longest.lower()
    assert len(jobstore.bucket_name("123456789012", "us-gov-west-1")) <= 63
    for account, region in [("12345", "eu-west-1"), ("123456789012", "EU-WEST-1"),
                            ("123456789012", "eu-west-1/../x"), ("", "eu-west-1")]:
        with pytest.raises(UsageError):
            jobstore.bucket_name(account, region)


@pytest.mark.parametrize("rel", ["status.json", "checkpoints/a/b.pt", "checkpoints/ü.pt"])
def test_safe_relpath_accepts_plain_relative_paths(rel):
    assert agent_upload.safe_relpath(rel) == rel


@pytest.mark.parametrize("rel", [
    "", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a/", ".", "..", "a\\..\\b",
    "a\nb", "a\x00b", "a\x1bb", "a\x7fb", "C:/x", "x" * 256, "a/" + "y" * 300])
def test_safe_relpath_refuses_what_could_escape_or_mislead(rel):
    assert agent_upload.safe_relpath(rel) is None


def _s3(region="eu-west-1"):
    session = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
                            region_name=region)
    return jobstore.s3_client(session, region)


def _policy(grant: dict) -> dict:
    return json.loads(base64.b64decode(grant["fields"]["policy"]))


def test_grant_policy_limits_the_prefix_the_size_and_the_time():
    """The signed policy holds the job's own prefix, under its owner's (F32)."""
    before = time.time()
    grant = jobstore.upload_grant(_s3(), "cloudtrain-123456789012-eu-west-1", "ab12cd34",
                                  expires_s=3600, max_bytes=1 << 30, owner_key=KEY)
    policy = _policy(grant)
    conditions = policy["conditions"]
    assert ["starts-with", "$key", f"jobs/{KEY}/ab12cd34/"] in conditions
    assert ["content-length-range", 0, 1 << 30] in conditions
    assert {"x-amz-server-side-encryption": "AES256"} in conditions
    assert {"bucket": "cloudtrain-123456789012-eu-west-1"} in conditions
    # No exact-key condition: the uploader picks each key under the prefix.
    assert not [c for c in conditions if isinstance(c, dict) and "key" in c]
    expiration = time.mktime(time.strptime(policy["expiration"], "%Y-%m-%dT%H:%M:%SZ")) \
        - time.timezone
    assert before + 3590 <= expiration <= time.time() + 3610
    assert before + 3600 <= grant["expires_at"] <= time.time() + 3600
    assert grant["prefix"] == f"jobs/{KEY}/ab12cd34/" and grant["max_bytes"] == 1 << 30
    assert "key" not in grant["fields"]
    # SigV4 at the bucket's regional endpoint: a new bucket redirects the global one.
    assert grant["fields"]["x-amz-algorithm"] == "AWS4-HMAC-SHA256"
    assert grant["url"] == "https://cloudtrain-123456789012-eu-west-1.s3.eu-west-1.amazonaws.com/"
    json.dumps(grant)  # goes into job.json as it is


@pytest.mark.parametrize("job_id,expires_s,max_bytes", [
    ("../other", 60, 10), ("a/b", 60, 10), ("", 60, 10), ("ab..cd", 60, 10),
    ("ab12", 0, 10), ("ab12", 8 * 24 * 3600, 10), ("ab12", 60, -1), ("ab12", 60, 6 << 30)])
def test_grant_refuses_bad_job_ids_lifetimes_and_sizes(job_id, expires_s, max_bytes):
    with pytest.raises(UsageError):
        jobstore.upload_grant(_s3(), "cloudtrain-123456789012-eu-west-1", job_id,
                              expires_s=expires_s, max_bytes=max_bytes, owner_key=KEY)


@pytest.mark.parametrize("owner_key", ["", "ab12cd34", "AIDA/../x", "a" * 300, "AIDA JQABLZS4A3Q",
                                       "../AIDAJQABLZS4A3QDU576Q", 12345678901234])
def test_a_bad_owner_key_is_refused_F32(owner_key):
    """The owner key becomes part of every key: an 8-character one would fall under the
    policy's read of the old layout (jobs/????????/*), a slash would leave the prefix."""
    with pytest.raises(UsageError):
        jobstore.job_prefix("ab12cd34", owner_key=owner_key)


def test_the_prefix_is_the_owners_and_old_jobs_keep_theirs_F32():
    assert jobstore.job_prefix("ab12cd34", owner_key=KEY) == f"jobs/{KEY}/ab12cd34/"
    assert jobstore.job_prefix("ab12cd34", 2, owner_key=KEY) == f"jobs/{KEY}/ab12cd34/nodes/2/"
    assert jobstore.job_prefix("ab12cd34", owner_key=None) == "jobs/ab12cd34/"
    assert jobstore.job_prefix("ab12cd34", owner_key="AROA3X42LBCDUVY8K5WCZ:alice@example.com"
                               ) == "jobs/AROA3X42LBCDUVY8K5WCZ:alice@example.com/ab12cd34/"


def test_credential_expiry_is_none_for_long_term_keys():
    session = boto3.Session(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret")
    assert jobstore.credential_expiry(session) is None


def test_credential_expiry_of_temporary_credentials(tmp_path, monkeypatch):
    # A credential_process that returns an Expiration: botocore's real provider chain
    # turns it into refreshable credentials, as it does for SSO and assumed roles.
    ends = time.time() + 1800
    script = tmp_path / "creds.py"
    script.write_text("import json\nprint(json.dumps({'Version': 1, 'AccessKeyId': 'ASIAX', "
                      "'SecretAccessKey': 's', 'SessionToken': 't', 'Expiration': %r}))\n"
                      % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ends)))
    config = tmp_path / "config"
    config.write_text(f"[profile temp]\ncredential_process = {sys.executable} {script}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    expiry = jobstore.credential_expiry(boto3.Session(profile_name="temp"))
    assert expiry is not None and abs(expiry - ends) < 2


def _job(tmp_path):
    job = tmp_path / "job"
    (job / "checkpoints" / "sub").mkdir(parents=True)
    for name in ("output.log", "status.json", "metrics.jsonl", "job.json", "run.sh"):
        (job / name).write_text(name)
    (job / "checkpoints" / "b.pt").write_bytes(b"b")
    (job / "checkpoints" / "sub" / "a.pt").write_bytes(b"a")
    (job / "checkpoints" / "link.pt").symlink_to("/etc/passwd")
    (job / "checkpoints" / "linkdir").symlink_to("/etc")
    (job / "checkpoints" / "bad\nname").write_bytes(b"x")
    return job


def test_uploader_sends_small_files_first_then_regular_checkpoints_only(tmp_path):
    files, skipped = agent_upload.job_files(str(_job(tmp_path)))
    assert [rel for rel, _ in files] == ["status.json", "job.json", "metrics.jsonl",
                                         "output.log", "checkpoints/b.pt",
                                         "checkpoints/sub/a.pt"]
    assert sorted(skipped) == [("checkpoints/bad\nname", "name not portable"),
                               ("checkpoints/link.pt", "not a regular file"),
                               ("checkpoints/linkdir", "not a regular file")]


def test_request_body_streams_the_file_between_the_fields_and_hashes_it(tmp_path):
    data = os.urandom(3 * agent_upload.CHUNK + 17)
    head, tail = agent_upload._form([("policy", "p"), ("key", "jobs/x/a")], "a b\"c", "BOUND")
    body = agent_upload._Body(head, io.BytesIO(data), len(data), tail, time.time() + 60)
    sent = b"".join(iter(lambda: body.read(8192), b""))
    assert len(sent) == len(body) and sent == head + data + tail
    assert body.sha256.hexdigest() == hashlib.sha256(data).hexdigest()
    assert head.endswith(b'name="file"; filename="a_b_c"\r\n'
                         b"Content-Type: application/octet-stream\r\n\r\n")
    assert b'name="key"\r\n\r\njobs/x/a\r\n' in head and tail == b"\r\n--BOUND--\r\n"


def test_a_file_that_shrinks_while_sent_is_an_error_not_a_short_object():
    body = agent_upload._Body(b"h", io.BytesIO(b"abc"), 10, b"t", time.time() + 60)
    body.read(1)
    body.read(100)
    with pytest.raises(agent_upload.FileUnreadable):
        body.read(100)


def test_upload_to_nowhere_reports_and_never_raises(tmp_path):
    from labs.loopback import free_port

    grant = {"url": f"http://127.0.0.1:{free_port()}/", "fields": {}, "prefix": "jobs/x/"}
    started = time.monotonic()
    job = str(_job(tmp_path))
    result = agent_upload.upload_job(job, grant, timeout_s=2.0)
    assert time.monotonic() - started < 5
    assert result["ok"] is False and result["files"] == 0
    assert "cannot reach http://127.0.0.1" in result["error"] and "no manifest" in result["error"]
    for broken in ({}, {"url": 5}, None, {"url": "ftp://x/", "prefix": "p/", "fields": {}}):
        result = agent_upload.upload_job(job, broken, timeout_s=1.0)
        assert result["ok"] is False and result["error"]


@given(st.integers(min_value=1, max_value=10000 * 5 * 1024 ** 3))
def test_RF2_a_multipart_upload_s_parts_hold_the_file_within_s3_s_limits(size):
    """RF2: whatever the file's size up to the role's limit, its parts are whole MiB of at
    least 512 MiB (so at most 10,000 of them hold it) and none over S3's 5 GB part."""
    part = agent_upload.part_bytes(size)
    assert part % (1 << 20) == 0 and part >= agent_upload.PART_BYTES
    assert part <= agent_upload.PUT_MAX_BYTES
    assert -(-size // part) <= agent_upload.MAX_PARTS
