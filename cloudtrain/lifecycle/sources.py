"""Stage: a launch's sources, what a new job takes from an earlier one: `--on JOB` (the
kept instance it runs on, or waits for behind the job there, its files the baseline of the
sync) and `--resume-from JOB` (the
checkpoints it starts from). Both are checked before anything is launched (plan and launch
call the same checks). It may call watch (to learn of an earlier job's end), kept and group.

    kept_source(store, spec)              the job whose kept instance `--on` reuses, or
                                          queues behind
    resume_source(store, settings, spec)  the job whose checkpoints `--resume-from` takes
    remote_jobdir(job)                    where a job's directory is on its host
    copy_checkpoints(source, host, jobdir)  the source's checkpoints into the new job
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path

from .. import config, state
from ..errors import UsageError
from ..hosts import Host
from ..local_host import LocalHost
from ..market import Market
from ..spec import JobSpec
from ..state import Job, Store
from . import group, kept
from .watch import refresh

CHECKPOINT_COPY_TIMEOUT_S = 3600.0  # `--on` with --resume-from: copying GBs on the host


def kept_source(store: Store, spec: JobSpec) -> tuple[JobSpec, Job | None]:
    """The job whose kept instance `--on` reuses: the one that holds it now (the job named,
    or the later job it was handed over to). Ended: this job takes the instance over. Running
    (a queue as SkyPilot's `exec`): this job waits behind it, and behind the jobs queued
    there already, on the instance. What was found goes in the spec: the instance, its
    type, market, region and disk, the jobs ahead (spec.kept), and, unless given, the
    instance's idle time (its holder's); --on keeps the instance unless --no-keep said.
    Returns that spec and the job."""
    if not spec.on_job:
        return spec, None
    settings = config.Settings.load()
    named = store.find_job(spec.on_job)
    if named.active:  # learn of an end nobody has seen yet
        named = refresh(store, settings, named)
    if named.backend != spec.backend:
        raise UsageError(f"--on {named.id}: that job ran on {named.backend}, not {spec.backend}")
    inst = kept.instance_of(store, named)
    if inst is None:
        if named.active:
            raise UsageError(f"--on {named.id}: the job is still {named.state}; wait until it "
                             f"runs, or `cloudtrain down {named.id}`")
        raise UsageError(f"--on {named.id}: its instance is gone (launch it with --keep to "
                         "reuse it)")
    holder = store.job(inst.job_id)
    if holder.active and holder.state != state.QUEUED:
        holder = refresh(store, settings, holder)
        inst = kept.instance_of(store, named) or inst
        holder = store.job(inst.job_id)
    ahead = []
    if holder.active:
        if holder.state not in (state.RUNNING, state.STAGING):
            raise UsageError(f"--on {named.id}: job {holder.id} on its instance is still "
                             f"{holder.state}; wait until it runs, or `cloudtrain down "
                             f"{holder.id}`")
        ahead = [holder] + kept.queued_on(store, inst.id)
    return _on_the_instance(spec, settings, inst, holder, ahead), holder


def _on_the_instance(spec: JobSpec, settings: config.Settings, inst, holder: Job,
                     ahead: list[Job]) -> JobSpec:
    """The spec of a job `--on` an instance: where it runs, how long it may wait there."""
    now = time.time()
    wait = sum(max(0.0, (j.started_at or now) + float(j.spec.max_runtime_s or 0)
                   - now) if j.state != state.QUEUED else
               float(j.spec.max_runtime_s or 0) for j in ahead)
    before = holder.spec
    last = ahead[-1].spec if ahead else before
    idle = spec.idle_minutes
    if spec.keep and idle is None:
        idle = last.idle_minutes if last.idle_minutes is not None else \
            settings.keep_idle_minutes
    return spec.changed(
        kept={"instance": inst.id, "type": inst.instance_type, "region": inst.region,
              "holder": holder.id, "ahead": [j.id for j in ahead], "wait_s": wait,
              "made_kept": [j.id for j in ahead if not j.keeps_instance]},
        instance_type=inst.instance_type or before.placement.instance_type,
        market=Market(inst.market or before.placement.market or Market.ON_DEMAND),
        region=inst.region or before.placement.region,
        disk_gb=spec.placement.disk_gb or before.placement.disk_gb, idle_minutes=idle)


def resume_source(store: Store, settings: config.Settings, spec: JobSpec) -> Job | None:
    """The job whose checkpoints `--resume-from` takes: ended, the same recipe, started,
    its checkpoint written with the arguments this run has."""
    if not spec.resume_from:
        return None
    # Refreshed first: a job whose instance went away unseen has its checkpoints in the job
    # store, and its end is learnt (and its files brought home) here.
    source = refresh(store, settings, store.find_job(spec.resume_from))
    if source.active:  # refreshed just now: it really is still running
        raise UsageError(f"--resume-from {source.id}: the job is still {source.state}",
                         hint=f"wait for its end (cloudtrain logs {source.id} --follow), or "
                              f"stop it: cloudtrain down {source.id}")
    if source.recipe != spec.recipe:
        raise UsageError(f"--resume-from {source.id}: that job ran {source.command}, "
                         f"not recipe {spec.recipe}")
    if not source.jobdir:
        raise UsageError(f"--resume-from {source.id}: the job never started, so it has no checkpoint")
    _check_resumable(source, spec)
    return source


def _check_resumable(source: Job, spec: JobSpec) -> None:
    """The arguments the recipe's checkpoint is tied to (recipe.yaml `resume_must_match`)
    are the same in both jobs, checked before anything is launched: the recipe itself
    would refuse only once its instance is up, e.g. resnet9's "checkpoints/last.pt is for 2
    epochs, this run asks for 4"."""
    from .. import recipes

    assert spec.recipe is not None  # a recipe job's resume
    rec = recipes.load(spec.recipe)
    before = source.spec.args or {}
    for key in rec.resume_must_match:
        old, new = before.get(key), spec.args.get(key)
        if old != new:
            def said(value):
                return "the recipe's default" if value is None else f"{key}={value}"

            raise UsageError(f"--resume-from {source.id}: its checkpoint was written with "
                             f"{said(old)}, this run has {said(new)}; recipe {rec.name} "
                             f"resumes only with the same {key}",
                             hint=f"--set {key}={old}" if old is not None else
                             f"leave out --set {key}")


def remote_jobdir(job: Job) -> str | None:
    """Where a job's directory is on its host, also after its files were collected home."""
    return (job.host or {}).get("remote_jobdir") or job.jobdir


def copy_checkpoints(source: Job, host: Host, jobdir: str) -> None:
    """The source job's checkpoints into the new job: copied on the host they share, or
    sent from this machine where they were collected (a cloud job's, after it ended)."""
    source_host = group.host_of(source)
    src = f"{source.jobdir}/checkpoints"
    found = source_host.run(f"test -d {shlex.quote(src)} && ls -A {shlex.quote(src)}",
                            check=False).stdout.split()
    if not found:
        raise UsageError(f"--resume-from {source.id}: it saved no checkpoint"
                         + ("" if source.backend == "local" else
                            " that was brought home (its instance is gone)"))
    if source_host.describe() == host.describe():
        host.run(f"cp -a {shlex.quote(src)}/. {shlex.quote(jobdir)}/checkpoints/",
                 timeout=CHECKPOINT_COPY_TIMEOUT_S)
    elif isinstance(source_host, LocalHost):
        host.sync(Path(src), f"{jobdir}/checkpoints")
    else:
        raise UsageError(f"--resume-from {source.id}: its checkpoints are still on its own "
                         f"instance; wait until it ends (they are brought home then)")
