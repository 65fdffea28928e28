"""Where a dataset comes from, as written: config.yaml's `datasets:` (NAME: SOURCE), a
recipe's `data:` names, `--data NAME=SOURCE`. Parsing only, nothing is read; config.py parses
`datasets:` with it, so it sits below config and imports nothing of cloudtrain but errors.

    parse_s3_url(url)                     (bucket, prefix), or a one-line UsageError
    parse_source(name, value, where)      one SOURCE -> Source
    parse_declarations(value, where)      config.yaml's `datasets:` -> {name: Source}
    parse_data_flags(values, named)       `--data NAME[=SOURCE]` -> {name: Source or None}
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .errors import UsageError, shown

# S3's rules for new bucket names: 3-63 of a-z 0-9 . -, a letter or digit at each end.
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
IP_LIKE = re.compile(r"\d+\.\d+\.\d+\.\d+")
PREFIX_PART = re.compile(r"[A-Za-z0-9!_.*'()=+,;:@ -]+")
URL_HINT = "cloudtrain data push /data/imagenet s3://my-bucket/imagenet"


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` -> ("bucket", "some/prefix"); a trailing "/" is dropped."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise UsageError(f"{shown(url)} is not an s3://BUCKET/PREFIX address", hint=URL_HINT)
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not BUCKET.fullmatch(bucket) or ".." in bucket or IP_LIKE.fullmatch(bucket):
        raise UsageError(f"{shown(bucket)} is not an S3 bucket name (3 to 63 of a-z, "
                         "0-9, '.' and '-', a letter or digit at each end)", hint=URL_HINT)
    prefix = prefix.rstrip("/")
    if prefix:
        parts = prefix.split("/")
        if any(p in (".", "..") or not PREFIX_PART.fullmatch(p) for p in parts) \
                or len(prefix) > 512:
            raise UsageError(f"{shown(prefix)} is not a prefix cloudtrain writes under: "
                             "no empty, '.' or '..' parts, at most 512 characters of letters, "
                             "digits and !_.*'()=+,;:@- or space", hint=URL_HINT)
    return bucket, prefix


NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
SNAPSHOT = re.compile(r"snap-[0-9a-f]{8}([0-9a-f]{9})?")
KINDS = ("s3", "snapshot", "path")
FIRST_READS = ("preread", "fsr", "none")
# gp3: 3,000 IOPS and 125 MB/s come with the volume; up to 16,000 IOPS and 1,000 MB/s are
# bought (the throughput at most IOPS / 4).
GP3_BASE_MBPS, GP3_MAX_MBPS, GP3_BASE_IOPS, GP3_MAX_IOPS = 125, 1000, 3000, 16000
OPTIONS = {"s3": {"source"}, "path": {"path"},
           "snapshot": {"source", "throughput", "iops", "first_read"}}
DECLARE_HINT = ("declare it once in config.yaml, e.g.\n  datasets:\n    imagenet: "
                "s3://my-bucket/imagenet\nor pass --data imagenet=s3://my-bucket/imagenet "
                "(push a prepared tree there with `cloudtrain data push DIR s3://...`)")


@dataclass(frozen=True)
class Source:
    """Where a dataset comes from: an S3 prefix (staged onto the instance's disk), an EBS
    snapshot (a volume made from it, mounted read-only), or a path already on the host."""
    name: str
    kind: str  # one of KINDS
    location: str  # s3://bucket/prefix, snap-..., or /abs/path
    throughput: int = GP3_BASE_MBPS  # snapshot: the volume's MB/s
    iops: int = GP3_BASE_IOPS  # snapshot: the volume's IOPS
    first_read: str = "preread"  # snapshot: how the fresh volume's first-read penalty is paid

    def to_dict(self) -> dict:
        doc: dict[str, object] = {"name": self.name, "kind": self.kind,
                                  "location": self.location}
        if self.kind == "snapshot":
            doc.update(throughput=self.throughput, iops=self.iops, first_read=self.first_read)
        return doc

    @classmethod
    def from_dict(cls, doc: dict) -> "Source":
        return cls(**{k: doc[k] for k in ("name", "kind", "location", "throughput", "iops",
                                          "first_read") if k in doc})

    def describe(self) -> str:
        if self.kind == "snapshot":
            return (f"{self.location} (gp3 {self.throughput} MB/s, {self.iops} IOPS, first "
                    f"read: {self.first_read})")
        return self.location


def check_name(name, where: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise UsageError(f"{where}: {shown(name)} is not a dataset name (1 to 64 of "
                         "a-z, 0-9, '_', '.', '-', starting with a letter or digit)")
    return name


def parse_source(name: str, value, where: str) -> Source:
    """A SOURCE as written in config.yaml or after `--data NAME=`: `s3://bucket/prefix`,
    `snap-0123...`, an absolute path, or a mapping `{source: ..., <options>}` /
    `{path: /abs/path}`. A one-line UsageError naming `where` otherwise."""
    check_name(name, where)
    options: dict = {}
    if isinstance(value, dict):
        options = dict(value)
        if "path" in options and "source" not in options:
            text = options.pop("path")
            if not isinstance(text, str) or not text.startswith("/"):
                raise UsageError(f"{where}: {name}: path must be an absolute path on the host, "
                                 f"got {shown(text)}")
        else:
            text = options.pop("source", None)
    else:
        text = value
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{where}: {name}: expected s3://BUCKET/PREFIX, snap-ID or an absolute "
                         f"path, got {shown(text)}", hint=DECLARE_HINT)
    if text.startswith("s3://"):
        bucket, prefix = parse_s3_url(text)
        kind, location = "s3", f"s3://{bucket}/{prefix}".rstrip("/")
    elif SNAPSHOT.fullmatch(text):
        kind, location = "snapshot", text
    elif text.startswith("/") and "\0" not in text and "\n" not in text and len(text) < 4096:
        kind, location = "path", os.path.normpath(text)
    else:
        raise UsageError(f"{where}: {name}: {shown(text)} is not s3://BUCKET/PREFIX, an "
                         "EBS snapshot id (snap-...) or an absolute path", hint=DECLARE_HINT)
    unknown = set(options) - (OPTIONS[kind] - {"source", "path"})
    if unknown:
        raise UsageError(f"{where}: {name}: unknown option(s) {', '.join(sorted(map(str, unknown)))}"
                         f" for a{'n' if kind == 's3' else ''} {kind} source")
    extra = {}
    if kind == "snapshot":
        throughput = _whole(options.get("throughput", GP3_BASE_MBPS), f"{where}: {name}: "
                            "throughput (MB/s)", GP3_BASE_MBPS, GP3_MAX_MBPS)
        iops = _whole(options.get("iops", max(GP3_BASE_IOPS, throughput * 4)),
                      f"{where}: {name}: iops", GP3_BASE_IOPS, GP3_MAX_IOPS)
        if throughput * 4 > iops:  # gp3: at most 0.25 MB/s per provisioned IOPS
            raise UsageError(f"{where}: {name}: gp3 allows at most iops / 4 MB/s: "
                             f"{throughput} MB/s needs at least {throughput * 4} iops")
        first = options.get("first_read", "preread")
        if first not in FIRST_READS:
            raise UsageError(f"{where}: {name}: first_read must be one of "
                             f"{', '.join(FIRST_READS)}, got {shown(first)}")
        extra = {"throughput": throughput, "iops": iops, "first_read": first}
    return Source(name, kind, location, **extra)


def _whole(value, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{what} must be a whole number from {low} to {high}, "
                         f"got {shown(value)}")
    return value


def parse_declarations(value, where: str) -> dict[str, Source]:
    """config.yaml's `datasets:` mapping of NAME: SOURCE."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{where}: `datasets:` must be a mapping of NAME: SOURCE",
                         hint=DECLARE_HINT)
    return {name: parse_source(name, source, f"{where}: datasets")
            for name, source in value.items()}


def parse_data_flags(values, named: dict | None = None) -> dict[str, Source | None]:
    """`--data NAME=SOURCE` (this job reads NAME from SOURCE) or `--data NAME` (the declared
    source of NAME): {name: Source or None}. `named`: {NAME: "job.yaml:6: datasets.NAME"} for
    those a job file gave, which messages name instead of the flag."""
    named = named or {}
    found: dict[str, Source | None] = {}
    for text in values or ():
        raw, eq, source = str(text).partition("=")
        name = raw.strip()
        check_name(name, named.get(raw) or f"--data {shown(text)}")
        if name in found:
            raise UsageError(f"{named.get(raw) or f'--data {name}'} is given twice")
        found[name] = parse_source(name, source.strip(), named.get(raw) or "--data") \
            if eq else None
    return found

