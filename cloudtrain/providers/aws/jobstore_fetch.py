"""Reading the S3 job store back (jobstore.py writes it and holds its layout):

    fetch(s3, bucket, job, dir, limit)    the stored files, validated, into a local directory
    latest_checkpoint(s3, bucket, job)    the streamed checkpoint that stream/latest.json names
    parse_manifest(data, job)             a checkpoint manifest, checked
    restore_plan(s3, bucket, job, m, s)   that checkpoint as presigned GETs, for the new instance

Nothing read from the bucket is trusted: whoever held the grant could have written any key
under the prefix with any content until it expired. Keys are checked as untrusted paths,
sizes against a limit before and while downloading, contents against the manifest's sha256.
boto3 is imported inside functions only.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CloudtrainError
from ...host import checkpoint_manifest
from ...host.agent_upload import CHECKPOINTS, MANIFEST, safe_relpath
from .errors import code_of
from .jobstore import (
    GRANT_MAX_S, LATEST_MAX_BYTES, MANIFEST_MAX_BYTES, MAX_OBJECTS, STREAM,
    job_prefix, list_keys, owner_check, sha256_of)


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
    # relative path -> its key, where that is not prefix + path (a streamed one)
    keys: dict[str, str] = {}
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
                             ExtraArgs=owner_check(expected_owner), Callback=_SizeGuard(size))
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


def _list(s3, bucket, prefix, expected_owner, result: FetchResult) -> dict[str, tuple]:
    """{relative path: (size, None)} of what is stored; an absent bucket is nothing stored."""
    from botocore.exceptions import ClientError

    stored: dict[str, tuple] = {}
    try:
        for key, size in list_keys(s3, bucket, prefix, expected_owner):
            rel = key[len(prefix):]
            if rel.startswith(STREAM):
                continue  # the checkpoint stream: latest_checkpoint reads it
            if len(stored) >= MAX_OBJECTS:
                result.skipped.append((prefix, f"more than {MAX_OBJECTS} objects: the rest"))
                break
            stored[rel] = (size, None)
    except ClientError as exc:
        if code_of(exc) != "NoSuchBucket":
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
                         **owner_check(expected_owner))["Body"]
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
                            **owner_check(expected_owner))
    except ClientError as exc:
        if code_of(exc) in ("NoSuchKey", "NoSuchBucket", "404", "NotFound"):
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
    for key, size in list_keys(s3, bucket, slot, expected_owner):
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
    return None if sha256_of(path)[1] == digest else "sha256 differs from the manifest"


def _remove(path: str) -> None:
    if os.path.isfile(path) and not os.path.islink(path):
        os.remove(path)
