"""The embedded default: this machine, no cloud account, nothing that bills.

A job on several machines (--nodes N) runs node 0 here and nodes 1.. on the hosts listed in
config.yaml's `local_nodes:`, over SSH (a lab, a few workstations; the tests use network
namespaces), with the same agent, torchrun rendezvous and lifecycle as on a cloud.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time

from .. import config
from ..errors import ConfigError, HostError, MissingDependency, UsageError
from ..hosts import Host, default_tmux_socket
from ..local_host import LocalHost
from ..ssh_host import SSHHost
from ..progress import SILENT, Reporter
from .base import Question
from ..state import Instance, Job, Store

NODE_PATTERN = re.compile(r"(?:([A-Za-z_][\w.-]{0,31})@)?([A-Za-z0-9][A-Za-z0-9.-]{0,252})"
                          r"(?::(\d{1,5}))?")
KNOWN_NODES = "known_nodes.json"  # host keys of local_nodes, pinned on first contact


def parse_nodes(text: str, key: str) -> list[tuple[str, str, int]]:
    """config.yaml's local_nodes as [(user, host, port)]; a ConfigError names a bad entry."""
    out = []
    for entry in [e.strip() for e in (text or "").split(",") if e.strip()]:
        m = NODE_PATTERN.fullmatch(entry)
        port = int(m.group(3)) if m and m.group(3) else 22
        if not m or not 1 <= port <= 65535:
            raise ConfigError(f"config.yaml local_nodes: {config.shown(entry)} is not "
                              "[user@]host[:port]")
        out.append((m.group(1) or "root", m.group(2), port))
    if out and not key:
        raise ConfigError("config.yaml: local_nodes needs local_nodes_key (the private key "
                          "that logs in to them)")
    return out


class LocalProvider:
    name = "local"

    def __init__(self, settings: config.Settings | None = None):
        self.settings = settings or config.Settings.load()

    def _host(self, tmux: str | None = None, python: str | None = None) -> LocalHost:
        return LocalHost(tmux or default_tmux_socket(), python or self.settings.python or None)

    def preflight(self, spec) -> None:
        host = self._host()
        host.require_tmux()
        if getattr(spec, "nodes", 1) > 1:
            listed = parse_nodes(self.settings.local_nodes, self.settings.local_nodes_key)
            if len(listed) < spec.nodes - 1:
                what = getattr(spec, "origins", {}).get("nodes", f"--nodes {spec.nodes}")
                raise UsageError(
                    f"{what}: the local backend runs node 0 here and the others on the hosts "
                    f"in config.yaml's local_nodes:, which lists {len(listed)}",
                    hint="add hosts (local_nodes: user@10.0.0.2, user@10.0.0.3 and "
                         "local_nodes_key: ~/.ssh/id_ed25519), or launch on a cloud "
                         "(--instance TYPE)")
        if spec.requires:
            missing = host.missing_modules(spec.requires)
            if missing:
                raise MissingDependency(
                    f"{spec.display()} needs the Python modules {', '.join(missing)}, "
                    f"which {host.python} lacks",
                    hint="pip install 'cloudtrain[recipes]' (torch and torchvision) into this "
                         "environment, or set `python:` in config.yaml to one that has them")

    def acquire(self, store: Store, job: Job, spec, report: Reporter = SILENT) -> list[Host]:
        """This machine; for a job on several, this machine as node 0 and the first
        spec.nodes - 1 hosts of local_nodes, each reached over SSH once (its host key pinned
        in $CLOUDTRAIN_HOME/known_nodes.json on first contact, refused if it changes) and
        recorded as the job's instances."""
        if getattr(spec, "nodes", 1) <= 1:
            report.phase("running on this machine (local backend)")
            store.add_instance(Instance(
                id=f"local-{job.id}", job_id=job.id, provider=self.name, region=None,
                zone=None, instance_type="local", market="local", state="running",
                launched_at=time.time(), terminated_at=None, price_per_hour=0.0, details=None))
            return [self._host()]
        from .. import nodes
        from ..ssh import Endpoint

        listed = parse_nodes(self.settings.local_nodes, self.settings.local_nodes_key)
        listed = listed[:spec.nodes - 1]
        key = os.path.expanduser(self.settings.local_nodes_key)
        known = self._known_nodes()
        report.phase(f"node 0 is this machine; reaching {len(listed)} more over SSH: "
                     + ", ".join(f"{u}@{h}:{p}" for u, h, p in listed))

        def reach(i: int) -> Host:
            if i == 0:
                return self._host()
            user, address, port = listed[i - 1]
            label = f"{user}@{address}:{port}"
            host = SSHHost(Endpoint(address, port, user, key, known.get(label)),
                           default_tmux_socket(), "python3")
            try:
                host.home()
            except HostError as exc:
                raise HostError(f"local node {label}: {exc.message}", hint=exc.hint) from exc
            return host

        hosts = nodes.each(reach, spec.nodes)
        self._pin(known, hosts[1:], listed)
        remote = [h for h in hosts[1:] if isinstance(h, SSHHost)]  # every node but 0 (reach)
        hosts[0].peer_address = self.settings.node_address or self._address_towards(
            remote[0].endpoint.host, remote[0].endpoint.port)
        for h in remote:
            h.peer_address = h.endpoint.host
        now = time.time()
        for i, node in enumerate(hosts):
            store.add_instance(Instance(
                id=f"local-{job.id}" + (f"-n{i}" if i else ""), job_id=job.id,
                provider=self.name, region=None, zone=None, instance_type="local",
                market="local", state="running", launched_at=now, terminated_at=None,
                price_per_hour=0.0, details={"node": i, "host": node.name}))
        return hosts

    def _known_nodes(self) -> dict:
        path = config.home() / KNOWN_NODES
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)} \
            if isinstance(found, dict) else {}

    def _pin(self, known: dict, hosts: list, listed: list) -> None:
        updated = dict(known)
        for h, (user, address, port) in zip(hosts, listed):
            updated[f"{user}@{address}:{port}"] = h.endpoint.host_key
        if updated != known:
            config.write_private(config.home() / KNOWN_NODES,
                                 json.dumps(updated, indent=1).encode())

    @staticmethod
    def _address_towards(address: str, port: int) -> str:
        """This machine's address on the route to `address` (no packet is sent: a UDP
        socket's connect only picks the route)."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((address, port))
            return s.getsockname()[0]

    def host_for(self, job: Job) -> LocalHost:
        info = job.host or {}
        return self._host(info.get("tmux_socket"), info.get("python"))

    def setup(self, host: Host) -> str | None:
        """Nothing to install here: preflight checked tmux and the Python modules. A local
        node over SSH must have python3 and tmux itself (`remote_python:` for one with the
        job's modules)."""
        if not isinstance(host, SSHHost):
            return None
        found = host.run("command -v python3; printf 'tmux:'; command -v tmux",
                         check=False).stdout.splitlines()
        if "tmux:" in found or not found or found[0].startswith("tmux:"):
            from ..hosts import TMUX_INSTALL_HINT

            raise MissingDependency(f"{host.name} needs python3 and tmux",
                                    hint=TMUX_INSTALL_HINT)
        # `remote_python:` names the interpreter with torch there, as for cloud instances.
        host.python = self.settings.remote_python or found[0]
        return None

    def gpus(self, spec, host: Host) -> int:
        return host.gpu_count()

    def jobdir(self, job_id: str, host: Host | None = None) -> str:
        if isinstance(host, SSHHost):
            return f"{host.home()}/.cloudtrain/jobs/{job_id}"
        return str(config.home() / "jobs" / job_id)

    def data_dir(self, host: Host | None = None) -> str:
        if isinstance(host, SSHHost):
            return f"{host.home()}/.cloudtrain/data"
        return str(config.home() / "data")

    def results_grant(self, store: Store, job: Job, spec, node: int = 0
                      ) -> tuple[dict | None, str | None]:
        return None, None  # the job directory is here already, and outlives nothing

    def checkpoint_plan(self, store: Store, job: Job, expires_s: float) -> dict | None:
        return None  # a job here is never relaunched elsewhere: its checkpoints stay put

    def plan(self, spec) -> list[tuple[str, str]]:
        self.preflight(spec)
        rows = [("backend", "local (this machine)"), ("runs", spec.display())]
        if spec.nodes > 1:
            listed = parse_nodes(self.settings.local_nodes, self.settings.local_nodes_key)
            rows.append(("nodes", f"{spec.nodes}: this machine (node 0, the rendezvous) and "
                                  + ", ".join(f"{u}@{h}:{p}" for u, h, p in
                                              listed[:spec.nodes - 1]) + " over SSH"))
        if spec.kind == "recipe":  # refused here as the launch refuses it
            gpus = self._host().gpu_count()
            procs = spec.processes(gpus)
            rows.append(("processes", f"{procs} ({gpus} GPU(s) here)" + (
                f" per node x {spec.nodes} nodes under torchrun" if spec.nodes > 1 else "")))
        ask = self.question(spec)
        rows += [("WARNING", warning) for warning in (ask.warnings if ask else [])]
        return rows + [("max runtime", f"{spec.max_runtime_s / 60:g} min"), ("cost", "$0.00")]

    def question(self, spec) -> Question | None:
        """A GPU recipe's full run on a machine without a GPU would take hours (and be
        stopped at its max runtime): said, and asked, before it starts; Enter says no where
        the run is predicted to fail."""
        from ..preflight import cpu_warning

        if spec.kind != "recipe" or spec.profile or self._host().gpu_count():
            return None
        found = cpu_warning(spec)
        return None if found is None else Question(None, [found[0]], default=not found[1])

    def instance_states(self, store: Store, job: Job) -> dict[str, dict]:
        return {}  # this machine is always there

    def cleanup(self, store: Store, regions: set[str] | None = None) -> list[str]:
        return []  # no shared cloud resources

    def release(self, store: Store, job: Job, force: bool = False) -> None:
        for inst in store.instances(job.id):
            if inst.state != "terminated":
                store.update_instance(inst.id, state="terminated", terminated_at=time.time())
