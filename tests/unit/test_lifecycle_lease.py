"""lifecycle/lease.py alone: a stop signal during a launch ends it as an interruption, whatever
error the code it landed in made of it."""

from __future__ import annotations

import os
import signal

import pytest

from cloudtrain.lifecycle import lease


def _signal_turned_into(error: Exception, sig=signal.SIGTERM):
    """Inside the block: the signal arrives, and the code it landed in raises `error` instead
    of letting its KeyboardInterrupt through (as CPython's import machinery does)."""
    try:
        os.kill(os.getpid(), sig)
    except KeyboardInterrupt:
        raise error from None
    raise AssertionError("the signal did not interrupt")


@pytest.mark.parametrize("sig, kind", [(signal.SIGTERM, lease.LaunchInterrupted),
                                       (signal.SIGHUP, lease.LaunchInterrupted),
                                       (signal.SIGINT, KeyboardInterrupt)])
def test_F13_a_signal_that_became_another_error_is_still_the_launchs_interruption(sig, kind):
    """F13 (CI, -n 3): SIGTERM at the launch's sync landed inside an import, CPython raised
    TypeError "expected a message argument" in its place, and the launch ended `failed: ...`
    with exit 1, where a signal ends it cancelled with 130."""
    with lease.signals_interrupt():
        try:
            _signal_turned_into(TypeError("expected a message argument"), sig)
        except TypeError as exc:
            ended = lease.interruption(exc)
    assert isinstance(ended, kind)
    assert isinstance(ended.__cause__, TypeError)
    if kind is lease.LaunchInterrupted:
        assert ended.signame == signal.Signals(sig).name


def test_without_a_signal_an_error_is_the_error():
    error = TypeError("a real one")
    with lease.signals_interrupt():
        assert lease.interruption(error) is error
    interrupted = KeyboardInterrupt()
    with lease.signals_interrupt():
        assert lease.interruption(interrupted) is interrupted


def test_a_signal_of_an_earlier_launch_is_not_this_ones():
    with lease.signals_interrupt():
        try:
            _signal_turned_into(ValueError("x"))
        except ValueError:
            pass
    error = ValueError("later")
    assert lease.interruption(error) is error
    with lease.signals_interrupt():
        assert lease.interruption(error) is error
