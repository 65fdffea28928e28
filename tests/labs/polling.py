"""Waiting for something to happen: the one polling loop of the tests and labs."""

from __future__ import annotations

import time


def wait_for(predicate, timeout=20.0, interval=0.1, what="condition"):
    """`predicate()`'s first truthy value, polled every `interval` seconds; AssertionError
    naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
