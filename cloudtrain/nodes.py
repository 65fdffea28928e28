"""Jobs that span several machines: one torchrun job over N nodes, node 0 the rendezvous.

    count(job)                  the nodes a job spans (1 for most)
    records(job)                each node's record: how to reach it, its job directory, the
                                address its peers use, its instance
    jobdir(job, i)              node i's job directory (on its host, or here once collected)
    each(fn, n)                 fn(i) for every node at once, in threads; results in node
                                order, the first failure raised naming its node
    rendezvous_script()         what one round trip on each node finds out: the network
                                interface that holds the node's address, and (node 0) a free
                                TCP port for the rendezvous
    torchrun_argv(...)          node i's torchrun: --nnodes N --node-rank i, the static c10d
                                rendezvous at node 0's address (global rank 0 is on node 0,
                                so node 0's metrics are rank 0's)
    environment(...)            CLOUDTRAIN_NODES, CLOUDTRAIN_NODE_RANK, MASTER_ADDR,
                                MASTER_PORT and the socket interface gloo and NCCL bind to
    combine(statuses)           the job's status from its nodes' agents: one node failing,
                                cancelled or interrupted ends the whole job

Each node runs its own agent in its own tmux, from the same run.sh apart from its rank; the
lifecycle (lifecycle/, over a group.NodeGroup, which also keeps the connections to the nodes)
launches, probes, stops, collects and releases all of them. Node 0's job directory is the
job's (its metrics, checkpoints and log are the job's); node i's files come home to
`jobs/<id>/nodes/<i>/`.
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TypeVar

from . import config
from .errors import CloudtrainError
from .state import Job

T = TypeVar("T")

NODES_DIR = "nodes"  # jobs/<id>/nodes/<i>/: node i's files, once brought home
MASTER_PORT = 29500  # torchrun's default; node 0 takes the first free port from here
# The agent states a node ends in, worst first: an interruption decides a recovering job's
# fate, then a failure (the node whose job failed first is the cause; the others' collective
# calls fail after it), then a stop at the job's budget (every node asks it), then a cancel.
_WORST = ("preempted", "failed", "stopped", "cancelled")


def count(job_or_spec) -> int:
    spec = job_or_spec.spec if isinstance(job_or_spec, Job) else job_or_spec
    n = getattr(spec, "nodes", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


def records(job: Job) -> list[dict]:
    """Each node's record, node 0 first; [] for a job on one machine (or one whose nodes
    were never all acquired)."""
    host = job.host or {}
    found = host.get("nodes")
    if host.get("collected_from") is not None:
        found = (host["collected_from"] or {}).get("nodes")
    return [n for n in found if isinstance(n, dict)] if isinstance(found, list) else []


def local_dir(job_id: str, node: int) -> Path:
    """Where node i's files come home ($CLOUDTRAIN_HOME/jobs/<id>/nodes/<i>)."""
    return config.home() / "jobs" / job_id / NODES_DIR / str(node)


def jobdir(job: Job, node: int) -> str | None:
    """Node i's job directory: node 0's is the job's; node i's own on its host, or here once
    its files were brought home."""
    if node == 0:
        return job.jobdir
    recs = records(job)
    if node >= len(recs):
        return None
    if recs[node].get("collected"):
        return str(local_dir(job.id, node))
    return recs[node].get("jobdir")


class NodeError(CloudtrainError):
    """A step failed on one node; `node` says which."""

    def __init__(self, node: int, exc: BaseException):
        message = exc.message if isinstance(exc, CloudtrainError) else f"{type(exc).__name__}: {exc}"
        super().__init__(f"node {node}: {message}",
                         hint=exc.hint if isinstance(exc, CloudtrainError) else None)
        self.node = node
        self.cause = exc


def each(fn: Callable[[int], T], n: int, max_workers: int = 32) -> list[T]:
    """fn(0) ... fn(n-1) at once (threads: each node's step is mostly waiting on its own
    connection), results in node order. Every call is waited for; then the first failure in
    node order is raised as a NodeError (KeyboardInterrupt as itself)."""
    if n == 1:
        return [fn(0)]
    results: list = [None] * n
    errors: dict[int, BaseException] = {}

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported below, in node order
            errors[i] = exc

    with ThreadPoolExecutor(max_workers=min(n, max_workers),
                            thread_name_prefix="cloudtrain-node") as pool:
        list(pool.map(run, range(n)))
    if errors:
        first = min(errors)
        exc = errors[first]
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        if isinstance(exc, NodeError):
            raise exc
        raise NodeError(first, exc) from exc
    return results


# What one round trip on a node finds out (stdlib Python on the host): the interface that
# holds ADDRESS (gloo and NCCL bind to it: a hostname that resolves elsewhere, or to
# 127.0.1.1, would otherwise be announced to the peers), and with PORT a free TCP port from
# there (node 0's rendezvous).
_PROBE = r"""
import fcntl, socket, struct, sys
address, port = sys.argv[1], int(sys.argv[2])
name = ""
for _, ifname in socket.if_nameindex():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))
        if socket.inet_ntoa(raw[20:24]) == address:
            name = ifname
            break
    except OSError:
        pass
    finally:
        s.close()
found = 0
while port and port < 65536 and not found:
    s = socket.socket()
    try:
        s.bind(("", port))
        found = port
    except OSError:
        port += 1
    finally:
        s.close()
print(name)
print(found)
"""


def rendezvous_script(python: str, address: str, port: int = 0) -> str:
    return shlex.join([python, "-c", _PROBE, address, str(port)])


def read_rendezvous(stdout: str) -> tuple[str | None, int | None]:
    """(interface, port) from rendezvous_script's output (untrusted: checked)."""
    import re

    lines = (stdout or "").splitlines() + ["", ""]
    said = lines[0].strip()
    iface = said if re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", said) else None
    port = lines[1].strip()
    port_n = int(port) if port.isdigit() and 0 < int(port) < 65536 else None
    return iface, port_n


def torchrun_argv(python: str, nodes: int, rank: int | str, procs: int, master: str,
                  port: int | str, job_id: str) -> list[str]:
    """Node `rank`'s torchrun: static rendezvous (the c10d TCPStore on node 0 at
    master:port), so node ranks are the nodes' own and global rank 0 runs on node 0. Rank
    and port may be placeholders that the node fills in (scripts.NODE_RANK_VAR)."""
    return [python, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--node-rank={rank}",
            f"--nproc-per-node={procs}", f"--master-addr={master}", f"--master-port={port}",
            f"--rdzv-id={job_id}"]


def environment(nodes: int, rank: int, master: str, port: int, iface: str | None,
                efa: dict | None = None) -> dict:
    """What every process of node `rank` sees besides the single-node variables."""
    env = {"CLOUDTRAIN_NODES": str(nodes), "CLOUDTRAIN_NODE_RANK": str(rank),
           "MASTER_ADDR": master, "MASTER_PORT": str(port)}
    if iface:
        env["GLOO_SOCKET_IFNAME"] = iface
        env["NCCL_SOCKET_IFNAME"] = iface
    env.update(efa or {})
    return env


def combine(statuses: list[dict | None]) -> dict:
    """The job's status from its nodes' agents (None: a node not heard from). Node 0's
    record (its pid, metrics, checkpoint uploads) with the job's state: the worst node's
    end once any node has ended badly (its reason names the node; of failures, a node whose
    instance is gone (`instance_lost`) first, then the earliest), succeeded once every
    node has, else running."""
    first = dict(statuses[0] or {})
    ended = [(i, s) for i, s in enumerate(statuses) if s and s.get("state") in _WORST]
    if ended:
        # A node whose instance is gone is the cause of the others' failures, though its end
        # is only found after theirs (when a probe cannot reach it and EC2 says it is gone).
        ended.sort(key=lambda p: (_WORST.index(p[1]["state"]), not p[1].get("instance_lost"),
                                  p[1].get("ended_at") or 0, p[0]))
        i, worst = ended[0]
        reason = worst.get("reason") or worst["state"]
        combined = {**first, "state": worst["state"], "exit_code": worst.get("exit_code"),
                    "ended_at": worst.get("ended_at"),
                    "reason": reason if len(statuses) == 1 else f"node {i}: {reason}"}
        if worst.get("interruption") is not None:
            combined["interruption"] = worst["interruption"]
        return combined
    if statuses and all(s and s.get("state") == "succeeded" for s in statuses):
        return {**first, "ended_at": max((s or {}).get("ended_at") or 0 for s in statuses) or
                first.get("ended_at")}
    if first.get("state") == "succeeded":  # node 0 is done, the others are still finishing
        first.update(state="running", ended_at=None, exit_code=None)
    return first


def summary(statuses: list[dict | None]) -> list[dict]:
    """What `status` keeps of each node's agent status (state, exit code, reason, heartbeat)."""
    out = []
    for s in statuses:
        s = s or {}
        out.append({k: s.get(k) for k in ("state", "exit_code", "reason", "heartbeat_at",
                                          "started_at", "ended_at")})
    return out
