"""Stage: inspect, what the commands that read a job show: its timeline and detail
(`status JOB`), its log (`logs`, `logs --follow`), its metrics file (`plot`), and the command
lines `attach` and `ssh` run. Every one refreshes the job first and answers from its current
state. It may call stop (whether an ended job still holds its instance), watch, kept (a
kept instance, after its job), collect, group and attempts.

    timeline(store, job)                  the job's phases, from its events
    detail(store, settings, ref)          what `status JOB` shows
    read_log / tail_log / follow          the job's output (a node's with `node`)
    ending(store, job)                    what a followed job's end says
    for_logs(store, settings, ref)        the job whose output `logs` prints
    attach_argv / ssh_argv                tmux's and ssh's command lines to the job
    forward(store, settings, job, ports)  its instance's ports, listening here (port_forward)
    metrics_file(job) / recipe_target(job)  for `plot`
"""

from __future__ import annotations

import shlex
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, cast

from .. import config, state
from ..errors import CloudtrainError, HostError, UsageError
from ..hosts import Host
from ..local_host import LocalHost
from ..nodes import jobdir as node_jobdir
from ..nodes import records
from ..state import Job, Store
from . import attempts, group, kept
from .collect import files_home, read_record
from .stop import holds_instance
from .watch import refresh

if TYPE_CHECKING:
    from ..ssh_host import SSHHost

FOLLOW_POLL_S = 0.2
REFRESH_EVERY_S = 1.0


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


@dataclass
class Detail:
    job: Job
    phases: list[Phase]
    log_tail: bytes  # the last lines of output
    target: dict | None  # the recipe's target_reached row, if it was reached
    runs: dict | None = None  # the recipe's runs_summary row (`--set runs=N`), once written
    attempts: list | None = None  # a recovering job's attempts (attempts.summary)
    recovery: dict | None = None  # what its interruptions cost (attempts.recovery_cost)
    trend: str | None = None  # a sparkline of its accuracy by epoch (curves.accuracy_trend)
    startup: dict | None = None  # the recipe's {"event": "startup"} row: before the 1st step


def detail(store: Store, settings: config.Settings, ref: str, tail_lines: int = 10) -> Detail:
    job = refresh(store, settings, store.find_job(ref))
    probe, log_tail = {}, b""
    # A probe of a directory with no agent yet takes it for one whose agent never started
    # (and says so in its status.json): only a job that runs there, or ran, is probed. Not
    # one queued on a kept instance, nor one a launcher is still copying and setting up.
    if job.jobdir and not _queued_only(store, job):
        host = group.host_of(job)
        try:
            if not job.active or state.on_host(job):
                probe = read_record(job, settings.stale_after_seconds)
            log_tail, _ = host.tail(f"{job.jobdir}/output.log", tail_lines)
        except HostError as exc:  # the instance is gone and its files were not collected
            log_tail = f"(output not available: {exc.message})\n".encode()
    rows = attempts.summary(store, job)
    return Detail(job, timeline(store, job), log_tail, probe.get("target"), probe.get("runs"),
                  rows, attempts.recovery_cost(rows) if rows else None,
                  *_from_metrics(job))


def _from_metrics(job: Job) -> tuple[str | None, dict | None]:
    """`status JOB`'s accuracy sparkline (None without accuracy rows) and the job's last
    startup breakdown (None when it wrote none)."""
    from .. import curves

    rows, events = curves.read_rows(metrics_file(job))
    trend = curves.accuracy_trend(rows, metric=recipe_target(job)[1]) if rows else None
    startup = [e for e in events if e.get("event") == "startup"]
    return trend, (startup[-1] if startup else None)


def metrics_file(job: Job) -> Path:
    """The job's metrics.jsonl on this machine: its own (a job here, or one whose files came
    home), else a fresh copy of the instance's (at most curves.MAX_BYTES) in jobs/<id>/;
    where the instance cannot be read, the copy from before, if any."""
    from ..curves import MAX_BYTES

    local = config.home() / "jobs" / job.id / "metrics.jsonl"
    if not job.jobdir:
        return local
    host = group.host_of(job)
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
    """The recipe's target for the job's variant (its accuracy, a fraction as metrics.jsonl
    writes it, and its metric), or (None, None)."""
    if not job.recipe:
        return None, None
    from .. import recipes

    try:
        target = recipes.load(job.recipe).target_for(job.spec.args or {})
    except CloudtrainError:  # the recipe is gone or changed
        return None, None
    return target.get("value"), target.get("metric")


def _log_of(job: Job, node: int) -> tuple[Host | None, str | None]:
    """(host, output.log path) of the job's node `node` (0: the job's own log)."""
    _check_node(job, node)
    where = node_jobdir(job, node) if node else job.jobdir
    if not where:
        return None, None
    return group.node_host(job, node), f"{where}/output.log"


def read_log(job: Job, offset: int = 0, node: int = 0) -> bytes:
    host, path = _log_of(job, node)
    if host is None or path is None:
        return b""
    with _left_behind(job):
        return host.read(path, offset)


def tail_log(job: Job, lines: int, node: int = 0) -> tuple[bytes, int]:
    """The last `lines` lines of the job's output (of node `node`) and the offset where the
    file ended."""
    host, path = _log_of(job, node)
    if host is None or path is None:
        return b"", 0
    with _left_behind(job):
        return host.tail(path, lines)


@contextmanager
def _left_behind(job: Job) -> Iterator[None]:
    """An ended job's files still on its instance (for_logs found none in the job store),
    and the instance does not answer: what that means, not only the connection's error."""
    try:
        yield
    except HostError as exc:
        if job.active:
            raise
        raise CloudtrainError(
            f"job {job.id} has ended and its instance is gone; its files are not in the job "
            f"store (yet), and its instance does not answer: {exc.message}",
            hint=f"its agent stores them as the job ends: try again in a minute; "
                 f"cloudtrain status {job.id}") from exc


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
        # a queued job has no log yet
        if host is not None and path is not None and job.state != state.QUEUED:
            try:
                chunk = host.read(path, offset)
            except (HostError, OSError):
                # The connection dropped (often: the instance powered off as the job ended).
                # Forget it; the refresh below finds the job's end and where its files are now.
                group.forget(job.id)
                if node:
                    group.forget_nodes(job.id)
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


def ending(store: Store, job: Job) -> list[str]:
    """What a followed job's end says (`launch -f`, `logs -f`): the one line on its outcome,
    and the job's outputs note where a declared output was not found or not brought
    home (it was only in `status JOB`'s timeline)."""
    lines = [f"job {job.id} {job.state}" + (f": {job.reason}" if job.reason else "")]
    note = next((e.detail for e in reversed(store.events(job.id)) if e.phase == "outputs"),
                None)
    if note and ("; not found: " in note or "; not brought home: " in note):  # collect's notes
        lines.append(note)
    return lines


def for_logs(store: Store, settings: config.Settings, ref: str) -> Job:
    """The job whose output `logs` prints, refreshed (a job whose instance is gone is then
    read from where its files went). One that never started has no output: why."""
    job = refresh(store, settings, store.find_job(ref))
    if not job.active and not _ran(store, job):
        raise CloudtrainError(f"job {job.id} never started: {_why(job)}",
                              hint=f"cloudtrain status {job.id}")
    return files_home(store, job)


def _ran(store: Store, job: Job) -> bool:
    """Whether the job got as far as running (or staging data for, or setting up) its
    command: a phase of its host's, or its agent's start."""
    return bool(job.jobdir) and (job.started_at is not None or any(
        e.phase in (state.RUNNING, state.STAGING) for e in store.events(job.id)))


def _queued_only(store: Store, job: Job) -> bool:
    """Whether the job is queued on a kept instance, or was and never started there."""
    return job.state == state.QUEUED or (not _ran(store, job) and any(
        e.phase == state.QUEUED for e in store.events(job.id)))


def _why(job: Job) -> str:
    return job.reason or job.state


def _ended(job: Job) -> str:
    return f"job {job.id} has ended ({job.state}" + (f": {job.reason}" if job.reason else "") + ")"


def _on_its_host(store: Store, settings: config.Settings, job: Job, action: str) -> Job:
    """The job, refreshed, if it is where `attach`/`ssh` can reach it; else the reason why
    not: it never started, it has ended (but for its kept instance; one handed
    over: the job that has it now), or it has no host yet."""
    job = refresh(store, settings, job)
    if not job.active and not _ran(store, job):
        if job.backend != "local":
            raise UsageError(f"job {job.id} has no instance ({_why(job)})",
                             hint=f"cloudtrain status {job.id}")
        raise UsageError(f"job {job.id} never started: {_why(job)}",
                         hint=f"cloudtrain status {job.id}")
    if not job.active and not holds_instance(store, job):
        later = kept.instance_of(store, job)
        if later is not None and later.job_id != job.id:  # handed over to a later job
            raise UsageError(_ended(job) + f"; its instance {later.id} went on to job "
                                           f"{later.job_id}",
                             hint=f"cloudtrain {action} {later.job_id}")
        raise UsageError(_ended(job), hint=f"cloudtrain logs {job.id}")
    if job.active and not state.on_host(job):
        raise UsageError(f"job {job.id} is {job.state}: nothing to {action} to yet",
                         hint=f"cloudtrain logs {job.id} --follow (it waits for the start)")
    return job


def _check_node(job: Job, node: int) -> None:
    """`--node N` names one of the job's nodes."""
    if node and node >= len(records(job)):
        raise UsageError(f"--node {node}: job {job.id} runs on "
                         f"{len(records(job)) or 1} node(s), numbered from 0")


def _node_host(job: Job, node: int) -> Host:
    _check_node(job, node)
    return group.node_host(job, node)


@dataclass
class Reach:
    """How `ssh` and `attach` reach a job's instance: the command line, and for an ended job's kept
    instance what it bills and when it powers itself off (kept.facts_of)."""
    argv: list[str]
    kept: dict | None = None


def attach_argv(store: Store, settings: config.Settings, job: Job,
                terminal: bool = True, node: int = 0) -> Reach:
    """tmux's command line that attaches to the job's session (on node `node`). `terminal`:
    whether this process has one (tmux needs it: "open terminal failed: not a terminal"). After the
    job, on its kept instance: a tmux session of its own there
    (`ct-<job>-kept`, made on the first attach), which outlives a dropped connection."""
    job = _on_its_host(store, settings, job, "attach")
    if not terminal:
        raise UsageError(f"attach needs a terminal; use cloudtrain logs {job.id} -f")
    facts = kept.facts_of(store, settings, job)
    if facts is not None:
        if node:
            raise UsageError(f"--node {node}: job {job.id} has ended; its kept instance is "
                             "one machine", hint=f"cloudtrain attach {job.id}")
        on = cast("SSHHost", kept.instance_host(job))  # an instance's, over SSH
        return Reach(on.ssh_argv(on.tmux("new-session", "-A", "-s", f"ct-{job.id}-kept")),
                     facts)
    host = _node_host(job, node)
    if not host.session_alive(job.id):
        raise UsageError(f"job {job.id} has no tmux session any more",
                         hint=f"cloudtrain status {job.id}")
    return Reach(host.attach_argv(job.id))


def ssh_argv(store: Store, settings: config.Settings, job: Job, node: int = 0,
             command: tuple[str, ...] = (), tty: bool = True) -> Reach:
    """The ssh line to a job's instance: a shell, or `command` run there (one word: shell
    code as written; several: each word quoted, as `launch -- CMD` treats them). A kept
    instance is reached after its job ended, until it is terminated."""
    job = _on_its_host(store, settings, job, "ssh")
    facts = kept.facts_of(store, settings, job)
    if facts is not None:  # its files came home, its instance runs on: reached as launched
        if node:
            raise UsageError(f"--node {node}: job {job.id} has ended; its kept instance is "
                             "one machine", hint=f"cloudtrain ssh {job.id}")
        host = kept.instance_host(job)
    else:
        host = _node_host(job, node)
    if job.backend == "local" and isinstance(host, LocalHost):
        raise UsageError(f"job {job.id} runs on this machine: use cloudtrain attach {job.id}",
                         hint=f"cloudtrain logs {job.id}")
    if isinstance(host, LocalHost):  # its files were brought home: the instance is gone
        raise UsageError(_ended(job) + " and its instance is gone",
                         hint=f"cloudtrain logs {job.id}")
    ssh = cast("SSHHost", host)  # not this machine: an instance's, over SSH
    if not command:
        return Reach(ssh.ssh_argv(), facts)
    return Reach(ssh.ssh_argv(command[0] if len(command) == 1 else shlex.join(command),
                              tty=tty), facts)


def forward(store: Store, settings: config.Settings, job: Job, ports: list) -> tuple:
    """Ports of the job's instance (a running job's, or a kept one after its job), listening
    on this machine's loopback over the job's SSH connection (port_forward.Forwarder, bound
    already): (the forwarder, the host's name, kept.facts_of for a kept instance)."""
    from ..port_forward import Forwarder

    job = _on_its_host(store, settings, job, "forward")
    facts = kept.facts_of(store, settings, job)
    host = kept.instance_host(job) if facts is not None else _node_host(job, 0)
    if isinstance(host, LocalHost):
        if job.backend == "local":
            raise UsageError(f"job {job.id} runs on this machine: its ports are here already "
                             f"(http://localhost:{ports[0].remote})")
        raise UsageError(_ended(job) + " and its instance is gone",
                         hint=f"cloudtrain logs {job.id}")
    ssh = cast("SSHHost", host)  # not this machine: an instance's, over SSH
    return Forwarder(ssh.conn, ports), ssh.name, facts
