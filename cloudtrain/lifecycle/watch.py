"""Stage: watch, while a job runs: its record brought up to date from its host (one probe
round trip a node), and what it means when a host does not answer (its instance gone: the
job's end read from the job store; a spot instance taken: the attempt ends, interrupted),
when the agent says the job ended (collect), or when the launcher died. It may call kept (a job
queued on a kept instance), collect, scripts, group, attempts, secrets and supervisor (to start
it for a relaunch).

    refresh(store, settings, job)         one job, brought up to date
    refresh_active(store, settings)       every active job, each one's trouble noted on it
    interrupted(store, settings, job, ..) the instance was taken: end the attempt; relaunch
                                          (the supervisor does) or fail, and release it
    launcher_died(store, job)             a relaunch whose supervisor died goes on
    spot_reason(states)                   whether EC2 says it took a spot instance back
"""

from __future__ import annotations

import socket
import time

from .. import config, datasets, ledger, nodes, providers, state
from ..host.job_processes import pid_alive
from ..errors import CloudtrainError, HostError
from ..state import Job, Store
from . import attempts, autoscaled, group, kept, supervisor
from .collect import (collect_files, finish, from_job_store, mark_node_collected,
                      node_from_store, probe_files, record_node_agents, record_set_up,
                      record_staged, stop_nodes)

UNREACHABLE = "host unreachable"  # the reason a job has while its host does not answer


def refresh(store: Store, settings: config.Settings, job: Job) -> Job:
    """Bring an active job's record up to date from its host (one probe round trip)."""
    if job.state == state.QUEUED:  # on a kept instance: started there since?
        job = kept.refresh_queued(store, settings, job)
        if job.state == state.QUEUED or not job.active:
            return job
    if job.state == state.RECOVERING:  # the supervisor's to relaunch
        return job
    if job.active and not state.on_host(job):
        return _check_launcher(store, job)
    if not job.active or not job.jobdir:
        return job
    if (job.host or {}).get("collected_from") is not None:
        # Its files came home from the job store (from_job_store, by a process that saw its
        # instance gone and had not decided yet): no agent runs here to probe (a probe would
        # take the copy for a job whose agent never started); the end is the lost host's.
        return _host_lost(store, settings, job, HostError(
            f"job {job.id}: its instance is gone (its files were read from the job store)"))
    if len(nodes.records(job)) > 1:
        report = _probe_nodes(store, settings, job)
        if isinstance(report, Job):  # a node is lost, and what that means was decided
            return report
    else:
        try:
            report = group.host_of(job).probe_job(job.jobdir, settings.stale_after_seconds)
        except HostError as exc:
            return _host_lost(store, settings, job, exc)
    fields = {}
    if report.get("metrics"):
        fields["metrics"] = report["metrics"]
    status = report.get("status") or {}
    if status.get("started_at") and not job.started_at:
        fields["started_at"] = status["started_at"]
    staging = report.get("staging")
    if job.state == state.STAGING and staging:
        fields["metrics"] = {**(fields.get("metrics") or {}),
                             "staging": datasets.progress_line(staging)}
        if record_staged(store, job, staging):  # the data is complete: the job itself runs
            fields["metrics"] = report.get("metrics") or None
    record_set_up(store, store.job(job.id), report.get("setup"))  # its setup is done
    agent_state = status.get("state")
    if agent_state == state.PREEMPTED and autoscaled.grouped(job):
        # AWS Auto Scaling replaces the instance; nothing here relaunches or releases.
        store.update_job(job.id, reason="spot interruption notice: the checkpoint goes to the "
                                        "job store, AWS Auto Scaling relaunches the job",
                         **fields)
        return store.job(job.id)
    if agent_state == state.PREEMPTED and job.spec.recovery.recover:
        if not attempts.drained(job, status):  # the notice's checkpoint is on its way up
            stop_nodes(job, settings, wait=False)  # the other nodes' jobs checkpoint too
            store.update_job(job.id, reason="spot interruption notice: uploading the "
                                            "checkpoint", **fields)
            return store.job(job.id)
        why = "spot interruption notice" if status.get("interruption") or \
            len(nodes.records(job)) < 2 else status.get("reason") or "spot instance interrupted"
        return interrupted(store, settings, job, status, why, host_alive=True)
    if agent_state in state.TERMINAL_STATES:
        # Only the process that records the end collects and releases: two collecting at
        # once would race on the same files, and one releasing under the other cut it short.
        # The answer is of the run this snapshot saw: a relaunch since (at the same address,
        # its agent not started yet) is no job that ended.
        if store.set_state(job.id, agent_state, at=status.get("ended_at") or time.time(),
                           detail=status.get("reason"), exit_code=status.get("exit_code"),
                           reason=status.get("reason"), same_run=job, **fields):
            finish(store, job)
        return store.job(job.id)
    if (job.reason or "").startswith(UNREACHABLE):  # it answers again (an end above
        fields["reason"] = None                       # sets its own reason)
    if fields:
        store.update_job(job.id, **fields)
    if job.backend != "local":  # what it has cost so far (an estimate until it ends)
        ledger.settle(store, store.job(job.id))
    return store.job(job.id)


def refresh_active(store: Store, settings: config.Settings,
                   active: list[Job] | None = None) -> None:
    """Refresh every active job (`active`: those already read), each one's trouble noted on
    it rather than hiding the others'. Reads no finished job: `status` lists 10,000 of
    those in a fraction of a second (history.select)."""
    with providers.shared():  # one session per cloud for all of them
        for job in store.jobs(active_only=True) if active is None else active:
            try:
                refresh(store, settings, job)
            except CloudtrainError as exc:  # one job's trouble never hides the rest
                store.update_job(job.id, reason=f"could not refresh: {exc.message}")


def _probe_nodes(store: Store, settings: config.Settings, job: Job) -> dict | Job:
    """refresh's probe for a job on several machines: every node at once (one round trip
    each, on its own connection). The report is node 0's (its metrics are rank 0's) with the
    job's status combined from all nodes (nodes.combine), and the staging of the node that
    is furthest from done. A node that does not answer is looked up in the cloud: its
    instance gone means its end (what it stored in the job store, else failed, or preempted
    when EC2 took a spot instance back); still there, the job is only unreachable now."""
    recs = nodes.records(job)
    n = len(recs)

    def probe(i: int):
        try:
            jd = nodes.jobdir(job, i)
            assert jd is not None  # each node of several has its own (nodes.records)
            return group.node_host(job, i).probe_job(jd, settings.stale_after_seconds)
        except HostError as exc:
            return exc

    reports = nodes.each(probe, n)
    lost = {i: r for i, r in enumerate(reports) if isinstance(r, HostError)}
    statuses = [r.get("status") if isinstance(r, dict) else None for r in reports]
    if lost:
        verdict = _nodes_lost(store, settings, job, lost, statuses)
        if isinstance(verdict, Job):
            return verdict
    job = store.job(job.id)
    report = dict(reports[0]) if isinstance(reports[0], dict) else \
        probe_files(job.jobdir) if job.jobdir is not None and \
        (job.host or {}).get("collected_from") is not None else {}
    report["status"] = nodes.combine(statuses)
    stagings = [r.get("staging") if isinstance(r, dict) else None for r in reports]
    report["staging"] = next((st for st in stagings if not st or st.get("state") != "staged"),
                             stagings[0])
    record_node_agents(store, job.id, statuses)
    return report


def _nodes_lost(store: Store, settings: config.Settings, job: Job, lost: dict,
                statuses: list) -> Job | None:
    """Nodes that did not answer a probe: each whose instance is gone gets its end in
    `statuses` (from the job store, or failed/preempted by what EC2 says); if any node is
    only unreachable and none has ended, the job is recorded as unreachable and returned."""
    recs = nodes.records(job)
    states = providers.get(job.backend).instance_states(store, job)
    recorded = {i.id for i in store.instances(job.id)}
    if autoscaled.grouped(job):
        gone = [recs[i].get("instance") for i in sorted(lost) if recs[i].get("instance")
                and (states.get(recs[i]["instance"]) or {"state": "terminated"})["state"]
                in ("shutting-down", "terminated")]
        if gone:  # AWS replaces it and the nodes meet again (host/regroup.py)
            return _group_went_on(store, job, autoscaled.learn, f"node {gone[0]} " + (
                "taken back" if spot_reason({gone[0]: states[gone[0]]} if gone[0] in states
                                            else states) else "gone"))
    unreachable = []
    for i, exc in lost.items():
        inst = recs[i].get("instance")
        seen = states.get(inst) if inst else None
        ended = bool(inst) and ((seen is None and inst in recorded and job.backend != "local")
                                or (seen is not None and seen["state"] in ("shutting-down",
                                                                             "terminated")))
        if not ended:
            unreachable.append(f"node {i}: {exc.message}")
            continue
        spot = spot_reason({inst: seen}) if seen else False
        try:
            if i == 0:
                stored = from_job_store(store, job) or {}
            else:
                from_node = node_from_store(store, job, i)
                if from_node is not None:
                    mark_node_collected(store, job.id, i)
                stored = from_node or {}
        except CloudtrainError as store_exc:
            unreachable.append(f"node {i}: the job store could not be read "
                               f"({store_exc.message})")
            continue
        if stored.get("state") in state.TERMINAL_STATES and not (
                spot and stored["state"] not in (state.SUCCEEDED, state.PREEMPTED)):
            statuses[i] = stored
        else:
            why = (seen or {}).get("message") or (seen or {}).get("state") or "no longer listed"
            statuses[i] = {"state": state.PREEMPTED if spot else state.FAILED,
                           "ended_at": time.time(), "exit_code": None, "instance_lost": True,
                           "reason": ("spot instance interrupted" if spot else
                                      f"its instance {inst} was terminated ({why})")}
    ended = any(s and s.get("state") in state.TERMINAL_STATES and s.get("state") !=
                state.SUCCEEDED for s in statuses)
    if unreachable and not ended:
        store.update_job(job.id, reason=f"{UNREACHABLE}: " + "; ".join(unreachable))
        return store.job(job.id)
    return None


def _host_lost(store: Store, settings: config.Settings, job: Job, exc: HostError) -> Job:
    """The job's host does not answer. If the cloud says its instance is gone, so is the job:
    its true outcome and files are then read from the job store (the agent put them there
    before the power-off); without them it is preempted (a spot interruption took it) or
    failed. Otherwise the host is only unreachable now."""
    states = providers.get(job.backend).instance_states(store, job)
    # EC2 forgets a terminated instance about an hour later: a recorded one it no longer
    # lists is gone too.
    for inst in store.instances(job.id):
        if inst.provider != "local" and inst.id not in states:
            states[inst.id] = {"state": "terminated", "reason": "", "message": "no longer listed"}
    if autoscaled.grouped(job):
        return _group_host_lost(store, job, states, exc)
    if not (states and all(s["state"] in ("shutting-down", "terminated")
                           for s in states.values())):
        store.update_job(job.id, reason=f"{UNREACHABLE}: {exc.message}")
        return store.job(job.id)
    if job.spec.recovery.recover and store.job(job.id).state != job.state:
        return store.job(job.id)  # another process saw the loss first and acted on it
    try:
        status = from_job_store(store, job) or {}
    except CloudtrainError as store_exc:  # throttled, expired credentials: ask again later
        store.update_job(job.id, reason=f"{UNREACHABLE}; the job store could not be read "
                                        f"({store_exc.message}): status tries again")
        return store.job(job.id)
    spot = spot_reason(states)
    if job.spec.recovery.recover and (status.get("state") == state.PREEMPTED or (
            spot and status.get("state") != state.SUCCEEDED)):
        why = "spot interruption notice" if status.get("state") == state.PREEMPTED else \
            "spot instance interrupted without a notice"
        gone = {i for i, s in states.items() if s["state"] in ("shutting-down", "terminated")}
        return interrupted(store, settings, job, status, why, host_alive=False,
                                    gone=gone)
    # The stored status is the agent's word, unless EC2 took a spot instance back under a
    # job that had not finished: then the agent saw only a signal (the shutdown's SIGTERM, or
    # SIGHUP as tmux went) and EC2 knows why.
    if status.get("state") in state.TERMINAL_STATES and not (
            spot and status["state"] not in (state.SUCCEEDED, state.PREEMPTED)):
        ended = store.set_state(job.id, status["state"],
                                at=status.get("ended_at") or time.time(),
                                detail=status.get("reason"), exit_code=status.get("exit_code"),
                                reason=status.get("reason"), same_run=job)
    else:
        reason = "spot instance interrupted" if spot else \
            "instance terminated before the job's end was seen: " + \
            "; ".join(f"{i}: {s['message'] or s['state']}" for i, s in states.items())
        ended = store.set_state(job.id, state.PREEMPTED if spot else state.FAILED,
                                reason=reason, detail=reason, same_run=job)
    if ended or not store.job(job.id).active:
        finish(store, store.job(job.id), collect=False, force=True)  # it is gone anyway
    return store.job(job.id)


def _group_host_lost(store: Store, job: Job, states: dict, exc: HostError) -> Job:
    """The host of a job that AWS Auto Scaling relaunches does not answer. Its instance still
    runs: only unreachable now. Gone: the job went on elsewhere (its attempts are read from
    the job store), or it has ended, and its end and files are read from there."""
    fresh = store.job(job.id)
    if (fresh.host or {}).get("host") != (job.host or {}).get("host"):
        return fresh  # the record moved to a replacement since this snapshot was read
    current = store.attempt(job.id)
    mine = current.instance_id if current is not None and current.instance_id else None
    gone = ("shutting-down", "terminated")
    recorded = next((i.id for i in store.instances(job.id)
                     if (i.details or {}).get("address") == (job.host or {}).get("host")), None)
    if mine is not None and states.get(mine, {}).get("state") not in gone and recorded == mine:
        store.update_job(job.id, reason=f"{UNREACHABLE}: {exc.message}")
        return store.job(job.id)
    lost_one = recorded or mine
    why = f"{lost_one or 'its instance'} " + ("taken back" if spot_reason(
        {lost_one: states[lost_one]} if lost_one in states else states) else "gone")
    return _group_went_on(store, job, lambda st, j: autoscaled.lost(st, j, states, why), why)


def _group_went_on(store: Store, job: Job, learn, why: str) -> Job:
    """A job of an Auto Scaling group lost an instance: `learn(store, job)` reads its
    attempts from the job store and returns its final record, or None while it runs on (AWS
    replaced the instance: the reason says so). Its end is recorded, its files read from the
    job store."""
    try:
        final = learn(store, job)
        if final is None:
            fresh = store.job(job.id)
            if len(nodes.records(fresh)) > 1:  # followed once the nodes have met again
                return _follow_nodes(store, fresh, why)
            return store.job(job.id)
        status = from_job_store(store, job) or {}
        for i in range(1, len(nodes.records(job))):  # each node's files, nodes/<i>/
            if node_from_store(store, job, i) is not None:
                mark_node_collected(store, job.id, i)
    except CloudtrainError as store_exc:  # throttled, expired credentials: ask again later
        store.update_job(job.id, reason=f"{UNREACHABLE}; the job store could not be read "
                                        f"({store_exc.message}): status tries again")
        return store.job(job.id)
    ended = final["ended_at"] or status.get("ended_at") or time.time()
    code = final["exit_code"] if final["exit_code"] is not None else status.get("exit_code")
    if store.set_state(job.id, final["state"], at=ended, detail=final["reason"],
                       exit_code=code, reason=final["reason"], expect=_moved_on(store, job)):
        finish(store, store.job(job.id), collect=False, force=True)  # it is gone anyway
    return store.job(job.id)


def _moved_on(store: Store, job: Job) -> str:
    """The state `job` (a snapshot) is in now, where only its own stored files moved it on
    since (from_job_store: the stager's end, then the setup's, recorded at their own times);
    else the snapshot's. A compare-and-set on the snapshot's state alone failed against
    those steps, and the job stayed `running` after its end."""
    now = store.job(job.id).state
    steps = {state.STAGING: (state.SETTING_UP, state.RUNNING),
             state.SETTING_UP: (state.RUNNING,)}
    return now if now in steps.get(job.state, ()) else job.state


def _follow_nodes(store: Store, job: Job, why: str) -> Job:
    """A job on several nodes of a group goes on after AWS replaced one: once the nodes have
    met again, its record follows them (status, logs and down reach them there); until then
    its reason says so."""
    try:
        provider = autoscaled.recovery_of(job)
        host = provider.follow_nodes(store, job)
    except CloudtrainError as exc:
        host, why = None, f"{why} (the new node is not reachable yet: {exc.message})"
    if host is None:
        store.update_job(job.id, reason=f"{why}; AWS Auto Scaling relaunches it and the nodes "
                                        "meet again")
        return store.job(job.id)
    current = store.attempt(job.id)
    store.update_job(job.id, host=host, reason=None)
    store.add_event(job.id, "replacement", detail=f"attempt {current.n if current else '?'}: "
                    + ", ".join(f"node {i} {r.get('instance')}" for i, r in
                                enumerate(host["nodes"])))
    group.forget(job.id)
    group.forget_nodes(job.id)
    return store.job(job.id)


def _check_launcher(store: Store, job: Job) -> Job:
    """A job still being launched whose launcher is gone will never start: fail it and
    release what it holds. Gone means its lease ran out (seen from any machine), or, on the
    launching machine itself, that its process no longer exists (seen at once).

    `job` is a snapshot, perhaps seconds old (status refreshes jobs one by one); the
    launcher may since have finished the launch and exited. The job is failed only if it is
    still in the state the snapshot saw (compare-and-set), so a job that reached RUNNING is
    never touched here."""
    hostname, _, pid = (job.launcher or "").rpartition(":")
    here = hostname == socket.gethostname() and pid.isdigit()
    died = here and not pid_alive(int(pid))
    # A launcher seen alive here (stopped with Ctrl-Z, a laptop asleep) keeps its job.
    expired = job.lease_until is not None and time.time() > job.lease_until and \
        not (here and not died)
    if not (died or expired):
        return job
    relaunch = launcher_died(store, job)
    if relaunch is not None:  # the supervisor died mid-relaunch: its restart goes on
        return relaunch
    reason = f"the launching process died during {job.state}" if died else \
        f"the launch stopped answering during {job.state} (its lease expired)"
    if store.set_state(job.id, state.FAILED, reason=reason, detail=reason, expect=job.state):
        # It never ran, so even a --keep instance goes; it wrote nothing to collect.
        finish(store, store.job(job.id), collect=False, force=True)
    return store.job(job.id)


def spot_reason(states: dict) -> bool:
    """Whether EC2 says it took one of these instances back (a spot interruption)."""
    return any(s["state"] in ("shutting-down", "terminated") and
               ("Spot" in s.get("reason", "") or "Spot" in s.get("message", ""))
               for s in states.values())


def interrupted(store: Store, settings: config.Settings, job: Job, status: dict | None,
                why: str, host_alive: bool, gone: set[str] | None = None) -> Job:
    """The job's instance was (or is being) taken back. End its attempt; with restarts left
    the job goes to `recovering` for the supervisor, else it fails. Whatever the job still
    holds is released. `job` is the snapshot the caller decided on: only if the job is still
    in that state (compare-and-set), and, with `gone` (the instances the cloud says are
    gone), still on one of those, is anything done: two processes noticing the same loss,
    or one noticing it late, never end the next attempt."""
    spec = job.spec
    current = store.attempt(job.id)
    if current is None:  # a job launched before attempts were recorded
        store.add_attempt(job.id, 1, started_at=job.created_at)
        current = store.attempt(job.id)
    mine = {i.id for i in attempts.instances_of(store, job.id, current)}
    assert current is not None  # recorded just above where there was none
    if current.ended_at is not None or (gone is not None and mine and not mine & gone):
        return store.job(job.id)
    if host_alive:  # its logs and last files, while it still answers
        try:
            collect_files(store, job)
        except CloudtrainError:
            pass
    ended = ((status or {}).get("ended_at")) or time.time()
    ckpt = (status or {}).get("checkpoint_stream")
    if current.n - 1 >= spec.recovery.max_restarts:
        new_state = state.FAILED
        reason = (f"{why}; --max-restarts {spec.recovery.max_restarts} used up after {current.n} "
                  f"attempt{'s' if current.n > 1 else ''}")
    else:
        new_state = state.RECOVERING
        reason = f"{why}; relaunching (attempt {current.n + 1} of at most " \
                 f"{spec.recovery.max_restarts + 1})"
    if not store.set_state(job.id, new_state, reason=reason, detail=reason, expect=job.state,
                           same_run=job):
        return store.job(job.id)  # someone else acted first (another process, or `down`)
    store.update_attempt(job.id, current.n, only_if_open=True, ended_at=ended,
                         outcome=attempts.INTERRUPTED, end_reason=why,
                         last_step=attempts.last_step(job, status), checkpoint=ckpt)
    if ckpt and ckpt.get("final"):
        store.add_event(job.id, "checkpoint", detail=attempts.upload_line(ckpt))
    group.forget(job.id)
    if new_state == state.FAILED:
        finish(store, store.job(job.id), collect=False, force=True)
        return store.job(job.id)
    try:
        providers.get(job.backend).release(store, store.job(job.id), force=True)
    except CloudtrainError as exc:  # `down` and the next relaunch's release try again
        store.add_event(job.id, "release", detail=f"RELEASE FAILED: {exc.message}")
    ledger.settle(store, store.job(job.id))
    result = store.job(job.id)
    supervisor.ensure(store, settings)
    return result


def launcher_died(store: Store, job: Job) -> Job | None:
    """A relaunch whose supervisor died (or stopped renewing its lease) half-way: back to
    `recovering`, keeping the attempt and its instance (tagged with the attempt's number),
    so the restarted supervisor goes on with them. None: not a relaunch."""
    current = store.attempt(job.id)
    if not attempts.recoverable(job) or current is None or current.n < 2 or current.ended_at:
        return None
    detail = f"the supervisor stopped during attempt {current.n}'s {job.state}; it goes on"
    store.set_state(job.id, state.RECOVERING, detail=detail, reason=detail, expect=job.state)
    return store.job(job.id)
