"""Spot recovery: one job, several attempts, until it ends or its restarts are used up.

    recoverable(job)                      an active spot job launched to recover
    begin(store, job, spec)               attempt 1, at launch
    placed(store, job_id, n)              the attempt's instance, once it exists
    started(store, job_id, n, at)         the job runs on the attempt's instance
    resuming(store, job_id, n, plan)      the checkpoint the attempt resumes from
    drained(job, status)                  a noticed interruption's checkpoint is uploaded
    interrupted(store, settings, job, ..) the instance was taken: end the attempt; relaunch
                                          (the supervisor does) or fail, and release it
    relaunch(store, settings, job, say)   the supervisor's step: the next AZ, region or
                                          market, a new instance, the checkpoint restored
    close(store, job)                     the job ended: its open attempt ends with it
    summary(store, job)                   each attempt's place, outcome, work redone, cost

Where a relaunch goes: the other AZs of the region first (the current spot prices decide
their order, the interrupted AZ last), then the other allowed regions (`regions:` in
config.yaml; not for a job whose data is an EBS snapshot, which lives in one region), then,
with `--fallback on-demand`, the same places on demand. A place with no capacity or no quota
is skipped; with none anywhere the job waits in `recovering` and is tried again every
`recovery_retry_seconds`, up to `recovery_wait_minutes` after the interruption.

Who does it: the supervisor (supervisor.py), a process of its own on the launching machine.
Everything it knows is in the store (the job's state and attempts) and in EC2's tags (the
attempt's instance), so a supervisor killed half-way is restarted and goes on: with the
instance it had started, in whichever region that was, never beside it (F30).

This module never imports boto3 or paramiko: the provider and the hosts do that.
"""

from __future__ import annotations

import os
import socket
import time

from . import config, state
from .errors import CloudtrainError, PlacementError
from .spec import RECIPE, JobSpec
from .state import Attempt, Job, Store

NOTICE_DRAIN_S = 150.0  # after a spot notice, how long the final checkpoint upload may take
INTERRUPTED = "interrupted"


def recoverable(job: Job) -> bool:
    return job.active and job.backend != "local" and bool((job.spec or {}).get("recover"))


def begin(store: Store, job: Job, spec: JobSpec) -> None:
    store.add_attempt(job.id, 1, market=spec.market, instance_type=spec.instance_type,
                      region=spec.region)


def instances_of(store: Store, job_id: str, attempt: Attempt | None) -> list:
    """The instances of an attempt: on several nodes, those recorded with its number (node
    0 first); else its one instance."""
    if attempt is None:
        return []
    found = [i for i in store.instances(job_id) if (i.details or {}).get("attempt") == attempt.n
             and isinstance((i.details or {}).get("node"), int)]
    if found:
        return sorted(found, key=lambda i: i.details["node"])
    return [i for i in store.instances(job_id) if i.id == attempt.instance_id]


def placed(store: Store, job_id: str, n: int) -> None:
    """Attempt n's instance: node 0's of a job on several machines, else the newest one
    recorded for the job."""
    live = [i for i in store.instances(job_id) if i.state != "terminated"]
    first = [i for i in live if (i.details or {}).get("node") == 0
             and (i.details or {}).get("attempt") in (None, n)]
    if first or live:
        inst = (first or live)[-1]
        store.update_attempt(job_id, n, instance_id=inst.id, region=inst.region,
                             zone=inst.zone, market=inst.market,
                             instance_type=inst.instance_type)


def started(store: Store, job_id: str, n: int, at: float) -> None:
    store.update_attempt(job_id, n, running_at=at)


def resuming(store: Store, job_id: str, n: int, plan: dict) -> None:
    step = plan.get("step")
    store.update_attempt(job_id, n, resumed_seq=plan.get("seq"),
                         resumed_step=step if isinstance(step, int) else None)
    store.add_event(job_id, "restore", detail=(
        f"attempt {n} resumes from checkpoint {plan.get('seq')}"
        + (f" (step {step})" if isinstance(step, int) else "")
        + f", {_mb(plan)} MB from the job store"))


def _mb(plan: dict) -> str:
    total = sum(f.get("size", 0) for f in plan.get("files") or [] if isinstance(f, dict))
    return f"{total / 1e6:.1f}"


def drained(job: Job, status: dict) -> bool:
    """Whether a job that got its spot notice has finished uploading its checkpoint (the
    agent records the final upload), or may not wait any longer for it."""
    if not (job.host or {}).get("checkpoint_stream"):
        return True
    if ((status or {}).get("checkpoint_stream") or {}).get("final"):
        return True
    noticed = ((status or {}).get("interruption") or {}).get("noticed_at") or \
        (status or {}).get("ended_at") or 0
    return time.time() - float(noticed) > NOTICE_DRAIN_S


def _last_step(job: Job, status: dict | None) -> int | None:
    """The last step the attempt is known to have run: its latest metrics row's, or the
    final checkpoint's when that is later (a notice checkpoints mid-epoch)."""
    steps = []
    step = (job.metrics or {}).get("step")
    if isinstance(step, int):
        steps.append(step)
    ckpt = ((status or {}).get("checkpoint_stream") or {})
    if ckpt.get("final") and ckpt.get("ok") and isinstance(ckpt.get("step"), int):
        steps.append(ckpt["step"])
    return max(steps) if steps else None


def interrupted(store: Store, settings: config.Settings, job: Job, status: dict | None,
                why: str, host_alive: bool, gone: set[str] | None = None) -> Job:
    """The job's instance was (or is being) taken back. End its attempt; with restarts left
    the job goes to `recovering` for the supervisor, else it fails. Whatever the job still
    holds is released. `job` is the snapshot the caller decided on: only if the job is still
    in that state (compare-and-set), and, with `gone` (the instances the cloud says are
    gone), still on one of those, is anything done: two processes noticing the same loss,
    or one noticing it late, never end the next attempt."""
    from . import jobs, ledger, providers, supervisor

    spec = JobSpec.from_dict(job.spec)
    current = store.attempt(job.id)
    if current is None:  # a job launched before attempts were recorded
        store.add_attempt(job.id, 1, started_at=job.created_at)
        current = store.attempt(job.id)
    mine = {i.id for i in instances_of(store, job.id, current)}
    if current.ended_at is not None or (gone is not None and mine and not mine & gone):
        return store.job(job.id)
    if host_alive:  # its logs and last files, while it still answers
        try:
            jobs.collect_files(store, job)
        except CloudtrainError:
            pass
    ended = ((status or {}).get("ended_at")) or time.time()
    ckpt = (status or {}).get("checkpoint_stream")
    if current.n - 1 >= spec.max_restarts:
        new_state = state.FAILED
        reason = (f"{why}; --max-restarts {spec.max_restarts} used up after {current.n} "
                  f"attempt{'s' if current.n > 1 else ''}")
    else:
        new_state = state.RECOVERING
        reason = f"{why}; relaunching (attempt {current.n + 1} of at most " \
                 f"{spec.max_restarts + 1})"
    if not store.set_state(job.id, new_state, reason=reason, detail=reason, expect=job.state):
        return store.job(job.id)  # someone else acted first (another process, or `down`)
    store.update_attempt(job.id, current.n, only_if_open=True, ended_at=ended,
                         outcome=INTERRUPTED, end_reason=why,
                         last_step=_last_step(job, status), checkpoint=ckpt)
    if ckpt and ckpt.get("final"):
        store.add_event(job.id, "checkpoint", detail=_upload_line(ckpt))
    jobs._forget_host(job.id)
    if new_state == state.FAILED:
        jobs._finish(store, store.job(job.id), collect=False, force=True)
        return store.job(job.id)
    try:
        providers.get(job.backend).release(store, store.job(job.id), force=True)
    except CloudtrainError as exc:  # `down` and the next relaunch's release try again
        store.add_event(job.id, "release", detail=f"RELEASE FAILED: {exc.message}")
    ledger.settle(store, store.job(job.id))
    result = store.job(job.id)
    supervisor.ensure(store, settings)
    return result


def _upload_line(ckpt: dict) -> str:
    if not ckpt.get("ok"):
        return ("the checkpoint taken at the notice did NOT reach the job store"
                + (f": {ckpt['error']}" if ckpt.get("error") else ""))
    size = (ckpt.get("bytes") or 0) / 1e6
    secs = ckpt.get("seconds") or 0.0
    rate = f", {size / secs:.0f} MB/s" if secs else ""
    step = f" (step {ckpt['step']})" if isinstance(ckpt.get("step"), int) else ""
    return (f"the checkpoint taken at the notice{step} reached the job store: {size:.1f} MB "
            f"in {secs:.1f} s{rate}")


def close(store: Store, job: Job) -> None:
    """The job has ended: so has its open attempt (its last step known, and its outcome)."""
    current = store.attempt(job.id)
    if current is None or current.ended_at is not None:
        return
    store.update_attempt(job.id, current.n, only_if_open=True,
                         ended_at=job.ended_at or time.time(), outcome=job.state,
                         end_reason=job.reason, last_step=_last_step(job, None))


# -- relaunching ------------------------------------------------------------------------------


def places(spec: JobSpec, settings: config.Settings, home: str | None) -> list[tuple[str, str]]:
    """(region, market) in the order a relaunch tries them."""
    return spec.relaunch_places(settings, home)


def attempt_spec(spec: JobSpec, n: int, region: str, market: str,
                 interrupted_attempt: Attempt | None, store_region: str | None) -> JobSpec:
    data = spec.to_dict()
    data.update(attempt=n, region=region, market=market, store_region=store_region,
                avoid_zones=[interrupted_attempt.zone] if interrupted_attempt
                and interrupted_attempt.zone and interrupted_attempt.region == region else [])
    if market != "spot":
        data["max_price"] = None
    return JobSpec.from_dict(data)


def relaunch(store: Store, settings: config.Settings, job: Job, say=None) -> Job:
    """Continue a `recovering` job on a new instance: each place in turn (a place without
    capacity or quota is skipped), the attempt's instance tagged with its number (a restarted
    supervisor finds it), the checkpoint restored by the host from the job store. A job
    cancelled meanwhile is left alone; with no place anywhere, it waits and is tried again."""
    from . import jobs, lease, providers

    job = store.job(job.id)
    if job.state != state.RECOVERING:
        return job
    spec = JobSpec.from_dict(job.spec)
    provider = providers.get(job.backend)
    attempts = store.attempts(job.id)
    done = [a for a in attempts if a.ended_at is not None]
    last = attempts[-1] if attempts else None
    n = last.n if last is not None and last.ended_at is None else (last.n + 1 if last else 1)
    before = done[-1] if done else None
    if n - 1 > spec.max_restarts:
        return _give_up(store, job, f"--max-restarts {spec.max_restarts} used up")
    first = attempts[0] if attempts and attempts[0].n == 1 else None
    home = (before.region if before else None) or (first.region if first else None) or \
        provider.region(spec)
    store_region = first.region if first and first.region else home
    # Temporary credentials may have expired while it waited: a CredentialsError here
    # leaves the job recovering (the supervisor says so), not failed by a half-done launch.
    provider.check_credentials(home)
    try:
        found = jobs.read_datasets(spec, settings)
    except CloudtrainError as exc:
        return _give_up(store, job, f"its datasets cannot be read for the relaunch: "
                                    f"{exc.message}")
    order = places(spec, settings, home)
    if last is not None and last.ended_at is None and n > 1:  # a relaunch begun before
        order = _open_attempt_first(store, provider, job, last, order)
    failures = []
    for region, market in order:
        attempt = attempt_spec(spec, n, region, market, before, store_region)
        if not store.set_state(job.id, state.PROVISIONING, expect=state.RECOVERING,
                               detail=f"attempt {n}: {market} {attempt.instance_type} in "
                                      f"{region}"):
            return store.job(job.id)  # `down` came first
        if not store.add_attempt(job.id, n, region=region, market=market,
                                 instance_type=attempt.instance_type):
            store.update_attempt(job.id, n, region=region, market=market)
        store.update_job(job.id, launcher=f"{socket.gethostname()}:{os.getpid()}",
                         reason=None)
        if say is not None:
            say(f"job {job.id}: attempt {n}, {market} {attempt.instance_type} in {region}")
        try:
            with lease.renewing(store.path, job.id):
                jobs.start_attempt(store, settings, attempt, provider, job, say, found)
            return store.job(job.id)
        except PlacementError as exc:
            failures.append(f"{market} in {region}: {exc.message}")
            store.set_state(job.id, state.RECOVERING, expect=state.PROVISIONING,
                            detail=f"no {market} {attempt.instance_type} in {region}")
        finally:
            store.update_job(job.id, lease_until=None)
    since = before.ended_at if before and before.ended_at else time.time()
    if time.time() - since > settings.recovery_wait_minutes * 60:
        return _give_up(store, job, "no capacity for a relaunch in "
                                    f"{settings.recovery_wait_minutes:g} min: "
                                    + "; ".join(failures))
    store.update_job(job.id, reason="relaunch waits for capacity: " + "; ".join(failures))
    store.add_event(job.id, "relaunch-waiting", detail="; ".join(failures)[:500])
    return store.job(job.id)


def _open_attempt_first(store: Store, provider, job: Job, attempt: Attempt,
                        order: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """F30: a supervisor killed mid-relaunch may have started the open attempt's instance in
    any place it tried, the first place or not. Before any place is tried again, those
    instances are looked up everywhere (by the attempt's tag, and where the store has the
    job's live instances); the relaunch goes on in the region of the one it started last
    (the attempt's region), and the others are terminated, so that a place tried first
    never starts a second instance while one bills elsewhere."""
    live = provider.attempt_instances(store, job, attempt.n, [r for r, _ in order])
    if not live:
        return order
    keep = attempt.region if attempt.region in live else sorted(live)[0]
    for region, ids in sorted(live.items()):
        if region == keep:
            continue
        provider.terminate(region, ids)
        for instance in ids:
            store.update_instance(instance, state="terminated", terminated_at=time.time())
        store.add_event(job.id, "instance", detail=f"attempt {attempt.n}'s {', '.join(ids)} "
                        f"in {region} terminated: the relaunch goes on in {keep}")
    market = attempt.market or "spot"
    return [(keep, market)] + [p for p in order if p != (keep, market)]


def _give_up(store: Store, job: Job, why: str) -> Job:
    from . import jobs

    reason = f"recovery stopped: {why}"
    if store.set_state(job.id, state.FAILED, reason=reason, detail=reason,
                       expect=state.RECOVERING):
        jobs._finish(store, store.job(job.id), collect=False, force=True)
    return store.job(job.id)


def launcher_died(store: Store, job: Job) -> Job | None:
    """A relaunch whose supervisor died (or stopped renewing its lease) half-way: back to
    `recovering`, keeping the attempt and its instance (tagged with the attempt's number),
    so the restarted supervisor goes on with them. None: not a relaunch."""
    current = store.attempt(job.id)
    if not recoverable(job) or current is None or current.n < 2 or current.ended_at:
        return None
    detail = f"the supervisor stopped during attempt {current.n}'s {job.state}; it goes on"
    store.set_state(job.id, state.RECOVERING, detail=detail, reason=detail, expect=job.state)
    return store.job(job.id)


# -- what it cost ---------------------------------------------------------------------------


def summary(store: Store, job: Job) -> list[dict]:
    """One row per attempt: where, when, how it ended, the checkpoint it resumed from, the
    steps redone after it (the next attempt resumed from an earlier step than it reached),
    its cost and the estimated cost of that redone work (redone steps x its time per step x
    its price)."""
    from . import cost, ledger

    attempts = store.attempts(job.id)
    instances = {i.id: i for i in store.instances(job.id)}
    rows = []
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        redone = None
        if nxt is not None and a.last_step is not None:
            redone = max(a.last_step - (nxt.resumed_step or 0), 0)
        usd = per_s = run = None
        inst = instances.get(a.instance_id or "")
        if inst is not None:
            runs = [ledger.run_of(i) for i in instances_of(store, job.id, a)] or \
                [ledger.run_of(inst)]
            run = runs[0]
            usd = sum(cost.instance_cost(r, now=time.time()).dollars for r in runs)
            end = a.ended_at or time.time()
            if run.price_per_hour and a.running_at and a.last_step is not None:
                steps = a.last_step - (a.resumed_step or 0)
                if steps > 0:
                    per_s = (end - a.running_at) / steps
        redone_usd = None
        if redone is not None and per_s is not None:  # every node redid those steps
            redone_usd = redone * per_s * (run.price_per_hour or 0.0) / 3600 * \
                max(1, len(instances_of(store, job.id, a)))
        rows.append({"attempt": a.n, "instance": a.instance_id, "region": a.region,
                     "zone": a.zone, "market": a.market, "started_at": a.started_at,
                     "running_at": a.running_at, "ended_at": a.ended_at,
                     "outcome": a.outcome or ("running" if job.active else job.state),
                     "reason": a.end_reason, "resumed_step": a.resumed_step,
                     "resumed_checkpoint": a.resumed_seq, "last_step": a.last_step,
                     "redone_steps": redone, "redone_usd": redone_usd, "usd": usd,
                     "checkpoint": a.checkpoint})
    return rows


def recovery_cost(rows: list[dict]) -> dict:
    """What the interruptions cost: steps redone and their estimated price, and the time and
    price of the attempts after the first up to their training start (boot, sync, restore)."""
    redone = sum(r["redone_steps"] or 0 for r in rows)
    redone_usd = sum(r["redone_usd"] or 0.0 for r in rows)
    return {"attempts": len(rows), "interruptions": sum(r["outcome"] == INTERRUPTED
                                                        for r in rows),
            "redone_steps": redone, "redone_usd": round(redone_usd, 4)}


def resumable(spec: JobSpec) -> bool:
    """Whether the recipe can be told to resume (its `resume` argument)."""
    if spec.kind != RECIPE:
        return False
    from . import recipes

    return "resume" in recipes.load(spec.recipe).arguments
