"""Stage: collect, after a job (or one of its nodes) ends: its files brought home (over
SSH, else from the job store that outlives its instance), its hosts released, its cost
settled. Also how a job's files are read once they are home (probe_files, read_record), and
the bounded stop of a job's nodes that comes first. It may call scripts, group, attempts and
secrets.

    collect_files(store, job)         log, metrics, status, checkpoints and outputs home
    from_job_store(store, job)        the same from the job store; the stored status
    finish(store, job, collect, force)  collect, release, close the attempt, settle the cost
    settle_cost(store, job) / settle_all(store)  the job's cost, once every instance is priced
    stop_nodes(job, settings, ...)    every node's agent asked to stop (bounded)
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from .. import config, datasets, hostdata, ledger, nodes, providers, state, state_runs
from ..host import agent_control
from ..host.job_status import metrics_tail, read_json
from ..errors import CloudtrainError, HostError, NotRegularFile
from ..local_host import LocalHost
from ..providers.base import CloudHosts, ResultStore
from ..state import Job, Store
from . import attempts, group, secrets

STOP_MARGIN_S = 30.0  # beyond the grace period, how long a graceful stop may take
NODE_FILES = ("output.log", "status.json", "job.json", "run.sh", datasets.STATUS_FILE)


def collect_files(store: Store, job: Job) -> bool:
    """Copy a remote job's log, metrics and status to $CLOUDTRAIN_HOME/jobs/<id>/ (before its
    host goes away); from then on the job is read from there."""
    local = config.home() / "jobs" / job.id
    _collect_nodes(store, job)
    job = store.job(job.id)
    if job.jobdir and Path(job.jobdir) == local and isinstance(group.host_of(job), LocalHost):
        _note_local_outputs(store, job)
    if not job.jobdir or Path(job.jobdir) == local or isinstance(group.host_of(job), LocalHost):
        return False
    host = group.host_of(job)
    settings = config.Settings.load()
    try:
        for name in ("output.log", "metrics.jsonl", "status.json", "job.json", "run.sh",
                     datasets.STATUS_FILE):
            try:
                data = host.read(f"{job.jobdir}/{name}")
            except NotRegularFile:
                continue  # a FIFO or a link the job put there: the rest comes home
            local.mkdir(parents=True, exist_ok=True)
            config.write_private(local / name, data)
        pulled = host.pull_tree(f"{job.jobdir}/checkpoints", local / "checkpoints",
                                settings.collect_checkpoints_mb * 1e6)
        outputs = job.spec.output_paths()
        got = host.pull_paths(job.jobdir, outputs, local, settings.collect_checkpoints_mb * 1e6) \
            if outputs else None
        # The agent waits (bounded) for this before it powers the instance off.
        host.write_text(f"{job.jobdir}/collected", str(time.time()))
    except HostError:
        return False
    if pulled.over_limit or pulled.skipped_count:
        store.add_event(job.id, "collected", detail=(
            f"{pulled.files} checkpoint files ({pulled.bytes / 1e6:.1f} MB) brought home"
            + (f"; the rest passed collect_checkpoints_mb ({settings.collect_checkpoints_mb:g})"
               if pulled.over_limit else "")
            + (f"; {pulled.skipped_count} entries skipped (links, devices or unsafe names)"
               if pulled.skipped_count else "")))
    if got is not None:
        store.add_event(job.id, "outputs", detail=outputs_note(got, local, settings))
    store.update_job(job.id, jobdir=str(local), host={"kind": "LocalHost", "collected_from":
                                                       job.host, "remote_jobdir": job.jobdir})
    return True


def _note_local_outputs(store: Store, job: Job) -> None:
    """A job on this machine wrote its named outputs in place: say where, and which are not
    there (once: a job is collected once)."""
    outputs = job.spec.output_paths()
    if not outputs or any(e.phase == "outputs" for e in store.events(job.id)):
        return
    assert job.jobdir is not None  # a job that ran here
    missing = [o for o in outputs if not os.path.lexists(Path(job.jobdir, o))]
    note = f"outputs: in {job.jobdir}"
    if missing:
        note += "; not found: " + ", ".join(missing[:5]) + \
            (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    store.add_event(job.id, "outputs", detail=note)


def outputs_note(got, local: Path, settings: config.Settings) -> str:
    """What came home of the job's named outputs (a limit hit or a path not found is
    said, never skipped silently)."""
    note = f"outputs: {got.files} files ({got.bytes / 1e6:.1f} MB) brought home to {local}"
    if got.over_limit:
        note += (f"; the rest passed collect_checkpoints_mb ({settings.collect_checkpoints_mb:g}"
                 " MB, config.yaml)")
    if got.skipped_count:
        shown_ = ", ".join(f"{p} ({why})" for p, why in got.skipped[:5])
        more = got.skipped_count - min(len(got.skipped), 5)
        note += f"; not brought home: {shown_}" + (f" and {more} more" if more > 0 else "")
    return note


def _collect_nodes(store: Store, job: Job) -> None:
    """Nodes 1.. of a job on several machines: their log, status and settings to
    jobs/<id>/nodes/<i>/ (over their own connection, else from the job store), and the
    `collected` marker their agents wait for before powering off. Node 0 is the job's own
    directory (collect_files)."""
    recs = nodes.records(job)
    if len(recs) < 2:
        return

    def collect(i: int) -> None:
        if recs[i].get("collected"):
            return
        h, jd = group.node_host(job, i), nodes.jobdir(job, i)
        assert jd is not None  # each node of several has its own (nodes.records)
        local = nodes.local_dir(job.id, i)
        if isinstance(h, LocalHost) and Path(jd) == local:
            return
        try:
            for name in NODE_FILES:
                try:
                    data = h.read(f"{jd}/{name}")
                except NotRegularFile:
                    continue  # a FIFO or a link the job put there
                local.mkdir(parents=True, exist_ok=True)
                config.write_private(local / name, data)
            h.write_text(f"{jd}/collected", str(time.time()))
        except HostError:
            try:
                with Store(store.path) as mine:  # a connection of this thread's own
                    if node_from_store(mine, job, i) is None:
                        return
            except CloudtrainError:
                return
        done.append(i)

    done: list[int] = []
    nodes.each(lambda i: collect(i) if i else None, len(recs))
    for i in done:
        mark_node_collected(store, job.id, i)


def finish(store: Store, job: Job, collect: bool = True, force: bool = False) -> None:
    """After the job: bring its files home (over SSH, else from the job store), give the
    host back whatever happened to the files, settle the cost."""
    try:
        if len(nodes.records(job)) > 1:  # the nodes still running the job stop first
            stop_nodes(store.job(job.id), config.Settings.load(), store=store)
        if collect and not collect_files(store, store.job(job.id)):
            _collect_from_store(store, store.job(job.id))
    finally:
        providers.get(job.backend).release(store, store.job(job.id), force=force)
        if len(nodes.records(job)) > 1:
            group.forget_nodes(job.id)
        if not store.job(job.id).active:
            attempts.close(store, store.job(job.id))
            secrets.forget(job.id)  # it runs no more: nothing needs its secrets
    settle_cost(store, store.job(job.id))


def _collect_from_store(store: Store, job: Job) -> None:
    """The SSH copy failed (the instance powered off under it, a slow link): take the files
    from the job store instead, where the agent put them before the power-off."""
    if not job.jobdir or (job.host or {}).get("collected_from") is not None \
            or isinstance(group.host_of(job), LocalHost):
        return
    try:
        from_job_store(store, job)
    except CloudtrainError as exc:
        store.add_event(job.id, "results", detail=f"job store not readable: {exc.message}")


def files_home(store: Store, job: Job) -> Job:
    """An ended job whose files did not come home (its instance went before the copy, and
    the job store had none of them yet: the Auto Scaling lab once stored an attempt's end
    before its files): from the job store now, where they are by then. The job as it is
    after; as it was where the job store cannot be read now (none, credentials expired):
    its instance is asked next, as before."""
    if job.active or not job.jobdir or (job.host or {}).get("collected_from") is not None \
            or isinstance(group.host_of(job), LocalHost):
        return job
    try:
        from_job_store(store, job)
    except CloudtrainError:
        return job
    return store.job(job.id)


def settle_cost(store: Store, job: Job) -> None:
    """Record the job's cost (settled once every instance is terminated and priced), with
    the cost at which it first reached its target."""
    target_time = None
    # Read from the job's files where they are here; a remote host is not asked (it may be
    # the unreachable one `down` just terminated, and the cost must not wait on it).
    here = job.backend == "local" or (job.host or {}).get("collected_from") is not None
    if job.jobdir and here:
        try:
            target = read_record(job).get("target") or {}
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
        provider = providers.get(job.backend)
        if isinstance(provider, CloudHosts):  # else nothing to ask: release() recorded it
            provider.record_ends(store, job)
        settle_cost(store, store.job(job.id))
        done += store.job(job.id).cost_settled
    return done


def probe_files(jobdir: str) -> dict:
    """What a probe reports, read from a job directory on this machine without acting on it."""
    latest, target, summary = metrics_tail(jobdir)
    return hostdata.clean_report({"status": read_json(os.path.join(jobdir, "status.json")),
                                  "staging": read_json(os.path.join(jobdir,
                                                                    datasets.STATUS_FILE)),
                                  "setup": read_json(os.path.join(jobdir,
                                                                  agent_control.SETUP_STATUS)),
                                  "now": time.time(), "metrics": latest, "target": target,
                                  "runs": summary})


def read_record(job: Job, stale_after_s: float = 1e9) -> dict:
    """The job's status and metrics, the way a probe reports them. A job whose files were
    brought home is read without the probe's reaping: a status.json that came from an instance
    names process groups there, and nothing here may be signalled because of it."""
    assert job.jobdir is not None  # a job that started
    if (job.host or {}).get("collected_from") is not None:
        return probe_files(job.jobdir)
    return group.host_of(job).probe_job(job.jobdir, stale_after_s)


def from_job_store(store: Store, job: Job) -> dict | None:
    """Bring the job's files home from the job store that outlives its instance; the stored
    status (untrusted, checked like a probe's answer), or None when nothing was stored. A
    store that cannot be read now raises (CloudtrainError): the caller decides nothing."""
    local = config.home() / "jobs" / job.id
    provider = providers.get(job.backend)
    fetched = provider.fetch_results(store, job, local) \
        if isinstance(provider, ResultStore) else None
    if not fetched:
        return None
    host = job.host or {}
    # Only onto the run `job` saw: another process may have decided on the same loss first,
    # and the job be on its next attempt now (whose record this must not replace).
    if not store.update_job(job.id, same_run=job, jobdir=str(local), host={
            "kind": "LocalHost", "collected_from": state_runs.ran_on(job.host),  # home again:
            "remote_jobdir": host.get("remote_jobdir", job.jobdir)     # from where first
            if host.get("collected_from") is not None else job.jobdir, "from_store": True}):
        return probe_files(str(local)).get("status")
    store.add_event(job.id, "results", detail=(
        f"{fetched['files']} files ({fetched['bytes'] / 1e6:.1f} MB) from the job store"
        + ("" if fetched.get("complete") else "; the upload was not complete")))
    group.forget(job.id)
    report = read_record(store.job(job.id))
    if report.get("metrics"):
        store.update_job(job.id, metrics=report["metrics"])
    record_staged(store, store.job(job.id), report.get("staging"))
    record_set_up(store, store.job(job.id), report.get("setup"))
    return report.get("status")


def record_staged(store: Store, job: Job, staging: dict | None) -> bool:
    """A job still in `staging` whose stager said the data is complete runs from then on (or
    runs its job file's setup first: `setting-up`): the event at the stager's own end time
    (also when it is learnt only after the job ended, from the job store), so the cost of
    the copy and of the training split there."""
    if job.state != state.STAGING or not staging or staging.get("state") != "staged":
        return False
    return store.set_state(job.id, state.SETTING_UP if job.spec.setup else
                           state.RUNNING, at=staging.get("ended_at") or time.time(),
                           detail=datasets.staged_line(staging), expect=state.STAGING)


def record_set_up(store: Store, job: Job, setup: dict | None) -> bool:
    """A job running its job file's setup on its host (`setting-up` after the launch) whose
    setup is done runs its command from then on: the `running` event at the setup's own end
    (run.sh's setup-status.json), so that the setup is the setup phase's time and cost."""
    if not (state.on_host(job) and job.state == state.SETTING_UP) or not setup or \
            setup.get("state") != "done":
        return False
    ended = setup.get("ended_at")
    # run.sh's clock has whole seconds: never before the phase it ends
    at = max([ended or time.time()] + [e.at for e in store.events(job.id)])
    return store.set_state(job.id, state.RUNNING, at=at,
                           detail="setup done" + (f" in {ended - setup['started_at']:.0f} s"
                                                  if ended and setup.get("started_at") else ""),
                           expect=state.SETTING_UP)


def node_from_store(store: Store, job: Job, node: int) -> dict | None:
    """Node i's files from the job store (its agent put them there before the power-off),
    brought to jobs/<id>/nodes/<i>/; its stored status, or None when nothing was stored. The
    caller records the node as collected (_mark_node_collected)."""
    local = nodes.local_dir(job.id, node)
    provider = providers.get(job.backend)
    fetched = provider.fetch_results(store, job, local, node=node) \
        if isinstance(provider, ResultStore) else None
    if not fetched:
        return None
    return hostdata.clean_status(read_json(str(local / "status.json")))


def mark_node_collected(store: Store, job_id: str, node: int) -> None:
    """Node i's files are home: its record says so, and where (it is read there from now)."""
    job = store.job(job_id)
    host = dict(job.host or {})
    where = host["collected_from"] if host.get("collected_from") is not None else host
    recs = where.get("nodes")
    if isinstance(recs, list) and node < len(recs):
        recs[node] = {**recs[node], "collected": True,
                      "local_jobdir": str(nodes.local_dir(job_id, node))}
        store.update_job(job_id, host=host)


def stop_nodes(job: Job, settings: config.Settings, wait: bool = True,
               grace_s: float | None = None, store: Store | None = None) -> list:
    """Ask every node's agent still running the job to stop it (SIGTERM, SIGKILL after the
    grace period); with `wait`, until each has (bounded); without, only the signal. One
    node's failure to answer never holds the others. Returns each node's final status (or
    the error), node 0 first; with `store`, what they said is kept for `status JOB`."""
    recs = nodes.records(job)
    if len(recs) < 2:
        return []
    grace = settings.stop_grace_seconds if grace_s is None else grace_s

    def stop(i: int):
        if recs[i].get("collected") or (i == 0 and (job.host or {}).get("collected_from")):
            return None
        jd = nodes.jobdir(job, i)
        assert jd is not None  # each node of several has its own (nodes.records)
        result, problem = bounded(
            lambda: group.node_host(job, i).stop_job(jd, grace, wait=wait),
            grace + STOP_MARGIN_S)
        return problem if problem is not None else result

    answers = nodes.each(stop, len(recs))
    if store is not None:
        record_node_agents(store, job.id, [a if isinstance(a, dict) else None
                                            for a in answers])
    return answers


def record_node_agents(store: Store, job_id: str, statuses: list) -> None:
    """What each node's agent last said (state, exit code, reason), kept in the job's node
    records for `status JOB`; a node not heard from keeps what it said before."""
    job = store.job(job_id)
    host = dict(job.host or {})
    where = host["collected_from"] if isinstance(host.get("collected_from"), dict) else host
    recs = where.get("nodes")
    if not isinstance(recs, list):
        return
    for rec, agent in zip(recs, nodes.summary(statuses)):
        if agent.get("state") is not None:
            rec["agent"] = agent
    store.update_job(job_id, host=host)


def bounded(call, seconds: float):
    """(result, None) if `call` returns within `seconds`, else (None, what went wrong). The
    call runs in a daemon thread, so a host that never answers cannot hold `down` up."""
    box: dict = {}

    def run():
        try:
            box["result"] = call()
        except Exception as exc:
            box["error"] = exc.message if isinstance(exc, CloudtrainError) else \
                f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        return None, f"no answer in {seconds:.0f} s"
    return box.get("result"), box.get("error")
