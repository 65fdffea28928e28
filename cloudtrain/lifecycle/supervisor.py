"""Stage: recovery's process, the one that relaunches interrupted spot jobs whether or not
anyone is watching. This module is the process itself (is it running, start it, stop it, its
loop); what a round does (refresh a job, relaunch it) is recovery.round_, handed to run().
It calls nothing else of the lifecycle, so that any stage may start it (ensure) and every
`cloudtrain` command may check it cheaply (watchdog).

    state_of(home)           is it running (pid, since, last heartbeat), and what it watches
    needed(store)            whether any job needs it (an active job launched to recover)
    ensure(store, settings)  start it if it is needed and not running; a line to say, or None
    start(home)              start it: detached, in its own tmux session on this machine
    stop(home)               stop it (SIGTERM; it finishes the step it is in)
    run(home, handover, round_)  the loop itself (`cloudtrain supervisor run`, inside tmux,
                             through recovery.supervise)

One per CLOUDTRAIN_HOME: the running one holds an exclusive lock on `supervisor.lock` (the
kernel drops it when the process dies, however it dies), so "is it running" is "is the lock
held", with no stale pid files to believe. It keeps no state of its own: each round it reads
the store (the jobs, their attempts) and acts through recovery.round_ (watch.refresh notices an
interruption, recovery.relaunch starts the next attempt; the attempt's instance is tagged with
its number, so a supervisor killed half-way finds it again). Any `cloudtrain` command restarts
a dead supervisor while recovering jobs exist (cli.py calls watchdog).

It runs in tmux so that closing the terminal it was started from does not stop it, and so
that `tmux -L <socket> attach -t <session>` shows what it is doing. It leaves when no job
needs it any more.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from .. import config, state
from ..errors import CloudtrainError, MissingDependency

LOCK = "supervisor.lock"
INFO = "supervisor.json"  # pid, started_at, heartbeat_at, watching: for `status`
LOG = "supervisor.log"
# The environment the supervisor needs from the command that started it goes over in a file
# of this name (0600, a random suffix) that it reads and deletes before anything else; the
# command deletes it too once the supervisor holds its lock, or gives up. The tmux server it
# runs under may be older than that shell, and have none of it.
HANDOVER = ".supervisor-start-"
LEGACY_ENV = "supervisor.env"  # where earlier versions left it, secrets and all, for good
START_WAIT_S = 10.0
IDLE_EXIT_S = 30.0  # with nothing to watch for this long, it leaves
ENV_PREFIXES = ("AWS_", "CLOUDTRAIN_")
ENV_NAMES = ("PATH", "HOME", "USER", "LANG", "VIRTUAL_ENV", "PYTHONPATH", "SSL_CERT_FILE",
             "REQUESTS_CA_BUNDLE", "TMPDIR")
# Credentials in the environment (aws-vault, CI secrets, SSO exports), as opposed to those
# the AWS chain finds by itself (a profile, the SSO cache), which need nothing handed over.
ENV_CREDENTIALS = "AWS_SECRET_ACCESS_KEY"
FROM_ENVIRONMENT = "the environment of the command that started it"
FROM_CHAIN = "the AWS chain (profile, SSO cache)"


def session(home: Path) -> str:
    """Its tmux session: one per CLOUDTRAIN_HOME."""
    return "ct-supervisor-" + hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:8]


def _held(home: Path) -> bool:
    """Whether a live process holds the supervisor's lock."""
    path = Path(home) / LOCK
    if not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken just now
    return False


def state_of(home: Path) -> dict:
    info = {}
    try:
        info = json.loads((Path(home) / INFO).read_text())
    except (OSError, ValueError):
        pass
    info = info if isinstance(info, dict) else {}
    running = _held(home)
    return {"running": running, "pid": info.get("pid") if running else None,
            "started_at": info.get("started_at") if running else None,
            "heartbeat_at": info.get("heartbeat_at") if running else None,
            "watching": info.get("watching") if running else None,
            "credentials": info.get("credentials") if running else None,
            "session": session(home), "tmux_socket": info.get("tmux_socket")}


def watched(store: state.Store) -> list[state.Job]:
    """The jobs the supervisor looks after: active, launched to recover."""
    return [j for j in store.jobs(active_only=True)
            if j.backend != "local" and j.spec.recovery.recover]


def needed(store: state.Store) -> bool:
    return bool(watched(store))


def ensure(store: state.Store, settings: config.Settings | None = None) -> str | None:
    """Start the supervisor if a job needs it and none runs. Returns what to tell the user
    (None: nothing happened). Never raises: a command must not fail because of it; a
    supervisor that cannot start is said."""
    home = config.home()
    try:
        if not needed(store) or _held(home):
            return None
        pid = start(home)
        said = f"pid {pid}, " if pid is not None else ""
        return f"recovery supervisor started ({said}tmux session {session(home)})"
    except CloudtrainError as exc:
        return f"WARNING: the recovery supervisor could not start: {exc.message}"
    except OSError as exc:
        return f"WARNING: the recovery supervisor could not start: {exc}"


def watchdog() -> str | None:
    """What every `cloudtrain` command does first: restart a dead supervisor while jobs need
    it. Cheap (one query) and silent unless it acted; nothing here can fail the command."""
    try:
        home = config.home()
        if not (home / "state.db").exists():
            return None
        with state.open_store(home) as store:
            return ensure(store)
    except Exception:  # a broken store or config: the command itself says so
        return None


def start(home: Path | None = None) -> int | None:
    """Start `cloudtrain supervisor run` in a tmux session of its own and wait (bounded) until
    it holds the lock. Returns its pid, once it has said it (None if it has not within the
    wait: only a pid it wrote is a true one). What it needs of this process's environment (AWS
    settings, and credentials kept only there) is handed over in a private file that it
    deletes at once; nothing of it stays on disk."""
    import secrets

    from ..hosts import default_tmux_socket

    home = Path(home or config.home())
    socket = default_tmux_socket()
    env = {k: v for k, v in os.environ.items()
           if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    env["CLOUDTRAIN_HOME"] = str(home)
    (home / LEGACY_ENV).unlink(missing_ok=True)
    for stale in home.glob(HANDOVER + "*"):  # a start killed before it could delete its own
        stale.unlink(missing_ok=True)
    handover = home / f"{HANDOVER}{secrets.token_hex(8)}"
    config.write_private(handover, json.dumps(env).encode())
    try:
        return _start_in_tmux(home, socket, handover)
    finally:
        handover.unlink(missing_ok=True)


def _start_in_tmux(home: Path, socket: str, handover: Path) -> int | None:
    # The same cloudtrain as this command's (a source checkout's too): the tmux server's
    # environment may name another, or none.
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join([package_root] + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p and p != package_root])
    command = shlex.join(["env", f"PYTHONPATH={path}", sys.executable, "-m", "cloudtrain",
                          "supervisor", "run", "--home", str(home), "--handover",
                          str(handover)])
    log = shlex.quote(str(home / LOG))
    try:
        subprocess.run(["tmux", "-L", socket, "kill-session", "-t", session(home)],
                       capture_output=True, timeout=10)
        proc = subprocess.run(
            ["tmux", "-L", socket, "new-session", "-d", "-s", session(home), "-c", str(home),
             f"exec {command} >>{log} 2>&1"],
            capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise MissingDependency("tmux is not installed on this machine") from None
    except subprocess.TimeoutExpired:
        raise CloudtrainError("tmux did not answer in 10 s") from None
    if proc.returncode != 0 and not _held(home):
        raise CloudtrainError(f"tmux could not start it: {proc.stderr.strip()[:200]}")
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if _held(home):
            break
        time.sleep(0.05)
    else:
        raise CloudtrainError(f"it did not start within {START_WAIT_S:.0f} s (see {home / LOG})")
    # It writes its pid just after it takes the lock; a supervisor.json left by one killed
    # with SIGKILL names a process that is gone.
    while True:
        pid = state_of(home).get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool) and _alive(pid):
            return pid
        if time.monotonic() >= deadline or not _held(home):
            return None
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # another user's: alive
        return True
    except (ProcessLookupError, OverflowError, ValueError):
        return False
    return True


def _take(handover: Path | None) -> dict:
    """The environment start() handed over, read and deleted before anything else."""
    if handover is None or not handover.name.startswith(HANDOVER):
        return {}
    try:
        text = handover.read_text()
    except OSError:
        return {}
    finally:
        handover.unlink(missing_ok=True)
    try:
        env = json.loads(text)
    except ValueError:
        return {}
    return {k: str(v) for k, v in env.items() if isinstance(k, str)} \
        if isinstance(env, dict) else {}


def stop(home: Path | None = None, wait_s: float = 30.0) -> bool:
    """Ask the running supervisor to leave (it finishes its current step); True if one ran."""
    home = Path(home or config.home())
    info = state_of(home)
    pid = info.get("pid")
    if not info["running"] or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + wait_s
    while _held(home) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


# -- the loop -------------------------------------------------------------------------------


class Stop(Exception):
    """Leave now (the cloud refused the credentials): raised by a round."""


# One look at one job: (store, settings, job, next_try, credentials) -> None (recovery.round_).
Round = Callable[[state.Store, config.Settings, state.Job, dict, str], None]


def run(home: Path | None, handover: Path | None, round_: Round) -> int:
    """The supervisor itself, with the environment start() handed over, doing `round_` on
    each watched job. Exits 0 at once if another holds the lock. AWS credentials that were
    only in that environment live in this process's memory and nowhere else: when they
    expire, it says so (on the jobs it watches and in its log) and leaves; the next command
    run with valid ones restarts it."""
    env = _take(handover)
    home = Path(home or config.home())
    home.mkdir(parents=True, exist_ok=True)
    os.environ.update(env)
    credentials = FROM_ENVIRONMENT if env.get(ENV_CREDENTIALS) else FROM_CHAIN
    os.environ["CLOUDTRAIN_HOME"] = str(home)
    fd = os.open(home / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return 0
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: its stacks, in the log
    stopping = {"flag": False}

    def on_term(signum, frame):
        stopping["flag"] = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_term)
    started = time.time()
    _write_info(home, started, None, credentials)  # its pid, at once: start() waits for it
    say(f"supervisor {os.getpid()} watching {home}")
    try:
        # A config.yaml mistake made while it runs must not end the recovery: said in its
        # log (once), that setting at its default.
        with config.tolerating(say):
            _loop(home, started, stopping, credentials, round_)
    except Stop:
        pass
    finally:
        say(f"supervisor {os.getpid()} leaves")
        try:
            (home / INFO).unlink()
        except OSError:
            pass
        os.close(fd)
    return 0


def _loop(home: Path, started: float, stopping: dict, credentials: str, round_: Round) -> None:
    """Rounds over the watched jobs until stopped, or idle for IDLE_EXIT_S."""
    idle_since = None
    next_try: dict[str, float] = {}
    while not stopping["flag"]:
        if not (home / "state.db").exists():
            break  # the home went away (a test's, a user's rm -rf)
        settings = config.Settings.load()
        with state.open_store(home) as store:
            jobs_now = watched(store)
            _write_info(home, started, len(jobs_now), credentials)
            for job in jobs_now:
                if stopping["flag"]:
                    break
                round_(store, settings, job, next_try, credentials)
        if jobs_now:
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_EXIT_S:
            break
        _sleep(settings.supervisor_poll_seconds, stopping)


def _write_info(home: Path, started: float, watching: int | None, credentials: str) -> None:
    from ..hosts import default_tmux_socket

    config.write_private(home / INFO, json.dumps({
        "pid": os.getpid(), "started_at": started, "heartbeat_at": time.time(),
        "watching": watching, "tmux_socket": default_tmux_socket(),
        "credentials": credentials}).encode())


def _sleep(seconds: float, stopping: dict) -> None:
    deadline = time.monotonic() + seconds
    while not stopping["flag"] and time.monotonic() < deadline:
        time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))


def say(line: str) -> None:
    """A line of the supervisor's log (its stdout, in supervisor.log)."""
    print(time.strftime("%Y-%m-%d %H:%M:%S ") + line, flush=True)
