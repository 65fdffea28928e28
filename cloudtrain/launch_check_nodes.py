"""`cloudtrain check --launch --nodes N`: a job on several nodes proved on your own account, for
cents, before a multi-node run depends on it.

`check --launch` proves one instance. A job on several nodes depends on more: N instances from
one RunInstances in one AZ and one cluster placement group, the security group that admits
the nodes to each other on every port (torch's rendezvous on one, gloo's and NCCL's data on
others), and the rendezvous settings each node gets (CLOUDTRAIN_NODES, CLOUDTRAIN_NODE_RANK,
MASTER_ADDR, MASTER_PORT). This launches N small instances of NODES_TYPE (the cheapest x86_64
type a cluster placement group takes: burstable T types are not) through the real multi-node
path, runs on every node a script that meets node 0 at the rendezvous port and again at a
second port node 0 opens, and echoes 1 MiB each way, then takes everything down and shows
the bill. Each step is timed and judged on one line, as `check --launch`'s are.

    run(nodes=2, region=None, say=None, confirm=None) -> Report   (launch_check's report)

What it does not prove: EFA (an EFA type costs dollars an hour a node), nor NCCL on GPUs.

This module holds the flow's steps; launch_check runs them between its resources and its
teardown.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from . import config, nodes as node_files, state
from .errors import CloudtrainError, UsageError
from .launch_check import JOB_END_WAIT_S, ended_job, priced_type, run as run_check, \
    wait_for_job
from .launch_check_steps import Check, Flow, Report, Step, Steps

# The cheapest x86_64 Nitro type a cluster placement group takes ("Cluster placement groups":
# not burstable T types), and its us-east-1 on-demand price for when the Price List API
# cannot be asked. A reasoned choice from AWS's price list, not measured here.
NODES_TYPE = "c6a.large"
NODES_TYPE_PRICE = ("us-east-1", 0.0765)
MAX_NODES = 4
MAX_RUNTIME_MINUTES = 10
SCRIPT = "check-nodes.py"
PAYLOAD = 1 << 20  # bytes echoed each way between a node and node 0
MET = re.compile(r"^node (\d+) met node 0 at (\S+): ports (\d+) and (\d+), 1 MiB each way "
                 r"in (\d+) ms$", re.M)

# Stdlib only: the image's python3. Node 0 listens at MASTER_PORT and at a second port it
# picks; each other node says hello at the first, learns the second, sends 1 MiB there and
# gets it back. Every node prints what it met, then the check's own line.
_BODY = r'''import hashlib, os, socket, sys, time

rank, nodes = int(os.environ["CLOUDTRAIN_NODE_RANK"]), int(os.environ["CLOUDTRAIN_NODES"])
master, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
payload = hashlib.sha256(b"cloudtrain").digest() * (PAYLOAD // 32)
deadline = time.time() + 240


def whole(conn, n):
    got = b""
    while len(got) < n:
        chunk = conn.recv(min(65536, n - len(got)))
        if not chunk:
            raise SystemExit(f"node {rank}: the connection closed after {len(got)} bytes")
        got += chunk
    return got


def connect(address):
    while True:
        try:
            return socket.create_connection(address, timeout=30)
        except OSError as exc:
            if time.time() > deadline:
                raise SystemExit(f"node {rank}: could not reach {address}: {exc}")
            time.sleep(1)


if rank == 0:
    first = socket.create_server(("", port))
    second = socket.create_server(("", 0))
    other = second.getsockname()[1]
    first.settimeout(240)
    second.settimeout(240)
    for _ in range(nodes - 1):
        hello, where = first.accept()
        peer = int(whole(hello, 8).decode())
        hello.sendall(b"%08d" % other)
        data, _ = second.accept()
        data.sendall(whole(data, len(payload)))
        print(f"node 0 met node {peer} from {where[0]}", flush=True)
else:
    start = time.time()
    hello = connect((master, port))
    hello.sendall(b"%08d" % rank)
    other = int(whole(hello, 8).decode())
    data = connect((master, other))
    data.sendall(payload)
    if whole(data, len(payload)) != payload:
        raise SystemExit(f"node {rank}: node 0 sent back other bytes")
    ms = int((time.time() - start) * 1000)
    print(f"node {rank} met node 0 at {master}: ports {port} and {other}, 1 MiB each way "
          f"in {ms} ms", flush=True)
'''


def script(line: str) -> str:
    """The script every node runs; it ends by printing `line` (the check's own)."""
    return _BODY.replace("PAYLOAD", str(PAYLOAD)) + f"print({line!r})\n"


def run(nodes: int = 2, region: str | None = None,
        say: Callable[[Step], None] | None = None,
        confirm: Callable[[str], None] | None = None) -> Report:
    if not 2 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes {nodes}: the check runs on 2 to {MAX_NODES} nodes",
                         hint="cloudtrain check --launch --nodes 2")
    return run_check(region=region, say=say, confirm=confirm, flow=Flow(
        name="nodes", spot=False, requires=lambda c: _requires(c, nodes),
        job=lambda c: _spec_args(c, nodes), steps=lambda c, steps, job: _steps(c, steps, job,
                                                                              nodes),
        question=lambda c, report: _question(c, report, nodes),
        instance_type=lambda c: priced_type(c, NODES_TYPE, NODES_TYPE_PRICE)))


def _requires(c: Check, nodes: int) -> str:
    return (f"{nodes} nodes of {NODES_TYPE} from one RunInstances, in one AZ and one cluster "
            "placement group; they reach each other through the security group cloudtrain")


def _question(c: Check, report: Report, nodes: int) -> str:
    minutes = c.provider.power_off_minutes(MAX_RUNTIME_MINUTES * 60)
    return (f"This launches {nodes} on-demand {report.instance_type} in {c.region} for a few "
            f"minutes, billed per second (60 s minimum) at ${report.price_per_hour:.4f}/h "
            f"each; each powers itself off after {minutes} min at the latest.")


def _spec_args(c: Check, nodes: int) -> dict:
    assert c.workdir is not None
    (Path(c.workdir) / SCRIPT).write_text(script(c.line))
    c.synced = SCRIPT
    return {"command": (f"python3 {SCRIPT}",), "nodes": nodes, "spot": False,
            "max_runtime": MAX_RUNTIME_MINUTES}


def _steps(c: Check, steps: Steps, job, nodes: int) -> state.Job:
    """After the launch: where the nodes are, then what each said it met. Returns the job
    as it ended."""
    store = c.store
    with steps.step("placement") as s:
        found = [i for i in store.instances(job.id)]
        zones = sorted({i.zone for i in found if i.zone})
        if len(found) != nodes or len(zones) != 1:
            raise CloudtrainError(f"the job has {len(found)} instance(s) in "
                                  f"{', '.join(zones) or 'no AZ'}, not {nodes} in one AZ")
        s.detail = (f"{', '.join(i.id for i in found)} in {zones[0]}, one cluster placement "
                    "group")
        s.data = {"instances": [i.id for i in found], "zone": zones[0]}
    with steps.step("meeting") as s:
        job = wait_for_job(lambda: ended_job(c, job), JOB_END_WAIT_S, "the job's end", c, job)
        if job.state != state.SUCCEEDED:
            raise CloudtrainError(f"the nodes' job {job.state}: {job.reason or 'no reason'}",
                                  hint=f"cloudtrain logs {job.id} shows node 0's output; the "
                                       "security group cloudtrain must admit its members on "
                                       "every port (infra/README.md)")
        met = []
        for rank in range(nodes):
            log = (Path(node_files.local_dir(job.id, rank)) if rank
                   else config.home() / "jobs" / job.id) / "output.log"
            out = log.read_text(errors="replace") if log.exists() else ""
            if c.line not in out:
                raise CloudtrainError(f"node {rank}'s log did not come home, or lacks the "
                                      "check's line", hint=f"cloudtrain logs {job.id}")
            if rank:
                found_met = MET.search(out)
                if not found_met or int(found_met[1]) != rank:
                    raise CloudtrainError(f"node {rank} did not say it met node 0",
                                          hint=f"cloudtrain logs {job.id}")
                met.append((rank, found_met[2], int(found_met[3]), int(found_met[4]),
                            int(found_met[5])))
        s.detail = "; ".join(f"node {r} met node 0 at {a} on ports {p} and {q}, 1 MiB each "
                             f"way in {ms} ms" for r, a, p, q, ms in met)
        s.data = {"met": [{"node": r, "address": a, "ports": [p, q], "ms": ms}
                          for r, a, p, q, ms in met]}
    return job
