"""One dataset's download from S3: `workers` threads fetch ranges, finishers place the files.

Standard library only, Python 3.8+; shipped beside stager.py, which runs a DatasetRun for each
dataset of kind shards or objects. Imports safefile, shards and the stager's lower modules
(stage_plan, awsapi, stage_fetch), never stager itself: the stager is handed in.

    DatasetRun(stager, dataset, rec, t0, staging).go()

A shard is extracted in a process of its own (shards.extract_shard: its files appear only
once the whole shard matched its sha256); an object of kind objects is checked (size, md5)
and renamed into place.
"""

import errno
import hashlib
import multiprocessing
import multiprocessing.pool
import os
import queue
import signal
import threading
import time

from . import safefile, shards
from .stage_fetch import Source, Stopped
from .stage_plan import StageError, disk_reason
from .awsapi import object_url


class Job:
    """One object to download into a temp file: a shard, or one file of kind objects."""

    def __init__(self, index: int, src: Source, size: int, tmp: str, item):
        self.index, self.src, self.size, self.tmp, self.item = index, src, size, tmp, item
        self.fd: int | None = None
        self.left = 0


class DatasetRun:
    """One dataset's download: `workers` threads fetch ranges, 2 threads finish files."""

    def __init__(self, stager, d: dict, rec: dict, t0: float, staging: str):
        """`stager`: the stager.Stager running the plan (its stop event, signal, fetcher,
        workers, extractors, part size, progress); `d`: the checked dataset, its dest the
        folder to fill; `rec`: its record in the status; `staging`: a folder for downloads."""
        self.s, self.d, self.rec, self.t0, self.staging = stager, d, rec, t0, staging
        self.dest = d["dest"]
        self.shown = d.get("_shown_dest", self.dest)  # the folder the user knows it by
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self.tasks: queue.Queue = queue.Queue()
        self.finish_q: queue.Queue = queue.Queue()
        self.queued = 0  # range tasks not yet taken by a worker
        self.unfinished = 0  # downloaded jobs not yet extracted / placed
        self.open_jobs = 0
        self.opened: list = []
        self.pool: multiprocessing.pool.Pool | None = None  # extraction processes (shards)
        self.root = os.path.realpath(self.dest)

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()
        self.s.stop.set()

    def counted(self, n: int) -> None:
        with self.cond:
            self.rec["bytes_done"] += n

    def jobs(self):
        d = self.d
        presigned = d["auth"] == "presigned"
        region, bucket, endpoint = d["region"], d["bucket"], d.get("endpoint")
        prefix = d.get("prefix", "").strip("/")
        if d["kind"] == "shards":
            for i, entry in enumerate(d["_manifest"].shards):
                key = "%s/shards/%s" % (prefix, entry.name) if prefix else "shards/" + entry.name
                url = d["shard_urls"][i] if presigned else object_url(bucket, key, region,
                                                                      endpoint)
                src = Source(bucket, key, url, region, self.s.role, presigned)
                yield Job(i, src, entry.bytes, os.path.join(self.staging, entry.name), entry)
        else:
            for i, o in enumerate(d["objects"]):
                url = o["url"] if presigned else object_url(bucket, o["key"], region, endpoint)
                src = Source(bucket, o["key"], url, region, self.s.role, presigned)
                yield Job(i, src, o["bytes"], os.path.join(self.staging, "obj-%d" % i), o)

    def go(self) -> None:
        s = self.s
        s.stop.clear()
        finishers = 2
        if self.d["kind"] == "shards":
            # Forked before any thread of this run starts (a fork copies no lock held by
            # another thread); `fork` also works where the script runs as __main__.
            finishers = s.extractors
            self.pool = extraction_pool(finishers)
        threads = [threading.Thread(target=self.worker, name="stage-get-%d" % i, daemon=True)
                   for i in range(s.workers)]
        threads += [threading.Thread(target=self.finisher, name="stage-put-%d" % i,
                                     daemon=True) for i in range(finishers)]
        for t in threads:
            t.start()
        last = time.monotonic()
        try:
            for job in self.jobs():
                with self.cond:
                    while self.error is None and s.signum is None and not (
                            self.queued < s.workers and self.unfinished <= finishers):
                        self.cond.wait(0.2)
                        last = self._tick(last)
                    if self.error is not None or s.signum is not None:
                        break
                self.open(job)
                last = self._tick(last)
            with self.cond:
                while self.error is None and s.signum is None and self.open_jobs > 0:
                    self.cond.wait(0.2)
                    last = self._tick(last)
        finally:
            s.stop.set()
            for _ in range(s.workers):
                self.tasks.put(None)
            for _ in range(finishers):
                self.finish_q.put(None)
            s.fetcher.interrupt()
            if self.pool is not None:  # an extraction under way is cut off: its shard's
                self.pool.terminate()  # files never appeared (they land only when whole)
                self.pool.join()
                self.pool = None
            deadline = time.monotonic() + 1.5
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            for job in self.opened:
                if job.fd is not None:
                    try:
                        os.close(job.fd)
                    except OSError:
                        pass
                    job.fd = None
        s.check_signal()
        if self.error is not None:
            err = self.error
            if isinstance(err, StageError):
                raise err
            if isinstance(err, OSError):
                raise StageError(self.disk_reason(err)) from None
            raise err
        if self.open_jobs:
            raise StageError("staging stopped with %d files unfinished" % self.open_jobs)

    def disk_reason(self, exc: OSError) -> str:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "no space left on %s after %d of %d bytes: give the instance a larger " \
                   "disk (--disk-gb)" % (self.shown, self.rec["bytes_done"],
                                         self.rec["bytes_total"])
        return disk_reason(exc)

    def _tick(self, last: float) -> float:
        now = time.monotonic()
        if now - last >= self.s.progress_s:
            self.s.progress(self.rec, self.t0)
            return now
        return last

    def open(self, job: Job) -> None:
        try:
            job.fd = os.open(job.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            self.fail(exc)
            return
        self.opened.append(job)
        ranges = [(a, min(self.s.part, job.size - a)) for a in range(0, job.size, self.s.part)]
        if not ranges:
            ranges = [(0, 0)]
        with self.cond:
            job.left = len(ranges)
            self.open_jobs += 1
            self.queued += len(ranges)
        for a, n in ranges:
            self.tasks.put((job, a, n))

    def worker(self) -> None:
        while True:
            task = self.tasks.get()
            if task is None:
                return
            job, start, length = task
            with self.cond:
                self.queued -= 1
                self.cond.notify_all()
            if self.s.stop.is_set():
                continue
            try:
                self.s.fetcher.fetch(job.src, job.fd, start, length, job.size, self.counted)
            except Stopped:
                continue
            except BaseException as exc:
                self.fail(exc)
                continue
            with self.cond:
                job.left -= 1
                complete = job.left == 0
                if complete:
                    self.unfinished += 1
            if complete:
                try:
                    os.close(job.fd)
                except OSError as exc:
                    self.fail(exc)
                    continue
                job.fd = None
                self.finish_q.put(job)

    def finisher(self) -> None:
        while True:
            job = self.finish_q.get()
            if job is None:
                return
            if self.s.stop.is_set():
                continue
            try:
                files = self.finish(job)
            except Stopped:
                continue
            except ValueError as exc:
                self.fail(StageError(str(exc).splitlines()[0] if str(exc) else "bad data"))
                continue
            except BaseException as exc:
                self.fail(exc)
                continue
            finally:
                try:
                    os.unlink(job.tmp)
                except OSError:
                    pass
            with self.cond:
                self.unfinished -= 1
                self.open_jobs -= 1
                self.rec["files_done"] += files
                self.cond.notify_all()

    def finish(self, job: Job) -> int:
        if self.d["kind"] == "shards":  # in the pool; make_folders takes folders made meanwhile
            assert self.pool is not None  # made in run() for shards
            pending = self.pool.apply_async(_extract, (job.tmp, self.dest, job.item))
            # A pool replaces a worker that died (killed, out of memory) but not its task:
            # never wait for ever. A shard extracts at tens of MB/s at the very least.
            deadline = time.monotonic() + 600 + job.size / 10e6
            while True:
                try:
                    return pending.get(0.5)
                except multiprocessing.TimeoutError:
                    if self.s.stop.is_set():
                        raise Stopped() from None
                    if time.monotonic() > deadline:
                        raise StageError("extracting %s did not finish (its process died?)"
                                         % job.item.name) from None
        o = job.item
        size = os.path.getsize(job.tmp)
        if size != o["bytes"]:
            raise ValueError("%s is %d bytes, not the %d listed" % (job.src.name, size,
                                                                   o["bytes"]))
        if o.get("md5") and not job.src.etag_not_md5:
            h = hashlib.md5()
            with open(job.tmp, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            if h.hexdigest() != o["md5"]:
                raise ValueError("%s is not what its listing says: md5 %s, not %s" % (
                    job.src.name, h.hexdigest(), o["md5"]))
        parts = o["path"].split("/")
        try:
            parent = safefile.make_folders(self.root, parts[:-1])
        except safefile.NotFolder as exc:
            raise ValueError("%r cannot be written: %r in the destination is a link or a file, "
                             "not a folder" % (o["path"][:200],
                                               exc.filename[len(self.root) + 1:][:200])) from None
        os.replace(job.tmp, os.path.join(parent, parts[-1]))
        return 1


_STOPS = {signal.SIGINT, signal.SIGTERM}


def extraction_pool(processes: int) -> multiprocessing.pool.Pool:
    """`processes` extraction processes, each born with SIGINT and SIGTERM blocked until
    _extractor_signals has set them. A forked process starts with the stager's handlers
    (they only note the signal): a Pool.terminate() that reached one before its initializer
    ran was noted and dropped, and the process then waited for work forever on a queue lock
    terminate() held, while the stager waited to join it (a stage stopped or failed at its
    start hung). Blocked, the SIGTERM waits until the default action is back, and kills."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:  # the pool's threads (which start its later processes) inherit the mask
        return multiprocessing.get_context("fork").Pool(processes,
                                                        initializer=_extractor_signals)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _extractor_signals() -> None:
    """An extraction process leaves SIGINT (sent to the whole group) to the stager, which
    stops it itself, and dies of a SIGTERM (the stager's terminate())."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


def _extract(tmp: str, dest: str, entry) -> int:
    with open(tmp, "rb") as f:
        return shards.extract_shard(f, dest, entry)
