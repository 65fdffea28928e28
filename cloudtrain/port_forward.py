"""Ports of a job's instance opened on this machine (`cloudtrain forward JOB 6006`):
TensorBoard, Jupyter or any server the job runs there, reached at localhost:PORT here.

Each forward listens on 127.0.0.1 only (not the network this machine is on), and each
connection to it is one `direct-tcpip` channel of the job's SSH connection (ssh.Connection:
the host key pinned at launch, checked before anything is sent) to 127.0.0.1:REMOTE as the
instance sees it, so a server that listens on the instance's loopback only is reached too,
and nothing new is opened in the security group. No `ssh` binary is needed.

    parse(word)                       `REMOTE[:LOCAL]` -> Forward
    Forwarder(conn, forwards)         the listening sockets, bound at once (a port in use
                                      is said before anything is served)
    Forwarder.serve(stop)             until `stop` is set (Ctrl-C): each connection pumped
                                      both ways in two threads
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

from .errors import HostError, UsageError
from .ssh import CHANNEL_OPEN_TIMEOUT_S

CHUNK = 64 << 10
ACCEPT_POLL_S = 0.2  # how often serve() looks at its stop event


@dataclass(frozen=True)
class Forward:
    remote: int  # the port on the instance (its loopback)
    local: int  # the port on this machine's loopback (0: any free one)


def parse(word: str) -> Forward:
    """`6006` (the same port here) or `8888:18888` (the instance's 8888 at localhost:18888)."""
    remote, _, local = str(word).partition(":")
    try:
        numbers = [int(remote), int(local) if local else int(remote)]
    except ValueError:
        raise UsageError(f"{word!r}: expected PORT or PORT:LOCAL_PORT, e.g. 6006 or 8888:18888")
    if not 1 <= numbers[0] <= 65535 or not 0 <= numbers[1] <= 65535:
        raise UsageError(f"{word!r}: a port is a number from 1 to 65535 (a local port of 0: "
                         "any free one)")
    return Forward(numbers[0], numbers[1])


class Forwarder:
    """Listening sockets on this machine's loopback, each forwarded over `conn`."""

    def __init__(self, conn, forwards: list[Forward], bind: str = "127.0.0.1"):
        self.conn = conn
        self.listeners: list[tuple[socket.socket, Forward]] = []
        self._threads: list[threading.Thread] = []
        self.opened = 0  # connections forwarded so far
        try:
            for f in forwards:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((bind, f.local))
                except OSError as exc:
                    sock.close()
                    raise UsageError(f"localhost:{f.local} cannot be used here: "
                                     f"{exc.strerror or exc}",
                                     hint=f"forward it to another port: {f.remote}:"
                                          f"{f.local + 10000 if f.local < 55536 else 0}") from None
                sock.listen(16)
                sock.settimeout(ACCEPT_POLL_S)
                self.listeners.append((sock, Forward(f.remote, sock.getsockname()[1])))
        except BaseException:
            self.close()
            raise

    @property
    def forwards(self) -> list[Forward]:
        """What is forwarded, with the local ports as bound (a 0 asked for is a real one)."""
        return [f for _, f in self.listeners]

    def serve(self, stop: threading.Event) -> None:
        """Accept and forward connections until `stop` is set or the SSH connection is
        lost (HostError then)."""
        threads = [threading.Thread(target=self._accept, args=(sock, f, stop), daemon=True)
                   for sock, f in self.listeners]
        for t in threads:
            t.start()
        try:
            while not stop.wait(ACCEPT_POLL_S):
                self.conn.check_alive()
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=2)
            self.close()

    def _accept(self, sock: socket.socket, f: Forward, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                client, peer = sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._one, args=(client, peer, f), daemon=True)
            t.start()
            self._threads.append(t)

    def _one(self, client: socket.socket, peer, f: Forward) -> None:
        """One connection: a direct-tcpip channel to 127.0.0.1:REMOTE on the instance (a
        server not listening there refuses it, and the connection here is closed)."""
        import paramiko

        try:
            self.conn.check_alive()
            chan = self.conn.transport.open_channel(
                "direct-tcpip", ("127.0.0.1", f.remote), peer, timeout=CHANNEL_OPEN_TIMEOUT_S)
        except (paramiko.SSHException, HostError, EOFError, OSError):
            client.close()
            return
        self.opened += 1
        client.settimeout(None)
        done = threading.Event()

        def pump(read, write, finish) -> None:
            try:
                while True:
                    data = read(CHUNK)
                    if not data:
                        break
                    write(data)
            except (OSError, EOFError, paramiko.SSHException):
                pass
            finally:
                finish()
                done.set()

        def to_instance_done() -> None:
            try:
                chan.shutdown_write()
            except (OSError, EOFError):
                pass

        def to_client_done() -> None:
            try:
                client.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        up = threading.Thread(target=pump, args=(client.recv, chan.sendall, to_instance_done),
                              daemon=True)
        up.start()
        pump(chan.recv, client.sendall, to_client_done)
        up.join(timeout=30)
        chan.close()
        client.close()

    def close(self) -> None:
        for sock, _ in self.listeners:
            try:
                sock.close()
            except OSError:
                pass
