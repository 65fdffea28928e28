"""A cloud of network-namespace instances for end-to-end tests (root only): moto's EC2 and
S3 on the bridge, a VPC whose two subnets (one per AZ) hold the namespaces' addresses, each
namespace an instance with its own sshd, home directory (its disk) and tmux, a fake IMDSv2
for spot notices, and what a test does as EC2 (take an instance back).

moto hands out a subnet's addresses in order after the three AWS reserves: in us-east-1a
10.200.<n>.4, .5, .6, ...; in us-east-1b 10.200.<n>.132, .133, ... (n: the worker's lab net,
labs/netns.py's lab_ip builds them)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .aws import _plain_http_stands_in_for_tls, moto_lab
from .credentials import CLIENT_CREDS, REGION
from .imds import FakeIMDS
from .netns import GATEWAY, NET, NetnsLab
from .polling import wait_for
from .sshd import SSHD

BRIDGE = str(GATEWAY)
ZONES = {"us-east-1a": f"10.200.{NET}.0/25", "us-east-1b": f"10.200.{NET}.128/25"}
SPOT_REASON = ("Server.SpotInstanceTermination", "Server.SpotInstanceTermination: Spot "
                                                 "instance termination")

RECORDER = """#!/bin/bash
# The instance's `shutdown -h now`: recorded (the test plays EC2's part).
echo "{\\"jobdir\\": \\"$CLOUDTRAIN_JOB_DIR\\", \\"at\\": $(date +%s)}" >> {log}
"""


def terminate_with_reason(instance_id: str, reason: tuple[str, str], stop: bool = False) -> None:
    """Terminate (or, with `stop`, stop) an instance in moto's backend as EC2 does by itself,
    with EC2's state reason (code, message), as DescribeInstances then shows it."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    backend = ec2_backends[DEFAULT_ACCOUNT_ID][REGION]
    # moto's terminate() writes "Client.UserInitiatedShutdown" after the state: a
    # DescribeInstances served in between (the supervisor polls from another process)
    # saw a user's shutdown, and the job failed instead of recovering (once, in CI). The
    # instance takes EC2's reason first, and keeps it through terminate().
    found = backend.get_instance(instance_id)
    why = StateReason(reason[1], reason[0])
    found.__class__ = type("Reclaimed", (type(found),), {
        "state_reason": property(lambda self: why, lambda self, value: None)})
    if stop:
        backend.stop_instances([instance_id])
    else:
        backend.terminate_instances([instance_id])


_UNINTERRUPTED: dict[tuple, tuple[int, dict]] = {}


def uninterrupted(cli, launch: tuple[str, ...], timeout: float = 180) -> tuple[int, dict]:
    """The job of `launch` (launch's arguments) run on this machine by the local backend,
    uninterrupted: (its last step, its final weights), what a recovered run must end with.
    Run once per test process for every test and file that compares with the same run (the
    recipes are deterministic on the CPU): test_spot_recovery.py and
    test_autoscaled_recovery.py each trained the same resnet9 reference of 64 steps."""
    if launch not in _UNINTERRUPTED:
        import torch

        plain = cli.launch(*launch, "--backend", "local")
        # a status a second: each is a process that imports cloudtrain, which at the default
        # 0.2 s took about 40% of a core from the training it waits for
        assert cli.wait(plain, timeout=timeout, interval=1.0)["state"] == "succeeded"
        job = cli.job(plain)
        _UNINTERRUPTED[launch] = (job["metrics"]["step"], torch.load(
            Path(job["jobdir"]) / "checkpoints" / "last.pt", map_location="cpu",
            weights_only=False)["model"])
    return _UNINTERRUPTED[launch]


class CloudLab:
    """Namespace instances (`hosts`: their addresses, each in the AZ whose subnet holds it),
    moto on the bridge, the fake IMDS, and what the test does as EC2."""

    def __init__(self, net: NetnsLab, tmp: Path, cli, ct_home: Path, monkeypatch,
                 hosts: list[str]):
        self.net, self.tmp, self.cli, self.home = net, tmp, cli, ct_home
        self._moto = contextlib.ExitStack()  # moto's server and its console text (close())
        self.aws = self._moto.enter_context(moto_lab(BRIDGE, ct_home, tmp / "lab", monkeypatch,
                                                     "10.200.0.0/16", ZONES))
        self.endpoint = self.aws.endpoint
        self._store = None  # stored_checkpoint's S3 client and owner key, made on first use
        _plain_http_stands_in_for_tls(monkeypatch)
        self.imds = FakeIMDS(host=BRIDGE, role=None)
        self.hosts, self.sshds, self.homes = {}, {}, {}
        # more of each host's environment (start()); every host shares this machine's cores,
        # so its torch takes one thread (tests/conftest.py says why)
        self.host_env: dict[str, str] = {"OMP_NUM_THREADS": "1"}
        self.asg = None  # the AutoScalingLab, when cloud_lab(autoscaling=True) made one
        self.iam = None  # labs.moto_iam.RoleSessions, when cloud_lab(iam=True) made one
        # tmux's socket path must fit a Unix socket's 108 bytes: a short folder under /tmp
        self.tmux_root = Path(tempfile.mkdtemp(prefix="ctr-", dir="/tmp"))
        no_tmux = self._path_without_tmux()
        for ip in hosts:
            self.hosts[ip] = net.add_host(ip)
            self.homes[ip] = tmp / f"home-{ip}"
            server = SSHD(tmp / f"sshd-{ip}", host=ip, port=22, client_key=self.aws.key,
                          netns=self.hosts[ip].name)
            self.sshds[ip] = server
            self.hosts[ip].sshds.append(server)
        self.no_tmux_path = no_tmux
        self.aws.serve_hosts(*self.sshds.values())
        self.log = tmp / "shutdowns.jsonl"
        recorder = tmp / "shutdown"
        recorder.write_text(RECORDER.replace("{log}", str(self.log)))
        recorder.chmod(0o755)
        self.aws.write_config(
            ssh_port=22, ssh_wait_seconds=30.0, remote_root="~/.cloudtrain",
            shutdown_command=str(recorder), shutdown_delay_seconds=0.0,
            imds_url=self.imds.url, spot_poll_seconds=0.2, checkpoint_settle_seconds=0.2,
            supervisor_poll_seconds=0.3, recovery_retry_seconds=1.0,
            stale_after_seconds=20.0,
            # a group's nodes regroup (host/regroup.py) at the lab's pace: EC2 here says a
            # taken-back instance is gone at once, not within AWS's seconds
            regroup_watch_seconds=0.5, regroup_peers_seconds=2.0,
            regroup_lost_wait_seconds=5.0, regroup_stop_grace_seconds=1.0)

    def _end_supervisor(self) -> None:
        """The supervisor goes with the lab: asked (SIGTERM), then killed after 2 s. It
        finishes its current step first, and at the lab's end that step may be an SSH probe
        of an instance whose namespace is gone, which waits out its connect timeout (15 s,
        as an address nobody answers on AWS does): every autoscaled test paid it."""
        from cloudtrain.lifecycle import supervisor

        pid = supervisor.state_of(self.home).get("pid")
        if not isinstance(pid, int):
            return
        for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 10.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait_s
            while supervisor.state_of(self.home)["running"] and time.monotonic() < deadline:
                time.sleep(0.05)
            if not supervisor.state_of(self.home)["running"]:
                return

    def _path_without_tmux(self) -> Path:
        """A PATH for an instance whose user-data has not installed tmux yet."""
        shim = self.tmp / "bin-no-tmux"
        shim.mkdir()
        for entry in os.scandir("/usr/bin"):
            if entry.name != "tmux":
                os.symlink(entry.path, shim / entry.name)
        return shim

    def start(self, ip: str, without_tmux: bool = False) -> None:
        """Its sshd, with its own disk (HOME) and tmux (TMUX_TMPDIR); sshd takes the first
        SetEnv line only, so it is one line, rewritten each time."""
        self.homes[ip].mkdir(exist_ok=True)
        (self.tmux_root / ip).mkdir(exist_ok=True)
        server = self.sshds[ip]
        lines = [l for l in server.config.read_text().splitlines() if not l.startswith("SetEnv")]
        env = f"SetEnv HOME={self.homes[ip]} TMUX_TMPDIR={self.tmux_root / ip}"
        env += "".join(f" {k}={v}" for k, v in self.host_env.items())
        if without_tmux:
            env += f" PATH={self.no_tmux_path}"
        server.config.write_text("\n".join(lines + [env]) + "\n")
        server.start()

    def restart_with_tmux(self, ip: str) -> None:
        self.sshds[ip].stop()
        self.start(ip)

    def instances(self, job_id: str) -> list[dict]:
        return self.aws.instances(**{"tag:cloudtrain:job": job_id})

    def live(self, job_id: str) -> list[dict]:
        return [i for i in self.instances(job_id) if i["State"]["Name"] != "terminated"]

    def current(self, job_id: str) -> dict:
        return wait_for(lambda: (self.live(job_id) or [None])[-1], timeout=120,
                        what="the job's instance")

    def take_back(self, instance: dict, reason: tuple[str, str] = SPOT_REASON) -> None:
        """EC2 reclaims the spot instance (or, with another `reason`, an instance fails):
        its processes and disk go, it is terminated with that reason."""
        terminate_with_reason(instance["InstanceId"], reason)
        ip = instance["PrivateIpAddress"]
        # The group's lab may be terminating it at the same moment (its agent powered it off
        # after a notice): whatever of it is gone already is simply not there to end.
        host, home = self.hosts.get(ip), self.homes.get(ip)
        if host is not None:
            host.close()  # sshd, agent, job, its tmux: every process in the namespace
        for socket in (self.tmux_root / ip).glob("tmux-*/*"):  # and its tmux server
            subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True)
        for status in home.glob(".cloudtrain/jobs/*/status.json") if home else []:
            try:
                doc = json.loads(status.read_text() or "{}")
            except (OSError, ValueError):
                continue
            for pid in [doc.get("agent_pid")] + [p for p, _ in doc.get("descendants") or []]:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (TypeError, ValueError, ProcessLookupError):
                    pass
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)

    def metrics(self, ip: str, job_id: str) -> list[dict]:
        path = self.homes[ip] / ".cloudtrain" / "jobs" / job_id / "metrics.jsonl"
        try:
            return [json.loads(l) for l in path.read_text().splitlines() if l.endswith("}")]
        except (OSError, ValueError):
            return []

    def stored_checkpoint(self, job_id: str) -> dict | None:
        """The job's latest.json in the job store (None while there is none). Tests poll it
        every 0.1 s for minutes: its S3 client and the owner's key are made once per lab (a
        new client and a GetCallerIdentity per poll took a fifth of a core from the
        instances' training on a 2-core machine)."""
        if self._store is None:
            import boto3

            creds = {"endpoint_url": self.endpoint, "region_name": REGION, **CLIENT_CREDS}
            owner_key = boto3.client("sts", **creds).get_caller_identity()["UserId"]  # aws:userid
            self._store = (boto3.client("s3", **creds), owner_key)
        s3, owner_key = self._store
        try:
            body = s3.get_object(Bucket=f"cloudtrain-123456789012-{REGION}",
                                 Key=f"jobs/{owner_key}/{job_id}/stream/latest.json"
                                 )["Body"].read()
        except Exception:
            return None
        return json.loads(body)

    def leftovers(self) -> dict:
        ec2 = self.aws.ec2
        running = [i["InstanceId"] for i in self.aws.instances()
                   if i["State"]["Name"] != "terminated"]
        volumes = [v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]
                   if v["State"] not in ("deleted", "deleting")
                   and not v.get("Attachments")]
        spot = [r["SpotInstanceRequestId"] for r in
                ec2.describe_spot_instance_requests()["SpotInstanceRequests"]
                if r["State"] in ("open", "active")]
        return {"instances": running, "volumes": volumes, "spot_requests": spot}

    def close(self) -> None:
        self._end_supervisor()
        self.imds.close()
        self._moto.close()
        shutil.rmtree(self.tmux_root, ignore_errors=True)


@contextlib.contextmanager
def cloud_lab(cli, ct_home: Path, tmp: Path, monkeypatch, hosts: list[str], tmux_socket: str,
              autoscaling: bool = False, iam: bool = False):
    """A CloudLab of `hosts` for one test or benchmark run, jobs on their own tmux server
    here; everything it made is gone afterwards. With `autoscaling`, `lab.asg` makes moto's
    Auto Scaling groups behave as AWS's (tests/labs/asg.py). With `iam`, `lab.iam` hands each
    instance its role's own credentials and refuses what IAM would refuse them, and any key
    it revokes (tests/labs/moto_iam.py)."""
    monkeypatch.setenv("CLOUDTRAIN_TMUX_SOCKET", tmux_socket)
    with NetnsLab(tmp / "netns") as net:
        lab = CloudLab(net, tmp, cli, ct_home, monkeypatch, hosts)
        if iam:
            from labs.moto_iam import RoleSessions

            lab.iam = RoleSessions().install(monkeypatch)
            lab.imds.issuer = lab.iam.issue
        try:
            if autoscaling:
                from labs.asg import AutoScalingLab

                lab.asg = AutoScalingLab(lab, monkeypatch).start()
            yield lab
        finally:
            if lab.asg is not None:
                lab.asg.close()
            lab.close()
            subprocess.run(["tmux", "-L", tmux_socket, "kill-server"], capture_output=True)


@contextlib.contextmanager
def autoscaled_lab(cli, ct_home: Path, tmp: Path, monkeypatch, name: str,
                   profile: str = "ct-instance", drop: tuple[str, ...] = ()):
    """cloud_lab with Auto Scaling and no pre-declared hosts, the job's instance profile and
    remote_root set (labs.asg.instance_profile_config; `drop`: config lines to remove); the
    lab itself made no error by the end."""
    from labs.asg import instance_profile_config

    with cloud_lab(cli, ct_home, tmp, monkeypatch, [], f"{name}-{os.getpid()}",
                   autoscaling=True) as lab:
        instance_profile_config(lab, ct_home, profile, drop=drop)
        yield lab
        assert lab.asg.errors() == []


@contextlib.contextmanager
def bench_home(label: str):
    """A benchmark's own CLOUDTRAIN_HOME (the tests' settings), MonkeyPatch and CLI."""
    import pytest

    from conftest import CLI, TEST_CONFIG  # the tests' settings and command runner

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        tmp = Path(tmp)
        home = tmp / "ct-home"
        home.mkdir()
        (home / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in TEST_CONFIG.items()))
        mp.setenv("CLOUDTRAIN_HOME", str(home))
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        yield tmp, home, mp, CLI(home), f"ct-bench-{label}-{os.getpid()}"
