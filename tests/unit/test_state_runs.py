"""cloudtrain/state_runs.py: which run of a job a record is (F13: a decision on a snapshot of
one run never lands on the run after it)."""

from __future__ import annotations

from types import SimpleNamespace

from cloudtrain.state_runs import ran_on, same_run_of

SSH = {"kind": "SSHHost", "host": "10.0.0.4", "port": 22, "user": "ubuntu", "host_key": "k1"}


def _job(host, attempt=1):
    return SimpleNamespace(host=host, facts=SimpleNamespace(attempt=attempt))


def test_F13_ran_on_follows_files_brought_home_once_or_twice():
    home = {"kind": "LocalHost", "collected_from": SSH, "remote_jobdir": "/j"}
    assert ran_on(home) == SSH and ran_on({**home, "collected_from": home}) == SSH
    assert ran_on(SSH) == SSH and ran_on(None) is None


def test_F13_the_same_run_is_the_same_attempt_on_the_same_machine():
    seen = _job(SSH)
    assert same_run_of(_job({**SSH, "checkpoint_stream": True}), seen)  # the run goes on
    assert same_run_of(_job({"kind": "LocalHost", "collected_from": SSH}), seen)  # came home
    assert same_run_of(_job({**SSH, "nodes": [{"collected": True}]}), seen)
    assert not same_run_of(_job(SSH, attempt=2), seen)  # a relaunch at the same address
    assert not same_run_of(_job({**SSH, "host_key": "k2"}), seen)  # AWS's replacement
    assert not same_run_of(_job({**SSH, "host": "10.0.0.5"}), seen)
