"""Issue 27 end to end: a spot job that AWS Auto Scaling relaunches, with the laptop closed.

Through the real AWS path against the lab's moto, with tests/labs/asg.py playing AWS Auto
Scaling: every instance the job's group launches is a namespace host that runs the launch
template's user-data at boot; a lost instance is replaced; a deleted group's instances go.
The launching machine's every cloudtrain process (the supervisor too) is killed once the job
runs, and nothing of it runs again until the job has ended and nothing is left in moto; only
then does `cloudtrain status` run, and it learns the attempts from the job store.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import pytest

from labs.cloud import autoscaled_lab, uninterrupted
from labs.polling import wait_for
from labs.netns import netns_available

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd"),
              pytest.mark.slow]
torch = pytest.importorskip("torch")

PROFILE = "ct-instance"
# The smoke profile, longer (64 steps), so an interruption lands mid-training.
RESNET9 = ("--recipe", "resnet9", "--profile", "smoke", "--set", "epochs=4",
           "--set", "synthetic_train=2048", "--set", "batch_size=128", "--set", "ghost_splits=4")


@pytest.fixture
def lab(cli, ct_home, tmp_path, monkeypatch):
    with autoscaled_lab(cli, ct_home, tmp_path, monkeypatch, "ct-e2e-autoscaled",
                        PROFILE) as lab:
        yield lab


def _uninterrupted(cli) -> tuple[int, dict]:
    """The same run on this machine, uninterrupted: (its steps, its final weights), run once
    for the tests of this file and test_spot_recovery.py (labs.cloud.uninterrupted)."""
    return uninterrupted(cli, RESNET9)


def _same_as_uninterrupted(ct_home: Path, job: dict, steps: int, theirs: dict,
                           expected: int) -> None:
    """The job ran `expected` steps, as the uninterrupted run did, to the same weights."""
    assert job["metrics"]["step"] == steps == expected
    ours = torch.load(ct_home / "jobs" / job["id"] / "checkpoints" / "last.pt",
                      map_location="cpu", weights_only=False)["model"]
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def _take_back(lab, name: str, inst, notice: bool) -> None:
    """EC2 takes the group's instance back: at once, or after a notice, once its agent has
    finished with it (stored the checkpoint, powered off)."""
    if notice:
        lab.imds.announce(inst.ip)
        wait_for(lambda: inst.id not in [i.id for i in lab.asg.live(name)]
                 or inst.power_off_at is not None, timeout=120,
                 what="the agent to finish its notice")
    if inst.id in [i.id for i in lab.asg.live(name)]:
        lab.take_back({"InstanceId": inst.id, "PrivateIpAddress": inst.ip})


def _everything_gone(lab) -> dict:
    left = lab.asg.leftovers()
    return {k: v for k, v in left.items() if v}


def _until_everything_gone(lab, job_id: str, timeout: float) -> None:
    """Wait for the job to end and its group to go; on a timeout, say what each live node
    of the job last logged and reported (its status.json, the tail of its output.log), so
    that a run which hangs in CI says where."""
    try:
        wait_for(lambda: not _everything_gone(lab), timeout=timeout, interval=1.0,
                 what="the job to end and its group to go")
    except AssertionError as exc:
        told = [f"{exc}: {lab.asg.leftovers()}"]
        for inst in lab.asg.live(f"cloudtrain-{job_id}"):
            jobdir = lab.homes.get(inst.ip, Path("/nonexistent")) / ".cloudtrain" / "jobs" / job_id
            for name, lines in (("status.json", 1), ("output.log", 25)):
                try:
                    text = (jobdir / name).read_text(errors="replace").splitlines()[-lines:]
                except OSError as why:
                    text = [f"({why.strerror})"]
                told.append(f"--- {inst.id} {inst.ip} {name}\n" + "\n".join(text))
        raise AssertionError("\n".join(told)) from None


@pytest.mark.parametrize("notice", [False, True], ids=["no-notice", "notice"])
def test_laptop_closed_instance_taken_back_the_group_relaunches_and_the_job_succeeds(
        lab, cli, ct_home, tmp_path, notice):
    """A resnet9 spot job launched into its Auto Scaling group; the launching machine is
    then closed (every cloudtrain process killed); the instance is taken back mid-training,
    without a notice, or with one (the agent uploads the checkpoint it asks for and powers
    off). The group's replacement starts the job from its bundle in the job store, resumes
    from the last streamed checkpoint and ends it: the agent records the end and deletes the
    group. Nothing is left; only then does `status` run, and shows the job succeeded with 2
    attempts, each priced, and weights equal to an uninterrupted run's."""
    job_id = cli.launch(*RESNET9, "--instance", "g5.xlarge", "--spot", timeout=300)
    job = cli.job(job_id)
    assert job["state"] in ("running", "staging"), job
    name = f"cloudtrain-{job_id}"
    (first,) = lab.asg.wait_for_group(name, 1)
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("epoch"), timeout=180,
             what="the first streamed checkpoint")
    lab.asg.kill_launching_machine()
    _take_back(lab, name, first, notice)
    replacement = wait_for(lambda: next((i for i in lab.asg.live(name) if i.id != first.id),
                                        None), timeout=120, what="the replacement")
    _until_everything_gone(lab, job_id, 400)
    assert replacement.user_data_exit == 0

    job = cli.job(job_id)  # the first cloudtrain command since the laptop closed
    assert job["state"] == "succeeded", (job["reason"], job["timeline"])
    attempts = job["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    assert attempts[0]["instance"] == first.id and attempts[1]["instance"] == replacement.id
    assert attempts[0]["outcome"] == "interrupted"
    assert attempts[1]["resumed_step"] is not None and 0 < attempts[1]["resumed_step"] < 64
    assert all(a["usd"] is not None and a["usd"] > 0 for a in attempts), attempts
    out = cli.ok("status", job_id).stdout
    assert "attempts  2: 1 interrupted" in out, out
    log = cli.ok("logs", job_id).stdout
    assert "resnet9: done, 4 epochs" in log, log[-2000:]

    _same_as_uninterrupted(ct_home, job, *_uninterrupted(cli), 64)


def _kill_everything_of_the_job(lab, inst, job_id: str) -> None:
    """The agent, the job and every power-off timer on the instance gone, the instance kept:
    nothing on it will ever report, stop or power it off."""
    import signal
    import subprocess

    status = json.loads((lab.homes[inst.ip] / ".cloudtrain" / "jobs" / job_id /
                         "status.json").read_text())
    marker = inst.path("/var/lib/cloudtrain/user-data-ran").read_text()
    watchdog = [int(line.split("=", 1)[1]) for line in marker.splitlines()
                if line.startswith("watchdog_pid=")]
    for pid in [status["agent_pid"], status.get("pid"), *watchdog]:
        for kill in (lambda p: os.killpg(p, signal.SIGKILL), lambda p: os.kill(p, signal.SIGKILL)):
            try:
                kill(int(pid))
            except (TypeError, ValueError, ProcessLookupError, PermissionError):
                pass
    subprocess.run([*inst.enter(), "shutdown", "-c"], check=True, capture_output=True)
    wait_for(lambda: inst.power_off_at is None, timeout=10, what="the pending shutdown cancelled")


def test_an_agent_that_never_reports_stops_billing_at_the_deadline(lab, cli, tmp_path):
    """The job's agent, its job and the instance's power-off timers are killed, the instance
    kept, the launching machine closed: nothing will ever end it but AWS. At the deadline
    (max runtime + the power-off margin) the group's scheduled action sets it to 0 and the
    instance goes; `status` then says the job failed, and why, and deletes the empty group
    and its template: nothing is left."""
    from cloudtrain.providers.aws.instances import RUNTIME_MARGIN_MIN

    work = tmp_path / "own"
    work.mkdir()
    (work / "job.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(3600)\n")
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--max-runtime", "10m",
                        "--workdir", str(work), "--", "python3", "job.py", timeout=300)
    name = f"cloudtrain-{job_id}"
    (inst,) = lab.asg.wait_for_group(name, 1)
    wait_for(lambda: (lambda s: s.exists() and json.loads(s.read_text()).get("pid"))(
        lab.homes[inst.ip] / ".cloudtrain" / "jobs" / job_id / "status.json"),
        timeout=60, what="the job to run")
    lab.asg.kill_launching_machine()
    _kill_everything_of_the_job(lab, inst, job_id)
    time.sleep(2)
    assert [i.id for i in lab.asg.live(name)] == [inst.id]  # nothing ends it by itself
    lab.asg.advance((10 + RUNTIME_MARGIN_MIN) * 60 - 30)
    time.sleep(1)
    assert [i.id for i in lab.asg.live(name)] == [inst.id]  # not before the deadline
    lab.asg.advance(60)
    wait_for(lambda: not lab.asg.live(name) and not lab.asg.leftovers()["instances"],
             timeout=60, what="the scheduled action to end the instance")
    assert lab.asg.log("scheduled-action")[-1]["desired"] == 0

    job = cli.job(job_id)
    assert job["state"] == "failed", (job["reason"], job["timeline"])
    assert "scheduled action set the job's group to 0 at the deadline" in job["reason"]
    assert _everything_gone(lab) == {}, lab.asg.leftovers()


def test_RD7_the_power_off_timer_of_a_group_instance_ends_the_group_before_powering_off(
        lab, cli, tmp_path):
    """RD7: the user-data's power-off timer (for an agent that never ended its job) powered
    a group's instance off and nothing more: AWS Auto Scaling then started a replacement into
    the same end, and another, until the group's deadline. Now, on an instance of a group, the
    timer first records the job failed and ends its group with the instance's role; the
    power-off follows; no replacement starts; `status` says why; nothing is left."""
    import subprocess

    work = tmp_path / "own"
    work.mkdir()
    (work / "job.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(3600)\n")
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--workdir", str(work), "--",
                        "python3", "job.py", timeout=300)
    name = f"cloudtrain-{job_id}"
    (inst,) = lab.asg.wait_for_group(name, 1)
    status = lab.homes[inst.ip] / ".cloudtrain" / "jobs" / job_id / "status.json"
    wait_for(lambda: status.exists() and json.loads(status.read_text()).get("pid"),
             timeout=60, what="the job to run")
    watch = inst.path("/var/lib/cloudtrain/watchdog-command").read_text()
    assert "bootstrap.py --end-group" in watch and f"--group {name}" in watch
    lab.asg.kill_launching_machine()
    # The agent and its job hang (killed here: nothing of them will end the job); the timer
    # is what is left, re-armed to fire in 2 s (its test hook) instead of at the max runtime.
    doc = json.loads(status.read_text())
    for pid in (doc["agent_pid"], doc.get("pid")):
        for kill in (lambda p: os.killpg(p, 9), lambda p: os.kill(p, 9)):
            try:
                kill(int(pid))
            except (TypeError, ValueError, ProcessLookupError, PermissionError):
                pass
    subprocess.run([*inst.enter(), "env", "CLOUDTRAIN_UD_WATCHDOG_SECONDS=2",
                    "/usr/local/bin/cloudtrain-rearm", "1"], check=True, capture_output=True)
    _until_everything_gone(lab, job_id, 120)
    assert len(lab.asg.log("launch")) == 1, lab.asg.log("launch")  # no replacement
    job = cli.job(job_id)
    assert job["state"] == "failed", (job["reason"], job["timeline"])
    assert "the instance's power-off timer fired" in job["reason"], job["reason"]


def test_with_the_laptop_on_status_and_logs_follow_the_job_to_its_replacement(lab, cli, tmp_path):
    """The laptop stays on (its supervisor too): once AWS Auto Scaling has replaced the
    taken instance, the job's record follows it there (the replacement's host key checked
    against its console, as at launch): `status` says it runs, `logs` reads the replacement's
    log, and the job's end is seen and collected as for any job; nothing is left."""
    from test_spot_recovery import _own_job

    work = _own_job(tmp_path, 60)
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--workdir", str(work), "--",
                        "python3", "job.py", "60", timeout=300)
    name = f"cloudtrain-{job_id}"
    (first,) = lab.asg.wait_for_group(name, 1)
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0) >= 10, timeout=60,
             what="a streamed checkpoint at step 10")
    lab.take_back({"InstanceId": first.id, "PrivateIpAddress": first.ip})
    new = wait_for(lambda: next((i for i in lab.asg.live(name) if i.id != first.id), None),
                   timeout=60, what="the replacement")
    job = wait_for(lambda: (lambda j: j if j["host"].get("host") == new.ip
                            or j["state"] == "succeeded" else None)(cli.job(job_id)),
                   timeout=120, interval=0.5, what="the record to follow the replacement")
    if job["state"] != "succeeded":
        assert job["state"] == "running" and not job["reason"], job["reason"]
        assert "attempt 2 starts at step" in cli.ok("logs", job_id).stdout
    job = cli.wait(job_id, timeout=180)
    assert job["state"] == "succeeded", (job["reason"], job["timeline"])
    assert [a["instance"] for a in job["attempts"]] == [first.id, new.id]
    assert any(p["name"] == "replacement" for p in job["timeline"]) or \
        job["attempts"][1]["outcome"] == "succeeded"
    assert "done at step 60" in cli.ok("logs", job_id).stdout
    wait_for(lambda: _everything_gone(lab) == {}, timeout=60, what="nothing left")


@pytest.mark.parametrize("notice", [True, False], ids=["notice", "no-notice"])
def test_issue38_laptop_closed_past_the_deadline_s_switch_the_group_goes_on_demand(
        lab, cli, tmp_path, notice):
    """Issue 38 with the laptop closed: a spot job of at most 132 s of work, due in 15 min,
    run by its Auto Scaling group; its plan says spot until about 36 s after the launch. The
    launching machine is closed, and past that moment the instance is taken back: with a
    notice, its agent stores the checkpoint and sets the group to on-demand before it powers
    off; without one, the group's spot replacement finds the switch past, sets the group to
    on-demand and powers off without running anything. Either way AWS's next instance is
    on-demand (the lab replaces spot by on-demand as AWS does on a new distribution), the
    job resumes there and succeeds; nothing is left. Then `status` shows the attempts'
    markets and the timeline says the switch, at the minute the plan gave."""
    from test_spot_recovery import _own_job

    work = _own_job(tmp_path, 400)
    due = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 900))
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--max-runtime", "2.2",
                        "--deadline", due, "--workdir", str(work), "--", "python3", "job.py",
                        "400", timeout=300)
    name = f"cloudtrain-{job_id}"
    (first,) = lab.asg.wait_for_group(name, 1)
    switch = cli.job(job_id)["spec"]["expected"]["deadline"]["switch_at"]
    switch = datetime.datetime.fromisoformat(switch.replace("Z", "+00:00")).timestamp()
    planned = time.strftime("%H:%M", time.localtime(switch))
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0) >= 50
             and time.time() > switch + 1, timeout=240, what="a checkpoint after the switch")
    lab.asg.kill_launching_machine()
    if notice:  # EC2 takes it back at the notice's time; the agent powers off before that
        lab.imds.announce(first.ip)
        wait_for(lambda: first.id not in [i.id for i in lab.asg.live(name)], timeout=120,
                 what="the agent to store its checkpoint and power off")
    else:
        lab.take_back({"InstanceId": first.id, "PrivateIpAddress": first.ip})
    _until_everything_gone(lab, job_id, 400)
    spot = [e["spot"] for e in lab.asg.log("launch") if e["group"] == name]
    assert spot == ([True, False] if notice else [True, True, False]), lab.asg.log("launch")
    assert lab.asg.log("policy-updated"), "the group's distribution was never updated"

    job = cli.job(job_id)  # the first cloudtrain command since the laptop closed
    assert job["state"] == "succeeded", (job["reason"], job["timeline"])
    markets = [a["market"] for a in job["attempts"]]
    assert markets == (["spot", "on-demand"] if notice else ["spot", "spot", "on-demand"])
    said = [e["detail"] for e in job["timeline"] if e["name"] == "deadline"]
    assert said[0].startswith(f"spot until {planned}"), said
    n = 1 if notice else 2
    assert said[-1].startswith(f"on-demand: the switch was at {planned}; attempt {n}'s spot "
                               "instance"), said
    assert job["metrics"]["step"] == 400
    assert all(a["usd"] is not None and a["usd"] > 0 for a in job["attempts"]), job["attempts"]


def test_RD3_a_gpus_job_s_group_takes_another_type_of_its_gpus_when_its_own_has_none(
        lab, cli, tmp_path):
    """RD3: a spot job whose type --gpus A10G:1 chose (g5.xlarge) is run by a group that may
    launch g5.2xlarge and g5.4xlarge too (the same GPU, at least its vCPUs, memory and
    instance store). With the laptop closed, its instance is taken back while AWS has no
    g5.xlarge capacity left: the group launches a g5.2xlarge, the job resumes there and
    succeeds, nothing is left; `status` shows each attempt on its own type, each priced."""
    from test_spot_recovery import _own_job

    work = _own_job(tmp_path, 200)
    args = ("--gpus", "A10G:1", "--spot", "--workdir", str(work), "--", "python3", "job.py",
            "200")
    plan = " ".join(cli.ok("launch", *args[:3], "--dry-run", *args[3:]).stdout.split())
    assert "(the job's group, on g5.xlarge or g5.2xlarge, g5.4xlarge: the same GPUs" in plan, \
        plan
    job_id = cli.launch(*args, timeout=300)
    name = f"cloudtrain-{job_id}"
    (first,) = lab.asg.wait_for_group(name, 1)
    assert first.moto.instance_type == "g5.xlarge"
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0) >= 30, timeout=120,
             what="a streamed checkpoint at step 30")
    lab.asg.kill_launching_machine()
    lab.asg.no_capacity.add("g5.xlarge")
    lab.take_back({"InstanceId": first.id, "PrivateIpAddress": first.ip})
    _until_everything_gone(lab, job_id, 300)
    launched = [e["instance_type"] for e in lab.asg.log("launch") if e["group"] == name]
    assert launched == ["g5.xlarge", "g5.2xlarge"], launched

    job = cli.job(job_id)  # the first cloudtrain command since the laptop closed
    assert job["state"] == "succeeded", (job["reason"], job["timeline"])
    assert [a["type"] for a in job["attempts"]] == ["g5.xlarge", "g5.2xlarge"], job["attempts"]
    assert all(a["usd"] is not None and a["usd"] > 0 for a in job["attempts"]), job["attempts"]
    assert job["metrics"]["step"] == 200


# resnet9's smoke run over 3 processes, one per node (gloo on the CPU): 512 images in 3
# shards, 5 steps an epoch, 6 epochs (30 steps), a checkpoint each epoch.
RESNET9_NODES = ("--recipe", "resnet9", "--profile", "smoke", "--set", "gpus=3",
                 "--set", "epochs=6")
def _uninterrupted_nodes(cli, recipe: tuple = RESNET9_NODES) -> tuple[int, dict]:
    """The same 3-process run on this machine (torchrun, gloo), uninterrupted: its steps and
    final weights. The ranks, shards and reduction order are the 3 nodes'."""
    return uninterrupted(cli, (*recipe, "--procs", "3"), timeout=300)


@pytest.mark.parametrize("lost, notice", [(0, False), (2, True)],
                         ids=["node-0-no-notice", "node-2-notice"])
def test_three_nodes_laptop_closed_a_node_taken_back_the_nodes_meet_again_and_succeed(
        lab, cli, ct_home, monkeypatch, lost, notice):
    """Issue 27's multi-node done-when: a resnet9 job on 3 nodes of one Auto Scaling group (in
    its placement group); the launching machine is closed; a node is taken back
    mid-training: node 0 (the rendezvous, the checkpoint stream) without a notice, or node 2
    after one (its agent stops and powers off; the others' runs fail with it gone, and they
    find it gone in EC2). AWS puts a replacement in the group; the other nodes stop their
    part and meet the replacement through the job store, which takes the free rank; all
    three restore the last streamed checkpoint and finish the job. Nothing is left; only then
    does `status` run: succeeded, 2 attempts, each priced, and weights equal to an
    uninterrupted 3-process run's."""
    from labs.moto_placement import PlacementGroups

    lab.asg.placement = PlacementGroups().install(monkeypatch)
    job_id = cli.launch(*RESNET9_NODES, "--nodes", "3", "--instance", "g5.xlarge", "--spot",
                        timeout=300)
    name = f"cloudtrain-{job_id}"
    first = lab.asg.wait_for_group(name, 3)
    nodes = cli.job(job_id)["nodes"]
    assert {n["instance"] for n in nodes} == {i.id for i in first}
    (gone,) = [i for i in first if i.id == nodes[lost]["instance"]]
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("epoch"), timeout=240,
             interval=1.0, what="rank 0's first streamed checkpoint")
    lab.asg.kill_launching_machine()
    _take_back(lab, name, gone, notice)
    replacement = wait_for(lambda: next((i for i in lab.asg.live(name)
                                         if i.id not in {f.id for f in first}), None),
                           timeout=120, what="the replacement")
    _until_everything_gone(lab, job_id, 600)
    assert replacement.user_data_exit == 0
    assert lab.asg.log("launch")[-1]["instance"] == replacement.id  # no launch after it

    job = cli.job(job_id)  # the first cloudtrain command since the laptop closed
    assert job["state"] == "succeeded", (job["reason"], job["timeline"])
    attempts = job["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    assert attempts[0]["outcome"] == "interrupted"
    assert attempts[1]["instance"] == replacement.id
    assert attempts[1]["resumed_step"] is not None and 0 < attempts[1]["resumed_step"] < 30, (
        attempts, lab.stored_checkpoint(job_id))
    assert all(a["usd"] is not None and a["usd"] > 0 for a in attempts), attempts
    out = cli.ok("status", job_id).stdout
    assert "attempts  2: 1 interrupted" in out, out
    # The survivors kept their ranks; the replacement took the lost one's (their files came
    # home from the job store: rank 0's as the job's, the others' from nodes/<rank>/).
    master = replacement.ip if lost == 0 else nodes[0]["address"]
    for rank in (0, 1, 2):
        log = (ct_home / "jobs" / job_id / ("nodes/%d" % rank if rank else "") /
               "output.log").read_text()
        if rank != lost:
            assert f"attempt 2: rank {rank} of 3, rendezvous {master}:" in log, log[-3000:]
    _same_as_uninterrupted(ct_home, job, *_uninterrupted_nodes(cli), 30)


# C3's run: 10 epochs of 5 steps, so that a second loss lands mid-training or near its end
RESNET9_NODES_LONG = ("--recipe", "resnet9", "--profile", "smoke", "--set", "gpus=3",
                      "--set", "epochs=10")


def test_C3_three_nodes_lose_node_1_then_the_rendezvous_after_a_notice_and_succeed(
        lab, cli, ct_home, monkeypatch):
    """C3, the chaos run's sequence: a resnet9 job on 3 nodes, the launching machine
    closed; node 1 is taken back without a notice; once the three train again, node 0 (the
    rendezvous, the checkpoint stream) has a spot notice and is taken back 15 s later.
    Each loss is one replacement and one attempt; the job ends succeeded (before: its two
    faults used three restarts and it ended preempted) with the weights of an uninterrupted
    run, and nothing is left."""
    from labs.moto_placement import PlacementGroups

    lab.asg.placement = PlacementGroups().install(monkeypatch)
    job_id = cli.launch(*RESNET9_NODES_LONG, "--nodes", "3", "--instance", "g5.xlarge",
                        "--spot", "--max-restarts", "3", timeout=300)
    name = f"cloudtrain-{job_id}"
    first = lab.asg.wait_for_group(name, 3)
    nodes = cli.job(job_id)["nodes"]
    by_rank = {k: next(i for i in first if i.id == n["instance"]) for k, n in enumerate(nodes)}
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("epoch"), timeout=240,
             interval=1.0, what="rank 0's first streamed checkpoint")
    lab.asg.kill_launching_machine()
    _take_back(lab, name, by_rank[1], notice=False)
    wait_for(lambda: next((i for i in lab.asg.live(name) if i.id not in
                           {f.id for f in first}), None), timeout=120, what="the replacement")
    resumed = (lab.stored_checkpoint(job_id) or {}).get("step") or 0
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0) > resumed,
             timeout=400, interval=1.0, what="the three training again")
    zero = by_rank[0]
    lab.imds.announce(zero.ip)
    time.sleep(15)
    if zero.id in [i.id for i in lab.asg.live(name)]:
        lab.take_back({"InstanceId": zero.id, "PrivateIpAddress": zero.ip})
    _until_everything_gone(lab, job_id, 900)

    job = cli.job(job_id)
    assert job["state"] == "succeeded", (job["reason"], job["timeline"])
    launched = [e["instance"] for e in lab.asg.log("launch")]
    assert len(launched) == 5, launched  # 3, and one replacement per loss
    assert [a["attempt"] for a in job["attempts"]] == [1, 2, 3], job["attempts"]
    _same_as_uninterrupted(ct_home, job, *_uninterrupted_nodes(cli, RESNET9_NODES_LONG), 50)


def test_three_nodes_whose_job_fails_end_failed_with_nothing_left(lab, cli, tmp_path,
                                                                  monkeypatch):
    """The job's own failure on a group of 3 nodes, the launching machine closed: every node
    looks for a lost peer (none: EC2 says all run, none had a notice), so the failure is the
    job's; rank 0 waits for the others' results, records final.json (failed, the exit code)
    and deletes the group, which ends the others: nothing is left, nothing was relaunched,
    and `status` then says failed and why."""
    from labs.moto_placement import PlacementGroups

    lab.asg.placement = PlacementGroups().install(monkeypatch)
    work = tmp_path / "own"
    work.mkdir()
    (work / "job.py").write_text("import sys, time\nprint('up', flush=True)\ntime.sleep(3)\n"
                                 "sys.exit(3)\n")
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--nodes", "3", "--workdir",
                        str(work), "--", "python3", "job.py", timeout=300)
    name = f"cloudtrain-{job_id}"
    first = lab.asg.wait_for_group(name, 3)
    lab.asg.kill_launching_machine()
    _until_everything_gone(lab, job_id, 240)
    # nothing relaunched: the group launched its 3 nodes and no more
    assert sorted(e["instance"] for e in lab.asg.log("launch")) == sorted(i.id for i in first)
    job = cli.job(job_id)
    assert job["state"] == "failed", (job["reason"], job["timeline"])
    assert job["exit_code"] == 3 and "exit" in (job["reason"] or ""), job["reason"]
    assert [a["attempt"] for a in job["attempts"]] == [1]


def test_three_nodes_laptop_on_the_record_follows_the_nodes_after_they_meet(lab, cli,
                                                                             tmp_path,
                                                                             monkeypatch):
    """The laptop stays on (its supervisor too) while node 0 of a 3-node group job is taken
    back: once the nodes have met the replacement, the job's record follows them (the
    replacement's host key checked against its console), so `status` says it runs, `logs`
    reads rank 0's log on the replacement, and the job's end is seen and collected as for any
    job; nothing is left."""
    from labs.moto_placement import PlacementGroups
    from test_spot_recovery import _own_job

    lab.asg.placement = PlacementGroups().install(monkeypatch)
    work = _own_job(tmp_path, 120)
    job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--nodes", "3", "--workdir",
                        str(work), "--", "python3", "job.py", "120", timeout=300)
    name = f"cloudtrain-{job_id}"
    first = lab.asg.wait_for_group(name, 3)
    nodes = cli.job(job_id)["nodes"]
    (zero,) = [i for i in first if i.id == nodes[0]["instance"]]
    wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0) >= 10, timeout=60,
             what="a streamed checkpoint at step 10")
    _take_back(lab, name, zero, notice=False)
    new = wait_for(lambda: next((i for i in lab.asg.live(name)
                                 if i.id not in {f.id for f in first}), None),
                   timeout=60, what="the replacement")
    job = wait_for(lambda: (lambda j: j if j["nodes"][0]["instance"] == new.id
                            or j["state"] == "succeeded" else None)(cli.job(job_id)),
                   timeout=120, interval=0.5, what="the record to follow the nodes")
    if job["state"] != "succeeded":
        assert job["state"] == "running" and not job["reason"], job["reason"]
        assert [n["instance"] for n in job["nodes"][1:]] == [n["instance"] for n in nodes[1:]]
        assert "attempt 2 starts at step" in cli.ok("logs", job_id).stdout
    job = cli.wait(job_id, timeout=180)
    assert job["state"] == "succeeded", (job["reason"], job["timeline"])
    assert [a["attempt"] for a in job["attempts"]] == [1, 2]
    assert "done at step 120" in cli.ok("logs", job_id).stdout
    wait_for(lambda: _everything_gone(lab) == {}, timeout=90, what="nothing left")
