"""LocalHost: this machine as a Host, through subprocess and the file system (the local
provider's host). Imports the Host verbs from hosts.py."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from . import config
from . import hostdata
from .host import agent as agent_module
from .host import safefile
from .errors import HostError, MissingDependency, NotRegularFile
from .gitignore import list_files
from .hosts import (TAIL_WINDOW, TMUX_INSTALL_HINT, CommandFailed, Host, Result, last_lines,
                    session_name)


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
        # A job's files: a FIFO or a link to /dev/zero in their place is refused at once.
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
