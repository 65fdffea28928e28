"""Stage: stop, `down` and its sweep: a job stopped gracefully where it runs (bounded), its
instance terminated by record and by tag whatever the host does, the instances tagged as ours
that no job here holds found and terminated, the clouds' unused shared resources removed.
It may call watch, kept (a queued job; the queue of an instance it terminates), collect,
group and lease.

    cancel(store, settings, refs, every)  stop jobs (and with --all, the untracked ones)
    down_targets(store)                   what `down --all` stops
    holds_instance(store, job)            an ended job that still holds a (kept) instance
    holds_group(store, job)               ... or an Auto Scaling group (it deletes the group
                                          before it terminates anything)
    reconcile(store)                      every instance tagged as ours, and whether we know it
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from .. import config, providers, state
from ..errors import CloudtrainError, Interrupted, MissingDependency, NotFound, UsageError
from ..nodes import records
from ..providers.base import Account, CloudRecovery, Sweep, Sweeps
from ..state import Job, Store
from . import group, kept, lease
from .collect import STOP_MARGIN_S, bounded, finish, stop_nodes
from .watch import UNREACHABLE, refresh


@dataclass
class StopOutcome:
    ref: str  # the job's id, or for an instance no job in the store knows, its instance id
    job: Job | None  # None: an orphan instance found by its tags only
    stopped: bool  # False: it had already ended
    note: str
    ok: bool = True  # False: something may still be running (said in the note)
    # "job" or "orphan": something stopped (or not); "sweep": where the cloud was looked
    # at, and each region that could not be (ok False)
    kind: str = "job"
    regions: tuple[str, ...] = ()  # a sweep's regions checked (the note says how many)


def cancel(store: Store, settings: config.Settings, refs: tuple[str, ...], every: bool,
           grace_s: float | None = None,
           say: Callable[[str], None] | None = None) -> list[StopOutcome]:
    """Stop jobs: SIGTERM to the job, SIGKILL after the grace period; mark them cancelled and
    terminate their instances.

    `down` is the kill switch, so it works whatever the host does: the graceful stop
    is bounded, and the instance is then terminated by record and by tag through the cloud's
    API whether or not the stop worked. One job's failure never stops the others. `--all`
    also terminates instances tagged as ours that no job in the store holds (a lost or
    other machine's state), and a reference that is no job here may name such an instance's
    job. `say`: each graceful stop as it begins (the grace period can be minutes of silence).
    """
    if every and refs:
        raise UsageError("give job ids or --all, not both")
    if not every and not refs:
        raise UsageError("which jobs? give job ids, or --all", hint="cloudtrain status")
    grace = settings.stop_grace_seconds if grace_s is None else grace_s
    unknown: list[str] = []
    if every:
        targets = down_targets(store)
    else:
        targets = []
        for ref in refs:
            try:
                targets.append(store.find_job(ref))
            except NotFound:
                unknown.append(ref)
    outcomes: list[StopOutcome] = []
    seen: set[str] = set()
    for job in targets:
        if job.id in seen:
            continue
        seen.add(job.id)
        try:
            outcomes.append(_stop_one(store, settings, job, grace, say))
        except KeyboardInterrupt:  # say what is left as it is
            rest = [j.id for j in targets if j.id not in seen]
            raise Interrupted(
                f"job {job.id} may still be running: its stop had begun but not finished (it "
                "is not marked cancelled, and any instance of it still runs)"
                + (f"; not stopped at all: {', '.join(rest)}" if rest else "")
                + f"; run `cloudtrain down {' '.join([job.id] + rest)}` again") from None
    tags: list[str] = []
    swept: list[StopOutcome] = []
    if every or unknown:
        orphans = _stop_orphans(store, None if every else unknown)
        tags = [tag for tag, o in orphans if o.kind == "orphan"]
        outcomes += [o for _, o in orphans if o.kind != "sweep"]
        swept = [o for _, o in orphans if o.kind == "sweep"]
    missing = [r for r in unknown if not any(t.startswith(r) for t in tags)]
    complete = all(o.ok for o in swept)
    if missing and not outcomes and complete:
        store.find_job(missing[0])  # raises the usual NotFound, with its hint
    outcomes += [StopOutcome(r, None, False, "no such job (here or tagged in the cloud)"
                             if complete else "no such job here, nor tagged in the regions "
                             "that could be checked", False, kind="orphan") for r in missing]
    _cleanup_clouds(store, settings, [o.job for o in outcomes if o.job is not None], every)
    return outcomes + swept


def down_targets(store: Store) -> list[Job]:
    """What `down --all` stops: every active job, and --keep jobs that ended but still hold
    an instance."""
    recovering = dict(providers.able(CloudRecovery))  # once, not per job: each loads config
    return store.jobs(active_only=True) + [
        j for j in store.jobs() if not j.active and (
            holds_instance(store, j)
            or (j.backend in recovering and holds_group(store, j, recovering[j.backend])))]


def _stop_one(store: Store, settings: config.Settings, job: Job, grace: float,
              say: Callable[[str], None] | None = None) -> StopOutcome:
    """One job: a bounded graceful stop where it runs, then release whatever happens."""
    if job.state == state.QUEUED:  # on a kept instance, not started: out of its queue
        job = store.job(job.id)  # (`down --all`: the job ahead's `down` may have cancelled it)
        note = kept.unqueue(store, job) if job.state == state.QUEUED else None
        if note is not None:
            return StopOutcome(job.id, store.job(job.id), True, note)
        job = store.job(job.id)  # started meanwhile: stopped as any running job
    if not job.active and holds_instance(store, job):
        return _release_outcome(store, job, True, f"{job.state}; its kept instance terminated")
    if not job.active and holds_group(store, job):  # an Auto Scaling group may start more
        return _release_outcome(store, job, True, job.state)
    try:
        job = refresh(store, settings, job)
    except Exception as exc:  # the cloud or host misbehaving must not keep it billing
        store.update_job(job.id, reason=f"could not refresh before stopping: {exc}")
        job = store.job(job.id)
    if not job.active and not holds_instance(store, job):
        return StopOutcome(job.id, job, False, f"already {job.state}: nothing to stop")
    status, problem = {}, None
    if (job.reason or "").startswith(UNREACHABLE):  # the probe just now got no answer:
        problem = job.reason                          # no graceful stop to wait for
    elif job.jobdir and state.on_host(job) and len(records(job)) > 1:  # every node at once, each bounded
        _say_stopping(say, job, grace, len(records(job)))
        answers = stop_nodes(job, settings, grace_s=grace, store=store)
        status = answers[0] if isinstance(answers[0], dict) else {}
        problems = [f"node {i}: {a}" for i, a in enumerate(answers) if isinstance(a, str)]
        problem = "; ".join(problems) or None
    elif job.jobdir and state.on_host(job):
        _say_stopping(say, job, grace)
        status, problem = bounded(lambda: group.host_of(job).stop_job(job.jobdir, grace) or {},
                                   grace + STOP_MARGIN_S)
        status = status if isinstance(status, dict) else {}
    if status.get("state") in (state.SUCCEEDED, state.FAILED):  # it ended on its own first
        store.set_state(job.id, status["state"], at=status.get("ended_at"),
                        reason=status.get("reason"), exit_code=status.get("exit_code"))
        note = f"already {status['state']}: nothing to stop"
    else:
        reason = "cancelled by user" + (f" (graceful stop failed: {problem})" if problem else "")
        store.set_state(job.id, state.CANCELLED, detail=reason, reason=reason,
                        exit_code=status.get("exit_code"))
        note = "cancelled" + (f"; the graceful stop failed ({problem}), terminated instead"
                              if problem else "")
    return _release_outcome(store, job, note.startswith("cancelled"), note,
                            collect=problem is None)


def _say_stopping(say: Callable[[str], None] | None, job: Job, grace: float,
                  nodes: int = 1) -> None:
    """The graceful stop, said as it is sent: the job has `grace` seconds to end."""
    if say is not None:
        where = f" on its {nodes} nodes" if nodes > 1 else ""
        say(f"stopping {job.id}{where}: SIGTERM sent, SIGKILL in {grace:g} s")


def _release_outcome(store: Store, job: Job, stopped: bool, note: str,
                     collect: bool = True) -> StopOutcome:
    """The job's Auto Scaling group deleted first (it would replace what is terminated
    next), then its instances released; a group that could not be deleted is said, and
    its instances are terminated all the same."""
    failed = None
    held = {i.id for i in store.instances(job.id) if i.state != "terminated"}
    try:
        with lease.uninterruptible("deleting the job's auto scaling group"):
            deleted, failed = _delete_groups(store, job)
        if deleted:
            note += f"; its auto scaling group {', '.join(deleted)} deleted"
        with lease.uninterruptible("terminating the job's instance"):
            finish(store, job, collect=collect, force=True)
        dropped = kept.drop_queue(store, held, job.id)
        if dropped:
            note += f"; queued there, never run, cancelled: {', '.join(dropped)}"
    except Exception as exc:
        message = exc.message if isinstance(exc, CloudtrainError) else f"{type(exc).__name__}: {exc}"
        if message != failed:  # release says the group's failure again: once is enough
            note += f"; RELEASE FAILED, its instance may still be running: {message}"
        return StopOutcome(job.id, store.job(job.id), stopped, note + _group_failure(failed),
                           ok=False)
    return StopOutcome(job.id, store.job(job.id), stopped, note + _group_failure(failed),
                       ok=failed is None)


def _group_failure(failed: str | None) -> str:
    return f"; GROUP DELETE FAILED, it may start instances again: {failed}" if failed else ""


def _delete_groups(store: Store, job: Job) -> tuple[list[str], str | None]:
    """Delete a cloud job's Auto Scaling groups (by record and by tag): (the names deleted,
    why it failed or None)."""
    provider = providers.get(job.backend)
    if not isinstance(provider, CloudRecovery):
        return [], None
    try:
        return provider.delete_job_groups(store, job), None
    except CloudtrainError as exc:
        return [], exc.message


def _stop_orphans(store: Store, refs: list[str] | None) -> list[tuple[str, StopOutcome]]:
    """Terminate live instances tagged as ours that no job in the store holds (all of them,
    or those whose job tag starts with one of `refs`), in every region the owner can have
    one, in each cloud backend that sweeps (the store and config.yaml may be a fresh
    machine's). Without an account configured there is nothing to find, unless this store
    used that cloud.
    Besides the instances: "sweep" outcomes that say which regions were checked, and each
    region that could not be (ok False: something may bill there)."""
    return [found for backend, provider in providers.able(Sweeps)
            for found in _sweep(store, refs, backend, provider)]


def _sweep(store: Store, refs: list[str] | None, backend: str, provider: Sweeps
           ) -> list[tuple[str, StopOutcome]]:
    """_stop_orphans in one cloud backend."""
    used = _cloud_used(store, backend)
    configured = isinstance(provider, Account) and provider.account.configured()
    if not (used or configured):  # no account on this machine: nothing to look with
        return []
    try:
        swept = provider.orphans(store)
    except CloudtrainError as exc:
        # No credentials on a machine that never used the cloud: nothing of ours to find
        # (a job named here is then simply no job). Any other failure may hide something
        # billing: said, and the exit code says so.
        if used or not isinstance(exc, MissingDependency):
            return [("", StopOutcome(backend, None, False, "could not look for untracked "
                                     f"instances: {exc.message}", False, kind="sweep"))]
        return []
    outcomes = []
    # Groups first (a group replaces an instance terminated before it), templates last.
    order = {"group": 0, "launch-template": 2, "role": 3}  # a job's IAM role after all
    for orphan in sorted(swept.found, key=lambda o: order.get(o.get("kind"), 1)):
        tag = orphan.get("job") or ""
        if refs is not None and not any(tag.startswith(r) for r in refs if r):
            continue
        if orphan.get("kind") in order:
            outcomes.append((tag, _delete_orphan_group(provider, orphan, tag)))
            continue
        try:
            provider.terminate(orphan["region"], [orphan["id"]])
            what, done = ("volume", "deleted") if orphan["id"].startswith("vol-") else \
                ("instance", "terminated")
            outcome = StopOutcome(orphan["id"], None, True,
                                  f"{what} of job {tag or '?'} not in this store: {done}",
                                  kind="orphan")
        except CloudtrainError as exc:
            outcome = StopOutcome(orphan["id"], None, False,
                                  f"job {tag or '?'}: TERMINATE FAILED, still running: "
                                  f"{exc.message}", False, kind="orphan")
        outcomes.append((tag, outcome))
    outcomes += [("", outcome) for outcome in sweep_outcomes(backend, swept)]
    return outcomes


def _delete_orphan_group(provider, orphan: dict, tag: str) -> StopOutcome:
    """An Auto Scaling group (and its template), or a template left alone, of a job the
    store does not hold: deleted."""
    what = {"group": "auto scaling group", "role": "IAM role"}.get(orphan["kind"],
                                                                    "launch template")
    try:
        if orphan["kind"] == "role":
            provider.delete_job_role(orphan["region"], orphan["id"])
        else:
            provider.delete_job_group(orphan["region"], orphan["id"])
    except CloudtrainError as exc:
        return StopOutcome(orphan["id"], None, False, f"job {tag or '?'}: GROUP DELETE FAILED, "
                           f"it may start instances again: {exc.message}", False, kind="orphan")
    return StopOutcome(orphan["id"], None, True, f"{what} of job {tag or '?'} not in this "
                       "store: deleted", kind="orphan")


def sweep_outcomes(backend: str, swept) -> list[StopOutcome]:
    """Each region that could not be checked (ok False), then the regions that were."""
    out = [StopOutcome(backend, None, False, f"could not check {region}: {why}", False,
                       kind="sweep") for region, why in sorted(swept.unchecked.items())]
    if swept.regions:
        other = " other" if swept.unchecked else ""
        out.append(StopOutcome(backend, None, False, f"checked {len(swept.regions)}{other} "
                               f"region{'s' if len(swept.regions) != 1 else ''} "
                               f"({swept.chosen_by})", kind="sweep",
                               regions=tuple(swept.regions)))
    return out


def _cloud_used(store: Store, backend: str) -> bool:
    return store.db.execute("SELECT 1 FROM jobs WHERE backend = ? LIMIT 1",
                            (backend,)).fetchone() is not None


def _cloud_configured(settings: config.Settings, backend: str) -> bool:
    """Whether this machine is set up for the cloud (so `down --all` asks it even with an
    empty store): it is the default backend, or a region is configured."""
    return bool(settings.backend == backend or settings.region or os.environ.get("AWS_REGION")
                or os.environ.get("AWS_DEFAULT_REGION"))


def holds_group(store: Store, job: Job, provider=None) -> bool:
    """Whether the store says a cloud job has an Auto Scaling group not yet deleted (which
    may start instances; read from the job's timeline, no cloud call)."""
    provider = provider or providers.get(job.backend)
    return isinstance(provider, CloudRecovery) and bool(provider.recorded_groups(store, job))


def holds_instance(store: Store, job: Job) -> bool:
    """Whether the job holds a cloud instance that may still bill (a kept one, say)."""
    return any(i.state != "terminated" and i.provider != "local" for i in store.instances(job.id))


def _cleanup_clouds(store: Store, settings: config.Settings, jobs: list[Job],
                    every: bool = False) -> None:
    """After `down`: per cloud, remove the shared resources (security group, key pair) that
    no instance uses any more (with --all, also where no job was stopped just now)."""
    by_backend: dict[str, set[str]] = {}
    for job in jobs:
        for inst in store.instances(job.id):
            if inst.region:
                by_backend.setdefault(job.backend, set()).add(inst.region)
    for backend, _ in providers.able(Sweeps) if every else []:
        if _cloud_used(store, backend) or _cloud_configured(settings, backend):
            by_backend[backend] = set()  # every region the store knows, the configured one
    for backend, regions in by_backend.items():
        try:
            providers.get(backend).cleanup(store, regions or None)
        except CloudtrainError:
            pass  # unused groups and key pairs do not bill; the next `down --all` tries again


def reconcile(store: Store):
    """Every instance the cloud has tagged as ours, in every region the owner can have one,
    and whether the store knows it: a providers.base.Sweep whose `found` is the list, and
    `unchecked` the regions that could not be asked."""
    sweeps = [provider.reconcile(store) for _, provider in providers.able(Sweeps)]
    if len(sweeps) == 1:
        return sweeps[0]
    return Sweep([f for s in sweeps for f in s.found], [r for s in sweeps for r in s.regions],
                 {r: why for s in sweeps for r, why in s.unchecked.items()},
                 "; ".join(s.chosen_by for s in sweeps))
