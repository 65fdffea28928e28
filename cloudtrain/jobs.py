"""The job lifecycle, the same for every backend:

    launch ─► provision ─► sync ─► setup ─► run (agent in tmux) ─► collect ─► release

Every transition is an event row in the state store; that timeline is what `status` shows.
This module talks to hosts only through `Host` and to clouds only through a provider; it
never imports boto3 or paramiko.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from . import config, providers, state
from .agent import pid_alive
from .errors import CloudtrainError, HostError, UsageError
from .hosts import Host, LocalHost
from .spec import COMMAND, RECIPE, JobSpec
from .state import Job, Store

FOLLOW_POLL_S = 0.2
REFRESH_EVERY_S = 1.0


def plan(spec: JobSpec, store: Store | None = None) -> list[tuple[str, str]]:
    """What `launch` would do for this spec (`--dry-run`): nothing is created or billed."""
    rows = [("job", spec.display()), *providers.get(spec.backend).plan(spec)]
    row = expected(spec, store)
    if row is not None:
        from .render import estimate_line

        rows.append(("estimate", estimate_line(row, spec.market)[len("estimate: "):]))
    return rows


def expected(spec: JobSpec, store: Store | None = None):
    """The estimate (time and cost) of a cloud recipe job on its instance type, from the
    recipe's published result (estimate.py); None where there is no basis for one."""
    if spec.backend != "aws" or spec.on_job:
        return None
    from . import estimate

    try:
        region = providers.get(spec.backend).region(spec)
    except CloudtrainError:
        return None
    row = estimate.for_spec(spec, region, store)
    if row is not None:  # kept with the job, so `status JOB` can set it against the bill
        spec.expected = {"train_s": row.train_s, "total_s": row.total_s, "market": spec.market,
                         "usd": row.spot if spec.market == "spot" else row.on_demand,
                         "basis": row.scaling}
    return row


def run_script(spec: JobSpec, jobdir: str, python: str, procs: int = 1) -> str:
    """The job's run.sh: cd into place and exec the command (no shell quoting games in tmux).
    A torchrun recipe on `procs` > 1 processes starts under torchrun, one process per GPU
    (`--standalone`: a private rendezvous on a free local port)."""
    lines = ["#!/usr/bin/env bash", f"# cloudtrain job: {spec.display()}", "set -e"]
    if spec.kind == RECIPE:
        from . import recipes

        rec = recipes.load(spec.recipe)
        lines.append(f"cd {shlex.quote(jobdir)}")
        starter = [python]
        if procs > 1:
            starter = [python, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc_per_node={procs}"]
        lines.append("exec " + shlex.join([*starter, rec.entry_path(),
                                           *rec.script_args(spec.args)]))
    else:
        lines.append(f"cd {shlex.quote(jobdir + '/work')}")
        if len(spec.command) == 1:
            lines.append(spec.command[0])  # one string: the user's shell code, as written
        else:
            lines.append("exec " + shlex.join(spec.command))
    return "\n".join(lines) + "\n"


def job_environment(job_id: str, data_dir: str, host: Host, gpus: int = 0, procs: int = 1
                    ) -> dict:
    """Environment for the job. On this machine the tmux server may be older than this
    shell, so what the job needs from the launching environment (PATH with its virtualenv)
    is passed here; a remote host keeps its own."""
    env = {"CLOUDTRAIN_JOB_ID": job_id, "CLOUDTRAIN_DATA_DIR": data_dir,
           "CLOUDTRAIN_GPUS": str(gpus), "CLOUDTRAIN_PROCS": str(procs)}
    if isinstance(host, LocalHost):
        for key in ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX"):
            if key in os.environ:
                env[key] = os.environ[key]
    return env


# -- launch --------------------------------------------------------------------------------------


def launch(store: Store, settings: config.Settings, spec: JobSpec) -> Job:
    """Start the job and return once its agent runs it. On any failure or Ctrl-C the job is
    recorded as failed or cancelled and its host released: nothing is left running."""
    provider = providers.get(spec.backend)
    provider.preflight(spec)
    source = _resume_source(store, spec)
    kept = _kept_source(store, spec)
    job = store.create_job(name=spec.name, kind=spec.kind, recipe=spec.recipe,
                           command=spec.display(), backend=spec.backend, spec=spec.to_dict(),
                           launcher=f"{socket.gethostname()}:{os.getpid()}")
    host: Host | None = None
    agent_started = False
    try:
        _advance(store, job.id, state.PROVISIONING)
        if kept is not None:
            host = provider.adopt(store, kept, job)
            _open_hosts.pop(kept.id, None)
        else:
            host = provider.acquire(store, job, spec)
        _open_hosts[job.id] = host
        jobdir = provider.jobdir(job.id, host)
        store.update_job(job.id, host=host.describe(), jobdir=jobdir)
        like = _remote_jobdir(kept) if kept is not None else None

        _advance(store, job.id, state.SYNCING)
        sent = 0
        data_dir = provider.data_dir(host)
        host.run("mkdir -p " + " ".join(shlex.quote(d) for d in (
            f"{jobdir}/checkpoints", f"{jobdir}/work", data_dir)))
        host.install_agent(jobdir)
        if spec.kind == RECIPE:
            from . import recipes

            rec = recipes.load(spec.recipe)
            sent += host.sync(rec.path, f"{jobdir}/recipes/{rec.name}",
                              like and f"{like}/recipes/{rec.name}")
            shared = rec.path.parent / recipes.SHARED_DIR
            if shared.is_dir():
                sent += host.sync(shared, f"{jobdir}/recipes/{recipes.SHARED_DIR}",
                                  like and f"{like}/recipes/{recipes.SHARED_DIR}")
        if spec.workdir:
            sent += host.sync(Path(spec.workdir), f"{jobdir}/work", like and f"{like}/work")
        if source is not None:
            _copy_checkpoints(source, host, jobdir)

        _advance(store, job.id, state.SETTING_UP, detail=f"{sent} files sent")
        provider.setup(host)
        store.update_job(job.id, host=host.describe())
        gpus = provider.gpus(spec, host)
        procs = spec.processes(gpus)
        host.write_text(f"{jobdir}/run.sh", run_script(spec, jobdir, host.python, procs))
        shutdown_command, shutdown_delay = provider.shutdown(spec)
        host.write_text(f"{jobdir}/job.json", json.dumps({
            "job_id": job.id,
            "max_runtime_s": spec.max_runtime_s,
            "grace_s": settings.stop_grace_seconds,
            "heartbeat_s": settings.heartbeat_seconds,
            "shutdown_command": shutdown_command,
            "shutdown_delay_s": shutdown_delay,
            "env": job_environment(job.id, data_dir, host, gpus, procs),
            **provider.agent_settings(spec),
        }, indent=1))

        host.start_agent(job.id, jobdir)
        agent_started = True
        _advance(store, job.id, state.RUNNING,
                 detail=f"{procs} processes under torchrun" if procs > 1 else None)
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        _abort_launch(store, settings, provider, job, host if agent_started else None, exc)
        if interrupted:
            raise
        if isinstance(exc, CloudtrainError):
            raise
        raise CloudtrainError(f"launch of job {job.id} failed: {exc}") from exc
    return store.job(job.id)


class LaunchCancelled(CloudtrainError):
    """The job was stopped (`down`) while it was being launched."""


def _advance(store: Store, job_id: str, new_state: str, detail: str | None = None) -> None:
    if not store.set_state(job_id, new_state, detail=detail) and not store.job(job_id).active:
        raise LaunchCancelled(f"job {job_id} was stopped during launch")


def _kept_source(store: Store, spec: JobSpec) -> Job | None:
    """The job whose kept instance `--on` reuses: ended, with its instance still running."""
    if not spec.on_job:
        return None
    source = store.find_job(spec.on_job)
    if source.backend != spec.backend:
        raise UsageError(f"--on {source.id}: that job ran on {source.backend}, not {spec.backend}")
    if source.active:
        raise UsageError(f"--on {source.id}: the job is still {source.state}; wait for it, or "
                         f"`cloudtrain down {source.id}`")
    if not any(i.state != "terminated" for i in store.instances(source.id)):
        raise UsageError(f"--on {source.id}: its instance is gone (launch it with --keep to reuse "
                         "it)")
    return source


def _remote_jobdir(job: Job) -> str | None:
    """Where a job's directory is on its host, also after its files were collected home."""
    return (job.host or {}).get("remote_jobdir") or job.jobdir


def _resume_source(store: Store, spec: JobSpec) -> Job | None:
    if not spec.resume_from:
        return None
    source = store.find_job(spec.resume_from)
    if source.active:
        raise UsageError(f"--resume-from {source.id}: the job is still {source.state}",
                         hint=f"cloudtrain down {source.id}")
    if source.recipe != spec.recipe:
        raise UsageError(f"--resume-from {source.id}: that job ran {source.command}, "
                         f"not recipe {spec.recipe}")
    if not source.jobdir:
        raise UsageError(f"--resume-from {source.id}: the job never started, so it has no checkpoint")
    return source


def _copy_checkpoints(source: Job, host: Host, jobdir: str) -> None:
    """The source job's checkpoints into the new job: copied on the host they share, or
    sent from this machine where they were collected (a cloud job's, after it ended)."""
    source_host = host_of(source)
    src = f"{source.jobdir}/checkpoints"
    found = source_host.run(f"test -d {shlex.quote(src)} && ls -A {shlex.quote(src)}",
                            check=False).stdout.split()
    if not found:
        raise UsageError(f"--resume-from {source.id}: it saved no checkpoint"
                         + ("" if source.backend == "local" else
                            " that was brought home (its instance is gone)"))
    if source_host.describe() == host.describe():
        host.run(f"cp -a {shlex.quote(src)}/. {shlex.quote(jobdir)}/checkpoints/")
    elif isinstance(source_host, LocalHost):
        host.sync(Path(src), f"{jobdir}/checkpoints")
    else:
        raise UsageError(f"--resume-from {source.id}: its checkpoints are still on its own "
                         f"instance; wait until it ends (they are brought home then)")


def _abort_launch(store, settings, provider, job, host, exc) -> None:
    """Undo a launch that cannot finish: stop the agent if it started, release the host
    (terminating any instance), and record why. A failure to release is recorded too."""
    interrupted = isinstance(exc, KeyboardInterrupt)
    message = exc.message if isinstance(exc, CloudtrainError) else str(exc)
    reason = "interrupted during launch" if interrupted else f"launch failed: {message}"
    try:
        if host is not None:
            host.stop_job(store.job(job.id).jobdir, settings.stop_grace_seconds)
    except Exception:  # the host may be the thing that failed; releasing it is what matters
        pass
    try:
        provider.release(store, store.job(job.id), force=True)
    except Exception as release_exc:
        reason += f"; RELEASE FAILED, check `cloudtrain status --refresh`: {release_exc}"
    store.set_state(job.id, state.CANCELLED if interrupted else state.FAILED,
                    reason=reason.splitlines()[0])


# -- observing -----------------------------------------------------------------------------------


# Hosts this process has opened, by job: one SSH connection per host for every step.
_open_hosts: dict[str, Host] = {}


def host_of(job: Job) -> Host:
    """The host that has the job's directory: its instance, or this machine once the job's
    files were collected here."""
    kind = (job.host or {}).get("kind")
    cached = _open_hosts.get(job.id)
    if cached is not None and type(cached).__name__ == kind:
        return cached
    if kind == "LocalHost" and job.backend != "local":
        host: Host = LocalHost((job.host or {}).get("tmux_socket", "cloudtrain"))
    else:
        host = providers.get(job.backend).host_for(job)
    _open_hosts[job.id] = host
    return host


def refresh(store: Store, settings: config.Settings, job: Job) -> Job:
    """Bring an active job's record up to date from its host (one probe round trip)."""
    if job.active and job.state != state.RUNNING:
        return _check_launcher(store, job)
    if not job.active or not job.jobdir:
        return job
    try:
        report = host_of(job).probe_job(job.jobdir, settings.stale_after_seconds)
    except HostError as exc:
        return _host_lost(store, job, exc)
    fields = {}
    if report.get("metrics"):
        fields["metrics"] = report["metrics"]
    status = report.get("status") or {}
    if status.get("started_at") and not job.started_at:
        fields["started_at"] = status["started_at"]
    agent_state = status.get("state")
    if agent_state in state.TERMINAL_STATES:
        store.set_state(job.id, agent_state, at=status.get("ended_at") or time.time(),
                        detail=status.get("reason"), exit_code=status.get("exit_code"),
                        reason=status.get("reason"), **fields)
        _finish(store, job)
        return store.job(job.id)
    if fields:
        store.update_job(job.id, **fields)
    if job.backend != "local":  # what it has cost so far (an estimate until it ends)
        from . import ledger

        ledger.settle(store, store.job(job.id))
    return store.job(job.id)


def _host_lost(store: Store, job: Job, exc: HostError) -> Job:
    """The job's host does not answer. If the cloud says its instance is gone, so is the job
    (preempted when a spot interruption took it); otherwise it is only unreachable now."""
    states = providers.get(job.backend).instance_states(store, job)
    if states and all(s["state"] in ("shutting-down", "terminated") for s in states.values()):
        spot = any("Spot" in s["reason"] or "Spot" in s["message"] for s in states.values())
        reason = "spot instance interrupted" if spot else \
            "instance terminated before the job's end was seen: " + \
            "; ".join(f"{i}: {s['message'] or s['state']}" for i, s in states.items())
        store.set_state(job.id, state.PREEMPTED if spot else state.FAILED, reason=reason,
                        detail=reason)
        _finish(store, store.job(job.id), collect=False, force=True)  # it is gone anyway
        return store.job(job.id)
    store.update_job(job.id, reason=f"host unreachable: {exc.message}")
    return store.job(job.id)


def _check_launcher(store: Store, job: Job) -> Job:
    """A job still being launched whose launching process is gone will never start."""
    hostname, _, pid = (job.launcher or "").rpartition(":")
    if hostname == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid)):
        reason = f"the launching process died during {job.state}"
        if store.set_state(job.id, state.FAILED, reason=reason, detail=reason):
            _finish(store, job)
        return store.job(job.id)
    return job


def collect_files(store: Store, job: Job) -> bool:
    """Copy a remote job's log, metrics and status to $CLOUDTRAIN_HOME/jobs/<id>/ (before its
    host goes away); from then on the job is read from there."""
    local = config.home() / "jobs" / job.id
    if not job.jobdir or Path(job.jobdir) == local or isinstance(host_of(job), LocalHost):
        return False
    host = host_of(job)
    settings = config.Settings.load()
    try:
        for name in ("output.log", "metrics.jsonl", "status.json", "job.json", "run.sh"):
            data = host.read(f"{job.jobdir}/{name}")
            local.mkdir(parents=True, exist_ok=True)
            (local / name).write_bytes(data)
        host.pull_tree(f"{job.jobdir}/checkpoints", local / "checkpoints",
                       settings.collect_checkpoints_mb * 1e6)
    except HostError:
        return False
    store.update_job(job.id, jobdir=str(local), host={"kind": "LocalHost", "collected_from":
                                                       job.host, "remote_jobdir": job.jobdir})
    return True


def _finish(store: Store, job: Job, collect: bool = True, force: bool = False) -> None:
    """After the job: bring its files home, give the host back, settle the cost."""
    if collect:
        collect_files(store, store.job(job.id))
    providers.get(job.backend).release(store, store.job(job.id), force=force)
    settle_cost(store, store.job(job.id))


def settle_cost(store: Store, job: Job) -> None:
    """Record the job's cost (settled once every instance is terminated and priced), with
    the cost at which it first reached its target."""
    from . import ledger

    target_time = None
    if job.jobdir:
        try:
            target = host_of(job).probe_job(job.jobdir, 1e9).get("target") or {}
            target_time = target.get("time")
        except HostError:
            pass
    ledger.settle(store, job, target_time)


def settle_all(store: Store) -> int:
    """Settle every job whose cost is still an estimate: EC2 termination times and spot
    price history where the provider can give them. Returns how many are now settled."""
    done = 0
    for job in store.jobs():
        if job.cost_settled or job.active:
            continue
        providers.get(job.backend).record_ends(store, job)
        settle_cost(store, store.job(job.id))
        done += store.job(job.id).cost_settled
    return done


def refresh_all(store: Store, settings: config.Settings) -> list[Job]:
    """Refresh every active job; return all jobs, newest first."""
    for job in store.jobs(active_only=True):
        refresh(store, settings, job)
    return store.jobs()


def read_log(job: Job, offset: int = 0) -> bytes:
    if not job.jobdir:
        return b""
    return host_of(job).read(f"{job.jobdir}/output.log", offset)


def tail_log(job: Job, lines: int) -> tuple[bytes, int]:
    """The last `lines` lines of the job's output and the offset where the file ended."""
    if not job.jobdir:
        return b"", 0
    return host_of(job).tail(f"{job.jobdir}/output.log", lines)


def follow(store: Store, settings: config.Settings, job: Job, offset: int = 0
           ) -> Iterator[bytes]:
    """Yield the job's output as it is written, until the job has ended and all is read."""
    host = None
    next_refresh = 0.0
    while True:
        job = store.job(job.id)
        if job.jobdir and host is None:
            host = host_of(job)
        if host is not None:
            chunk = host.read(f"{job.jobdir}/output.log", offset)
            if chunk:
                offset += len(chunk)
                yield chunk
                continue
        if not job.active:
            return
        if time.monotonic() >= next_refresh:
            job = refresh(store, settings, job)
            next_refresh = time.monotonic() + REFRESH_EVERY_S
            if not job.active:
                continue  # read what the job wrote last, then stop
        time.sleep(FOLLOW_POLL_S)


# -- stopping ------------------------------------------------------------------------------------


@dataclass
class StopOutcome:
    job: Job
    stopped: bool  # False: it had already ended
    note: str


def cancel(store: Store, settings: config.Settings, refs: tuple[str, ...], every: bool,
           grace_s: float | None = None) -> list[StopOutcome]:
    """Stop jobs: SIGTERM to the job, SIGKILL after the grace period; mark them cancelled."""
    if every and refs:
        raise UsageError("give job ids or --all, not both")
    if not every and not refs:
        raise UsageError("which jobs? give job ids, or --all", hint="cloudtrain status")
    grace = settings.stop_grace_seconds if grace_s is None else grace_s
    jobs = store.jobs(active_only=True) if every else [store.find_job(r) for r in refs]
    if every:  # --keep jobs that ended still hold an instance: stop those too
        jobs += [j for j in store.jobs() if not j.active and _holds_instance(store, j)]
    outcomes = []
    for job in jobs:
        if not job.active and _holds_instance(store, job):
            _finish(store, job, force=True)
            outcomes.append(StopOutcome(store.job(job.id), True,
                                        f"{job.state}; its kept instance terminated"))
            continue
        job = refresh(store, settings, job)
        if not job.active:
            outcomes.append(StopOutcome(job, False, f"already {job.state}: nothing to stop"))
            continue
        status = {}
        if job.jobdir and job.state == state.RUNNING:
            status = host_of(job).stop_job(job.jobdir, grace) or {}
        if status.get("state") in (state.SUCCEEDED, state.FAILED):  # it ended on its own first
            store.set_state(job.id, status["state"], at=status.get("ended_at"),
                            reason=status.get("reason"), exit_code=status.get("exit_code"))
            note = f"already {status['state']}: nothing to stop"
        else:
            store.set_state(job.id, state.CANCELLED, detail="cancelled by user",
                            reason="cancelled by user", exit_code=status.get("exit_code"))
            note = "cancelled"
        _finish(store, job, force=True)
        outcomes.append(StopOutcome(store.job(job.id), note == "cancelled", note))
    _cleanup_clouds(store, [o.job for o in outcomes])
    return outcomes


def _holds_instance(store: Store, job: Job) -> bool:
    return any(i.state != "terminated" and i.provider != "local" for i in store.instances(job.id))


def _cleanup_clouds(store: Store, jobs: list[Job]) -> None:
    """After `down`: per cloud, remove the shared resources (security group, key pair) that
    no instance uses any more."""
    by_backend: dict[str, set[str]] = {}
    for job in jobs:
        for inst in store.instances(job.id):
            if inst.region:
                by_backend.setdefault(job.backend, set()).add(inst.region)
    for backend, regions in by_backend.items():
        providers.get(backend).cleanup(store, regions)


# -- reading the record -------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    start: float
    duration: float | None  # None: still in this phase
    detail: str | None = None


def timeline(store: Store, job: Job) -> list[Phase]:
    events = store.events(job.id)
    phases = []
    for i, ev in enumerate(events):
        if ev.phase in state.TERMINAL_STATES:
            phases.append(Phase(ev.phase, ev.at, 0.0, ev.detail))
            continue
        end = events[i + 1].at if i + 1 < len(events) else None
        phases.append(Phase(ev.phase, ev.at, None if end is None else max(end - ev.at, 0.0),
                            ev.detail))
    return phases


def attach_argv(job: Job) -> list[str]:
    if not job.active:
        raise UsageError(f"job {job.id} has ended ({job.state}): there is no session to attach to",
                         hint=f"cloudtrain logs {job.id}")
    host = host_of(job)
    if not host.session_alive(job.id):
        raise UsageError(f"job {job.id} has no tmux session any more",
                         hint=f"cloudtrain status {job.id}")
    return host.attach_argv(job.id)


def ssh_argv(job: Job) -> list[str]:
    host = host_of(job)
    if isinstance(host, LocalHost):
        raise UsageError(f"job {job.id} " + ("runs on this machine: use cloudtrain attach"
                                              if job.backend == "local" else
                                              "has ended and its instance is gone"),
                         hint=f"cloudtrain logs {job.id}")
    return host.ssh_argv()


def reconcile(store: Store) -> list[dict]:
    """Every instance the cloud has tagged as ours, and whether the store knows it."""
    return providers.get("aws").reconcile(store)


@dataclass
class Detail:
    job: Job
    phases: list[Phase]
    log_tail: bytes  # the last lines of output
    target: dict | None  # the recipe's target_reached row, if it was reached
    runs: dict | None = None  # the recipe's runs_summary row (`--set runs=N`), once written


def detail(store: Store, settings: config.Settings, ref: str, tail_lines: int = 10) -> Detail:
    job = refresh(store, settings, store.find_job(ref))
    probe, log_tail = {}, b""
    if job.jobdir:
        host = host_of(job)
        try:
            probe = host.probe_job(job.jobdir, settings.stale_after_seconds)
            log_tail, _ = host.tail(f"{job.jobdir}/output.log", tail_lines)
        except HostError as exc:  # the instance is gone and its files were not collected
            log_tail = f"(output not available: {exc.message})\n".encode()
    return Detail(job, timeline(store, job), log_tail, probe.get("target"), probe.get("runs"))
