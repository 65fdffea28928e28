"""A throwaway real sshd for tests (see shared/test-infra.md): its own host key, one
authorised client key, listening on an address and port of the test's choosing."""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
from pathlib import Path

from .loopback import free_port
from .polling import wait_for

SSHD_BIN = "/usr/sbin/sshd"


class SSHD:
    def __init__(self, workdir: Path, host: str = "127.0.0.1", port: int | None = None,
                 client_key: Path | None = None, netns: str | None = None):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.host, self.port = host, port or free_port(host)
        self.user = getpass.getuser()
        self.netns = netns
        self.host_key = self.dir / "host_ed25519"
        self.client_key = client_key or self.dir / "client_ed25519"
        if not self.host_key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.host_key)],
                           check=True)
        if not self.client_key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(self.client_key)], check=True)
        pub = Path(str(self.client_key) + ".pub")
        self.authorized = self.dir / "authorized_keys"
        self.authorized.write_text(pub.read_text() if pub.exists() else "")
        self.config = self.dir / "sshd_config"
        self.config.write_text("\n".join([
            f"Port {self.port}", f"ListenAddress {self.host}", f"HostKey {self.host_key}",
            f"PidFile {self.dir / 'sshd.pid'}", f"AuthorizedKeysFile {self.authorized}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
            "StrictModes no", "PermitRootLogin prohibit-password", "Subsystem sftp internal-sftp",
            "MaxSessions 50", "MaxStartups 50", "LogLevel VERBOSE", ""]))
        self.proc: subprocess.Popen | None = None

    def listen_on(self, addresses: list[str]) -> None:
        """Listen on each of these addresses (same port), e.g. every IP a subnet can hand out."""
        lines = [l for l in self.config.read_text().splitlines() if not l.startswith("ListenAddress")]
        lines[1:1] = [f"ListenAddress {a}" for a in addresses]
        self.config.write_text("\n".join(lines) + "\n")

    def authorize(self, public_line: str) -> None:
        with open(self.authorized, "a") as f:
            f.write(public_line.strip() + "\n")

    def argv(self) -> list[str]:
        """The command that runs this sshd (inside its network namespace, if it has one)."""
        cmd = [SSHD_BIN, "-D", "-e", "-f", str(self.config)]
        return ["ip", "netns", "exec", self.netns, *cmd] if self.netns else cmd

    def addresses(self) -> list[str]:
        return [l.split()[1] for l in self.config.read_text().splitlines()
                if l.startswith("ListenAddress ")]

    def start(self) -> "SSHD":
        """Started, and listening on each of its addresses itself. Where another process took
        its port meanwhile (the other pytest worker's lab listens on the same loopback
        addresses), it moves to a free port and starts again: a connection to the port
        alone would have reached that other sshd (which refuses our key)."""
        os.makedirs("/run/sshd", exist_ok=True)
        for _ in range(5):
            self.log = open(self.dir / "sshd.log", "wb")
            self.proc = subprocess.Popen(self.argv(), stdout=self.log, stderr=subprocess.STDOUT)
            if wait_for(self._listening, timeout=10, interval=0.05,
                        what="sshd to start listening") == "listening":
                return self
            self.stop()
            if self.netns:  # its own network: the port was not taken by anyone else
                break
            self.port = free_port(*self.addresses())
            self.config.write_text("".join(
                f"Port {self.port}\n" if l.startswith("Port ") else l + "\n"
                for l in self.config.read_text().splitlines()))
        raise RuntimeError("sshd could not listen: " + (self.dir / "sshd.log").read_text())

    def _listening(self) -> str | None:
        """"listening" once sshd says it listens on every address; "port taken" when one of
        them was in use (it may still listen on the rest: stop it); None before."""
        said = (self.dir / "sshd.log").read_text(errors="replace")
        if "Address already in use" in said:
            return "port taken"
        if self.proc.poll() is not None:
            raise RuntimeError("sshd exited: " + said)
        if all(f"Server listening on {a} port {self.port}." in said for a in self.addresses()):
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return "listening"
            except OSError:
                return None
        return None

    def connections(self) -> int:
        """How many SSH logins this server accepted (from its log)."""
        return (self.dir / "sshd.log").read_text().count("Accepted publickey")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.log.close()
