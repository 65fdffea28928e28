"""Stage: the attempts ledger of a job launched to recover (spot recovery): one job, several
attempts, until it ends or its restarts are used up. Low in the order so that launch, watch
and collect record into it; it calls nothing of the lifecycle.

    recoverable(job)                      an active spot job launched to recover
    begin(store, job, spec)               attempt 1, at launch
    placed(store, job_id, n)              the attempt's instance, once it exists
    started(store, job_id, n, at)         the job runs on the attempt's instance
    resuming(store, job_id, n, plan)      the checkpoint the attempt resumes from
    resumable(spec)                       whether the recipe can be told to resume
    drained(job, status)                  a noticed interruption's checkpoint is uploaded
    last_step(job, status)                the last step an attempt is known to have run
    close(store, job)                     the job ended: its open attempt ends with it
    summary(store, job)                   each attempt's place (and its AZ's placement score),
                                          outcome, work redone, cost
    recovery_cost(rows)                   what the interruptions cost, in all

What ends an attempt early (an interruption) is watch.interrupted; what starts the next one
is recovery.relaunch.
"""

from __future__ import annotations

import time

from .. import cost, ledger
from ..spec import RECIPE, JobSpec
from ..state import Attempt, Job, Store

NOTICE_DRAIN_S = 150.0  # after a spot notice, how long the final checkpoint upload may take
INTERRUPTED = "interrupted"


def recoverable(job: Job) -> bool:
    return job.active and job.backend != "local" and bool(job.spec.recovery.recover)


def begin(store: Store, job: Job, spec: JobSpec) -> None:
    place = spec.placement
    store.add_attempt(job.id, 1, market=place.market, instance_type=place.instance_type,
                      region=place.region)


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
    before = store.attempt(job_id, n - 1) if n > 1 else None
    if before is not None and isinstance(step, int) and before.last_step is not None \
            and before.last_step < step:
        # It ran at least to the checkpoint it resumed from or streamed: the last step seen
        # here (its metrics, read every few seconds) can lag behind the stream's.
        store.update_attempt(job_id, n - 1, last_step=step)
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


def last_step(job: Job, status: dict | None) -> int | None:
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


def upload_line(ckpt: dict) -> str:
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
                         end_reason=job.reason, last_step=last_step(job, None))


def summary(store: Store, job: Job) -> list[dict]:
    """One row per attempt: where, when, how it ended, the checkpoint it resumed from, the
    steps redone after it (the next attempt resumed from an earlier step than it reached),
    its cost and the estimated cost of that redone work (redone steps x its time per step x
    its price)."""
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
            price = run.price_per_hour if run is not None else None  # per_s: run is set
            redone_usd = redone * per_s * (price or 0.0) / 3600 * \
                max(1, len(instances_of(store, job.id, a)))
        rows.append({"attempt": a.n, "instance": a.instance_id, "region": a.region,
                     "zone": a.zone, "type": a.instance_type or (inst.instance_type if inst
                                                                 else None),
                     "score": _score(inst), "market": a.market,
                     "started_at": a.started_at,
                     "running_at": a.running_at, "ended_at": a.ended_at,
                     "outcome": a.outcome or ("running" if job.active else job.state),
                     "reason": a.end_reason, "resumed_step": a.resumed_step,
                     "resumed_checkpoint": a.resumed_seq, "last_step": a.last_step,
                     "redone_steps": redone, "redone_usd": redone_usd, "usd": usd,
                     "checkpoint": a.checkpoint})
    return rows


def _score(inst) -> int | None:
    """The spot placement score EC2 gave the attempt's AZ when it was launched, if any."""
    score = ((inst.details or {}) if inst is not None else {}).get("placement_score")
    return score if type(score) is int else None


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
    from .. import recipes

    assert spec.recipe is not None  # asked of a recipe job
    return "resume" in recipes.load(spec.recipe).arguments
