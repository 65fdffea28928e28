"""Self-test of tests/labs/netns.py: two namespaces as two instances, each with its own sshd,
reachable from here and from each other on 10.200.0.0/24; nothing left behind."""

from __future__ import annotations

import os
import subprocess

import pytest

from cloudtrain.ssh_host import SSHHost
from cloudtrain.ssh import Endpoint
from labs.polling import wait_for
from labs.netns import GATEWAY, NET, NetnsLab, cleanup_stale, lab_ip, netns_available

REASON = netns_available()
pytestmark = [
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server"),
]

IPS = (lab_ip(11), lab_ip(12))
REACH = "import socket, sys; socket.create_connection((sys.argv[1], 22), 2).close()"


def leftovers(prefix: str) -> list[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [word for line in netns.splitlines() + [l.split(": ")[1] for l in links.splitlines()]
            for word in line.split()[:1] if word.startswith(prefix)]


def test_two_hosts_each_with_its_own_sshd(tmp_path):
    with NetnsLab(workdir=tmp_path / "lab") as lab:
        hosts = [lab.add_host(ip) for ip in IPS]
        servers = [h.start_sshd() for h in hosts]
        assert len({h.name for h in hosts}) == 2 and all(h.name.startswith(lab.prefix)
                                                          for h in hosts)
        for host, server in zip(hosts, servers):
            ssh = SSHHost(Endpoint(host.ip, 22, server.user, str(server.client_key)))
            try:
                assert ssh.run("hostname -I").stdout.split() == [host.ip]
            finally:
                ssh.close()
            assert server.connections() == 1
            assert host.exec(["hostname", "-I"]).stdout.split() == [host.ip]
        # Host 11 reaches host 12's sshd over the bridge.
        a, b = hosts
        a.exec(["python3", "-c", REACH, b.ip])
        # Host 11's sshd listens on its own address only, not on its loopback.
        refused = a.exec(["python3", "-c", REACH, "127.0.0.1"], check=False)
        assert refused.returncode != 0 and "ConnectionRefused" in refused.stderr
        # A background process in a namespace is killed at exit.
        sleeper = b.popen(["sleep", "60"])
        # `ip netns exec` joins the namespace just after it starts: wait for that.
        wait_for(lambda: str(sleeper.pid) in subprocess.run(
            ["ip", "netns", "pids", b.name], capture_output=True, text=True).stdout.split(),
            timeout=5, what="process in the namespace")
        assert leftovers(lab.prefix)
        with pytest.raises(ValueError):
            lab.add_host("10.201.0.5")
        with pytest.raises(ValueError):
            lab.add_host(str(GATEWAY))
    assert all(s.proc.poll() is not None for s in servers) and sleeper.poll() is not None
    assert leftovers(lab.prefix) == []
    assert f"10.200.{NET}." not in subprocess.run(["ip", "-4", "addr"], capture_output=True,
                                             text=True).stdout


def test_cleanup_stale_removes_a_crashed_labs_leftovers(tmp_path):
    lab = NetnsLab(workdir=tmp_path / "lab").start()
    try:
        host = lab.add_host(lab_ip(11))
        server = host.start_sshd()
        assert cleanup_stale(lab.prefix) == []  # its owner (this process) is alive: kept
        removed = cleanup_stale(lab.prefix, skip_live=False)  # as if it had crashed
        assert set(removed) == {lab.bridge, host.veth, host.name}
        assert leftovers(lab.prefix) == []
        server.proc.wait(timeout=5)  # killed with its namespace
    finally:
        lab.close()  # releases the lock; what is already gone is skipped
    assert lab.cleanup_errors == []
