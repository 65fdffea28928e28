"""The lab's sshd (tests/labs/sshd.py) against the real sshd: it is never mistaken for another
process listening on its port."""

from __future__ import annotations

import os
import shutil
import socket

import pytest

from cloudtrain.ssh import Endpoint
from cloudtrain.ssh_host import SSHHost
from conftest import TMUX_SOCKET
from labs.loopback import free_port
from labs.sshd import SSHD

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")


def test_a_port_taken_at_one_of_its_addresses_moves_it_to_a_free_one(tmp_path):
    """CI: the other pytest worker's AWS lab listened on the same loopback addresses and port;
    this lab's sshd could not bind, and the check that it listened reached the other sshd,
    so the launch met "Authentication failed". The port is taken here at the second of two
    addresses, where a connection to the first alone would have said all is well."""
    first, second = "127.0.3.4", "127.0.3.5"
    port = free_port(first, second)
    with socket.socket() as other:
        other.bind((second, port))
        other.listen()
        server = SSHD(tmp_path / "sshd", host=first, port=port)
        server.listen_on([first, second])
        server.start()
        try:
            assert server.port != port
            assert f"Port {server.port}" in server.config.read_text()
            assert "Address already in use" not in (server.dir / "sshd.log").read_text()
            for address in (first, second):
                host = SSHHost(Endpoint(address, server.port, server.user,
                                        str(server.client_key)), TMUX_SOCKET,
                               python=shutil.which("python3") or "python3")
                try:
                    assert host.run("echo ok").stdout.strip() == "ok"
                finally:
                    host.close()
        finally:
            server.stop()


def test_free_port_is_free_at_every_address_it_is_asked_for():
    with socket.socket() as held:
        held.bind(("127.0.3.7", 0))
        held.listen()
        taken = held.getsockname()[1]
        for _ in range(20):
            port = free_port("127.0.3.6", "127.0.3.7")
            assert port != taken
            with socket.socket() as s:
                s.bind(("127.0.3.7", port))
