"""Which Host a describe() record names (a job's `host`, a node's record): LocalHost or
SSHHost. Above hosts.py, local_host.py and ssh_host.py, which it imports."""

from __future__ import annotations

from .errors import HostError
from .hosts import Host
from .local_host import LocalHost
from .ssh_host import SSHHost


def from_description(info: dict) -> Host:
    """The host a describe() record names (a job's `host`, a node's record): this machine,
    or one reached over SSH with its pinned host key."""
    kind = info.get("kind")
    if kind == "LocalHost":
        return LocalHost(info.get("tmux_socket") or "cloudtrain", info.get("python"))
    if kind == "SSHHost" and info.get("host"):
        from .ssh import Endpoint

        endpoint = Endpoint(info["host"], info.get("port") or 22, info.get("user") or "ubuntu",
                            info.get("key_path"), info.get("host_key"))
        return SSHHost(endpoint, info.get("tmux_socket") or "cloudtrain",
                       info.get("python") or "python3")
    raise HostError(f"no way to reach a host recorded as {str(kind)[:40]!r}")
