"""Datasets in S3 as tar shards (cloudtrain/host/shards.py): what `cloudtrain data push` does,
and what a launch reads of a job's datasets (S3 prefixes, EBS snapshots) before it starts.

    DatasetsMixin                         AWSProvider's verbs: push_dataset, read_dataset,
                                          dataset_size
    client(session, region, endpoint_url, connections)  an S3 client for many threads
    push(s3, root, bucket, prefix, ...)   the tree's shards, then its manifest -> PushReport
    read_manifest(s3, bucket, prefix)     the dataset's manifest, checked as untrusted

Layout: `<prefix>/shards/shard-00000.tar`, ... and `<prefix>/manifest.json`, written last:
a manifest there means every shard it lists is there. Each shard object carries its sha256
as metadata (`x-amz-meta-sha256`).

Resumable and idempotent: before writing a shard, HEAD its key. Absent: write the shard to a
temporary file and upload it (one read of the source). Present: stream the tar into a hash
only (a shard is deterministic, so no disk is needed to know its sha256) and upload only
when the size or the stored sha256 differ. A second push of the same tree reads it once and
writes nothing; a push cut short goes on where it stopped. The previous manifest is deleted
before the first shard is overwritten, so no reader ever sees a manifest over a mix of old
and new shards; shards of an earlier, longer push beyond the new count are deleted after the
new manifest is written.

`workers` shards are made and uploaded at a time (so at most `workers` temporary shards are
on disk), each with s3transfer's multipart upload (64 MB parts, `PART_THREADS` threads).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from ... import config
from ...datasets import Staged
from ...datasources import parse_s3_url
from ...host import shards
from ...errors import CloudtrainError, NotFound
from . import volumes
from .errors import AWSError, aws_errors, code_of
from .session import AwsSession

MANIFEST = "manifest.json"
PART_BYTES = 64 << 20
PART_THREADS = 4


class _PushStopped(Exception):
    """The push is stopping: an upload under way gives up at its next chunk."""


@dataclass
class PushReport:
    url: str  # s3://bucket/prefix
    shards: int = 0
    uploaded: int = 0  # shards written by this push
    already: int = 0  # shards found stored with the same sha256
    deleted: int = 0  # stale shards of an earlier, longer push
    files: int = 0
    file_bytes: int = 0
    bytes: int = 0  # of all shards
    uploaded_bytes: int = 0
    seconds: float = 0.0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why not pushed)


def client(session, region: str, endpoint_url: str | None, connections: int):
    """An S3 client shared by `connections` threads (botocore keeps 10 connections per client
    by default, and a busier pool drops connections with a warning)."""
    from botocore.config import Config

    style = "path" if endpoint_url else "virtual"  # a local endpoint (moto) has no DNS names
    cfg = Config(signature_version="s3v4", s3={"addressing_style": style},
                 retries={"max_attempts": 6, "mode": "standard"}, connect_timeout=10,
                 read_timeout=120, max_pool_connections=max(10, connections))
    return session.client("s3", region_name=region, endpoint_url=endpoint_url, config=cfg)


def key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def shard_key(prefix: str, name: str) -> str:
    return key(prefix, f"shards/{name}")


def check_bucket(s3, bucket: str, region: str) -> None:
    """HeadBucket, said in words: S3 answers it with a status and no body."""
    from botocore.exceptions import ClientError

    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = code_of(exc)
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise NotFound(f"no S3 bucket named {bucket}",
                           hint=f"create it: aws s3 mb s3://{bucket} --region {region}") from exc
        if code in ("403", "AccessDenied", "Forbidden"):
            raise AWSError(f"not allowed to use the S3 bucket {bucket} (403)",
                           hint="your credentials need s3:ListBucket, s3:GetObject, "
                                "s3:PutObject and s3:DeleteObject on it", code=code) from exc
        raise


def push(s3, root: Path, bucket: str, prefix: str, *, shard_bytes: int, workers: int,
         progress=None, region: str = "") -> PushReport:
    """Upload the tree at `root` as shards under `prefix`, then its manifest."""
    started = time.monotonic()
    prefix = prefix.strip("/")
    report = PushReport(f"s3://{bucket}/{prefix}")
    try:
        files, report.skipped = shards.scan(root)
        plans = shards.cut(files, shard_bytes)
    except ValueError as exc:
        raise CloudtrainError(str(exc)) from None
    if not plans:
        raise CloudtrainError(f"nothing to push: {root} holds no files"
                              + (f" ({len(report.skipped)} left out)" if report.skipped else ""))
    check_bucket(s3, bucket, region)
    entries = _upload_shards(_ShardUploader(s3, root, bucket, prefix), plans, workers, report,
                             progress)
    manifest = shards.Manifest.build(shard_bytes, [entries[i] for i in range(len(plans))],
                                     shards.folders_of(f.path for f in files))
    s3.put_object(Bucket=bucket, Key=key(prefix, MANIFEST), Body=manifest.to_json().encode(),
                  ContentType="application/json")
    report.deleted = _delete_stale(s3, bucket, prefix, len(plans))
    report.shards, report.files = len(plans), manifest.files
    report.bytes, report.file_bytes = manifest.bytes, manifest.file_bytes
    report.seconds = time.monotonic() - started
    return report


def _upload_shards(uploader: "_ShardUploader", plans: list, workers: int, report: PushReport,
                   progress) -> dict[int, shards.ShardEntry]:
    """Every shard through `workers` threads, counted in `report`; the entries by index. A
    failure or Ctrl-C stops the uploads still running at their next chunk."""
    entries: dict[int, shards.ShardEntry] = {}
    with tempfile.TemporaryDirectory(prefix="cloudtrain-push-") as tmp, \
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="push") as pool:
        pending = {pool.submit(uploader.one, p, tmp): p.index for p in plans}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_EXCEPTION)
                for future in done:
                    entry, uploaded = future.result()
                    entries[pending.pop(future)] = entry
                    report.uploaded += uploaded
                    report.already += not uploaded
                    report.uploaded_bytes += entry.bytes if uploaded else 0
                    if progress:
                        progress(len(entries), len(plans), "shards")
        except ValueError as exc:  # a file changed while being pushed
            uploader.stop.set()
            pool.shutdown(cancel_futures=True)
            raise CloudtrainError(str(exc), hint="push again once the tree is still") from None
        except BaseException:
            uploader.stop.set()
            pool.shutdown(cancel_futures=True)
            raise
    return entries


class _ShardUploader:
    """One shard at a time, from any thread: skipped when the bucket holds the same bytes,
    else written to a temporary file and uploaded. The old manifest is deleted before the
    first shard is overwritten (a reader never pairs it with new shards)."""

    def __init__(self, s3, root: Path, bucket: str, prefix: str):
        from boto3.s3.transfer import TransferConfig

        self.s3, self.root, self.bucket, self.prefix = s3, root, bucket, prefix
        self.transfer = TransferConfig(multipart_threshold=PART_BYTES,
                                       multipart_chunksize=PART_BYTES,
                                       max_concurrency=PART_THREADS)
        self.manifest_gone = threading.Lock()
        self.manifest_deleted = False
        self.stop = threading.Event()  # Ctrl-C or a failure: uploads end at their next chunk

    def still_going(self, _sent: int = 0) -> None:
        if self.stop.is_set():
            raise _PushStopped()

    def before_overwrite(self) -> None:
        with self.manifest_gone:
            if not self.manifest_deleted:
                self.s3.delete_object(Bucket=self.bucket, Key=key(self.prefix, MANIFEST))
                self.manifest_deleted = True

    def one(self, plan: shards.ShardPlan, tmp: str) -> tuple[shards.ShardEntry, bool]:
        from boto3.exceptions import S3UploadFailedError

        s3, bucket, root = self.s3, self.bucket, self.root
        target = shard_key(self.prefix, plan.name)
        self.still_going()
        stored = _head(s3, bucket, target)
        if stored is not None:
            entry = shards.write_shard(root, plan)  # hashed only, nothing on disk
            if stored == (entry.bytes, entry.sha256):
                return entry, False
        path = os.path.join(tmp, plan.name)
        try:
            with open(path, "wb") as out:
                entry = shards.write_shard(root, plan, out)
            self.before_overwrite()
            self.still_going()
            # s3transfer aborts the multipart upload when the callback raises: no parts
            # are left billing in the bucket after a Ctrl-C.
            s3.upload_file(path, bucket, target, Config=self.transfer, Callback=self.still_going,
                           ExtraArgs={"Metadata": {"sha256": entry.sha256},
                                      "ContentType": "application/x-tar"})
        except S3UploadFailedError as exc:  # boto3's wrapper around the ClientError
            # "Failed to upload /tmp/.../shard-00000.tar to bucket/key: <S3's answer>"
            said = str(exc).split(f"{bucket}/{target}: ", 1)[-1]
            denied = "(403)" in said or "AccessDenied" in said
            raise AWSError(f"upload of s3://{bucket}/{target} failed: {said}",
                           hint="your credentials need s3:PutObject on the bucket"
                           if denied else None) from None
        finally:
            if os.path.exists(path):
                os.unlink(path)
        return entry, True


def _head(s3, bucket: str, target: str) -> tuple[int, str] | None:
    """(size, metadata sha256) of a stored object, None when there is none."""
    from botocore.exceptions import ClientError

    try:
        head = s3.head_object(Bucket=bucket, Key=target)
    except ClientError as exc:
        if code_of(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    return int(head.get("ContentLength", -1)), head.get("Metadata", {}).get("sha256", "")


def _delete_stale(s3, bucket: str, prefix: str, count: int) -> int:
    """Delete shard objects numbered `count` and above (left by an earlier, longer push);
    other keys under shards/ are not ours to delete."""
    folder = shard_key(prefix, "")
    stale = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
        for obj in page.get("Contents", []):
            name = obj["Key"][len(folder):]
            if shards.SHARD_NAME.fullmatch(name) and int(name[6:11]) >= count:
                stale.append(obj["Key"])
    for start in range(0, len(stale), 1000):
        s3.delete_objects(Bucket=bucket, Delete={
            "Objects": [{"Key": k} for k in stale[start:start + 1000]], "Quiet": True})
    return len(stale)


def read_manifest(s3, bucket: str, prefix: str,
                  max_shards: int = shards.MAX_SHARDS) -> shards.Manifest:
    """The manifest of the dataset at `prefix`, read at most MAX_MANIFEST_BYTES and checked
    field by field; a missing one is a NotFound (a push not finished, or the wrong prefix)."""
    from botocore.exceptions import ClientError

    prefix = prefix.strip("/")
    url = f"s3://{bucket}/{key(prefix, MANIFEST)}"
    try:
        got = s3.get_object(Bucket=bucket, Key=key(prefix, MANIFEST))
    except ClientError as exc:
        if code_of(exc) in ("404", "NoSuchKey", "NoSuchBucket"):
            raise NotFound(f"no dataset at s3://{bucket}/{prefix}: {url} is missing",
                           hint="a push that did not finish, or the wrong prefix: run "
                                "`cloudtrain data push DIR s3://...` (again)") from exc
        raise
    body = got["Body"]
    try:
        if int(got.get("ContentLength", 0)) > shards.MAX_MANIFEST_BYTES:
            raise CloudtrainError(f"{url} is larger than {shards.MAX_MANIFEST_BYTES} bytes: "
                                  "not a manifest of ours")
        text = body.read(shards.MAX_MANIFEST_BYTES + 1)
    finally:
        body.close()
    try:
        return shards.Manifest.from_json(text, max_shards=max_shards)
    except ValueError as exc:
        raise CloudtrainError(f"{url}: {exc}") from None


# -- what an instance stages: read here (the user's credentials), fetched there -----------------

MAX_PLAIN_OBJECTS = 100_000  # a plain prefix is one GET per file; beyond this, push shards
PRESIGN_SECONDS = 12 * 3600  # a presigned staging link: the copy starts within minutes


@dataclass
class Contents:
    """What a dataset prefix holds: shards with a manifest, or plain objects."""
    kind: str  # "shards" or "objects"
    files: int
    bytes: int  # what a staging downloads
    file_bytes: int  # what it takes on disk
    identity: str  # sha256 that changes whenever the contents do
    manifest: shards.Manifest | None = None
    objects: list[dict] = field(default_factory=list)  # {key, path, bytes, md5}
    largest: int = 0  # the largest shard (object) as stored: what one download in flight takes

    def has_folder(self, folder: str) -> bool | None:
        """Whether the dataset holds `folder` (a relative path): its manifest's folder list,
        or the objects' paths; None when the manifest lists no folders."""
        if self.manifest is not None:
            return self.manifest.has_folder(folder)
        below = folder.strip("/") + "/"
        return any(o["path"].startswith(below) for o in self.objects)


def contents(s3, bucket: str, prefix: str) -> Contents:
    """The dataset at s3://bucket/prefix: its manifest if it has one (what `data push`
    writes), else the objects below it (at most MAX_PLAIN_OBJECTS). A NotFound when neither.
    A manifest's shards are checked against what S3 stores (one listing of shards/): the
    sizes a launch plans with (disk, time to copy) are S3's, not the manifest's word."""
    import hashlib
    import json

    try:
        manifest = read_manifest(s3, bucket, prefix)
    except NotFound:
        manifest = None
    if manifest is not None:
        stored = _stored_shards(s3, bucket, prefix, manifest)
        return Contents("shards", manifest.files, sum(stored), manifest.file_bytes,
                        hashlib.sha256(manifest.to_json().encode()).hexdigest(), manifest,
                        largest=max(stored))
    below = key(prefix.strip("/"), "")
    objects: list[dict] = []
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=below)
    for page in pages:
        for item in page.get("Contents", []):
            name = str(item.get("Key", ""))
            rel = name[len(below):]
            if not rel or rel.endswith("/"):
                continue  # the prefix itself, or a "folder" placeholder
            etag = str(item.get("ETag", "")).strip('"')
            md5 = etag if len(etag) == 32 and all(c in "0123456789abcdef" for c in etag) else None
            size = item.get("Size")
            if not isinstance(size, int) or not 0 <= size <= shards.MAX_OBJECT_BYTES:
                raise CloudtrainError(f"s3://{bucket}/{name}: S3 listed a size of {size!r}")
            why = shards.safe_member(rel)
            if why:
                raise CloudtrainError(f"s3://{bucket}/{name}: cannot be staged as a file "
                                      f"({why})")
            objects.append({"key": name, "path": rel, "bytes": size, "md5": md5})
            if len(objects) > MAX_PLAIN_OBJECTS:
                raise CloudtrainError(
                    f"s3://{bucket}/{prefix} holds more than {MAX_PLAIN_OBJECTS:,} objects and "
                    "no manifest: one request per file would be slow",
                    hint=f"stage it as shards: cloudtrain data push DIR s3://{bucket}/{prefix}")
    if not objects:
        raise NotFound(f"no dataset at s3://{bucket}/{prefix}: no manifest.json and no objects "
                       "below it",
                       hint="push one there with `cloudtrain data push DIR s3://...`, or fix "
                            "the dataset's source")
    size = sum(o["bytes"] for o in objects)
    identity = hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()
    return Contents("objects", len(objects), size, size, identity, objects=objects,
                    largest=max(o["bytes"] for o in objects))


def _stored_shards(s3, bucket: str, prefix: str, manifest: shards.Manifest) -> list[int]:
    """The manifest's shards' sizes as S3 lists them, in its order; a CloudtrainError when one
    is missing or not the size the manifest gives it. The manifest is bucket content, and
    whoever can write the bucket can write any numbers in it: a disk, a max runtime
    and a power-off timer sized from them would be whatever they say."""
    folder = shard_key(prefix.strip("/"), "")
    listed: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
        for item in page.get("Contents", []):
            name, size = str(item.get("Key", ""))[len(folder):], item.get("Size")
            if shards.SHARD_NAME.fullmatch(name) and isinstance(size, int):
                listed[name] = size
    url = f"s3://{bucket}/{prefix.strip('/')}"
    where, again = f"dataset {url}", f"push it again: cloudtrain data push DIR {url}"
    missing = [s.name for s in manifest.shards if s.name not in listed]
    if missing:
        raise CloudtrainError(
            f"{where}: {len(missing):,} of the {len(manifest.shards):,} shards its manifest "
            f"lists are not stored (shards/{missing[0]} first)", hint=again)
    wrong = [s for s in manifest.shards if listed[s.name] != s.bytes]
    if wrong:
        s = wrong[0]
        more = f" ({len(wrong):,} shards differ)" if len(wrong) > 1 else ""
        raise CloudtrainError(
            f"{where}: shards/{s.name} is {listed[s.name]:,} bytes, its manifest says "
            f"{s.bytes:,}{more}", hint=again)
    return [listed[s.name] for s in manifest.shards]


def presign(s3, bucket: str, object_key: str, seconds: int = PRESIGN_SECONDS) -> str:
    """A link that lets whoever holds it GET that one object until it expires: how an
    instance without an instance profile reads the dataset, with no credentials on it."""
    return s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": object_key},
                                     ExpiresIn=seconds)


def _dataset_client(aws: AwsSession, region: str | None, workers: int = 8):
    """(S3 client, its region, the endpoint it talks to: None for AWS itself)."""
    region = region or aws.region()  # the same chain as every command's
    session = aws.session(region)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return client(session, region, endpoint, workers * PART_THREADS), region, endpoint


def push_dataset(aws: AwsSession, root: Path, bucket: str, prefix: str, *, shard_mb: int = 256,
                 workers: int = 8, region: str | None = None, progress=None) -> PushReport:
    """`cloudtrain data push` (its arguments checked: datasets.check_push): the tree at
    `root` as shards under s3://bucket/prefix (resumable: run it again after an
    interruption, it uploads only the shards not already stored)."""
    s3, region, _ = _dataset_client(aws, region, workers)
    with aws_errors(region, "s3"):
        return push(s3, root, bucket, prefix, shard_bytes=shard_mb << 20,
                    workers=workers, progress=progress, region=region)


def read_dataset(aws: AwsSession, spec, source: dict) -> Staged:
    """What one of the job's datasets holds, read before launch (datasets.preflight): an
    S3 prefix with the user's credentials, from the bucket's own region; a snapshot's
    size."""
    if source["kind"] == "snapshot":
        return Staged(source, None, snapshot_gb=volumes.snapshot_size(aws, spec, source["location"]))
    bucket, prefix = parse_s3_url(source["location"])
    region = spec.placement.region if spec.backend == "aws" and spec.placement.region else None
    s3, region, endpoint = _dataset_client(aws, region)
    with aws_errors(region, "s3"):
        where = _bucket_region(s3, bucket) or region
        if where != region:
            s3, _, endpoint = _dataset_client(aws, where)
        found = contents(s3, bucket, prefix)
    return Staged(source, found, where, temporary=temporary_credentials(aws),
                  entry=lambda role: _stager_entry(s3, endpoint, bucket, prefix, where,
                                                   found, role))


def dataset_size(aws: AwsSession, location: str) -> dict:
    """`data ls --check`: what the S3 prefix at `location` holds now."""
    bucket, prefix = parse_s3_url(location)
    s3, region, _ = _dataset_client(aws, None)
    with aws_errors(region, "s3"):
        c = contents(s3, bucket, prefix)
    return {"kind": c.kind, "files": c.files, "bytes": c.bytes, "file_bytes": c.file_bytes}


def temporary_credentials(aws: AwsSession) -> bool:
    """Whether the user's AWS credentials are a temporary session's (SSO, an assumed
    role): links signed with them die with the session."""
    try:
        creds = aws.session(None).get_credentials()
        return bool(creds is not None and creds.get_frozen_credentials().token)
    except Exception:  # no credentials, no profile: nothing to warn of
        return False


def _bucket_region(s3, bucket: str) -> str | None:
    """The bucket's region from HeadBucket's x-amz-bucket-region header (S3 sends it on a
    refusal or a redirect too); None when it does not say."""
    from botocore.exceptions import ClientError

    try:
        meta = s3.head_bucket(Bucket=bucket)["ResponseMetadata"]
    except ClientError as exc:
        meta = exc.response.get("ResponseMetadata", {})
        if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchBucket", "NotFound"):
            raise NotFound(f"no S3 bucket named {bucket}",
                           hint="fix the dataset's source (config.yaml `datasets:` or --data)"
                           ) from None
    found = (meta.get("HTTPHeaders") or {}).get("x-amz-bucket-region")
    return found if isinstance(found, str) and config.REGION_PATTERN.fullmatch(found) else None


def _stager_entry(s3, endpoint: str | None, bucket: str, prefix: str, region: str,
                  c: Contents, role: bool) -> dict:
    """The stager's entry for an S3 dataset (cloudtrain/stager.py): with `role` the instance
    signs its own requests with its role's credentials; otherwise each object gets a
    presigned link (the user's credentials never leave this machine either way)."""
    entry: dict = {"kind": c.kind, "bucket": bucket, "prefix": prefix, "region": region,
             "endpoint": endpoint, "auth": "role" if role else "presigned",
             "identity": c.identity}
    if c.kind == "shards":
        assert c.manifest is not None  # shards come with their manifest (contents())
        entry["manifest"] = json.loads(c.manifest.to_json())
        if not role:
            entry["shard_urls"] = [presign(s3, bucket, shard_key(prefix, sh.name))
                                   for sh in c.manifest.shards]
    else:
        entry["objects"] = [dict(o, **({} if role else {"url": presign(s3, bucket, o["key"])}))
                            for o in c.objects]
    return entry
