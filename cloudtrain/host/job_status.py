"""The job's status as the agent records it, and guarded reads of what a job may write.

Standard library only, Python 3.8+; shipped beside agent.py. The orchestrator reads the same
states and helpers (hostdata, render, curves, lifecycle.collect). Imports safefile and nothing
else of ours.

    STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED, PREEMPTED; ACTIVE   status.json's states
    read_json(path, default)   a JSON object from the job directory, bounded, no link followed
    as_pid(v), as_time(v)      a value read back from there, checked
    clean_text(text, limit)    text read back (a job's, a record's) as one line to show
    save_status(path, status)  a status decided from outside the agent, written atomically
    metrics_tail(jobdir)       the latest metrics row and the events that matter
    fmt_duration(seconds)      1h02m03s, as reasons and messages say it
"""

import json
import math
import os
import time
import unicodedata

from . import safefile

# In a job directory an instance fills itself (bootstrap.py, an Auto Scaling replacement's):
# {"stage": "booting", "pid"} while it restores the job, then how it ended.
BOOT_STATUS = "bootstrap-status.json"

# Agent states as written to status.json. "starting" is before run.sh has a pid.
STARTING, RUNNING = "starting", "running"
SUCCEEDED, FAILED, CANCELLED, PREEMPTED = "succeeded", "failed", "cancelled", "preempted"
STOPPED = "stopped"  # ended by a limit of the job's own before it could cross it: its budget
ACTIVE = (STARTING, RUNNING)
# A node of a job on several nodes that leaves its part to meet the others (host/regroup.py):
# the stop's state, never written to status.json (which says running meanwhile).
REGROUP = "regrouping"

METRICS_TAIL_BYTES = 65536
METRICS_SCAN_BYTES = 16 << 20
JSON_MAX_BYTES = 4 << 20  # status.json and the other small JSON files a job can write to


def now():
    """The wall clock (status.json's times are seconds since the epoch)."""
    return time.time()


def read_json(path, default=None):
    """A JSON object from a file of the job directory (JSON_MAX_BYTES at most), or `default`
    when there is none (safefile.read_json)."""
    return safefile.read_json(path, JSON_MAX_BYTES, default)


def as_pid(value):
    """A positive int pid, or None (status.json may hold "abc", 0, -1, true or a list)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < (1 << 31):
        return None
    return value


def as_time(value, default=None):
    """A finite number of seconds, or `default`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    try:
        value = float(value)
    except OverflowError:
        return default
    return value if math.isfinite(value) else default


# Unicode categories dropped from text read back: controls (terminal escapes), format
# characters (bidi overrides), surrogates, and line/paragraph separators.
HIDDEN = ("Cc", "Cf", "Cs", "Zl", "Zp")


def clean_text(text, limit):
    """One line, no control characters (terminal escapes included), at most `limit` chars."""
    text = text[:limit * 4]
    text = "".join(" " if c in "\r\n\t" else c for c in text
                   if c in "\r\n\t" or unicodedata.category(c) not in HIDDEN)
    return text[:limit]


def save_status(path, status):
    """Record a status decided from outside the agent (probe, stop, reap). A job directory
    that is gone, or a status.json that is no file any more, does not change the answer."""
    try:
        safefile.write_json(path, status)
    except OSError:
        pass


def fmt_duration(seconds):
    """Whole seconds as 1h02m03s, 4m05s or 6s."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return "%dh%02dm%02ds" % (h, m, s) if h else ("%dm%02ds" % (m, s) if m else "%ds" % s)


def metrics_tail(jobdir):
    """The latest metrics row (not an event row), the first target_reached event and the
    last runs_summary event. Rows come from the tail; the events from the whole file (up to
    METRICS_SCAN_BYTES), since a target reached early in a long run is far from the end."""
    path = os.path.join(jobdir, "metrics.jsonl")
    try:  # a FIFO or a link to /dev/zero planted there is refused at once
        data, _ = safefile.read_tail(path, METRICS_SCAN_BYTES)
    except OSError:
        return None, None, None
    latest, target, summary = None, None, None
    tail_from = len(data) - METRICS_TAIL_BYTES
    offset = 0
    for line in data.splitlines(True):
        start, offset = offset, offset + len(line)
        if start < tail_from and b'"event"' not in line:
            continue  # an old plain row: only the newest matters
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a line cut by the window or being written; or deep nesting
        if not isinstance(row, dict):
            continue
        if row.get("event") == "target_reached":
            target = target or row
        elif row.get("event") == "runs_summary":
            summary = row
        elif "event" not in row:
            latest = row
    return latest, target, summary
