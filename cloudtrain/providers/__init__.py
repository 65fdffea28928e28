"""Providers turn a job's resources into hosts and back.

Contract, the same for every provider:
    name                        the backend's name, as `--backend` takes it
    preflight(spec)             refuse early (MissingDependency, UsageError) what cannot run
    ready(spec)                 what a real launch needs beyond the dry run (credentials),
                                checked before it asks or records anything
    plan(spec)                  what launch would do, as (what, value) rows; creates nothing
    question(spec)              what launch says and asks before it goes on: a Question or None
    acquire(store, job, spec)   get a host for the job, recording its instances; -> Host
    setup(host)                 make the host ready for the agent (python3, tmux)
    gpus(spec, host)            GPUs the job's host has (torchrun starts one process each)
    host_for(job)               the host of a job launched earlier (from the store's record)
    jobdir(job_id, host)        where the job's directory is on that host
    data_dir(host)              where datasets are cached on that host
    shutdown(spec)              (command, delay): how the host powers itself off after the job
    agent_settings(spec)        extra job.json settings for the agent (spot notice watch)
    release(store, job, force)  give the host back: nothing may keep billing afterwards
    checkpoint_plan(store, job, expires_s)  the latest checkpoint the job streamed to its job
                                store, as a restore plan for a new host (None: none stored)
    instance_states(store, job) the cloud's view of the job's instances (when its host is lost)
    record_ends(store, job)     termination times and prices from the cloud, for the bill
    cleanup(store, regions)     remove shared resources (group, key pair) nothing uses; with no
                                regions (aws): the store's regions and the configured one
    reconcile(store)            every instance the cloud has tagged as ours, in every region
                                the owner can have one: a Sweep (aws only)
    orphans(store)              live instances tagged with our owner that no active or kept job
                                holds, in every such region: a Sweep whose found is
                                [{id, region, job, type, state, launched_at}] (aws only)
    terminate(region, ids)      terminate those instances (aws only)
    attempt_instances(store, job, n, regions)  live instances of attempt n of a recovering
                                job, {region: [ids]}, by its attempt tag (aws only)
    check_credentials(region)   whether the cloud still accepts the credentials; a
                                CredentialsError if not (aws only)
    configured()                whether this machine may have credentials for it, told
                                without a network call (aws only)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError

BACKENDS = ("local", "aws")


@dataclass
class Question:
    """What `launch` says before it creates anything (a provider's question(spec)), and asks
    in a terminal."""
    text: str | None  # the question's own words (what is bought, at most what it costs)
    warnings: list[str] = field(default_factory=list)  # said on stderr, asked or not
    default: bool = True  # Enter's answer: no where the plan predicts the job fails


@dataclass
class Sweep:
    """A look for what is tagged ours in every region: what was found, the regions that
    answered, those that could not be asked (region -> why), and how the regions were
    chosen. Nothing may be called "all clear" while `unchecked` is not empty."""
    found: object  # per region while sweeping; the caller's list afterwards
    regions: list[str]
    unchecked: dict[str, str]
    chosen_by: str


def get(name: str):
    if name == "local":
        from .local import LocalProvider

        return LocalProvider()
    if name == "aws":
        from .aws import AWSProvider

        return AWSProvider()
    raise UsageError(f"unknown backend '{name}'; known backends: {', '.join(BACKENDS)}")
