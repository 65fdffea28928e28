"""Providers turn a job's resources into hosts and back.

Contract, the same for every provider:
    name                        the backend's name, as `--backend` takes it
    preflight(spec)             refuse early (MissingDependency, UsageError) what cannot run
    acquire(store, job, spec)   get a host for the job, recording its instances; -> Host
    host_for(job)               the host of a job launched earlier (from the store's record)
    jobdir(job_id)              where the job's directory is on that host
    data_dir()                  where datasets are cached on that host
    release(store, job)         give the host back: nothing may keep billing afterwards
"""

from __future__ import annotations

from ..errors import UsageError

BACKENDS = ("local",)


def get(name: str):
    if name == "local":
        from .local import LocalProvider

        return LocalProvider()
    raise UsageError(f"unknown backend '{name}'; known backends: {', '.join(BACKENDS)}")
