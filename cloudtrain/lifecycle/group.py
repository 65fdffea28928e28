"""Stage: every stage's hosts. The hosts a job runs on, as one value whatever their number,
and the connections this process keeps to them. It calls nothing of the lifecycle.

    NodeGroup                   the 1..N hosts of one attempt: their job directories, data
                                directories, the addresses their peers use, their instances;
                                `each(fn)` runs a step on every node (in parallel threads, one
                                connection each; for a group of one, just the call)
    host_of(job)                the host that has the job's directory (node 0's, or this
                                machine once its files were brought home)
    node_host(job, i)           node i's host
    keep(job_id, i, host)       remember a host the launch opened, so later steps reuse it
    opened(job_id)              node 0's host, if this process has it open
    forget(job_id)              close and forget node 0's connection
    forget_nodes(job_id)        close and forget the connections to nodes 1..

One SSH connection per host for the whole launch and every probe after it: hosts are opened
once and kept here, by (job id, node).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

from .. import nodes, providers
from ..errors import CloudtrainError
from ..host_kinds import from_description
from ..hosts import Host, close_quietly
from ..local_host import LocalHost
from ..ssh_host import SSHHost
from ..state import Job, Store

T = TypeVar("T")

# Hosts this process has opened: (job id, node) -> Host.
_open: dict[tuple[str, int], Host] = {}
_lock = threading.Lock()


@dataclass
class NodeGroup:
    """The hosts of one attempt at a job, node 0 first: node 0 is the job's host (and the
    rendezvous of a job on several machines); a job on one machine is a group of one."""

    job_id: str
    hosts: list[Host]
    jobdirs: list[str]
    data_dirs: list[str]
    addresses: list[str | None]  # what the other nodes reach each at (N > 1 only)
    instances: list[str | None]  # each node's instance id (N > 1 only)
    ifaces: list[str | None] | None = None  # the network interface of each (once set up)

    @classmethod
    def open(cls, store: Store, provider, job: Job, hosts: list[Host]) -> "NodeGroup":
        """The group of `hosts` (acquired for `job`), recorded as the job's host; a group of
        several also says which instance each node is."""
        n = len(hosts)
        jobdirs = nodes.each(lambda i: provider.jobdir(job.id, hosts[i]), n)
        many = n > 1
        group = cls(job.id, hosts, jobdirs, [provider.data_dir(h) for h in hosts],
                    [node_address(h) for h in hosts] if many else [None],
                    node_instances(store, job, n) if many else [None])
        store.update_job(job.id, host=group.record(), jobdir=jobdirs[0])
        if many:
            store.add_event(job.id, "nodes", detail=", ".join(
                f"node {i}: {group.instances[i] or hosts[i].name} ({group.addresses[i]})"
                for i in range(n)))
        return group

    @property
    def n(self) -> int:
        return len(self.hosts)

    def each(self, fn: Callable[[int], T]) -> list[T]:
        """fn(i) for every node, results in node order (nodes.each: threads for several
        nodes, the first failure raised naming its node; one node: the call itself)."""
        return nodes.each(fn, self.n)

    def record(self) -> dict:
        """The job's host record: node 0's description, and for several nodes each node's
        (how to reach it, its job directory, address, instance, interface)."""
        if self.n == 1:
            return self.hosts[0].describe()
        extra = [{"iface": f} for f in self.ifaces] if self.ifaces is not None \
            else [{}] * self.n
        return {**self.hosts[0].describe(), "nodes": [
            {**h.describe(), "jobdir": self.jobdirs[i], "address": self.addresses[i],
             "instance": self.instances[i], **extra[i]} for i, h in enumerate(self.hosts)]}

    @contextlib.contextmanager
    def store_for(self, store: Store) -> Iterator[Store]:
        """The store connection a node's step uses: the caller's for a group of one (the
        step runs in the caller's thread), else a connection of the step's own (SQLite
        connections are not shared between threads)."""
        if self.n == 1:
            yield store
            return
        with Store(store.path) as mine:
            yield mine


def node_address(host: Host) -> str:
    """Where the other nodes reach this one (the torchrun rendezvous): the address its
    provider found for it (a cloud instance's private IP, this machine's on the route to the
    others), else the address it is reached at."""
    if host.peer_address:
        return host.peer_address
    return host.endpoint.host if isinstance(host, SSHHost) else "127.0.0.1"


def node_instances(store: Store, job: Job, n: int) -> list[str | None]:
    """The instance id of each of the job's n nodes, in node order, by the node each live
    instance of the job records (None: no instance for that node)."""
    by_node = {}
    for inst in store.instances(job.id):
        node = (inst.details or {}).get("node")
        if inst.state != "terminated" and isinstance(node, int):
            by_node[node] = inst.id
    return [by_node.get(i) for i in range(n)]


def host_of(job: Job) -> Host:
    """The host that has the job's directory: its instance, or this machine once the job's
    files were collected here."""
    kind = (job.host or {}).get("kind")
    with _lock:
        cached = _open.get((job.id, 0))
    if cached is not None and type(cached).__name__ == kind:
        return cached
    if kind == "LocalHost" and job.backend != "local":
        host: Host = LocalHost((job.host or {}).get("tmux_socket", "cloudtrain"))
    else:
        host = providers.get(job.backend).host_for(job)
    keep(job.id, 0, host)
    return host


def node_host(job: Job, node: int) -> Host:
    """Node i's host: node 0 is host_of(job); node i's connection is opened once and kept
    (one SSH connection per node for the whole launch and every probe after it)."""
    if node == 0:
        return host_of(job)
    recs = nodes.records(job)
    if node >= len(recs):
        raise CloudtrainError(f"job {job.id} has no node {node} (it has {len(recs) or 1})")
    if recs[node].get("collected"):
        return LocalHost()
    with _lock:
        cached = _open.get((job.id, node))
        if cached is not None:
            return cached
        made = from_description(recs[node])
        _open[(job.id, node)] = made
        return made


def keep(job_id: str, node: int, host: Host) -> None:
    """Remember a host the launch opened, so later steps reuse its connection."""
    with _lock:
        _open[(job_id, node)] = host


def opened(job_id: str) -> Host | None:
    """Node 0's host, if this process has opened it."""
    with _lock:
        return _open.get((job_id, 0))


def forget(job_id: str) -> None:
    """Close and forget the connection to the job's host (node 0)."""
    with _lock:
        host = _open.pop((job_id, 0), None)
    close_quietly(host)


def forget_nodes(job_id: str) -> None:
    """Close and forget the job's connections to its nodes 1.. (gone or collected)."""
    with _lock:
        mine = [k for k in _open if k[0] == job_id and k[1] > 0]
        hosts = [_open.pop(k) for k in mine]
    for h in hosts:
        close_quietly(h)
