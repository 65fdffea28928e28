"""Stage: launch, one path for a job on 1..N machines: provision, sync, set up, start.

    launch ─► provision ─► sync ─► set up ─► data, restore, results, stream ─► files ─► start

launch() records the job and holds its lease; start_attempt() is one attempt at it (a
relaunch makes the next one): the steps below run once, in this order, over the attempt's
NodeGroup, and a failure anywhere releases what the attempt started (abort). A job on one
machine is a group of one: each step is the same for it, run in the caller's thread. Where
one node and many differ, the step decides (one node syncs each folder with rsync against a
kept instance's job directory and shows byte progress, several get one tar bundle; the
rendezvous and the node environment are for several only).

    step            where                   what
    provision       _acquire                the hosts (a kept instance's for --on), recorded
    mkdir, agent    _prepare                job, checkpoint and data directories; the agent
    copies          _copies, _sync          the recipe and the workdir, to every node
    checkpoints     _sync                   --resume-from's, to every node
    set up          _set_up                 provider.setup, GPUs (and the rendezvous)
    staging         _stage                  the data's notes, volumes mounted, stager's plan
    restore         _restore                a relaunch's checkpoint plan (resume: the recipe)
    results grant   _grants                 where the agent stores the results
    stream          _stream_settings        a recovering job's checkpoint stream
    job files       _write_files            setup.sh, secrets, run.sh, job.json
    bundle          _upload_bundle          a recovering job's files to its job store, for an
                                            instance that starts it by itself (issue 27)
    start           _start                  the agent in tmux on every node; a job --on a
                                            busy kept instance: queued there (kept.enqueue)

It may call abort, plan, sources (and below them: kept), scripts, group, attempts, secrets,
lease and supervisor; the hosts only through `Host`, the cloud only through the provider.
"""

from __future__ import annotations

import json
import dataclasses
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import config, datasets, ledger, progress, providers, state
from ..errors import CloudtrainError, NoCredentials, PlacementError
from ..hosts import bundle, sync_many
from ..nodes import MASTER_PORT, environment, read_rendezvous, rendezvous_script
from ..providers.base import Account, CloudHosts, CloudRecovery, ResultStore
from ..spec import RECIPE, JobSpec
from ..state import Job, Store
from . import attempts, group, lease, scripts, secrets, supervisor
from .abort import LaunchCancelled, abort_launch
from .group import NodeGroup
from .kept import enqueue, instance_host
from .plan import check_name, name_note, read_datasets, warn_about_workdir
from .sources import copy_checkpoints, kept_source, remote_jobdir, resume_source

if TYPE_CHECKING:
    from ..providers.base import Provider


def launch(store: Store, settings: config.Settings, spec: JobSpec,
           say: Callable[[str], None] | progress.Reporter | None = None,
           found: list | None = None) -> Job:
    """Start the job and return once its agent runs it. On any failure, Ctrl-C, SIGTERM or
    SIGHUP the job is recorded as failed or cancelled and its host released: nothing is left
    running. While it works, the launcher holds the job's lease (lease.py), so a launcher
    killed outright (SIGKILL, a lost container) is noticed by any later `cloudtrain` command.
    `say` is a progress.Reporter (each phase as it starts) or a plain callback (notes only)."""
    renamed = check_name(store, spec)
    report = progress.of(say)
    provider = providers.get(spec.backend)
    provider.preflight(spec)
    if isinstance(provider, Account):
        provider.ready(spec)  # nothing is recorded for a launch that cannot start
    # The datasets are read before anything is created: a missing prefix stops here.
    if found is None:
        spec, found = read_datasets(spec, settings)
    source = resume_source(store, settings, spec)
    spec, kept = kept_source(store, spec)
    job = store.create_job(name=spec.name, kind=spec.kind, recipe=spec.recipe,
                           command=spec.display(), backend=spec.backend, spec=spec.to_dict(),
                           launcher=f"{socket.gethostname()}:{os.getpid()}")
    report.phase(f"launching job {job.id}: waiting until it starts (Ctrl-C cancels the launch)")
    decided = (spec.expected or {}).get("deadline")
    if isinstance(decided, dict) and decided.get("why"):  # the plan's word, in the timeline
        store.add_event(job.id, "deadline", detail=str(decided["why"])[:500])
    note = name_note(spec, renamed, launched=True)  # None: no name was taken over
    if note is not None:
        report.note(note)
    if spec.secret_values and spec.recovery.recover:  # a relaunch needs them when nobody is here
        secrets.save(job.id, spec.secret_values)
    if spec.recovery.recover:
        attempts.begin(store, job, spec)
    try:
        # The cleanup runs inside the signal guard too: a second SIGTERM is noted, not obeyed,
        # from the first signal to the end of the cleanup.
        with lease.renewing(store.path, job.id), lease.signals_interrupt():
            start_attempt(store, settings, spec, provider, job, report, found, source, kept)
    except NoCredentials as exc:  # the way on that only a launch has
        exc.hint = f"{exc.hint}; `cloudtrain launch --dry-run` works without"
        raise
    finally:
        store.update_job(job.id, lease_until=None)
    job = store.job(job.id)
    if spec.recovery.recover and job.active:
        line = supervisor.ensure(store, settings)
        if line:
            report.note(line)
    return job


def start_attempt(store: Store, settings: config.Settings, spec: JobSpec, provider, job: Job,
                  say: Callable[[str], None] | progress.Reporter | None = None,
                  found: list | None = None, source: Job | None = None,
                  kept: Job | None = None) -> None:
    """One attempt at the job: provision, sync, set up, start. A failure releases what it
    started (abort.py), and fails the job (raised), unless a spot interruption took the
    instance of a recovering job (it goes to `recovering`, returned). A relaunch's
    PlacementError (no capacity or quota here) is raised before anything was created: the
    caller tries the next place."""
    report = progress.of(say)
    try:
        started, detail = _launch_steps(_Launch(store, settings, spec, provider, job, report,
                                                found), source, kept)
        if queued(spec):  # it starts when the jobs ahead of it on the instance have ended
            _advance(store, job.id, state.QUEUED, detail=detail, at=started)
            report.phase(f"queued job {job.id} {detail}")
            return
        # With data to stage, the job runs once the stager says it is complete, and with a
        # job file's setup once that is done (refresh moves it on, at their own clocks).
        _advance(store, job.id, state.STAGING if found else
                 state.SETTING_UP if spec.setup else state.RUNNING,
                 detail=datasets.staging_line(spec) if found else detail, at=started)
        if spec.recovery.recover:
            attempts.started(store, job.id, job.facts.attempt, started)
        report.phase(f"started job {job.id}" + (": its data is staged first" if found else
                                                ": its setup runs first" if spec.setup else ""))
    except BaseException as raised:
        exc = lease.interruption(raised)
        if isinstance(exc, PlacementError) and job.facts.attempt > 1:
            raise  # nothing was created here; the relaunch tries its next place
        recovering = abort_launch(store, settings, provider, job, group.opened(job.id), exc)
        if recovering:
            report.note(f"job {job.id}: {recovering}")
            return
        if exc is not raised:
            raise exc from raised
        if isinstance(exc, (KeyboardInterrupt, CloudtrainError)):
            raise
        raise CloudtrainError(f"launch of job {job.id} failed: {exc}") from exc


@dataclass
class _Launch:
    """What every step of one attempt works with."""

    store: Store
    settings: config.Settings
    spec: JobSpec
    provider: Provider
    job: Job
    report: progress.Reporter
    found: list | None  # the datasets read (read_datasets); empty or None: no data


def _launch_steps(a: _Launch, source: Job | None, kept: Job | None
                  ) -> tuple[float, str | None]:
    """The launch's steps, each once over the attempt's nodes: when the job started, and
    what to say of the start in the timeline. Each step is a phase of the reporter."""
    _advance(a.store, a.job.id, state.PROVISIONING)
    nodes = _acquire(a, kept)
    _advance(a.store, a.job.id, state.SYNCING)
    copies = _copies(a)
    sent = _sync(a, nodes, copies, kept, source)
    _advance(a.store, a.job.id, state.SETTING_UP, detail=f"{sent} files sent"
             + (f" to {nodes.n} nodes" if nodes.n > 1 else ""))
    gpus, rendezvous = _set_up(a, nodes)
    procs = a.spec.processes(gpus)
    stages = _stage(a, nodes)
    stream_from = _restore(a, nodes)
    grants = _grants(a, nodes)
    stream = _stream_settings(a, grants[0], stream_from)
    if stream:
        a.store.update_job(a.job.id, host={**(a.store.job(a.job.id).host or {}),
                                           "checkpoint_stream": True})
    _write_files(a, nodes, gpus, procs, stages, stream_from is not None, grants, stream,
                 rendezvous)
    if a.spec.recovery.recover and grants[0] is not None and a.job.facts.attempt == 1 \
            and isinstance(a.provider, ResultStore):
        _upload_bundle(a, a.provider, nodes, copies, stages[0] is not None,
                       required=_grouped(a))
    if queued(a.spec):  # the kept instance's agent starts it when the job ahead ends
        a.report.phase("queuing the job on the kept instance")
        return enqueue(a.store, a.job, nodes.hosts[0], nodes.jobdirs[0], a.spec)
    return _start(a, nodes, procs, rendezvous)


def queued(spec: JobSpec) -> bool:
    """Whether the job waits on a kept instance behind the jobs running or queued there."""
    return bool((spec.kept or {}).get("ahead"))


def _acquire(a: _Launch, kept: Job | None) -> NodeGroup:
    """Step provision: the job's hosts (`--on`: the kept instance, taken over), kept open
    for every later step, and recorded as the job's."""
    if kept is not None and kept.active:  # it runs there now: this job is queued behind
        a.report.phase(f"preparing the job on job {kept.id}'s instance, to wait its turn there")
        hosts = [instance_host(kept)]
    elif kept is not None:
        a.report.phase(f"taking over job {kept.id}'s instance")
        assert isinstance(a.provider, CloudHosts)  # --on: a kept cloud instance
        hosts = [a.provider.adopt(a.store, kept, a.job)]
        group.forget(kept.id)
    else:  # all of them at once, or none
        hosts = a.provider.acquire(a.store, a.job, a.spec, a.report)
    for i, h in enumerate(hosts):
        group.keep(a.job.id, i, h)
    if a.spec.recovery.recover:
        attempts.placed(a.store, a.job.id, a.job.facts.attempt)
    return NodeGroup.open(a.store, a.provider, a.job, hosts)


def _prepare(nodes: NodeGroup, i: int) -> None:
    """Steps mkdir and agent on node i: its job, checkpoint and data directories, made in
    the round trip that looks at the agent, and the agent (skipped where the same files
    are there)."""
    jobdir = nodes.jobdirs[i]
    nodes.hosts[i].install_agent(jobdir, make=(f"{jobdir}/checkpoints", f"{jobdir}/work",
                                               nodes.data_dirs[i]))


def _sync(a: _Launch, nodes: NodeGroup, copies: list[tuple[Path, str, tuple[str, ...]]],
          kept: Job | None, source: Job | None) -> int:
    """Steps mkdir, agent, copies and checkpoints: the job's files on every node; the number
    of files sent. One node syncs each folder (rsync where it can, only what changed since
    the kept job's copy for --on, with byte progress); several get one tar bundle."""
    if nodes.n == 1:
        _prepare(nodes, 0)
        jobdir, like = nodes.jobdirs[0], remote_jobdir(kept) if kept is not None else None
        sent = sync_many(nodes.hosts[0], [
            (local, f"{jobdir}/{folder}", like and f"{like}/{folder}", include)
            for local, folder, include in copies], a.report)
    else:
        sent = _send_bundle(a, nodes, copies)
    if source is not None:
        a.report.phase(f"copying job {source.id}'s checkpoints")
        nodes.each(lambda i: copy_checkpoints(source, nodes.hosts[i], nodes.jobdirs[i]))
    return sent


def _copies(a: _Launch) -> list[tuple[Path, str, tuple[str, ...]]]:
    """What is synced into each job directory: (local dir, folder in the job directory,
    include) for the recipe, the shared recipe code and the workdir; what the workdir would
    send, and how a recipe on fewer machines than published differs, are said."""
    spec = a.spec
    copies: list[tuple[Path, str, tuple[str, ...]]] = []
    if spec.kind == RECIPE:
        from .. import recipes

        assert spec.recipe is not None  # a recipe job names its recipe
        rec = recipes.load(spec.recipe)
        copies.append((rec.path, f"recipes/{rec.name}", ()))
        shared = rec.path.parent / recipes.SHARED_DIR
        if shared.is_dir():
            copies.append((shared, f"recipes/{recipes.SHARED_DIR}", ()))
        published = rec.nodes_published(spec.args)
        if published > spec.nodes:  # say how this run differs from the published one
            note = (f"variant {spec.args.get('variant')} was published on {published} machines; "
                    f"this job runs on {spec.nodes} (--nodes {published} for the published "
                    f"run), with the published per-GPU batch: a global batch "
                    f"{published / spec.nodes:g}x smaller, the lr scaled with it")
            a.store.add_event(a.job.id, "fewer-machines", detail=note)
            a.report.note(note)
    if spec.workdir:
        warn_about_workdir(Path(spec.workdir), tuple(spec.include), a.report)
        copies.append((Path(spec.workdir), "work", tuple(spec.include)))
    return copies


def _send_bundle(a: _Launch, nodes: NodeGroup,
                 copies: list[tuple[Path, str, tuple[str, ...]]]) -> int:
    """The same files to every node: packed once into one tar stream, which each node
    unpacks through its own connection (one round trip, no rsync process per node)."""
    n = nodes.n
    with tempfile.NamedTemporaryFile(prefix="cloudtrain-sync-", suffix=".tar") as tar:
        files, size = bundle(copies, tar)
        tar.flush()
        packed = os.path.getsize(tar.name)
        a.report.phase(f"syncing {files} file{'' if files == 1 else 's'}, "
                       f"{progress.megabytes(size)} to each of {n} nodes")
        a.report.transfer(packed * n)
        done = [0] * n
        lock = threading.Lock()

        def send(i: int) -> int:
            def sent(count: int) -> None:
                with lock:
                    done[i] = count
                    a.report.sent(sum(done))

            _prepare(nodes, i)
            nodes.hosts[i].unpack(Path(tar.name), nodes.jobdirs[i], sent=sent)
            return files

        total = sum(nodes.each(send))
        a.report.sent(packed * n)
    return total


def _set_up(a: _Launch, nodes: NodeGroup) -> tuple[int, tuple[str, int] | None]:
    """Step set up: the provider's setup of every host, and the GPUs the job gets (the
    fewest of any node). On several nodes, in the same round trip each, the network
    interface of each node and a free port for the rendezvous at node 0: (master, port)."""
    n = nodes.n
    a.report.phase("setting up the host" if n == 1 else f"setting up {n} nodes")

    def set_up(i: int) -> tuple[int, str | None, int | None]:
        host = nodes.hosts[i]
        software[i] = a.provider.setup(host)  # recorded below: the store is this thread's
        gpus = a.provider.gpus(a.spec, host)
        if n == 1:
            return gpus, None, None
        address = nodes.addresses[i]
        assert address is not None  # every node of several has its address (NodeGroup.open)
        out = host.run(rendezvous_script(host.python, address,
                                         MASTER_PORT if i == 0 else 0), check=False).stdout
        return (gpus, *read_rendezvous(out))

    software: dict[int, str | None] = {}
    found = nodes.each(set_up)
    for i, line in sorted(software.items()):
        if line:  # the image's torch, CUDA build and driver, which the job will meet
            a.store.add_event(a.job.id, "software", detail=line if n == 1 else f"node {i}: {line}")
    if n > 1:
        nodes.ifaces = [iface for _, iface, _ in found]
    a.store.update_job(a.job.id, host=nodes.record())
    master = nodes.addresses[0]
    rendezvous = (master, found[0][2] or MASTER_PORT) if master is not None and n > 1 else None
    return min(gpus for gpus, _, _ in found), rendezvous


def _stage(a: _Launch, nodes: NodeGroup) -> list[list[str] | None]:
    """Step staging: the data's notes (said once), each node's snapshot volumes mounted, and
    the stager's plan on each node; its command for run.sh, per node (None: no data)."""
    if not a.found:
        return [None] * nodes.n
    mounts = nodes.each(lambda i: _mounts(a, nodes, i))
    for note in datasets.notes(a.spec, a.settings, a.found):
        a.store.add_event(a.job.id, "data-note", detail=note)
        a.report.note(note)
    return nodes.each(lambda i: scripts.stage_plan(
        a.spec, a.settings, nodes.hosts[i], nodes.jobdirs[i], nodes.data_dirs[i], a.found,
        mounts[i]))


def _mounts(a: _Launch, nodes: NodeGroup, i: int) -> dict:
    if not isinstance(a.provider, CloudHosts):
        return {}  # no volumes: a dataset there is a path
    with nodes.store_for(a.store) as store:
        return a.provider.data_mounts(store, a.job, nodes.hosts[i], nodes.instances[i])


def _restore(a: _Launch, nodes: NodeGroup) -> dict | None:
    """Step restore: a relaunched job's last checkpoint: the plan (presigned GETs from the
    job store) goes to each node, whose run.sh fetches it (checked, restore_argv) before the
    job starts, and a recipe is told to resume. Returns the checkpoint it restores, or None
    when there is nothing to restore: the job starts over. Every node gets it (each rank
    resumes from its own disk)."""
    spec = a.spec
    if not spec.recovery.recover or a.job.facts.attempt < 2:
        return None
    plan = a.provider.checkpoint_plan(a.store, a.job, spec.max_runtime_s + 3600)
    if not plan:
        a.store.add_event(a.job.id, "restore", detail=f"attempt {a.job.facts.attempt}: no "
                                                      "checkpoint in the job store, the job "
                                                      "starts over")
        return None
    from ..host.checkpoint_manifest import LOGS

    # Node 0's log and metrics are the job's: the other nodes take its checkpoint only.
    files = [f for f in plan.get("files") or [] if f.get("path") not in LOGS]
    others = {**plan, "files": files, "bytes": sum(int(f.get("size") or 0) for f in files)}
    nodes.each(lambda i: nodes.hosts[i].write_text(f"{nodes.jobdirs[i]}/{scripts.RESTORE_PLAN}",
                                                   json.dumps(plan if i == 0 else others)))
    if attempts.resumable(spec):
        a.spec = dataclasses.replace(spec, args={**spec.args, "resume": True})
    attempts.resuming(a.store, a.job.id, a.job.facts.attempt, plan)
    return plan


def _grants(a: _Launch, nodes: NodeGroup) -> list[dict | None]:
    """Step results grant: where each node's agent stores the job's results (node i > 0
    under its own prefix); the line about it is said once."""
    grants: list[dict | None] = []
    for i in range(nodes.n):
        first = grants[0] if grants else None
        if i and first is not None and _grouped(a):
            # The nodes of a group hold the job's one grant, each storing below nodes/<i>/
            # (any node may come to hold any rank: host/regroup.py).
            grants.append({**first, "prefix": first["prefix"] + f"nodes/{i}/"})
            continue
        grant, note = a.provider.results_grant(a.store, a.job, a.spec, node=i)
        if note and i == 0:  # where the results go when nobody is watching, or what is lost
            a.store.add_event(a.job.id, "results-store", detail=note)
            (a.report.info if grant is not None and not note.startswith("WARNING")
             else a.report.note)(note)
        grants.append(grant)
    return grants


def _grouped(a: _Launch) -> bool:
    """Whether the job runs in its Auto Scaling group (AWS relaunches it, issue 27)."""
    return bool(a.store.job(a.job.id).facts.auto_scaling_group)


def _stream_settings(a: _Launch, grant: dict | None, stream_from: dict | None) -> dict | None:
    """Step stream: a recovering job's checkpoint stream (the agent uploads each new
    checkpoint to the job store as it is written), or None: no recovery, or no job store to
    stream to (said)."""
    if not a.spec.recovery.recover:
        return None
    if grant is None:
        warning = ("WARNING: no job store, so no checkpoint outlives the instance: a "
                   "relaunch after an interruption starts this job over")
        a.store.add_event(a.job.id, "checkpoints", detail=warning)
        a.report.note(warning)
        return None
    settle_s = a.settings.checkpoint_settle_seconds
    return {"settle_s": settle_s, "poll_s": min(1.0, max(0.05, settle_s / 2)),
            "start_seq": (stream_from or {}).get("seq") or 0,
            "start_slot": (stream_from or {}).get("slot"), "attempt": a.job.facts.attempt}


def _write_files(a: _Launch, nodes: NodeGroup, gpus: int, procs: int,
                 stages: list[list[str] | None], restore: bool, grants: list[dict | None],
                 stream: dict | None, rendezvous: tuple[str, int] | None) -> None:
    """Step job files, on every node: setup.sh and the secrets' file, run.sh (with the
    stager's and the restore's commands; on several nodes, torchrun with the node's rank and
    the rendezvous) and job.json (node 0's with the checkpoint stream; on several nodes, the
    node's environment)."""
    # The environment of the nodes' fast network (EFA on AWS), for a job on several nodes.
    fast = a.provider.network_environment(a.spec) \
        if rendezvous and isinstance(a.provider, CloudHosts) else {}
    # A job of an Auto Scaling group: node 0's agent ends the group with the job; on several
    # nodes each agent knows its rank, the attempt's nodes and rank 0's checkpoint stream (a
    # node meets the others again after AWS replaced one: host/regroup.py).
    grouped = a.provider.group_settings(a.store, a.job, a.spec) \
        if isinstance(a.provider, CloudRecovery) else {}
    members = [{"rank": i, "instance": nodes.instances[i], "address": nodes.addresses[i]}
               for i in range(nodes.n)]

    def group_part(i: int) -> dict:
        if not grouped or rendezvous is None:
            return grouped if i == 0 else {}
        return {"auto_scaling": {**grouped["auto_scaling"], "rank": i, "members": members,
                                 "stream": stream}}

    def write(i: int) -> None:
        host, jobdir = nodes.hosts[i], nodes.jobdirs[i]
        node, env = None, None
        if rendezvous is not None:
            master, port = rendezvous
            node = {"nodes": nodes.n, "rank": i, "master": master, "port": port,
                    "from_env": bool(grouped)}
            assert nodes.ifaces is not None  # set by _set_up on several nodes
            env = environment(nodes.n, i, master, port, nodes.ifaces[i], fast)
        scripts.write_job_scripts(host, jobdir, a.spec, a.job.id)
        host.write_text(f"{jobdir}/run.sh", scripts.run_script(
            a.spec, jobdir, host.python, procs, stages[i],
            scripts.restore_argv(host, jobdir) if restore else None, node=node,
            job_id=a.job.id, setup_once=scripts.setup_once(host)))
        settings = scripts.job_settings(
            a.settings, a.spec, a.provider, a.job.id, host, jobdir, nodes.data_dirs[i], gpus,
            procs, grants[i], stream if i == 0 else None, env, a.job.facts.attempt)
        if "budget" in settings and a.job.facts.attempt > 1:  # a relaunch: what came before
            settings["budget"]["spent_before_usd"] = ledger.spent_before(a.store, a.job, nodes.n)
        host.write_text(f"{jobdir}/job.json", json.dumps({**settings, **group_part(i)},
                                                         indent=1))

    nodes.each(write)


def _upload_bundle(a: _Launch, provider: ResultStore, nodes: NodeGroup,
                   copies: list[tuple[Path, str, tuple[str, ...]]], staged: bool,
                   required: bool = False) -> None:
    """Step bundle: a recovering job with a job store gets its bundle there (the first
    attempt's; a relaunch keeps it), what host/bootstrap.py on a replacement instance starts
    the job from with nothing of this machine: the synced files (the same listing), node 0's
    job files as written just now, the agent, and the agent's start line. `required`: a job
    of an Auto Scaling group, whose every replacement starts from the bundle: without one the
    launch fails (and its group is deleted), rather than leave a group that cannot recover."""
    a.report.phase("uploading the job's bundle to its job store")
    names = ["run.sh", "job.json"] + ([scripts.SETUP_FILE] if a.spec.setup else []) \
        + ([datasets.PLAN_FILE] if staged else [])
    try:
        with tempfile.TemporaryDirectory(prefix="cloudtrain-bundle-") as tmp:
            parts, meta = scripts.bundle_parts(nodes.hosts[0], nodes.jobdirs[0], a.job.id,
                                               copies, names, Path(tmp))
            line = provider.upload_bundle(a.store, a.job, a.spec, parts, meta)
    except CloudtrainError as exc:
        if required:
            raise
        # The job runs as it would have without a bundle; only an instance that starts it
        # alone needs one, and the supervisor here still relaunches over SSH.
        line = (f"no bundle in the job store ({' '.join(exc.message.split())}): a replacement "
                "instance cannot start the job by itself; the supervisor here relaunches it")
    if line:
        a.store.add_event(a.job.id, "bundle", detail=line)
        a.report.note(line)


def _start(a: _Launch, nodes: NodeGroup, procs: int, rendezvous: tuple[str, int] | None
           ) -> tuple[float, str | None]:
    """Step start: the agent in tmux on every node; when the job started, and what the
    timeline says of it."""
    if rendezvous is None:
        a.report.phase("starting the job in tmux")
    else:
        a.report.phase(f"starting the job in tmux on {nodes.n} nodes "
                       f"(rendezvous {rendezvous[0]}:{rendezvous[1]})")
    started = time.time()  # the job runs from here on: start_agent waits for the agent's word
    nodes.each(lambda i: nodes.hosts[i].start_agent(a.job.id, nodes.jobdirs[i]))
    if rendezvous is None:
        return started, (f"{procs} processes under torchrun" if procs > 1 else None)
    return started, (f"{nodes.n} nodes x {procs} process{'es' if procs > 1 else ''} under "
                     f"torchrun, rendezvous {rendezvous[0]}:{rendezvous[1]}")


def _advance(store: Store, job_id: str, new_state: str, detail: str | None = None,
             at: float | None = None) -> None:
    if not store.set_state(job_id, new_state, detail=detail, at=at) \
            and not store.job(job_id).active:
        raise LaunchCancelled(f"job {job_id} was stopped during launch")
