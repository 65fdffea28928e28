"""Network namespaces as cloud instances, for end-to-end tests (see shared/test-infra.md,
"Network namespaces as instances"; root only).

    with NetnsLab(workdir=tmp_path) as lab:
        a = lab.add_host("10.200.0.11")
        sshd = a.start_sshd()                       # real sshd on 10.200.0.11:22, in a's netns
        SSHHost(Endpoint(a.ip, 22, sshd.user, str(sshd.client_key))).run("hostname -I")
        a.exec(["ip", "-br", "addr"])               # any command inside the namespace

A lab is one bridge ``<prefix>br`` holding 10.200.0.1/24 in the root namespace, plus per host
a namespace ``<prefix>-<last octet>`` whose ``eth0`` (a veth; root end ``<prefix>v<octet>``
on the bridge) has ``<ip>/24`` and a default route via 10.200.0.1. ``<prefix>`` is
``ctl`` + 6 hex digits of the pid + 2 hex digits of a per-process lab counter, so every
name the lab creates starts with its own prefix and with PREFIX ("ctl"); nothing else is
ever deleted. IP forwarding is not enabled: hosts reach each other and the root namespace,
nothing beyond.

Namespaces share this machine's kernel, filesystem and processes: files written "on a host"
land on this machine, and a tmux server is found through its socket in /tmp whichever
namespace asks, so give each host its own tmux socket name if what runs there must stay in
that host's namespace.

Labs share a subnet per pytest-xdist worker (lab_net: 10.200.<n>.0/24, n the worker's
number, so the end-to-end tests of two workers run side by side): only one lab of a subnet
runs at a time, a second one waits on its lock file, up to ``lock_timeout`` seconds. The
addresses in this docstring are worker 0's.
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from .sshd import SSHD

PREFIX = "ctl"


def lab_net() -> int:
    """n of the 10.200.<n>.0/24 this process's labs use: CT_LAB_NET, else the pytest-xdist
    worker's number (gw0: 0, gw1: 1, ...), else 0. Labs of different nets run side by side
    (their own bridge, addresses, moto and lock); labs of one net take turns (LOCK_FILE)."""
    given = os.environ.get("CT_LAB_NET")
    if given is None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        given = worker[2:] if worker.startswith("gw") else "0"
    n = int(given) if given.isascii() and given.isdigit() else 0
    return n if n <= 254 else 0


NET = lab_net()
SUBNET = ipaddress.ip_network(f"10.200.{NET}.0/24")
GATEWAY = SUBNET.network_address + 1
LOCK_FILE = f"/run/cloudtrain-netns-lab-{NET}.lock"


def lab_ip(last: int) -> str:
    """The lab's address ending in `last` (moto hands out .4, .5, ... in us-east-1a, .132,
    ... in us-east-1b: labs/cloud.py's ZONES)."""
    return str(SUBNET.network_address + last)
_labs = itertools.count()
_OWNER = re.compile(rf"^{PREFIX}([0-9a-f]{{6}})[0-9a-f]{{2}}(?:br|v\d+|-\d+|-probe)$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({proc.returncode}): "
                           f"{proc.stderr.strip()}")
    return proc


def _netns_names() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    # "7: ctl0012ab00v11@if6: <...>": the name, without the "@peer" suffix.
    return [line.split(": ")[1].split("@")[0] for line in out.splitlines() if ": " in line]


def _link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def _kill_netns_processes(ns: str, timeout: float = 5.0) -> None:
    """kill -9 every process in namespace `ns`, until none is left (or timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        proc = _ip("netns", "pids", ns, check=False)
        pids = [int(p) for p in proc.stdout.split() if p.isdigit() and int(p) != os.getpid()]
        if proc.returncode != 0 or not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} survive in namespace {ns}")
        time.sleep(0.02)


def _delete_netns(ns: str) -> None:
    try:
        _kill_netns_processes(ns)
    finally:  # a namespace still in use lives on unnamed until its processes exit
        if ns in _netns_names():
            _ip("netns", "del", ns)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


# `ip netns exec NS` mounts /etc/netns/NS/<file> over /etc/<file> for what it starts (the
# hosts' sshds, so every process on a host). This machine's nameserver is out of a host's
# reach (no forwarding): a name lookup there waited for DNS timeouts, and torch's TCPStore
# looks up each peer's address (25 s per rendezvous). A host resolves the lab's addresses
# from its hosts file, and anything else fails at once.
NETNS_ETC = Path("/etc/netns")
LAB_HOSTS = "127.0.0.1 localhost\n" + "".join(
    f"{ip} lab-{str(ip).replace('.', '-')}\n" for ip in SUBNET.hosts())
LAB_RESOLV = "# a lab host: no DNS here, lookups fail at once\nnameserver 127.0.0.1\n"


def _host_etc(ns: str) -> None:
    etc = NETNS_ETC / ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(LAB_HOSTS)
    (etc / "resolv.conf").write_text(LAB_RESOLV)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix: str = PREFIX, skip_live: bool = True) -> list[str]:
    """Remove namespaces (after killing their processes) and links whose name starts with
    `prefix`: leftovers of crashed runs of this module. With skip_live, names that encode the
    pid of a process still alive (a lab running right now, maybe in another pytest) are
    kept. Returns what was removed."""
    if not prefix.startswith(PREFIX):
        raise ValueError(f"prefix must start with {PREFIX!r}: only this module's names go")

    def stale(name: str) -> bool:
        if not name.startswith(prefix):
            return False
        owner = _OWNER.match(name)
        return not (skip_live and owner and _pid_alive(int(owner.group(1), 16)))

    removed = []
    # veths first (deleting one end removes the pair, even while its namespace is in use).
    for name in sorted(_link_names(), key=lambda n: n.endswith("br")):
        if stale(name) and _ip("link", "del", "dev", name, check=False).returncode == 0:
            removed.append(name)
    for ns in _netns_names():
        if stale(ns):
            _delete_netns(ns)
            removed.append(ns)
    for etc in NETNS_ETC.glob(prefix + "*") if NETNS_ETC.is_dir() else []:
        if stale(etc.name) and etc.name not in _netns_names():
            shutil.rmtree(etc, ignore_errors=True)
            removed.append(str(etc))
    return removed


@functools.lru_cache(maxsize=None)
def require_netns() -> None:
    """For a benchmark on namespace hosts: exit with why not, where a NetnsLab cannot run."""
    why = netns_available()
    if why:
        sys.exit(f"needs network namespaces: {why}")


def netns_available() -> str | None:
    """None if a NetnsLab can run here, else why not (for pytest.skip). Tries a throwaway
    namespace, with a bridge and a veth pair made inside it (the root namespace is not
    touched)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "needs iproute2 (`ip`)"
    probe = f"{PREFIX}{os.getpid() & 0xFFFFFF:06x}ff-probe"  # kept by cleanup_stale
    try:
        if (err := _ip("netns", "add", probe, check=False)).returncode != 0:
            return f"`ip netns add` fails: {err.stderr.strip()}"
        for args in (["link", "add", "name", "pbr", "type", "bridge"],
                     ["link", "add", "name", "pv0", "type", "veth", "peer", "name", "pv1"]):
            err = subprocess.run(["ip", "netns", "exec", probe, "ip", *args],
                                 capture_output=True, text=True)
            if err.returncode != 0:
                return f"`ip {' '.join(args)}` fails in a namespace: {err.stderr.strip()}"
        return None
    finally:
        if probe in _netns_names():
            _delete_netns(probe)


class NetnsHost:
    """One "instance": a namespace with eth0 at `ip`/24 on the lab's bridge."""

    def __init__(self, lab: "NetnsLab", ip: str, name: str, veth: str):
        self.lab, self.ip, self.name, self.veth = lab, ip, name, veth
        self.sshds: list[SSHD] = []
        self.procs: list[subprocess.Popen] = []

    def __repr__(self) -> str:
        return f"NetnsHost({self.ip}, netns={self.name})"

    def command(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def exec(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        """subprocess.run(cmd) inside the namespace; by default captured as text, check=True."""
        kw.setdefault("check", True)
        if not any(k in kw for k in ("stdout", "stderr", "capture_output")):
            kw["capture_output"] = True
        kw.setdefault("text", True)
        return subprocess.run(self.command(cmd), **kw)

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        """A background process inside the namespace (killed and reaped at lab exit)."""
        proc = subprocess.Popen(self.command(cmd), **kw)
        self.procs.append(proc)
        return proc

    def start_sshd(self, client_key: Path | str | None = None, port: int = 22) -> SSHD:
        """A real sshd listening on ip:port in this namespace, as the current user; it
        accepts `client_key` (default: the lab's shared key, lab.client_key)."""
        key = Path(client_key) if client_key else self.lab.client_key
        server = SSHD(self.lab.workdir / f"sshd-{self.ip}-{port}", host=self.ip, port=port,
                      client_key=key, netns=self.name)
        self.sshds.append(server)
        return server.start()

    def close(self) -> None:
        for server in self.sshds:
            server.stop()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        _kill_netns_processes(self.name)
        for proc in self.procs:
            proc.wait()


class NetnsLab:
    """A bridge holding GATEWAY (10.200.<n>.1/24) plus one namespace per add_host(); all
    removed on exit."""

    def __init__(self, workdir: Path | str | None = None, lock_timeout: float = 120.0,
                 clean_stale: bool = True):
        self.tag = f"{os.getpid() & 0xFFFFFF:06x}{next(_labs) & 0xFF:02x}"
        self.prefix = PREFIX + self.tag  # every name this lab creates starts with it
        self.bridge = self.prefix + "br"
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="netns-lab-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.lock_timeout = lock_timeout
        self.clean_stale = clean_stale
        self.hosts: dict[str, NetnsHost] = {}
        self._links: list[str] = []  # root-namespace links this lab created
        self._namespaces: list[str] = []
        self._lock_fd: int | None = None
        self._client_key: Path | None = None
        self.cleanup_errors: list[str] = []

    # --- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> "NetnsLab":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(raise_errors=exc_type is None)

    def start(self) -> "NetnsLab":
        try:
            self._lock()
            if self.clean_stale:
                cleanup_stale()
            self._check_subnet_free()
            self._links.append(self.bridge)
            _ip("link", "add", "name", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{GATEWAY}/{SUBNET.prefixlen}", "dev", self.bridge)
            _ip("link", "set", "dev", self.bridge, "up")
        except BaseException:
            self.close(raise_errors=False)
            raise
        return self

    def _lock(self) -> None:
        fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._lock_fd = fd
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RuntimeError(f"another NetnsLab holds {LOCK_FILE} (only one at a time)")
                time.sleep(0.1)

    def _check_subnet_free(self) -> None:
        """Refuse (touching nothing) if the root namespace already routes part of SUBNET."""
        for line in _ip("-4", "route", "show").stdout.splitlines():
            dst = line.split()[0]
            if dst == "default":
                continue
            if ipaddress.ip_network(dst, strict=False).overlaps(SUBNET):
                raise RuntimeError(f"{SUBNET} is already routed here ({line.strip()}); a "
                                   f"crashed lab's leftovers go with netns.cleanup_stale()")

    def close(self, raise_errors: bool = True) -> None:
        """Stop sshds, kill every process in each namespace, delete namespaces, veths and the
        bridge. Runs every step even if some fail; safe to call twice."""
        errors = []

        def attempt(what, fn, *args):
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - report all, after trying everything
                errors.append(f"{what}: {e}")

        for host in reversed(list(self.hosts.values())):
            attempt(f"stop {host.name}", host.close)
        for link in [name for name in reversed(self._links) if name != self.bridge]:
            if _link_exists(link):
                attempt(f"del link {link}", _ip, "link", "del", "dev", link)
        for ns in reversed(self._namespaces):
            attempt(f"del netns {ns}", _delete_netns, ns)
        if self.bridge in self._links and _link_exists(self.bridge):
            attempt(f"del bridge {self.bridge}", _ip, "link", "del", "dev", self.bridge)
        self.hosts.clear()
        self._links.clear()
        self._namespaces.clear()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        self.cleanup_errors += errors
        if errors:
            if raise_errors:
                raise RuntimeError("NetnsLab cleanup: " + "; ".join(errors))
            warnings.warn("NetnsLab cleanup: " + "; ".join(errors), stacklevel=2)

    # --- hosts ---------------------------------------------------------------------------
    @property
    def client_key(self) -> Path:
        """One client key (ed25519, no passphrase) that every start_sshd() accepts by default."""
        if self._client_key is None:
            key = self.workdir / "client_ed25519"
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                               check=True)
            self._client_key = key
        return self._client_key

    def add_host(self, ip: str) -> NetnsHost:
        if self._lock_fd is None:
            raise RuntimeError("NetnsLab not started (use `with NetnsLab() as lab`)")
        addr = ipaddress.ip_address(ip)
        if addr not in SUBNET or addr in (GATEWAY, SUBNET.network_address,
                                         SUBNET.broadcast_address):
            raise ValueError(f"host address {ip} must be a free host address in {SUBNET} "
                             f"other than {GATEWAY}")
        if ip in self.hosts:
            raise ValueError(f"{ip} is already a host of this lab")
        octet = str(addr).rsplit(".", 1)[1]
        ns, veth = f"{self.prefix}-{octet}", f"{self.prefix}v{octet}"
        assert len(veth) <= 15 and len(self.bridge) <= 15, (veth, self.bridge)
        host = NetnsHost(self, str(addr), ns, veth)
        self._namespaces.append(ns)
        _ip("netns", "add", ns)
        _host_etc(ns)
        self.hosts[host.ip] = host
        # The pair is born with its inner end already in the namespace, named eth0.
        self._links.append(veth)
        _ip("link", "add", "name", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", "dev", veth, "master", self.bridge)
        _ip("link", "set", "dev", veth, "up")
        inside = ["-n", ns]
        _ip(*inside, "addr", "add", f"{addr}/{SUBNET.prefixlen}", "dev", "eth0")
        _ip(*inside, "link", "set", "dev", "lo", "up")
        _ip(*inside, "link", "set", "dev", "eth0", "up")
        _ip(*inside, "route", "add", "default", "via", str(GATEWAY))
        return host

    def remove_host(self, ip: str) -> None:
        """Take one host away (an instance terminated): its processes, namespace and veth go,
        and its address may be given to a new host."""
        host = self.hosts.pop(ip)
        try:
            host.close()
        finally:
            if _link_exists(host.veth):
                _ip("link", "del", "dev", host.veth)
            _delete_netns(host.name)
            self._links.remove(host.veth)
            self._namespaces.remove(host.name)
