"""Datasets on the cloud, the user's side: `cloudtrain data push DIR s3://bucket/prefix`.

    parse_s3_url(url)                     (bucket, prefix), or a one-line UsageError
    push(directory, url, ...)             the tree as tar shards and a manifest -> PushReport

The shard format is cloudtrain/host/shards.py; the S3 work is cloudtrain/providers/aws/datasets.py
(boto3 stays there). Credentials and profile are the AWS provider's (config.yaml's
`aws_profile:`, then the AWS chain); AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL points the
client elsewhere (moto in the tests), as for the job store.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from . import config
from .errors import NotFound, UsageError

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


def _s3_client(region: str | None, workers: int = 8):
    """An S3 client with the user's credentials (config.yaml's `aws_profile:`, then the AWS
    chain), its region, and the endpoint it talks to (None: AWS itself)."""
    from .providers.aws import AWSProvider
    from .providers.aws import datasets as s3_datasets

    provider = AWSProvider()
    region = region or provider.region()  # the same chain as every command's
    session = provider.session(region)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return (s3_datasets.client(session, region, endpoint, workers * s3_datasets.PART_THREADS),
            region, endpoint)


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
    from .providers.aws import datasets as s3_datasets
    from .providers.aws.errors import aws_errors

    if region:
        from .preflight import check_known_region

        check_known_region(config.check_region(region, "--region"))
    s3, region, _ = _s3_client(region, workers)
    with aws_errors(region, "s3"):
        return s3_datasets.push(s3, root, bucket, prefix, shard_bytes=shard_mb << 20,
                                workers=workers, progress=progress, region=region)


# -- declared datasets: config.yaml `datasets:`, a recipe's `data:`, `--data NAME=SOURCE` -------

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
        doc = {"name": self.name, "kind": self.kind, "location": self.location}
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
        raise UsageError(f"{where}: {config.shown(name)} is not a dataset name (1 to 64 of "
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
                                 f"got {config.shown(text)}")
        else:
            text = options.pop("source", None)
    else:
        text = value
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{where}: {name}: expected s3://BUCKET/PREFIX, snap-ID or an absolute "
                         f"path, got {config.shown(text)}", hint=DECLARE_HINT)
    if text.startswith("s3://"):
        bucket, prefix = parse_s3_url(text)
        kind, location = "s3", f"s3://{bucket}/{prefix}".rstrip("/")
    elif SNAPSHOT.fullmatch(text):
        kind, location = "snapshot", text
    elif text.startswith("/") and "\0" not in text and "\n" not in text and len(text) < 4096:
        kind, location = "path", os.path.normpath(text)
    else:
        raise UsageError(f"{where}: {name}: {config.shown(text)} is not s3://BUCKET/PREFIX, an "
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
                             f"{', '.join(FIRST_READS)}, got {config.shown(first)}")
        extra = {"throughput": throughput, "iops": iops, "first_read": first}
    return Source(name, kind, location, **extra)


def _whole(value, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UsageError(f"{what} must be a whole number from {low} to {high}, "
                         f"got {config.shown(value)}")
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
    those a job file gave, which messages name instead of the flag (U11)."""
    named = named or {}
    found: dict[str, Source | None] = {}
    for text in values or ():
        raw, eq, source = str(text).partition("=")
        name = raw.strip()
        check_name(name, named.get(raw) or f"--data {config.shown(text)}")
        if name in found:
            raise UsageError(f"{named.get(raw) or f'--data {name}'} is given twice")
        found[name] = parse_source(name, source.strip(), named.get(raw) or "--data") \
            if eq else None
    return found


def needed(recipe_data: list[dict], args: dict) -> list[dict]:
    """The recipe's `data:` entries that a job with these arguments reads (an entry's `when:`
    mapping must match the arguments: imagenet's `{data: imagenet}` is not read with
    `data=synthetic`), unless its `dir_arg` points the recipe at a copy already on the host
    (`--set data_dir=/data/imagenet`)."""
    return [entry for entry in recipe_data
            if all(args.get(k) == v for k, v in (entry.get("when") or {}).items())
            and not (entry.get("dir_arg") and args.get(entry["dir_arg"]))]


def resolve(spec, settings, flags: dict[str, Source | None]) -> list[dict]:
    """The datasets a job stages, as [{name, dir, kind, location, ...}] for its spec: each
    dataset its recipe reads, from `--data`, else config.yaml; a dataset with a public origin
    and no declared source is downloaded by the recipe as before. A dataset with neither is a
    UsageError, before anything is created. Your own command stages what `--data` names."""
    declared = settings.datasets
    out: list[dict] = []
    if spec.recipe:
        from . import recipes

        entries = needed(recipes.load(spec.recipe).data, spec.args)
    else:
        entries = []
    named = {e["name"] for e in entries}
    for name in flags:
        if name not in named:
            if spec.recipe:
                reads = ", ".join(sorted(named)) or "no dataset"
                raise UsageError(f"--data {name}: recipe {spec.recipe} with these arguments reads "
                                 f"{reads}")
            entries.append({"name": name})
    for entry in entries:
        name = entry["name"]
        source = flags.get(name) or declared.get(name)
        if name in flags and flags[name] is None and source is None:
            raise UsageError(f"--data {name}: no source is declared for {name}",
                             hint=DECLARE_HINT.replace("imagenet", name))
        if source is None:
            if entry.get("download"):
                continue  # the recipe fetches it from its public origin, as it always has
            raise UsageError(f"recipe {spec.recipe} reads dataset {name}, which has no source "
                             "and cannot be downloaded on the instance",
                             hint=DECLARE_HINT.replace("imagenet", name))
        if source.kind == "path" and spec.backend == "local" and not os.path.isdir(source.location):
            raise UsageError(f"dataset {name}: {source.location} is not a folder on this machine")
        out.append({**source.to_dict(), "dir": entry.get("dir") or name,
                    "size_mb": entry.get("size_mb")})
    return out


# -- before launch: what each dataset holds, read with the user's credentials ---------------------

STAGING_WORKERS = 32
STAGING_PART_BYTES = 16 << 20
STAGING_ALLOWANCE_S, STAGING_ALLOWANCE_RATE = 600.0, 100e6  # 10 min + the bytes at 100 MB/s
STAGING_FAST_DISK_GB = 10  # copies this large get a faster root volume (staging_disk_mbps)
# Besides its datasets, a root volume holds the AMI (the Deep Learning AMI takes tens of GB),
# the framework's caches, checkpoints, and the stager's shards in flight (about ten).
DISK_MARGIN_GB = 100
IN_FLIGHT_SHARDS = 10


def disk_needed(copied_bytes: float, shard_bytes: int = 0,
                in_flight: int = IN_FLIGHT_SHARDS) -> int:
    """GB of root volume a job copying `copied_bytes` of data onto it needs at least, with
    `in_flight` shards of `shard_bytes` downloaded beside their extracted files."""
    return math.ceil(copied_bytes / 1e9 * 1.05 + DISK_MARGIN_GB
                     + min(in_flight, IN_FLIGHT_SHARDS) * shard_bytes / 1e9)


@dataclass
class Staged:
    """One dataset of a job, read before launch: its source and what it holds."""
    source: dict  # an entry of JobSpec.datasets
    contents: object = None  # providers.aws.datasets.Contents (s3) or None
    region: str = ""  # the bucket's region (s3)
    snapshot_gb: int = 0  # the snapshot's size (snapshot)


def preflight(spec, settings) -> list[Staged]:
    """Read what each of the job's datasets holds, before anything is created: a missing
    prefix, a refused read or a snapshot that does not exist stops the launch here. Records
    the sizes in `spec.staging` (shown by the dry run, `status JOB` and `data ls`), and sizes
    the instance's disk to hold the copies when the user did not. The sizes are those S3
    stores (a manifest's own numbers are only checked against them: F29)."""
    found: list[Staged] = []
    for source in spec.datasets:
        if source["kind"] == "s3":
            found.append(_read_s3(spec, source))
        elif source["kind"] == "snapshot":
            found.append(_read_snapshot(spec, source))
        else:
            found.append(Staged(source))
    spec.staging = {s.source["name"]: _summary(s) for s in found}
    # The copy runs inside the job's clock (the agent's max runtime, the instance's power-off
    # timer, the upload grant): it gets time of its own on top, at a pessimistic rate, as
    # far as the one-week limit leaves room; past it, from the job's own time.
    needed = copy_seconds(spec)
    if needed >= config.WEEK_S:
        raise UsageError(f"the datasets ({copy_bytes(spec) / 1e9:,.0f} GB) take up to "
                         f"{needed / 60:,.0f} min to copy at the {STAGING_ALLOWANCE_RATE / 1e6:g}"
                         f" MB/s the max runtime allows for: past the one-week limit "
                         f"({config.WEEK_S / 60:,.0f} min)",
                         hint="stage less data, or give the job a copy already on the host "
                              "(--data NAME=/path, or an EBS snapshot: --data NAME=snap-...)")
    base = spec.max_runtime_s - spec.staging_allowance_s
    spec.staging_allowance_s = max(0.0, min(needed, config.WEEK_S - base))
    spec.max_runtime_s = base + spec.staging_allowance_s
    copied = sum(s.contents.file_bytes for s in found if s.contents is not None)
    if spec.backend != "local" and copied and not spec.on_job:
        sharded = [s.contents for s in found if s.contents is not None
                   and s.contents.kind == "shards"]
        need = disk_needed(copied, max((c.largest for c in sharded), default=0), max(
            (len(c.manifest.shards) if c.manifest else IN_FLIGHT_SHARDS for c in sharded),
            default=0))
        if need > config.GP3_MAX_GB:
            raise UsageError(f"the datasets take {copied / 1e9:,.0f} GB on disk: with the "
                             f"system and the copies in flight the root volume would be "
                             f"{need:,} GB, past gp3's largest ({config.GP3_MAX_GB:,} GiB)",
                             hint="stage less data, or give it as an EBS snapshot (--data "
                                  "NAME=snap-...), a volume of its own")
        if spec.disk_gb and spec.disk_gb < need:
            raise UsageError(f"--disk-gb {spec.disk_gb}: the datasets take {copied / 1e9:.1f} "
                             f"GB on disk; give at least {need}", hint=f"--disk-gb {need}")
        spec.disk_gb = max(spec.root_gb(settings), need)
        if copied >= STAGING_FAST_DISK_GB * 1e9:  # the copy writes at the volume's speed
            spec.disk_mbps = settings.staging_disk_mbps
    return found


def copy_bytes(spec) -> int:
    """Bytes the staging reads before the job starts: each S3 dataset, and each snapshot
    volume read once (first_read: preread), as preflight recorded them in spec.staging."""
    return sum(int(((spec.staging or {}).get(d["name"]) or {}).get("bytes") or 0)
               for d in spec.datasets if d["kind"] == "s3" or
               (d["kind"] == "snapshot" and d.get("first_read") == "preread"))


def copy_seconds(spec) -> float:
    """The most the copy is expected to take: 10 minutes and the bytes at 100 MB/s."""
    read = copy_bytes(spec)
    return STAGING_ALLOWANCE_S + read / STAGING_ALLOWANCE_RATE if read else 0.0


def _summary(s: Staged) -> dict:
    c = s.contents
    if c is not None:
        return {"kind": c.kind, "files": c.files, "bytes": c.bytes, "file_bytes": c.file_bytes,
                "identity": c.identity, "region": s.region}
    if s.snapshot_gb:
        return {"kind": "snapshot", "bytes": s.snapshot_gb * (1 << 30)}
    return {"kind": s.source["kind"]}


INTER_REGION_USD_PER_GB = 0.02  # S3 to EC2 in another region (us-east-1 list price)


def notes(spec, settings) -> list[str]:
    """What a user should know about the copies before paying for them: a bucket in another
    region (slower, and billed per GB), presigned links that die with a session."""
    out = []
    instance_region = spec.region or settings.region
    for d in spec.datasets:
        info = (spec.staging or {}).get(d["name"]) or {}
        if d["kind"] == "s3" and spec.backend == "aws" and info.get("region") and \
                instance_region and info["region"] != instance_region:
            gb = (info.get("bytes") or 0) / 1e9
            out.append(f"dataset {d['name']}: its bucket is in {info['region']}, the instance "
                       f"in {instance_region}: the copy crosses regions (slower, and about "
                       f"${INTER_REGION_USD_PER_GB * gb:.2f} of transfer for {gb:.1f} GB)")
    if any(d["kind"] == "s3" for d in spec.datasets) and not (
            spec.backend == "aws" and settings.instance_profile) and _session_credentials():
        out.append("the instance reads the datasets through links signed with your temporary "
                   "(session) credentials: they stop working when that session expires; set "
                   "instance_profile in config.yaml (infra/README.md) for long copies")
    return out


def _session_credentials() -> bool:
    """Whether the user's AWS credentials are a temporary session's (SSO, an assumed role)."""
    try:
        from .providers.aws import AWSProvider

        creds = AWSProvider().session(None).get_credentials()
        return bool(creds is not None and creds.get_frozen_credentials().token)
    except Exception:  # no credentials, no profile: nothing to warn of
        return False


def _read_s3(spec, source: dict) -> Staged:
    from .providers.aws import datasets as s3_datasets
    from .providers.aws.errors import aws_errors

    bucket, prefix = parse_s3_url(source["location"])
    region = spec.region if spec.backend == "aws" and spec.region else None
    s3, region, _ = _s3_client(region)
    with aws_errors(region, "s3"):
        where = _bucket_region(s3, bucket) or region
        if where != region:
            s3, _, _ = _s3_client(where)
        contents = s3_datasets.contents(s3, bucket, prefix)
    return Staged(source, contents, where)


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


def _read_snapshot(spec, source: dict) -> Staged:
    if spec.on_job:
        raise UsageError(f"dataset {source['name']}: an EBS snapshot becomes a volume of a new "
                         "instance; --on reuses one", hint="launch without --on")
    if spec.backend != "aws":
        raise UsageError(f"dataset {source['name']}: an EBS snapshot ({source['location']}) "
                         f"becomes a volume on an AWS instance; the {spec.backend} backend "
                         "cannot use it", hint="use --backend aws, or a path: on this machine")
    from .providers import get

    size_gb = get("aws").snapshot_size(spec, source["location"])
    return Staged(source, None, snapshot_gb=size_gb)


def host_plan(found: list[Staged], spec, settings, data_dir: str,
              mounts: dict[str, str] | None = None) -> dict | None:
    """The stager's plan (cloudtrain/host/stager.py) for the copies onto the host, or None when
    the job stages nothing. With an instance profile the instance signs its own requests
    with the role's credentials; otherwise each object gets a presigned link (the user's
    credentials never leave this machine either way)."""
    if not found:
        return None
    role = spec.backend == "aws" and bool(settings.instance_profile)
    entries = []
    for s in found:
        src = s.source
        dest = f"{data_dir}/{src['dir']}"
        entry = {"name": src["name"], "dest": dest}
        if src["kind"] == "path":
            entry.update(kind="path", path=src["location"])
        elif src["kind"] == "snapshot":  # mounted by the provider; read once if asked
            entry.update(kind="path", path=(mounts or {})[src["name"]],
                         preread=src.get("first_read") == "preread")
        else:
            entry.update(_s3_entry(s, role))
        entries.append(entry)
    return {"version": 1, "workers": STAGING_WORKERS, "part_bytes": STAGING_PART_BYTES,
            "progress_s": 5, "imds_url": settings.imds_url, "datasets": entries}


def _s3_entry(s: Staged, role: bool) -> dict:
    from .providers.aws import datasets as s3_datasets

    bucket, prefix = parse_s3_url(s.source["location"])
    s3, _, endpoint = _s3_client(s.region)
    c = s.contents
    entry = {"kind": c.kind, "bucket": bucket, "prefix": prefix, "region": s.region,
             "endpoint": endpoint, "auth": "role" if role else "presigned",
             "identity": c.identity}
    if c.kind == "shards":
        entry["manifest"] = json.loads(c.manifest.to_json())
        if not role:
            entry["shard_urls"] = [s3_datasets.presign(s3, bucket, s3_datasets.shard_key(
                prefix, sh.name)) for sh in c.manifest.shards]
    else:
        entry["objects"] = [dict(o, **({} if role else {"url": s3_datasets.presign(
            s3, bucket, o["key"])})) for o in c.objects]
    return entry


# -- on the host: the plan file run.sh hands the stager, and what it reports back ----------------

PLAN_FILE = "staging.json"  # in the job directory: the stager's plan (host_plan)
STATUS_FILE = "staging-status.json"  # the stager's progress and outcome (agent.STAGING_STATUS)


def _gb(n) -> str:
    return f"{(n or 0) / 1e9:.1f} GB" if (n or 0) >= 1e8 else f"{(n or 0) / 1e6:.1f} MB"


def staging_line(spec) -> str:
    """The timeline's word on what the staging phase copies or mounts."""
    parts = []
    for d in spec.datasets:
        info = (spec.staging or {}).get(d["name"], {})
        if d["kind"] == "path":
            parts.append(f"{d['name']} at {d['location']} (on the host)")
        elif d["kind"] == "snapshot":
            parts.append(f"{d['name']} from {d['location']} ({_gb(info.get('bytes'))} volume)")
        else:
            parts.append(f"{d['name']} from {d['location']} ({_gb(info.get('bytes'))}, "
                         f"{info.get('files', 0):,} files, {info.get('kind', 's3')})")
    nodes = int(getattr(spec, "nodes", 1) or 1)
    if nodes > 1 and any(d["kind"] != "path" for d in spec.datasets):
        copied = sum(int(((spec.staging or {}).get(d["name"]) or {}).get("bytes") or 0)
                     for d in spec.datasets if d["kind"] not in ("path", "snapshot"))
        parts.append(f"on each of {nodes} nodes, at the same time (its own disk"
                     + (f"; {_gb(copied * nodes)} read in all" if copied else "") + ")")
    needed = copy_seconds(spec)
    if spec.staging_allowance_s or needed:  # the copy runs inside the job's clock
        text = f"max runtime +{spec.staging_allowance_s / 60:.0f} min for it"
        if spec.staging_allowance_s < needed and spec.max_runtime_s >= config.WEEK_S:
            text += (f" (the one-week limit: the copy may take up to {needed / 60:.0f} min, the "
                     "rest from the job's own time)")
        parts.append(text)
    return "; ".join(parts)


def progress_line(staging: dict) -> str:
    """A cleaned stager status (hostdata.clean_staging) in one line: bytes, files, MB/s."""
    parts = []
    for d in staging.get("datasets") or []:
        done, total = d.get("bytes_done") or 0, d.get("bytes_total") or 0
        text = f"{d['name']} {d.get('state') or '?'}"
        if total:
            text += f" {_gb(done)} of {_gb(total)} ({100 * done / total:.0f}%)"
        if d.get("files_total"):
            text += f", {d.get('files_done') or 0:,} of {d['files_total']:,} files"
        if d.get("mb_s"):
            text += f", {d['mb_s']:.0f} MB/s"
        parts.append(text)
    if staging.get("error"):
        parts.append(f"error: {staging['error']}")
    return "; ".join(parts) or (staging.get("state") or "starting")


def staged_line(staging: dict) -> str:
    """The timeline's word when the data is complete: how much, how fast."""
    parts = []
    for d in staging.get("datasets") or []:
        if d.get("state") == "skipped":
            parts.append(f"{d['name']} already on the host")
            continue
        secs = d.get("seconds")
        text = f"{d['name']} {_gb(d.get('bytes_done'))}, {d.get('files_done') or 0:,} files"
        if secs:
            text += f" in {secs:.0f} s ({(d.get('bytes_done') or 0) / 1e6 / max(secs, 1e-3):.0f} MB/s)"
        parts.append(text)
    return "data staged: " + ("; ".join(parts) or "nothing to copy")


# -- `cloudtrain data ls` ------------------------------------------------------------------------


def listing(store, settings, check: bool = False) -> list[dict]:
    """The declared datasets (config.yaml), each with its source, its size (as last read at
    a launch, or now with `check`), and the last job that staged it: when, where, how fast."""
    last: dict[str, dict] = {}
    for job in store.jobs():  # newest first
        for d in (job.spec or {}).get("datasets") or []:
            name = d.get("name") if isinstance(d, dict) else None
            if not isinstance(name, str) or name in last:
                continue
            staged = next((ev for ev in store.events(job.id) if ev.phase == "running"
                           and (ev.detail or "").startswith("data staged")), None)
            if staged is None:
                continue
            inst = (job.spec or {}).get("instance_type") or job.backend
            region = (job.spec or {}).get("region") or ""
            last[name] = {"job": job.id, "at": staged.at, "where": f"{inst} {region}".strip(),
                          "detail": staged.detail,
                          "size": ((job.spec or {}).get("staging") or {}).get(name)}
    rows = []
    for name, source in sorted(settings.datasets.items()):
        seen = last.get(name) or {}
        row = {"name": name, "kind": source.kind, "source": source.describe(),
               "size": seen.get("size"), "last_staged": {k: seen[k] for k in
                                                         ("job", "at", "where", "detail")
                                                         if k in seen} or None}
        if check and source.kind == "s3":
            row["size"] = _check_size(source)
        rows.append(row)
    return rows


def _check_size(source: Source) -> dict:
    from .errors import CloudtrainError
    from .providers.aws import datasets as s3_datasets
    from .providers.aws.errors import aws_errors

    bucket, prefix = parse_s3_url(source.location)
    try:
        s3, region, _ = _s3_client(None)
        with aws_errors(region, "s3"):
            c = s3_datasets.contents(s3, bucket, prefix)
    except CloudtrainError as exc:
        return {"error": exc.message}
    return {"kind": c.kind, "files": c.files, "bytes": c.bytes, "file_bytes": c.file_bytes}
