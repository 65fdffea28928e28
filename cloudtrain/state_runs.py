"""Which run of a job a record is (state.py): the machine it reaches, and whether a job as
stored is still the run a snapshot of it saw. A decision taken on a snapshot lands only on
that run (Store.set_state and Store.update_job's `same_run`)."""

from __future__ import annotations

from typing import Any


def ran_on(host: dict | None) -> dict | None:
    """The record of the machine a job runs or ran on: a job whose files were brought home
    keeps it as `collected_from` (its host record is this machine's from then on)."""
    while host is not None and host.get("collected_from") is not None:
        host = host["collected_from"]
    return host


def _machine(host: dict | None) -> tuple:
    """Which machine a host record reaches (ran_on's): its address, port and host key. Not
    what else the record keeps of the run (its nodes' files brought home, the checkpoint
    stream), which changes while the run goes on."""
    h = ran_on(host) or {}
    return h.get("kind"), h.get("host"), h.get("port"), h.get("host_key")


def same_run_of(now: Any, snapshot: Any) -> bool:
    """Whether `now` (a state.Job as stored) is still the run `snapshot` saw: the same
    attempt on the same machine (AWS Auto Scaling's replacement is another; its attempt is
    counted in the job store), its files brought home since or not."""
    return _machine(now.host) == _machine(snapshot.host) and \
        now.facts.attempt == snapshot.facts.attempt
