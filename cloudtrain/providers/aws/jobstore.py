"""The S3 job store: a job's status, log, metrics and checkpoints outlive its instance.

    bucket_name(account, region)          one bucket per account and region
    ensure_bucket(s3, bucket, ...)        create and lock it down on first use; later a HeadBucket
    bucket_is_ours(s3, bucket, ...)       read-only: there and ours, or not there (`check`)
    upload_grant(s3, bucket, job, ...)    a presigned POST for one job's prefix, for the agent
    credential_expiry(session)            when the credentials that sign a grant end
    put(s3, bucket, job, name, data)      one object under the job's prefix
    delete_job(s3, bucket, job)           every object under the job's prefix

Reading it back (fetch, latest_checkpoint, restore_plan) is jobstore_fetch.py.

Layout: `jobs/<owner_key>/<job_id>/<path in the job directory>`, and
`jobs/<owner_key>/<job_id>/manifest.json` written last by the uploader
(cloudtrain/host/agent_upload.py, on the instance) as the sign that
the upload is complete. The instance holds no AWS keys: the grant is an S3 presigned POST
whose signed policy allows keys under the job's prefix only, each at most `max_bytes`, until
it expires (no IAM role to create, no iam:PassRole needed).

`<owner_key>` is the caller's `aws:userid` (STS GetCallerIdentity's UserId: an IAM user's unique
id, `<role id>:<session name>` for an assumed role), which an IAM policy can name as
`${aws:userid}`: infra/iam-policy-cli.json gives each principal its own prefix only. Jobs
stored before owners were part of the key live under `jobs/<job_id>/` (`owner_key=None`
below); the job's record says which (the provider keeps the owner key with the job).

`<prefix>stream/` is the checkpoint stream (cloudtrain/host/checkpoint_stream.py): two slots
`stream/a/`, `stream/b/` and `stream/latest.json` naming the one that holds a complete
snapshot. jobstore_fetch.fetch() leaves it alone, except that when the upload's manifest
says the checkpoints went there (`checkpoints_in_stream`) it brings them from the named slot.

Nothing read from the bucket is trusted: whoever held the grant could have written any key
under the prefix with any content until it expired. Keys are checked as untrusted paths,
sizes against a limit before and while downloading, contents against the manifest's sha256.

boto3 is imported inside functions only: `cloudtrain --help` does not pay for it. Raw boto
dicts stay inside this module.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

from ...errors import CloudtrainError, UsageError
from ...host import checkpoint_manifest
from ...host.agent_upload import POST_MAX_BYTES
from .errors import code_of

PREFIX = "jobs/"
STREAM = checkpoint_manifest.STREAM  # "stream/": the checkpoint stream, below the job's prefix
LATEST_MAX_BYTES = checkpoint_manifest.MANIFEST_MAX_BYTES  # stream/latest.json
TAG_OWNER = "cloudtrain:owner"  # the same tag key as every other cloudtrain resource
# SigV4 signatures last at most 7 days; the same bound is kept for POST policies.
GRANT_MAX_S = 7 * 24 * 3600
MANIFEST_MAX_BYTES = 16 << 20
MAX_OBJECTS = 100_000  # a job prefix listing more than this is not a job's upload
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# aws:userid: AIDA... (21 characters), AROA...:session, the 12-digit account, account:name.
# Never 8 characters: the policy's read of old-layout jobs (`jobs/????????/*`, 8-hex ids)
# cannot reach an owner's prefix.
OWNER_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9:+=,.@_-]{11,255}")
ACCOUNT = re.compile(r"\d{12}")
REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d{1,2}")
# S3 answers HeadBucket without a body: only the status says what happened.
MISSING = {"404", "NoSuchBucket", "NotFound"}
FORBIDDEN = {"403", "AccessDenied", "Forbidden"}


def s3_client(session, region: str, endpoint_url: str | None = None):
    """An S3 client fit for the job store: SigV4 (a presigned POST is SigV2 otherwise),
    the bucket's regional endpoint (a bucket created minutes ago answers the global
    endpoint with 307 redirects, which a POST cannot follow), standard retries."""
    from botocore.config import Config

    style = "path" if endpoint_url else "virtual"  # a local endpoint (moto) has no DNS names
    cfg = Config(signature_version="s3v4", s3={"addressing_style": style},
                 retries={"max_attempts": 6, "mode": "standard"},
                 connect_timeout=10, read_timeout=60)
    return session.client("s3", region_name=region, endpoint_url=endpoint_url, config=cfg)


def bucket_name(account_id: str, region: str) -> str:
    """`cloudtrain-<account>-<region>`: one bucket per account and region (S3 names are
    global, so the account keeps it ours; at most 63 characters, lowercase)."""
    if not ACCOUNT.fullmatch(account_id or ""):
        raise UsageError(f"not an AWS account id: {account_id!r}")
    if not REGION.fullmatch(region or ""):
        raise UsageError(f"not an AWS region: {region!r}")
    name = f"cloudtrain-{account_id}-{region}"
    assert len(name) <= 63, name
    return name


def ensure_bucket(s3, bucket: str, region: str, owner: str, expire_days: int = 30, *,
                  owner_key: str) -> bool:
    """Make sure `bucket` exists, is ours and is locked down; True when this call created it.

    A later call costs one listing of the caller's own prefix (`jobs/<owner_key>/`, one key:
    the only listing infra/iam-policy-cli.json allows; HeadBucket would need s3:ListBucket on
    the whole bucket). Creating the bucket is a one-time administrator's step
    (infra/iam-policy-store-admin.json): on creation, Block Public Access (all four), default
    encryption SSE-S3 with a bucket key, a policy denying requests without TLS, lifecycle
    rules (objects under jobs/ expire after `expire_days`, incomplete multipart uploads are
    aborted after a day), then the tags. If configuring fails the new bucket is deleted, so
    the next call starts again instead of finding a bucket without its settings.
    `owner` is the caller's ARN (STS GetCallerIdentity): tag value, account and partition."""
    from botocore.exceptions import ClientError

    account, partition = _arn_account(owner), _arn_partition(owner)
    if bucket_is_ours(s3, bucket, owner, owner_key):
        return False
    params: dict = {"Bucket": bucket}
    if region != "us-east-1":  # us-east-1 refuses its own name as a LocationConstraint
        params["CreateBucketConfiguration"] = {"LocationConstraint": region}
    created = True
    try:
        s3.create_bucket(**params)
    except ClientError as exc:
        if code_of(exc) in FORBIDDEN:
            raise CloudtrainError(
                f"the job store bucket {bucket} does not exist, and creating it is a one-time "
                "administrator's step", hint="see 'The job store' in infra/README.md "
                "(infra/iam-policy-store-admin.json)") from exc
        if code_of(exc) == "BucketAlreadyExists":
            raise _not_ours(bucket, account) from exc
        if code_of(exc) != "BucketAlreadyOwnedByYou":  # another cloudtrain of ours, just now
            raise
        created = False
    try:
        _configure(s3, bucket, owner, partition, expire_days)
    except Exception:
        if created:
            try:
                s3.delete_bucket(Bucket=bucket)
            except ClientError:
                pass
        raise
    return created


def bucket_is_ours(s3, bucket: str, owner: str, owner_key: str) -> bool:
    """Read-only: True where `bucket` exists and the caller's account owns it (one listing
    of the caller's own prefix, the only listing infra/iam-policy-cli.json allows), False
    where there is no such bucket; a refusal is the bucket of another account, or one these
    credentials may not use (_not_ours)."""
    from botocore.exceptions import ClientError

    account = _arn_account(owner)
    try:
        s3.list_objects_v2(Bucket=bucket, Prefix=PREFIX + _owner_key(owner_key) + "/",
                           MaxKeys=1, **owner_check(account))
        return True
    except ClientError as exc:
        if code_of(exc) in FORBIDDEN:
            raise _not_ours(bucket, account) from exc
        if code_of(exc) not in MISSING:
            raise
    return False


def _configure(s3, bucket: str, owner: str, partition: str, expire_days: int) -> None:
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True,
        "BlockPublicPolicy": True, "RestrictPublicBuckets": True})
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [{
        "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"},
        "BucketKeyEnabled": True}]})
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(_tls_only(bucket, partition)))
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "expire-jobs", "Status": "Enabled", "Filter": {"Prefix": PREFIX},
         "Expiration": {"Days": int(expire_days)}},
        {"ID": "abort-incomplete-multipart-uploads", "Status": "Enabled",
         "Filter": {"Prefix": ""}, "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}},
    ]})
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [
        {"Key": TAG_OWNER, "Value": owner}, {"Key": "Name", "Value": bucket}]})


def _tls_only(bucket: str, partition: str) -> dict:
    arn = f"arn:{partition}:s3:::{bucket}"
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
        "Resource": [arn, f"{arn}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


def _not_ours(bucket: str, account: str | None) -> CloudtrainError:
    return CloudtrainError(
        f"the S3 bucket {bucket} belongs to another AWS account (or your credentials may "
        "not use it): cloudtrain will not store jobs there",
        hint="bucket names are global, so anyone can take one first; see for yourself with: "
             f"aws s3api head-bucket --bucket {bucket} --expected-bucket-owner "
             f"{account or '<your account id>'}")


def job_prefix(job_id: str, node: int = 0, *, owner_key: str | None) -> str:
    """The job's key prefix, `jobs/<owner_key>/<id>/` (None: `jobs/<id>/`, the layout
    before owners); node i > 0 of a job on several machines stores its own files under
    `<prefix>nodes/<i>/`."""
    _check_job_id(job_id)
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < 1024:
        raise UsageError(f"a node is numbered 0 to 1023, not {node!r}")
    owner = f"{_owner_key(owner_key)}/" if owner_key is not None else ""
    return f"{PREFIX}{owner}{job_id}/" + (f"nodes/{node}/" if node else "")


def upload_grant(s3, bucket: str, job_id: str, expires_s: int, max_bytes: int,
                 node: int = 0, *, owner_key: str | None) -> dict:
    """A presigned POST letting its holder write objects under the job's prefix only
    (job_prefix; node i > 0: `<prefix>nodes/<i>/`), each at most `max_bytes` (S3 allows 5 GB
    per POST),
    for `expires_s` seconds, encrypted SSE-S3.
    Returns {"url", "fields", "prefix", "expires_at", "max_bytes"}, all JSON-serialisable:
    what agent_upload.upload_job takes.

    The signature is made with `s3`'s credentials and lives no longer than they do: a
    grant signed with temporary credentials (SSO, an assumed role, anything with a session
    token) is refused with 403 once that session ends, whatever `expires_s` says. Clamp
    `expires_s` to credential_expiry(session) and tell the user when that is short."""
    prefix = job_prefix(job_id, node, owner_key=owner_key)
    if not 0 < expires_s <= GRANT_MAX_S:
        raise UsageError(f"an upload grant lasts 1 s to 7 days, not {expires_s} s")
    if not 0 <= max_bytes <= POST_MAX_BYTES:
        raise UsageError(f"an S3 POST carries at most {POST_MAX_BYTES} bytes, not {max_bytes}")
    # A key ending in ${filename} makes botocore add ["starts-with", "$key", prefix] to the
    # policy; S3 then refuses any key outside the prefix.
    post = s3.generate_presigned_post(
        Bucket=bucket, Key=prefix + "${filename}", ExpiresIn=int(expires_s),
        Fields={"x-amz-server-side-encryption": "AES256"},
        Conditions=[{"x-amz-server-side-encryption": "AES256"},
                    ["content-length-range", 0, int(max_bytes)]])
    fields = {k: v for k, v in post["fields"].items() if k != "key"}  # the uploader sets it
    return {"url": post["url"], "fields": fields, "prefix": prefix,
            "expires_at": time.time() + int(expires_s), "max_bytes": int(max_bytes)}


def credential_expiry(session) -> float | None:
    """When `session`'s credentials end (Unix time), for temporary ones botocore knows the
    end of (SSO, assumed roles, instance and container roles, credential_process with an
    Expiration). None for long-term access keys, and also for a session token botocore was
    given without its expiry (AWS_SESSION_TOKEN in the environment): such a grant may then
    die earlier than upload_grant says, and nothing here can tell when."""
    creds = session.get_credentials()
    if creds is None:
        return None
    creds.get_frozen_credentials()  # a deferred provider (SSO, assume-role) fetches now
    expiry = getattr(creds, "_expiry_time", None)  # RefreshableCredentials only
    return expiry.timestamp() if expiry is not None else None


def put(s3, bucket: str, job_id: str, name: str, data: bytes, *,
        expected_owner: str | None = None, owner_key: str | None) -> str:
    """Write one object, `name` under the job's prefix, encrypted SSE-S3; returns its key."""
    key = job_prefix(job_id, owner_key=owner_key) + name
    s3.put_object(Bucket=bucket, Key=key, Body=data, ServerSideEncryption="AES256",
                  **owner_check(expected_owner))
    return key


def delete_job(s3, bucket: str, job_id: str, *, expected_owner: str | None = None,
               owner_key: str | None) -> int:
    """Delete every object under the job's prefix; returns how many."""
    keys = [key for key, _ in list_keys(s3, bucket, job_prefix(job_id, owner_key=owner_key),
                                    expected_owner)]
    # DeleteObjects is an XML body, and XML 1.0 cannot carry most control characters: such
    # keys go one by one (DeleteObject names the key in the URL).
    plain = [k for k in keys if not _xml_unsafe(k)]
    for start in range(0, len(plain), 1000):
        batch = [{"Key": k} for k in plain[start:start + 1000]]
        s3.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True},
                          **owner_check(expected_owner))
    for key in keys:
        if _xml_unsafe(key):
            s3.delete_object(Bucket=bucket, Key=key, **owner_check(expected_owner))
    return len(keys)


def list_keys(s3, bucket: str, prefix: str, expected_owner: str | None):
    """(key, size) under `prefix`, every page (botocore asks for url-encoded keys and
    decodes them, so keys with control characters come through intact)."""
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix, **owner_check(expected_owner))
    for page in pages:
        for obj in page.get("Contents", []):
            yield obj["Key"], int(obj["Size"])


def _owner_key(owner_key: str) -> str:
    if not (isinstance(owner_key, str) and OWNER_KEY.fullmatch(owner_key)):
        raise UsageError(f"not an AWS user id (aws:userid): {str(owner_key)[:100]!r}")
    return owner_key


def _check_job_id(job_id: str) -> None:
    if not JOB_ID.fullmatch(job_id or "") or ".." in job_id:
        raise UsageError(f"not a job id: {job_id!r}")


def _xml_unsafe(key: str) -> bool:
    return any(ord(c) < 32 and c not in "\t\n\r" for c in key)


def owner_check(account: str | None) -> dict:
    return {"ExpectedBucketOwner": account} if account else {}


def _arn_account(arn: str) -> str | None:
    """arn:aws:iam::123456789012:user/me -> 123456789012."""
    parts = (arn or "").split(":")
    return parts[4] if len(parts) > 5 and ACCOUNT.fullmatch(parts[4]) else None


def _arn_partition(arn: str) -> str:
    parts = (arn or "").split(":")
    return parts[1] if len(parts) > 5 and parts[1] else "aws"


def sha256_of(path: Path | str) -> tuple[int, str]:
    """(size, sha256 hex) of a local file: what a manifest lists, and what a download is
    checked against."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()
