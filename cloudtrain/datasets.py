"""Datasets, the orchestrator's side: which datasets a job stages, what they hold before
launch, the stager's plan, and the lines that say so.

    check_push(directory, url, ...)       `data push`'s arguments -> (folder, bucket, prefix)
    resolve(spec, settings, flags, data)  the datasets a job stages, for its spec
    preflight(spec, settings, provider)   what each holds, read before anything is created
                                          (and whether it has the folders the job reads)
    host_plan(found, spec, ...)           the stager's plan for the host
    notes(spec, settings, found)          what to know before paying for the copies
    listing(store, settings, account)     `data ls`

The shard format is cloudtrain/host/shards.py. How a SOURCE is written and parsed is
datasources.py. Nothing here talks to a cloud: what a source holds is read by the provider
given in (its read_dataset: the AWS provider reads S3 and EBS snapshots with the user's
credentials, in its datasets module).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from . import config
from .errors import CloudtrainError, UsageError

if TYPE_CHECKING:  # parsed only on the paths that read sources (status does not)
    from .datasources import Source
    from .host.shards import Manifest

MAX_SHARD_MB = 100_000  # 10,000 parts of 64 MB make 640 GB: far below S3's part limit
MAX_WORKERS = 64


def check_push(directory, url: str, shard_mb: int, workers: int,
               region: str | None = None) -> tuple[Path, str, str]:
    """`data push`'s arguments, checked before any settings or credentials are looked at:
    (the folder, bucket, prefix), or a one-line UsageError."""
    from .datasources import parse_s3_url

    bucket, prefix = parse_s3_url(url)
    if not isinstance(shard_mb, int) or not 1 <= shard_mb <= MAX_SHARD_MB:
        raise UsageError(f"--shard-mb must be from 1 to {MAX_SHARD_MB}, not {shard_mb}")
    if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise UsageError(f"--workers must be from 1 to {MAX_WORKERS}, not {workers}")
    root = Path(directory)
    if not root.is_dir():
        raise UsageError(f"{str(directory)!r} is not a folder")
    if region:
        config.check_known_region(config.check_region(region, "--region"))
    return root, bucket, prefix


def needed(recipe_data: list[dict], args: dict) -> list[dict]:
    """The recipe's `data:` entries that a job with these arguments reads (an entry's `when:`
    mapping must match the arguments: imagenet's `{data: imagenet}` is not read with
    `data=synthetic`), unless its `dir_arg` points the recipe at a copy already on the host
    (`--set data_dir=/data/imagenet`)."""
    return [entry for entry in recipe_data
            if all(args.get(k) == v for k, v in (entry.get("when") or {}).items())
            and not (entry.get("dir_arg") and args.get(entry["dir_arg"]))]


def resolve(spec, settings, flags: dict[str, Source | None],
            recipe_data: list[dict]) -> list[dict]:
    """The datasets a job stages, as [{name, dir, kind, location, ...}] for its spec: each
    dataset its recipe reads (`recipe_data`: the recipe's `data:` entries), from `--data`, else
    config.yaml; a dataset with a public origin and no declared source is downloaded by the
    recipe as before. A dataset with neither is a UsageError, before anything is created. Your
    own command stages what `--data` names."""
    from .datasources import DECLARE_HINT

    declared = settings.datasets
    out: list[dict] = []
    entries = needed(recipe_data, spec.args) if spec.recipe else []
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
        read = _reads(entry, spec)
        if read:
            out[-1]["reads"] = read
    return out


def _reads(entry: dict, spec) -> dict | None:
    """What of the dataset the job reads (the recipe's `reads:` for its arguments), for
    preflight to check before anything is created: {folders, within, by, prepare}."""
    reads = entry.get("reads")
    if not reads:
        return None
    by = reads["by"]
    folders = reads["folders"].get(str(spec.args.get(by)))
    if folders is None:
        return None
    return {"folders": list(folders), "within": list(reads.get("within") or [""]),
            "by": f"{by}={spec.args.get(by)}", "prepare": reads.get("prepare") or ""}


# -- before launch: what each dataset holds, read with the user's credentials ---------------------

STAGING_WORKERS = 32
STAGING_PART_BYTES = 16 << 20
STAGING_ALLOWANCE_S, STAGING_ALLOWANCE_RATE = 600.0, 100e6  # 10 min + the bytes at 100 MB/s
STAGING_FAST_DISK_GB = 10  # copies this large get a faster root volume (staging_disk_mbps)
# Besides its datasets, a root volume holds the AMI (the Deep Learning AMI takes tens of GB),
# the framework's caches, checkpoints, and the stager's shards in flight (about ten).
DISK_MARGIN_GB = 100
IN_FLIGHT_SHARDS = 10


def copy_room(copied_bytes: float, shard_bytes: int = 0,
              in_flight: int = IN_FLIGHT_SHARDS) -> float:
    """GB a copy of `copied_bytes` of files takes on the disk it lands on: 5 % more for the
    file system, and `in_flight` shards of `shard_bytes` downloaded beside their extracted
    files."""
    return copied_bytes / 1e9 * 1.05 + min(in_flight, IN_FLIGHT_SHARDS) * shard_bytes / 1e9


def disk_needed(copied_bytes: float, shard_bytes: int = 0,
                in_flight: int = IN_FLIGHT_SHARDS) -> int:
    """GB of root volume a job copying `copied_bytes` of data onto it needs at least: the
    copy's room, and the system's (DISK_MARGIN_GB)."""
    return math.ceil(copy_room(copied_bytes, shard_bytes, in_flight) + DISK_MARGIN_GB)


class Contents(Protocol):
    """What an S3 dataset prefix holds, as the provider found it."""
    kind: str  # "shards" or "objects"
    files: int
    bytes: int  # what a staging downloads
    file_bytes: int  # what it takes on disk
    identity: str  # changes whenever the contents do
    manifest: Manifest | None
    largest: int  # the largest shard (object) as stored

    def has_folder(self, folder: str) -> bool | None: ...


@dataclass
class Staged:
    """One dataset of a job, read before launch: its source and what it holds."""
    source: dict  # an entry of JobSpec.datasets
    # s3: what the prefix holds, as the provider found it (kind "shards" or "objects", files,
    # bytes, file_bytes, identity, largest, manifest, objects); None otherwise
    contents: Contents | None = None
    region: str = ""  # the bucket's region (s3)
    snapshot_gb: int = 0  # the snapshot's size (snapshot)
    temporary: bool = False  # s3: read with temporary (session) credentials
    # s3: the stager's entry for it, made by the provider (presigned links, or none when the
    # instance signs with its role: the argument)
    entry: Callable[[bool], dict] | None = None


def preflight(spec, settings, provider) -> tuple:
    """Read what each of the job's datasets holds, before anything is created: a missing
    prefix, a refused read or a snapshot that does not exist stops the launch here. `provider`:
    the job's (its read_dataset). Returns the spec with the sizes in `staging` (shown by the
    dry run, `status JOB` and `data ls`), and the instance's disk sized to hold the copies
    when the user did not; and what was read (Staged, one a dataset). The sizes are those S3
    stores (a manifest's own numbers are only checked against them)."""
    found: list[Staged] = []
    for source in spec.data.datasets:
        if source["kind"] == "snapshot" and spec.on_job:
            raise UsageError(f"dataset {source['name']}: an EBS snapshot becomes a volume of a "
                             "new instance; --on reuses one", hint="launch without --on")
        found.append(Staged(source) if source["kind"] == "path" else
                     provider.read_dataset(spec, source))
        check_folders(found[-1], spec)
    spec = spec.changed(staging={s.source["name"]: _summary(s) for s in found})
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
    base = spec.max_runtime_s - spec.data.staging_allowance_s
    allowance = max(0.0, min(needed, config.WEEK_S - base))
    spec = spec.changed(staging_allowance_s=allowance, max_runtime_s=base + allowance)
    copied = sum(s.contents.file_bytes for s in found if s.contents is not None)
    if spec.backend != "local" and copied and not spec.on_job:
        sharded = [s.contents for s in found if s.contents is not None
                   and s.contents.kind == "shards"]
        in_flight = (max((c.largest for c in sharded), default=0), max(
            (len(c.manifest.shards) if c.manifest else IN_FLIGHT_SHARDS for c in sharded),
            default=0))
        fast = copied >= STAGING_FAST_DISK_GB * 1e9  # the copy writes at the volume's speed
        disks = provider.staging_disk(spec, settings.staging_disk_mbps if fast else 0)
        local = _local_disk(spec, disks["local"], copy_room(copied, *in_flight))
        spec = spec.changed(local_disk=local)
        if local is not None and local["used"]:  # the root volume stays as the job asked
            return spec, found
        need = disk_needed(copied, *in_flight)
        if need > config.GP3_MAX_GB:
            raise UsageError(f"the datasets take {copied / 1e9:,.0f} GB on disk: with the "
                             f"system and the copies in flight the root volume would be "
                             f"{need:,} GB, past gp3's largest ({config.GP3_MAX_GB:,} GiB)",
                             hint="stage less data, or give it as an EBS snapshot (--data "
                                  "NAME=snap-...), a volume of its own")
        if spec.placement.disk_gb and spec.placement.disk_gb < need:
            raise UsageError(f"--disk-gb {spec.placement.disk_gb}: the datasets take "
                             f"{copied / 1e9:.1f} GB on disk; give at least {need}",
                             hint=f"--disk-gb {need}")
        spec = spec.changed(disk_gb=max(spec.root_gb(settings), need))
        if fast:
            spec = spec.changed(disk_mbps=disks["mbps"])
    return spec, found


def _local_disk(spec, disk: dict | None, room: float) -> dict | None:
    """Where the copies go, for the spec (Data.local_disk): the instance's local disk (the
    provider's `disk`: the NVMe its image mounts) where it holds the copy's `room` GB, free
    and lost with the instance; else the root volume, and why."""
    if disk is None:
        return None
    if not disk.get("path"):
        return {"used": False, "why": disk["why"]}
    if room > disk["gb"]:
        return {"used": False, "why": (
            f"{spec.placement.instance_type}'s local NVMe ({disk['gb']:,.0f} GB at "
            f"{disk['path']}) is smaller than the {math.ceil(room):,} GB the copy needs (the "
            "files, 5% for the file system, the shards in flight)")}
    return {"used": True, "path": disk["path"], "dir": disk["dir"], "disks": disk["disks"],
            "gb": disk["gb"], "need_gb": math.ceil(room)}


class MissingFolders(UsageError):
    """A dataset lacks folders the job reads: the launch, and its dry run, stop on it."""


MISSING_SHOWN = 6


def check_folders(staged: Staged, spec) -> None:
    """The dataset holds every folder the job reads (its `reads`, from the recipe), where
    that can be told before launch: a path on this machine for a local job, an S3 dataset's
    manifest folder list or objects. A MissingFolders naming them, with the command that
    makes them, otherwise; a path on an instance or a snapshot is the recipe's to check."""
    source, reads = staged.source, staged.source.get("reads")
    if not reads:
        return
    if source["kind"] == "path" and spec.backend == "local":
        def has(folder: str) -> bool | None:
            return os.path.isdir(os.path.join(source["location"], *folder.split("/")))
    elif source["kind"] == "s3" and staged.contents is not None:
        has = staged.contents.has_folder
    else:
        return
    missing, lacking = [], []
    for top in reads["folders"]:
        gaps = [p for p in (_join(top, w) for w in reads["within"]) if has(p) is False]
        missing += gaps
        if gaps:
            lacking.append(top)
    if not missing:
        return
    shown_ = ", ".join(missing[:MISSING_SHOWN]) + (
        f" and {len(missing) - MISSING_SHOWN} more" if len(missing) > MISSING_SHOWN else "")
    raise MissingFolders(f"dataset {source['name']} at {source['location']} has no {shown_}, "
                         f"which recipe {spec.recipe} with {reads['by']} reads",
                         hint=_prepare_hint(reads["prepare"], lacking, source))


def _join(top: str, below: str) -> str:
    return "/".join(p for p in (top, below) if p)


def _prepare_hint(template: str, lacking: list[str], source: dict) -> str | None:
    """The recipe's prepare command for the folders it lacks: each `{name}` the numbers of
    the lacking `name/N` folders (`--sizes {sz}` -> `--sizes 40,88`; '' for none); DEST the
    dataset's path here, or DEST then pushed to its S3 prefix."""
    import re
    import shlex

    if not template:
        return None

    def numbers(match) -> str:
        found = [f.split("/", 1)[1] for f in lacking
                 if f.split("/", 1)[0] == match.group(1) and "/" in f]
        return ",".join(found) or "''"

    line = re.sub(r"\{(\w+)\}", numbers, template)
    if source["kind"] == "path":
        return line.replace("DEST", shlex.quote(source["location"]))
    return f"{line}, then cloudtrain data push DEST {source['location']}"


def copy_bytes(spec) -> int:
    """Bytes the staging reads before the job starts: each S3 dataset, and each snapshot
    volume read once (first_read: preread), as preflight recorded them in spec.data.staging."""
    return sum(int(((spec.data.staging or {}).get(d["name"]) or {}).get("bytes") or 0)
               for d in spec.data.datasets if d["kind"] == "s3" or
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


def notes(spec, settings, found: list[Staged]) -> list[str]:
    """What a user should know about the copies before paying for them: a bucket in another
    region (slower, and billed per GB), presigned links that die with a session (`found`:
    what preflight read)."""
    out = []
    instance_region = spec.placement.region or settings.region
    for d in spec.data.datasets:
        info = (spec.data.staging or {}).get(d["name"]) or {}
        if d["kind"] == "s3" and spec.backend == "aws" and info.get("region") and \
                instance_region and info["region"] != instance_region:
            gb = (info.get("bytes") or 0) / 1e9
            out.append(f"dataset {d['name']}: its bucket is in {info['region']}, the instance "
                       f"in {instance_region}: the copy crosses regions (slower, and about "
                       f"${INTER_REGION_USD_PER_GB * gb:.2f} of transfer for {gb:.1f} GB)")
    for s in found:  # a manifest pushed before folders were listed (check_folders could not)
        if s.source.get("reads") and s.contents is not None and \
                s.contents.has_folder("") is None:
            out.append(f"dataset {s.source['name']}: its manifest lists no folders (pushed "
                       "by an older cloudtrain), so whether it has what the job reads is "
                       f"found out on the instance; `cloudtrain data push DIR "
                       f"{s.source['location']}` again lists them")
    if spec.data.disk_mbps is not None and spec.data.disk_mbps < settings.staging_disk_mbps:
        out.append(f"the root volume takes the copy at {spec.data.disk_mbps} MB/s, not "
                   f"staging_disk_mbps's {settings.staging_disk_mbps}: "
                   f"{spec.placement.instance_type}'s link to EBS takes no more, so more is "
                   "not bought")
    if any(d["kind"] == "s3" for d in spec.data.datasets) and not (
            spec.backend == "aws" and settings.instance_profile) and \
            any(s.temporary for s in found):
        out.append("the instance reads the datasets through links signed with your temporary "
                   "(session) credentials: they stop working when that session expires; set "
                   "instance_profile in config.yaml (infra/README.md) for long copies")
    return out


def host_plan(found: list[Staged], spec, settings, data_dir: str,
              mounts: dict[str, str] | None = None) -> dict | None:
    """The stager's plan (cloudtrain/host/stager.py) for the copies onto the host, or None when
    the job stages nothing. With an instance profile the instance signs its own requests
    with the role's credentials; otherwise each object gets a presigned link (the user's
    credentials never leave this machine either way). Where preflight put the copies on
    the instance's local disk (Data.local_disk), the plan's `scratch` says where it should
    be mounted, and each S3 dataset's `scratch_dest` (its copy there: dest becomes a link to
    it) and `need_bytes`; the stager takes the root volume (dest) where the disk is not
    there, not writable or too full. Every node of a job gets the same plan: each copies
    onto its own disk."""
    if not found:
        return None
    role = spec.backend == "aws" and bool(settings.instance_profile)
    local = spec.data.local_disk if (spec.data.local_disk or {}).get("used") else None
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
            assert s.entry is not None  # an s3 dataset's, made by its provider
            entry.update(s.entry(role))
            if local is not None and s.contents is not None:  # onto the local disk, linked
                c = s.contents
                shard = c.largest if c.kind == "shards" else 0
                flying = len(c.manifest.shards) if c.manifest else IN_FLIGHT_SHARDS
                entry.update(scratch_dest=f"{local['dir']}/{src['dir']}",
                             need_bytes=int(copy_room(c.file_bytes, shard, flying) * 1e9))
        entries.append(entry)
    plan = {"version": 1, "workers": STAGING_WORKERS, "part_bytes": STAGING_PART_BYTES,
            "progress_s": 5, "imds_url": settings.imds_url, "datasets": entries}
    if local is not None:  # the stager checks it is there, writable and roomy, else says so
        plan["scratch"] = {"mount": local["path"], "dir": local["dir"]}
    return plan


# -- on the host: the plan file run.sh hands the stager, and what it reports back ----------------

PLAN_FILE = "staging.json"  # in the job directory: the stager's plan (host_plan)
STATUS_FILE = "staging-status.json"  # the stager's progress and outcome (agent.STAGING_STATUS)


def _gb(n) -> str:
    return f"{(n or 0) / 1e9:.1f} GB" if (n or 0) >= 1e8 else f"{(n or 0) / 1e6:.1f} MB"


def staging_line(spec) -> str:
    """The timeline's word on what the staging phase copies or mounts."""
    parts = []
    for d in spec.data.datasets:
        info = (spec.data.staging or {}).get(d["name"], {})
        if d["kind"] == "path":
            parts.append(f"{d['name']} at {d['location']} (on the host)")
        elif d["kind"] == "snapshot":
            parts.append(f"{d['name']} from {d['location']} ({_gb(info.get('bytes'))} volume)")
        else:
            parts.append(f"{d['name']} from {d['location']} ({_gb(info.get('bytes'))}, "
                         f"{info.get('files', 0):,} files, {info.get('kind', 's3')})")
    nodes = int(getattr(spec, "nodes", 1) or 1)
    if nodes > 1 and any(d["kind"] != "path" for d in spec.data.datasets):
        copied = sum(int(((spec.data.staging or {}).get(d["name"]) or {}).get("bytes") or 0)
                     for d in spec.data.datasets if d["kind"] not in ("path", "snapshot"))
        parts.append(f"on each of {nodes} nodes, at the same time (its own disk"
                     + (f"; {_gb(copied * nodes)} read in all" if copied else "") + ")")
    needed = copy_seconds(spec)
    if spec.data.staging_allowance_s or needed:  # the copy runs inside the job's clock
        text = f"max runtime +{spec.data.staging_allowance_s / 60:.0f} min for it"
        if spec.data.staging_allowance_s < needed and spec.max_runtime_s >= config.WEEK_S:
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
        if d.get("kind") == "path" and not d.get("files_done"):  # linked, nothing read
            parts.append(f"{d['name']} linked, not copied")
            continue
        secs = d.get("seconds")
        text = f"{d['name']} {_gb(d.get('bytes_done'))}, {d.get('files_done') or 0:,} files"
        if secs:
            text += f" in {secs:.0f} s ({(d.get('bytes_done') or 0) / 1e6 / max(secs, 1e-3):.0f} MB/s)"
        parts.append(text)
    disk = staging.get("disk")
    if disk:  # where the copies went, where the plan had a local disk for them
        parts.append(f"onto the local NVMe ({disk['path']})" if disk["local"] else
                     f"onto the root volume ({disk['path']}), not the local NVMe: "
                     f"{disk['note']}")
    return "data staged: " + ("; ".join(parts) or "nothing to copy")


# -- `cloudtrain data ls` ------------------------------------------------------------------------


def listing(store, settings, account=None) -> list[dict]:
    """The declared datasets (config.yaml), each with its source, its size (as last read at
    a launch, or now by `account`: the AWS account's dataset_size), and the last job that
    staged it: when, where, how fast."""
    last: dict[str, dict] = {}
    for job in store.jobs():  # newest first
        for d in job.spec.data.datasets or []:
            name = d.get("name") if isinstance(d, dict) else None
            if not isinstance(name, str) or name in last:
                continue
            staged = next((ev for ev in store.events(job.id) if ev.phase == "running"
                           and (ev.detail or "").startswith("data staged")), None)
            if staged is None:
                continue
            inst = job.spec.placement.instance_type or job.backend
            region = job.spec.placement.region or ""
            last[name] = {"job": job.id, "at": staged.at, "where": f"{inst} {region}".strip(),
                          "detail": staged.detail,
                          "size": (job.spec.data.staging or {}).get(name)}
    rows = []
    for name, source in sorted(settings.datasets.items()):
        seen = last.get(name) or {}
        row = {"name": name, "kind": source.kind, "source": source.describe(),
               "size": seen.get("size"), "last_staged": {k: seen[k] for k in
                                                         ("job", "at", "where", "detail")
                                                         if k in seen} or None}
        if account is not None and source.kind == "s3":
            try:
                row["size"] = account.dataset_size(source.location)
            except CloudtrainError as exc:
                row["size"] = {"error": exc.message}
        rows.append(row)
    return rows
