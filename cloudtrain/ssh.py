"""One paramiko connection per host, reused for every step (commands, files, rsync).

The host key is pinned on first contact (trust on first use, recorded by the caller) and
verified on every later connection: a changed key is refused, not silently accepted.

rsync runs over the same connection: the local rsync is given a "remote shell" that is a
tiny relay (`python -m cloudtrain.ssh relay SOCKET`) talking to this process over a Unix
socket; this process opens a channel on the existing transport for the command rsync asks
for and pumps the bytes. No second SSH connection, no `ssh` binary needed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from .errors import HostError

CONNECT_TIMEOUT_S = 10.0
KEEPALIVE_S = 30


@dataclass
class Endpoint:
    host: str
    port: int = 22
    user: str = "ubuntu"
    key_path: str | None = None  # private key file (0600)
    host_key: str | None = None  # "<type> <base64>" pinned on first contact

    def label(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


class HostKeyMismatch(HostError):
    pass


class Connection:
    """An authenticated SSH transport, opened once; counts the connections it makes."""

    opened = 0  # connections opened by this process (benchmarks read it)

    def __init__(self, endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT_S):
        import paramiko

        self.endpoint = endpoint
        self._lock = threading.Lock()
        self._sftp = None
        try:
            sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
        except OSError as exc:
            raise HostError(f"cannot reach {endpoint.label()}: {exc}") from exc
        try:
            transport = paramiko.Transport(sock)
            transport.banner_timeout = timeout
            transport.start_client(timeout=timeout)
            key = transport.get_remote_server_key()
            seen = f"{key.get_name()} {key.get_base64()}"
            if endpoint.host_key and endpoint.host_key != seen:
                raise HostKeyMismatch(
                    f"the host key of {endpoint.label()} changed since first contact "
                    f"(pinned {endpoint.host_key.split()[0]}, now {key.get_name()}): refusing to "
                    "connect", hint="if the instance was replaced, launch again; otherwise "
                                    "someone may be intercepting the connection")
            self.host_key = seen
            pkey = load_private_key(endpoint.key_path) if endpoint.key_path else None
            if pkey is None:
                raise HostError(f"no private key to log in to {endpoint.label()}")
            transport.auth_publickey(endpoint.user, pkey)
            transport.set_keepalive(KEEPALIVE_S)
        except paramiko.SSHException as exc:
            sock.close()
            raise HostError(f"SSH to {endpoint.label()} failed: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        self.transport = transport
        Connection.opened += 1

    # -- commands --------------------------------------------------------------------------------

    def exec(self, command: str, timeout: float | None = None, stdin: bytes | None = None
             ) -> tuple[int, bytes, bytes]:
        chan = self.transport.open_session()
        try:
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                got = False
                if chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() \
                        and not chan.recv_stderr_ready():
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise HostError(f"on {self.endpoint.label()}: `{command}` did not finish "
                                    f"in {timeout:.0f} s")
                if not got:
                    time.sleep(0.005)
            return chan.recv_exit_status(), bytes(out), bytes(err)
        finally:
            chan.close()

    def open_exec(self, command: str):
        """A channel running `command`, for streaming (tar, rsync)."""
        chan = self.transport.open_session()
        chan.exec_command(command)
        return chan

    # -- files -----------------------------------------------------------------------------------

    @property
    def sftp(self):
        with self._lock:
            if self._sftp is None:
                import paramiko

                self._sftp = paramiko.SFTPClient.from_transport(self.transport)
            return self._sftp

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
        self.transport.close()

    # -- rsync over this connection ----------------------------------------------------------------

    def relay(self) -> "Relay":
        return Relay(self)


def load_private_key(path: str):
    import paramiko

    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key_file(path)
        except paramiko.SSHException:
            continue
        except FileNotFoundError as exc:
            raise HostError(f"SSH key {path} does not exist") from exc
    raise HostError(f"{path} is not a private key paramiko can read")


def generate_ed25519(path: str) -> str:
    """Write a new ed25519 private key (OpenSSH format, 0600); return its public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    return public.decode()


class Relay:
    """Serves `python -m cloudtrain.ssh relay SOCKET` processes (rsync's remote shell)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.dir = tempfile.mkdtemp(prefix="ct-relay-")
        self.path = os.path.join(self.dir, "s")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def rsh(self) -> str:
        """The value for rsync's -e: our relay, which ignores the host name rsync passes."""
        return f"{sys.executable} -m cloudtrain.ssh relay {self.path}"

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client:
            header = b""
            while not header.endswith(b"\n"):
                chunk = client.recv(1)
                if not chunk:
                    return
                header += chunk
            argv = json.loads(header)
            import shlex

            chan = self.conn.open_exec(shlex.join(argv))

            def upstream():
                while True:
                    data = client.recv(65536)
                    if not data:
                        chan.shutdown_write()
                        return
                    chan.sendall(data)

            t = threading.Thread(target=upstream, daemon=True)
            t.start()
            while True:
                data = chan.recv(65536)
                if not data:
                    break
                client.sendall(data)
            chan.close()
            # shutdown, not just close: the upstream thread still blocks in recv() on it,
            # and a bare close() would neither wake it nor send the relay its EOF.
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.server.close()
        try:
            os.unlink(self.path)
            os.rmdir(self.dir)
        except OSError:
            pass


def _relay_main(sock_path: str, argv: list[str]) -> int:
    """rsync runs `<rsh> HOST rsync --server ...`: pass the command on, then pipe bytes."""
    remote = argv[1:]  # drop the host name rsync puts first
    if remote and remote[0] == "-l":  # rsync may pass `-l user`
        remote = remote[2:]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    s.sendall(json.dumps(remote).encode() + b"\n")

    def up():
        while True:
            data = os.read(0, 65536)
            if not data:
                s.shutdown(socket.SHUT_WR)
                return
            s.sendall(data)

    threading.Thread(target=up, daemon=True).start()
    while True:
        data = s.recv(65536)
        if not data:
            return 0
        os.write(1, data)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "relay":
        sys.exit(_relay_main(sys.argv[2], sys.argv[3:]))
    print("usage: python -m cloudtrain.ssh relay SOCKET HOST COMMAND...", file=sys.stderr)
    sys.exit(2)
