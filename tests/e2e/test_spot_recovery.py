"""Issue 13 end to end: spot jobs that finish. Through the real AWS path (moto's EC2 and S3 on
the bridge) with two instances that are network namespaces, one per AZ (10.200.0.4 in
us-east-1a, 10.200.0.132 in us-east-1b), each with its own sshd, home directory (its disk) and
tmux; the agent hears of interruptions from a fake IMDSv2 on the bridge; the recovery
supervisor runs in tmux on this machine as it would on a user's.

An interruption here is what EC2 does to a spot instance: (with a notice) the agent reads
spot/instance-action, the job checkpoints, the agent uploads it and powers off; then the
instance is terminated with reason Server.SpotInstanceTermination, its processes killed and
its disk gone. Without a notice only the second half happens.

Every scenario ends with nothing left in moto: no instance, volume or spot request.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labs.cloud import cloud_lab, uninterrupted
from labs.polling import wait_for
from labs.netns import lab_ip, netns_available

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd"),
              pytest.mark.slow]
torch = pytest.importorskip("torch")

HOSTS = {"us-east-1a": lab_ip(4), "us-east-1b": lab_ip(132)}  # moto's first address
# The smoke profile, longer: 16 steps an epoch, so an interruption lands mid-epoch.
# The smoke profile at the batch it had when these step counts were set (64 steps of 128).
RESNET9 = ("--recipe", "resnet9", "--profile", "smoke", "--set", "epochs=4",
           "--set", "synthetic_train=2048", "--set", "batch_size=128", "--set", "ghost_splits=4")

# Your own code under recovery: a step every 0.15 s, a checkpoint (and the checkpoint-info
# the agent reads its step from) every 5, resuming from $CLOUDTRAIN_CHECKPOINT_DIR.
OWN_JOB = r"""
import json, os, sys, time
ck = os.environ["CLOUDTRAIN_CHECKPOINT_DIR"]
state = os.path.join(ck, "state.json")
step = json.load(open(state))["step"] if os.path.exists(state) else 0
print("attempt", os.environ["CLOUDTRAIN_ATTEMPT"], "starts at step", step, flush=True)
total = int(sys.argv[1])
with open(os.path.join(os.environ["CLOUDTRAIN_JOB_DIR"], "metrics.jsonl"), "a") as m:
    while step < total:
        time.sleep(0.15)
        step += 1
        m.write(json.dumps({"step": step, "epoch": step // 5, "time": time.time()}) + "\n"); m.flush()
        if step % 5 == 0:
            for name, doc in (("state.json", {"step": step}),
                              ("checkpoint-info.json", {"step": step, "epoch": step // 5})):
                tmp = os.path.join(ck, "." + name)
                json.dump(doc, open(tmp, "w")); os.replace(tmp, os.path.join(ck, name))
print("done at step", step, flush=True)
"""


@pytest.fixture
def lab(cli, ct_home, tmp_path, monkeypatch):
    with cloud_lab(cli, ct_home, tmp_path, monkeypatch, list(HOSTS.values()),
                   f"ct-e2e-recovery-{os.getpid()}") as lab:
        yield lab


def _nothing_left(lab) -> None:
    """No instance, volume or spot request of any job (the last release may still be under
    way in the process that recorded the job's end)."""
    empty = {"instances": [], "volumes": [], "spot_requests": []}
    wait_for(lambda: lab.leftovers() == empty, timeout=30, what="nothing left in moto")


def _own_job(tmp_path: Path, steps: int) -> Path:
    work = tmp_path / "own"
    work.mkdir(exist_ok=True)
    (work / "job.py").write_text(OWN_JOB)
    return work


def _attempts(cli, job_id: str) -> list[dict]:
    return cli.job(job_id)["attempts"]


def _wait_state(cli, job_id, states, timeout=300) -> dict:
    return wait_for(lambda: (lambda j: j if j["state"] in states else None)(cli.job(job_id)),
                    timeout=timeout, interval=0.5, what=f"job {job_id} to reach {states}")


def _final_weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def test_F13_notice_mid_training_resumes_elsewhere_bit_identical(lab, cli, ct_home, tmp_path):
    """A resnet9 run gets the 2-minute notice mid-training: it checkpoints at a step
    boundary, the agent uploads it, EC2 takes the instance; the supervisor relaunches in the
    other AZ, the new host restores the checkpoint from the job store, and the run finishes
    with the same step count and bit-identical weights as an uninterrupted run."""
    for ip in HOSTS.values():
        lab.start(ip)
    job_id = cli.launch(*RESNET9, "--instance", "g5.xlarge", "--spot")
    first = lab.current(job_id)
    ip = first["PrivateIpAddress"]
    # Mid-training: after the first epoch's checkpoint has been streamed.
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("epoch"), timeout=120,
             what="the first streamed checkpoint")
    lab.imds.announce(ip)
    wait_for(lambda: lab.log.exists() and ip in lab.log.read_text()
             or not lab.live(job_id) or lab.live(job_id)[-1]["InstanceId"] != first["InstanceId"],
             timeout=60, what="the agent to finish its notice")
    if first["InstanceId"] in [i["InstanceId"] for i in lab.live(job_id)]:
        lab.take_back(first)
    job = _wait_state(cli, job_id, ("succeeded", "failed", "cancelled"))
    assert job["state"] == "succeeded", (job["reason"], job["timeline"])

    attempts = job["attempts"]
    assert [a["outcome"] for a in attempts] == ["interrupted", "succeeded"], attempts
    assert attempts[0]["zone"] != attempts[1]["zone"]
    # The notice's checkpoint reached the store, and the next attempt resumed from it.
    ckpt = attempts[0]["checkpoint"]
    assert ckpt["final"] and ckpt["ok"] and ckpt["bytes"] > 0 and ckpt["seconds"] >= 0, ckpt
    assert attempts[1]["resumed_step"] == ckpt["step"]
    assert attempts[0]["redone_steps"] == 0  # nothing beyond the current step was lost
    assert 0 < ckpt["step"] < 64
    phases = [p["name"] for p in job["timeline"]]
    assert "recovering" in phases and "restore" in phases and "checkpoint" in phases, phases
    log = cli.ok("logs", job_id).stdout
    assert "restored checkpoint" in log and "resnet9: done, 4 epochs" in log

    # The same run without an interruption, on this machine (trained once for this file and
    # test_autoscaled_recovery.py).
    steps, theirs = uninterrupted(cli, RESNET9)
    assert job["metrics"]["step"] == steps == 64
    ours = _final_weights(ct_home / "jobs" / job_id / "checkpoints" / "last.pt")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    # Every attempt is billed.
    report = json.loads(cli.ok("cost-report", "--json").stdout)
    assert job_id in json.dumps(report)
    assert len(lab.instances(job_id)) == 2
    _nothing_left(lab)


def test_F13_termination_without_notice_resumes_from_the_last_upload(lab, cli, tmp_path):
    """No notice: the instance just vanishes. The next attempt resumes from the last
    checkpoint that reached the job store; the steps after it are counted as redone."""
    for ip in HOSTS.values():
        lab.start(ip)
    work = _own_job(tmp_path, 60)
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--workdir", str(work), "--",
                        "python3", "job.py", "60")
    first = lab.current(job_id)
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0) >= 10, timeout=60,
             what="a streamed checkpoint at step 10")
    time.sleep(0.4)  # a few steps past it
    lab.take_back(first)
    job = _wait_state(cli, job_id, ("succeeded", "failed", "cancelled"))
    assert job["state"] == "succeeded", json.dumps([job["reason"], job["attempts"],
                                                     job["timeline"]], indent=0)
    assert len(job["attempts"]) == 2, json.dumps([job["attempts"], job["timeline"], job["reason"]], indent=0)
    a1, a2 = job["attempts"]
    assert a1["outcome"] == "interrupted" and "without a notice" in a1["reason"]
    assert a2["resumed_step"] is not None and a2["resumed_step"] >= 10
    assert a2["resumed_step"] % 5 == 0
    assert a1["redone_steps"] == a1["last_step"] - a2["resumed_step"] >= 0
    log = cli.ok("logs", job_id).stdout
    assert f"attempt 2 starts at step {a2['resumed_step']}" in log and "done at step 60" in log
    assert job["metrics"]["step"] == 60
    out = cli.ok("status", job_id).stdout
    assert "attempts  2: 1 interrupted" in out
    _nothing_left(lab)


def test_F13_interruption_during_setup_starts_over_as_a_counted_attempt(lab, cli, tmp_path):
    """The first instance is taken while it is being set up (its user-data has not installed
    tmux yet): no checkpoint exists, the job starts over on the next instance, and the
    interrupted setup counts as an attempt."""
    for ip in HOSTS.values():  # neither has tmux yet; the second gets it below
        lab.start(ip, without_tmux=True)
    work = _own_job(tmp_path, 10)
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "launch", "--quiet",
                             "--instance", "g5.xlarge", "--spot", "--workdir", str(work), "--",
                             "python3", "job.py", "10"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        first = wait_for(lambda: next((i for i in lab.aws.instances()
                                       if i["State"]["Name"] == "running"), None),
                         timeout=60, what="the first instance")
        job_id = lab.aws.tags(first)["cloudtrain:job"]
        wait_for(lambda: cli.job(job_id)["state"] == "setting-up", timeout=60,
                 what="setting-up")
        other = next(ip for ip in HOSTS.values() if ip != first["PrivateIpAddress"])
        lab.restart_with_tmux(other)
        lab.take_back(first)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "interrupted during setting-up" in err
    job = _wait_state(cli, job_id, ("succeeded", "failed", "cancelled"))
    assert job["state"] == "succeeded", job["reason"]
    a1, a2 = job["attempts"]
    assert a1["outcome"] == "interrupted" and a1["running_at"] is None
    assert a2["resumed_step"] is None and a2["resumed_checkpoint"] is None
    assert "attempt 2 starts at step 0" in cli.ok("logs", job_id).stdout
    _nothing_left(lab)


def _supervisor_pid(ct_home: Path) -> int:
    return json.loads((ct_home / "supervisor.json").read_text())["pid"]


def _held_lock(ct_home: Path) -> bool:
    from cloudtrain.lifecycle.supervisor import state_of

    return state_of(ct_home)["running"]


def test_F13_supervisor_killed_mid_recovery_no_duplicate_no_lost_attempt(lab, cli, ct_home,
                                                                          tmp_path):
    """SIGKILL the supervisor while it waits for the relaunched instance's SSH: the next
    command restarts it, and it goes on with the instance it had started (found by its
    attempt tag) instead of starting another; the attempt is neither lost nor doubled."""
    work = _own_job(tmp_path, 30)
    for ip in HOSTS.values():
        lab.start(ip)
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--workdir", str(work), "--",
                        "python3", "job.py", "30")
    first = lab.current(job_id)
    other = next(ip for ip in HOSTS.values() if ip != first["PrivateIpAddress"])
    lab.sshds[other].stop()  # the relaunched instance answers SSH only later
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0) >= 5, timeout=60,
             what="a streamed checkpoint")
    lab.take_back(first)
    wait_for(lambda: len(lab.instances(job_id)) == 2 and
             cli.job(job_id)["state"] == "provisioning", timeout=60,
             what="the relaunch waiting for SSH")
    os.kill(_supervisor_pid(ct_home), signal.SIGKILL)
    # kill() returns before the process is gone (and its lock with it): on a loaded machine
    # `status` could still find it holding the lock and, rightly, start none
    wait_for(lambda: not _held_lock(ct_home), timeout=30, interval=0.05,
             what="the killed supervisor to be gone")
    proc = cli.ok("status")  # notices the dead relaunch, restarts the supervisor
    assert "recovery supervisor started" in proc.stderr
    lab.start(other)
    job = _wait_state(cli, job_id, ("succeeded", "failed", "cancelled"))
    assert job["state"] == "succeeded", job["reason"]
    assert len(lab.instances(job_id)) == 2  # no duplicate instance
    assert [a["attempt"] for a in job["attempts"]] == [1, 2]
    assert job["attempts"][1]["outcome"] == "succeeded"
    assert "supervisor stopped during attempt 2" in json.dumps(job["timeline"])
    _nothing_left(lab)


def test_F13_U23_max_restarts_0_ends_preempted_and_nothing_relaunches(lab, cli, tmp_path):
    for ip in HOSTS.values():
        lab.start(ip)
    work = _own_job(tmp_path, 200)
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--max-restarts", "0",
                        "--workdir", str(work), "--", "python3", "job.py", "200")
    first = lab.current(job_id)
    wait_for(lambda: lab.metrics(first["PrivateIpAddress"], job_id), timeout=60,
             what="the job to run")
    lab.take_back(first)
    # U23: no restart is no recovery: the loss is the job's end, said as it happened, and
    # nothing is relaunched (before U23 this ran a supervisor that gave up at once)
    job = _wait_state(cli, job_id, ("succeeded", "failed", "cancelled", "preempted"),
                      timeout=120)
    assert job["state"] == "preempted"
    assert job["reason"] == "spot instance interrupted"
    assert job["spec"]["recover"] is False
    assert len(lab.instances(job_id)) == 1
    _nothing_left(lab)


def test_F13_down_during_recovery_terminates_and_nothing_launches_after(lab, cli, tmp_path):
    work = _own_job(tmp_path, 200)
    for ip in HOSTS.values():
        lab.start(ip)
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--workdir", str(work), "--",
                        "python3", "job.py", "200")
    first = lab.current(job_id)
    other = next(ip for ip in HOSTS.values() if ip != first["PrivateIpAddress"])
    lab.sshds[other].stop()
    wait_for(lambda: lab.metrics(first["PrivateIpAddress"], job_id), timeout=60,
             what="the job to run")
    lab.take_back(first)
    wait_for(lambda: len(lab.instances(job_id)) == 2, timeout=60, what="the relaunch")
    out = cli.ok("down", job_id).stdout
    assert "cancelled" in out
    assert lab.live(job_id) == []
    time.sleep(3)  # the supervisor's relaunch gives up; nothing new may start meanwhile
    assert len(lab.instances(job_id)) == 2 and lab.live(job_id) == []
    job = cli.job(job_id)
    assert job["state"] == "cancelled"
    _nothing_left(lab)


def test_issue38_a_deadline_spot_can_no_longer_meet_sends_the_relaunch_on_demand(
        lab, cli, tmp_path):
    """Issue 38's deadline: a spot job of at most 132 s of work, due in 15 min. The plan says
    spot until about 36 s after the launch (the work, a launch, one restart and the switch's
    own restart must fit); the instance is taken back after that moment, and the supervisor
    relaunches it on-demand, saying the switch was at the minute the plan gave. The job
    resumes there and succeeds; nothing is left."""
    for ip in HOSTS.values():
        lab.start(ip)
    work = _own_job(tmp_path, 400)
    due = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 900))  # one time
    args = ("--instance", "g5.xlarge", "--spot", "--max-runtime", "2.2", "--deadline", due,
            "--workdir", str(work), "--", "python3", "job.py", "400")
    plan = cli.ok("launch", *args[:-4], "--dry-run", *args[-4:]).stdout
    predicted = plan.split("  deadline ", 1)[1].split("spot until ", 1)[1][:5]
    job_id = cli.launch(*args)
    first = lab.current(job_id)
    switch = cli.job(job_id)["spec"]["expected"]["deadline"]["switch_at"]  # ISO, as JSON's
    switch = datetime.datetime.fromisoformat(switch.replace("Z", "+00:00")).timestamp()
    assert time.strftime("%H:%M", time.localtime(switch)) == predicted
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0) >= 50
             and time.time() > switch + 1, timeout=240, what="a checkpoint after the switch")
    lab.take_back(first)
    job = _wait_state(cli, job_id, ("succeeded", "failed", "cancelled"))
    assert job["state"] == "succeeded", json.dumps([job["reason"], job["timeline"]], indent=0)
    a1, a2 = job["attempts"]
    assert (a1["market"], a2["market"]) == ("spot", "on-demand"), job["attempts"]
    said = [e["detail"] for e in job["timeline"] if e["name"] == "deadline"]
    assert said[0].startswith(f"spot until {predicted}"), said
    assert said[-1].startswith(f"on-demand: the switch was at {predicted}"), said
    assert job["metrics"]["step"] == 400
    _nothing_left(lab)
