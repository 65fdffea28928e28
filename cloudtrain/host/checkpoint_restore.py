"""A checkpoint snapshot restored onto a new instance from the job store.

Standard library only, Python 3.8+; shipped beside agent.py; run through checkpoint_stream.py's
command (`python3 checkpoint_stream.py restore PLAN JOBDIR`) by run.sh before the job starts.
Imports checkpoint_manifest, agent_upload and safefile, nothing else of ours.

    restore(plan_path, jobdir, sign=None)
                                 the files a plan (the manifest with a presigned GET URL per
                                 file) names, verified, then swapped in; `sign`: the URLs are
                                 plain object URLs, each GET signed with the instance role
                                 (host/bootstrap.py: an instance that starts its job alone)
"""

import hashlib
import http.client
import os
import stat
import time
import urllib.error
import urllib.request

from . import agent_upload, safefile
from .awsapi import retry
from .checkpoint_manifest import (CHUNK, LOGS, RESTORE_STATUS, RESTORE_TIMEOUT_S,
                                  check_manifest, is_time, signature)

PLAN_MAX_BYTES = 16 << 20  # a restore plan, and restore-status.json
RESTORE_TRIES = 4  # per file, on connection errors and 5xx only
RESTORE_BACKOFF_S = 1.0  # 1 s, 2 s, 4 s


class RestoreError(Exception):
    """A restore that cannot succeed; the message says why, in one line."""


class _Transient(Exception):
    """Worth another try: a connection error, a 5xx, a body cut short."""


def _inside(root, rel):
    """The path for `rel` below `root` (resolved), or None: not a safe relative path, or it
    would resolve elsewhere (a link already in the job directory, at any level)."""
    if agent_upload.safe_relpath(rel) is None:
        return None
    target = os.path.join(root, *rel.split("/"))
    if os.path.realpath(target) != target or not target.startswith(root.rstrip(os.sep) + os.sep):
        return None
    return target


def _load_plan(plan_path):
    plan = safefile.read_json(plan_path, PLAN_MAX_BYTES)
    if plan is None:
        raise RestoreError("the plan %s is not a readable JSON object" % plan_path)
    why = check_manifest(plan)
    if why is not None:
        raise RestoreError("the plan is not a valid manifest: %s" % why)
    for item in plan["files"]:
        url = item.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise RestoreError("the plan has no http(s) URL for %r" % item["path"])
    timeout = plan.get("timeout_s", RESTORE_TIMEOUT_S)
    if not is_time(timeout) or timeout <= 0:
        raise RestoreError("the plan's timeout_s is not a positive number")
    return plan, float(timeout)


def _get(url, tmp, size, digest, deadline, rel, sign=None):
    """Download `url` into the new file `tmp`: exactly `size` bytes with this sha256;
    `sign(url)`: the headers that sign the GET (None: the URL is presigned)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    h, got = hashlib.sha256(), 0
    with os.fdopen(fd, "wb") as out:
        try:
            timeout = max(1.0, min(60.0, deadline - time.time()))
            req = urllib.request.Request(url, headers=sign(url) if sign else {})
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                while True:
                    if time.time() > deadline:
                        raise RestoreError("ran out of time downloading %s" % rel)
                    block = resp.read(CHUNK)
                    if not block:
                        break
                    got += len(block)
                    if got > size:
                        raise RestoreError("%s: more than the %d bytes listed" % (rel, size))
                    h.update(block)
                    out.write(block)
        except urllib.error.HTTPError as exc:
            detail = agent_upload.aws_error(exc.read(agent_upload.ERROR_BODY_BYTES) or b"")
            message = "HTTP %d for %s: %s" % (exc.code, rel, detail)
            if exc.code >= 500:
                raise _Transient(message)
            raise RestoreError(message + (" (the presigned URL has expired?)"
                                          if exc.code == 403 else ""))
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise _Transient("%s: %s" % (rel, reason))
        out.flush()
        os.fsync(out.fileno())
    if got != size:
        raise _Transient("%s: %d bytes downloaded, %d listed" % (rel, got, size))
    if h.hexdigest() != digest:
        raise RestoreError("%s: the sha256 differs from the manifest" % rel)


def _download(url, tmp, size, digest, deadline, rel, sign=None):
    return retry(lambda: _get(url, tmp, size, digest, deadline, rel, sign),
                 lambda exc: isinstance(exc, _Transient), RESTORE_TRIES, RESTORE_BACKOFF_S,
                 deadline=deadline,
                 give_up=lambda exc, made: RestoreError("%s (after %d tries)" % (exc, made)))


def _append_into(tmp, target):
    """Add a restored log to the end of the one already at `target`, in place; False when
    there is none. The agent holds output.log open for appending from before run.sh (which
    runs the restore) starts: a file renamed over it would take the job's output nowhere."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return False
    with os.fdopen(fd, "ab") as dst, open(tmp, "rb") as src:
        if not stat.S_ISREG(os.fstat(dst.fileno()).st_mode):
            raise RestoreError("%s is not a file" % os.path.basename(target))
        while True:
            block = src.read(CHUNK)
            if not block:
                break
            dst.write(block)
        dst.flush()
        os.fsync(dst.fileno())
    return True


def restore(plan_path, jobdir, sign=None):
    """Download the snapshot `plan_path` names into `jobdir`: every file into a temporary file
    beside its place, verified (size, sha256), and only once all are, each renamed into place
    (metrics.jsonl and output.log, when there already, get the restored copy appended in
    place instead). A failure before that point replaces nothing. Returns, and writes as
    <jobdir>/restore-status.json, {"ok", "seq", "step", "epoch", "files", "bytes", "seconds",
    "error"}, plus "slot", "at" and the restored checkpoints' "signature" (the Streamer does
    not upload them again)."""
    started = time.time()
    status: dict[str, object] = {
        "ok": False, "seq": None, "step": None, "epoch": None, "files": 0, "bytes": 0,
        "seconds": 0.0, "error": None, "slot": None, "signature": None}
    staged = []
    try:
        plan, timeout = _load_plan(plan_path)
        status.update(seq=plan["seq"], slot=plan["slot"], step=plan.get("step"),
                      epoch=plan.get("epoch"))
        deadline = started + timeout
        os.makedirs(jobdir, exist_ok=True)
        root = os.path.realpath(jobdir)
        targets = []
        for item in plan["files"]:  # every path is checked before anything is written
            target = _inside(root, item["path"])
            if target is None:
                raise RestoreError("unsafe path %r: nothing restored" % item["path"])
            if os.path.lexists(target) and not stat.S_ISREG(os.lstat(target).st_mode):
                raise RestoreError("%s is there and not a file: nothing restored" % item["path"])
            targets.append(target)
        for item, target in zip(plan["files"], targets):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if _inside(root, item["path"]) != target:  # a folder made just now, not a link
                raise RestoreError("%s changed while it was restored" % item["path"])
            tmp = os.path.join(os.path.dirname(target), ".%s.%d.restoring"
                               % (os.path.basename(target), os.getpid()))
            staged.append(tmp)
            _download(item["url"], tmp, item["size"], item["sha256"], deadline, item["path"],
                      sign)
        for item, target, tmp in zip(plan["files"], targets, staged):  # checkpoints first
            if item["path"] not in LOGS:
                os.replace(tmp, target)
        for item, target, tmp in zip(plan["files"], targets, staged):
            if item["path"] in LOGS and not _append_into(tmp, target):
                os.replace(tmp, target)
        for folder in sorted({os.path.dirname(t) for t in targets}):
            safefile.fsync_dir(folder)
        status.update(ok=True, files=len(targets), bytes=plan["bytes"],
                      signature=[list(s) for s in signature(root)])
    except RestoreError as exc:
        status["error"] = str(exc)
    except Exception as exc:
        status["error"] = "%s: %s" % (type(exc).__name__, exc)
    finally:
        for tmp in staged:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    status["seconds"] = round(time.time() - started, 3)
    status["at"] = time.time()
    if status["error"] is not None:
        status["error"] = " ".join(str(status["error"]).split())[:500]
    try:
        safefile.write_json(os.path.join(jobdir, RESTORE_STATUS), status)
    except OSError:
        pass
    return status
