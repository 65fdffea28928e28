"""A job on several nodes of an EC2 Auto Scaling group, as processes on this machine (no root):
the host side's whole regroup path (agent, regroup.Team, bootstrap's attempt and meeting, the
checkpoint stream and restore) against moto's S3, EC2 and Auto Scaling, with AWS's timings
made short, so a test can run many orders and delays of faults where the namespace lab
(labs.asg, tests/e2e) runs one.

Every node is an instance of the group in moto (its id and private address are moto's); on
this machine it is a folder (its disk: the job directory and the agent's files), a fake IMDS
of its own (labs.imds: its identity, the role's credentials, its spot notice) and the
processes that carry LAB_NODE=<its instance id> in their environment. What is real: the
agent (agent.py run, from the shipped files), its Team, bootstrap.enter_job on a replacement
(take_attempt, meet_others, join_attempt), the records in S3, EC2's answers, the group's end
(DeleteAutoScalingGroup with the role). What stands in:

- **The job** (JOB below): N ranks that take each step together through files in a folder
  all nodes share (a collective): a rank whose peer stopped beating fails at once, as gloo
  does when a peer's connection drops; a SIGTERM on any rank is agreed at the next step
  (common.stopping), and all exit 143 after rank 0 saved. Rank 0 saves a checkpoint every
  `every` steps (renamed into place, with checkpoint-info.json) and resumes from the one in
  its job directory, as each rank does after a restore.
- **AWS's part** (the Cloud thread): an instance that powers off (the agent's shutdown
  command) or is taken back (`take_back`, with or without a notice first) is terminated in
  moto, and its processes killed; moto's group replaces it at once, and the replacement
  boots after `boot_s`: its job files are the launch's (the bundle, unpacked), then
  bootstrap.enter_job, then the agent, as user-data's bootstrap.py does. A deleted group's
  instances go with it.

    with GroupNodes(endpoint, tmp, monkeypatch, nodes=3, steps=40) as lab:
        lab.wait_step(10); lab.take_back(lab.node(rank=1)); lab.wait_end()
        lab.final(), lab.attempts(), lab.launched, lab.log(instance)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3

from cloudtrain.hosts import write_host_files

from .aws import instance_store
from .imds import FakeIMDS
from .polling import wait_for

REGION = "us-east-1"
BUCKET = "cloudtrain-123456789012-us-east-1"
OWNER = "AIDAEXAMPLEOWNER0001"
JOB_ID = "nodes01"
PREFIX = f"jobs/{OWNER}/{JOB_ID}/"
GROUP = f"cloudtrain-{JOB_ID}"

# AWS's and the host side's waits, made short (module.NAME: seconds) in every node's process.
TIMING = {"regroup.WATCH_S": 0.2, "regroup.MEET_POLL_S": 0.2, "regroup.LOST_WAIT_S": 3.0,
          "regroup.STOP_GRACE_S": 2.0, "regroup.END_WAIT_S": 8.0, "regroup.PEERS_S": 1.0,
          "regroup.REPLACE_WAIT_S": 60.0, "regroup.MEET_WAIT_S": 30.0,
          "checkpoint_stream.LOOK_S": 0.1}

# A node's process: the agent, or a replacement's boot (bootstrap.enter_job, then the agent).
NODE_MAIN = r"""
import json, os, sys
mode, here, root = sys.argv[1:4]
sys.path.insert(0, here)
from cloudtrain_host import (agent_progress, auto_scaling, bootstrap, bundle_reader,
                             checkpoint_stream, regroup)
for name, value in json.loads(os.environ["LAB_TIMING"]).items():
    module, attr = name.split(".")
    setattr(sys.modules["cloudtrain_host." + module], attr, value)
if mode == "agent":
    from cloudtrain_host import agent
    sys.exit(agent.main(["run", root]))
job = json.load(open(os.path.join(root, "job.json")))
conf = auto_scaling.settings(job)
imds = job["imds_url"]
bundle = bundle_reader.Bundle(conf["bucket"], conf["prefix"], conf["store_region"],
                              conf["endpoint"], imds)
try:
    bundle.credentials()
    bootstrap.enter_job(bundle, root, job, conf, imds)
except bundle_reader.Failed as exc:
    line = " ".join(str(exc).split())[:500]
    print("bootstrap: %s" % line, flush=True)
    if exc.code in bootstrap.GIVE_UP:
        args = type("Args", (), {"prefix": conf["prefix"], "group": conf["group"],
                                 "region": conf["region"], "endpoint": conf["endpoint"],
                                 "imds": imds})
        print("bootstrap: %s" % bootstrap.give_up(args, root, bootstrap.COULD_NOT_START % line),
              flush=True)
    if exc.code not in (bundle_reader.EXIT_ENDED, bundle_reader.EXIT_RESTARTS):
        bootstrap.power_off(job, root)  # the boot script's power-off
    sys.exit(exc.code)
os.execv(sys.executable, [sys.executable, __file__, "agent", here, root])
"""

# The job: ranks that step together through a shared folder (see the docstring).
JOB = r"""
import json, os, signal, sys, threading, time
total, every, step_s, end_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
rank = int(os.environ.get("CLOUDTRAIN_NODE_RANK", "0"))  # a job on one node has no rank set
nodes = int(os.environ.get("CLOUDTRAIN_NODES", "1"))
attempt = os.environ["CLOUDTRAIN_ATTEMPT"]
jobdir = os.environ["CLOUDTRAIN_JOB_DIR"]
room = os.path.join(os.environ["LAB_SHARED"], "attempt-" + attempt)
os.makedirs(room, exist_ok=True)
ck = os.path.join(jobdir, "checkpoints")
os.makedirs(ck, exist_ok=True)
state = os.path.join(ck, "state.json")
step = json.load(open(state))["step"] if os.path.exists(state) else 0
print("attempt %s rank %d of %d starts at step %d" % (attempt, rank, nodes, step), flush=True)
stopping = []
signal.signal(signal.SIGTERM, lambda *a: stopping.append(1))
def beat():
    mine = os.path.join(room, "alive-%d" % rank)
    while True:
        with open(mine, "w") as f:
            f.write(str(time.time()))
        time.sleep(0.05)
threading.Thread(target=beat, daemon=True).start()
def save(step):
    for name, doc in (("state.json", {"step": step}),
                      ("checkpoint-info.json", {"step": step, "epoch": None})):
        tmp = os.path.join(ck, "." + name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, os.path.join(ck, name))
def together(step):
    # every rank at `step` (a collective); a peer that stopped beating fails it, as gloo does
    if stopping:
        open(os.path.join(room, "stop-%d" % step), "w").close()
    open(os.path.join(room, "at-%d-%d" % (step, rank)), "w").close()
    started = time.time()
    while not all(os.path.exists(os.path.join(room, "at-%d-%d" % (step, r)))
                  for r in range(nodes)):
        for r in range(nodes):
            path = os.path.join(room, "alive-%d" % r)
            try:
                age = time.time() - os.stat(path).st_mtime
            except FileNotFoundError:  # not started yet: torchrun's rendezvous waits for it
                age = 0.0 if time.time() - started < 60 else 60.0
            if age > 1.0:
                print("rank %d: lost peer rank %d at step %d" % (rank, r, step), flush=True)
                sys.exit(1)
        time.sleep(0.01)
    return os.path.exists(os.path.join(room, "stop-%d" % step))
metrics = open(os.path.join(jobdir, "metrics.jsonl"), "a")
while step < total:
    if together(step + 1):
        if rank == 0:
            save(step)
        print("rank %d: stopped at step %d" % (rank, step), flush=True)
        sys.exit(143)
    time.sleep(step_s)
    step += 1
    if rank == 0:
        metrics.write(json.dumps({"step": step, "time": time.time(), "attempt": attempt}) + "\n")
        metrics.flush()
        if step % every == 0 or step == total:
            save(step)
if rank == 0:
    time.sleep(end_s)  # its last save, an evaluation: the others have ended already
print("rank %d: done at step %d" % (rank, step), flush=True)
"""


class Node:
    """One instance of the group, as this machine holds it."""

    def __init__(self, lab, instance: str, address: str):
        self.lab, self.id, self.address = lab, instance, address
        self.dir = lab.tmp / "nodes" / instance
        self.jobdir = self.dir / "jobs" / JOB_ID
        self.agent_dir = self.dir / "agent"
        self.imds = FakeIMDS(role="ct-instance")
        self.imds.metadata["127.0.0.1"] = {
            "/latest/meta-data/instance-id": instance,
            "/latest/meta-data/local-ipv4": address,
            "/latest/meta-data/placement/availability-zone": "us-east-1a",
            "/latest/meta-data/instance-type": "g5.xlarge",
            "/latest/meta-data/instance-life-cycle": "spot"}
        self.gone = False
        self.procs: list[subprocess.Popen] = []

    def start(self, mode: str) -> None:
        env = dict(os.environ, LAB_NODE=self.id, LAB_SHARED=str(self.lab.shared),
                   LAB_TIMING=json.dumps(self.lab.timing))
        log = open(self.dir / f"{mode}.log", "ab")
        self.procs.append(subprocess.Popen(
            [sys.executable, str(self.lab.main), mode, str(self.agent_dir), str(self.jobdir)],
            cwd=self.jobdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True))
        log.close()

    def status(self) -> dict:
        try:
            return json.loads((self.jobdir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def powered_off(self) -> bool:
        return (self.dir / "off").exists()

    def kill(self) -> None:
        """Every process of this instance, as its termination ends them."""
        self.gone = True
        for _ in range(3):
            for pid in _pids_with(f"LAB_NODE={self.id}"):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.05)
        for p in self.procs:
            p.wait(timeout=10)
        self.imds.close()


def _pids_with(marker: str) -> list[int]:
    found = []
    needle = marker.encode() + b"\0"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


class GroupNodes:
    """The job's group in moto, its nodes on this machine, and AWS's part (a thread)."""

    def __init__(self, endpoint: str, tmp: Path, monkeypatch, nodes: int = 3, steps: int = 40,
                 every: int = 5, step_s: float = 0.1, end_s: float = 0.0, boot_s: float = 1.0,
                 max_restarts: int = 5, timing: dict | None = None):
        self.endpoint, self.tmp, self.nodes = endpoint, Path(tmp), nodes
        self.steps, self.every, self.step_s, self.end_s = steps, every, step_s, end_s
        self.boot_s, self.max_restarts = boot_s, max_restarts
        self.timing = dict(TIMING, **(timing or {}))
        self.s3, self.imds, self.grant = instance_store(endpoint, monkeypatch, BUCKET, JOB_ID,
                                                        OWNER, REGION)
        self.ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)
        self.asg = boto3.client("autoscaling", region_name=REGION, endpoint_url=endpoint)
        self.shared = self.tmp / "network"
        self.shared.mkdir(parents=True)
        self.main = self.tmp / "node_main.py"
        self.main.write_text(NODE_MAIN)
        self.by_id: dict[str, Node] = {}
        self.launched: list[str] = []  # every instance the group launched, in order
        self.events: list[tuple[float, str, str]] = []  # (time, what, instance)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._cloud, daemon=True)

    # -- the launch ---------------------------------------------------------------------------

    def __enter__(self):
        vpc = self.ec2.create_vpc(CidrBlock="10.200.0.0/16")["Vpc"]["VpcId"]
        subnet = self.ec2.create_subnet(VpcId=vpc, CidrBlock="10.200.0.0/24",
                                        AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
        self.ec2.create_launch_template(LaunchTemplateName=GROUP, LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge", "TagSpecifications": [
                {"ResourceType": "instance",
                 "Tags": [{"Key": "cloudtrain:job", "Value": JOB_ID}]}]})
        self.asg.create_auto_scaling_group(
            AutoScalingGroupName=GROUP, LaunchTemplate={"LaunchTemplateName": GROUP},
            MinSize=self.nodes, MaxSize=self.nodes, DesiredCapacity=self.nodes,
            VPCZoneIdentifier=subnet)
        first = sorted(self.live().items())
        members = [{"rank": k, "instance": i, "address": a} for k, (i, a) in enumerate(first)]
        self.s3.put_object(Bucket=BUCKET, Key=PREFIX + "attempts/1.json", Body=json.dumps(
            {"attempt": 1, "instance": first[0][0], "by": "launch"}))
        for k, (ident, address) in enumerate(first):  # the launch: job.json for rank k
            node = self._node(ident, address)
            job = self.job_json(node)
            job["env"].update(CLOUDTRAIN_ATTEMPT="1", CLOUDTRAIN_NODES=str(self.nodes),
                              CLOUDTRAIN_NODE_RANK=str(k), MASTER_ADDR=first[0][1],
                              MASTER_PORT="29500")
            job["auto_scaling"].update(rank=k, members=members)
            if k == 0:
                job["checkpoint_stream"] = dict(job["auto_scaling"]["stream"], attempt=1)
            else:
                job["results_store"] = dict(self.grant, prefix=PREFIX + f"nodes/{k}/")
            (node.jobdir / "job.json").write_text(json.dumps(job))
            node.start("agent")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)
        for node in list(self.by_id.values()):
            if not node.gone:
                node.kill()
        self.imds.close()

    def job_json(self, node: Node) -> dict:
        """job.json as the launch writes it into the bundle (rank 0's part, attempt 1)."""
        return {
            "job_id": JOB_ID, "heartbeat_s": 0.2, "grace_s": 5, "imds_url": node.imds.url,
            "spot_poll_s": 0.1, "results_store": dict(self.grant), "shutdown_delay_s": 0,
            "collect_wait_s": 0, "shutdown_command": f"echo off >> {node.dir / 'off'}",
            "env": {},
            "auto_scaling": {"group": GROUP, "region": REGION, "endpoint": self.endpoint,
                             "max_restarts": self.max_restarts, "prefix": PREFIX,
                             "bucket": BUCKET, "store_region": REGION, "nodes": self.nodes,
                             "rank": 0, "members": [],
                             "stream": {"settle_s": 2.0, "poll_s": 1.0, "start_seq": 0,
                                        "start_slot": None}}}

    def _node(self, ident: str, address: str) -> Node:
        node = Node(self, ident, address)
        node.jobdir.mkdir(parents=True)
        (node.jobdir / "checkpoints").mkdir()
        write_host_files(node.agent_dir)
        (node.jobdir / "job.py").write_text(JOB)
        (node.jobdir / "run.sh").write_text(
            f"exec {sys.executable} job.py {self.steps} {self.every} {self.step_s} "
            f"{self.end_s}\n")
        with self._lock:
            self.by_id[ident] = node
            self.launched.append(ident)
        self.events.append((time.time(), "launch", ident))
        return node

    # -- AWS's part -----------------------------------------------------------------------------

    def live(self) -> dict[str, str]:
        """{instance: private address} of the group's pending or running instances."""
        found = self.ec2.describe_instances(Filters=[
            {"Name": "tag:aws:autoscaling:groupName", "Values": [GROUP]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
        return {i["InstanceId"]: i["PrivateIpAddress"] for r in found["Reservations"]
                for i in r["Instances"]}

    def _cloud(self):
        booting: dict[str, float] = {}
        while not self._stop.is_set():
            try:
                live = self.live()
                for ident, node in list(self.by_id.items()):
                    if node.gone:
                        continue
                    if node.powered_off() or ident not in live:
                        self._end(node, "power-off" if node.powered_off() else "terminated")
                for ident, address in live.items():
                    if ident in self.by_id:
                        continue
                    booting.setdefault(ident, time.time() + self.boot_s)
                    if time.time() >= booting[ident]:
                        self._boot(ident, address)
            except Exception as exc:  # noqa: BLE001 - said at the end (errors)
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(0.1)

    def _end(self, node: Node, why: str) -> None:
        self.events.append((time.time(), why, node.id))
        if why == "power-off":
            try:
                self.ec2.terminate_instances(InstanceIds=[node.id])  # the group replaces it
            except Exception:  # noqa: BLE001 - gone with its group already
                pass
        node.kill()

    def _boot(self, ident: str, address: str) -> None:
        """A replacement: the bundle's job files (the launch's), then user-data's
        bootstrap (enter_job), which starts the agent."""
        node = self._node(ident, address)
        (node.jobdir / "job.json").write_text(json.dumps(dict(
            self.job_json(node), checkpoint_stream=self.job_json(node)["auto_scaling"]["stream"])))
        self.events.append((time.time(), "boot", ident))
        node.start("boot")

    def take_back(self, node: Node, notice_s: float | None = None) -> None:
        """EC2 takes the instance back: at once, or `notice_s` after a spot notice."""
        if notice_s is not None:
            node.imds.announce("127.0.0.1")
            self.events.append((time.time(), "notice", node.id))
            time.sleep(notice_s)
        if not node.gone:
            self.events.append((time.time(), "take-back", node.id))
            try:
                self.ec2.terminate_instances(InstanceIds=[node.id])
            except Exception:  # noqa: BLE001 - it powered off and went already
                pass
            node.kill()

    # -- what a test reads ------------------------------------------------------------------------

    def node(self, rank: int, running: bool = True) -> Node:
        """The live node that holds `rank` now (its job.json says), its part running (or
        not `running`: ended, waiting for the job's end)."""
        for node in list(self.by_id.values()):
            if node.gone:
                continue
            try:
                job = json.loads((node.jobdir / "job.json").read_text())
            except (OSError, ValueError):
                continue
            if job.get("auto_scaling", {}).get("rank") == rank and (
                    not running or node.status().get("state") == "running"):
                return node
        raise LookupError(f"no live node holds rank {rank}")

    def step(self) -> int:
        """The last step rank 0 took, on any node (metrics.jsonl)."""
        best = 0
        for node in list(self.by_id.values()):
            path = node.jobdir / "metrics.jsonl"
            if path.exists():
                rows = [json.loads(l) for l in path.read_text().splitlines() if l.endswith("}")]
                best = max([best] + [r["step"] for r in rows])
        return best

    def wait_step(self, step: int, timeout: float = 60) -> None:
        wait_for(lambda: self.step() >= step, timeout=timeout, interval=0.02,
                 what=f"rank 0 at step {step}")

    def record(self, name: str) -> dict | None:
        try:
            return json.loads(self.s3.get_object(Bucket=BUCKET, Key=PREFIX + name)["Body"]
                              .read())
        except self.s3.exceptions.NoSuchKey:
            return None

    def final(self) -> dict | None:
        return self.record("final.json")

    def attempts(self) -> list[dict]:
        out, n = [], 1
        while (doc := self.record(f"attempts/{n}.json")) is not None:
            out.append(doc)
            n += 1
        return out

    def group_gone(self) -> bool:
        return not self.asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]

    def wait_end(self, timeout: float = 120) -> dict:
        """final.json, once the group is gone and no node of it runs."""
        try:
            wait_for(lambda: self.final() is not None and self.group_gone()
                     and all(n.gone for n in list(self.by_id.values())), timeout=timeout,
                     interval=0.2, what="the job's end")
        except AssertionError as exc:
            raise AssertionError(f"{exc}:\n{self.describe()}") from None
        return self.final()

    def describe(self) -> str:
        """Each node's state and its log's last lines (what a failed test shows)."""
        lines = [f"final: {self.final()}", f"attempts: {[a.get('instance') for a in self.attempts()]}"]
        for node in list(self.by_id.values()):
            log = node.jobdir / "output.log"
            tail = log.read_text().splitlines()[-6:] if log.exists() else []
            boot = node.dir / "boot.log"
            lines.append(f"{node.id} gone={node.gone} {node.status().get('state')}: "
                         + " | ".join(tail)
                         + (" | boot: " + boot.read_text()[-300:] if boot.exists() else ""))
        return "\n".join(lines)
