"""SSHHost: a machine reached over SSH as a Host, every verb over one paramiko connection
(ssh.py): commands, SFTP for files, rsync or a tar stream for folders. Imports the Host verbs
from hosts.py; paramiko only through ssh.py, when a connection is first made."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .host import safefile
from .errors import HostError, NotRegularFile
from .gitignore import list_files
from .hosts import CommandFailed, Host, Result, file_sizes, session_name

if TYPE_CHECKING:
    from .ssh import Connection

# Deadlines for remote calls (one hung host hung `status`, `down` and `down --all`).
RUN_TIMEOUT_S = 300.0  # any command that does not say otherwise
STREAM_IDLE_S = 120.0  # a tar stream or rsync that moves no byte for this long is dead
RSYNC_TIMED_OUT = 30  # rsync's exit code for its --timeout ("Timeout in data send/receive")


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
        # A file the machine's boot writes once what the job needs is installed (None:
        # nothing is installed at boot); setup waits for it.
        self.ready_file: str | None = None
        self.name = endpoint.label()
        self._conn: Connection | None = None
        self._home: str | None = None
        self._has_rsync: bool | None = None

    @property
    def conn(self):
        if self._conn is None:
            from .ssh import Connection

            conn = self._conn = Connection(self.endpoint)
            self.endpoint.host_key = conn.host_key  # pinned from now on
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def home(self) -> str:
        """The login shell's $HOME, where the agent and every command run: asked once per
        connection. Not SFTP's start directory (the passwd home), which a host may set apart
        from $HOME (sshd's SetEnv, as the namespace lab gives each host its own disk)."""
        if self._home is None:
            self._home = self.run('printf %s "$HOME"').stdout
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
        # A job's files: LSTAT first, so that a FIFO (whose open would hang the host's
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
            # user can read anyway; the local side is what the pull-back's own checks protect.)
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
        sizes = file_sizes(local_dir, files) if sent is not None else {}
        # NUL-separated names (git allows a newline in a name; an audit saw "ok\nsecret.txt"
        # split into two entries and a gitignored secret.txt uploaded), and --protect-args so
        # the remote shell never sees the paths. rsync names each file (--out-format) as it
        # sends it: that is the progress.
        names = "".join(f + "\0" for f in files).encode("utf-8", "surrogateescape")
        err: list[bytes] = []
        try:
            proc = subprocess.Popen(
                ["rsync", "-a", "--protect-args", f"--timeout={max(1, round(STREAM_IDLE_S))}",
                 *extra, "--from0", "--files-from=-",
                 "--out-format=%n", "-e", relay.rsh(), f"{local_dir}/", f"remote:{remote_dir}/"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            p_in, p_out, p_err = proc.stdin, proc.stdout, proc.stderr
            assert p_in is not None and p_out is not None and p_err is not None  # PIPEs

            def feed() -> None:
                try:
                    p_in.write(names)
                    p_in.close()
                except OSError:  # rsync ended early: its exit code says why
                    pass

            threads = [threading.Thread(target=feed, daemon=True),
                       threading.Thread(target=lambda: err.append(p_err.read()),
                                        daemon=True)]
            for t in threads:
                t.start()
            timer = threading.Timer(3600, proc.kill)
            timer.daemon = True
            timer.start()
            count = done = 0
            try:
                for raw in p_out:
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
        if code == RSYNC_TIMED_OUT:
            raise HostError(f"rsync to {self.name}:{remote_dir} stalled: nothing moved for "
                            f"{STREAM_IDLE_S:.0f} s", hint="the connection or the instance hung; "
                            "launch again")
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
