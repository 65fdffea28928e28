"""Checkpoints streamed to the S3 job store while the job runs, and restored on a new instance.

Standard library only, Python 3.8+: shipped to the host beside agent.py and agent_upload.py
and imported by the agent by name; `restore` (checkpoint_restore.py) also runs as a command
on the new instance:

    python3 checkpoint_stream.py restore PLAN JOBDIR

Layout, under the job's prefix `jobs/<owner key>/<job_id>/` (jobstore.job_prefix; the agent's
presigned-POST grant covers it):

    stream/a/<path>, stream/b/<path>   two slots, each meant to hold one whole snapshot:
                                       checkpoints/** plus metrics.jsonl and output.log
    stream/latest.json                 the manifest naming the slot that holds a complete
                                       snapshot (seq, files with size and sha256, step)

A presigned POST can only write objects, never rename or delete them, so a snapshot cannot
be swapped in atomically. Instead a new snapshot always goes into the slot latest.json does
NOT name, and latest.json is written only once every file of it is stored: a snapshot cut
short (a spot notice, the time limit, S3 failing) leaves the named slot as it was. A partial
upload is never used.

    Streamer(jobdir, grant, ...)   in the agent: watches <jobdir>/checkpoints, uploads the
                                   newest whole checkpoint, one upload at a time, however
                                   often the job writes one; flush() at the job's end
    checkpoint_restore.restore     on the new instance: the files a plan (the manifest with a
                                   presigned GET URL per file) names, verified, then swapped in
    checkpoint_manifest            what a snapshot holds; check_manifest (jobstore.py uses it)

This module holds the Streamer and the command; it imports checkpoint_manifest,
checkpoint_restore, agent_upload and safefile.
"""

import errno
import fcntl
import json
import os
import signal
import sys
import threading
import time

from . import agent_upload, safefile
from .checkpoint_manifest import (CHECKPOINTS, CHUNK, INFO, LATEST, LOGS, RESTORE_STATUS,
                                  SLOTS, STREAM, VERSION, as_count, checkpoint_files,
                                  is_time, signature, step_from_info, step_from_metrics)
from .checkpoint_restore import PLAN_MAX_BYTES, restore

UPLOAD_TIMEOUT_S = 1800.0  # one snapshot from the background thread
RETRY_AFTER_S = 30.0  # a snapshot S3 refused is tried again after this (or a newer one)
LOOK_S = 0.2  # the longest time between two looks at the checkpoints (a listing and an lstat each)
STILL_S = 0.05  # the checkpoints must not change over this: a save of several files is whole
STOP_WAIT_S = 30.0
INFO_MAX_BYTES = 65536
METRICS_TAIL_BYTES = 1 << 20


# -- a snapshot, opened ----------------------------------------------------------------------


def _pread_all(fd, offset, size):
    out = []
    while size > 0:
        data = os.pread(fd, min(size, CHUNK), offset)
        if not data:
            break
        out.append(data)
        offset += len(data)
        size -= len(data)
    return b"".join(out)


def other_slot(slot):
    """The slot a new snapshot goes into: never the one latest.json names."""
    return "b" if slot == "a" else "a"


def job_id_of(grant):
    """`jobs/<owner key>/<job_id>/` (or `jobs/<job_id>/`, the layout before owners) -> job_id."""
    return str(grant.get("prefix") or "").rstrip("/").rsplit("/", 1)[-1]


def open_for_writing(fd):
    """Whether some process has the file open for writing now: True, False, or None where
    this file system cannot tell. Linux refuses a read lease (EAGAIN) on a file that any
    process has open for writing; the lease is given back at once. A writer that opens the
    file in that instant waits for it and sends its holder a signal, here SIGURG, which is
    ignored unless handled (SIGIO, the default, would end the agent)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except (AttributeError, ValueError):
        return None  # not Linux
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EBUSY):
            return True
        return None  # EINVAL (no leases here: NFS, FUSE), EACCES (not the file's owner)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError:
        pass
    return False


class Moved(Exception):
    """A checkpoint file was written to in place while it was uploaded: not named."""


class NotYet(Exception):
    """The checkpoints are being written: a file is open for writing, or (where that cannot be
    told) was written to within settle_s, or the files changed while they were opened."""


class SnapshotError(Exception):
    """This snapshot cannot be stored (a file too large, one changed while it was sent)."""


class _Cancelled(OSError):
    """stop() gave up on an upload of a checkpoint that is no longer the newest."""


class _Source(object):
    """An open file as agent_upload's body source, which stop() can cut short."""

    def __init__(self, f, cancel):
        self.f, self.cancel = f, cancel

    def seek(self, pos, whence=0):
        return self.f.seek(pos, whence)

    def read(self, n=-1):
        if self.cancel.is_set():
            raise _Cancelled("cancelled")
        return self.f.read(n)


class _Snapshot(object):
    """The files of one snapshot, opened: [(rel, file object, size, fstat)]. Uploading from
    these descriptors means a checkpoint os.replace'd meanwhile cannot mix versions: the old
    inode stays readable until closed."""

    def __init__(self, jobdir):
        self.taken_at = time.time()
        self.files: list[tuple] = []
        self.checkpoints = 0
        try:
            for rel, path in checkpoint_files(jobdir):
                self._open(rel, path)
            self.checkpoints = len(self.files)
            for name in LOGS:
                self._open(name, os.path.join(jobdir, name))
        except BaseException:
            self.close()
            raise
        self.sig = tuple((rel, st.st_size, st.st_mtime_ns, st.st_ino)
                         for rel, _, _, st in self.files[:self.checkpoints])

    def _open(self, rel, path):
        try:  # a FIFO or a link planted there is refused, not waited on or followed
            fd = safefile.open_regular(path)
        except OSError:
            return  # gone since the listing, or not a regular file
        f = os.fdopen(fd, "rb")
        st = os.fstat(fd)
        self.files.append((rel, f, st.st_size, st))

    def step(self):
        """(step, epoch, step_source) from the snapshot's own checkpoint-info.json, else from
        its metrics.jsonl (up to the size it had), else (None, None, None)."""
        for rel, f, size, _ in self.files:
            if rel == CHECKPOINTS + "/" + INFO and size <= INFO_MAX_BYTES:
                found = step_from_info(_pread_all(f.fileno(), 0, size))
                if found is not None:
                    return found[0], found[1], "checkpoint"
        for rel, f, size, _ in self.files:
            if rel == "metrics.jsonl":
                start = max(0, size - METRICS_TAIL_BYTES)
                found = step_from_metrics(_pread_all(f.fileno(), start, size - start))
                if found is not None:
                    return found[0], found[1], "metrics"
        return None, None, None

    def check_whole(self, settle_s):
        """NotYet unless every checkpoint file is whole: no process has it open for writing
        (a file renamed into place, as recipes/common/checkpoint.py saves, never is), or,
        where that cannot be told, it has not been written to for settle_s."""
        for rel, f, _, st in self.files[:self.checkpoints]:
            writing = open_for_writing(f.fileno())
            if writing:
                raise NotYet("%s is open for writing" % rel)
            if writing is None and time.time() - st.st_mtime < settle_s:
                raise NotYet("%s was written to %.1f s ago" % (rel, time.time() - st.st_mtime))

    def changed(self):
        """The first checkpoint written to in place since it was opened, or None (a recipe
        that saves without a rename could be caught mid-write: such an upload is not named)."""
        for rel, f, _, st in self.files[:self.checkpoints]:
            now = os.fstat(f.fileno())
            if (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
                return rel
        return None

    def close(self):
        for _, f, _, _ in self.files:
            f.close()
        self.files = []


def _new_record(final, seq=None, slot=None):
    return {"seq": seq, "slot": slot, "step": None, "epoch": None, "bytes": 0, "seconds": 0.0,
            "ok": False, "at": None, "error": None, "final": bool(final)}


class Streamer(object):
    """Uploads <jobdir>/checkpoints to the job store as the job writes them.

    start() runs a daemon thread that looks every `poll_s` (at most LOOK_S apart): once the
    checkpoints differ from the last upload and are whole (Snapshot.check_whole: no file open
    for writing, none changed over STILL_S), it uploads them, however often the job writes
    them. One upload at a time; a checkpoint written during an upload waits for it, and the
    next upload takes the newest then (those in between are skipped). A file written to in
    place during its upload is not named (the next look takes it again). stop() ends it;
    flush() uploads what is new, synchronously, within a time limit (at the job's end).
    `last` is the record of the last upload attempt; nothing here raises out of the thread.
    `settle_s`: where this file system cannot tell whether a file is open for writing, how
    long it must not have been written to. A restored attempt passes
    `start_seq`/`start_slot` (from the manifest it resumed from): its first upload is seq
    start_seq+1, into the other slot."""

    def __init__(self, jobdir, grant, settle_s=2.0, poll_s=1.0, start_seq=0, start_slot=None,
                 attempt=None):
        if not agent_upload.writable(grant):
            raise ValueError("the grant says neither where to post nor which role writes")
        self.jobdir = os.path.abspath(jobdir)
        self.grant = grant
        self.settle_s = float(settle_s)
        self.poll_s = min(float(poll_s), LOOK_S)
        self.attempt = attempt
        self.job_id = job_id_of(grant)
        self._seq = int(start_seq or 0)  # of the snapshot latest.json names (as far as we know)
        self._start_seq = self._seq
        self._slot = start_slot if start_slot in SLOTS else None
        self._good = None  # the record of that snapshot, and the checkpoints it holds
        self._good_sig = None
        # a manifest whose POST failed: S3 may or may not have it
        self._pending: tuple | None = None
        self._failed_sig, self._retry_at = None, 0.0
        self._inflight = None  # the signature being uploaded
        self._moved = False  # the last upload failed only because a file was written to
        self._last = None
        self._uploads = 0
        self._lock = threading.Lock()  # one upload at a time: the thread's or flush's
        self._stop = threading.Event()
        self._cancel = threading.Event()
        self._thread = None
        self._from_restore()

    # -- the public surface ---------------------------------------------------------------

    @property
    def last(self):
        """A copy of the record of the last upload attempt, or None: {"seq", "slot", "step",
        "epoch", "bytes", "seconds", "ok", "at", "error", "final"}."""
        rec = self._last
        return None if rec is None else dict(rec)

    @property
    def uploads(self):
        """How many snapshots this streamer stored (latest.json written)."""
        return self._uploads

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="checkpoint-stream",
                                            daemon=True)
            self._thread.start()

    def stop(self, timeout_s=STOP_WAIT_S):
        """End the thread, waiting up to `timeout_s` for an upload under way. An upload of a
        checkpoint that has been replaced since is cut short instead: the newer one needs the
        time (flush uploads it)."""
        self._stop.set()
        inflight = self._inflight
        if inflight is not None and inflight != signature(self.jobdir):
            self._cancel.set()
        if self._thread is not None:
            self._thread.join(max(0.0, float(timeout_s)))
        if self._thread is None or not self._thread.is_alive():
            self._cancel.clear()

    def flush(self, timeout_s, final=True):
        """Upload a snapshot now if the checkpoints changed since the last upload stored (or
        none was stored yet and there are checkpoints), within `timeout_s`. Returns the record;
        when nothing needed uploading it is that of the snapshot already stored (ok)."""
        started = time.time()
        timeout_s = max(0.0, float(timeout_s))
        if not self._lock.acquire(timeout=timeout_s):
            rec = _new_record(final)
            rec.update(at=time.time(), seconds=round(time.time() - started, 3),
                       error="an upload was still under way after %.0f s" % timeout_s)
            self._last = rec
            return dict(rec)
        try:
            self._cancel.clear()
            rec = self._attempt(final, started + timeout_s, flushing=True)
            return dict(rec)
        finally:
            self._lock.release()

    def poll_once(self, now=None):
        """One look at the checkpoints (the thread calls this every poll_s): returns the
        record of an upload it made, or None (nothing new, or not whole yet). `now`: a
        monotonic clock reading."""
        t = time.monotonic() if now is None else now
        sig = signature(self.jobdir)
        if not sig or sig == self._good_sig:
            return None
        if sig == self._failed_sig and t < self._retry_at:
            return None
        self._from_restore()  # run.sh restores after the agent (and this thread) started
        if sig == self._good_sig:
            return None
        if not self._lock.acquire(blocking=False):
            return None  # flush is uploading
        try:
            rec = self._attempt(False, time.time() + UPLOAD_TIMEOUT_S, seen=sig)
        finally:
            self._lock.release()
        if rec is not None and not rec["ok"] and not self._moved:
            self._failed_sig, self._retry_at = sig, t + RETRY_AFTER_S
        return rec

    # -- inside ---------------------------------------------------------------------------

    def _run(self):
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # a bug must not end the streaming silently
                rec = _new_record(False)
                rec.update(at=time.time(), error="%s: %s" % (type(exc).__name__, exc))
                self._last = rec
            self._stop.wait(self.poll_s)

    def _from_restore(self):
        """A restored attempt starts with the restored checkpoints already stored: they are
        not uploaded again unless they change (restore-status.json holds their signature)."""
        if not self._start_seq or self._good is not None or self._seq != self._start_seq:
            return
        status = safefile.read_json(os.path.join(self.jobdir, RESTORE_STATUS), PLAN_MAX_BYTES)
        if not (status and status.get("ok") is True and status.get("seq") == self._seq
                and isinstance(status.get("signature"), list)):
            return
        try:
            restored = tuple(tuple(item) for item in status["signature"])
        except TypeError:
            return
        if restored and restored == signature(self.jobdir):
            self._good_sig = restored
            self._good = _new_record(False, self._seq, self._slot)
            self._good.update(step=as_count(status.get("step")),
                              epoch=as_count(status.get("epoch")),
                              bytes=as_count(status.get("bytes")) or 0, ok=True,
                              at=status.get("at") if is_time(status.get("at")) else None)

    def _attempt(self, final, deadline, flushing=False, seen=None):
        """One snapshot taken and sent: its record, that of the one already stored, or None
        when the thread's look (`seen`: the signature it saw) found the files not whole."""
        started = time.time()
        rec = _new_record(final)
        snap, stored, moved = None, None, False
        try:
            if self._pending is not None:
                self._resolve_pending(deadline)
            self._from_restore()
            sig = signature(self.jobdir)
            if self._good is not None and (sig == self._good_sig or (flushing and not sig)):
                stored = dict(self._good, final=bool(final))  # already stored: nothing to send
            elif flushing and not sig:
                rec["ok"] = True  # no checkpoint, none stored: nothing to send
            else:
                snap = _Snapshot(self.jobdir)
                if not snap.sig:
                    raise SnapshotError("the checkpoints were removed before the upload")
                if seen is not None:
                    self._still(snap, seen)
                self._inflight = snap.sig
                self._send(snap, final, deadline, rec)
        except NotYet:
            return None  # (finally: closed) the next look tries again
        except Moved as exc:
            rec["error"], moved = str(exc), True  # the next look takes the newest
        except (agent_upload.UploadError, agent_upload.FileUnreadable, SnapshotError) as exc:
            rec["error"] = str(exc)
        except Exception as exc:  # never raise into the agent
            rec["error"] = "%s: %s" % (type(exc).__name__, exc)
        finally:
            self._inflight = None
            if snap is not None:
                snap.close()
        if stored is not None:  # its own time and duration: when it was stored, how long it took
            self._last = stored
            return stored
        if self._cancel.is_set() and not rec["ok"]:
            rec["error"] = "cut short: a newer checkpoint was waiting (%s)" % rec["error"]
        rec["seconds"] = round(time.time() - started, 3)
        rec["at"] = time.time()
        if rec["error"] is not None:
            rec["error"] = " ".join(str(rec["error"]).split())[:500]
        if rec["ok"] and rec["seq"] is not None:
            self._good = dict(rec)
        self._moved = moved
        self._last = rec
        return rec

    def _still(self, snap, seen):
        """NotYet unless the opened files are those the look saw, whole, and the checkpoints
        have not changed over STILL_S (a save of several files has ended)."""
        if snap.sig != seen:
            raise NotYet("the checkpoints changed while they were opened")
        snap.check_whole(self.settle_s)
        self._stop.wait(STILL_S)
        if signature(self.jobdir) != seen:
            raise NotYet("the checkpoints changed over %.2f s" % STILL_S)

    def _send(self, snap, final, deadline, rec):
        """Upload `snap` into the slot latest.json does not name, then latest.json."""
        seq, slot = self._seq + 1, other_slot(self._slot)
        step, epoch, source = snap.step()
        rec.update(seq=seq, slot=slot, step=step, epoch=epoch)
        limit = agent_upload.upload_limit(self.grant)
        for rel, _, size, _ in snap.files[:snap.checkpoints]:
            if size > limit:
                raise SnapshotError("%s is %d bytes, over the %d-byte upload limit"
                                    % (rel, size, limit))
        started = time.time()
        files = []
        prefix = self.grant["prefix"] + STREAM + slot + "/"
        for i, (rel, f, size, _) in enumerate(snap.files):
            is_log = i >= snap.checkpoints
            if is_log and size > limit:
                continue  # a log too large for one POST: the checkpoint matters more
            try:
                digest = agent_upload._post_with_retries(
                    self.grant, prefix + rel, _Source(f, self._cancel), size, deadline)
            except agent_upload.FileUnreadable as exc:
                if is_log and not self._cancel.is_set():
                    continue  # truncated meanwhile: the snapshot stands without it
                raise SnapshotError("%s: %s" % (rel, exc))
            files.append({"path": rel, "size": size, "sha256": digest})
        moved = snap.changed()
        if moved is not None:
            raise Moved("%s was written to while it was uploaded; not named" % moved)
        total = sum(item["size"] for item in files)
        rec["bytes"] = total
        manifest = {"version": VERSION, "job_id": self.job_id, "seq": seq, "slot": slot,
                    "files": files, "step": step, "epoch": epoch, "step_source": source,
                    "taken_at": snap.taken_at, "uploaded_at": time.time(),
                    "upload_seconds": round(time.time() - started, 3), "bytes": total,
                    "attempt": self.attempt, "final": bool(final)}
        self._pending = (manifest, snap.sig, rec)
        self._resolve_pending(deadline)
        rec["ok"] = True

    def _resolve_pending(self, deadline):
        """POST latest.json for a snapshot whose files are all stored. Until that succeeds
        neither slot is written: S3 may have taken a manifest whose answer was lost, so
        either slot may be the one it names."""
        assert self._pending is not None  # called with one pending
        manifest, sig, rec = self._pending
        data = json.dumps(manifest, sort_keys=True).encode("utf-8")
        agent_upload._post_with_retries(self.grant, self.grant["prefix"] + STREAM + LATEST,
                                        _BytesSource(data), len(data), deadline)
        self._pending = None
        self._seq, self._slot = manifest["seq"], manifest["slot"]
        self._good, self._good_sig = dict(rec, ok=True, error=None), sig
        self._uploads += 1


class _BytesSource(object):
    def __init__(self, data):
        self.data, self.pos = data, 0

    def seek(self, pos, whence=0):
        self.pos = pos

    def read(self, n=-1):
        n = len(self.data) if n is None or n < 0 else n
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out


def main(argv):
    if len(argv) != 3 or argv[0] != "restore":
        print("usage: checkpoint_stream.py restore PLAN JOBDIR", file=sys.stderr)
        return 2
    status = restore(argv[1], argv[2])
    if not status["ok"]:
        print("cloudtrain: checkpoint restore failed: %s" % status["error"], file=sys.stderr)
        return 1
    print("cloudtrain: restored checkpoint %s (step %s, %.1f MB) from the job store in %.1f s"
          % (status["seq"], "unknown" if status["step"] is None else status["step"],
             status["bytes"] / 1e6, status["seconds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
