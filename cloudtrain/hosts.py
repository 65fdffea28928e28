"""Host: the one thing the lifecycle talks to for running a job somewhere.

    run(cmd) -> Result            a shell command; check=True raises CommandFailed
    put(local, remote)            one file
    get(remote, local)            one file
    sync(local_dir, remote_dir)   a directory, honouring .gitignore
    read(path, offset, end)       bytes [offset, end) of a (growing) file

and, built on those, what every host does the same way: start the agent in tmux, probe and
stop a job through the agent. `LocalHost` is this machine through subprocess; an SSH host
implements the same verbs over one connection.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from . import agent as agent_module
from .errors import HostError, MissingDependency
from .gitignore import list_files

AGENT_SOURCE = Path(agent_module.__file__)
TMUX_INSTALL_HINT = ("install tmux: `apt-get install tmux` (Debian/Ubuntu), `dnf install tmux` "
                     "(Fedora/Amazon Linux) or `brew install tmux` (macOS)")


@dataclass
class Result:
    command: str
    exit_code: int
    stdout: str
    stderr: str

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


class Host(ABC):
    """The verbs every host has; subclasses implement run/put/get/sync/read."""

    name = "host"
    python = "python3"  # the interpreter that runs the agent on this host

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
    def sync(self, local_dir: Path, remote_dir: str, like: str | None = None) -> int:
        """Copy local_dir's files (as git would keep them) to remote_dir; files unchanged
        since `like` (an earlier copy on the host) are not sent again."""

    @abstractmethod
    def read(self, path: str, offset: int = 0, end: int | None = None) -> bytes:
        ...

    @abstractmethod
    def write_text(self, remote: str, text: str) -> None:
        ...

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

    def install_agent(self, jobdir: str) -> None:
        """Put the agent where `start_agent`, `probe_job` and `stop_job` run it from."""
        self.put(AGENT_SOURCE, f"{jobdir}/agent.py")

    def pull_tree(self, remote: str, local: Path, limit_bytes: float) -> int:
        """Copy the files below `remote` into `local`, unless together they exceed
        limit_bytes; returns the bytes copied."""
        listing = self.run(f"cd {shlex.quote(remote)} 2>/dev/null && find . -type f -printf '%s %P\\n'",
                           check=False).stdout.splitlines()
        files = [(int(size), name) for size, _, name in (l.partition(" ") for l in listing) if name]
        total = sum(size for size, _ in files)
        if not files or total > limit_bytes:
            return 0
        for _, name in files:
            self.get(f"{remote}/{name}", local / name)
        return total

    def start_agent(self, job_id: str, jobdir: str) -> None:
        """Start `agent.py run <jobdir>` as the command of a new detached tmux session.

        The tmux server exits when its last session ends; a new-session that reaches it while
        it is exiting fails with "server exited unexpectedly" (seen with many jobs launched
        at once). That, and only that kind of failure, is tried again."""
        agent_cmd = shlex.join([self.python, f"{jobdir}/agent.py", "run", jobdir])
        command = self.tmux("new-session", "-d", "-s", session_name(job_id), "-x", "200",
                            "-y", "50", agent_cmd)
        for attempt in range(TMUX_START_TRIES):
            result = self.run(command, check=False)
            if result.ok:
                return
            transient = any(m in result.stderr for m in TMUX_TRANSIENT)
            if not transient or attempt == TMUX_START_TRIES - 1:
                break
            if self.session_alive(job_id):
                return
            time.sleep(0.05 * (attempt + 1))
        raise CommandFailed(self, result)

    def session_alive(self, job_id: str) -> bool:
        return self.run(self.tmux("has-session", "-t", session_name(job_id)), check=False).ok

    def attach_argv(self, job_id: str) -> list[str]:
        return ["tmux", "-L", self.tmux_socket, "attach-session", "-t", session_name(job_id)]

    def probe_job(self, jobdir: str, stale_after_s: float) -> dict:
        result = self.run(shlex.join([self.python, f"{jobdir}/agent.py", "probe", jobdir,
                                      "--stale", str(stale_after_s)]))
        return json.loads(result.stdout)

    def stop_job(self, jobdir: str, grace_s: float) -> dict | None:
        result = self.run(shlex.join([self.python, f"{jobdir}/agent.py", "stop", jobdir,
                                      "--grace", str(grace_s)]), timeout=grace_s + 60)
        return json.loads(result.stdout)

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

    def write_text(self, remote: str, text: str) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        Path(remote).write_text(text)

    def sync(self, local_dir: Path, remote_dir: str, like: str | None = None) -> int:
        """Copy the files git would keep; unchanged files (size and mtime) are skipped."""
        copied = 0
        for rel in list_files(local_dir):
            src, dst = Path(local_dir) / rel, Path(remote_dir) / rel
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
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read() if end is None else f.read(max(end - offset, 0))
        except FileNotFoundError:
            return b""

    def tail(self, path: str, lines: int) -> tuple[bytes, int]:
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return b"", 0
        return last_lines(self.read(path, max(0, size - TAIL_WINDOW), size), lines), size

    def probe_job(self, jobdir: str, stale_after_s: float) -> dict:
        # Same code the agent runs on remote hosts, without a process per job.
        return agent_module.probe(jobdir, stale_after_s)

    def stop_job(self, jobdir: str, grace_s: float) -> dict | None:
        return agent_module.stop(jobdir, grace_s)

    def describe(self) -> dict:
        return {**super().describe(), "python": self.python}


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
        if self._home is None:
            self._home = self.run('printf %s "$HOME"').stdout
        return self._home

    def run(self, command: str, check: bool = True, timeout: float | None = None) -> Result:
        code, out, err = self.conn.exec(command, timeout=timeout)
        result = Result(command, code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
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
            self.conn.sftp.put(str(local), remote)
            self.conn.sftp.chmod(remote, os.stat(local).st_mode & 0o777)

        self._into_dir(remote, write)

    def get(self, remote: str, local: Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        self.conn.sftp.get(remote, str(local))

    def write_text(self, remote: str, text: str) -> None:
        def write():
            with self.conn.sftp.open(remote, "w") as f:
                f.write(text.encode())

        self._into_dir(remote, write)

    def read(self, path: str, offset: int = 0, end: int | None = None) -> bytes:
        try:
            with self.conn.sftp.open(path, "rb") as f:
                f.seek(offset)
                return f.read() if end is None else f.read(max(end - offset, 0))
        except FileNotFoundError:
            return b""

    def sync(self, local_dir: Path, remote_dir: str, like: str | None = None) -> int:
        """rsync over this connection where both ends have rsync (hard-linking what is
        unchanged since `like`), else a tar stream."""
        files = list_files(local_dir)
        self.run(f"mkdir -p {shlex.quote(remote_dir)}")
        if not files:
            return 0
        if self._has_rsync is None:
            self._has_rsync = (shutil.which("rsync") is not None
                               and self.run("command -v rsync", check=False).ok)
        if self._has_rsync:
            return self._rsync(Path(local_dir), remote_dir, files, like)
        return self._tar(Path(local_dir), remote_dir, files)

    def _rsync(self, local_dir: Path, remote_dir: str, files: list[str],
               like: str | None = None) -> int:
        relay = self.conn.relay()
        extra = [f"--link-dest={like}"] if like else []
        try:
            proc = subprocess.run(
                ["rsync", "-a", *extra, "--files-from=-", "--out-format=%n", "-e", relay.rsh(),
                 f"{local_dir}/", f"remote:{remote_dir}/"],
                input="\n".join(files) + "\n", capture_output=True, text=True, timeout=3600)
        finally:
            relay.close()
        if proc.returncode != 0:
            raise HostError(f"rsync to {self.name}:{remote_dir} failed ({proc.returncode}): "
                            + (proc.stderr.strip().splitlines() or ["no output"])[-1])
        return sum(1 for line in proc.stdout.splitlines() if line and not line.endswith("/"))

    def _tar(self, local_dir: Path, remote_dir: str, files: list[str]) -> int:
        import tarfile

        chan = self.conn.open_exec(f"tar -x -C {shlex.quote(remote_dir)}")
        writer = chan.makefile("wb")
        with tarfile.open(fileobj=writer, mode="w|") as tar:
            for rel in files:
                tar.add(local_dir / rel, arcname=rel, recursive=False)
        writer.flush()
        chan.shutdown_write()
        code = chan.recv_exit_status()
        err = chan.makefile_stderr("rb").read().decode("utf-8", "replace")
        chan.close()
        if code != 0:
            raise HostError(f"tar into {self.name}:{remote_dir} failed ({code}): {err.strip()}")
        return len(files)

    def ssh_argv(self, *remote: str) -> list[str]:
        """The system ssh client, for interactive use, trusting only the pinned host key."""
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
        argv = ["ssh", "-t", "-p", str(ep.port), "-o", f"UserKnownHostsFile={known}",
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
