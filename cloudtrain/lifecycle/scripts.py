"""Stage: launch's files on the host, the ones a job's host runs and reads: run.sh (with
the setup script, the secrets' file, the stager's and the restore's commands before the
job's own), job.json (what the agent enforces, the job's environment) and the stager's plan.
Only text and the host's verbs; it calls secrets, nothing else of the lifecycle.

    run_script(spec, jobdir, ...)     run.sh
    threads_line(procs)               run.sh's line: torch's threads per process (issue 28)
    setup_lines(spec, jobdir, once)   run.sh's lines for the job file's `setup`
    write_job_scripts(host, ..)       beside run.sh: setup.sh and the secrets' private file
    job_settings(...)                 job.json
    job_environment(...)              the job's CLOUDTRAIN_* environment
    stage_plan(...)                   the stager's plan on the host, and its command
    restore_argv(host, jobdir)        the command that fetches a relaunch's checkpoint
    bundle_parts(host, jobdir, ...)   the job's bundle: what an instance starts it from alone
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path

from .. import config, datasets
from ..errors import UsageError
from ..host import agent_control, bootstrap, checkpoint_manifest
from ..hosts import Host, agent_dir, bundle, host_files
from ..local_host import LocalHost
from ..nodes import torchrun_argv
from ..providers.base import CloudHosts
from ..spec import RECIPE, JobSpec
from . import secrets

SETUP_FILE = "setup.sh"
RESTORE_PLAN = checkpoint_manifest.RESTORE_PLAN  # on the host, before the job starts


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
    A job's secrets are read first, from a file that is then deleted (secrets.py). A
    recovering job's resumable recipe resumes where bootstrap.py left its RESUME marker (a
    replacement instance that restored a checkpoint)."""
    # Nothing the user typed reaches this file outside shlex.quote; the one line that
    # names the job is JSON (newlines and control characters escaped) inside a comment.
    lines = ["#!/usr/bin/env bash", "set -e",
             "# cloudtrain job: " + json.dumps(spec.display())]
    if spec.secrets:
        lines += secrets.run_lines(jobdir)
    if restore:
        lines.append(shlex.join(restore))
    if stage:
        lines.append(shlex.join(stage))
    if spec.setup:
        lines += setup_lines(spec, jobdir, setup_once)
    if spec.kind == RECIPE:
        from .. import recipes

        assert spec.recipe is not None  # a recipe job names its recipe
        rec = recipes.load(spec.recipe)
        lines.append(f"cd {shlex.quote(jobdir)}")
        lines.append(threads_line(procs))
        starter = [python]
        if node is not None and node["nodes"] > 1 and node.get("from_env"):
            # A node of an Auto Scaling group: its rank and the rendezvous are job.json's
            # (the agent's environment), which host/regroup.py rewrites when the nodes meet
            # again; the bundle's run.sh is then every node's.
            starter = torchrun_argv(python, node["nodes"], NODE_RANK_VAR, procs, MASTER_VAR,
                                    PORT_VAR, job_id or "cloudtrain")
        elif node is not None and node["nodes"] > 1:
            starter = torchrun_argv(python, node["nodes"], node["rank"], procs, node["master"],
                                    node["port"], job_id or "cloudtrain")
        elif procs > 1:
            starter = [python, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc_per_node={procs}"]
        if spec.recovery.recover and "resume" in rec.arguments and not spec.args.get("resume"):
            # The bundle holds attempt 1's run.sh; a replacement whose bootstrap restored a
            # checkpoint leaves its marker, and the same run.sh then resumes from it.
            args = {k: v for k, v in spec.args.items() if k != "resume"}
            resumed = [*starter, rec.entry_path(), *rec.script_args({**args, "resume": True})]
            lines.append(f"if [ -e {shlex.quote(jobdir + '/' + bootstrap.RESUME)} ]; then "
                         f"exec {_joined(starter, resumed[len(starter):])}; fi")
        lines.append("exec " + _joined(starter, [rec.entry_path(),
                                                 *rec.script_args(spec.args)]))
    else:
        lines.append(f"cd {shlex.quote(jobdir + '/work')}")
        if len(spec.command) == 1:
            lines.append(spec.command[0])  # one string: the user's shell code, as written
        else:
            lines.append("exec " + shlex.join(spec.command))
    return "\n".join(lines) + "\n"


# torchrun's node arguments read from the node's environment (a node of a group): these
# stand-ins, which shlex leaves unquoted, become "$VAR" in the starter's part of the line only.
NODE_RANK_VAR, MASTER_VAR, PORT_VAR = ("@CLOUDTRAIN_NODE_RANK@", "@MASTER_ADDR@",
                                       "@MASTER_PORT@")


def _joined(starter: list[str], rest: list[str]) -> str:
    """The exec line's words: the starter's, with the node's variables expanded by bash, then
    the recipe's, all quoted."""
    head = shlex.join(starter)
    for var in (NODE_RANK_VAR, MASTER_VAR, PORT_VAR):
        head = head.replace(var, '"$' + var.strip("@") + '"')
    return head + (" " + shlex.join(rest) if rest else "")


def threads_line(procs: int) -> str:
    """run.sh's line that gives each of a recipe's `procs` processes on this host its share of
    the host's usable cores as torch's intra-op threads (OMP_NUM_THREADS, at least 1), unless
    the job's environment already says (a job file's `envs`, or the launching shell on this
    machine): theirs wins. Without it torch takes every core in each process, and torchrun
    sets 1 for every process of a multi-process run (its "Setting OMP_NUM_THREADS
    environment variable for each process to be 1 in default" warning), which leaves 11 of
    a p4d's 12 vCPUs per GPU to the loader alone. CLOUDTRAIN_CORES tells the recipe that
    cloudtrain chose, and from what (recipes/common/startup.pin_threads says it in the job's
    startup row)."""
    procs = max(1, int(procs))
    return ('if [ -z "${OMP_NUM_THREADS:-}" ]; then '
            "CLOUDTRAIN_CORES=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null "
            "|| echo 1); "
            f"OMP_NUM_THREADS=$(( CLOUDTRAIN_CORES / {procs} )); "
            '[ "$OMP_NUM_THREADS" -ge 1 ] || OMP_NUM_THREADS=1; '
            "export OMP_NUM_THREADS CLOUDTRAIN_CORES; fi")


def setup_lines(spec: JobSpec, jobdir: str, once: bool) -> list[str]:
    """run.sh's lines for the job file's `setup` (in SETUP_FILE beside run.sh): run in the
    job's working directory, its output in the job's log; a failure ends the job with the
    setup's exit code and says so (agent.setup_failure). `once`: a marker named by the
    script's sha256 beside the host's job directories skips it where it already ran
    unchanged (a kept instance reused with --on); each fresh instance runs it."""
    work = jobdir + "/work" if spec.kind != RECIPE or spec.workdir else jobdir
    q = shlex.quote
    marker = f"{jobdir.rsplit('/', 2)[0]}/setup-done/" + \
        hashlib.sha256((spec.setup or "").encode()).hexdigest()[:32]  # asked with a setup
    status = q(f"{jobdir}/{agent_control.SETUP_STATUS}")

    def said(state: str) -> str:
        """setup-status.json: where the setup is (`status` shows the job setting-up until it
        is done: watch.refresh), in whole seconds (`date +%N` is GNU's only)."""
        ended = "null" if state == "running" else '"$(date +%s)"'
        return (f"printf '{{\"state\": \"{state}\", \"started_at\": %s, \"ended_at\": %s}}"
                f"\\n' \"$_ct_t0\" {ended} > {status}")

    run = [f"cd {q(work)}", "_ct_t0=$(date +%s)", said("running"),
           "echo 'cloudtrain: setup started'",
           f"set +e; bash {q(jobdir + '/' + SETUP_FILE)}; _ct_rc=$?; set -e",
           "if [ $_ct_rc -ne 0 ]; then printf '{\"state\": \"failed\", \"exit_code\": %d}\\n' "
           f"$_ct_rc > {status}; "
           "echo \"cloudtrain: setup failed (exit code $_ct_rc)\"; exit $_ct_rc; fi",
           said("done"),
           "echo 'cloudtrain: setup done'"]
    if not once:
        return run
    return [f"if [ -e {q(marker)} ]; then echo 'cloudtrain: setup skipped: it ran unchanged "
            f"on this instance'; _ct_t0=$(date +%s); {said('done')}; else",
            *run, f"mkdir -p {q(marker.rsplit('/', 1)[0])} && touch {q(marker)}; fi"]


def setup_once(host: Host) -> bool:
    """Whether setup may be skipped where it already ran unchanged: on an instance (kept and
    reused), not on this machine, where each job's setup runs (nothing here is "kept")."""
    return not isinstance(host, LocalHost)


def write_job_scripts(host: Host, jobdir: str, spec: JobSpec, job_id: str) -> None:
    """Beside run.sh: the job file's setup script, and the secrets' private file (values
    from the spec in memory, else, for a relaunch, from secrets.py's copy)."""
    if spec.setup:
        host.write_text(f"{jobdir}/{SETUP_FILE}", spec.setup)
    if spec.secrets:
        values = spec.secret_values or secrets.load(job_id)
        missing = [k for k in spec.secrets if k not in values]
        if missing:
            raise UsageError(f"the value of secret {missing[0]} is gone (its job ended, or "
                             "its copy in $CLOUDTRAIN_HOME/secrets/ was removed)",
                             hint="launch the job again with the secret")
        host.write_text(f"{jobdir}/{secrets.HOST_FILE}", secrets.host_script(
            {k: values[k] for k in spec.secrets}), private=True)


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
        # OMP_NUM_THREADS: the launching shell's choice of torch's threads, which run.sh's
        # threads_line keeps (the tmux server's copy may be from an older shell).
        for key in ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "OMP_NUM_THREADS"):
            if key in os.environ:
                env[key] = os.environ[key]
    return env


def job_settings(settings: config.Settings, spec: JobSpec, provider, job_id: str, host: Host,
                 jobdir: str, data_dir: str, gpus: int, procs: int, grant: dict | None,
                 stream: dict | None, node_env: dict | None = None, attempt: int = 1) -> dict:
    """The host's job.json: what the agent enforces and the job's environment."""
    cloud = isinstance(provider, CloudHosts)  # else never power off the user's own machine
    shutdown_command, shutdown_delay = provider.shutdown(spec) if cloud else (None, 0.0)
    env = job_environment(job_id, data_dir, host, gpus, procs, jobdir, attempt)
    return {
        "job_id": job_id,
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
        "outputs": spec.output_paths(),
        "results_store": grant,
        **({"checkpoint_stream": stream} if stream else {}),
        **(provider.agent_settings(spec) if cloud else {}),
    }


def stage_plan(spec: JobSpec, settings: config.Settings, host: Host, jobdir: str,
               data_dir: str, found: list | None, mounts: dict) -> list[str] | None:
    """The stager's command for run.sh (its plan written to the host), or None: no data."""
    plan = datasets.host_plan(found or [], spec, settings, data_dir, mounts)
    if plan is None:
        return None
    host.write_text(f"{jobdir}/{datasets.PLAN_FILE}", json.dumps(plan))
    return [host.python, f"{agent_dir(jobdir)}/stager.py", f"{jobdir}/{datasets.PLAN_FILE}",
            f"{jobdir}/{datasets.STATUS_FILE}"]


def restore_argv(host: Host, jobdir: str) -> list[str]:
    """run.sh's first line on a relaunched job's host: fetch the checkpoint of its plan."""
    return [host.python, f"{agent_dir(jobdir)}/checkpoint_stream.py", "restore",
            f"{jobdir}/{RESTORE_PLAN}", jobdir]


def bundle_parts(host: Host, jobdir: str, job_id: str, copies: list, names: list[str],
                 into: Path) -> tuple[list[tuple[str, Path]], dict]:
    """The job's bundle (host/bootstrap.py's layout), as files in the folder `into`: the
    synced files as one tar (hosts.bundle, the listing a sync sends: modes kept, no link
    followed), the job's files `names` as launch wrote them on `host` (read back: the same
    bytes), the agent's files, and start.sh (the line Host.start_agent runs). Returns
    ([(name in the bundle, local file)], the manifest's fields besides the objects). The
    secrets' file is never part of it: a job's secret values stay off the job store."""
    into = Path(into)
    archive = into / bootstrap.ARCHIVE
    with open(archive, "wb") as f:
        bundle(copies, f)
    files, size = _archive_counts(archive)
    parts = [(bootstrap.ARCHIVE, archive)]
    for name in names:
        local = into / f"job-{name}"
        local.write_bytes(host.read(f"{jobdir}/{name}"))
        parts.append((bootstrap.JOB_DIR + name, local))
    for name, data in host_files():
        local = into / f"agent-{name.replace('/', '~')}"
        local.write_bytes(data)
        parts.append((bootstrap.AGENT_DIR + name, local))
    start = into / bootstrap.START
    start.write_text("#!/bin/sh\n" + host.start_command(job_id, jobdir) + "\n")
    parts.append((bootstrap.START, start))
    meta = {"job_id": job_id, "jobdir": jobdir, "agent_dir": Path(agent_dir(jobdir)).name,
            "archive": {"files": files, "bytes": size}}
    return parts, meta


def _archive_counts(archive: Path) -> tuple[int, int]:
    """(files, bytes) of the bundle's tar as written (what the instance checks it against).
    A link in it is refused here: the instance refuses every link in a bundle (it cannot
    tell a planted one from the user's), so the job could never start there."""
    import tarfile

    files = size = 0
    with tarfile.open(archive, mode="r:") as tar:
        for member in tar:
            if not member.isreg():
                raise UsageError(f"{member.name} is a {'link' if member.issym() or member.islnk() else 'special file'}: "
                                 "an instance that starts this recovering job by itself "
                                 "takes regular files only",
                                 hint="replace it by the file it names, leave it out "
                                      "(.gitignore), or launch with --no-recover")
            files += 1
            size += member.size
    return files, size
