"""Stage: abort, a launch (or relaunch) attempt that cannot finish, undone: the agent
stopped on every node if it started, the secrets dropped, the hosts released, and the job
recorded as failed or cancelled; or, when EC2 took a recovering job's spot instance, the
attempt ended as interrupted (watch.interrupted) for the supervisor's relaunch. Nothing
interrupts it. It may call watch, collect, group, attempts, secrets and lease.

    abort_launch(store, settings, provider, job, host, exc)  undo; what to say, or None
    LaunchCancelled                      the job was stopped (`down`) while being launched
"""

from __future__ import annotations

import shlex

from .. import config, state
from ..errors import CloudtrainError
from ..hosts import Host, session_name
from ..nodes import each, records
from ..nodes import jobdir as node_jobdir
from ..state import Job
from . import attempts, group, lease, secrets
from .collect import settle_cost
from .watch import interrupted, spot_reason


class LaunchCancelled(CloudtrainError):
    """The job was stopped (`down`) while it was being launched."""


def abort_launch(store, settings, provider, job, host, exc) -> str | None:
    """Undo a launch that cannot finish: stop the agent if it started, release the host
    (terminating any instance), and record why. Nothing interrupts this (a second
    Ctrl-C once stopped the termination half-way); a failure to release is recorded and
    raised, naming the command that finishes the job. Returns what to say when the job goes
    on: a spot interruption took the instance of a recovering job (during sync, say), which
    then waits in `recovering` for the supervisor's relaunch (or failed, restarts used up);
    None otherwise."""
    cancelled = isinstance(exc, KeyboardInterrupt)  # Ctrl-C, SIGTERM, SIGHUP
    if not cancelled and not isinstance(exc, LaunchCancelled):
        recovering = _spot_taken(store, settings, provider, job)
        if recovering:
            return recovering
    message = exc.message if isinstance(exc, CloudtrainError) else str(exc)
    if isinstance(exc, lease.LaunchInterrupted):
        reason = f"interrupted during launch ({exc.signame})"
    else:
        reason = "interrupted during launch" if cancelled else f"launch failed: {message}"
    with lease.uninterruptible("terminating what the launch started"):
        store.rollback()  # a signal may have come inside a write transaction
        jobdir = store.job(job.id).jobdir
        started = store.job(job.id).state not in (state.PENDING, state.PROVISIONING,
                                                   state.SYNCING)
        if host is not None and jobdir and started:
            _stop_agents(store.job(job.id), settings, host)
        if store.job(job.id).spec.secrets:
            _drop_secrets(store.job(job.id), host)
        released = True
        try:
            provider.release(store, store.job(job.id), force=True)
        except Exception as release_exc:
            released = False
            reason += f"; RELEASE FAILED: {release_exc}"
        store.set_state(job.id, state.CANCELLED if cancelled else state.FAILED,
                        reason=reason.splitlines()[0])
        try:  # what the instance's minutes cost, shown by status, not "-"
            settle_cost(store, store.job(job.id))
        except Exception:  # a price lookup is not worth failing the cleanup over
            pass
    if not released and any(i.state != "terminated" for i in store.instances(job.id)):
        raise CloudtrainError(
            f"job {job.id}: its instance may still be running ({reason.splitlines()[0]})",
            hint=f"cloudtrain down {job.id} (it terminates by record and by tag)")
    return None


def _stop_agents(job: Job, settings: config.Settings, host: Host) -> None:
    """The agent may be starting or started: stop it, and its tmux session with it (on this
    machine nothing else would; an instance is terminated anyway). On every node of a job on
    several machines (`host`: node 0's)."""
    recs = records(job)
    many = len(recs) > 1

    def stop_node(i: int) -> None:
        h = group.node_host(job, i) if many else host
        jd = node_jobdir(job, i) if many else job.jobdir
        assert jd is not None  # a started job's nodes each have one
        try:
            h.stop_job(jd, settings.stop_grace_seconds)
            h.run(h.tmux("kill-session", "-t", session_name(job.id)), check=False, timeout=30)
        except Exception:  # the host may be what failed; releasing it is what matters
            pass

    each(stop_node, len(recs) if many else 1)


def _drop_secrets(job: Job, host: Host | None) -> None:
    """A launch that ends before run.sh ran: the secrets' host file goes (a kept instance or
    this machine keeps its disk), and so does this machine's copy for relaunches."""
    secrets.forget(job.id)
    if host is not None and job.jobdir:
        try:
            host.run("rm -f " + shlex.quote(f"{job.jobdir}/{secrets.HOST_FILE}"),
                     check=False, timeout=30)
        except Exception:  # the host may be what failed; an instance is terminated anyway
            pass


def _spot_taken(store, settings, provider, job) -> str | None:
    """A recovering job whose spot instance EC2 took back while it was being set up: the
    attempt ends as interrupted and the job is relaunched (or fails, restarts used up)."""
    current = store.job(job.id)
    if not attempts.recoverable(current) or current.state == state.PENDING:
        return None
    try:
        states = provider.instance_states(store, current)
    except Exception:  # the cloud cannot say: an ordinary launch failure
        return None
    if not spot_reason(states):
        return None
    store.rollback()
    why = f"spot instance interrupted during {current.state}"
    after = interrupted(store, settings, current, None, why, host_alive=False)
    if after.state == state.FAILED:
        return after.reason or why
    return f"{why}; the recovery supervisor relaunches it (`cloudtrain status {job.id}`)"
