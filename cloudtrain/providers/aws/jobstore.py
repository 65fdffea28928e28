"""The S3 job store: a job's status, log, metrics and checkpoints outlive its instance.

    bucket_name(account, region)          one bucket per account and region
    ensure_bucket(s3, bucket, ...)        create and lock it down on first use; later a HeadBucket
    upload_grant(s3, bucket, job, ...)    a presigned POST for one job's prefix, for the agent
    credential_expiry(session)            when the credentials that sign a grant end
    fetch(s3, bucket, job, dir, limit)    the stored files, validated, into a local directory
    put(s3, bucket, job, name, data)      one object under the job's prefix
    delete_job(s3, bucket, job)           every object under the job's prefix
    latest_checkpoint(s3, bucket, job)    the streamed checkpoint that stream/latest.json names
    restore_plan(s3, bucket, job, m, s)   that checkpoint as presigned GETs, for the new instance

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
snapshot. fetch() leaves it alone, except that when the upload's manifest says the
checkpoints went there (`checkpoints_in_stream`) it brings them from the named slot.

Nothing read from the bucket is trusted: whoever held the grant could have written any key
under the prefix with any content until it expired. Keys are checked as untrusted paths,
sizes against a limit before and while downloading, contents against the manifest's sha256.

boto3 is imported inside functions only: `cloudtrain --help` does not pay for it. Raw boto
dicts stay inside this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CloudtrainError, UsageError
from ...host import checkpoint_manifest
from ...host.agent_upload import CHECKPOINTS, MANIFEST, POST_MAX_BYTES, safe_relpath

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


class StreamError(CloudtrainError):
    """The checkpoint stream's latest.json, or the snapshot it names, does not check out."""

    def __init__(self, reason: str):
        reason = " ".join(str(reason).split())[:500]  # one line, whatever the bucket held
        super().__init__(f"the job store's checkpoint cannot be used: {reason}",
                         hint="the job can start over without it")
        self.reason = reason


@dataclass
class FetchResult:
    complete: bool = False  # the manifest was there and valid: the upload had finished
    files: list[str] = field(default_factory=list)  # relative paths written below local_dir
    bytes: int = 0  # their total size
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (key or path, why not)
    uploaded_at: float | None = None  # from the manifest
    streamed: int | None = None  # checkpoints_in_stream: the seq of the snapshot they came from

    @property
    def found(self) -> bool:
        """Whether anything at all was stored for the job."""
        return bool(self.complete or self.files or self.skipped)


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
    try:
        s3.list_objects_v2(Bucket=bucket, Prefix=PREFIX + _owner_key(owner_key) + "/",
                           MaxKeys=1, **_expected(account))
        return False
    except ClientError as exc:
        if _code(exc) in FORBIDDEN:
            raise _not_ours(bucket, account) from exc
        if _code(exc) not in MISSING:
            raise
    params: dict = {"Bucket": bucket}
    if region != "us-east-1":  # us-east-1 refuses its own name as a LocationConstraint
        params["CreateBucketConfiguration"] = {"LocationConstraint": region}
    created = True
    try:
        s3.create_bucket(**params)
    except ClientError as exc:
        if _code(exc) in FORBIDDEN:
            raise CloudtrainError(
                f"the job store bucket {bucket} does not exist, and creating it is a one-time "
                "administrator's step", hint="see 'The job store' in infra/README.md "
                "(infra/iam-policy-store-admin.json)") from exc
        if _code(exc) == "BucketAlreadyExists":
            raise _not_ours(bucket, account) from exc
        if _code(exc) != "BucketAlreadyOwnedByYou":  # another cloudtrain of ours, just now
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


def fetch(s3, bucket: str, job_id: str, local_dir: Path, limit_bytes: int, *,
          only: tuple[str, ...] | None = None,
          expected_owner: str | None = None, node: int = 0, owner_key: str | None) -> FetchResult:
    """Download what is stored for `job_id` into `local_dir` (at most `limit_bytes` in all).

    With a manifest (the upload finished) only the files it lists are fetched, and each must
    match its size and sha256; without one (the upload was cut short) whatever is there is
    fetched, unverified. Keys under stream/ are not part of it; but when the manifest says
    the checkpoints were streamed instead (`checkpoints_in_stream`), those of the snapshot
    stream/latest.json names are fetched as checkpoints/..., verified the same way
    (`streamed`: its seq). `only`: relative paths, or folders ending in "/", to fetch (e.g.
    ("status.json", "output.log")). Every key is checked as an untrusted path: what could
    land outside `local_dir` is skipped, as is whatever would pass the limit.
    `expected_owner`: the account id; S3 then refuses a bucket some other account owns.
    `node`: node i > 0 of a job on several machines (its own prefix, upload_grant).
    `owner_key`: the prefix's owner (job_prefix; None for a job stored before owners)."""
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError

    prefix = job_prefix(job_id, node, owner_key=owner_key)
    result = FetchResult()
    stored = _list(s3, bucket, prefix, expected_owner, result)
    if not stored:
        return result
    wanted = stored
    keys = {}  # relative path -> its key, where that is not prefix + path (a streamed one)
    if MANIFEST in stored:
        listed, in_stream = _read_manifest(s3, bucket, prefix, stored.pop(MANIFEST),
                                           expected_owner, result)
        if listed is not None:
            wanted = _against_manifest(stored, listed, result)
        if in_stream and (only is None or any(o.startswith(CHECKPOINTS) for o in only)):
            _streamed(s3, bucket, job_id, expected_owner, wanted, keys, result, owner_key)
    local = Path(local_dir)
    local.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(local)
    transfer = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20,
                              max_concurrency=8)
    for rel in sorted(wanted, key=_fetch_order):
        size, digest = wanted[rel]
        if only is not None and not any(rel == o or (o.endswith("/") and rel.startswith(o))
                                        for o in only):
            continue
        target = _inside(root, rel)
        if target is None:
            result.skipped.append((rel, "unsafe path"))
            continue
        if result.bytes + size > limit_bytes:
            result.skipped.append((rel, f"{size} bytes would pass the {limit_bytes}-byte limit"))
            continue
        # Into a file beside the target, which it replaces only once it is verified: a bad
        # object never destroys a good local copy.
        partial = f"{target}.{os.getpid()}.fetching"
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if _inside(root, rel) != target:  # a folder made just now is not a link elsewhere
                raise OSError("path changed")
            s3.download_file(bucket, keys.get(rel, prefix + rel), partial, Config=transfer,
                             ExtraArgs=_expected(expected_owner), Callback=_SizeGuard(size))
            why = _verify(partial, size, digest)
            if why is None:
                os.replace(partial, target)
        except (ClientError, OSError, _TooLarge) as exc:
            why = f"not downloaded: {exc}"
        _remove(partial)
        if why:
            result.skipped.append((rel, why))
            continue
        result.files.append(rel)
        result.bytes += size
    return result


def put(s3, bucket: str, job_id: str, name: str, data: bytes, *,
        expected_owner: str | None = None, owner_key: str | None) -> str:
    """Write one object, `name` under the job's prefix, encrypted SSE-S3; returns its key."""
    key = job_prefix(job_id, owner_key=owner_key) + name
    s3.put_object(Bucket=bucket, Key=key, Body=data, ServerSideEncryption="AES256",
                  **_expected(expected_owner))
    return key


def delete_job(s3, bucket: str, job_id: str, *, expected_owner: str | None = None,
               owner_key: str | None) -> int:
    """Delete every object under the job's prefix; returns how many."""
    keys = [key for key, _ in _keys(s3, bucket, job_prefix(job_id, owner_key=owner_key),
                                    expected_owner)]
    # DeleteObjects is an XML body, and XML 1.0 cannot carry most control characters: such
    # keys go one by one (DeleteObject names the key in the URL).
    plain = [k for k in keys if not _xml_unsafe(k)]
    for start in range(0, len(plain), 1000):
        batch = [{"Key": k} for k in plain[start:start + 1000]]
        s3.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True},
                          **_expected(expected_owner))
    for key in keys:
        if _xml_unsafe(key):
            s3.delete_object(Bucket=bucket, Key=key, **_expected(expected_owner))
    return len(keys)


# -- helpers ---------------------------------------------------------------------------------


class _TooLarge(Exception):
    """An object grew between the listing and the download."""


class _SizeGuard:
    """download_file's progress callback: stops a download that passes the listed size
    (s3transfer cancels the transfer and removes its temporary file)."""

    def __init__(self, size: int):
        self.size, self.seen = size, 0

    def __call__(self, n: int) -> None:
        self.seen += n
        if self.seen > self.size:
            raise _TooLarge(f"more than the {self.size} bytes listed")


def _keys(s3, bucket: str, prefix: str, expected_owner: str | None):
    """(key, size) under `prefix`, every page (botocore asks for url-encoded keys and
    decodes them, so keys with control characters come through intact)."""
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix, **_expected(expected_owner))
    for page in pages:
        for obj in page.get("Contents", []):
            yield obj["Key"], int(obj["Size"])


def _list(s3, bucket, prefix, expected_owner, result: FetchResult) -> dict[str, tuple]:
    """{relative path: (size, None)} of what is stored; an absent bucket is nothing stored."""
    from botocore.exceptions import ClientError

    stored: dict[str, tuple] = {}
    try:
        for key, size in _keys(s3, bucket, prefix, expected_owner):
            rel = key[len(prefix):]
            if rel.startswith(STREAM):
                continue  # the checkpoint stream: latest_checkpoint reads it
            if len(stored) >= MAX_OBJECTS:
                result.skipped.append((prefix, f"more than {MAX_OBJECTS} objects: the rest"))
                break
            stored[rel] = (size, None)
    except ClientError as exc:
        if _code(exc) != "NoSuchBucket":
            raise
    return stored


def _read_manifest(s3, bucket, prefix, entry, expected_owner, result
                   ) -> tuple[dict | None, bool]:
    """({relative path: (size, sha256)} from the manifest, or None (and why in skipped);
    whether it says the checkpoints are in the stream)."""
    size = entry[0]
    if size > MANIFEST_MAX_BYTES:
        result.skipped.append((MANIFEST, f"{size} bytes: too large for a manifest"))
        return None, False
    body = s3.get_object(Bucket=bucket, Key=prefix + MANIFEST,
                         **_expected(expected_owner))["Body"]
    try:
        doc = json.loads(body.read(MANIFEST_MAX_BYTES + 1))
        listed = {}
        for item in doc["files"]:
            path, nbytes, digest = item["path"], item["size"], item["sha256"]
            if not (isinstance(path, str) and isinstance(nbytes, int) and nbytes >= 0
                    and isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
                raise ValueError(f"bad entry {item!r:.200}")
            listed[path] = (nbytes, digest)
        uploaded_at = doc.get("uploaded_at")
        in_stream = doc.get("checkpoints_in_stream") is True
        not_uploaded = [(item["path"], item["reason"]) for item in doc.get("skipped", [])
                        if isinstance(item.get("path"), str) and isinstance(item.get("reason"), str)]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        result.skipped.append((MANIFEST, f"invalid manifest: {exc}"))
        return None, False
    finally:
        body.close()
    result.complete = True
    # What the uploader could not send (too large for a POST, a symlink, ...), in its words.
    result.skipped.extend((path[:300], f"not uploaded: {reason[:200]}")
                          for path, reason in not_uploaded)
    result.uploaded_at = float(uploaded_at) if isinstance(uploaded_at, (int, float)) else None
    return listed, in_stream


def _streamed(s3, bucket, job_id, expected_owner, wanted: dict, keys: dict,
              result: FetchResult, owner_key: str | None) -> None:
    """The checkpoints the agent streamed instead of uploading them with the results: those
    of the snapshot stream/latest.json names, added to `wanted` (verified like the rest)."""
    try:
        manifest = latest_checkpoint(s3, bucket, job_id, expected_owner=expected_owner,
                                     owner_key=owner_key)
    except StreamError as exc:
        result.skipped.append((CHECKPOINTS + "/", f"streamed, but {exc.reason}"))
        return
    if manifest is None:
        return  # the job wrote no checkpoint
    stream = f"{job_prefix(job_id, owner_key=owner_key)}{STREAM}{manifest['slot']}/"
    for item in manifest["files"]:
        if item["path"].startswith(CHECKPOINTS + "/"):
            wanted[item["path"]] = (item["size"], item["sha256"])
            keys[item["path"]] = stream + item["path"]
    result.streamed = manifest["seq"]


def latest_checkpoint(s3, bucket: str, job_id: str, expected_owner: str | None = None, *,
                      owner_key: str | None) -> dict | None:
    """The checkpoint stream's manifest (stream/latest.json), checked field by field and
    against the objects of the slot it names (one listing): every file there, at its size.
    None when there is no latest.json; StreamError when it or its snapshot does not check
    out. Contents are checked (sha256) by whoever downloads them."""
    from botocore.exceptions import ClientError

    stream = job_prefix(job_id, owner_key=owner_key) + STREAM
    try:
        obj = s3.get_object(Bucket=bucket, Key=stream + checkpoint_manifest.LATEST,
                            **_expected(expected_owner))
    except ClientError as exc:
        if _code(exc) in ("NoSuchKey", "NoSuchBucket", "404", "NotFound"):
            return None
        raise
    body = obj["Body"]
    try:
        if int(obj.get("ContentLength") or 0) > LATEST_MAX_BYTES:
            raise StreamError(f"latest.json is {obj['ContentLength']} bytes, more than "
                              f"{LATEST_MAX_BYTES}")
        data = body.read(LATEST_MAX_BYTES + 1)
    finally:
        body.close()
    manifest = parse_manifest(data, job_id)
    slot = f"{stream}{manifest['slot']}/"
    stored: dict[str, int] = {}
    for key, size in _keys(s3, bucket, slot, expected_owner):
        if len(stored) >= MAX_OBJECTS:
            break
        stored[key[len(slot):]] = size
    for item in manifest["files"]:
        if item["path"] not in stored:
            raise StreamError(f"checkpoint {manifest['seq']}: {item['path']!r} is not stored "
                              f"in slot {manifest['slot']}")
        if stored[item["path"]] != item["size"]:
            raise StreamError(f"checkpoint {manifest['seq']}: {item['path']!r} is stored with "
                              f"{stored[item['path']]} bytes, not {item['size']}")
    return manifest


MANIFEST_KEYS = ("version", "job_id", "seq", "slot", "files", "step", "epoch", "step_source",
                 "taken_at", "uploaded_at", "upload_seconds", "bytes", "attempt", "final")


def parse_manifest(data: bytes, job_id: str) -> dict:
    """stream/latest.json's bytes as a manifest dict (its known keys only), or StreamError."""
    if len(data) > LATEST_MAX_BYTES:
        raise StreamError(f"latest.json is more than {LATEST_MAX_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise StreamError(f"latest.json is not JSON: {exc}") from None
    why = checkpoint_manifest.check_manifest(doc)
    if why is not None:
        raise StreamError(f"latest.json: {why}")
    if doc["job_id"] != job_id:
        raise StreamError(f"latest.json is job {doc['job_id']!r}'s, not {job_id}'s")
    manifest = {k: doc.get(k) for k in MANIFEST_KEYS}
    manifest["files"] = [{"path": f["path"], "size": f["size"], "sha256": f["sha256"]}
                         for f in doc["files"]]
    return manifest


def restore_plan(s3, bucket: str, job_id: str, manifest: dict, expires_s: float,
                 timeout_s: float = checkpoint_manifest.RESTORE_TIMEOUT_S, *,
                 owner_key: str | None) -> dict:
    """`manifest` (from latest_checkpoint) as the plan checkpoint_restore.restore takes on the
    new instance: each file with "url", a presigned GET of its object (valid `expires_s`,
    at most 7 days: SigV4's limit), and "timeout_s" for the whole restore. The instance needs
    no AWS credentials. A URL signed with temporary credentials dies with them."""
    prefix = job_prefix(job_id, owner_key=owner_key)
    why = checkpoint_manifest.check_manifest(manifest)
    if why is not None:
        raise StreamError(why)
    expires = int(max(1, min(float(expires_s), GRANT_MAX_S)))
    slot = f"{prefix}{STREAM}{manifest['slot']}/"
    plan = dict(manifest)
    plan["files"] = [dict(item, url=s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": slot + item["path"]},
        ExpiresIn=expires)) for item in manifest["files"]]
    plan["timeout_s"] = float(timeout_s)
    return plan


def _against_manifest(stored: dict, listed: dict, result: FetchResult) -> dict:
    """What to fetch when there is a manifest: its files, where the stored size agrees."""
    wanted = {}
    for rel, (size, digest) in listed.items():
        if rel not in stored:
            result.skipped.append((rel, "in the manifest but not stored"))
        elif stored[rel][0] != size:
            result.skipped.append((rel, f"stored size {stored[rel][0]} is not the manifest's "
                                        f"{size}"))
        else:
            wanted[rel] = (size, digest)
    for rel in stored.keys() - listed.keys():
        result.skipped.append((rel, "not in the manifest"))
    return wanted


def _fetch_order(rel: str) -> tuple:
    """The job's own small files first, then checkpoints: with a tight limit, the status
    and the log come home before a checkpoint."""
    return (rel.startswith("checkpoints/"), rel)


def _inside(root: str, rel: str) -> str | None:
    """The local path for `rel` below `root` (already resolved), or None when `rel` is not
    a safe relative path or would resolve outside `root` (through a link already there)."""
    if safe_relpath(rel) is None:
        return None
    target = os.path.join(root, *rel.split("/"))
    resolved = os.path.realpath(target)
    if resolved != target or not resolved.startswith(root.rstrip(os.sep) + os.sep):
        return None
    return target


def _verify(path: str, size: int, digest: str | None) -> str | None:
    """Why the downloaded file is not what was listed, or None."""
    actual = os.path.getsize(path)
    if actual != size:
        return f"{actual} bytes downloaded, {size} listed"
    if digest is None:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return None if h.hexdigest() == digest else "sha256 differs from the manifest"


def _remove(path: str) -> None:
    if os.path.isfile(path) and not os.path.islink(path):
        os.remove(path)


def _owner_key(owner_key: str) -> str:
    if not (isinstance(owner_key, str) and OWNER_KEY.fullmatch(owner_key)):
        raise UsageError(f"not an AWS user id (aws:userid): {str(owner_key)[:100]!r}")
    return owner_key


def _check_job_id(job_id: str) -> None:
    if not JOB_ID.fullmatch(job_id or "") or ".." in job_id:
        raise UsageError(f"not a job id: {job_id!r}")


def _xml_unsafe(key: str) -> bool:
    return any(ord(c) < 32 and c not in "\t\n\r" for c in key)


def _expected(account: str | None) -> dict:
    return {"ExpectedBucketOwner": account} if account else {}


def _arn_account(arn: str) -> str | None:
    """arn:aws:iam::123456789012:user/me -> 123456789012."""
    parts = (arn or "").split(":")
    return parts[4] if len(parts) > 5 and ACCOUNT.fullmatch(parts[4]) else None


def _arn_partition(arn: str) -> str:
    parts = (arn or "").split(":")
    return parts[1] if len(parts) > 5 and parts[1] else "aws"


def _code(exc) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
