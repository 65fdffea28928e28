"""Stage a job's datasets onto the instance's disk before training, following a plan.

Standard library only, Python 3.8+: part of the host package, run through its launcher with
the host's python3:

    python3 stager.py PLAN_JSON STATUS_JSON

The plan (written by the orchestrator, trusted but checked for shape: stage_plan.py) lists
datasets; each is either already on the host (kind "path": dest becomes a link to it), tar
shards in S3 with their manifest (kind "shards"), or a plain prefix of S3 objects (kind
"objects"). S3 objects are read with ranged GETs by a pool of `workers` threads
(stage_run.py, stage_fetch.py), through presigned URLs or signed with the instance role's
credentials (IMDSv2, SigV4: awsapi.py). Everything that comes back over the network is
untrusted: sizes, bodies and status codes are checked; a shard's files appear in dest only
once the whole shard matched its sha256 (shards.extract_shard).

    stage(plan, status_path, out=sys.stdout, backoff_s=0.5) -> exit code

This module holds the run over the plan's datasets (each staged into a partial copy that
replaces dest whole; where the plan names a local disk, the instance's NVMe, the copy is made
there and dest becomes a link to it, or, the disk missing, not writable or too full, at dest
as before: stage_disk.py), the status file and the progress lines, and the command; it
imports the stage_* modules, safefile and shards.

Exit 0 when every dataset is staged; 1 after one line `cloudtrain staging failed: <reason>`
on stderr; 143 / 130 after SIGTERM / SIGINT. STATUS_JSON is rewritten (atomically) every
progress_s seconds and at each dataset's end.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import stat
import sys
import threading
import time

from . import safefile, shards, stage_disk
from .stage_fetch import Fetcher
from .stage_plan import StageError, check_plan, disk_reason, reason
from .stage_run import DatasetRun
from .awsapi import RoleCredentials

MARKER = ".cloudtrain-staged.json"
STAGING = ".staging"
PARTIAL = ".cloudtrain-partial.json"  # in a copy under way: the version it is of

# Shards are extracted in processes of their own: Python's tarfile reads a stream at a few
# hundred MB/s per core (benchmarks/data_staging.py), slower than an instance's disk.
MAX_EXTRACTORS = 8
MARKER_BYTES = 1 << 20


class Stager:
    """One run over a plan: its datasets in order, its status file, its signals."""

    def __init__(self, plan: dict, status_path, out, backoff_s: float):
        self.plan = plan
        self.status_path = str(status_path)
        self.out = out
        # From the plan once check_plan has passed it (run): it may not even be an object.
        self.workers, self.part, self.progress_s = 1, 1 << 20, 5.0
        self.extractors = max(1, min(MAX_EXTRACTORS, os.cpu_count() or 1))
        self.stop = threading.Event()
        self.fetcher = Fetcher(self.stop, backoff_s)
        self.signum = None
        self.role: RoleCredentials | None = None
        self.scratch: str | None = None  # the local disk's folder the copies go to, if any
        self.started = time.time()
        self.status: dict = {"state": "staging", "started_at": self.started, "ended_at": None,
                       "error": None, "datasets": []}

    # - status and progress ------------------------------------------------------------

    def write_status(self) -> None:
        try:
            safefile.write_atomic(self.status_path,
                                  (json.dumps(self.status, indent=1) + "\n").encode("ascii"),
                                  sync=False)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise

    def progress(self, rec: dict, t0: float) -> None:
        rec["seconds"] = round(time.time() - t0, 3)
        rate = rec["bytes_done"] / rec["seconds"] if rec["seconds"] > 0 else 0.0
        rec["mb_s"] = round(rate / 1e6, 3)
        total = rec["bytes_total"]
        pct = int(100 * rec["bytes_done"] / total) if total else 100
        line = "cloudtrain staging %s: %.1f of %.1f GB (%d%%), %s of %s files, %.0f MB/s" % (
            rec["name"], rec["bytes_done"] / 1e9, total / 1e9, pct,
            "{:,}".format(rec["files_done"]), "{:,}".format(rec["files_total"]), rate / 1e6)
        if rec["state"] == "staging" and rate > 0:
            left = (total - rec["bytes_done"]) / rate
            line += ", about %s left" % (
                "%d min" % round(left / 60) if left >= 90 else "%d s" % max(1, round(left)))
        elif rec["state"] != "staging":
            line += ", " + rec["state"]
        print(line, file=self.out, flush=True)
        self.write_status()

    def linked(self, d: dict, rec: dict, t0: float) -> None:
        """A dataset already on the host, linked and not read: said as that, not as a copy
        of 0 bytes."""
        rec.update(state="staged", seconds=round(time.time() - t0, 3))
        print("cloudtrain staging %s: linked %s" % (rec["name"], d["path"]), file=self.out,
              flush=True)
        self.write_status()

    # - running ------------------------------------------------------------------------

    def run(self) -> int:
        datasets = None
        try:
            datasets = check_plan(self.plan)
            self.workers, self.part = self.plan["workers"], self.plan["part_bytes"]
            self.progress_s = float(self.plan.get("progress_s", 5))
            for d in datasets:
                self.status["datasets"].append({
                    "name": d["name"], "kind": d["kind"], "state": "waiting",
                    "bytes_total": 0, "bytes_done": 0, "files_total": 0, "files_done": 0,
                    "mb_s": 0.0, "seconds": 0.0})
            self.choose_disk(datasets)
            self.write_status()
            for d, rec in zip(datasets, self.status["datasets"]):
                self.check_signal()
                self.dataset(d, rec)
        except StageError as exc:
            return self._fail(str(exc))
        except OSError as exc:  # the status file or dest cannot be written
            return self._fail(disk_reason(exc))
        except Exception as exc:  # a bug: the status says so, the traceback follows
            self._fail("internal error (%s: %s)" % (type(exc).__name__, reason(exc)))
            raise
        self.status.update(state="staged", ended_at=time.time())
        self.write_status()
        return 0

    def _fail(self, reason: str) -> int:
        interrupted = self.signum is not None
        if interrupted:
            reason = "interrupted"
        self.status.update(state="failed", ended_at=time.time(), error=reason)
        for rec in self.status["datasets"]:
            if rec["state"] == "staging":
                rec["state"] = "failed"
        try:
            self.write_status()
        except OSError:
            pass
        print("cloudtrain staging failed: %s" % reason, file=sys.stderr, flush=True)
        if interrupted:
            return 130 if self.signum == signal.SIGINT else 143
        return 1

    def choose_disk(self, datasets: list) -> None:
        """Where the plan puts the copies on the local disk: that disk if it is mounted,
        writable and roomy; else the root volume's data dir (where it can hold the files),
        said in the log and the status."""
        scratch = self.plan.get("scratch")
        if not scratch:
            return
        wanted = sum(d.get("need_bytes", 0) for d in datasets if d.get("scratch_dest") and
                     _marker_identity(os.path.join(d["scratch_dest"], MARKER)) != d["identity"])
        self.scratch, why = stage_disk.choose(scratch, wanted)
        if self.scratch is not None:
            self.status["disk"] = {"local": True, "path": self.scratch, "note": None}
            print("cloudtrain staging: onto the local NVMe at %s (%s free)" % (
                self.scratch, stage_disk.size(stage_disk.free_bytes(self.scratch))),
                file=self.out, flush=True)
            return
        stage_disk.check_root([d for d in datasets if _marker_identity(
            os.path.join(d["dest"], MARKER)) != d.get("identity")], why)
        roots = sorted({os.path.dirname(d["dest"].rstrip("/")) for d in datasets
                        if d.get("scratch_dest")})
        self.status["disk"] = {"local": False, "path": ", ".join(roots), "note": why}
        print("cloudtrain staging: not onto the local NVMe (%s): onto the root volume at %s "
              "instead" % (why, ", ".join(roots)), file=self.out, flush=True)

    def on_signal(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        self.stop.set()

    def check_signal(self) -> None:
        """StageError("interrupted") once a signal came."""
        if self.signum is not None:
            raise StageError("interrupted")

    def dataset(self, d: dict, rec: dict) -> None:
        t0 = time.time()
        if d["kind"] == "path":
            rec["state"] = "staging"
            self._link(d)
            if d.get("preread"):
                self._preread(d["path"], rec, t0)
                rec["state"] = "staged"
                self.progress(rec, t0)
                return
            self.linked(d, rec, t0)
            return
        dest = d["dest"].rstrip("/")
        if d["kind"] == "shards":
            m = d["_manifest"]
            rec["bytes_total"], rec["files_total"] = m.bytes, m.files
        else:
            rec["bytes_total"] = sum(o["bytes"] for o in d["objects"])
            rec["files_total"] = len(d["objects"])
        # On the local disk (choose_disk), the copy goes there and dest becomes a link to it;
        # a copy of this version at dest already (followed through a link) is kept.
        target = d["scratch_dest"].rstrip("/") if self.scratch and d.get("scratch_dest") \
            else dest
        if target != dest:
            if _marker_identity(os.path.join(dest, MARKER)) == d["identity"]:
                self._skipped(rec, t0)
                return
            _check_replaceable(dest)
        parent, base = os.path.split(target)
        os.makedirs(parent, exist_ok=True)
        # One staging of a folder at a time (two jobs on one host, the local backend's shared
        # data dir): the second waits, then finds the copy made.
        with _Lock(os.path.join(parent, ".%s.cloudtrain-lock" % base), self.out, d["name"]):
            if _marker_identity(os.path.join(target, MARKER)) == d["identity"]:
                if target != dest:
                    _link_to(dest, target)
                self._skipped(rec, t0)
                return
            _check_replaceable(target)
            rec["state"] = "staging"
            self._copy(d, rec, t0, os.path.join(parent, ".%s.cloudtrain-partial" % base))
            _swap_in(os.path.join(parent, ".%s.cloudtrain-partial" % base), target,
                     os.path.join(parent, ".%s.cloudtrain-old" % base))
            if target != dest:
                _link_to(dest, target)
        rec["state"] = "staged"
        self.progress(rec, t0)

    def _skipped(self, rec: dict, t0: float) -> None:
        rec["state"] = "skipped"
        rec["bytes_done"], rec["files_done"] = rec["bytes_total"], rec["files_total"]
        self.progress(rec, t0)

    def _copy(self, d: dict, rec: dict, t0: float, partial: str) -> None:
        """The dataset into `partial`, verified and marked: what replaces dest whole. A
        partial copy of this same version (a staging cut short) is continued."""
        marker = os.path.join(partial, MARKER)
        if _read_doc(os.path.join(partial, PARTIAL)).get("identity") != d["identity"]:
            shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial, exist_ok=True)
        safefile.write_json(os.path.join(partial, PARTIAL), {"identity": d["identity"]},
                            sync=False)
        if d["auth"] == "role" and self.role is None:
            self.role = RoleCredentials(self.plan["imds_url"])
        if d["auth"] == "role" and self.role is not None:  # made just above
            self.role.get()  # no instance profile: say so before any worker starts
        staging = os.path.join(partial, STAGING)
        shutil.rmtree(staging, ignore_errors=True)
        os.mkdir(staging, 0o700)
        try:
            DatasetRun(self, dict(d, dest=partial, _shown_dest=d["dest"]), rec, t0, staging).go()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if d["kind"] == "shards":
            try:
                shards.verify_tree(partial, d["_manifest"])
            except ValueError as exc:
                raise StageError(str(exc)) from None
        os.unlink(os.path.join(partial, PARTIAL))
        safefile.write_json(marker, {"identity": d["identity"], "name": d["name"],
                                     "files": rec["files_total"], "bytes": rec["bytes_total"],
                                     "staged_at": time.time()}, sync=False)

    def _preread(self, root: str, rec: dict, t0: float) -> None:
        """Read every file below root once, `workers` at a time: a volume made from an EBS
        snapshot fetches each block from S3 on its first read, so an epoch that reads it
        would run at that speed; paid here, it is the staging phase's (timed, priced)."""
        files = []
        for top, dirs, names in os.walk(root):
            dirs[:] = sorted(n for n in dirs if not os.path.islink(os.path.join(top, n)))
            for n in names:
                p = os.path.join(top, n)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    files.append((p, st.st_size))
        rec["files_total"], rec["bytes_total"] = len(files), sum(n for _, n in files)
        lock = threading.Lock()
        todo = iter(files)
        errors: list = []
        last = [time.time()]

        def reader():
            while not self.stop.is_set() and not errors:
                with lock:
                    item = next(todo, None)
                if item is None:
                    return
                try:
                    with open(item[0], "rb", buffering=0) as f:
                        while not self.stop.is_set():
                            chunk = f.read(1 << 20)
                            if not chunk:
                                break
                            with lock:
                                rec["bytes_done"] += len(chunk)
                except OSError as exc:
                    errors.append("cannot read %s: %s" % (item[0], reason(exc)))
                    return
                with lock:
                    rec["files_done"] += 1
                    tick = time.time() - last[0] >= float(self.plan.get("progress_s", 5))
                    if tick:
                        last[0] = time.time()
                if tick:
                    self.progress(rec, t0)

        threads = [threading.Thread(target=reader, daemon=True)
                   for _ in range(int(self.plan.get("workers", 16)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.check_signal()
        if errors:
            raise StageError(errors[0])

    def _link(self, d: dict) -> None:
        path, dest = d["path"], d["dest"]
        if not os.path.isdir(path):
            raise StageError("%s is not a folder on this host: the dataset's path must exist "
                             "before the job starts" % path)
        if os.path.islink(dest):
            if os.readlink(dest) == path:
                return
            os.unlink(dest)
        elif os.path.lexists(dest):
            if os.path.realpath(dest) == os.path.realpath(path):
                return
            raise StageError("%s already exists and is not a link to %s: move it away or "
                             "choose another dest" % (dest, path))
        parent = os.path.dirname(dest.rstrip("/"))
        os.makedirs(parent, exist_ok=True)
        tmp = "%s.cloudtrain-link.%d" % (dest.rstrip("/"), os.getpid())
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(path, tmp)
        os.replace(tmp, dest.rstrip("/"))


class _Lock:
    """An exclusive flock on `path` for the staging of one folder; says so while it waits."""

    def __init__(self, path: str, out, name: str):
        self.path, self.out, self.name = path, out, name
        self.fd: int | None = None

    def __enter__(self):
        self.fd = fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("cloudtrain staging %s: waiting for another job staging it on this host"
                  % self.name, file=self.out, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        assert self.fd is not None  # opened by __enter__
        os.close(self.fd)  # releases the lock


def _read_doc(path: str) -> dict:
    try:
        if os.path.islink(path):
            return {}
        with open(path, "rb") as f:
            doc = json.loads(f.read(MARKER_BYTES))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _check_replaceable(dest: str) -> None:
    """dest may be replaced by a staged copy: absent, a link (an earlier `path` dataset), an
    empty folder, or an earlier copy of ours (its marker says so). A folder of files that
    cloudtrain did not stage is never deleted: the staging stops and says so."""
    if not os.path.lexists(dest) or os.path.islink(dest):
        return
    if not os.path.isdir(dest):
        raise StageError("%s is a file, not a dataset folder: move it away" % dest)
    if os.path.exists(os.path.join(dest, MARKER)) or not os.listdir(dest):
        return
    raise StageError("%s already holds files cloudtrain did not stage: move them away, or "
                     "read them as they are with --data NAME=%s" % (dest, dest))


def _link_to(dest: str, target: str) -> None:
    """dest (absent, a link, or an earlier copy of ours: _check_replaceable) becomes a link to
    the copy at target, in one rename; an earlier copy there is deleted after."""
    if os.path.islink(dest) and os.readlink(dest) == target:
        return
    parent, base = os.path.split(dest)
    os.makedirs(parent, exist_ok=True)
    tmp = "%s.cloudtrain-link.%d" % (dest, os.getpid())
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    old = os.path.join(parent, ".%s.cloudtrain-old" % base)
    if os.path.lexists(dest) and not os.path.islink(dest):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dest, old)
    os.replace(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


def _swap_in(partial: str, dest: str, old: str) -> None:
    """Put the finished copy in place of dest with renames (a reader sees the old tree or
    the new one, never a mix), then delete the old one."""
    shutil.rmtree(old, ignore_errors=True)
    if os.path.islink(dest):
        os.unlink(dest)
    elif os.path.lexists(dest):
        os.rename(dest, old)
    os.rename(partial, dest)
    shutil.rmtree(old, ignore_errors=True)


def _marker_identity(marker: str):
    try:
        if os.path.islink(marker):
            return None
        with open(marker, "rb") as f:
            doc = json.loads(f.read(MARKER_BYTES))
    except (OSError, ValueError):
        return None
    return doc.get("identity") if isinstance(doc, dict) else None


def stage(plan: dict, status_path, out=sys.stdout, backoff_s: float = 0.5) -> int:
    """Stage every dataset of `plan`, rewriting `status_path`; the exit code (0, 1, 130,
    143). SIGTERM and SIGINT stop it promptly when called from the main thread."""
    s = Stager(plan, status_path, out, backoff_s)
    installed = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            installed[signum] = signal.signal(signum, s.on_signal)
    try:
        return s.run()
    finally:
        for signum, old in installed.items():
            signal.signal(signum, old)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python3 stager.py PLAN_JSON STATUS_JSON", file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as f:
            plan = json.loads(f.read(256 << 20))
    except (OSError, ValueError) as exc:
        print("cloudtrain staging failed: cannot read the plan %s (%s)" % (argv[0], reason(exc)),
              file=sys.stderr)
        return 1
    return stage(plan, argv[1])


if __name__ == "__main__":
    sys.exit(main())