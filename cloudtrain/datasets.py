"""Datasets on the cloud, the user's side: `cloudtrain data push DIR s3://bucket/prefix`.

    parse_s3_url(url)                     (bucket, prefix), or a one-line UsageError
    push(directory, url, ...)             the tree as tar shards and a manifest -> PushReport

The shard format is cloudtrain/shards.py; the S3 work is cloudtrain/providers/aws/datasets.py
(boto3 stays there). Credentials and profile are the AWS provider's (config.yaml's
`aws_profile:`, then the AWS chain); AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL points the
client elsewhere (moto in the tests), as for the job store.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from . import config
from .errors import UsageError

MAX_SHARD_MB = 100_000  # 10,000 parts of 64 MB make 640 GB: far below S3's part limit
MAX_WORKERS = 64
# S3's rules for new bucket names: 3-63 of a-z 0-9 . -, a letter or digit at each end.
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
IP_LIKE = re.compile(r"\d+\.\d+\.\d+\.\d+")
PREFIX_PART = re.compile(r"[A-Za-z0-9!_.*'()=+,;:@ -]+")
URL_HINT = "cloudtrain data push /data/imagenet s3://my-bucket/imagenet"


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix"); a trailing "/" is dropped."""
    shown = config.shown(url)
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise UsageError(f"{shown} is not an s3://BUCKET/PREFIX address", hint=URL_HINT)
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not BUCKET.fullmatch(bucket) or ".." in bucket or IP_LIKE.fullmatch(bucket):
        raise UsageError(f"{config.shown(bucket)} is not an S3 bucket name (3 to 63 of a-z, "
                         "0-9, '.' and '-', a letter or digit at each end)", hint=URL_HINT)
    prefix = prefix.rstrip("/")
    if prefix:
        parts = prefix.split("/")
        if any(p in (".", "..") or not PREFIX_PART.fullmatch(p) for p in parts) \
                or len(prefix) > 512:
            raise UsageError(f"{config.shown(prefix)} is not a prefix cloudtrain writes under: "
                             "no empty, '.' or '..' parts, at most 512 characters of letters, "
                             "digits and !_.*'()=+,;:@- or space", hint=URL_HINT)
    return bucket, prefix


def push(directory, url: str, *, shard_mb: int = 256, workers: int = 8,
         region: str | None = None, progress=None):
    """Push the tree at `directory` to `url` (resumable: run it again after an interruption,
    it uploads only the shards not already stored). Returns a PushReport."""
    bucket, prefix = parse_s3_url(url)
    if not isinstance(shard_mb, int) or not 1 <= shard_mb <= MAX_SHARD_MB:
        raise UsageError(f"--shard-mb must be from 1 to {MAX_SHARD_MB}, not {shard_mb}")
    if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise UsageError(f"--workers must be from 1 to {MAX_WORKERS}, not {workers}")
    root = Path(directory)
    if not root.is_dir():
        raise UsageError(f"{str(directory)!r} is not a folder")
    from .providers.aws import AWSProvider
    from .providers.aws import datasets as s3_datasets
    from .providers.aws.errors import aws_errors

    provider = AWSProvider()
    if region:
        config.check_region(region, "--region")
    session = provider.session(region)
    region = region or provider.settings.region or session.region_name or "us-east-1"
    config.check_region(region, "AWS_REGION, AWS_DEFAULT_REGION or the AWS profile")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    with aws_errors(region, "s3"):
        s3 = s3_datasets.client(session, region, endpoint,
                                workers * s3_datasets.PART_THREADS)
        return s3_datasets.push(s3, root, bucket, prefix, shard_bytes=shard_mb << 20,
                                workers=workers, progress=progress, region=region)
