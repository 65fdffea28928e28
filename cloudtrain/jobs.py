"""The job lifecycle, the same for every backend:

    launch ─► provision ─► sync ─► setup ─► run (agent in tmux) ─► collect ─► release

Every transition is an event row in the state store; that timeline is what `status` shows.
This module talks to hosts only through `Host` and to clouds only through a provider; it
never imports boto3 or paramiko.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .host import agent as agent_module
from . import config, datasets, hostdata, lease, progress, providers, state
from .host.agent import metrics_tail, pid_alive, read_json
from .errors import CloudtrainError, HostError, Interrupted, MissingDependency, NoCredentials, \
    NotFound, NotRegularFile, PlacementError, UsageError
from .gitignore import survey
from .hosts import Host, LocalHost, agent_dir, close_quietly, measure, session_name, sync_many
from .spec import RECIPE, JobSpec
from .state import Job, Store

FOLLOW_POLL_S = 0.2
CHECKPOINT_COPY_TIMEOUT_S = 3600.0
UNREACHABLE = "host unreachable"  # the reason a job has while its host does not answer  # `--on` with --resume-from: copying GBs on the host
REFRESH_EVERY_S = 1.0


def plan(spec: JobSpec, store: Store | None = None, settings: config.Settings | None = None
         ) -> list[tuple[str, str]]:
    """What `launch` would do for this spec (`--dry-run`): nothing is created or billed. The
    datasets are read (with the user's credentials) for their sizes; one that cannot be read
    is said, as the launch would stop on it."""
    data_rows = []
    if spec.datasets:
        try:
            settings = settings or config.Settings.load()
            found = read_datasets(spec, settings)
            data_rows = [("data", datasets.staging_line(spec))] + [
                ("note", note) for note in datasets.notes(spec, settings, found)]
        except CloudtrainError as exc:
            data_rows = [("data", f"cannot be read, the launch would stop: {exc.message}")]
    renamed = None
    if store is not None:  # D18, D29: the checks the launch makes on the name, --on, --resume-from
        renamed = check_name(store, spec)
        _kept_source(store, spec)
        _resume_source(store, settings or config.Settings.load(), spec)
    rows = [("job", spec.display()), *_given_rows(spec),
            *providers.get(spec.backend).plan(spec), *data_rows]
    if renamed is not None:  # U4: the name row says whose name it takes
        rows = [("name", name_note(spec, renamed, launched=False)) if key == "name" else
                (key, value) for key, value in rows]
    row = expected(spec, store)
    if row is not None:
        from .render import estimate_line

        rows.append(("estimate", estimate_line(row, spec.market)[len("estimate: "):]))
    return rows


def _given_rows(spec: JobSpec) -> list[tuple[str, str]]:
    """U12: what the job takes besides its command, as the plan's rows: its name, the
    workdir's files (and those held back), setup's first line, the names of its envs and
    secrets (never a secret's value), its outputs; warnings on what the workdir sends."""
    rows = [("name", spec.name)] if spec.name else []
    if spec.workdir:
        found = survey(Path(spec.workdir), tuple(spec.include))
        count, size = measure(Path(spec.workdir), files=found.files)
        rows.append(("workdir", f"{spec.workdir}: {count} file{'' if count == 1 else 's'}, "
                                f"{progress.megabytes(size)} to sync"
                     + (f"; {_held_back(found.held_back)}" if found.held_back else "")))
        for line in (workdir_warning(Path(spec.workdir), tuple(spec.include)),
                     credentials_sent(spec)):
            if line:
                rows.append(("WARNING", line.removeprefix("WARNING: ")))
    if spec.setup:
        lines = [line.strip() for line in spec.setup.splitlines() if line.strip()]
        more = len(lines) - 1
        rows.append(("setup", lines[0] + (f" (and {more} more line{'' if more == 1 else 's'})"
                                           if more else "")))
    for key, names in (("env", sorted(spec.envs)), ("secrets", spec.secrets),
                       ("outputs", spec.outputs)):
        if names:
            rows.append((key, ", ".join(names)))
    return rows


def question(spec: JobSpec, warn: Callable[[str], None] | None = None
             ) -> providers.Question | None:
    """What `launch` says and asks before it goes on: the price of the paid resources it
    creates, or why a run here would not finish (a GPU recipe on a machine without a GPU).
    `warn`: the plan's warnings are said through it at once (and left out of the question),
    before the check that there are credentials to launch with (U5: before anything is asked
    or recorded; a warning is neither)."""
    provider = providers.get(spec.backend)
    provider.preflight(spec)  # what cannot work is refused before anything is asked
    asked = provider.question(spec)
    if asked is not None and warn is not None:
        for line in asked.warnings:
            warn(line)
        asked.warnings = []
    provider.ready(spec)  # U5: nor is a launch asked about that cannot start (no credentials)
    return asked


def expected(spec: JobSpec, store: Store | None = None):
    """The estimate (time and cost) of a cloud recipe job on its instance type, from the
    recipe's published result (estimate.py); None where there is no basis for one."""
    if spec.backend != "aws" or spec.on_job:
        return None
    from . import estimate

    try:
        region = providers.get(spec.backend).region(spec)
    except CloudtrainError:
        return None
    row = estimate.for_spec(spec, region, store)
    if row is not None:  # kept with the job, so `status JOB` can set it against the bill
        spec.expected = {"train_s": row.train_s, "total_s": row.total_s, "market": spec.market,
                         "usd": row.spot if spec.market == "spot" else row.on_demand,
                         "basis": row.scaling}
    return row


def run_script(spec: JobSpec, jobdir: str, python: str, procs: int = 1,
               stage: list[str] | None = None, restore: list[str] | None = None,
               node: dict | None = None, job_id: str = "", setup_once: bool = False) -> str:
    """The job's run.sh: cd into place and exec the command (no shell quoting games in tmux).
    A torchrun recipe on `procs` > 1 processes starts under torchrun, one process per GPU
    (`--standalone`: a private rendezvous on a free local port); on several machines (`node`:
    {nodes, rank, master, port}) every node starts torchrun with its rank and the rendezvous
    at node 0 (nodes.torchrun_argv). `restore`: the command that brings the last checkpoint
    from the job store (a relaunched spot job), and `stage`: the stager's, run first in that
    order: the job starts only once both are complete. The job file's `setup` runs next
    (setup_lines; `setup_once`: skipped where it already ran unchanged, a kept instance).
    A job's secrets are read first, from a file that is then deleted (job_secrets)."""
    # F1: nothing the user typed reaches this file outside shlex.quote; the one line that
    # names the job is JSON (newlines and control characters escaped) inside a comment.
    lines = ["#!/usr/bin/env bash", "set -e",
             "# cloudtrain job: " + json.dumps(spec.display())]
    if spec.secrets:
        from . import job_secrets

        lines += job_secrets.run_lines(jobdir)
    if restore:
        lines.append(shlex.join(restore))
    if stage:
        lines.append(shlex.join(stage))
    if spec.setup:
        lines += setup_lines(spec, jobdir, setup_once)
    if spec.kind == RECIPE:
        from . import recipes

        rec = recipes.load(spec.recipe)
        lines.append(f"cd {shlex.quote(jobdir)}")
        starter = [python]
        if node is not None and node["nodes"] > 1:
            from .nodes import torchrun_argv

            starter = torchrun_argv(python, node["nodes"], node["rank"], procs, node["master"],
                                    node["port"], job_id or "cloudtrain")
        elif procs > 1:
            starter = [python, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc_per_node={procs}"]
        lines.append("exec " + shlex.join([*starter, rec.entry_path(),
                                           *rec.script_args(spec.args)]))
    else:
        lines.append(f"cd {shlex.quote(jobdir + '/work')}")
        if len(spec.command) == 1:
            lines.append(spec.command[0])  # one string: the user's shell code, as written
        else:
            lines.append("exec " + shlex.join(spec.command))
    return "\n".join(lines) + "\n"


SETUP_FILE = "setup.sh"


def setup_lines(spec: JobSpec, jobdir: str, once: bool) -> list[str]:
    """run.sh's lines for the job file's `setup` (in SETUP_FILE beside run.sh): run in the
    job's working directory, its output in the job's log; a failure ends the job with the
    setup's exit code and says so (agent.setup_failure). `once`: a marker named by the
    script's sha256 beside the host's job directories skips it where it already ran
    unchanged (a kept instance reused with --on); each fresh instance runs it."""
    work = jobdir + "/work" if spec.kind != RECIPE or spec.workdir else jobdir
    q = shlex.quote
    marker = f"{jobdir.rsplit('/', 2)[0]}/setup-done/" + \
        hashlib.sha256(spec.setup.encode()).hexdigest()[:32]
    status = q(f"{jobdir}/{agent_module.SETUP_STATUS}")
    run = [f"cd {q(work)}",
           "echo 'cloudtrain: setup started'",
           f"set +e; bash {q(jobdir + '/' + SETUP_FILE)}; _ct_rc=$?; set -e",
           "if [ $_ct_rc -ne 0 ]; then printf '{\"state\": \"failed\", \"exit_code\": %d}\\n' "
           f"$_ct_rc > {status}; "
           "echo \"cloudtrain: setup failed (exit code $_ct_rc)\"; exit $_ct_rc; fi",
           "echo 'cloudtrain: setup done'"]
    if not once:
        return run
    return [f"if [ -e {q(marker)} ]; then echo 'cloudtrain: setup skipped: it ran unchanged "
            "on this instance'; else",
            *run, f"mkdir -p {q(marker.rsplit('/', 1)[0])} && touch {q(marker)}; fi"]


def _setup_once(host: Host) -> bool:
    """Whether setup may be skipped where it already ran unchanged: on an instance (kept and
    reused), not on this machine, where each job's setup runs (nothing here is "kept")."""
    return not isinstance(host, LocalHost)


def _write_job_scripts(host: Host, jobdir: str, spec: JobSpec, job_id: str) -> None:
    """Beside run.sh: the job file's setup script, and the secrets' private file (values
    from the spec in memory, else, for a relaunch, from job_secrets' copy)."""
    if spec.setup:
        host.write_text(f"{jobdir}/{SETUP_FILE}", spec.setup)
    if spec.secrets:
        from . import job_secrets

        values = spec.secret_values or job_secrets.load(job_id)
        missing = [k for k in spec.secrets if k not in values]
        if missing:
            raise UsageError(f"the value of secret {missing[0]} is gone (its job ended, or "
                             "its copy in $CLOUDTRAIN_HOME/secrets/ was removed)",
                             hint="launch the job again with the secret")
        host.write_text(f"{jobdir}/{job_secrets.HOST_FILE}", job_secrets.host_script(
            {k: values[k] for k in spec.secrets}), private=True)


def output_paths(spec: JobSpec) -> list[str]:
    """The job's named outputs relative to its directory on the host: own code's below its
    working directory (work/), a recipe's below the job directory."""
    base = "work/" if spec.kind != RECIPE or spec.workdir else ""
    return [base + p for p in spec.outputs]


def _warn_about_workdir(workdir: Path, include: tuple[str, ...],
                        say: Callable[[str], None] | None) -> None:
    """F6, F27: a workdir that is the home directory, holds it, or holds cloudtrain's own is
    synced without the credential-looking files (gitignore.CREDENTIAL_PATTERNS) but is almost
    surely a mistake: said with what is actually sent, what was held back, and what an
    --include sent anyway. Of any other workdir, the credential-looking files held back."""
    if say is None:
        return
    line = workdir_warning(workdir, include)
    if line is None:  # any other workdir: what the sync leaves out, said (F27)
        held = survey(workdir, include).held_back
        line = f"{_held_back(held)} from the workdir (--include PATTERN sends one)" \
            if held else None
    if line:
        say(line)


def workdir_warning(workdir: Path, include: tuple[str, ...] = ()) -> str | None:
    """The WARNING line for a workdir that is, or holds, the home directory or
    $CLOUDTRAIN_HOME (None for any other)."""
    where, home, state = Path(workdir).resolve(), Path.home().resolve(), config.home()
    if where == home:
        what = "is your home directory"
    elif home.is_relative_to(where):
        what = f"holds your home directory {home}"
    elif state.is_relative_to(where):
        what = f"holds cloudtrain's state {state}"
    else:
        return None
    found = survey(where, include)
    count, size = measure(where, files=found.files)
    line = (f"WARNING: the workdir {where} {what}: {count} file{'' if count == 1 else 's'} "
            f"({progress.megabytes(size)}) are sent to the host; "
            f"{_held_back(found.held_back)}")
    if found.included:
        line += f"; sent anyway by --include: {', '.join(found.included)}"
    return line


def _held_back(files: list[str], shown: int = 5) -> str:
    """`N credential-looking files held back (a, b, ... and M more)`."""
    n = len(files)
    if not n:
        return "no credential-looking file found"
    names = ", ".join(files[:shown]) + (f" and {n - shown} more" if n > shown else "")
    return f"{n} credential-looking file{'' if n == 1 else 's'} held back ({names})"


def credentials_sent(spec: JobSpec) -> str | None:
    """F27: what `--include` sends that the sync would otherwise hold back, as the line the
    launch asks (in a terminal, whatever -y says) or warns with: each file named."""
    if not spec.workdir or not spec.include:
        return None
    sent = survey(Path(spec.workdir), tuple(spec.include)).included
    if not sent:
        return None
    return (f"--include sends {len(sent)} credential-looking file{'' if len(sent) == 1 else 's'}"
            f" to the host: {', '.join(sent)}")


def job_environment(job_id: str, data_dir: str, host: Host, gpus: int = 0, procs: int = 1,
                    jobdir: str | None = None, attempt: int = 1) -> dict:
    """Environment for the job. On this machine the tmux server may be older than this
    shell, so what the job needs from the launching environment (PATH with its virtualenv)
    is passed here; a remote host keeps its own. CLOUDTRAIN_CHECKPOINT_DIR is where the job
    saves its checkpoints (a relaunched spot job finds its last one there, restored before
    it starts); CLOUDTRAIN_ATTEMPT counts the job's instances (1, then 2 after a relaunch)."""
    env = {"CLOUDTRAIN_JOB_ID": job_id, "CLOUDTRAIN_DATA_DIR": data_dir,
           "CLOUDTRAIN_GPUS": str(gpus), "CLOUDTRAIN_PROCS": str(procs),
           "CLOUDTRAIN_ATTEMPT": str(attempt)}
    if jobdir:
        env["CLOUDTRAIN_CHECKPOINT_DIR"] = f"{jobdir}/checkpoints"
    if isinstance(host, LocalHost):
        for key in ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX"):
            if key in os.environ:
                env[key] = os.environ[key]
    return env


# -- launch --------------------------------------------------------------------------------------


def check_name(store: Store, spec: JobSpec) -> Job | None:
    """A name refers to one job (D18), the newest of that name (U4): a name held by a job
    that has not finished is refused (`down NAME` would not know which); one held by a
    finished job moves to the new launch, so a job file with `name:` runs again and again.
    Returns the finished job that gives up the name, if any."""
    if not spec.name:
        return None
    taken = store.job_named(spec.name)
    if taken is None:
        return None
    if taken.active:
        raise UsageError(f"--name {spec.name}: job {taken.id} ({taken.state}) has that name "
                         f"and has not finished",
                         hint=f"stop it first (cloudtrain down {spec.name}), or give another "
                              f"name, e.g. --name {spec.name}-2")
    return taken


def name_note(spec: JobSpec, taken: Job | None, launched: bool) -> str | None:
    """What a launch says of a name it takes over from a finished job (U4)."""
    if taken is None:
        return None
    if launched:
        return (f"the name {spec.name} moves from job {taken.id} ({taken.state}) to this one; "
                f"that job keeps its id")
    return f"{spec.name} now names job {taken.id} ({taken.state}); this job takes the name"


def read_datasets(spec: JobSpec, settings: config.Settings) -> list:
    """Read what the job's datasets hold (datasets.preflight), before anything is created."""
    return datasets.preflight(spec, settings, providers.get(spec.backend, settings))


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
    provider.ready(spec)  # U5: nothing is recorded for a launch that cannot start
    # The datasets are read before anything is created: a missing prefix stops here.
    found = read_datasets(spec, settings) if found is None else found
    source = _resume_source(store, settings, spec)
    kept = _kept_source(store, spec)
    job = store.create_job(name=spec.name, kind=spec.kind, recipe=spec.recipe,
                           command=spec.display(), backend=spec.backend, spec=spec.to_dict(),
                           launcher=f"{socket.gethostname()}:{os.getpid()}")
    report.phase(f"launching job {job.id}: waiting until it starts (Ctrl-C cancels the launch)")
    if renamed is not None:
        report.note(name_note(spec, renamed, launched=True))
    if spec.secret_values and spec.recover:  # a relaunch needs them when nobody is here
        from . import job_secrets

        job_secrets.save(job.id, spec.secret_values)
    if spec.recover:
        from . import recovery

        recovery.begin(store, job, spec)
    try:
        # The cleanup runs inside the signal guard too: a second SIGTERM is noted, not obeyed,
        # from the first signal to the end of the cleanup.
        with lease.renewing(store.path, job.id), lease.signals_interrupt():
            start_attempt(store, settings, spec, provider, job, report, found, source, kept)
    except NoCredentials as exc:  # U21: the way on that only a launch has
        exc.hint = f"{exc.hint}; `cloudtrain launch --dry-run` works without"
        raise
    finally:
        store.update_job(job.id, lease_until=None)
    job = store.job(job.id)
    if spec.recover and job.active:
        from . import supervisor

        line = supervisor.ensure(store, settings)
        if line:
            report.note(line)
    return job


def start_attempt(store: Store, settings: config.Settings, spec: JobSpec, provider, job: Job,
                  say: Callable[[str], None] | progress.Reporter | None = None,
                  found: list | None = None, source: Job | None = None,
                  kept: Job | None = None) -> None:
    """One attempt at the job: provision, sync, set up, start. A failure releases what it
    started, and fails the job (raised), unless a spot interruption took the instance of a
    recovering job (it goes to `recovering`, returned). A relaunch's PlacementError (no
    capacity or quota here) is raised before anything was created: the caller tries the next
    place."""
    report = progress.of(say)
    try:
        _, started, detail = _launch_steps(store, settings, spec, provider, job,
                                           source, kept, report, found)
        # With data to stage, the job runs once the stager says it is complete
        # (refresh moves it on, at the stager's own clock).
        _advance(store, job.id, state.STAGING if found else state.RUNNING,
                 detail=datasets.staging_line(spec) if found else detail, at=started)
        if spec.recover:
            from . import recovery

            recovery.started(store, job.id, spec.attempt, started)
        report.phase(f"started job {job.id}" + (": its data is staged first" if found else ""))
    except BaseException as exc:
        if isinstance(exc, PlacementError) and spec.attempt > 1:
            raise  # nothing was created here; the relaunch tries its next place
        recovering = _abort_launch(store, settings, provider, job, _open_hosts.get(job.id), exc)
        if recovering:
            report.note(f"job {job.id}: {recovering}")
            return
        if isinstance(exc, (KeyboardInterrupt, CloudtrainError)):
            raise
        raise CloudtrainError(f"launch of job {job.id} failed: {exc}") from exc


def _launch_steps(store: Store, settings: config.Settings, spec: JobSpec, provider, job: Job,
                  source: Job | None, kept: Job | None, report: progress.Reporter,
                  found: list | None = None) -> tuple[Host, float, str | None]:
    """Provision, sync, set up and start the agent: the host the agent runs on, when the job
    started, and what to say of the start in the timeline. Each step is a phase of `report`."""
    if spec.nodes > 1:
        return _launch_nodes(store, settings, spec, provider, job, source, report, found)
    _advance(store, job.id, state.PROVISIONING)
    if kept is not None:
        report.phase(f"taking over job {kept.id}'s instance")
        host = provider.adopt(store, kept, job)
        _open_hosts.pop(kept.id, None)
    else:
        host = provider.acquire(store, job, spec, report)
    _open_hosts[job.id] = host
    if spec.recover:
        from . import recovery

        recovery.placed(store, job.id, spec.attempt)
    jobdir = provider.jobdir(job.id, host)
    store.update_job(job.id, host=host.describe(), jobdir=jobdir)
    like = _remote_jobdir(kept) if kept is not None else None

    _advance(store, job.id, state.SYNCING)
    data_dir = provider.data_dir(host)
    host.run("mkdir -p " + " ".join(shlex.quote(d) for d in (
        f"{jobdir}/checkpoints", f"{jobdir}/work", data_dir)))
    host.install_agent(jobdir)
    copies = _copies(store, spec, job, jobdir, like, report)
    sent = sync_many(host, copies, report)
    if source is not None:
        report.phase(f"copying job {source.id}'s checkpoints")
        _copy_checkpoints(source, host, jobdir)

    _advance(store, job.id, state.SETTING_UP, detail=f"{sent} files sent")
    report.phase("setting up the host")
    provider.setup(host)
    store.update_job(job.id, host=host.describe())
    gpus = provider.gpus(spec, host)
    procs = spec.processes(gpus)
    mounts = provider.data_mounts(store, job, host) if found else {}
    stage = _stage_step(spec, settings, host, jobdir, data_dir, found, mounts, report, store,
                        job)
    stream_from = _restore_step(store, spec, provider, job, [host], [jobdir])
    restore = restore_argv(host, jobdir) if stream_from else None
    _write_job_scripts(host, jobdir, spec, job.id)
    host.write_text(f"{jobdir}/run.sh", run_script(spec, jobdir, host.python, procs, stage,
                                                   restore, setup_once=_setup_once(host)))
    grant, note = provider.results_grant(store, job, spec)
    if note:  # where the results go when nobody is watching, or what is lost without it
        store.add_event(job.id, "results-store", detail=note)
        report.note(note)
    stream = _stream_settings(store, settings, spec, job, grant, stream_from, report)
    if stream:
        store.update_job(job.id, host={**host.describe(), "checkpoint_stream": True})
    host.write_text(f"{jobdir}/job.json", json.dumps(_job_settings(
        settings, spec, provider, job, host, jobdir, data_dir, gpus, procs, grant, stream),
        indent=1))

    report.phase("starting the job in tmux")
    started = time.time()  # the job runs from here on: start_agent waits for the agent's word
    host.start_agent(job.id, jobdir)
    return host, started, (f"{procs} processes under torchrun" if procs > 1 else None)


def _copies(store: Store, spec: JobSpec, job: Job, jobdir: str, like: str | None,
            report: progress.Reporter) -> list[tuple[Path, str, str | None, tuple[str, ...]]]:
    """What is synced into the job directory: (local dir, remote dir, like, include) for the
    recipe, the shared recipe code and the workdir."""
    copies: list[tuple[Path, str, str | None, tuple[str, ...]]] = []
    if spec.kind == RECIPE:
        from . import recipes

        rec = recipes.load(spec.recipe)
        copies.append((rec.path, f"{jobdir}/recipes/{rec.name}",
                       like and f"{like}/recipes/{rec.name}", ()))
        shared = rec.path.parent / recipes.SHARED_DIR
        if shared.is_dir():
            copies.append((shared, f"{jobdir}/recipes/{recipes.SHARED_DIR}",
                           like and f"{like}/recipes/{recipes.SHARED_DIR}", ()))
        published = rec.nodes_published(spec.args)
        if published > spec.nodes:  # say how this run differs from the published one
            note = (f"variant {spec.args.get('variant')} was published on {published} machines; "
                    f"this job runs on {spec.nodes} (--nodes {published} for the published "
                    f"run), with the published per-GPU batch: a global batch "
                    f"{published / spec.nodes:g}x smaller, the lr scaled with it")
            store.add_event(job.id, "fewer-machines", detail=note)
            report.note(note)
    if spec.workdir:
        _warn_about_workdir(Path(spec.workdir), tuple(spec.include), report)
        copies.append((Path(spec.workdir), f"{jobdir}/work", like and f"{like}/work",
                       tuple(spec.include)))
    return copies


def _stage_step(spec: JobSpec, settings: config.Settings, host: Host, jobdir: str,
                data_dir: str, found: list | None, mounts: dict, report: progress.Reporter,
                store: Store, job: Job, quiet: bool = False) -> list[str] | None:
    """The stager's command for run.sh (its plan written to the host), or None: no data."""
    plan = datasets.host_plan(found or [], spec, settings, data_dir, mounts)
    for note in datasets.notes(spec, settings, found) if found and not quiet else []:
        store.add_event(job.id, "data-note", detail=note)
        report.note(note)
    if plan is None:
        return None
    host.write_text(f"{jobdir}/{datasets.PLAN_FILE}", json.dumps(plan))
    return [host.python, f"{agent_dir(jobdir)}/stager.py", f"{jobdir}/{datasets.PLAN_FILE}",
            f"{jobdir}/{datasets.STATUS_FILE}"]


def _stream_settings(store: Store, settings: config.Settings, spec: JobSpec, job: Job,
                     grant: dict | None, stream_from: dict | None,
                     report: progress.Reporter) -> dict | None:
    """A recovering job's checkpoint stream (the agent uploads each new checkpoint to the job
    store as it is written), or None: no recovery, or no job store to stream to (said)."""
    if not spec.recover:
        return None
    if grant is None:
        warning = ("WARNING: no job store, so no checkpoint outlives the instance: a "
                   "relaunch after an interruption starts this job over")
        store.add_event(job.id, "checkpoints", detail=warning)
        report.note(warning)
        return None
    return {"settle_s": settings.checkpoint_settle_seconds,
            "poll_s": min(1.0, max(0.05, settings.checkpoint_settle_seconds / 2)),
            "start_seq": (stream_from or {}).get("seq") or 0,
            "start_slot": (stream_from or {}).get("slot"), "attempt": spec.attempt}


def _job_settings(settings: config.Settings, spec: JobSpec, provider, job: Job, host: Host,
                  jobdir: str, data_dir: str, gpus: int, procs: int, grant: dict | None,
                  stream: dict | None, node_env: dict | None = None) -> dict:
    """The host's job.json: what the agent enforces and the job's environment."""
    shutdown_command, shutdown_delay = provider.shutdown(spec)
    env = job_environment(job.id, data_dir, host, gpus, procs, jobdir, spec.attempt)
    return {
        "job_id": job.id,
        "max_runtime_s": spec.max_runtime_s,
        "grace_s": settings.stop_grace_seconds,
        "heartbeat_s": settings.heartbeat_seconds,
        "shutdown_command": shutdown_command,
        "shutdown_delay_s": shutdown_delay,
        # Without a stored copy the power-off waits (bounded) for the CLI to collect.
        "collect_wait_s": max(shutdown_delay, settings.collect_wait_minutes * 60),
        # The job file's envs over cloudtrain's environment (CLOUDTRAIN_* are refused
        # there), the node's rendezvous over both.
        "env": {**env, **spec.envs, **(node_env or {})},
        "outputs": output_paths(spec),
        "results_store": grant,
        **({"checkpoint_stream": stream} if stream else {}),
        **provider.agent_settings(spec),
    }


def _launch_nodes(store: Store, settings: config.Settings, spec: JobSpec, provider, job: Job,
                  source: Job | None, report: progress.Reporter, found: list | None
                  ) -> tuple[Host, float, str | None]:
    """_launch_steps for a job on spec.nodes machines: all of them acquired at once (or
    none), then each step on every node in parallel, one connection per node; node 0 is the
    rendezvous and its host is the job's."""
    from . import nodes

    n = spec.nodes
    _advance(store, job.id, state.PROVISIONING)
    hosts = provider.acquire_nodes(store, job, spec, report)
    _open_hosts[job.id] = hosts[0]
    for i, h in enumerate(hosts[1:], start=1):
        nodes.keep(job.id, i, h)
    if spec.recover:
        from . import recovery

        recovery.placed(store, job.id, spec.attempt)
    jobdirs = nodes.each(lambda i: provider.jobdir(job.id, hosts[i]), n)
    addresses = [provider.node_address(h) for h in hosts]
    instances = provider.node_instances(store, job, hosts)

    def record(extra: list[dict] | None = None) -> dict:
        recs = [{**h.describe(), "jobdir": jobdirs[i], "address": addresses[i],
                 "instance": instances[i], **((extra or [{}] * n)[i])}
                for i, h in enumerate(hosts)]
        return {**hosts[0].describe(), "nodes": recs}

    store.update_job(job.id, host=record(), jobdir=jobdirs[0])
    store.add_event(job.id, "nodes", detail=", ".join(
        f"node {i}: {instances[i] or hosts[i].name} ({addresses[i]})" for i in range(n)))

    _advance(store, job.id, state.SYNCING)
    data_dirs = [provider.data_dir(h) for h in hosts]
    # The same files go to every node: packed once into one tar stream, which each node
    # unpacks through its own connection (one round trip, no rsync process per node).
    copies = _copies(store, spec, job, "", None, report)
    import tempfile

    from .hosts import bundle

    with tempfile.NamedTemporaryFile(prefix="cloudtrain-sync-", suffix=".tar") as tar:
        files, size = bundle([(local, remote.lstrip("/"), include)
                              for local, remote, _, include in copies], tar)
        tar.flush()
        packed = os.path.getsize(tar.name)
        report.phase(f"syncing {files} file{'' if files == 1 else 's'}, "
                     f"{progress.megabytes(size)} to each of {n} nodes")
        report.transfer(packed * n)
        done = [0] * n
        lock = threading.Lock()

        def progress_of(i: int):
            def sent(count: int) -> None:
                with lock:
                    done[i] = count
                    report.sent(sum(done))
            return sent

        def prepare(i: int) -> int:
            h, jd = hosts[i], jobdirs[i]
            h.run("mkdir -p " + " ".join(shlex.quote(d) for d in (
                f"{jd}/checkpoints", f"{jd}/work", data_dirs[i])))
            h.install_agent(jd)
            h.unpack(Path(tar.name), jd, sent=progress_of(i))
            if source is not None:
                _copy_checkpoints(source, h, jd)
            return files

        sent = sum(nodes.each(prepare, n))
        report.sent(packed * n)

    _advance(store, job.id, state.SETTING_UP, detail=f"{sent} files sent to {n} nodes")
    report.phase(f"setting up {n} nodes")

    def setup(i: int) -> tuple[int, str | None, int | None]:
        h = hosts[i]
        provider.setup(h)
        gpus = provider.gpus(spec, h)
        out = h.run(nodes.rendezvous_script(h.python, addresses[i],
                                            nodes.MASTER_PORT if i == 0 else 0),
                    check=False).stdout
        iface, port = nodes.read_rendezvous(out)
        return gpus, iface, port

    found_out = nodes.each(setup, n)
    gpus = min(g for g, _, _ in found_out)
    procs = spec.processes(gpus)
    master, port = addresses[0], found_out[0][2] or nodes.MASTER_PORT
    store.update_job(job.id, host=record([{"iface": f[1]} for f in found_out]))
    efa = provider.efa_environment(spec)
    stream_from = _restore_step(store, spec, provider, job, hosts, jobdirs)
    grants = []
    for i in range(n):
        grant, note = provider.results_grant(store, job, spec, node=i)
        if note and i == 0:
            store.add_event(job.id, "results-store", detail=note)
            report.note(note)
        grants.append(grant)
    stream = _stream_settings(store, settings, spec, job, grants[0], stream_from, report)
    if stream:
        store.update_job(job.id, host={**store.job(job.id).host, "checkpoint_stream": True})

    def write(i: int) -> None:
        h, jd = hosts[i], jobdirs[i]
        with Store(store.path) as mine:  # a connection of this thread's own
            mounts = provider.data_mounts(mine, job, h, instances[i]) if found else {}
            stage = _stage_step(spec, settings, h, jd, data_dirs[i], found, mounts,
                                progress.SILENT, mine, job, quiet=i > 0)
        node = {"nodes": n, "rank": i, "master": master, "port": port}
        restore = restore_argv(h, jd) if stream_from else None
        _write_job_scripts(h, jd, spec, job.id)
        h.write_text(f"{jd}/run.sh", run_script(spec, jd, h.python, procs, stage, restore,
                                                node=node, job_id=job.id,
                                                setup_once=_setup_once(h)))
        env = nodes.environment(n, i, master, port, found_out[i][1], efa)
        h.write_text(f"{jd}/job.json", json.dumps(_job_settings(
            settings, spec, provider, job, h, jd, data_dirs[i], gpus, procs, grants[i],
            stream if i == 0 else None, env), indent=1))

    nodes.each(write, n)
    for note in datasets.notes(spec, settings, found) if found else []:
        report.note(note)
    report.phase(f"starting the job in tmux on {n} nodes (rendezvous {master}:{port})")
    started = time.time()
    nodes.each(lambda i: hosts[i].start_agent(job.id, jobdirs[i]), n)
    return hosts[0], started, (f"{n} nodes x {procs} process{'es' if procs > 1 else ''} "
                               f"under torchrun, rendezvous {master}:{port}")



RESTORE_PLAN = "restore.json"  # on the host: the checkpoint to fetch before the job starts
RESTORE_STATUS = "restore-status.json"


def _restore_step(store: Store, spec: JobSpec, provider, job: Job, hosts: list[Host],
                  jobdirs: list[str]) -> dict | None:
    """A relaunched job's last checkpoint: the plan (presigned GETs from the job store) goes
    to each host, whose run.sh fetches it (checked, restore_argv) before the job starts, and
    a recipe is told to resume. Returns the checkpoint it restores, or None when there is
    nothing to restore: the job starts over. Every node gets it (each rank resumes from its
    own disk)."""
    if not spec.recover or spec.attempt < 2:
        return None
    from . import recovery

    plan = provider.checkpoint_plan(store, job, spec.max_runtime_s + 3600)
    if not plan:
        store.add_event(job.id, "restore", detail=f"attempt {spec.attempt}: no checkpoint in "
                                                  "the job store, the job starts over")
        return None
    from .host.checkpoint_stream import LOGS

    for i, (host, jobdir) in enumerate(zip(hosts, jobdirs)):
        # Node 0's log and metrics are the job's: the other nodes take its checkpoint only.
        files = [f for f in plan.get("files") or [] if f.get("path") not in LOGS]
        mine = plan if i == 0 else {**plan, "files": files,
                                    "bytes": sum(int(f.get("size") or 0) for f in files)}
        host.write_text(f"{jobdir}/{RESTORE_PLAN}", json.dumps(mine))
    if recovery.resumable(spec):
        spec.args = {**spec.args, "resume": True}
    recovery.resuming(store, job.id, spec.attempt, plan)
    return plan


def restore_argv(host: Host, jobdir: str) -> list[str]:
    """run.sh's first line on a relaunched job's host: fetch the checkpoint of its plan."""
    return [host.python, f"{agent_dir(jobdir)}/checkpoint_stream.py", "restore",
            f"{jobdir}/{RESTORE_PLAN}", jobdir]


class LaunchCancelled(CloudtrainError):
    """The job was stopped (`down`) while it was being launched."""


def _advance(store: Store, job_id: str, new_state: str, detail: str | None = None,
             at: float | None = None) -> None:
    if not store.set_state(job_id, new_state, detail=detail, at=at) \
            and not store.job(job_id).active:
        raise LaunchCancelled(f"job {job_id} was stopped during launch")


def _kept_source(store: Store, spec: JobSpec) -> Job | None:
    """The job whose kept instance `--on` reuses: ended, with its instance still running."""
    if not spec.on_job:
        return None
    source = store.find_job(spec.on_job)
    if source.active:  # learn of an end nobody has seen yet (D29)
        source = refresh(store, config.Settings.load(), source)
    if source.backend != spec.backend:
        raise UsageError(f"--on {source.id}: that job ran on {source.backend}, not {spec.backend}")
    if source.active:
        raise UsageError(f"--on {source.id}: the job is still {source.state}; wait for it, or "
                         f"`cloudtrain down {source.id}`")
    if not any(i.state != "terminated" for i in store.instances(source.id)):
        raise UsageError(f"--on {source.id}: its instance is gone (launch it with --keep to reuse "
                         "it)")
    return source


def _remote_jobdir(job: Job) -> str | None:
    """Where a job's directory is on its host, also after its files were collected home."""
    return (job.host or {}).get("remote_jobdir") or job.jobdir


def _resume_source(store: Store, settings: config.Settings, spec: JobSpec) -> Job | None:
    if not spec.resume_from:
        return None
    # Refreshed first: a job whose instance went away unseen has its checkpoints in the job
    # store, and its end is learnt (and its files brought home) here.
    source = refresh(store, settings, store.find_job(spec.resume_from))
    if source.active:  # refreshed just now (D12): it really is still running
        raise UsageError(f"--resume-from {source.id}: the job is still {source.state}",
                         hint=f"wait for its end (cloudtrain logs {source.id} --follow), or "
                              f"stop it: cloudtrain down {source.id}")
    if source.recipe != spec.recipe:
        raise UsageError(f"--resume-from {source.id}: that job ran {source.command}, "
                         f"not recipe {spec.recipe}")
    if not source.jobdir:
        raise UsageError(f"--resume-from {source.id}: the job never started, so it has no checkpoint")
    _check_resumable(source, spec)
    return source


def _check_resumable(source: Job, spec: JobSpec) -> None:
    """The arguments the recipe's checkpoint is tied to (recipe.yaml `resume_must_match`)
    are the same in both jobs, checked before anything is launched (D33): the recipe itself
    would refuse only once its instance is up, e.g. resnet9's "checkpoints/last.pt is for 2
    epochs, this run asks for 4"."""
    from . import recipes

    rec = recipes.load(spec.recipe)
    before = (source.spec or {}).get("args") or {}
    for key in rec.resume_must_match:
        old, new = before.get(key), spec.args.get(key)
        if old != new:
            def said(value):
                return "the recipe's default" if value is None else f"{key}={value}"

            raise UsageError(f"--resume-from {source.id}: its checkpoint was written with "
                             f"{said(old)}, this run has {said(new)}; recipe {rec.name} "
                             f"resumes only with the same {key}",
                             hint=f"--set {key}={old}" if old is not None else
                             f"leave out --set {key}")


def _copy_checkpoints(source: Job, host: Host, jobdir: str) -> None:
    """The source job's checkpoints into the new job: copied on the host they share, or
    sent from this machine where they were collected (a cloud job's, after it ended)."""
    source_host = host_of(source)
    src = f"{source.jobdir}/checkpoints"
    found = source_host.run(f"test -d {shlex.quote(src)} && ls -A {shlex.quote(src)}",
                            check=False).stdout.split()
    if not found:
        raise UsageError(f"--resume-from {source.id}: it saved no checkpoint"
                         + ("" if source.backend == "local" else
                            " that was brought home (its instance is gone)"))
    if source_host.describe() == host.describe():
        host.run(f"cp -a {shlex.quote(src)}/. {shlex.quote(jobdir)}/checkpoints/",
                 timeout=CHECKPOINT_COPY_TIMEOUT_S)
    elif isinstance(source_host, LocalHost):
        host.sync(Path(src), f"{jobdir}/checkpoints")
    else:
        raise UsageError(f"--resume-from {source.id}: its checkpoints are still on its own "
                         f"instance; wait until it ends (they are brought home then)")


def _abort_launch(store, settings, provider, job, host, exc) -> str | None:
    """Undo a launch that cannot finish: stop the agent if it started, release the host
    (terminating any instance), and record why. Nothing interrupts this (F15: a second
    Ctrl-C once stopped the termination half-way); a failure to release is recorded and
    raised, naming the command that finishes the job. Returns what to say when the job goes
    on: a spot interruption took the instance of a recovering job (during sync, say), which
    then waits in `recovering` for the supervisor's relaunch (or failed, restarts used up);
    None otherwise."""
    interrupted = isinstance(exc, KeyboardInterrupt)
    if not interrupted and not isinstance(exc, LaunchCancelled):
        recovering = _spot_taken(store, settings, provider, job)
        if recovering:
            return recovering
    message = exc.message if isinstance(exc, CloudtrainError) else str(exc)
    if isinstance(exc, lease.LaunchInterrupted):
        reason = f"interrupted during launch ({exc.signame})"
    else:
        reason = "interrupted during launch" if interrupted else f"launch failed: {message}"
    with lease.uninterruptible("terminating what the launch started"):
        store.rollback()  # a signal may have come inside a write transaction
        jobdir = store.job(job.id).jobdir
        started = store.job(job.id).state not in (state.PENDING, state.PROVISIONING,
                                                   state.SYNCING)
        if host is not None and jobdir and started:
            # The agent may be starting or started: stop it, and its tmux session with it (on
            # this machine nothing else would; an instance is terminated anyway). On every
            # node of a job on several machines.
            from . import nodes

            current = store.job(job.id)
            many = len(nodes.records(current)) > 1

            def stop_node(i: int) -> None:
                h = nodes.host(current, i) if many else host
                jd = nodes.jobdir(current, i) if many else jobdir
                try:
                    h.stop_job(jd, settings.stop_grace_seconds)
                    h.run(h.tmux("kill-session", "-t", session_name(job.id)), check=False,
                          timeout=30)
                except Exception:  # the host may be what failed; releasing it is what matters
                    pass

            nodes.each(stop_node, len(nodes.records(current)) if many else 1)
        if (store.job(job.id).spec or {}).get("secrets"):
            _drop_secrets(store.job(job.id), host)
        released = True
        try:
            provider.release(store, store.job(job.id), force=True)
        except Exception as release_exc:
            released = False
            reason += f"; RELEASE FAILED: {release_exc}"
        store.set_state(job.id, state.CANCELLED if interrupted else state.FAILED,
                        reason=reason.splitlines()[0])
        try:  # D20: what the instance's minutes cost, shown by status, not "-"
            settle_cost(store, store.job(job.id))
        except Exception:  # a price lookup is not worth failing the cleanup over
            pass
    if not released and any(i.state != "terminated" for i in store.instances(job.id)):
        raise CloudtrainError(
            f"job {job.id}: its instance may still be running ({reason.splitlines()[0]})",
            hint=f"cloudtrain down {job.id} (it terminates by record and by tag)")
    return None


def _drop_secrets(job: Job, host: Host | None) -> None:
    """A launch that ends before run.sh ran: the secrets' host file goes (a kept instance or
    this machine keeps its disk), and so does this machine's copy for relaunches."""
    from . import job_secrets

    job_secrets.forget(job.id)
    if host is not None and job.jobdir:
        try:
            host.run("rm -f " + shlex.quote(f"{job.jobdir}/{job_secrets.HOST_FILE}"),
                     check=False, timeout=30)
        except Exception:  # the host may be what failed; an instance is terminated anyway
            pass


def _spot_taken(store, settings, provider, job) -> str | None:
    """A recovering job whose spot instance EC2 took back while it was being set up: the
    attempt ends as interrupted and the job is relaunched (or fails, restarts used up)."""
    from . import recovery

    current = store.job(job.id)
    if not recovery.recoverable(current) or current.state == state.PENDING:
        return None
    try:
        states = provider.instance_states(store, current)
    except Exception:  # the cloud cannot say: an ordinary launch failure
        return None
    if not _spot_reason(states):
        return None
    store.rollback()
    why = f"spot instance interrupted during {current.state}"
    after = recovery.interrupted(store, settings, current, None, why, host_alive=False)
    if after.state == state.FAILED:
        return after.reason or why
    return f"{why}; the recovery supervisor relaunches it (`cloudtrain status {job.id}`)"


def _spot_reason(states: dict) -> bool:
    return any(s["state"] in ("shutting-down", "terminated") and
               ("Spot" in s.get("reason", "") or "Spot" in s.get("message", ""))
               for s in states.values())


# -- observing -----------------------------------------------------------------------------------


# Hosts this process has opened, by job: one SSH connection per host for every step.
_open_hosts: dict[str, Host] = {}


def host_of(job: Job) -> Host:
    """The host that has the job's directory: its instance, or this machine once the job's
    files were collected here."""
    kind = (job.host or {}).get("kind")
    cached = _open_hosts.get(job.id)
    if cached is not None and type(cached).__name__ == kind:
        return cached
    if kind == "LocalHost" and job.backend != "local":
        host: Host = LocalHost((job.host or {}).get("tmux_socket", "cloudtrain"))
    else:
        host = providers.get(job.backend).host_for(job)
    _open_hosts[job.id] = host
    return host


def _forget_host(job_id: str) -> None:
    close_quietly(_open_hosts.pop(job_id, None))


def refresh(store: Store, settings: config.Settings, job: Job) -> Job:
    """Bring an active job's record up to date from its host (one probe round trip)."""
    if job.state == state.RECOVERING:  # the supervisor's to relaunch
        return job
    if job.active and job.state not in (state.RUNNING, state.STAGING):
        return _check_launcher(store, job)
    if not job.active or not job.jobdir:
        return job
    if len(_node_records(job)) > 1:
        report = _probe_nodes(store, settings, job)
        if isinstance(report, Job):  # a node is lost, and what that means was decided
            return report
    else:
        try:
            report = host_of(job).probe_job(job.jobdir, settings.stale_after_seconds)
        except HostError as exc:
            return _host_lost(store, settings, job, exc)
    fields = {}
    if (job.reason or "").startswith(UNREACHABLE):  # it answers again
        fields["reason"] = None
    if report.get("metrics"):
        fields["metrics"] = report["metrics"]
    status = report.get("status") or {}
    if status.get("started_at") and not job.started_at:
        fields["started_at"] = status["started_at"]
    staging = report.get("staging")
    if job.state == state.STAGING and staging:
        fields["metrics"] = {**(fields.get("metrics") or {}),
                             "staging": datasets.progress_line(staging)}
        if _record_staged(store, job, staging):  # the data is complete: the job itself runs
            fields["metrics"] = report.get("metrics") or None
    agent_state = status.get("state")
    if agent_state == state.PREEMPTED and (job.spec or {}).get("recover"):
        from . import recovery

        if not recovery.drained(job, status):  # the notice's checkpoint is on its way up
            _stop_nodes(job, settings, wait=False)  # the other nodes' jobs checkpoint too
            store.update_job(job.id, reason="spot interruption notice: uploading the "
                                            "checkpoint", **fields)
            return store.job(job.id)
        why = "spot interruption notice" if status.get("interruption") or \
            len(_node_records(job)) < 2 else status.get("reason") or "spot instance interrupted"
        return recovery.interrupted(store, settings, job, status, why, host_alive=True)
    if agent_state in state.TERMINAL_STATES:
        # Only the process that records the end collects and releases: two collecting at
        # once would race on the same files, and one releasing under the other cut it short.
        if store.set_state(job.id, agent_state, at=status.get("ended_at") or time.time(),
                           detail=status.get("reason"), exit_code=status.get("exit_code"),
                           reason=status.get("reason"), **fields):
            _finish(store, job)
        return store.job(job.id)
    if fields:
        store.update_job(job.id, **fields)
    if job.backend != "local":  # what it has cost so far (an estimate until it ends)
        from . import ledger

        ledger.settle(store, store.job(job.id))
    return store.job(job.id)


def _record_staged(store: Store, job: Job, staging: dict | None) -> bool:
    """A job still in `staging` whose stager said the data is complete runs from then on:
    the `running` event at the stager's own end time (also when it is learnt only after the
    job ended, from the job store), so the cost of the copy and of the training split there."""
    if job.state != state.STAGING or not staging or staging.get("state") != "staged":
        return False
    return store.set_state(job.id, state.RUNNING, at=staging.get("ended_at") or time.time(),
                           detail=datasets.staged_line(staging), expect=state.STAGING)


def _node_records(job: Job) -> list[dict]:
    from . import nodes

    return nodes.records(job)


def _probe_nodes(store: Store, settings: config.Settings, job: Job) -> dict | Job:
    """refresh's probe for a job on several machines: every node at once (one round trip
    each, on its own connection). The report is node 0's (its metrics are rank 0's) with the
    job's status combined from all nodes (nodes.combine), and the staging of the node that
    is furthest from done. A node that does not answer is looked up in the cloud: its
    instance gone means its end (what it stored in the job store, else failed, or preempted
    when EC2 took a spot instance back); still there, the job is only unreachable now."""
    from . import nodes

    recs = nodes.records(job)
    n = len(recs)

    def probe(i: int):
        try:
            return nodes.host(job, i).probe_job(nodes.jobdir(job, i), settings.stale_after_seconds)
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
        probe_files(job.jobdir) if (job.host or {}).get("collected_from") is not None else {}
    report["status"] = nodes.combine(statuses)
    stagings = [r.get("staging") if isinstance(r, dict) else None for r in reports]
    report["staging"] = next((st for st in stagings if not st or st.get("state") != "staged"),
                             stagings[0])
    _record_node_agents(store, job.id, statuses)
    return report


def _record_node_agents(store: Store, job_id: str, statuses: list) -> None:
    """What each node's agent last said (state, exit code, reason), kept in the job's node
    records for `status JOB`; a node not heard from keeps what it said before."""
    from . import nodes

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


def _nodes_lost(store: Store, settings: config.Settings, job: Job, lost: dict,
                statuses: list) -> Job | None:
    """Nodes that did not answer a probe: each whose instance is gone gets its end in
    `statuses` (from the job store, or failed/preempted by what EC2 says); if any node is
    only unreachable and none has ended, the job is recorded as unreachable and returned."""
    from . import nodes

    recs = nodes.records(job)
    states = providers.get(job.backend).instance_states(store, job)
    recorded = {i.id for i in store.instances(job.id)}
    unreachable = []
    for i, exc in lost.items():
        inst = recs[i].get("instance")
        seen = states.get(inst) if inst else None
        gone = bool(inst) and ((seen is None and inst in recorded and job.backend != "local")
                               or (seen is not None and seen["state"] in ("shutting-down",
                                                                            "terminated")))
        if not gone:
            unreachable.append(f"node {i}: {exc.message}")
            continue
        spot = _spot_reason({inst: seen}) if seen else False
        try:
            if i == 0:
                stored = _from_job_store(store, job) or {}
            else:
                stored = _node_from_store(store, job, i)
                if stored is not None:
                    _mark_node_collected(store, job.id, i)
                stored = stored or {}
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
                           "ended_at": time.time(), "exit_code": None,
                           "reason": ("spot instance interrupted" if spot else
                                      f"its instance {inst} was terminated ({why})")}
    ended = any(s and s.get("state") in state.TERMINAL_STATES and s.get("state") !=
                state.SUCCEEDED for s in statuses)
    if unreachable and not ended:
        store.update_job(job.id, reason=f"{UNREACHABLE}: " + "; ".join(unreachable))
        return store.job(job.id)
    return None


def _node_from_store(store: Store, job: Job, node: int) -> dict | None:
    """Node i's files from the job store (its agent put them there before the power-off),
    brought to jobs/<id>/nodes/<i>/; its stored status, or None when nothing was stored. The
    caller records the node as collected (_mark_node_collected)."""
    from . import nodes

    local = nodes.local_dir(job.id, node)
    fetched = providers.get(job.backend).fetch_results(store, job, local, node=node)
    if not fetched:
        return None
    return hostdata.clean_status(read_json(str(local / "status.json")))


def _mark_node_collected(store: Store, job_id: str, node: int) -> None:
    from . import nodes

    job = store.job(job_id)
    host = dict(job.host or {})
    where = host["collected_from"] if host.get("collected_from") is not None else host
    recs = where.get("nodes")
    if isinstance(recs, list) and node < len(recs):
        recs[node] = {**recs[node], "collected": True,
                      "local_jobdir": str(nodes.local_dir(job_id, node))}
        store.update_job(job_id, host=host)


def _stop_nodes(job: Job, settings: config.Settings, wait: bool = True,
                grace_s: float | None = None, store: Store | None = None) -> list:
    """Ask every node's agent still running the job to stop it (SIGTERM, SIGKILL after the
    grace period); with `wait`, until each has (bounded); without, only the signal. One
    node's failure to answer never holds the others. Returns each node's final status (or
    the error), node 0 first; with `store`, what they said is kept for `status JOB`."""
    from . import nodes

    recs = nodes.records(job)
    if len(recs) < 2:
        return []
    grace = settings.stop_grace_seconds if grace_s is None else grace_s

    def stop(i: int):
        if recs[i].get("collected") or (i == 0 and (job.host or {}).get("collected_from")):
            return None
        result, problem = _bounded(
            lambda: nodes.host(job, i).stop_job(nodes.jobdir(job, i), grace, wait=wait),
            grace + STOP_MARGIN_S)
        return problem if problem is not None else result

    answers = nodes.each(stop, len(recs))
    if store is not None:
        _record_node_agents(store, job.id, [a if isinstance(a, dict) else None
                                            for a in answers])
    return answers


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
    if not (states and all(s["state"] in ("shutting-down", "terminated")
                           for s in states.values())):
        store.update_job(job.id, reason=f"{UNREACHABLE}: {exc.message}")
        return store.job(job.id)
    if (job.spec or {}).get("recover") and store.job(job.id).state != job.state:
        return store.job(job.id)  # another process saw the loss first and acted on it
    try:
        status = _from_job_store(store, job) or {}
    except CloudtrainError as store_exc:  # throttled, expired credentials: ask again later
        store.update_job(job.id, reason=f"{UNREACHABLE}; the job store could not be read "
                                        f"({store_exc.message}): status tries again")
        return store.job(job.id)
    spot = _spot_reason(states)
    if (job.spec or {}).get("recover") and (status.get("state") == state.PREEMPTED or (
            spot and status.get("state") != state.SUCCEEDED)):
        from . import recovery

        why = "spot interruption notice" if status.get("state") == state.PREEMPTED else \
            "spot instance interrupted without a notice"
        gone = {i for i, s in states.items() if s["state"] in ("shutting-down", "terminated")}
        return recovery.interrupted(store, settings, job, status, why, host_alive=False,
                                    gone=gone)
    # The stored status is the agent's word, unless EC2 took a spot instance back under a
    # job that had not finished: then the agent saw only a signal (the shutdown's SIGTERM, or
    # SIGHUP as tmux went) and EC2 knows why.
    if status.get("state") in state.TERMINAL_STATES and not (
            spot and status["state"] not in (state.SUCCEEDED, state.PREEMPTED)):
        store.set_state(job.id, status["state"], at=status.get("ended_at") or time.time(),
                        detail=status.get("reason"), exit_code=status.get("exit_code"),
                        reason=status.get("reason"))
    else:
        reason = "spot instance interrupted" if spot else \
            "instance terminated before the job's end was seen: " + \
            "; ".join(f"{i}: {s['message'] or s['state']}" for i, s in states.items())
        store.set_state(job.id, state.PREEMPTED if spot else state.FAILED, reason=reason,
                        detail=reason)
    _finish(store, store.job(job.id), collect=False, force=True)  # it is gone anyway
    return store.job(job.id)


def probe_files(jobdir: str) -> dict:
    """What a probe reports, read from a job directory on this machine without acting on it."""
    latest, target, summary = metrics_tail(jobdir)
    return hostdata.clean_report({"status": read_json(os.path.join(jobdir, "status.json")),
                                  "staging": read_json(os.path.join(jobdir,
                                                                    datasets.STATUS_FILE)),
                                  "now": time.time(), "metrics": latest, "target": target,
                                  "runs": summary})


def _read_record(job: Job, stale_after_s: float = 1e9) -> dict:
    """The job's status and metrics, the way a probe reports them. A job whose files were
    brought home is read without the probe's reaping: a status.json that came from an instance
    names process groups there, and nothing here may be signalled because of it."""
    if (job.host or {}).get("collected_from") is not None:
        return probe_files(job.jobdir)
    return host_of(job).probe_job(job.jobdir, stale_after_s)


def _from_job_store(store: Store, job: Job) -> dict | None:
    """Bring the job's files home from the job store that outlives its instance; the stored
    status (untrusted, checked like a probe's answer), or None when nothing was stored. A
    store that cannot be read now raises (CloudtrainError): the caller decides nothing."""
    local = config.home() / "jobs" / job.id
    fetched = providers.get(job.backend).fetch_results(store, job, local)
    if not fetched:
        return None
    store.add_event(job.id, "results", detail=(
        f"{fetched['files']} files ({fetched['bytes'] / 1e6:.1f} MB) from the job store"
        + ("" if fetched.get("complete") else "; the upload was not complete")))
    store.update_job(job.id, jobdir=str(local), host={
        "kind": "LocalHost", "collected_from": job.host, "remote_jobdir": job.jobdir,
        "from_store": True})
    _forget_host(job.id)
    report = _read_record(store.job(job.id))
    if report.get("metrics"):
        store.update_job(job.id, metrics=report["metrics"])
    _record_staged(store, store.job(job.id), report.get("staging"))
    return report.get("status")


def _check_launcher(store: Store, job: Job) -> Job:
    """A job still being launched whose launcher is gone will never start: fail it and
    release what it holds. Gone means its lease ran out (seen from any machine), or, on the
    launching machine itself, that its process no longer exists (seen at once).

    F11: `job` is a snapshot, perhaps seconds old (status refreshes jobs one by one); the
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
    from . import recovery

    relaunch = recovery.launcher_died(store, job)
    if relaunch is not None:  # the supervisor died mid-relaunch: its restart goes on
        return relaunch
    reason = f"the launching process died during {job.state}" if died else \
        f"the launch stopped answering during {job.state} (its lease expired)"
    if store.set_state(job.id, state.FAILED, reason=reason, detail=reason, expect=job.state):
        # F14: it never ran, so even a --keep instance goes; it wrote nothing to collect.
        _finish(store, store.job(job.id), collect=False, force=True)
    return store.job(job.id)


def collect_files(store: Store, job: Job) -> bool:
    """Copy a remote job's log, metrics and status to $CLOUDTRAIN_HOME/jobs/<id>/ (before its
    host goes away); from then on the job is read from there."""
    local = config.home() / "jobs" / job.id
    _collect_nodes(store, job)
    job = store.job(job.id)
    if job.jobdir and Path(job.jobdir) == local and isinstance(host_of(job), LocalHost):
        _note_local_outputs(store, job)
    if not job.jobdir or Path(job.jobdir) == local or isinstance(host_of(job), LocalHost):
        return False
    host = host_of(job)
    settings = config.Settings.load()
    try:
        for name in ("output.log", "metrics.jsonl", "status.json", "job.json", "run.sh",
                     datasets.STATUS_FILE):
            try:
                data = host.read(f"{job.jobdir}/{name}")
            except NotRegularFile:
                continue  # a FIFO or a link the job put there (F34): the rest comes home
            local.mkdir(parents=True, exist_ok=True)
            config.write_private(local / name, data)
        pulled = host.pull_tree(f"{job.jobdir}/checkpoints", local / "checkpoints",
                                settings.collect_checkpoints_mb * 1e6)
        outputs = output_paths(JobSpec.from_dict(job.spec or {"kind": "command",
                                                               "backend": job.backend}))
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
    outputs = output_paths(JobSpec.from_dict(job.spec or {"kind": "command",
                                                           "backend": job.backend}))
    if not outputs or any(e.phase == "outputs" for e in store.events(job.id)):
        return
    missing = [o for o in outputs if not os.path.lexists(Path(job.jobdir, o))]
    note = f"outputs: in {job.jobdir}"
    if missing:
        note += "; not found: " + ", ".join(missing[:5]) + \
            (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    store.add_event(job.id, "outputs", detail=note)


def outputs_note(got, local: Path, settings: config.Settings) -> str:
    """What came home of the job's named outputs (D39: a limit hit or a path not found is
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


NODE_FILES = ("output.log", "status.json", "job.json", "run.sh", datasets.STATUS_FILE)


def _collect_nodes(store: Store, job: Job) -> None:
    """Nodes 1.. of a job on several machines: their log, status and settings to
    jobs/<id>/nodes/<i>/ (over their own connection, else from the job store), and the
    `collected` marker their agents wait for before powering off. Node 0 is the job's own
    directory (collect_files)."""
    from . import nodes

    recs = nodes.records(job)
    if len(recs) < 2:
        return

    def collect(i: int) -> None:
        if recs[i].get("collected"):
            return
        h, jd = nodes.host(job, i), nodes.jobdir(job, i)
        local = nodes.local_dir(job.id, i)
        if isinstance(h, LocalHost) and Path(jd) == local:
            return
        try:
            for name in NODE_FILES:
                try:
                    data = h.read(f"{jd}/{name}")
                except NotRegularFile:
                    continue  # a FIFO or a link the job put there (F34)
                local.mkdir(parents=True, exist_ok=True)
                config.write_private(local / name, data)
            h.write_text(f"{jd}/collected", str(time.time()))
        except HostError:
            try:
                with Store(store.path) as mine:  # a connection of this thread's own
                    if _node_from_store(mine, job, i) is None:
                        return
            except CloudtrainError:
                return
        done.append(i)

    done: list[int] = []
    nodes.each(lambda i: collect(i) if i else None, len(recs))
    for i in done:
        _mark_node_collected(store, job.id, i)


def _finish(store: Store, job: Job, collect: bool = True, force: bool = False) -> None:
    """After the job: bring its files home (over SSH, else from the job store), give the
    host back whatever happened to the files, settle the cost."""
    try:
        if len(_node_records(job)) > 1:  # the nodes still running the job stop first
            _stop_nodes(store.job(job.id), config.Settings.load(), store=store)
        if collect and not collect_files(store, store.job(job.id)):
            _collect_from_store(store, store.job(job.id))
    finally:
        providers.get(job.backend).release(store, store.job(job.id), force=force)
        if len(_node_records(job)) > 1:
            from . import nodes

            nodes.forget(job.id)
        if not store.job(job.id).active:
            from . import job_secrets, recovery

            recovery.close(store, store.job(job.id))
            job_secrets.forget(job.id)  # it runs no more: nothing needs its secrets
    settle_cost(store, store.job(job.id))


def _collect_from_store(store: Store, job: Job) -> None:
    """The SSH copy failed (the instance powered off under it, a slow link): take the files
    from the job store instead, where the agent put them before the power-off."""
    if not job.jobdir or (job.host or {}).get("collected_from") is not None \
            or isinstance(host_of(job), LocalHost):
        return
    try:
        _from_job_store(store, job)
    except CloudtrainError as exc:
        store.add_event(job.id, "results", detail=f"job store not readable: {exc.message}")


def settle_cost(store: Store, job: Job) -> None:
    """Record the job's cost (settled once every instance is terminated and priced), with
    the cost at which it first reached its target."""
    from . import ledger

    target_time = None
    # Read from the job's files where they are here; a remote host is not asked (it may be
    # the unreachable one `down` just terminated, and the cost must not wait on it).
    here = job.backend == "local" or (job.host or {}).get("collected_from") is not None
    if job.jobdir and here:
        try:
            target = _read_record(job).get("target") or {}
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
        providers.get(job.backend).record_ends(store, job)
        settle_cost(store, store.job(job.id))
        done += store.job(job.id).cost_settled
    return done


def refresh_active(store: Store, settings: config.Settings,
                   active: list[Job] | None = None) -> None:
    """Refresh every active job (`active`: those already read), each one's trouble noted on
    it rather than hiding the others'. Reads no finished job: `status` lists 10,000 of
    those in a fraction of a second (history.select)."""
    for job in store.jobs(active_only=True) if active is None else active:
        try:
            refresh(store, settings, job)
        except CloudtrainError as exc:  # one job's cloud or host trouble never hides the rest
            store.update_job(job.id, reason=f"could not refresh: {exc.message}")


def _log_of(job: Job, node: int) -> tuple[Host | None, str | None]:
    """(host, output.log path) of the job's node `node` (0: the job's own log)."""
    from . import nodes

    if node and node >= len(nodes.records(job)):
        raise UsageError(f"--node {node}: job {job.id} runs on "
                         f"{len(nodes.records(job)) or 1} node(s), numbered from 0")
    where = nodes.jobdir(job, node) if node else job.jobdir
    if not where:
        return None, None
    return (nodes.host(job, node) if node else host_of(job)), f"{where}/output.log"


def read_log(job: Job, offset: int = 0, node: int = 0) -> bytes:
    host, path = _log_of(job, node)
    return host.read(path, offset) if host is not None else b""


def tail_log(job: Job, lines: int, node: int = 0) -> tuple[bytes, int]:
    """The last `lines` lines of the job's output (of node `node`) and the offset where the
    file ended."""
    host, path = _log_of(job, node)
    return host.tail(path, lines) if host is not None else (b"", 0)


def follow(store: Store, settings: config.Settings, job: Job, offset: int = 0,
           node: int = 0) -> Iterator[bytes]:
    """Yield the job's output (node `node`'s) as it is written, until the job has ended and
    all is read."""
    host, where = None, None
    next_refresh = 0.0
    while True:
        job = store.job(job.id)
        current, path = _log_of(job, node)
        if path != where:  # its files were brought home: read them there from now on
            host, where = None, path
        if path and host is None:
            host = current
        if host is not None:
            try:
                chunk = host.read(path, offset)
            except (HostError, OSError):
                # The connection dropped (often: the instance powered off as the job ended).
                # Forget it; the refresh below finds the job's end and where its files are now.
                _forget_host(job.id)
                if node:
                    from . import nodes

                    nodes.forget(job.id)
                host, chunk, next_refresh = None, b"", 0.0
            if chunk:
                offset += len(chunk)
                yield chunk
                continue
        if not job.active:
            return
        if time.monotonic() >= next_refresh:
            job = refresh(store, settings, job)
            next_refresh = time.monotonic() + REFRESH_EVERY_S
            if not job.active:
                continue  # read what the job wrote last, then stop
        time.sleep(FOLLOW_POLL_S)


# -- stopping ------------------------------------------------------------------------------------


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


STOP_MARGIN_S = 30.0  # beyond the grace period, how long a graceful stop may take


def cancel(store: Store, settings: config.Settings, refs: tuple[str, ...], every: bool,
           grace_s: float | None = None) -> list[StopOutcome]:
    """Stop jobs: SIGTERM to the job, SIGKILL after the grace period; mark them cancelled and
    terminate their instances.

    `down` is the kill switch, so it works whatever the host does (F4, F26): the graceful stop
    is bounded, and the instance is then terminated by record and by tag through the cloud's
    API whether or not the stop worked. One job's failure never stops the others. `--all`
    also terminates instances tagged as ours that no job in the store holds (F12: a lost or
    other machine's state), and a reference that is no job here may name such an instance's
    job."""
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
            outcomes.append(_stop_one(store, settings, job, grace))
        except KeyboardInterrupt:  # U30: say what is left as it is
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
    return store.jobs(active_only=True) + [j for j in store.jobs()
                                           if not j.active and _holds_instance(store, j)]


def _stop_one(store: Store, settings: config.Settings, job: Job, grace: float) -> StopOutcome:
    """One job: a bounded graceful stop where it runs, then release whatever happens."""
    if not job.active and _holds_instance(store, job):
        return _release_outcome(store, job, True, f"{job.state}; its kept instance terminated")
    try:
        job = refresh(store, settings, job)
    except Exception as exc:  # the cloud or host misbehaving must not keep it billing
        store.update_job(job.id, reason=f"could not refresh before stopping: {exc}")
        job = store.job(job.id)
    if not job.active and not _holds_instance(store, job):
        return StopOutcome(job.id, job, False, f"already {job.state}: nothing to stop")
    status, problem = {}, None
    if (job.reason or "").startswith(UNREACHABLE):  # the probe just now got no answer:
        problem = job.reason                          # no graceful stop to wait for
    elif job.jobdir and job.state in (state.RUNNING, state.STAGING) and \
            len(_node_records(job)) > 1:  # every node at once, each bounded
        answers = _stop_nodes(job, settings, grace_s=grace, store=store)
        status = answers[0] if isinstance(answers[0], dict) else {}
        problems = [f"node {i}: {a}" for i, a in enumerate(answers) if isinstance(a, str)]
        problem = "; ".join(problems) or None
    elif job.jobdir and job.state in (state.RUNNING, state.STAGING):
        status, problem = _bounded(lambda: host_of(job).stop_job(job.jobdir, grace) or {},
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


def _release_outcome(store: Store, job: Job, stopped: bool, note: str,
                     collect: bool = True) -> StopOutcome:
    try:
        with lease.uninterruptible("terminating the job's instance"):
            _finish(store, job, collect=collect, force=True)
    except Exception as exc:
        message = exc.message if isinstance(exc, CloudtrainError) else f"{type(exc).__name__}: {exc}"
        return StopOutcome(job.id, store.job(job.id), stopped,
                           f"{note}; RELEASE FAILED, its instance may still be running: {message}",
                           ok=False)
    return StopOutcome(job.id, store.job(job.id), stopped, note)


def _bounded(call, seconds: float):
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


def _stop_orphans(store: Store, refs: list[str] | None) -> list[tuple[str, StopOutcome]]:
    """Terminate live instances tagged as ours that no job in the store holds (all of them,
    or those whose job tag starts with one of `refs`), in every region the owner can have
    one (F28: the store and config.yaml may be a fresh machine's). Without any AWS
    configuration or credentials there is nothing to find, unless this store used AWS.
    Besides the instances: "sweep" outcomes that say which regions were checked, and each
    region that could not be (ok False: something may bill there)."""
    backend = "aws"
    used = _cloud_used(store, backend)
    provider = providers.get(backend)
    if not (used or provider.configured()):  # no AWS on this machine: nothing to look with
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
    for orphan in swept.found:
        tag = orphan.get("job") or ""
        if refs is not None and not any(tag.startswith(r) for r in refs if r):
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


def sweep_outcomes(backend: str, swept) -> list[StopOutcome]:
    """Each region that could not be checked (ok False), then the regions that were."""
    out = [StopOutcome(backend, None, False, f"could not check {region}: {why}", False,
                       kind="sweep") for region, why in sorted(swept.unchecked.items())]
    if swept.regions:
        other = " other" if swept.unchecked else ""
        out.append(StopOutcome(backend, None, False, f"checked {len(swept.regions)}{other} "
                               f"region{'s' if len(swept.regions) != 1 else ''} "
                               f"({swept.chosen_by}): {', '.join(swept.regions)}",
                               kind="sweep"))
    return out


def _cloud_used(store: Store, backend: str) -> bool:
    return store.db.execute("SELECT 1 FROM jobs WHERE backend = ? LIMIT 1",
                            (backend,)).fetchone() is not None


def _cloud_configured(settings: config.Settings, backend: str) -> bool:
    """Whether this machine is set up for the cloud (so `down --all` asks it even with an
    empty store): it is the default backend, or a region is configured."""
    return bool(settings.backend == backend or settings.region or os.environ.get("AWS_REGION")
                or os.environ.get("AWS_DEFAULT_REGION"))


def _holds_instance(store: Store, job: Job) -> bool:
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
    if every and (_cloud_used(store, "aws") or _cloud_configured(settings, "aws")):
        by_backend["aws"] = set()  # every region the store knows, and the configured one
    for backend, regions in by_backend.items():
        try:
            providers.get(backend).cleanup(store, regions or None)
        except CloudtrainError:
            pass  # unused groups and key pairs do not bill; the next `down --all` tries again


# -- reading the record -------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    start: float
    duration: float | None  # None: still in this phase
    detail: str | None = None


def timeline(store: Store, job: Job) -> list[Phase]:
    events = store.events(job.id)
    phases = []
    for i, ev in enumerate(events):
        if ev.phase in state.TERMINAL_STATES:
            phases.append(Phase(ev.phase, ev.at, 0.0, ev.detail))
            continue
        end = events[i + 1].at if i + 1 < len(events) else None
        phases.append(Phase(ev.phase, ev.at, None if end is None else max(end - ev.at, 0.0),
                            ev.detail))
    return phases


# -- acting on a job: every command refreshes it first and answers from its current state ---


def _ran(store: Store, job: Job) -> bool:
    """Whether the job got as far as running (or staging data for) its command."""
    return bool(job.jobdir) and any(e.phase in (state.RUNNING, state.STAGING)
                                    for e in store.events(job.id))


def _why(job: Job) -> str:
    return job.reason or job.state


def _ended(job: Job) -> str:
    return f"job {job.id} has ended ({job.state}" + (f": {job.reason}" if job.reason else "") + ")"


def _on_its_host(store: Store, settings: config.Settings, job: Job, action: str) -> Job:
    """The job, refreshed, if it is where `attach`/`ssh` can reach it; else the reason why
    not (D8, D13): it never started, it has ended, or it has no host yet."""
    job = refresh(store, settings, job)
    if not job.active and not _ran(store, job):
        if job.backend != "local":
            raise UsageError(f"job {job.id} has no instance ({_why(job)})",
                             hint=f"cloudtrain status {job.id}")
        raise UsageError(f"job {job.id} never started: {_why(job)}",
                         hint=f"cloudtrain status {job.id}")
    if not job.active and not (action == "ssh" and _holds_instance(store, job)):
        raise UsageError(_ended(job), hint=f"cloudtrain logs {job.id}")
    if job.active and job.state not in (state.RUNNING, state.STAGING):
        raise UsageError(f"job {job.id} is {job.state}: nothing to {action} to yet",
                         hint=f"cloudtrain logs {job.id} --follow (it waits for the start)")
    return job


def _node_host(job: Job, node: int) -> Host:
    from . import nodes

    if node and node >= len(nodes.records(job)):
        raise UsageError(f"--node {node}: job {job.id} runs on "
                         f"{len(nodes.records(job)) or 1} node(s), numbered from 0")
    return nodes.host(job, node) if node else host_of(job)


def attach_argv(store: Store, settings: config.Settings, job: Job,
                terminal: bool = True, node: int = 0) -> list[str]:
    """tmux's command line that attaches to the job's session (on node `node`). `terminal`:
    whether this process has one (tmux needs it: "open terminal failed: not a terminal",
    D40)."""
    job = _on_its_host(store, settings, job, "attach")
    if not terminal:
        raise UsageError(f"attach needs a terminal; use cloudtrain logs {job.id} -f")
    host = _node_host(job, node)
    if not host.session_alive(job.id):
        raise UsageError(f"job {job.id} has no tmux session any more",
                         hint=f"cloudtrain status {job.id}")
    return host.attach_argv(job.id)


def ssh_argv(store: Store, settings: config.Settings, job: Job, node: int = 0,
             command: tuple[str, ...] = (), tty: bool = True) -> list[str]:
    """The ssh line to a job's instance: a shell, or `command` run there (one word: shell
    code as written; several: each word quoted, as `launch -- CMD` treats them)."""
    job = _on_its_host(store, settings, job, "ssh")
    host = _node_host(job, node)
    if job.backend == "local" and isinstance(host, LocalHost):
        raise UsageError(f"job {job.id} runs on this machine: use cloudtrain attach {job.id}",
                         hint=f"cloudtrain logs {job.id}")
    if isinstance(host, LocalHost):  # its files were brought home: the instance is gone
        raise UsageError(_ended(job) + " and its instance is gone",
                         hint=f"cloudtrain logs {job.id}")
    if not command:
        return host.ssh_argv()
    return host.ssh_argv(command[0] if len(command) == 1 else shlex.join(command), tty=tty)


def for_logs(store: Store, settings: config.Settings, ref: str) -> Job:
    """The job whose output `logs` prints, refreshed (a job whose instance is gone is then
    read from where its files went). One that never started has no output: why (D9)."""
    job = refresh(store, settings, store.find_job(ref))
    if not job.active and not _ran(store, job):
        raise CloudtrainError(f"job {job.id} never started: {_why(job)}",
                              hint=f"cloudtrain status {job.id}")
    return job


def reconcile(store: Store):
    """Every instance the cloud has tagged as ours, in every region the owner can have one,
    and whether the store knows it: a providers.Sweep whose `found` is the list, and
    `unchecked` the regions that could not be asked."""
    return providers.get("aws").reconcile(store)


def metrics_file(job: Job) -> Path:
    """The job's metrics.jsonl on this machine: its own (a job here, or one whose files came
    home), else a fresh copy of the instance's (at most curves.MAX_BYTES) in jobs/<id>/;
    where the instance cannot be read, the copy from before, if any."""
    from .curves import MAX_BYTES

    local = config.home() / "jobs" / job.id / "metrics.jsonl"
    if not job.jobdir:
        return local
    host = host_of(job)
    if isinstance(host, LocalHost):
        return Path(job.jobdir) / "metrics.jsonl"
    if not job.active and local.exists():  # it writes no more: the copy is whole
        return local
    try:
        data = host.read(f"{job.jobdir}/metrics.jsonl", 0, MAX_BYTES)
        local.parent.mkdir(parents=True, exist_ok=True)
        config.write_private(local, data)
    except (HostError, OSError):  # the instance is gone, or this disk refuses the copy
        pass
    return local


def recipe_target(job: Job) -> tuple[float | None, str | None]:
    """The recipe's target (its accuracy, a fraction as metrics.jsonl writes it, and its
    metric), or (None, None)."""
    if not job.recipe:
        return None, None
    from . import recipes

    try:
        target = recipes.load(job.recipe).target or {}
    except CloudtrainError:  # the recipe is gone or changed
        return None, None
    return target.get("value"), target.get("metric")


@dataclass
class Detail:
    job: Job
    phases: list[Phase]
    log_tail: bytes  # the last lines of output
    target: dict | None  # the recipe's target_reached row, if it was reached
    runs: dict | None = None  # the recipe's runs_summary row (`--set runs=N`), once written
    attempts: list | None = None  # a recovering job's attempts (recovery.summary)
    recovery: dict | None = None  # what its interruptions cost (recovery.recovery_cost)
    trend: str | None = None  # a sparkline of its accuracy by epoch (curves.accuracy_trend)
    startup: dict | None = None  # the recipe's {"event": "startup"} row: before the 1st step


def detail(store: Store, settings: config.Settings, ref: str, tail_lines: int = 10) -> Detail:
    job = refresh(store, settings, store.find_job(ref))
    probe, log_tail = {}, b""
    if job.jobdir:
        host = host_of(job)
        try:
            probe = _read_record(job, settings.stale_after_seconds)
            log_tail, _ = host.tail(f"{job.jobdir}/output.log", tail_lines)
        except HostError as exc:  # the instance is gone and its files were not collected
            log_tail = f"(output not available: {exc.message})\n".encode()
    from . import recovery

    attempts = recovery.summary(store, job)
    return Detail(job, timeline(store, job), log_tail, probe.get("target"), probe.get("runs"),
                  attempts, recovery.recovery_cost(attempts) if attempts else None,
                  *_from_metrics(job))


def _from_metrics(job: Job) -> tuple[str | None, dict | None]:
    """`status JOB`'s accuracy sparkline (None without accuracy rows) and the job's last
    startup breakdown (None when it wrote none)."""
    from . import curves

    rows, events = curves.read_rows(metrics_file(job))
    trend = curves.accuracy_trend(rows, metric=recipe_target(job)[1]) if rows else None
    startup = [e for e in events if e.get("event") == "startup"]
    return trend, (startup[-1] if startup else None)
