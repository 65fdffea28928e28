"""Stage: recovery, the relaunch of a job whose spot instance was taken (watch.interrupted
put it in `recovering`): the next AZ, region or market, a new instance through launch's one
path, the checkpoint restored. The top of the lifecycle: it may call every other stage
(launch, plan, collect, watch, attempts, lease, supervisor).

    places(spec, settings, home)          where a relaunch tries, in order
    attempt_spec(spec, n, region, ..)     the spec and facts of attempt n in one place
    relaunch(store, settings, job, say)   the supervisor's step: the next place, a new
                                          instance, the checkpoint restored
    round_(store, settings, job, ..)      one supervisor round on one job: refresh it,
                                          relaunch it when due
    supervise(home, handover)             the supervisor process (`cloudtrain supervisor run`)

Where a relaunch goes: the other AZs of the region first (the current spot prices decide
their order, the interrupted AZ last), then the other allowed regions (`regions:` in
config.yaml; not for a job whose data is an EBS snapshot, which lives in one region), then,
with `--fallback on-demand`, the same places on demand. A place with no capacity or no quota
is skipped; with none anywhere the job waits in `recovering` and is tried again every
`recovery_retry_seconds`, up to `recovery_wait_minutes` after the interruption.

Who does it: the supervisor (supervisor.py), a process of its own on the launching machine.
Everything it knows is in the store (the job's state and attempts, attempts.py) and in EC2's
tags (the attempt's instance), so a supervisor killed half-way is restarted and goes on: with
the instance it had started, in whichever region that was, never beside it.

This module never imports boto3 or paramiko: the provider and the hosts do that.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path

from .. import config, providers, state
from ..errors import CloudtrainError, CredentialsError, PlacementError
from ..market import Market
from ..spec import JobFacts, JobSpec
from ..state import Attempt, Job, Store
from . import lease, supervisor
from .collect import finish
from .launch import start_attempt
from .plan import deadline_decision, read_datasets
from .watch import refresh


def places(spec: JobSpec, settings: config.Settings, home: str | None) -> list[tuple[str, str]]:
    """(region, market) in the order a relaunch tries them."""
    return spec.relaunch_places(settings, home)


def deadline_places(store: Store, job: Job, order: list[tuple[str, str]], now: float | None = None
                    ) -> list[tuple[str, str]]:
    """A job with a deadline: its relaunch stays on spot while the work left, with the
    interruptions seen so far, fits before the deadline (deadline.py); once the slack is out,
    on-demand in the same regions. Said in the timeline either way."""
    now = time.time() if now is None else now
    seen = [a for a in store.attempts(job.id) if a.ended_at is not None and a.market == Market.SPOT]
    hours = sum(max(0.0, a.ended_at - (a.running_at or a.started_at or a.ended_at))
                for a in seen if a.ended_at is not None) / 3600.0
    decided = deadline_decision(job.spec, now=now, work_s=work_left(job), spot_hours=hours,
                                interruptions=len(seen))
    if decided is None:
        return order
    store.add_event(job.id, "deadline", detail=decided.why[:500])
    if decided.market == Market.SPOT:
        return order
    regions = list(dict.fromkeys(region for region, _ in order))
    if job.spec.placement.reservation:  # on-demand in the reservation: in its region only
        regions = regions[:1]
    return [(region, Market.ON_DEMAND) for region in regions]


def work_left(job: Job) -> float | None:
    """Training seconds the job has left, from its estimate and how far it got (its last
    epoch of its epochs); None where neither is known (the max runtime then bounds it)."""
    train = (job.spec.expected or {}).get("train_s")
    epochs = job.spec.args.get("epochs")
    done = (job.metrics or {}).get("epoch") if isinstance(job.metrics, dict) else None
    if not isinstance(train, (int, float)) or train <= 0:
        return None
    if isinstance(epochs, int) and epochs > 0 and isinstance(done, (int, float)) and done >= 0:
        return train * max(0.0, 1.0 - min(float(done), float(epochs)) / epochs)
    return float(train)


def attempt_spec(spec: JobSpec, n: int, region: str, market: str,
                 interrupted_attempt: Attempt | None, store_region: str | None
                 ) -> tuple[JobSpec, JobFacts]:
    """Attempt n in one place: the job's spec there (no spot price cap on demand), and the
    attempt's facts (its number, the zone just interrupted if in that region, the job
    store's region), which the relaunch keeps with the job before it launches."""
    avoid = (interrupted_attempt.zone,) if interrupted_attempt and interrupted_attempt.zone \
        and interrupted_attempt.region == region else ()
    there = spec.changed(region=region, market=Market(market),
                         max_price=spec.placement.max_price if market == Market.SPOT else None)
    return there, JobFacts(attempt=n, avoid_zones=avoid, store_region=store_region)


def relaunch(store: Store, settings: config.Settings, job: Job, say=None) -> Job:
    """Continue a `recovering` job on a new instance: each place in turn (a place without
    capacity or quota is skipped), the attempt's instance tagged with its number (a restarted
    supervisor finds it), the checkpoint restored by the host from the job store. A job
    cancelled meanwhile is left alone; with no place anywhere, it waits and is tried again."""
    job = store.job(job.id)
    if job.state != state.RECOVERING:
        return job
    spec = job.spec
    provider = providers.get(job.backend)
    attempts = store.attempts(job.id)
    done = [a for a in attempts if a.ended_at is not None]
    last = attempts[-1] if attempts else None
    n = last.n if last is not None and last.ended_at is None else (last.n + 1 if last else 1)
    before = done[-1] if done else None
    if n - 1 > spec.recovery.max_restarts:
        return _give_up(store, job, f"--max-restarts {spec.recovery.max_restarts} used up")
    first = attempts[0] if attempts and attempts[0].n == 1 else None
    home = (before.region if before else None) or (first.region if first else None) or \
        provider.account.region(spec)
    store_region = first.region if first and first.region else home
    # Temporary credentials may have expired while it waited: a CredentialsError here
    # leaves the job recovering (the supervisor says so), not failed by a half-done launch.
    provider.account.check_credentials(home)
    try:
        spec, found = read_datasets(spec, settings)
    except CloudtrainError as exc:
        return _give_up(store, job, f"its datasets cannot be read for the relaunch: "
                                    f"{exc.message}")
    order = deadline_places(store, job, places(spec, settings, home))
    if last is not None and last.ended_at is None and n > 1:  # a relaunch begun before
        order = _open_attempt_first(store, provider, job, last, order)
    failures = []
    for region, market in order:
        attempt, facts = attempt_spec(spec, n, region, market, before, store_region)
        if not store.set_state(job.id, state.PROVISIONING, expect=state.RECOVERING,
                               detail=f"attempt {n}: {market} {attempt.placement.instance_type} in "
                                      f"{region}"):
            return store.job(job.id)  # `down` came first
        if not store.add_attempt(job.id, n, region=region, market=market,
                                 instance_type=attempt.placement.instance_type):
            store.update_attempt(job.id, n, region=region, market=market)
        store.update_job(job.id, launcher=f"{socket.gethostname()}:{os.getpid()}",
                         reason=None)
        if say is not None:
            say(f"job {job.id}: attempt {n}, {market} {attempt.placement.instance_type} in "
                f"{region}")
        try:
            store.record_facts(job.id, attempt=facts.attempt, avoid_zones=list(facts.avoid_zones),
                               store_region=facts.store_region)
            with lease.renewing(store.path, job.id):
                start_attempt(store, settings, attempt, provider, store.job(job.id), say, found)
            return store.job(job.id)
        except PlacementError as exc:
            failures.append(f"{market} in {region}: {exc.message}")
            store.set_state(job.id, state.RECOVERING, expect=state.PROVISIONING,
                            detail=f"no {market} {attempt.placement.instance_type} in {region}")
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
    """A supervisor killed mid-relaunch may have started the open attempt's instance in
    any place it tried, the first place or not. Before any place is tried again, those
    instances are looked up everywhere (by the attempt's tag, and where the store has the
    job's live instances); the relaunch goes on in the region of the one it started last
    (the attempt's region), and the others are terminated, so that a place tried first
    never starts a second instance while one bills elsewhere."""
    live = provider.attempt_instances(store, job, attempt.n, [r for r, _ in order])
    if not live:
        return order
    keep = attempt.region if attempt.region is not None and attempt.region in live \
        else sorted(live)[0]
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
    reason = f"recovery stopped: {why}"
    if store.set_state(job.id, state.FAILED, reason=reason, detail=reason,
                       expect=state.RECOVERING):
        finish(store, store.job(job.id), collect=False, force=True)
    return store.job(job.id)


def round_(store: Store, settings: config.Settings, job: Job, next_try: dict[str, float],
           credentials: str = supervisor.FROM_CHAIN) -> None:
    """One look at one job: refresh a running one (an interruption shows up here), relaunch a
    recovering one when it is due. One job's trouble never stops the others, except
    credentials the cloud refuses: said on every job it watches, and it leaves
    (supervisor.Stop)."""
    say = supervisor.say
    try:
        job = refresh(store, settings, job)
        if job.state != state.RECOVERING or time.time() < next_try.get(job.id, 0.0):
            return
        say(f"job {job.id}: relaunching ({job.reason})")
        job = relaunch(store, settings, job, say=say)
        if job.state == state.RECOVERING:  # nowhere to go yet: ask again later
            next_try[job.id] = time.time() + settings.recovery_retry_seconds
            say(f"job {job.id}: {job.reason}; next try in "
                f"{settings.recovery_retry_seconds:g} s")
        else:
            next_try.pop(job.id, None)
            say(f"job {job.id}: {job.state}")
    except CredentialsError as exc:
        what = ("the credentials it was started with (from the environment) were refused, "
                "expired perhaps" if credentials == supervisor.FROM_ENVIRONMENT else
                "the AWS chain's credentials were refused, expired perhaps")
        note = (f"recovery paused: {what}: {exc.message}; any cloudtrain command run with "
                "valid AWS credentials restarts the supervisor")
        for watched_job in supervisor.watched(store):
            store.update_job(watched_job.id, reason=note)
            store.add_event(watched_job.id, "supervisor", detail=note)
        say(note)
        raise supervisor.Stop() from exc
    except CloudtrainError as exc:
        say(f"job {job.id}: {exc.message}")
    except Exception as exc:  # a bug must not end recovery for every job
        import traceback

        say(f"job {job.id}: internal error: {type(exc).__name__}: {exc}")
        traceback.print_exc()


def supervise(home: Path | None = None, handover: Path | None = None) -> int:
    """The recovery supervisor (`cloudtrain supervisor run`): supervisor.run doing round_ on
    every job it watches."""
    return supervisor.run(home, handover, round_)
