"""Stage: a job that AWS Auto Scaling relaunches (issue 27), seen from the launching machine.

While the laptop was closed, the job's group replaced a lost instance by itself; the
replacement's bootstrap wrote `attempts/<n>.json` to the job store, and the agent that ended
the job wrote `final.json` and deleted the group. Here that becomes the job's record: each
attempt and its instance (so the bill prices every instance the job ran on), then the end.
Nothing here relaunches or releases anything while the job runs: AWS does the one, the agent
the other.

    grouped(job)                     whether the job runs in an Auto Scaling group
    learn(store, job)                the store's attempts recorded here; its final record
    not_the_job_s(instance, ec2, job, launched)  why AWS does not bear out that an instance
                                     is the job's (EC2, or its group's scaling activities)
    ends_here(final, store, job, ec2)  final.json as the end, where it fits EC2 and attempts
    lost(store, job, states, why)    the recorded instance is gone: the job goes on elsewhere
                                     (None), or its end is known (the final record)
    switch_words(spec, doc)          the timeline's word for an instance that set the job's
                                     group to on-demand (a deadline)

It calls attempts (the ledger) and group (the hosts this process keeps open), and nothing
else of the lifecycle.
"""

from __future__ import annotations

import time

from .. import deadline, providers
from ..errors import CloudtrainError, UsageError
from ..market import Market
from ..providers.base import CloudRecovery
from ..state import SUCCEEDED, Instance, Job, Store
from . import attempts, group

REPLACED = "taken back; relaunched by AWS Auto Scaling"


def grouped(job: Job) -> bool:
    return bool(job.facts.auto_scaling_group)


def recovery_of(job: Job, provider=None) -> CloudRecovery:
    """The provider of a job its cloud relaunches by itself (`provider`: the job's, already
    at hand): only a CloudRecovery makes the group such a job runs in."""
    provider = provider or providers.get(job.backend)
    if not isinstance(provider, CloudRecovery):
        raise UsageError(f"job {job.id}: the {job.backend} backend relaunches no job by itself")
    return provider


def learn(store: Store, job: Job) -> dict | None:
    """Record the attempts the job store holds that this machine has not seen (each one's
    instance too, and the end of the one before it); the job's final record, or None while
    it runs. A group that AWS emptied (the deadline's scheduled action) or that is gone,
    with no final record, is the job's end too: nothing runs it any more.

    The job store is written through the job's grant, which any of its instances holds (and
    anyone who read it): a record is believed only where AWS agrees. An attempt is the
    job's only if EC2 shows its instance with the job's tag (and in the job's group), or,
    where EC2 no longer lists it (it stops about an hour after an instance's end), if the
    job's group's scaling activities show the group launched it: AWS Auto Scaling's own
    record, kept 6 weeks, which gives its launch and end for the bill too. Any other is
    passed over, said once, neither recorded nor priced (`release` would terminate what is
    recorded). final.json is the end only if it fits what EC2 and the attempts say
    (ends_here). Recording is idempotent: `status` and the supervisor may learn the same
    attempts at the same moment."""
    provider = providers.get(job.backend)
    group_provider = recovery_of(job, provider)
    record = group_provider.group_record(store, job)
    known = {a.n: a for a in store.attempts(job.id)}
    if not known:
        store.add_attempt(job.id, 1, started_at=job.created_at)
        known = {a.n: a for a in store.attempts(job.id)}
    spec = job.spec
    region = spec.placement.region or next((i.region for i in store.instances(job.id)
                                         if i.region), None)
    fresh = [d for d in record["attempts"] if d["attempt"] != 1 and d["attempt"] not in known]
    # EC2's view of the job's instances: only those that carry its tag are in it.
    ec2 = provider.instance_states(store, job) if fresh or record["final"] else {}
    manifest: list = []  # the latest streamed checkpoint's manifest, read once if needed
    launched: list = []  # the group's own record of its launches, read once if needed
    for doc in record["attempts"]:
        n = doc["attempt"]
        if n in known and known[n].resumed_step is None and doc["resumed_step"] is not None \
                and doc["instance"] == known[n].instance_id:
            store.update_attempt(job.id, n, resumed_step=doc["resumed_step"],
                                 resumed_seq=doc["resumed_seq"])  # said after the restore
        if n == 1 or n in known:
            continue
        seen = None
        if doc["instance"] not in ec2:
            seen = _launches(store, job, launched).get(doc["instance"])
        why = not_the_job_s(doc["instance"], ec2, job, launched[0] if launched else None)
        if why is not None:
            store.add_event(job.id, PASSED_OVER, once=True, detail=(
                f"attempts/{n}.json names {doc['instance']}, {why}: not taken as the job's "
                "(neither recorded nor priced)"))
            continue
        started = doc["started_at"]
        before = known.get(n - 1) or store.attempt(job.id)
        if before is not None and before.ended_at is None:
            store.update_attempt(job.id, before.n, only_if_open=True,
                                 ended_at=started, outcome=attempts.INTERRUPTED,
                                 end_reason=REPLACED,
                                 last_step=_last_step(store, job, before, manifest))
        # Where EC2 no longer lists the instance, the group's record of it has its times
        # and AZ (AWS's, not the job store's) for the bill.
        seen = seen or {}
        store.add_instance(Instance(
            id=doc["instance"], job_id=job.id, provider=job.backend, region=region,
            zone=seen.get("zone") or doc["zone"],
            instance_type=doc["type"] or spec.placement.instance_type,
            market=Market.ON_DEMAND if doc["lifecycle"] == "on-demand" else Market.SPOT,
            state="terminated" if seen.get("terminated_at") else "running",
            launched_at=seen.get("launched_at") or started,
            terminated_at=seen.get("terminated_at"), price_per_hour=None,
            details={"auto_scaling_group": job.facts.auto_scaling_group, "attempt": n,
                     **({"seen_in": "scaling activities"} if seen else {})}),
            event=("instance", f"{doc['instance']} in {doc['zone']} (attempt {n}, by AWS "
                               "Auto Scaling)"))
        store.add_attempt(job.id, n, started_at=started, instance_id=doc["instance"],
                          region=region, zone=doc["zone"], market=doc["lifecycle"],
                          instance_type=doc["type"] or spec.placement.instance_type,
                          running_at=started, resumed_step=doc["resumed_step"],
                          resumed_seq=doc["resumed_seq"])
        added = store.attempt(job.id, n)
        assert added is not None  # added just above
        known[n] = added
    for n, doc in sorted((record.get("switched") or {}).items()):
        if known.get(n) is not None and known[n].instance_id == doc["instance"]:
            store.add_event(job.id, "deadline", once=True, detail=switch_words(spec, doc))
    reached = record.get("reached") or {}  # how far each got, said by its own instances
    for a in store.attempts(job.id):
        if reached.get(a.n) is not None and (a.last_step or -1) < reached[a.n]:
            store.update_attempt(job.id, a.n, last_step=reached[a.n])
    named = (record["final"] or {}).get("instance")
    if named and named not in ec2:
        _launches(store, job, launched)
    final, why = ends_here(record["final"], store, job, ec2, record.get("group"),
                           launched[0] if launched else None)
    if why is not None:
        store.add_event(job.id, PASSED_OVER, once=True, detail=(
            f"final.json ({record['final']['state']}) is not taken as the job's end: {why}"))
    return final or _ended_without_word(record.get("group"))


PASSED_OVER = "passed-over"  # the event of a job store record that EC2 does not bear out
LIVE = ("pending", "running")


def switch_words(spec, doc: dict) -> str:
    """The timeline's word for an attempt's instance that set the job's group to on-demand
    (attempts/<n>/switched.json, from the job's own recorded instance): when the plan's
    switch was, and when the group took it; or why it could not."""
    switch_at = ((spec.expected or {}).get("deadline") or {}).get("switch_at")
    planned = f"the switch was at {deadline.hm(switch_at)}; " \
        if isinstance(switch_at, (int, float)) else ""
    if doc["ok"]:
        return (f"on-demand: {planned}attempt {doc['attempt']}'s spot instance "
                f"{doc['instance']} set its group to on-demand at {deadline.hm(doc['at'])}")
    return (f"spot still: {planned}attempt {doc['attempt']}'s instance {doc['instance']} could "
            f"not set its group to on-demand: {doc['line']}")[:500]


def not_the_job_s(instance: str, ec2: dict, job: Job, launched: dict | None = None
                  ) -> str | None:
    """Why `instance` is not the job's as AWS sees it (`ec2`: instance_states, the instances
    that carry the job's tag; `launched`: where it was read, group_launches, the instances
    the job's group launched by its scaling activities), or None where it is. The group's
    tag (which only AWS Auto Scaling sets: no principal may write an aws: tag) must name the
    job's group on a live instance; one that has left its group (detached, or ended by the
    group) may no longer carry it. An instance EC2 does not list with the job's tag is the
    job's where its group's activities show it launched it (only AWS writes those): EC2
    forgets an ended instance after about an hour, the activities after 6 weeks."""
    seen = ec2.get(instance)
    group = job.facts.auto_scaling_group
    if seen is not None and seen.get("job") != job.id:  # a recorded one, looked up by id
        seen = None
    if seen is None:
        if launched is not None and instance in launched:
            return None
        said = (f", nor the scaling activities of the job's group {group} (6 weeks of them) "
                "as one it launched") if launched is not None else ""
        return (f"which EC2 does not show with the job's tag (cloudtrain:job={job.id}; it "
                f"stops listing an instance about an hour after its end){said}")
    if group and seen.get("group") != group and (
            seen.get("group") is not None or seen.get("state") in LIVE):
        where = f"Auto Scaling group {seen['group']}" if seen.get("group") else \
            "no Auto Scaling group"
        return f"which EC2 shows in {where}, not in the job's {group}"
    return None


def ends_here(final: dict | None, store: Store, job: Job, ec2: dict,
              group: dict | None = None, launched: dict | None = None
              ) -> tuple[dict | None, str | None]:
    """final.json as the job's end where it fits what EC2 and the attempts say, else
    (None, why not). An agent's end names its attempt (or its instance, that attempt's); a
    bootstrap that found the restarts used up names the last attempt and itself; one that
    could not start the job names neither, and says failed. Whatever it names must be the
    job's, and no later attempt of the job may still run: a success while a replacement
    trains is not the end. Where nothing runs the job any more (its `group` deleted or at
    0, no instance of it live), it is the end whatever it names: EC2 stops listing an
    instance about an hour after it ended, so the records of a job that ended while this
    machine was off for longer cannot be checked, and nothing contradicts them."""
    if final is None:
        return None, None
    why = _final_unfit(final, store, job, ec2, launched)
    if why is None:
        return final, None
    stopped = (group or {}).get("gone") or (group or {}).get("desired") == 0
    anonymous = final.get("attempt") is None and final.get("instance") is None
    if stopped and not any(s.get("state") in LIVE for s in ec2.values()) and not (
            anonymous and final["state"] == SUCCEEDED):
        return final, None
    return None, why


def _final_unfit(final: dict, store: Store, job: Job, ec2: dict,
                 launched: dict | None) -> str | None:
    have = {a.n: a for a in store.attempts(job.id)}
    n, instance = final.get("attempt"), final.get("instance")
    if n is not None and n not in have:
        return f"it names attempt {n}, which the job does not have"
    if instance is not None:
        why = not_the_job_s(instance, ec2, job, launched)
        if why is not None:
            return f"it names {instance}, {why}"
        if n is None:
            n = next((a.n for a in have.values() if a.instance_id == instance), None)
    if n is None and final["state"] == SUCCEEDED:
        return "a success that names no attempt or instance of the job"
    later = [a for k, a in sorted(have.items()) if n is not None and k > n and a.instance_id
             and (ec2.get(a.instance_id) or {}).get("state") in LIVE]
    if later:
        return (f"attempt {later[-1].n} of the job still runs on {later[-1].instance_id} "
                f"(final.json names attempt {n})")
    return None


def _launches(store: Store, job: Job, launched: list) -> dict:
    """The instances the job's group launched (provider.group_launches), read once per look
    (`launched` caches it: [] until read). Where they cannot be read (AWS refuses the
    policy's missing action, or fails), {}: the attempts that need them are passed over as
    without them, and one WARNING line says why."""
    if not launched:
        try:
            provider = recovery_of(job)
            launched.append(provider.group_launches(store, job))
        except CloudtrainError as exc:
            launched.append(None)  # unknown, not "none launched"
            group = job.facts.auto_scaling_group
            store.add_event(job.id, PASSED_OVER, once=True, detail=(
                f"WARNING: the scaling activities of the job's Auto Scaling group {group} could "
                f"not be read ({' '.join(exc.message.split())}): an attempt whose instance EC2 "
                "no longer lists is passed over (infra/iam-policy-autoscaling.json allows it)"))
    return launched[0] or {}


def _last_step(store: Store, job: Job, attempt, manifest: list) -> int | None:
    """The last step an attempt that AWS replaced is known to have run: the step of the
    latest checkpoint it streamed to the job store (its manifest names the attempt), or its
    latest metrics row's where this machine followed that attempt's instance (`status`
    refreshed the job's metrics from it), whichever is later. `manifest` caches the
    manifest across the attempts of one look ([] until read)."""
    steps = []
    host = (job.host or {}).get("host")
    at = [i.id for i in store.instances(job.id) if host and (i.details or {}).get("address")
          == host]
    if at == [attempt.instance_id]:
        step = attempts.last_step(job, None)
        if step is not None:
            steps.append(step)
    if not manifest:
        try:
            manifest.append(providers.get(job.backend).checkpoint_plan(store, job, 60.0) or {})
        except CloudtrainError:
            manifest.append({})
    if manifest[0].get("attempt") == attempt.n and isinstance(manifest[0].get("step"), int):
        steps.append(manifest[0]["step"])
    return max(steps) if steps else None


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
    if live and current is not None and current.instance_id is not None \
            and current.instance_id in live:
        line = (f"{why}; AWS Auto Scaling relaunched it: attempt {current.n} on "
                f"{current.instance_id}")
        try:  # from now on status, logs and down reach the job there
            provider = recovery_of(job)
            host = provider.follow_replacement(store, job, current.instance_id)
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
