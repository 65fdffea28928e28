"""Stage: kept, an instance that outlives its job: one launched with `--keep` (or by `launch
--on`, which keeps it by default), and the jobs queued on it (`launch --on JOB` while a job
runs there). It may call collect, group and secrets; the cloud only through the provider.

A kept instance runs and bills until its idle timer powers it off (the agent re-arms it at
each job's end for the job's idle time: config.yaml's keep_idle_minutes, or --idle-minutes),
until `cloudtrain down`, or until the next `launch --on` job takes it over. The store says
which job holds it: its instance row moves with it (provider.adopt); a job that handed it
on says so in a `handover` event.

    instance_of(store, job)               the instance a job names for --on (handovers followed)
    queued_on(store, instance_id)         the jobs queued there, first first
    power_off_at(job, settings)           when the instance of an ended kept job powers off
    survey(store, settings)               every kept or busy instance, its cost up to now; a
                                          power-off that is due confirmed with the cloud
    facts_of(store, settings, job)        one job's kept instance (None: it holds none)
    instance_host(job)                    the SSH host of a kept job's instance
    enqueue(store, job, host, jobdir, spec)  the launch's last step for a job that waits
    refresh_queued(store, settings, job)  a queued job: started there since, or failed to?
    unqueue(store, job) / drop_queue(..)  `down`: a queued job out of the queue; the jobs
                                          queued on an instance that `down` terminated

The queue itself lives on the instance (host/job_queue.py), so that a job queued there
starts when the one before it ends, whether or not this machine is on.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import PurePosixPath

from .. import config, ledger, providers, state
from ..errors import CloudtrainError, HostError
from ..hosts import Host, agent_dir
from ..providers.base import CloudHosts
from ..state import Instance, Job, Store
from ..state_columns import json_column
from . import group, secrets
from .collect import settle_cost

# A power-off is taken for done only after this long (the shutdown itself, EC2's view).
DUE_GRACE_S = 120.0
# While a due power-off could not be confirmed (offline, no credentials), `status` asks
# again after this long, not on every call.
CONFIRM_EVERY_S = 600.0
HANDOVER = re.compile(r"(i-[0-9a-f]+) to job ([0-9a-f]+)\Z")


def _instance(store: Store, instance_id: str) -> Instance | None:
    row = store.db.execute("SELECT * FROM instances WHERE id = ?", (instance_id,)).fetchone()
    if row is None:
        return None
    values = dict(row)
    values["details"] = json_column(values["details"])
    return Instance(**values)


def held(store: Store, job: Job) -> Instance | None:
    """The cloud instance the job holds now and that may bill, if any."""
    return next((i for i in store.instances(job.id)
                 if i.state != "terminated" and i.provider != "local"), None)


def instance_of(store: Store, job: Job) -> Instance | None:
    """The instance `launch --on JOB` means, still there (not terminated): the one the job
    holds, the one it waits for (a queued job), or the one it handed over to a later job
    (that job holds it now)."""
    found = held(store, job)
    if found is not None:
        return found
    wanted = job.spec.kept or {}
    ids = [wanted.get("instance")] if job.state == state.QUEUED else []
    ids += [m.group(1) for e in reversed(store.events(job.id)) if e.phase == "handover"
            for m in [HANDOVER.match(e.detail or "")] if m]
    for instance_id in ids:
        inst = _instance(store, instance_id) if instance_id else None
        if inst is not None and inst.state != "terminated":
            return inst
    return None


def queued_on(store: Store, instance_id: str) -> list[Job]:
    """The jobs queued on an instance, in the order they start."""
    jobs = [j for j in store.jobs(active_only=True) if j.state == state.QUEUED
            and (j.spec.kept or {}).get("instance") == instance_id]
    return sorted(jobs, key=lambda j: j.created_at)


def idle_minutes(job: Job, settings: config.Settings) -> int:
    return settings.idle_minutes(job.spec.idle_minutes)


def power_off_at(job: Job, settings: config.Settings) -> float | None:
    """When the instance of an ended kept job powers itself off: its idle time after the
    job's end (the agent re-armed the timer then). A job kept only for a queue that then went
    away had no idle time: its start's timer (the max runtime + the margin) stands."""
    if job.ended_at is None:
        return None
    provider = providers.get(job.backend)
    if job.facts.kept_for_queue and job.spec.idle_minutes is None and job.started_at \
            and isinstance(provider, CloudHosts):
        minutes = provider.power_off_minutes(float(job.spec.max_runtime_s or 0))
        return job.started_at + minutes * 60
    return job.ended_at + idle_minutes(job, settings) * 60


def _facts(store: Store, settings: config.Settings, job: Job, inst: Instance,
           now: float) -> dict:
    """What `status` says of one kept (or busy) instance, as plain values."""
    run = ledger.run_of(inst)
    queued = [j.id for j in queued_on(store, inst.id)]
    kept = not job.active
    off = power_off_at(job, settings) if kept and not queued else None
    return {"job": job.id, "name": job.name, "instance": inst.id, "type": inst.instance_type,
            "region": inst.region, "market": inst.market, "price_per_hour": run.price_per_hour,
            "billing_since": inst.launched_at, "state": "kept" if kept else "busy",
            "job_state": job.state, "idle_minutes": idle_minutes(job, settings) if kept else None,
            "power_off_at": off, "due": off is not None and now > off, "queued": queued}


def facts_of(store: Store, settings: config.Settings, job: Job,
             now: float | None = None) -> dict | None:
    """The kept instance an ended job holds (as survey's rows), or None."""
    inst = held(store, job)
    if inst is None or job.active or job.backend == "local":
        return None
    return _facts(store, settings, job, inst, time.time() if now is None else now)


def survey(store: Store, settings: config.Settings) -> list[dict]:
    """Every instance that is kept (its job has ended) or busy with jobs queued behind the
    one on it: what it bills, when it powers itself off. A kept job's cost is brought up to
    now (it bills on); a power-off that is due is confirmed with the cloud (at most every
    CONFIRM_EVERY_S while it cannot be), and one that happened settles the job's cost."""
    now = time.time()
    rows = store.db.execute("SELECT DISTINCT job_id FROM instances WHERE state != 'terminated' "
                            "AND provider != 'local'").fetchall()
    out = []
    for (job_id,) in rows:
        job = store.job(job_id)
        inst = held(store, job)
        if inst is None:
            continue
        facts = _facts(store, settings, job, inst, now)
        if job.active and not facts["queued"]:
            continue  # a job running on its own instance: the table says all
        if facts["state"] == "kept":
            if facts["due"] and now > facts["power_off_at"] + DUE_GRACE_S:
                if _confirm_power_off(store, job, inst, now):
                    settle_cost(store, store.job(job.id))
                    continue
            settle_cost(store, job)  # billed up to now
        out.append(facts)
    return out


def _confirm_power_off(store: Store, job: Job, inst: Instance, now: float) -> bool:
    """Whether the cloud says the kept instance is gone (its end then recorded)."""
    details = inst.details or {}
    if now - float(details.get("power_off_checked_at") or 0) < CONFIRM_EVERY_S:
        return False
    provider = providers.get(job.backend)
    try:
        states = provider.instance_states(store, job)
        if states.get(inst.id, {}).get("state", "terminated") in ("shutting-down",
                                                                  "terminated"):
            if isinstance(provider, CloudHosts):
                provider.record_ends(store, job)
            return True
    except CloudtrainError:
        pass  # offline, no credentials: asked again later; the row says it is due
    store.update_instance(inst.id, details=json.dumps({**details,
                                                       "power_off_checked_at": now}))
    return False


def instance_host(job: Job) -> Host:
    """An SSH host to the job's instance, also once its files were brought home (a kept
    instance): the endpoint and host key recorded at its launch."""
    info = (job.host or {}).get("collected_from") or job.host or {}
    return providers.get(job.backend).host_for(Job(**{**job.__dict__, "host": info}))


# -- the queue ------------------------------------------------------------------------------


def _queue_call(host: Host, jobdir: str, *args: str) -> dict:
    """One call of host/job_queue.py on the instance (installed beside the agent of
    `jobdir`'s version), its JSON answer checked."""
    script = f"{agent_dir(jobdir)}/job_queue.py"
    out = host.run(shlex.join([host.python, script, *args]), check=False)
    if out.exit_code == 2 and "can't open file" in out.stderr:  # this CLI's agent: not there
        host.install_agent(jobdir)
        out = host.run(shlex.join([host.python, script, *args]), check=False)
    try:
        answer = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
    except ValueError:
        answer = {}
    if not isinstance(answer, dict) or not answer or "error" in answer or not out.ok:
        why = answer.get("error") if isinstance(answer, dict) else None
        said = why or out.stderr.strip()[-300:] or "no answer"
        raise HostError(f"the job queue on {host.name}: {said}")
    return answer


def _root(jobdir: str) -> str:
    """<root> of a job directory <root>/jobs/<id> on a host (where its queue is)."""
    return str(PurePosixPath(jobdir).parent.parent)


def enqueue(store: Store, job: Job, host: Host, jobdir: str, spec) -> tuple[float, str]:
    """The last launch step of a job that waits its turn on a kept instance: each job ahead
    keeps the instance (one that was to power it off is told not to), then the job goes in
    the instance's queue. Returns when and what the timeline says."""
    kept = spec.kept or {}
    ahead = list(kept.get("ahead") or [])
    for job_id in kept.get("made_kept") or []:
        before = store.job(job_id)
        remote = (before.host or {}).get("remote_jobdir") or before.jobdir
        if before.active and remote:
            host.write_text(f"{remote}/keep", f"kept for job {job.id}\n")
        store.record_facts(job_id, kept_for_queue=job.id)
        store.add_event(job_id, "kept", detail=f"keeps its instance for job {job.id}, queued "
                                               "behind it")
    agent = f"{agent_dir(jobdir)}/agent.py"
    answer = _queue_call(host, jobdir, "add", _root(jobdir), job.id,
                         str(int(job.created_at * 1e6)), host.python, agent,
                         host.tmux_socket, ahead[-1])
    if answer.get("started") is False:
        raise CloudtrainError(f"job {job.id} could not be started on the kept instance: "
                              f"{answer.get('error')}")
    detail = f"behind job {ahead[-1]} on {kept.get('instance')}" if answer.get("queued") else \
        f"on {kept.get('instance')} at once: job {ahead[-1]} had just ended"
    return time.time(), detail


def refresh_queued(store: Store, settings: config.Settings, job: Job) -> Job:
    """A queued job brought up to date: still waiting; started by the instance (it takes the
    instance over, and runs as any job); failed to start; or lost with its instance."""
    host = group.host_of(job)
    try:
        answer = _queue_call(host, job.jobdir or "", "state", _root(job.jobdir or ""), job.id)
    except HostError as exc:
        group.forget(job.id)
        return _queue_unreachable(store, job, exc)
    where = answer.get("state")
    if where == "queued":
        if job.reason:
            store.update_job(job.id, reason=None)
        return store.job(job.id)
    if where == "started":
        _take_over(store, job)
        new = state.STAGING if job.spec.data.datasets else state.RUNNING
        store.set_state(job.id, new, expect=state.QUEUED, reason=None,
                        detail="started on the kept instance as the job before it ended")
        return store.job(job.id)
    why = (f"it could not be started on the kept instance: {answer.get('error')}"
           if where == "failed" else "its entry in the kept instance's queue is gone")
    _failed(store, job, why)
    return store.job(job.id)


def _take_over(store: Store, job: Job) -> None:
    """The instance's record moves to the job that runs on it now (its billing with it)."""
    instance_id = (job.spec.kept or {}).get("instance")
    inst = _instance(store, instance_id) if instance_id else None
    if inst is None or inst.job_id == job.id:
        return
    store.hand_over(inst, job.id)


def _queue_unreachable(store: Store, job: Job, exc: HostError) -> Job:
    """The instance of a queued job does not answer: gone (the job fails, it never ran), or
    only unreachable now."""
    instance_id = (job.spec.kept or {}).get("instance")
    inst = _instance(store, instance_id) if instance_id else None
    gone = inst is None or inst.state == "terminated"
    if inst is not None and not gone:
        try:
            states = providers.get(job.backend).instance_states(store, store.job(inst.job_id))
            gone = states.get(inst.id, {}).get("state", "terminated") in ("shutting-down",
                                                                          "terminated")
        except CloudtrainError:
            gone = False
    if gone:
        _failed(store, job, f"its kept instance {instance_id} went away before it started")
    else:
        store.update_job(job.id, reason=f"host unreachable: {exc.message}")
    return store.job(job.id)


def _failed(store: Store, job: Job, why: str, new: str = state.FAILED) -> None:
    store.set_state(job.id, new, reason=why, detail=why)
    secrets.forget(job.id)


def unqueue(store: Store, job: Job) -> str | None:
    """`down` of a queued job: out of the instance's queue, cancelled; the note says so.
    None: it was started meanwhile (stop it as a running job)."""
    try:
        answer = _queue_call(group.host_of(job), job.jobdir or "", "remove",
                             _root(job.jobdir or ""), job.id)
    except HostError as exc:
        _failed(store, job, f"cancelled by user while queued (the instance did not answer: "
                            f"{exc.message})", state.CANCELLED)
        return "cancelled; its kept instance could not be reached to take it out of the queue"
    if not answer.get("removed"):
        return None
    _failed(store, job, "cancelled by user while queued", state.CANCELLED)
    return "cancelled; taken out of the kept instance's queue (it never ran)"


def drop_queue(store: Store, instance_ids: set[str], by: str) -> list[str]:
    """The jobs queued on instances `down` has terminated: cancelled (they never ran)."""
    dropped = []
    for instance_id in instance_ids:
        for job in queued_on(store, instance_id):
            _failed(store, job, f"cancelled: its kept instance {instance_id} was terminated "
                                f"with job {by} before it ran", state.CANCELLED)
            dropped.append(job.id)
    return dropped
