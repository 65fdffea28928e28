"""Host: the one thing the lifecycle talks to for running a job somewhere.

    run(cmd) -> Result            a shell command; check=True raises CommandFailed
    put(local, remote)            one file
    get(remote, local)            one file
    sync(local_dir, remote_dir)   a directory, honouring .gitignore
    read(path, offset, end)       bytes [offset, end) of a (growing) file

and, built on those, what every host does the same way: install the agent and start it in
tmux, probe and stop a job through the agent, bring a tree of files home. The hosts themselves
are below: local_host.py (this machine, through subprocess), ssh_host.py (the same verbs over
one SSH connection); host_kinds.py tells which one a stored record names. This module imports
neither.

Whatever comes back from a host (names, sizes, JSON, exit codes) is untrusted: code on the
instance can write into the job's directory, and the instance has a public address.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import time
import unicodedata
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import hostdata
from . import host as host_package
from .errors import HostError
from .gitignore import list_files
from .progress import Reporter, megabytes

HOST_DIR = Path(host_package.__file__).parent
# cloudtrain/host/'s name on a host: a package of its own folder there, so that its modules
# import each other as they do here (relatively) and nothing of an installed cloudtrain.
HOST_PACKAGE = host_package.SHIPPED_AS
# The host modules run as commands (`python3 <folder>/<name>.py ARGS`): each has a launcher
# beside the package, so a command's path and its processes' command lines name the module.
HOST_COMMANDS = ("agent", "bootstrap", "boot_loader", "checkpoint_stream", "job_queue", "stager")
LAUNCHER = ('"""`python3 {name}.py ARGS`: {package}.{name}, of the package beside this file, '
            'run as its main module (as `python3 -m` would)."""\n'
            "import os\nimport runpy\nimport sys\n\n"
            "sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I, -P too\n"
            'runpy.run_module("{package}.{name}", run_name="__main__", alter_sys=True)\n')
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
# Deadlines for remote calls (one hung host hung `status`, `down` and `down --all`).
PROBE_TIMEOUT_S = 20.0  # `agent.py probe` reads two small files
STOP_EXTRA_S = 30.0  # `agent.py stop` waits the grace period, then this long at most
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


def host_files(modules: tuple[str, ...] | None = None) -> list[tuple[str, bytes]]:
    """What a host gets, as (path below its folder, bytes): the package HOST_PACKAGE/ (its
    __init__.py and every module of cloudtrain/host/, or the `modules` named), then the
    launcher of each command among them. Launchers last: one is there only once what it runs
    is."""
    names = sorted(p.stem for p in HOST_DIR.glob("*.py") if p.name != "__init__.py") \
        if modules is None else list(modules)
    files = [(f"{HOST_PACKAGE}/{name}.py", (HOST_DIR / f"{name}.py").read_bytes())
             for name in ["__init__", *names]]
    files += [(f"{name}.py", LAUNCHER.format(package=HOST_PACKAGE, name=name).encode())
              for name in HOST_COMMANDS if name in names]
    return files


def write_host_files(folder: Path, files: list[tuple[str, bytes]] | None = None) -> None:
    """host_files() (or `files`) written below a local folder, as a host has them."""
    for name, data in host_files() if files is None else files:
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def agent_version() -> str:
    """12 hex digits of sha256 over the agent's files: a new agent gets a new directory, so a
    host running jobs of several versions keeps each one's agent intact."""
    digest = hashlib.sha256()
    for name, data in host_files():
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()[:12]


def agent_dir(jobdir: str) -> str:
    """`<root>/agent-<version>` for jobdir `<root>/jobs/<id>`: outside every job directory,
    so a job cannot replace the code that probes and stops it."""
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


def file_sizes(local_dir: Path, files: list[str]) -> dict[str, int]:
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
    sizes = file_sizes(Path(local_dir), list_files(local_dir, include) if files is None else files)
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
        def said(done: int, base: int = base) -> None:
            report.sent(base + done)

        sent += host.sync(local, remote, like, include=include, sent=said)
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

    @abstractmethod
    def unpack(self, tar_path: Path, remote_dir: str,
               sent: Callable[[int], None] | None = None) -> None:
        """Extract a bundle() (a tar file here) into remote_dir; `sent` is told the bytes
        sent so far."""

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
        files = host_files()
        want = {name: hashlib.sha256(data).hexdigest() for name, data in files}
        if self._make_and_hash(directory, list(want), (*make, f"{directory}/{HOST_PACKAGE}")
                               ) == want:
            return
        for name, data in files:
            # Under a temporary name, then renamed: a probe running the agent at this moment
            # sees the old file or the new one, never half of one.
            folder, _, base = f"{directory}/{name}".rpartition("/")
            tmp = f"{folder}/.{base}.{uuid.uuid4().hex[:8]}.tmp"
            self.write_text(tmp, data.decode("utf-8"))
            self._rename(tmp, f"{folder}/{base}")

    @abstractmethod
    def _make_and_hash(self, directory: str, names: list[str], make: tuple[str, ...] = ()
                       ) -> dict[str, str]:
        """Create `make` and `directory` (with their parents), then the sha256 hex of each of
        these files in `directory` that exists: one round trip."""

    @abstractmethod
    def _rename(self, src: str, dst: str) -> None:
        """Replace dst by src atomically."""

    def start_command(self, job_id: str, jobdir: str) -> str:
        """The shell line that starts the job's agent in a new detached tmux session and
        prints the pane's pid: what start_agent runs, and what an instance that starts the
        job by itself runs from its bundle (host/bootstrap.py)."""
        # `exec`: the pane's process is the agent itself, so tmux's pane_pid is its pid.
        agent_cmd = "exec {} 2>>{}".format(
            shlex.join([self.python, self.agent_path(jobdir), "run", jobdir]),
            shlex.quote(f"{jobdir}/agent.err"))
        return self.tmux("new-session", "-d", "-P", "-F", "#{pane_pid}", "-s",
                         session_name(job_id), "-x", "200", "-y", "50", agent_cmd)

    def start_agent(self, job_id: str, jobdir: str) -> None:
        """Start `agent.py run <jobdir>` as the command of a new detached tmux session, and
        wait until the agent proves it runs: a status.json with its pid (a tmux
        session whose python did not exist counted as a started job, shown running for ever).
        The agent's own early stderr (python missing, a syntax error on an old python) goes
        to <jobdir>/agent.err, whose tail the error shows.

        The tmux server exits when its last session ends; a new-session that reaches it while
        it is exiting fails with "server exited unexpectedly" (seen with many jobs launched
        at once). That, and only that kind of failure, is tried again."""
        command = self.start_command(job_id, jobdir)
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

        Names and sizes from the host once let code on an instance write any file
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


def close_quietly(host) -> None:
    """Close a host's connection, if it has one, ignoring that it may be broken already
    (that is usually why it is being forgotten)."""
    close = getattr(host, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001 - already broken
            pass
