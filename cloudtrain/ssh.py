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
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from .errors import HostError

CONNECT_TIMEOUT_S = 10.0
# A dead peer (instance gone, network cut) sends nothing, not even a reset: SSH keepalives
# every KEEPALIVE_S and TCP keepalives notice it; every call also has its own deadline.
KEEPALIVE_S = 15
TCP_KEEPALIVE = {"TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3,
                 "TCP_USER_TIMEOUT": 60_000}  # ms that sent data may stay unacknowledged
SFTP_TIMEOUT_S = 60.0  # one SFTP request (a 32 KB read, a stat) never takes this long
CHANNEL_OPEN_TIMEOUT_S = 30.0
MAX_OUTPUT_BYTES = 64 << 20  # a command's stdout + stderr; more is a runaway host

# paramiko logs each failed handshake from its transport thread with a 20-line traceback
# ("Exception (client): Error reading SSH protocol banner"); with no handler configured,
# Python's last-resort handler printed them all to stderr while an instance booted.
# A handler of our own keeps them out; `--debug` configures the root logger, which still
# gets them (the records propagate).
logging.getLogger("paramiko").addHandler(logging.NullHandler())


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


def not_up_reason(exc: HostError) -> str:
    """Why an SSH server is not up yet, in a few words, for the line a wait says while it
    retries: 'banner timeout' (the port accepts, sshd is not answering yet), 'connection
    refused', 'no answer'."""
    cause = exc.__cause__
    text = str(cause or exc.message).lower()
    if "banner" in text:
        return "banner timeout"
    if isinstance(cause, ConnectionRefusedError) or "refused" in text:
        return "connection refused"
    if isinstance(cause, (TimeoutError, socket.timeout)) or "timed out" in text:
        return "no answer"
    if isinstance(cause, (EOFError, ConnectionResetError)) or "reset" in text:
        return "connection closed"
    return exc.message.split(": ", 1)[-1][:80]


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
        _tcp_keepalive(sock)
        transport = None
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
        except BaseException as exc:
            # Close the Transport, not only the socket: its thread otherwise keeps reading
            # the closed socket and prints "Socket exception: Bad file descriptor (9)" to
            # stderr until the process ends (31 lines in one failed launch).
            if transport is not None:
                transport.close()
            sock.close()
            if isinstance(exc, (paramiko.SSHException, EOFError, OSError)):
                raise HostError(f"SSH to {endpoint.label()} failed: "
                                f"{exc or type(exc).__name__}") from exc
            raise
        self.transport = transport
        Connection.opened += 1

    # -- commands --------------------------------------------------------------------------------

    def check_alive(self) -> None:
        """Raise HostError at once when the transport is gone (peer dead, keepalive failed)."""
        if not self.transport.is_active():
            raise HostError(f"the SSH connection to {self.endpoint.label()} was lost")

    def _open_channel(self, timeout: float | None = None):
        import paramiko

        self.check_alive()
        limit = CHANNEL_OPEN_TIMEOUT_S if timeout is None else min(timeout, CHANNEL_OPEN_TIMEOUT_S)
        try:
            return self.transport.open_session(timeout=limit)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise HostError(f"on {self.endpoint.label()}: cannot open a channel: "
                            f"{exc or type(exc).__name__}") from exc

    def exec(self, command: str, timeout: float | None = None, stdin: bytes | None = None
             ) -> tuple[int, bytes, bytes]:
        """Run `command`; its exit code, stdout and stderr. Past `timeout` seconds, when the
        connection drops, or past MAX_OUTPUT_BYTES: HostError (the channel is closed)."""
        import paramiko

        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        chan = self._open_channel(timeout)
        # paramiko waits for the answer to the exec request, and for send window, with no
        # timeout of its own: closing the channel at the deadline is what wakes those waits.
        expired = threading.Event()
        timer = None
        if deadline is not None:
            def expire() -> None:
                expired.set()
                # a connection that broke meanwhile cannot send the close: the waits wake
                # on the broken transport all the same
                with suppress(Exception):
                    chan.close()

            timer = threading.Timer(max(deadline - time.monotonic(), 0), expire)
            timer.daemon = True
            timer.start()

        def too_late() -> HostError:
            return HostError(f"on {self.endpoint.label()}: `{command}` did not finish "
                             f"in {timeout:.0f} s")

        try:
            try:
                chan.exec_command(command)
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
            except (paramiko.SSHException, OSError, EOFError) as exc:
                if expired.is_set():
                    raise too_late() from exc
                raise HostError(f"on {self.endpoint.label()}: `{command}` could not start: "
                                f"{exc or type(exc).__name__}") from exc
            out, err = bytearray(), bytearray()
            while True:
                got = False
                if chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if expired.is_set() or (deadline is not None and time.monotonic() > deadline):
                    raise too_late()
                if chan.exit_status_ready() and not chan.recv_ready() \
                        and not chan.recv_stderr_ready():
                    break
                if len(out) + len(err) > MAX_OUTPUT_BYTES:
                    raise HostError(f"on {self.endpoint.label()}: `{command}` printed more "
                                    f"than {MAX_OUTPUT_BYTES >> 20} MiB")
                if not got and not self.transport.is_active():
                    raise HostError(f"on {self.endpoint.label()}: the connection was lost "
                                    f"during `{command}`")
                if not got:
                    time.sleep(0.005)
            return chan.recv_exit_status(), bytes(out), bytes(err)
        finally:
            if timer is not None:
                timer.cancel()
            chan.close()

    def open_exec(self, command: str):
        """A channel running `command`, for streaming (tar, rsync)."""
        chan = self._open_channel()
        chan.exec_command(command)
        return chan

    # -- files -----------------------------------------------------------------------------------

    @property
    def sftp(self):
        with self._lock:
            if self._sftp is None:
                self._sftp = self._open_sftp()
            return self._sftp

    def _open_sftp(self):
        """A new SFTP session, in bounded time: paramiko waits for the subsystem's start with
        no timeout of its own, so a host that accepted the channel and then froze would hold
        us for ever; the waiting is done in a thread that is given up on."""
        import paramiko

        self.check_alive()
        box: dict = {}

        def start() -> None:
            try:
                chan = self._open_channel(SFTP_TIMEOUT_S)
                chan.settimeout(SFTP_TIMEOUT_S)  # every SFTP request waits on this channel
                chan.invoke_subsystem("sftp")
                box["sftp"] = paramiko.SFTPClient(chan)
            except BaseException as exc:  # handed to the caller below
                box["error"] = exc

        worker = threading.Thread(target=start, daemon=True)
        worker.start()
        worker.join(SFTP_TIMEOUT_S)
        if "sftp" in box:
            return box["sftp"]
        exc = box.get("error")
        if isinstance(exc, HostError):
            raise exc
        raise HostError(f"on {self.endpoint.label()}: SFTP did not start"
                        + (f": {exc}" if exc else f" in {SFTP_TIMEOUT_S:.0f} s")) from exc

    @contextmanager
    def sftp_op(self, what: str):
        """The SFTP client, for one operation whose failures become one HostError line. A
        timed-out or broken session is dropped (its replies would be out of step); the next
        operation opens a new one. FileNotFoundError is left to the caller."""
        import paramiko

        self.check_alive()
        try:
            yield self.sftp
        except FileNotFoundError:
            raise
        except (TimeoutError, EOFError, paramiko.SSHException) as exc:
            self._drop_sftp()
            raise HostError(f"on {self.endpoint.label()}: {what} failed: "
                            f"{exc or type(exc).__name__}") from exc
        except OSError as exc:
            raise HostError(f"on {self.endpoint.label()}: {what} failed: {exc}") from exc

    def _drop_sftp(self) -> None:
        with self._lock:
            sftp, self._sftp = self._sftp, None
        if sftp is not None:
            try:
                sftp.close()
            except Exception:  # already broken: that is why it is dropped
                pass

    def close(self) -> None:
        self._drop_sftp()
        self.transport.close()

    # -- rsync over this connection ----------------------------------------------------------------

    def relay(self) -> "Relay":
        return Relay(self)


def _tcp_keepalive(sock: socket.socket) -> None:
    """Kernel keepalives on the SSH socket, where the platform has the options."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in TCP_KEEPALIVE.items():
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError:
        pass


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
                try:
                    while True:
                        data = client.recv(65536)
                        if not data:
                            chan.shutdown_write()
                            return
                        chan.sendall(data)
                except (OSError, EOFError):
                    return  # the downstream side ended first and shut the socket: done

            t = threading.Thread(target=upstream, daemon=True)
            t.start()
            while True:
                data = chan.recv(65536)
                if not data:
                    break
                client.sendall(data)
            chan.close()
            # shutdown, not just close: the upstream thread still blocks in recv() on it,
            # and a bare close() would neither wake it nor send the relay its EOF. It is
            # waited for before the socket is closed (a recv on a closed descriptor raised
            # "Bad file descriptor" in that thread, printed as a traceback, under load).
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            t.join(CHANNEL_OPEN_TIMEOUT_S)

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
