"""Part 3 of benchmarks/audit_figures.py: the audit of 2026-11-27's orphan (billing)
scenarios, against the labs the tests use (tests/labs/aws.py: moto's server in this process
and one loopback sshd answering at every private IP moto hands out; in-process `mock_aws`
for the supervisor's relaunch), each counted as the audit counted: what is left billing
(live instances, volumes of live instances, open spot requests) after the documented
cleanup. And F31's check: the AWS secret key and session token of a spot launch's shell,
searched in $CLOUDTRAIN_HOME while its recovery supervisor runs and after.

    lost state, no region configured          (F28) a fresh home, no region anywhere: down --all
    lost state, config region us-west-2       (F28) the instance is in us-east-1: down --all
    lost state, AWS_REGION=us-east-1          down --all
    supervisor killed mid-relaunch, 2nd region (F30) the next supervisor goes on
    supervisor killed mid-relaunch, same region
    SIGTERM 1.2 s / 2.5 s into a launch       (F13) nothing to do after
    down with SSH refused                     (F4) down
    a launch on a lying manifest              a shard whose sha256 lies: staging fails
    the FIFO job                              metrics.jsonl a FIFO (F34): status, metrics and
                                              logs stay bounded; the agent powers off

Run as `audit_lab.py relaunch other|same` it is the relaunch simulation itself, in a process
of its own (mock_aws, and the patches that stand in for a SIGKILL, stay there).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import audit_harness as harness
from audit_harness import Case, Outcome, Result, classify, isolated_env, kill_tmux, short

SSHD = "/usr/sbin/sshd"


@dataclasses.dataclass
class Scenario:
    name: str
    after_fault: int  # instances billing right after the fault
    cleanup: str  # the documented cleanup run
    left: int  # what still bills after it
    detail: str = ""
    error: str = ""  # the scenario could not be run: not measured


@dataclasses.dataclass
class LabFigures:
    scenarios: list[Scenario]
    results: list[Result]  # the scenarios' commands as inputs (sets `relaunch` and `aws`)


class _Patch:
    """monkeypatch's setattr, for the lab's helpers that take one (kept for the run)."""

    @staticmethod
    def setattr(target, name, value) -> None:
        setattr(target, name, value)


class Lab:
    """moto's server in this process; `fresh()` a reset cloud, a home and (with sshd) the
    loopback instance for one scenario."""

    def __init__(self, root: Path, timeout: float):
        from moto.server import ThreadedMotoServer

        import labs.aws as aws_lab
        from labs.loopback import free_port

        self.root, self.timeout = root, timeout
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        aws_lab._plain_http_stands_in_for_tls(_Patch())
        self.lab = None
        self.sock = None
        self.base = None

    def fresh(self, name: str, sshd: bool = True):
        """(home, env, lab or None): a reset moto; with `sshd`, the lab's VPC, DLAMI, key and
        instance, and its config.yaml."""
        import requests

        import labs.aws as aws_lab
        from labs.credentials import AWS_ENV
        from labs.loopback import free_port

        self.close_scenario()
        requests.post(f"{self.endpoint}/moto-api/reset", timeout=10)
        base = self.base = self.root / name.replace(" ", "-").replace("/", "-")
        home = base / "home"
        home.mkdir(parents=True)
        self.sock = f"{harness.RUN_ID}-lab-{len(list(self.root.iterdir()))}"
        env = isolated_env(base, home, self.sock, self.endpoint)
        env.update(AWS_ENV)
        env["AWS_ENDPOINT_URL"] = self.endpoint
        if sshd:
            (base / "lab").mkdir()
            self.lab = aws_lab.AWSLab(self.endpoint, home, base / "lab")
            self.lab.build(free_port())
            self.lab.write_config()
        return home, env, self.lab

    def close_scenario(self) -> None:
        if self.lab is not None:
            self.lab.sshd.stop()
            self.lab.restore()
            self.lab = None
        if self.sock:
            kill_tmux(self.sock)
        if self.base is not None:  # an agent the lab's "termination" could not stop
            harness.kill_left_under(self.base)

    def close(self) -> None:
        self.close_scenario()
        self.server.stop()

    def ec2(self, region: str):
        import boto3
        from botocore.config import Config

        from labs.credentials import CLIENT_CREDS

        return boto3.client("ec2", endpoint_url=self.endpoint, region_name=region,
                            config=Config(retries={"max_attempts": 1}),
                            **CLIENT_CREDS)

    def billing(self, regions=("us-east-1",)) -> list[str]:
        """What still bills: live instances, volumes attached to them, open spot requests."""
        out = []
        for region in regions:
            ec2 = self.ec2(region)
            live = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
                    if i["State"]["Name"] not in ("terminated", "shutting-down")]
            ids = {i["InstanceId"] for i in live}
            out += [f"{region} {i}" for i in sorted(ids)]
            out += [f"{region} volume {v['VolumeId']}" for v in ec2.describe_volumes()["Volumes"]
                    if any(a.get("InstanceId") in ids for a in v.get("Attachments", []))]
            out += [f"{region} spot request {r['SpotInstanceRequestId']}" for r in
                    ec2.describe_spot_instance_requests()["SpotInstanceRequests"]
                    if r["State"] in ("open", "active")]
        return out

    def run(self, argv: list[str], env: dict, cwd: Path, timeout: float | None = None
            ) -> Outcome:
        return harness.run_process([harness.PYTHON, "-m", "cloudtrain", *argv], env, cwd,
                                   timeout or self.timeout, shown=argv)


# -- the scenarios ---------------------------------------------------------------------------------


def _tagged_instance(lab: Lab, region: str, job_id: str) -> str:
    """An instance tagged as the caller's, of a job no store here knows (another machine's)."""
    import boto3

    from labs.credentials import CLIENT_CREDS

    owner = boto3.client("sts", endpoint_url=lab.endpoint, region_name=region,
                         **CLIENT_CREDS
                         ).get_caller_identity()["Arn"]
    (raw,) = lab.ec2(region).run_instances(
        ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": "cloudtrain:owner", "Value": owner},
            {"Key": "cloudtrain:job", "Value": job_id}]}])["Instances"]
    return raw["InstanceId"]


def lost_state(lab: Lab, name: str, config: str, env_region: str | None, out: list) -> Scenario:
    home, env, _ = lab.fresh(name, sshd=False)
    for key in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        env.pop(key, None)
    if env_region:
        env["AWS_REGION"] = env_region
    (home / "config.yaml").write_text(config)
    _tagged_instance(lab, "us-east-1", "6a92bfde")
    after = instances(lab.billing())
    outcome = lab.run(["down", "--all", "-y"], env, home.parent, timeout=240)
    out.append(outcome)
    left = lab.billing()
    said = (outcome.stdout.strip().splitlines() or [outcome.first_line])[-1]
    return Scenario(name, after, "down --all -y", len(left),
                    f"still running: {', '.join(left)}; down said: {short(said, 90)}")


def relaunch(lab: Lab, name: str, where: str, out: list) -> Scenario:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CLOUDTRAIN_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(harness.TREE), str(harness.TREE / "tests"),
                                           str(harness.TREE / "tests" / "integration")]),
               PYTHONDONTWRITEBYTECODE="1")
    outcome = harness.run_process([harness.PYTHON, __file__, "relaunch", where], env,
                                  lab.root, lab.timeout * 2, shown=["(relaunch)", where])
    out.append(outcome)
    try:
        found = json.loads(outcome.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Scenario(name, 0, "the next supervisor", 0,
                        error=f"no result: {short(outcome.first_line, 120)}")
    live = found["live"]
    return Scenario(name, found["after_fault"], "the next supervisor", max(0, len(live) - 1),
                    f"live instances of the job: {live}")


def sigterm_into_launch(lab: Lab, name: str, seconds: float, out: list) -> Scenario:
    home, env, _ = lab.fresh(name)
    argv = ["launch", "--instance", "g5.xlarge", "--", "sleep", "60"]
    start = time.monotonic()
    proc = subprocess.Popen(harness.limited([harness.PYTHON, "-m", "cloudtrain", *argv]),
                            env=env, cwd=home.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(max(0.0, seconds - (time.monotonic() - start)))
    proc.send_signal(signal.SIGTERM)
    try:
        stdout, stderr = proc.communicate(timeout=lab.timeout * 2)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        harness.kill_group(proc.pid)
        stdout, stderr, rc = proc.communicate()[0], b"", None
    err = stderr.decode("utf-8", "replace")
    kind = classify(rc, err, stdout.decode("utf-8", "replace"))
    if rc == 130 and "interrupted" in err and kind == "other":
        kind = "error"  # the designed line of an interrupted launch (exit 130)
    if rc == -signal.SIGTERM:  # it came before the launch set its handler (while loading,
        # before any instance): the default action; what bills is counted below regardless
        kind, err = "ok", "(ended by the SIGTERM before its handler was set)\n"
    out.append(Outcome(kind, argv, rc, err, time.monotonic() - start))
    after = instances(lab.billing())
    out.append(lab.run(["status"], env, home.parent))
    left = lab.billing()
    said = (err.strip().splitlines() or ["(nothing)"])[-1]
    return Scenario(name, after, "status", len(left),
                    f"still running: {left}; the launch said: {short(said, 90)}")


def _launch_job(lab: Lab, env: dict, home: Path, out: list, *command: str) -> str:
    outcome = lab.run(["launch", "-q", "--instance", "g5.xlarge", "--", *command], env,
                      home.parent, timeout=180)
    out.append(outcome)
    if outcome.returncode != 0:
        raise RuntimeError(f"the scenario's launch failed: {outcome.first_line}")
    return outcome.stdout.split()[-1]


def down_ssh_refused(lab: Lab, name: str, out: list) -> Scenario:
    home, env, _ = lab.fresh(name)
    job = _launch_job(lab, env, home, out, "sleep", "120")
    with sqlite3.connect(home / "state.db") as db:
        host = json.loads(db.execute("SELECT host FROM jobs WHERE id = ?", (job,)).fetchone()[0])
        host["port"] = 1  # the /32 rule no longer matches this machine: refused here
        db.execute("UPDATE jobs SET host = ? WHERE id = ?", (json.dumps(host), job))
    db.close()
    after = instances(lab.billing())
    out.append(lab.run(["down", job], env, home.parent, timeout=180))
    left = lab.billing()
    return Scenario(name, after, "down JOB", len(left), f"still running: {left}")


def lying_manifest(lab: Lab, name: str, out: list) -> Scenario:
    home, env, _ = lab.fresh(name)
    import boto3

    from labs.credentials import CLIENT_CREDS

    s3 = boto3.client("s3", endpoint_url=lab.endpoint, region_name="us-east-1",
                      **CLIENT_CREDS)
    s3.create_bucket(Bucket="audit-data")
    tree = home.parent / "dataset"
    for i in range(6):
        harness.write(tree / "train" / f"{i}.bin", os.urandom(4000))
    out.append(lab.run(["data", "push", str(tree), "s3://audit-data/ds", "--shard-mb", "1"],
                       env, home.parent, timeout=120))
    key = "ds/shards/shard-00000.tar"
    body = bytearray(s3.get_object(Bucket="audit-data", Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF  # same size, another sha256: the manifest lies about it
    s3.put_object(Bucket="audit-data", Key=key, Body=bytes(body))
    outcome = lab.run(["launch", "-q", "--instance", "g5.xlarge", "--data",
                       "ds=s3://audit-data/ds", "--follow", "--", "true"], env, home.parent,
                      timeout=240)
    out.append(outcome)
    after = instances(lab.billing())
    _until(lambda: not lab.billing(), 30)  # the agent powers the instance off
    out.append(lab.run(["status"], env, home.parent))
    left = lab.billing()
    return Scenario(name, after, "status", len(left),
                    f"still running: {left}; the launch said: {short(outcome.first_line, 90)}")


def fifo_job(lab: Lab, name: str, out: list) -> Scenario:
    home, env, _ = lab.fresh(name)
    job = _launch_job(lab, env, home, out, "bash", "-c",
                      'rm -f "$CLOUDTRAIN_JOB_DIR/metrics.jsonl"; '
                      'mkfifo "$CLOUDTRAIN_JOB_DIR/metrics.jsonl"; sleep 10')
    for argv in (["status"], ["status", job], ["metrics", job], ["logs", job]):
        out.append(lab.run(argv, env, home.parent))
    after = instances(lab.billing())

    def ended() -> bool:
        proc = lab.run(["status", job, "--json"], env, home.parent)
        try:
            return json.loads(proc.stdout).get("state") in ("succeeded", "failed", "cancelled")
        except ValueError:
            return False

    _until(ended, 60)
    _until(lambda: not lab.billing(), 30)  # the agent powers the instance off
    out.append(lab.run(["status"], env, home.parent))
    left = lab.billing()
    return Scenario(name, after, "none (the job ends)", len(left), f"still running: {left}")


def instances(billing: list[str]) -> int:
    """How many of billing()'s items are instances (not their volumes or spot requests)."""
    return sum(len(item.split()) == 2 for item in billing)


def _until(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1)
    return False


SECRET, TOKEN = "auditSECRETvalue123xyz", "auditSESSIONtoken456"


def supervisor_secrets(lab: Lab, out: list, flaws: list) -> None:
    """F31: a spot launch from a shell whose AWS keys live in the environment only."""
    home, env, _ = lab.fresh("supervisor secrets")
    env.update(AWS_SECRET_ACCESS_KEY=SECRET, AWS_SESSION_TOKEN=TOKEN)
    outcome = lab.run(["launch", "-q", "-y", "--instance", "g5.xlarge", "--spot", "--",
                       "sleep", "30"], env, home.parent, timeout=180)
    out.append(outcome)
    job = outcome.stdout.split()[-1] if outcome.returncode == 0 else None

    def running() -> bool:
        proc = lab.run(["supervisor", "status", "--json"], env, home.parent)
        try:
            return bool(json.loads(proc.stdout).get("running"))
        except ValueError:
            return False

    _until(running, 30)
    _secrets_in(home, "while the supervisor runs", flaws)
    if job:
        out.append(lab.run(["down", job], env, home.parent, timeout=180))
    out.append(lab.run(["supervisor", "stop"], env, home.parent))
    _secrets_in(home, "after it stopped", flaws)
    if (home / "supervisor.env").exists():
        flaws.append(("leak", "supervisor.env is left in $CLOUDTRAIN_HOME"))
    left = lab.billing()
    if left:
        flaws.append(("broken", f"still billing after down: {left}"))


def _secrets_in(home: Path, when: str, flaws: list) -> None:
    """The secret key in no file; the session token only where AWS requires it: the job
    store's presigned POST signed with session credentials carries it as a form field in the
    job's job.json (tests/integration/test_lifecycle_supervisor.py says the same)."""
    for rel in harness.files_holding(home, SECRET):
        flaws.append(("leak", f"AWS_SECRET_ACCESS_KEY in $CLOUDTRAIN_HOME/{rel} ({when})"))
    for rel in harness.files_holding(home, TOKEN):
        try:
            doc = json.loads((home / rel).read_text())
            fields = doc["results_store"]["fields"]
            allowed = Path(rel).name == "job.json" and fields.get(
                "x-amz-security-token") == TOKEN and (home / rel).read_text().count(TOKEN) == 1
        except (ValueError, KeyError, TypeError, OSError):
            allowed = False
        if not allowed:
            flaws.append(("leak", f"AWS_SESSION_TOKEN in $CLOUDTRAIN_HOME/{rel} ({when})"))


def run(args) -> LabFigures:
    print("\n== orphans: the audit's 10 orphan (billing) scenarios against moto and a loopback "
          "sshd (tests/labs/aws.py), and F31's supervisor secrets")
    if not Path(SSHD).exists():
        print("openssh-server is not installed (/usr/sbin/sshd): the scenarios cannot run")
        return LabFigures([Scenario("all", 0, "", 0, error="no openssh-server")], [])
    root = Path(tempfile.mkdtemp(prefix="ct-audit-lab-"))
    start = time.monotonic()
    lab = Lab(root, args.timeout)
    scenarios, results = [], []
    plan = [
        ("aws", "lost state, no region configured (F28)",
         lambda out: lost_state(lab, "lost state, no region configured (F28)", "", None, out)),
        ("aws", "lost state, config region us-west-2 (F28)",
         lambda out: lost_state(lab, "lost state, config region us-west-2 (F28)",
                                "region: us-west-2\n", None, out)),
        ("aws", "lost state, AWS_REGION=us-east-1",
         lambda out: lost_state(lab, "lost state, AWS_REGION=us-east-1", "", "us-east-1", out)),
        ("relaunch", "supervisor killed mid-relaunch in a second region (F30)",
         lambda out: relaunch(lab, "supervisor killed mid-relaunch in a second region (F30)",
                              "other", out)),
        ("relaunch", "supervisor killed mid-relaunch in the same region",
         lambda out: relaunch(lab, "supervisor killed mid-relaunch in the same region", "same",
                              out)),
        ("aws", "SIGTERM 1.2 s into a launch",
         lambda out: sigterm_into_launch(lab, "SIGTERM 1.2 s into a launch", 1.2, out)),
        ("aws", "SIGTERM 2.5 s into a launch",
         lambda out: sigterm_into_launch(lab, "SIGTERM 2.5 s into a launch", 2.5, out)),
        ("aws", "down with SSH refused", lambda out: down_ssh_refused(lab, "down with SSH refused",
                                                                       out)),
        ("aws", "a launch on a lying manifest",
         lambda out: lying_manifest(lab, "a launch on a lying manifest", out)),
        ("aws", "the FIFO job (F34)", lambda out: fifo_job(lab, "the FIFO job (F34)", out)),
    ]
    try:
        for group, name, scenario in plan:
            out: list[Outcome] = []
            t0 = time.monotonic()
            try:
                result = scenario(out)
            except Exception as exc:  # the lab's own failure: not measured, said
                result = Scenario(name, 0, "", 0, error=f"harness: {exc!r}"[:300])
            scenarios.append(result)
            kind = min((o.kind for o in out), key=harness.KINDS.index, default="ok")
            if not result.error:
                results.append(Result(Case(group, name, []), kind, out))
            print(f"  {name:58} {result.after_fault:>2} after the fault, "
                  f"{result.left} left after `{result.cleanup}` ({time.monotonic() - t0:.0f} s)"
                  + (f"  NOT MEASURED: {result.error}" if result.error else "")
                  + (f"\n      {kind}: "
                     f"{short(next(o for o in out if o.kind == kind).first_line, 120)}"
                     if kind in ("TRACEBACK", "HANG", "other") else ""))
        out, flaws = [], []
        try:
            supervisor_secrets(lab, out, flaws)
        except Exception as exc:
            print(f"  supervisor secrets: NOT MEASURED: harness: {exc!r}"[:300])
        else:
            kind = min((o.kind for o in out), key=harness.KINDS.index, default="ok")
            results.append(Result(Case("aws", "a spot launch's supervisor (F31)", []), kind, out,
                                  flaws))
            print(f"  {'a spot launch supervisor: AWS secrets in $CLOUDTRAIN_HOME (F31)':58} "
                  f"{len([f for f in flaws if f[0] == 'leak'])} found")
    finally:
        lab.close()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    print(f"{len(scenarios)} scenarios, {sum(s.left for s in scenarios)} left billing "
          f"({time.monotonic() - start:.0f} s)")
    return LabFigures(scenarios, results)


# -- the relaunch simulation (a process of its own) ----------------------------------------------


def simulate_relaunch(where: str) -> dict:
    """Supervisor A starts attempt 2's instance (in the second region when the home one has
    no capacity: `other`; at home: `same`) and is killed while waiting for it; the next
    command finds it gone; supervisor B relaunches (capacity back at home), and is stopped at
    the same point. The job's live instances then: one is the job's, any other bills idle.
    tests/integration/test_recovery.py's lab and kill points, outside pytest."""
    import pytest

    from test_recovery import HOME, Killed, _live, _recovering_job, killed_while_waiting
    from test_recovery import two_regions as lab

    ct_home = Path(tempfile.mkdtemp(prefix="ct-audit-relaunch-"))
    (ct_home / "config.yaml").write_text("")
    patch = pytest.MonkeyPatch()
    patch.setenv("CLOUDTRAIN_HOME", str(ct_home))
    from labs.moto_spot_scores import SpotScores

    SpotScores().install(patch)  # as tests/conftest.py does for every test
    cloud = lab.__wrapped__(patch, ct_home)  # the fixture's generator: moto, both regions
    ec2s = next(cloud)
    try:
        from cloudtrain.lifecycle import recovery, watch
        from cloudtrain.config import Settings
        from cloudtrain.state import open_store

        store = open_store(ct_home)
        job = _recovering_job(store)
        no_capacity = {HOME} if where == "other" else set()
        killed_while_waiting(patch, no_capacity)
        try:
            recovery.relaunch(store, Settings.load(), job)
        except Killed:
            pass
        after_fault = len(_live(ec2s, job.id))
        watch.launcher_died(store, store.job(job.id))
        no_capacity.clear()
        try:
            recovery.relaunch(store, Settings.load(), store.job(job.id))
        except Killed:
            pass
        return {"after_fault": after_fault, "live": [list(x) for x in _live(ec2s, job.id)]}
    finally:
        cloud.close()
        patch.undo()


if __name__ == "__main__":
    if sys.argv[1:2] == ["relaunch"]:
        print(json.dumps(simulate_relaunch(sys.argv[2])))
