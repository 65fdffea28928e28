"""Host: the one thing the lifecycle talks to for running a job somewhere.

    run(cmd) -> Result            a shell command; check=True raises CommandFailed
    put(local, remote)            one file
    get(remote, local)            one file
    sync(local_dir, remote_dir)   a directory, honouring .gitignore
    read(path, offset, end)       bytes [offset, end) of a (growing) file

and, built on those, what every host does the same way: install the agent and start it in
tmux, probe and stop a job through the agent, bring a tree of files home. `LocalHost` is this
machine through subprocess; an SSH host implements the same verbs over one connection.

Whatever comes back from a host (names, sizes, JSON, exit codes) is untrusted: code on the
instance can write into the job's directory, and the instance has a public address.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
import unicodedata
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import config
from . import hostdata
from .host import agent as agent_module
from .host import safefile
from .errors import HostError, MissingDependency, NotRegularFile
from .gitignore import list_files
from .progress import Reporter, megabytes

AGENT_SOURCE = Path(agent_module.__file__)
TMUX_INSTALL_HINT = ("install tmux: `apt-get install tmux` (Debian/Ubuntu), `dnf install tmux` "
                     "(Fedora/Amazon Linux) or `brew install tmux` (macOS)")


@dataclass
class Result:
    command: str
    exit_code: int
    stdout: str
    stderr: str
    stdout_bytes: bytes | None = None  # as the host sent it, where it came as bytes (SSH)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class CommandFailed(HostError):
    def __init__(self, host: "Host", result: Result):
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        message = f"on {host.name}: `{result.command}` exited with {result.exit_code}"
        super().__init__(message + (f"\n{tail}" if tail else ""))
        self.result = result


TAIL_WINDOW = 1 << 20  # `logs --tail` looks at most this far back
# Deadlines for remote calls (audit F26: one hung host hung `status`, `down` and `down --all`).
RUN_TIMEOUT_S = 300.0  # any command that does not say otherwise
PROBE_TIMEOUT_S = 20.0  # `agent.py probe` reads two small files
STOP_EXTRA_S = 30.0  # `agent.py stop` waits the grace period, then this long at most
STREAM_IDLE_S = 120.0  # a tar stream that moves no byte for this long is dead
AGENT_START_TIMEOUT_S = 15.0  # from tmux new-session to the agent's first status.json
AGENT_START_POLL_S = 0.02  # one SFTP read of status.json a time: no process started
# pull_tree bounds on what a host may make us walk.
PULL_MAX_ENTRIES = 100_000
PULL_MAX_DEPTH = 64
PULL_MAX_SKIPPED = 200  # reasons kept; the count goes on
PULL_CHUNK = 1 << 20
TMUX_START_TRIES = 5
TMUX_TRANSIENT = ("server exited unexpectedly", "lost server", "Connection refused",
                  "error connecting to")


def last_lines(data: bytes, lines: int) -> bytes:
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def default_tmux_socket() -> str:
    """The tmux server (`tmux -L`) jobs run under; tests set their own so as to keep out of
    a user's way (and, on namespace hosts, out of each other's)."""
    return os.environ.get("CLOUDTRAIN_TMUX_SOCKET", "cloudtrain")


def session_name(job_id: str) -> str:
    return f"ct-{job_id}"


def agent_files() -> list[Path]:
    """The files the agent runs from: every module of cloudtrain/host/ (agent.py first), put
    side by side in the host's agent directory, where they import each other by name."""
    beside = sorted(p for p in AGENT_SOURCE.parent.glob("*.py")
                    if p.name not in (AGENT_SOURCE.name, "__init__.py"))
    return [AGENT_SOURCE] + beside


def agent_version() -> str:
    """12 hex digits of sha256 over the agent's files: a new agent gets a new directory, so a
    host running jobs of several versions keeps each one's agent intact."""
    digest = hashlib.sha256()
    for path in agent_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def agent_dir(jobdir: str) -> str:
    """`<root>/agent-<version>` for jobdir `<root>/jobs/<id>`: outside every job directory,
    so a job cannot replace the code that probes and stops it (audit F19)."""
    return f"{Path(jobdir).parent.parent}/agent-{agent_version()}"


def bad_name(name) -> str | None:
    """Why a file name from a host cannot become a local path component, or None."""
    if not isinstance(name, str):
        return "not a text name"
    if name in ("", ".", ".."):
        return f"the name {name!r}"
    if "/" in name or "\0" in name:
        return "a '/' or NUL in the name"
    if any(unicodedata.category(c) == "Cc" for c in name):
        return "control characters in the name"
    if len(name.encode("utf-8", "surrogateescape")) > 255:
        return "a name longer than 255 bytes"
    return None


@dataclass
class PullResult:
    """What pull_tree brought home."""

    files: int = 0  # regular files copied completely
    bytes: int = 0  # bytes actually read and written
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path as shown, reason)
    skipped_count: int = 0  # all skipped entries (the list keeps the first PULL_MAX_SKIPPED)
    over_limit: bool = False  # stopped at limit_bytes; the file being copied was removed

    def skip(self, path: str, reason: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < PULL_MAX_SKIPPED:
            self.skipped.append((ascii(path)[1:-1], reason))


def _sizes(local_dir: Path, files: list[str]) -> dict[str, int]:
    out = {}
    for rel in files:
        try:
            out[rel] = (Path(local_dir) / rel).lstat().st_size
        except OSError:  # gone since it was listed: the copy will say so
            out[rel] = 0
    return out


def measure(local_dir: Path, include: tuple[str, ...] = (),
            files: list[str] | None = None) -> tuple[int, int]:
    """How many files, and bytes, a sync of local_dir sends at most (before `like` spares
    the unchanged ones); `files`: the list when it is known already."""
    sizes = _sizes(Path(local_dir), list_files(local_dir, include) if files is None else files)
    return len(sizes), sum(sizes.values())


def sync_many(host: "Host", copies: list[tuple[Path, str, str | None, tuple[str, ...]]],
              report: Reporter) -> int:
    """Sync each (local dir, remote dir, like, include) to the host, said as one phase with
    one bar over all of them; the number of files actually sent."""
    sizes = [measure(local, include) for local, _, _, include in copies]
    files = sum(n for n, _ in sizes)
    report.phase(f"syncing {files} file{'' if files == 1 else 's'}, "
                 f"{megabytes(sum(b for _, b in sizes))}")
    report.transfer(sum(b for _, b in sizes))
    sent = base = 0
    for (local, remote, like, include), (_, size) in zip(copies, sizes):
        sent += host.sync(local, remote, like, include=include,
                          sent=lambda done, base=base: report.sent(base + done))
        base += size
        report.sent(base)
    return sent


def bundle(copies: list[tuple[Path, str, tuple[str, ...]]], into) -> tuple[int, int]:
    """One tar stream of several directories, written once to the file object `into`, for
    sending to many hosts (a job on several nodes): each (local dir, folder inside the
    destination, include) as a sync would send it (the files git would keep, credentials
    left out unless included). Returns (files, bytes of the files)."""
    import tarfile

    count = size = 0
    with tarfile.open(fileobj=into, mode="w|") as tar:
        for local, folder, include in copies:
            for rel in list_files(local, include):
                tar.add(Path(local) / rel, arcname=f"{folder}/{rel}" if folder else rel,
                        recursive=False)
                count += 1
                size += (Path(local) / rel).lstat().st_size
    return count, size


class Host(ABC):
    """The verbs every host has; subclasses implement run/put/get/sync/read."""

    name = "host"
    python = "python3"  # the interpreter that runs the agent on this host
    # The address the other nodes of a job on several machines reach this host at (set by
    # the provider: an instance's private IP); None: the one it is reached at from here.
    peer_address: str | None = None

    def __init__(self, tmux_socket: str = "cloudtrain"):
        self.tmux_socket = tmux_socket

    # -- the primitive verbs ------------------------------------------------------------------

    @abstractmethod
    def run(self, command: str, check: bool = True, timeout: float | None = None) -> Result:
        ...

    @abstractmethod
    def put(self, local: Path, remote: str) -> None:
        ...

    @abstractmethod
    def get(self, remote: str, local: Path) -> None:
        ...

    @abstractmethod
    def sync(self, local_dir: Path, remote_dir: str, like: str | None = None,
             include: tuple[str, ...] = (), sent: Callable[[int], None] | None = None) -> int:
        """Copy local_dir's files (as git would keep them, less credentials unless `include`
        names them: see gitignore.list_files) to remote_dir; files unchanged since `like` (an
        earlier copy on the host) are not sent again. `sent` is told the bytes done so far
        (of measure()'s total) as the copy goes."""

    @abstractmethod
    def read(self, path: str, offset: int = 0, end: int | None = None) -> bytes:
        ...

    @abstractmethod
    def write_text(self, remote: str, text: str, private: bool = False) -> None:
        """Write a file on the host; `private`: readable by its owner only (0600) before
        any of `text` is in it (a job's secrets)."""

    # -- built on them ----------------------------------------------------------------------------

    def tmux(self, *args: str) -> str:
        return shlex.join(["tmux", "-L", self.tmux_socket, *args])

    def tail(self, path: str, lines: int) -> tuple[bytes, int]:
        """The last `lines` lines of a file, and the file's size at that moment."""
        size = int(self.run(f"stat -c %s {shlex.quote(path)} 2>/dev/null || echo 0").stdout or 0)
        return last_lines(self.read(path, max(0, size - TAIL_WINDOW), size), lines), size

    def gpu_count(self) -> int:
        """NVIDIA GPUs this host sees (`nvidia-smi -L`: one `GPU n: ...` line each); 0 when
        there is no driver or no GPU."""
        out = self.run("nvidia-smi -L 2>/dev/null", check=False).stdout
        return sum(1 for line in out.splitlines() if line.startswith("GPU "))

    def missing_modules(self, modules: list[str]) -> list[str]:
        """Which of `modules` the host's Python cannot import (found without importing)."""
        check = ("import importlib.util as u, sys; "
                 "print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))")
        result = self.run(shlex.join([self.python, "-c", check, *modules]))
        return result.stdout.split()

    # -- the agent ---------------------------------------------------------------------------------

    def agent_path(self, jobdir: str) -> str:
        return f"{agent_dir(jobdir)}/agent.py"

    def install_agent(self, jobdir: str, make: tuple[str, ...] = ()) -> None:
        """Put the agent where `start_agent`, `probe_job` and `stop_job` run it from:
        `agent_dir(jobdir)`, skipped when that directory already holds the same files. The
        directories in `make` (the job's) are created in the same round trip."""
        directory = agent_dir(jobdir)
        files = agent_files()
        want = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
        if self._make_and_hash(directory, list(want), make) == want:
            return
        for path in files:
            # Under a temporary name, then renamed: a probe running the agent at this moment
            # sees the old file or the new one, never half of one.
            tmp = f"{directory}/.{path.name}.{uuid.uuid4().hex[:8]}.tmp"
            self.put(path, tmp)
            self._rename(tmp, f"{directory}/{path.name}")

    @abstractmethod
    def _make_and_hash(self, directory: str, names: list[str], make: tuple[str, ...] = ()
                       ) -> dict[str, str]:
        """Create `make` and `directory` (with their parents), then the sha256 hex of each of
        these files in `directory` that exists: one round trip."""

    @abstractmethod
    def _rename(self, src: str, dst: str) -> None:
        """Replace dst by src atomically."""

    def start_agent(self, job_id: str, jobdir: str) -> None:
        """Start `agent.py run <jobdir>` as the command of a new detached tmux session, and
        wait until the agent proves it runs: a status.json with its pid (audit F20: a tmux
        session whose python did not exist counted as a started job, shown running for ever).
        The agent's own early stderr (python missing, a syntax error on an old python) goes
        to <jobdir>/agent.err, whose tail the error shows.

        The tmux server exits when its last session ends; a new-session that reaches it while
        it is exiting fails with "server exited unexpectedly" (seen with many jobs launched
        at once). That, and only that kind of failure, is tried again."""
        # `exec`: the pane's process is the agent itself, so tmux's pane_pid is its pid.
        agent_cmd = "exec {} 2>>{}".format(
            shlex.join([self.python, self.agent_path(jobdir), "run", jobdir]),
            shlex.quote(f"{jobdir}/agent.err"))
        command = self.tmux("new-session", "-d", "-P", "-F", "#{pane_pid}", "-s",
                            session_name(job_id), "-x", "200", "-y", "50", agent_cmd)
        for attempt in range(TMUX_START_TRIES):
            result = self.run(command, check=False)
            if result.ok:
                break
            transient = any(m in result.stderr for m in TMUX_TRANSIENT)
            if not transient or attempt == TMUX_START_TRIES - 1:
                raise CommandFailed(self, result)
            if self.session_alive(job_id):
                break
            time.sleep(0.05 * (attempt + 1))
        pid = result.stdout.strip()
        self._wait_for_agent(job_id, jobdir, int(pid) if pid.isdigit() else None)

    def _wait_for_agent(self, job_id: str, jobdir: str, pid: int | None) -> None:
        """Until status.json names the pane's pid as its agent; a session that is gone
        before that (the usual failure: no such python) ends the wait at once."""
        deadline = time.monotonic() + AGENT_START_TIMEOUT_S
        gone = False
        while True:
            if self._agent_wrote_status(jobdir, pid):
                return
            if gone or time.monotonic() > deadline:
                break
            gone = self._agent_gone(job_id, pid)  # then one last look at status.json
            if not gone:
                time.sleep(AGENT_START_POLL_S)
        self.run(self.tmux("kill-session", "-t", session_name(job_id)), check=False)
        printed = self.read(f"{jobdir}/agent.err").decode("utf-8", "replace").strip()
        tail = hostdata.clean_text(" / ".join(printed.splitlines()[-3:]), 300)
        why = "its session ended" if gone else f"no status.json in {AGENT_START_TIMEOUT_S:.0f} s"
        raise HostError(f"on {self.name}: the agent did not start ({why})"
                        + (f": {tail}" if tail else "; it printed nothing"),
                        hint=f"check that `{self.python}` runs Python 3.8 or newer there")

    def session_alive(self, job_id: str) -> bool:
        return self.run(self.tmux("has-session", "-t", session_name(job_id)), check=False).ok

    def _agent_gone(self, job_id: str, pid: int | None) -> bool:
        """Whether the agent's tmux session ended (pid: the pane's process, the agent)."""
        return not self.session_alive(job_id)

    def attach_argv(self, job_id: str) -> list[str]:
        return ["tmux", "-L", self.tmux_socket, "attach-session", "-t", session_name(job_id)]

    def _agent_wrote_status(self, jobdir: str, pid: int | None) -> bool:
        try:
            status = hostdata.clean_status(hostdata.parse(self.read(f"{jobdir}/status.json"),
                                                          self.name))
        except HostError:  # not there yet
            return False
        return bool(status and status["agent_pid"] and pid in (None, status["agent_pid"]))

    def probe_job(self, jobdir: str, stale_after_s: float) -> dict:
        """The agent's report, checked against the schema in hostdata (never raw)."""
        out = self._agent_call(jobdir, ["probe", jobdir, "--stale", str(stale_after_s),
                                        "--session", session_name(Path(jobdir).name),
                                        "--socket", self.tmux_socket], PROBE_TIMEOUT_S)
        return hostdata.probe_report(out, self.name)

    def stop_job(self, jobdir: str, grace_s: float, wait: bool = True) -> dict | None:
        """Stop the job through its agent; without `wait`, only ask it to."""
        out = self._agent_call(jobdir, ["stop", jobdir, "--grace", str(grace_s)]
                               + ([] if wait else ["--nowait", "1"]),
                               grace_s + STOP_EXTRA_S if wait else PROBE_TIMEOUT_S)
        return hostdata.stop_answer(out, self.name)

    def _agent_call(self, jobdir: str, args: list[str], timeout: float) -> bytes | str:
        """Run the installed agent; a host that has not got this version of it (the CLI was
        upgraded while the job ran) gets it installed, once."""
        command = shlex.join([self.python, self.agent_path(jobdir), *args])
        result = self.run(command, check=False, timeout=timeout)
        if result.exit_code == 2 and "can't open file" in result.stderr:
            self.install_agent(jobdir)
            result = self.run(command, check=False, timeout=timeout)
        if not result.ok:
            raise CommandFailed(self, result)
        return result.stdout if result.stdout_bytes is None else result.stdout_bytes

    # -- bringing files home -------------------------------------------------------------------------

    @abstractmethod
    def _listdir(self, path: str) -> list[tuple[str, int]]:
        """(name, st_mode) of each entry of a directory, symlinks not followed (lstat)."""

    @abstractmethod
    def _open_regular(self, path: str):
        """A binary reader for a regular file, or None when what is there now is not one."""

    def pull_tree(self, remote: str, local: Path, limit_bytes: float) -> PullResult:
        """Copy the regular files below `remote` into `local`, at most limit_bytes in all.

        Audit F2: names and sizes from the host once let code on an instance write any file
        of the user's (`../`, absolute names, a newline that forged a listing line). So the
        walk is over SFTP-style listings (lstat: symlinks, devices and FIFOs are skipped and
        counted), every name component is checked, the local path must resolve inside
        `local`, and the limit counts the bytes actually read: past it the copy stops, the
        partial file is removed, and the result says so."""
        result = PullResult()
        limit = float(limit_bytes)
        limit = 0.0 if limit != limit else max(limit, 0.0)  # NaN: nothing
        local = Path(local)
        local.mkdir(parents=True, exist_ok=True)
        base = local.resolve()
        todo, entries = [("", 0)], 0
        while todo:
            rel_dir, depth = todo.pop()
            here = f"{remote}/{rel_dir}" if rel_dir else remote
            try:
                listing = sorted(self._listdir(here))
            except FileNotFoundError:
                if rel_dir:
                    result.skip(rel_dir, "vanished")
                continue
            except (UnicodeDecodeError, PermissionError) as exc:
                result.skip(rel_dir or ".", f"unreadable directory ({type(exc).__name__})")
                continue
            for name, mode in listing:
                entries += 1
                rel = f"{rel_dir}/{name}" if rel_dir else str(name)
                if entries > PULL_MAX_ENTRIES:
                    result.skip(rel, f"more than {PULL_MAX_ENTRIES} entries")
                    return result
                why = bad_name(name)
                if why:
                    result.skip(rel, why)
                elif stat.S_ISDIR(mode):
                    if depth >= PULL_MAX_DEPTH:
                        result.skip(rel, f"deeper than {PULL_MAX_DEPTH} directories")
                    else:
                        todo.append((rel, depth + 1))
                elif not stat.S_ISREG(mode):
                    result.skip(rel, "symlink" if stat.S_ISLNK(mode) else "not a regular file")
                elif not (target := base.joinpath(*rel.split("/"))).resolve().is_relative_to(base):
                    result.skip(rel, "resolves outside the destination")
                elif not self._pull_file(f"{remote}/{rel}", rel, target, limit, result):
                    return result
        return result

    def pull_paths(self, remote_base: str, paths: list[str], local: Path,
                   limit_bytes: float) -> PullResult:
        """A job's named outputs (`--output`): each path below remote_base, a file or a
        directory, into local/<path>, at most limit_bytes in all, with pull_tree's guards
        (every name checked, nothing followed, nothing written outside `local`). A path
        that is not there is reported as skipped, so the user hears of it."""
        total = PullResult()
        limit = float(limit_bytes)
        limit = 0.0 if limit != limit else max(limit, 0.0)
        local = Path(local)
        local.mkdir(parents=True, exist_ok=True)
        base = local.resolve()
        for rel in paths:
            if total.over_limit:
                total.skip(rel, "the limit was reached before it")
                continue
            parts = rel.split("/")
            why = next((bad_name(p) for p in parts if bad_name(p)), None)
            if why:
                total.skip(rel, why)
                continue
            parent = "/".join(parts[:-1])
            try:
                listing = dict(self._listdir(f"{remote_base}/{parent}" if parent else remote_base))
            except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError, PermissionError):
                listing = {}
            mode = listing.get(parts[-1])
            target = base.joinpath(*parts)
            if mode is None:
                total.skip(rel, "not found")
            elif not target.resolve().is_relative_to(base):
                total.skip(rel, "resolves outside the destination")
            elif stat.S_ISDIR(mode):
                got = self.pull_tree(f"{remote_base}/{rel}", target, limit - total.bytes)
                total.files += got.files
                total.bytes += got.bytes
                total.over_limit = got.over_limit
                total.skipped_count += got.skipped_count
                total.skipped.extend(got.skipped[:PULL_MAX_SKIPPED - len(total.skipped)])
            elif stat.S_ISREG(mode):
                self._pull_file(f"{remote_base}/{rel}", rel, target, limit, total)
            else:
                total.skip(rel, "symlink" if stat.S_ISLNK(mode) else "not a regular file")
        return total

    def _pull_file(self, remote: str, rel: str, target: Path, limit: float,
                   result: PullResult) -> bool:
        """Copy one file, counting what is read; False once the limit is passed."""
        try:
            reader = self._open_regular(remote)
        except FileNotFoundError:
            result.skip(rel, "vanished")
            return True
        if reader is None:
            result.skip(rel, "not a regular file when opened")
            return True
        written = 0
        # Into a side file, renamed into place when whole: a pull cut short (the instance
        # powering off, another process pulling the same job) never truncates a good copy.
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            with reader:
                target.parent.mkdir(parents=True, exist_ok=True)
                # O_NOFOLLOW: never write through a symlink that appeared at the target.
                fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                             0o600)
                with os.fdopen(fd, "wb") as out:
                    while chunk := reader.read(PULL_CHUNK):
                        if result.bytes + written + len(chunk) > limit:
                            result.over_limit = True
                            break
                        out.write(chunk)
                        written += len(chunk)
            if result.over_limit:
                result.skip(rel, f"over the limit of {limit:.0f} bytes: stopped")
                return False
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        result.files += 1
        result.bytes += written
        return True

    def describe(self) -> dict:
        """What the state store keeps to reach this host again."""
        return {"kind": type(self).__name__, "tmux_socket": self.tmux_socket}


class LocalHost(Host):
    """This machine. Commands run through bash; files are copied directly."""

    name = "this machine"

    def __init__(self, tmux_socket: str = "cloudtrain", python: str | None = None):
        super().__init__(tmux_socket)
        self.python = python or sys.executable

    def run(self, command: str, check: bool = True, timeout: float | None = None) -> Result:
        try:
            proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise HostError(f"on {self.name}: `{command}` did not finish in {timeout:.0f} s") from exc
        result = Result(command, proc.returncode, proc.stdout, proc.stderr)
        if check and not result.ok:
            raise CommandFailed(self, result)
        return result

    def require_tmux(self) -> None:
        if shutil.which("tmux") is None:
            raise MissingDependency("tmux is not installed on this machine", hint=TMUX_INSTALL_HINT)

    def put(self, local: Path, remote: str) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(local, remote)

    def get(self, remote: str, local: Path) -> None:
        if Path(remote).resolve() != Path(local).resolve():
            Path(local).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(remote, local)

    def write_text(self, remote: str, text: str, private: bool = False) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        if private:
            config.write_private(Path(remote), text)
        else:
            Path(remote).write_text(text)

    def unpack(self, tar_path: Path, remote_dir: str,
               sent: Callable[[int], None] | None = None) -> None:
        """Extract a bundle() into remote_dir (with tar, as on a remote host)."""
        Path(remote_dir).mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["tar", "-x", "-C", remote_dir, "-f", str(tar_path)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise HostError(f"tar into {remote_dir} failed ({proc.returncode}): "
                            f"{proc.stderr.strip()[-300:]}")
        if sent is not None:
            sent(Path(tar_path).stat().st_size)

    def sync(self, local_dir: Path, remote_dir: str, like: str | None = None,
             include: tuple[str, ...] = (), sent: Callable[[int], None] | None = None) -> int:
        """Copy the files git would keep; unchanged files (size and mtime) are skipped."""
        copied = done = 0
        for rel in list_files(local_dir, include):
            src, dst = Path(local_dir) / rel, Path(remote_dir) / rel
            if sent is not None:
                done += src.lstat().st_size
                sent(done)
            if src.is_symlink():
                dst.parent.mkdir(parents=True, exist_ok=True)
                if dst.is_symlink() or dst.exists():
                    dst.unlink()
                os.symlink(os.readlink(src), dst)
                continue
            st = src.stat()
            if dst.exists():
                dt = dst.stat()
                if dt.st_size == st.st_size and int(dt.st_mtime) == int(st.st_mtime):
                    continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            copied += 1
        return copied

    def read(self, path: str, offset: int = 0, end: int | None = None) -> bytes:
        # A job's files: a FIFO or a link to /dev/zero in their place is refused at once (F34).
        try:
            return safefile.read_regular(path, offset, end)
        except FileNotFoundError:
            return b""
        except safefile.NotRegular as exc:
            raise NotRegularFile(f"cannot read {path}: {exc.strerror}") from None
        except OSError as exc:  # no permission, ...
            raise HostError(f"cannot read {path}: {exc.strerror or exc}") from None

    def tail(self, path: str, lines: int) -> tuple[bytes, int]:
        try:
            data, size = safefile.read_tail(path, TAIL_WINDOW)
        except FileNotFoundError:
            return b"", 0
        except safefile.NotRegular as exc:
            raise NotRegularFile(f"cannot read {path}: {exc.strerror}") from None
        except OSError as exc:
            raise HostError(f"cannot read {path}: {exc.strerror or exc}") from None
        return last_lines(data, lines), size

    def probe_job(self, jobdir: str, stale_after_s: float) -> dict:
        # Same code the agent runs on remote hosts, without a process per job; what it read
        # from the job directory is checked the same way.
        return hostdata.clean_report(agent_module.probe(
            jobdir, stale_after_s, session_name(Path(jobdir).name), self.tmux_socket))

    def stop_job(self, jobdir: str, grace_s: float, wait: bool = True) -> dict | None:
        return hostdata.clean_status(agent_module.stop(jobdir, grace_s, signal_only=not wait))

    def _make_and_hash(self, directory: str, names: list[str], make: tuple[str, ...] = ()
                       ) -> dict[str, str]:
        for path in (*make, directory):
            os.makedirs(path, exist_ok=True)
        found = {}
        for name in names:
            try:
                found[name] = hashlib.sha256(Path(directory, name).read_bytes()).hexdigest()
            except OSError:
                pass
        return found

    def _rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def _listdir(self, path: str) -> list[tuple[str, int]]:
        with os.scandir(path) as entries:
            return [(e.name, e.stat(follow_symlinks=False).st_mode) for e in entries]

    def _open_regular(self, path: str):
        # A symlink or FIFO swapped in after the listing is neither followed nor waited on.
        try:
            return os.fdopen(safefile.open_regular(path), "rb")
        except FileNotFoundError:
            raise
        except OSError:
            return None

    def describe(self) -> dict:
        return {**super().describe(), "python": self.python}


class _SFTPReader:
    """An open remote file whose reads are guarded like every other SFTP call."""

    def __init__(self, conn, path: str, f):
        self.conn, self.path, self.f = conn, path, f

    def read(self, n: int) -> bytes:
        with self.conn.sftp_op(f"read {self.path}"):
            return self.f.read(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.f.close()
        except Exception:  # the connection may be what failed
            pass


class SSHHost(Host):
    """A machine reached over SSH: every verb goes through one paramiko connection."""

    def __init__(self, endpoint, tmux_socket: str = "cloudtrain", python: str = "python3"):
        super().__init__(tmux_socket)
        self.endpoint = endpoint
        self.python = python
        self.name = endpoint.label()
        self._conn = None
        self._home: str | None = None
        self._has_rsync: bool | None = None

    @property
    def conn(self):
        if self._conn is None:
            from .ssh import Connection

            self._conn = Connection(self.endpoint)
            self.endpoint.host_key = self._conn.host_key  # pinned from now on
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def home(self) -> str:
        """The login directory ($HOME), asked over SFTP, whose server runs in it: no shell
        is started for it (a login shell costs a process and the user's rc files)."""
        if self._home is None:
            with self.conn.sftp_op("home directory") as sftp:
                self._home = sftp.normalize(".")
        return self._home

    def run(self, command: str, check: bool = True, timeout: float | None = None) -> Result:
        """Every remote command has a deadline: `timeout`, else RUN_TIMEOUT_S."""
        code, out, err = self.conn.exec(command, timeout=RUN_TIMEOUT_S if timeout is None
                                        else timeout)
        result = Result(command, code, out.decode("utf-8", "replace"),
                        err.decode("utf-8", "replace"), out)
        if check and not result.ok:
            raise CommandFailed(self, result)
        return result

    def _into_dir(self, remote: str, write) -> None:
        """Write over SFTP; create the directory (one more round trip) only if missing."""
        try:
            write()
        except FileNotFoundError:
            self.run(f"mkdir -p {shlex.quote(str(Path(remote).parent))}")
            write()

    def put(self, local: Path, remote: str) -> None:
        def write():
            with self.conn.sftp_op(f"put {remote}") as sftp:
                sftp.put(str(local), remote)
                sftp.chmod(remote, os.stat(local).st_mode & 0o777)

        self._into_dir(remote, write)

    def get(self, remote: str, local: Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        with self.conn.sftp_op(f"get {remote}") as sftp:
            sftp.get(remote, str(local))

    def write_text(self, remote: str, text: str, private: bool = False) -> None:
        def write():
            with self.conn.sftp_op(f"write {remote}") as sftp, sftp.open(remote, "w") as f:
                if private:
                    f.chmod(0o600)  # before the first byte is in it
                f.write(text.encode())

        self._into_dir(remote, write)

    def read(self, path: str, offset: int = 0, end: int | None = None) -> bytes:
        # A job's files (F34): LSTAT first, so that a FIFO (whose open would hang the host's
        # sftp-server) or a link to /dev/zero (a read without end) is refused, not opened;
        # then FSTAT on the handle, and no read past the size it had.
        try:
            with self.conn.sftp_op(f"read {path}") as sftp:
                mode = sftp.lstat(path).st_mode or 0
                if not stat.S_ISREG(mode):
                    raise safefile.NotRegular(path, safefile.kind(mode))
                with sftp.open(path, "rb") as f:
                    attrs = f.stat()
                    if not stat.S_ISREG(attrs.st_mode or 0):
                        raise safefile.NotRegular(path, safefile.kind(attrs.st_mode or 0))
                    stop = attrs.st_size if end is None else min(end, attrs.st_size)
                    f.seek(offset)
                    return f.read(max(stop - offset, 0))
        except FileNotFoundError:
            return b""
        except HostError as exc:
            if isinstance(exc.__cause__, safefile.NotRegular):
                raise NotRegularFile(f"cannot read {path} on {self.name}: "
                                     f"{exc.__cause__.strerror}") from None
            raise

    def _make_and_hash(self, directory: str, names: list[str], make: tuple[str, ...] = ()
                       ) -> dict[str, str]:
        out = self.run("mkdir -p -- " + " ".join(shlex.quote(d) for d in (*make, directory))
                       + f" && cd {shlex.quote(directory)} && {{ sha256sum -- "
                       + " ".join(shlex.quote(n) for n in names) + " 2>/dev/null || true; }"
                       ).stdout
        found = {}
        for line in out.splitlines():
            digest, _, name = line.partition("  ")
            if name in names:
                found[name] = digest
        return found

    def _rename(self, src: str, dst: str) -> None:
        with self.conn.sftp_op(f"rename {src}") as sftp:
            sftp.posix_rename(src, dst)

    def _agent_gone(self, job_id: str, pid: int | None) -> bool:
        """/proc/<pid> still there (one SFTP stat, no process started on the host): not
        gone. Otherwise, or on a host without /proc, tmux is asked."""
        if pid is not None:
            try:
                with self.conn.sftp_op(f"stat /proc/{pid}") as sftp:
                    sftp.stat(f"/proc/{pid}")
                return False
            except (FileNotFoundError, HostError):
                pass
        return not self.session_alive(job_id)

    def _listdir(self, path: str) -> list[tuple[str, int]]:
        # SFTP READDIR answers with lstat attributes: a symlink is a symlink, not its target.
        with self.conn.sftp_op(f"list {path}") as sftp:
            return [(a.filename, a.st_mode or 0) for a in sftp.listdir_attr(path)]

    def _open_regular(self, path: str):
        with self.conn.sftp_op(f"open {path}") as sftp:
            f = sftp.open(path, "rb")
            # FSTAT on the open handle: what was opened, whatever the listing said. (A symlink
            # swapped in would be followed on the host, but only to a file the host's own
            # user can read anyway; the local side is what F2 protects.)
            if not stat.S_ISREG(f.stat().st_mode or 0):
                f.close()
                return None
        return _SFTPReader(self.conn, path, f)

    def sync(self, local_dir: Path, remote_dir: str, like: str | None = None,
             include: tuple[str, ...] = (), sent: Callable[[int], None] | None = None) -> int:
        """rsync over this connection where both ends have rsync (hard-linking what is
        unchanged since `like`), else a tar stream."""
        files = list_files(local_dir, include)
        self.run(f"mkdir -p {shlex.quote(remote_dir)}")
        if not files:
            return 0
        if self._has_rsync is None:
            self._has_rsync = (shutil.which("rsync") is not None
                               and self.run("command -v rsync", check=False).ok)
        if self._has_rsync:
            return self._rsync(Path(local_dir), remote_dir, files, like, sent)
        return self._tar(Path(local_dir), remote_dir, files, sent)

    def _rsync(self, local_dir: Path, remote_dir: str, files: list[str],
               like: str | None = None, sent: Callable[[int], None] | None = None) -> int:
        relay = self.conn.relay()
        extra = [f"--link-dest={like}"] if like else []
        sizes = _sizes(local_dir, files) if sent is not None else {}
        # NUL-separated names (git allows a newline in a name; audit F3 saw "ok\nsecret.txt"
        # split into two entries and a gitignored secret.txt uploaded), and --protect-args so
        # the remote shell never sees the paths. rsync names each file (--out-format) as it
        # sends it: that is the progress.
        names = "".join(f + "\0" for f in files).encode("utf-8", "surrogateescape")
        err: list[bytes] = []
        try:
            proc = subprocess.Popen(
                ["rsync", "-a", "--protect-args", *extra, "--from0", "--files-from=-",
                 "--out-format=%n", "-e", relay.rsh(), f"{local_dir}/", f"remote:{remote_dir}/"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

            def feed() -> None:
                try:
                    proc.stdin.write(names)
                    proc.stdin.close()
                except OSError:  # rsync ended early: its exit code says why
                    pass

            threads = [threading.Thread(target=feed, daemon=True),
                       threading.Thread(target=lambda: err.append(proc.stderr.read()),
                                        daemon=True)]
            for t in threads:
                t.start()
            timer = threading.Timer(3600, proc.kill)
            timer.daemon = True
            timer.start()
            count = done = 0
            try:
                for raw in proc.stdout:
                    line = raw.decode("utf-8", "replace").rstrip("\n")
                    if line and not line.endswith("/"):
                        count += 1
                        if sent is not None:
                            done += sizes.get(line, 0)
                            sent(done)
                code = proc.wait()
            finally:
                timer.cancel()
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for t in threads:
                t.join(5)
        finally:
            relay.close()
        if code != 0:
            stderr = b"".join(err).decode("utf-8", "replace")
            raise HostError(f"rsync to {self.name}:{remote_dir} failed ({code}): "
                            + (stderr.strip().splitlines() or ["no output"])[-1])
        return count

    def unpack(self, tar_path: Path, remote_dir: str,
               sent: Callable[[int], None] | None = None) -> None:
        """Stream a bundle() into remote_dir through one `tar -x` on this connection."""
        def write(chan) -> None:
            done = 0
            with open(tar_path, "rb") as f:
                while chunk := f.read(1 << 20):
                    chan.sendall(chunk)
                    done += len(chunk)
                    if sent is not None:
                        sent(done)

        self._tar_stream(remote_dir, write, mkdir=True)

    def _tar(self, local_dir: Path, remote_dir: str, files: list[str],
             sent: Callable[[int], None] | None = None) -> int:
        import tarfile

        def write(chan) -> None:
            writer = chan.makefile("wb")
            with tarfile.open(fileobj=writer, mode="w|") as tar:
                done = 0
                for rel in files:
                    tar.add(local_dir / rel, arcname=rel, recursive=False)
                    if sent is not None:
                        done += (local_dir / rel).lstat().st_size
                        sent(done)
            writer.flush()

        self._tar_stream(remote_dir, write)
        return len(files)

    def _tar_stream(self, remote_dir: str, write: Callable, mkdir: bool = False) -> None:
        """`write(channel)` sends a tar stream to `tar -x -C remote_dir` on the host; then
        its exit status. A stream has no overall deadline (its size is the user's), but a
        host that stops taking bytes, or never reports tar's end, for STREAM_IDLE_S is given
        up on. HostError if it broke or tar failed."""
        where = shlex.quote(remote_dir)
        chan = self.conn.open_exec((f"mkdir -p {where} && " if mkdir else "")
                                   + f"tar -x -C {where}")
        chan.settimeout(STREAM_IDLE_S)
        try:
            write(chan)
            chan.shutdown_write()
            if not chan.status_event.wait(STREAM_IDLE_S):
                raise TimeoutError("no exit status")
            code = chan.recv_exit_status()
            err = chan.makefile_stderr("rb").read().decode("utf-8", "replace")
        except (TimeoutError, OSError, EOFError) as exc:
            raise HostError(f"tar into {self.name}:{remote_dir} stalled or broke: "
                            f"{exc or type(exc).__name__}") from exc
        finally:
            chan.close()
        if code != 0:
            raise HostError(f"tar into {self.name}:{remote_dir} failed ({code}): {err.strip()}")

    def ssh_argv(self, *remote: str, tty: bool = True) -> list[str]:
        """The system ssh client, trusting only the pinned host key; a terminal on the host
        for interactive use (`tty`), none for a command whose output is piped."""
        from .config import home

        ep = self.endpoint
        known = home() / "known_hosts"
        known.parent.mkdir(parents=True, exist_ok=True)
        name = ep.host if ep.port == 22 else f"[{ep.host}]:{ep.port}"
        lines = [l for l in (known.read_text().splitlines() if known.exists() else [])
                 if not l.startswith(name + " ")]
        if ep.host_key:
            lines.append(f"{name} {ep.host_key}")
        known.write_text("\n".join(lines) + "\n")
        argv = ["ssh", "-t" if tty else "-T", "-p", str(ep.port), "-o", f"UserKnownHostsFile={known}",
                "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes"]
        if ep.key_path:
            argv += ["-i", ep.key_path]
        return argv + [f"{ep.user}@{ep.host}", *remote]

    def attach_argv(self, job_id: str) -> list[str]:
        return self.ssh_argv(self.tmux("attach-session", "-t", session_name(job_id)))

    def describe(self) -> dict:
        return {**super().describe(), "host": self.endpoint.host, "port": self.endpoint.port,
                "user": self.endpoint.user, "key_path": self.endpoint.key_path,
                "host_key": self.endpoint.host_key, "python": self.python}


def close_quietly(host) -> None:
    """Close a host's connection, if it has one, ignoring that it may be broken already
    (that is usually why it is being forgotten)."""
    close = getattr(host, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001 - already broken
            pass


def from_description(info: dict) -> Host:
    """The host a describe() record names (a job's `host`, a node's record): this machine,
    or one reached over SSH with its pinned host key."""
    kind = info.get("kind")
    if kind == "LocalHost":
        return LocalHost(info.get("tmux_socket") or "cloudtrain", info.get("python"))
    if kind == "SSHHost" and info.get("host"):
        from .ssh import Endpoint

        endpoint = Endpoint(info["host"], info.get("port") or 22, info.get("user") or "ubuntu",
                            info.get("key_path"), info.get("host_key"))
        return SSHHost(endpoint, info.get("tmux_socket") or "cloudtrain",
                       info.get("python") or "python3")
    raise HostError(f"no way to reach a host recorded as {str(kind)[:40]!r}")
