"""Stage: a job that AWS Auto Scaling relaunches (issue 27), seen from the launching machine.

While the laptop was closed, the job's group replaced a lost instance by itself; the
replacement's bootstrap wrote `attempts/<n>.json` to the job store, and the agent that ended
the job wrote `final.json` and deleted the group. Here that becomes the job's record: each
attempt and its instance (so the bill prices every instance the job ran on), then the end.
Nothing here relaunches or releases anything while the job runs: AWS does the one, the agent
the other.

    grouped(job)                     whether the job runs in an Auto Scaling group
    learn(store, job)                the store's attempts recorded here; its final record
    lost(store, job, states, why)    the recorded instance is gone: the job goes on elsewhere
                                     (None), or its end is known (the final record)

It calls attempts (the ledger) and group (the hosts this process keeps open), and nothing
else of the lifecycle.
"""

from __future__ import annotations

import time

from .. import providers
from ..errors import CloudtrainError
from ..market import Market
from ..state import Instance, Job, Store
from . import attempts, group

REPLACED = "taken back; relaunched by AWS Auto Scaling"


def grouped(job: Job) -> bool:
    return bool((job.spec or {}).get("auto_scaling_group"))


def learn(store: Store, job: Job) -> dict | None:
    """Record the attempts the job store holds that this machine has not seen (each one's
    instance too, and the end of the one before it); the job's final record, or None while
    it runs. A group that AWS emptied (the deadline's scheduled action) or that is gone,
    with no final record, is the job's end too: nothing runs it any more."""
    record = providers.get(job.backend).group_record(store, job)
    final = record["final"] or _ended_without_word(record.get("group"))
    known = {a.n: a for a in store.attempts(job.id)}
    if not known:
        store.add_attempt(job.id, 1, started_at=job.created_at)
        known = {a.n: a for a in store.attempts(job.id)}
    instances = {i.id for i in store.instances(job.id)}
    spec = job.spec or {}
    region = spec.get("region") or next((i.region for i in store.instances(job.id)
                                         if i.region), None)
    for doc in record["attempts"]:
        n = doc["attempt"]
        if n in known and known[n].resumed_step is None and doc["resumed_step"] is not None:
            store.update_attempt(job.id, n, resumed_step=doc["resumed_step"],
                                 resumed_seq=doc["resumed_seq"])  # said after the restore
        if n == 1 or n in known:
            continue
        started = doc["started_at"]
        before = known.get(n - 1) or store.attempt(job.id)
        if before is not None and before.ended_at is None:
            store.update_attempt(job.id, before.n, only_if_open=True,
                                 ended_at=started, outcome=attempts.INTERRUPTED,
                                 end_reason=REPLACED)
        if doc["instance"] not in instances:
            store.add_instance(Instance(
                id=doc["instance"], job_id=job.id, provider=job.backend, region=region,
                zone=doc["zone"], instance_type=doc["type"] or spec.get("instance_type"),
                market=Market.ON_DEMAND if doc["lifecycle"] == "on-demand" else Market.SPOT,
                state="running", launched_at=started, terminated_at=None,
                price_per_hour=None,
                details={"auto_scaling_group": spec.get("auto_scaling_group"), "attempt": n}))
            instances.add(doc["instance"])
            store.add_event(job.id, "instance", detail=f"{doc['instance']} in {doc['zone']} "
                                                       f"(attempt {n}, by AWS Auto Scaling)")
        store.add_attempt(job.id, n, started_at=started, instance_id=doc["instance"],
                          region=region, zone=doc["zone"], market=doc["lifecycle"],
                          instance_type=doc["type"] or spec.get("instance_type"),
                          running_at=started, resumed_step=doc["resumed_step"],
                          resumed_seq=doc["resumed_seq"])
        known[n] = store.attempt(job.id, n)
    return final


def _ended_without_word(group: dict | None) -> dict | None:
    """The job's end where no agent recorded one: its group at 0 (the scheduled action at
    the deadline: every agent was broken) or deleted (by `down`, or by hand)."""
    if group is None or not (group.get("gone") or group.get("desired") == 0):
        return None
    why = ("the job's Auto Scaling group was deleted with no end recorded by its agent"
           if group.get("gone") else
           "the max runtime passed: AWS Auto Scaling's scheduled action set the job's group to "
           "0 at the deadline, with no end recorded by its agent")
    return {"state": "failed", "exit_code": None, "reason": why, "ended_at": time.time(),
            "attempt": None}


def lost(store: Store, job: Job, states: dict, why: str) -> dict | None:
    """The job's recorded instance is gone (EC2's `states` of every instance tagged with the
    job). The final record where the job has ended; else None, the job's reason saying
    where it went on (a replacement running now) or that AWS is relaunching it."""
    final = learn(store, job)
    if final is not None:
        return final
    live = [i for i, s in states.items() if s["state"] in ("pending", "running")]
    current = store.attempt(job.id)
    if live and current is not None and current.instance_id in live:
        line = (f"{why}; AWS Auto Scaling relaunched it: attempt {current.n} on "
                f"{current.instance_id}")
        try:  # from now on status, logs and down reach the job there
            host = providers.get(job.backend).follow_replacement(store, job,
                                                                 current.instance_id)
        except CloudtrainError as exc:
            line += f" (not reachable yet: {exc.message})"
        else:
            store.update_job(job.id, host=host, reason=None)
            store.add_event(job.id, "replacement", detail=f"attempt {current.n} on "
                                                          f"{current.instance_id} "
                                                          f"({host['host']})")
            group.forget(job.id)
            return None
    else:
        line = f"{why}; AWS Auto Scaling is relaunching it"
    store.update_job(job.id, reason=line)
    return None
