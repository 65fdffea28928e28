"""tests/labs/polling.py: the one polling loop of the tests and labs."""

from __future__ import annotations

import time

import pytest

from labs.polling import wait_for


def test_a_cheap_predicate_is_polled_every_interval():
    calls = []

    def ready():
        calls.append(time.monotonic())
        return len(calls) == 6 and "yes"

    assert wait_for(ready, timeout=5, interval=0.05) == "yes"
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert all(0.045 <= g < 0.5 for g in gaps), gaps


def test_a_slow_predicate_takes_no_more_than_a_third_of_the_wait():
    """A poll that runs a `cloudtrain` command takes a core for a fraction of a second:
    the next comes twice its time later, not `interval` later."""
    calls = []

    def slow():
        calls.append(time.monotonic())
        time.sleep(0.1)
        return len(calls) == 4

    assert wait_for(slow, timeout=10, interval=0.01)
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert all(g >= 0.29 for g in gaps), gaps  # 0.1 s polling, then 0.2 s asleep


def test_a_timeout_names_what_was_awaited_after_a_last_poll_at_the_deadline():
    calls = []
    started = time.monotonic()
    with pytest.raises(AssertionError, match="timed out waiting for the moon"):
        wait_for(lambda: calls.append(time.monotonic()), timeout=0.3, interval=0.2,
                 what="the moon")
    assert len(calls) == 3 and calls[-1] - started >= 0.3, calls
