"""What a checkpoint snapshot holds and the manifest that names it (stream/latest.json).

Standard library only, Python 3.8+; shipped beside agent.py and imported by name by
checkpoint_stream.py (the uploads) and checkpoint_restore.py (the download on a new instance);
the orchestrator's job store (providers/aws/jobstore.py) checks a manifest with it too.
Imports agent_upload (safe relative paths) and nothing else of ours.

    checkpoint_files(jobdir), signature(jobdir)   what <jobdir>/checkpoints holds now
    step_from_info(data), step_from_metrics(data) (step, epoch) a snapshot was taken at
    check_manifest(doc)                           why a manifest is not valid, or None

The layout under the job's prefix is in checkpoint_stream.py's docstring.
"""

import json
import math
import os
import re
import stat
from typing import TYPE_CHECKING

from . import agent_upload

if TYPE_CHECKING:  # 3.10's; the instance's Python may be older
    from typing import TypeGuard

STREAM = "stream/"
LATEST = "latest.json"
SLOTS = ("a", "b")
VERSION = 1
CHECKPOINTS = agent_upload.CHECKPOINTS
INFO = "checkpoint-info.json"  # {"step", "epoch", "file"}, beside the checkpoint (checkpoint.py)
LOGS = ("metrics.jsonl", "output.log")  # restored too: the resumed job appends to them
RESTORE_STATUS = "restore-status.json"
RESTORE_PLAN = "restore.json"  # in the job directory: the checkpoint to fetch before the job
STEP_SOURCES = ("checkpoint", "metrics")
MANIFEST_MAX_BYTES = 1 << 20  # latest.json (jobstore reads at most this much)
MAX_FILES = 10000
RESTORE_TIMEOUT_S = 1800.0  # a restore plan's timeout_s, when it names none
CHUNK = 1 << 20  # files are read and written in blocks of this size
HEX64 = re.compile(r"[0-9a-f]{64}\Z")


# -- what a snapshot holds ------------------------------------------------------------------


def checkpoint_files(jobdir):
    """[(relative path, absolute path)], sorted, of what is streamed from <jobdir>/checkpoints:
    files and folders whose names do not start with "." (a save in progress: checkpoint.py
    writes `.last.pt.tmp-<pid>`), not entered through links, with portable names. Whether each
    is a regular file is for the caller's lstat/fstat to say."""
    root = os.path.join(jobdir, CHECKPOINTS)
    found: list[tuple[str, str]] = []
    if os.path.islink(root) or not os.path.isdir(root):
        return found
    for top, dirs, names in os.walk(root):  # followlinks=False
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if name.startswith("."):
                continue
            path = os.path.join(top, name)
            rel = os.path.relpath(path, jobdir).replace(os.sep, "/")
            if agent_upload.safe_relpath(rel) is not None and agent_upload._utf8(rel):
                found.append((rel, path))
    return sorted(found)


def signature(jobdir):
    """The checkpoints as they are now: a sorted tuple of (relpath, size, mtime_ns, inode) of
    the regular files checkpoint_files lists. A new checkpoint renamed into place changes the
    inode even when its size and mtime happen to match."""
    sig = []
    for rel, path in checkpoint_files(jobdir):
        try:
            st = os.lstat(path)
        except OSError:
            continue  # removed since the listing (an old checkpoint rotated away)
        if stat.S_ISREG(st.st_mode):
            sig.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(sig)


def as_count(value):
    """A non-negative int from a JSON value (an integral float too), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and value >= 0:
        return int(value)
    return None


def step_from_info(data):
    """(step, epoch) from checkpoint-info.json's bytes, or None when it is not usable."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    step, epoch = as_count(doc.get("step")), as_count(doc.get("epoch"))
    return None if step is None and epoch is None else (step, epoch)


def step_from_metrics(data):
    """(step, epoch) of the last plain row (no "event") of metrics.jsonl bytes that has a
    step or an epoch, or None."""
    for line in reversed(data.splitlines()):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue  # the first line of a tail window, a line being written
        if not isinstance(row, dict) or "event" in row:
            continue
        step, epoch = as_count(row.get("step")), as_count(row.get("epoch"))
        if step is not None or epoch is not None:
            return step, epoch
    return None


def is_int(value, low=None) -> "TypeGuard[int]":
    """An int (not a bool), at least `low` when given."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and (low is None or value >= low))


def is_time(value):
    """A finite number of seconds >= 0 (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def check_manifest(doc):
    """Why `doc` (parsed latest.json, or a restore plan) is not a valid manifest, or None.
    Nothing in it is trusted: whoever held the grant could have written it."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("version") != VERSION or isinstance(doc.get("version"), bool):
        return "version is not %d" % VERSION
    if not isinstance(doc.get("job_id"), str) or not 0 < len(doc["job_id"]) <= 128:
        return "job_id is not a job id"
    if not is_int(doc.get("seq"), 1):
        return "seq is not an int >= 1"
    if doc.get("slot") not in SLOTS or not isinstance(doc.get("slot"), str):
        return "slot is not a or b"
    for key in ("step", "epoch", "attempt"):
        if doc.get(key) is not None and not is_int(doc.get(key), 0):
            return "%s is not an int >= 0 or null" % key
    if doc.get("step_source") is not None and doc.get("step_source") not in STEP_SOURCES:
        return "step_source is not checkpoint, metrics or null"
    for key in ("taken_at", "uploaded_at", "upload_seconds"):
        if not is_time(doc.get(key)):
            return "%s is not a number of seconds" % key
    if not isinstance(doc.get("final"), bool):
        return "final is not true or false"
    files = doc.get("files")
    if not isinstance(files, list) or len(files) > MAX_FILES:
        return "files is not a list of at most %d entries" % MAX_FILES
    seen: set[str] = set()
    total = 0
    for item in files:
        if not isinstance(item, dict):
            return "a files entry is not an object"
        path, size, digest = item.get("path"), item.get("size"), item.get("sha256")
        if (not isinstance(path, str) or agent_upload.safe_relpath(path) is None
                or not agent_upload._utf8(path)):
            return "unsafe path %r" % (path,)
        if not (path.startswith(CHECKPOINTS + "/") or path in LOGS):
            return "%r is neither a checkpoint nor a log" % (path,)
        if not is_int(size, 0):
            return "the size of %r is not an int >= 0" % (path,)
        if not isinstance(digest, str) or not HEX64.match(digest):
            return "the sha256 of %r is not 64 hex digits" % (path,)
        if path in seen:
            return "%r is listed twice" % (path,)
        seen.add(path)
        total += size
    for path in seen:  # "checkpoints/a" and "checkpoints/a/b" cannot both be files
        parts = path.split("/")
        if any("/".join(parts[:i]) in seen for i in range(1, len(parts))):
            return "%r is listed as a file and as a folder" % (path,)
    if not is_int(doc.get("bytes"), 0) or doc["bytes"] != total:
        return "bytes is not the sum of the files' sizes"
    return None
