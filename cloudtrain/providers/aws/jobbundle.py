"""A job's bundle in the job store: what an instance needs to start the job by itself.

    upload(s3, bucket, prefix, parts, meta)   every part, then bundle/manifest.json last
    manifest_bytes(doc)                       the manifest as stored (its sha256 pins it)

Layout (below the job's prefix `jobs/<owner_key>/<job_id>/`, cloudtrain/host/bootstrap.py
reads it on the instance with its role): `bundle/files.tar` (the synced files), `bundle/job/*`
(run.sh, job.json, ...), `bundle/agent/*.py`, `bundle/start.sh`, and `bundle/manifest.json`,
written last, with each object's size and sha256: the sign that the upload is complete. The
manifest of an earlier upload is deleted first, so an instance never pairs an old manifest with
new objects (it would refuse them on their sha256 anyway).

Uploads go through boto3's transfer manager (multipart for a large archive, its retries) with
the caller's credentials; the instance only ever reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...host import bundle_reader
from .jobstore import sha256_of


def manifest(parts: list[tuple[str, Path]], meta: dict) -> dict:
    """The bundle's manifest: `meta` (jobdir, agent_dir, archive's files and bytes, job id)
    and each part's name, size and sha256, in the order given."""
    objects = []
    for name, path in parts:
        size, digest = sha256_of(path)
        objects.append({"name": name, "size": size, "sha256": digest})
    return {"version": bundle_reader.VERSION, **meta, "objects": objects}


def manifest_bytes(doc: dict) -> bytes:
    """The manifest as it is stored (what an instance of the job's group checks against the
    sha256 its user-data names)."""
    return json.dumps(doc, indent=1).encode()


def upload(s3, bucket: str, prefix: str, parts: list[tuple[str, Path]], meta: dict,
           expected_owner: str | None = None) -> dict:
    """Upload each (name, local file) to `<prefix>bundle/<name>`, then the manifest; returns
    the manifest. `expected_owner`: the account the bucket must belong to (S3 refuses
    otherwise), as for every other write to the job store."""
    from boto3.s3.transfer import TransferConfig

    doc = manifest(parts, meta)
    base = prefix + bundle_reader.BUNDLE
    owner = {"ExpectedBucketOwner": expected_owner} if expected_owner else {}
    s3.delete_object(Bucket=bucket, Key=base + bundle_reader.MANIFEST, **owner)
    config = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20)
    for name, path in parts:
        with open(path, "rb") as f:
            s3.upload_fileobj(f, bucket, base + name, ExtraArgs=dict(owner), Config=config)
    body = manifest_bytes(doc)
    if len(body) > bundle_reader.MANIFEST_MAX_BYTES:
        raise ValueError(f"the bundle's manifest is {len(body)} bytes, more than the "
                         f"{bundle_reader.MANIFEST_MAX_BYTES} an instance reads")
    s3.put_object(Bucket=bucket, Key=base + bundle_reader.MANIFEST, Body=body,
                  ContentType="application/json", **owner)
    return doc
