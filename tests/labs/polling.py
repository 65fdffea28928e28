"""Waiting for something to happen: the one polling loop of the tests and labs."""

from __future__ import annotations

import time

# The share of a wait that its polls may take. A cheap predicate (a file read) is polled
# every `interval`; one that runs a `cloudtrain` command (a Python process: 0.3 to 1 s of a
# core) waits twice its own time between polls. Polled back to back, the suite's waits on
# `status` took most of a core from the jobs they waited for on the 2-core CI machine.
BUSY = 1 / 3


def wait_for(predicate, timeout=20.0, interval=0.1, what="condition", busy=BUSY):
    """`predicate()`'s first truthy value, polled every `interval` seconds, or less often
    where a poll takes long: no more than `busy` of the time goes to polls. AssertionError
    naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        started = time.monotonic()
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        spent = now - started
        time.sleep(min(max(interval, spent * (1 - busy) / busy), deadline - now))
