"""How far the job's attempt has got, kept in the job store for the launching machine.

Standard library only, Python 3.8+; shipped beside agent.py. Imports auto_scaling (the
attempt job.json says), job_records (the record: progress_doc, progress_key), agent_upload
(posts through the job's grant), safefile (bounded reads) and nothing else of ours.

A job run by an Auto Scaling group goes on while the laptop that launched it is closed: AWS
replaces a reclaimed instance and the replacement resumes from the last streamed checkpoint.
Only stream/latest.json is kept of the checkpoints, and an instance taken back without notice
says nothing more, so the launching machine, back later, cannot tell how far each attempt got
(how many steps the next one redid). Rank 0's agent says it while it can, in
attempts/<n>/progress.json (job_records.py): the step of this run's last metrics row and of
the newest checkpoint it streamed. One writer (job_records.progress_doc, posted by
Progress.post), one checker (job_records.check_progress, where the launching machine reads it).

    Progress.for_job(jobdir, settings, conf, checkpoint, log)   rank 0 of a group's job, or None
    start()            a thread that posts when the figures changed, at most every PROGRESS_S
    now()              at once, whatever the last post's age (a spot notice)
    finish(timeout_s)  the run's end: the thread stopped, the last figures posted

Nothing here may stop or slow the job: a post that fails is said once in output.log, and the
next one tries again.
"""

import json
import os
import stat
import threading
import time

from . import agent_upload, auto_scaling, job_records, safefile

# S3 bills each POST; one every 30 s is about 3,000 a day (well under a cent). An instance
# taken back without notice loses at most this much of the record's figures.
PROGRESS_S = 30.0
LOOK_S = 1.0  # how often the thread reads the metrics' tail (a local read)
TAIL_BYTES = 65536  # of metrics.jsonl, read from its end: the last row is in there
POST_TIMEOUT_S = 20.0
FINAL_S = 5.0  # the least a run's last record gets, where it carries a spend
METRICS = "metrics.jsonl"


def file_size(path):
    """The size of the regular file at `path` (not a link), else 0."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def last_step(path, start=0):
    """The step of the last metrics row (a JSON object with an int "step", not an event) in
    the part of metrics.jsonl from byte `start` on (the rows this run wrote), read from its
    last TAIL_BYTES only; None where there is none. A file shorter than `start` was replaced
    or cut since: all of it is then this run's."""
    try:
        data, size = safefile.read_tail(path, TAIL_BYTES)
    except OSError:  # none yet, or not a regular file (the job may plant anything there)
        return None
    if size < start:
        start = 0
    skip = start - (size - len(data))
    if skip > 0:
        data = data[skip:]
    for line in reversed(data.splitlines()):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # a line being written, or cut by the window
            continue
        if isinstance(row, dict) and "event" not in row and \
                job_records.as_step(row.get("step")) is not None:
            return row["step"]
    return None


class Progress:
    """One run's progress record (attempt `attempt`, at `key`), posted through `grant`.
    `checkpoint()` returns the checkpoint stream's last upload record ({"ok", "step", ...})
    or None; `log(line)` says a failure in output.log."""

    def __init__(self, jobdir, grant, key, attempt, checkpoint=None, log=None, spend=None):
        self.metrics = os.path.join(jobdir, METRICS)
        self.since = file_size(self.metrics)  # rows before this are runs before (a restore)
        self.grant, self.key, self.attempt = grant, key, attempt
        self.checkpoint = checkpoint or (lambda: None)
        # A job with a budget: spend(final) is the attempt's {"usd", "rate", "final"}
        # (host/budget.py), posted with the figures; None without one.
        self.spend = spend or (lambda final=False: None)
        self.final = False  # the run has ended: its spend runs to the power-off
        self.log = log or (lambda line: None)
        self.checkpoint_step = None  # of the newest checkpoint streamed in this run
        self.posted = None  # the figures last stored
        self.tried_at = None  # when a post was last tried
        self.failed = False  # said once until a post succeeds again
        self.lock = threading.Lock()  # one post at a time
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread = None

    @classmethod
    def for_job(cls, jobdir, settings, conf, checkpoint=None, log=None, spend=None):
        """The run's Progress where job.json is rank 0's of a job run by a group (`conf`:
        its auto_scaling, checked) with a grant and an attempt; None otherwise."""
        grant = settings.get("results_store")
        n = auto_scaling.attempt_number(settings)
        if conf is None or conf.get("rank") or n is None or not agent_upload.writable(grant):
            return None
        return cls(jobdir, dict(grant, prefix=conf["prefix"]),
                   job_records.progress_key(conf["prefix"], n), n, checkpoint, log, spend)

    def figures(self):
        """(the step of this run's last metrics row, the newest checkpoint step streamed, the
        attempt's spend or None)."""
        rec = self.checkpoint()
        step = job_records.as_step(rec.get("step")) if isinstance(rec, dict) and \
            rec.get("ok") is True else None
        if step is not None and (self.checkpoint_step is None or step > self.checkpoint_step):
            self.checkpoint_step = step
        spend = self.spend(self.final)
        return last_step(self.metrics, self.since), self.checkpoint_step, spend

    def post(self, timeout_s=POST_TIMEOUT_S):
        """Store the figures where they changed since the last post; whether it did."""
        if not self.lock.acquire(timeout=max(0.0, timeout_s)):
            return False
        try:
            figures = self.figures()
            if figures == self.posted or figures == (None, None, None):
                return False
            self.tried_at = time.time()
            doc = job_records.progress_doc(self.attempt, figures[0], figures[1],
                                           usd=figures[2])
            try:
                agent_upload.post_json(self.grant, self.key, doc, max(1.0, timeout_s))
            except Exception as exc:  # noqa: BLE001 - UploadError, a bad grant: said once
                if not self.failed:
                    self.log("the attempt's progress was not stored: %s" % exc)
                self.failed = True
                return False
            self.posted, self.failed = figures, False
            return True
        finally:
            self.lock.release()

    def _run(self):
        while not self.stopping.is_set():
            urgent = self.wake.wait(LOOK_S)
            self.wake.clear()
            if self.stopping.is_set():
                return
            if urgent or self.tried_at is None or time.time() - self.tried_at >= PROGRESS_S:
                self.post()

    def start(self):
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="progress", daemon=True)
            self.thread.start()
        return self

    def now(self):
        """Post at once (from the thread): a spot notice."""
        self.wake.set()

    def finish(self, timeout_s):
        """The run has ended: the thread stopped, the figures as they are now posted within
        `timeout_s`. Whether they are stored."""
        deadline = time.time() + max(0.0, timeout_s)
        self.final = True
        self.stopping.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join(max(0.0, deadline - time.time()))
        # A spend changes with every second: a post that went up is the answer. The last one
        # gets a few seconds even when the checkpoint's upload took the time (a budget counts
        # an attempt without its end as running on).
        return self.post(max(deadline - time.time(), FINAL_S if self.spend() else 0.0)) \
            or self.posted == self.figures()
