"""A kept instance as a user sees and manages it (issue 34: U38, U39, U40 and the queue),
against the lab: moto's EC2 and a loopback sshd that answers at the instances' addresses.
The lab's `sudo` records each power-off re-arm (aws.rearms()) instead of arming one, and its
shutdown command terminates the instance in moto, as EC2 does for a power-off."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time

import pytest

from conftest import unix_time
from labs.aws import aws, moto_endpoint  # noqa: F401  (fixtures)
from labs.polling import wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs openssh-server")


def _keep(cli, *args: str, command=("echo", "first")) -> str:
    proc = cli("launch", "--instance", "g5.xlarge", "--keep", *args, "--follow", "--quiet",
               "--", *command)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[0]


def _state(aws) -> str:
    (raw,) = aws.instances()
    return raw["State"]["Name"]


def _db(ct_home):
    db = sqlite3.connect(ct_home / "state.db")
    db.row_factory = sqlite3.Row
    return db


# -- U38 ----------------------------------------------------------------------------------------


def test_U38_ssh_reaches_a_kept_instance_after_its_job_and_says_when_it_powers_off(cli, aws):
    """U38: after a --keep job ended, `ssh` said "its instance is gone" while EC2 showed it
    running (and billing). It reaches the instance until it is terminated, and says when
    the instance powers itself off."""
    job = _keep(cli, "--name", "kept3")
    assert _state(aws) == "running"
    proc = cli("ssh", "kept3", "--", "echo", "reached-after")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "reached-after"
    note = " ".join(proc.stderr.split())
    (raw,) = aws.instances()
    assert raw["InstanceId"] in note and "running and billing $1.0060/h" in note
    ended = unix_time(cli.job(job)["ended_at"])
    off = time.strftime("%H:%M", time.localtime(ended + 3600))
    assert f"powers itself off at {off}" in note and "60 min after its last job" in note
    assert f"cloudtrain down {job}" in note
    cli.ok("down", job)
    proc = cli("ssh", job, "--", "true")
    assert proc.returncode == 2 and "has ended (succeeded)" in proc.stderr


def test_U38_attach_after_the_job_opens_a_tmux_session_on_the_kept_instance(cli, aws, ct_home):
    """U38: `attach` said the job had ended while its instance ran on. After the job it
    reaches the kept instance too: a tmux session of its own there, over the pinned key."""
    import subprocess

    from cloudtrain import config, state
    from cloudtrain.lifecycle import inspect

    job = _keep(cli)
    proc = cli("attach", job)  # no terminal here: said, as for a running job
    assert proc.returncode == 2 and "attach needs a terminal" in proc.stderr
    with state.Store(ct_home / "state.db") as store:
        reach = inspect.attach_argv(store, config.Settings.load(), store.find_job(job))
    socket = os.environ["CLOUDTRAIN_TMUX_SOCKET"]
    assert reach.argv[0] == "ssh" and "StrictHostKeyChecking=yes" in reach.argv
    assert reach.argv[-1] == f"tmux -L {socket} new-session -A -s ct-{job}-kept"
    assert reach.kept["instance"] == aws.instances()[0]["InstanceId"]
    # the same ssh line, with a command that makes the session detached, reaches it
    made = subprocess.run(reach.argv[:-1] + [reach.argv[-1].replace("-A", "-d")],
                          capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    alive = subprocess.run(["tmux", "-L", socket, "has-session", "-t", f"ct-{job}-kept"])
    subprocess.run(["tmux", "-L", socket, "kill-session", "-t", f"ct-{job}-kept"])
    assert alive.returncode == 0


def test_U38_ssh_to_a_job_whose_instance_went_on_names_the_job_that_has_it(cli, aws):
    first = _keep(cli)
    second = cli("launch", "--on", first, "--follow", "--quiet", "--", "echo", "second")
    assert second.returncode == 0, second.stderr
    second_id = second.stdout.splitlines()[0]
    proc = cli("ssh", first, "--", "true")
    assert proc.returncode == 2
    (raw,) = aws.instances()
    assert f"its instance {raw['InstanceId']} went on to job {second_id}" in proc.stderr
    assert f"Hint: cloudtrain ssh {second_id}" in proc.stderr
    assert cli("ssh", second_id, "--", "echo", "ok").stdout.strip() == "ok"


# -- U40 ----------------------------------------------------------------------------------------


def test_U40_status_shows_a_kept_instance_running_and_billing_with_its_power_off(cli, aws):
    """U40: `status` said `succeeded ~$0.02` and nothing of the instance that still billed.
    The row says kept, the line under the table what bills since when and when it powers
    itself off; `status --json` and `status JOB` say the same."""
    job = _keep(cli, "--name", "kept3")
    (raw,) = aws.instances()
    ended = unix_time(cli.job(job)["ended_at"])
    out = cli.ok("status", env={"COLUMNS": "200"}).stdout
    row = next(line for line in out.splitlines() if line.startswith(job))
    assert "succeeded, kept" in row
    kept_line = " ".join(out.split("kept: ", 1)[1].split())
    assert kept_line.startswith(f"{raw['InstanceId']} (g5.xlarge, us-east-1) of job {job} "
                                "(kept3): running and billing $1.0060/h since")
    off = time.strftime("%H:%M", time.localtime(ended + 3600))
    assert f"powers itself off at {off} (in 59m)" in kept_line or \
        f"powers itself off at {off} (in 1h)" in kept_line
    assert f"cloudtrain launch --on {job}" in kept_line and f"cloudtrain down {job}" in kept_line

    (listed,) = json.loads(cli.ok("status", "--json").stdout)
    kept = listed["kept"]
    assert kept["instance"] == raw["InstanceId"] and kept["state"] == "kept"
    assert kept["idle_minutes"] == 60
    assert abs(unix_time(kept["power_off_at"]) - (ended + 3600)) < 1
    assert kept["price_per_hour"] == pytest.approx(1.006) and kept["due"] is False
    assert listed["queue"] is None

    detail = cli.ok("status", job).stdout
    assert re.search(r"cost +~\$[0-9.]+ \(so far: its kept instance still bills\)", detail)
    assert f"kept      {raw['InstanceId']} (g5.xlarge, us-east-1) of job {job}" in detail
    assert cli.job(job)["kept"]["instance"] == raw["InstanceId"]

    cli.ok("down", job)
    out = cli.ok("status").stdout
    assert ", kept" not in out and "kept:" not in out and "succeeded" in out


def test_U40_the_idle_power_off_is_armed_by_default_and_configurable(cli, aws):
    """U40: a kept instance powered off max runtime + 30 min after its last job *started*
    unless --idle-minutes was given; now the agent re-arms its timer at each job's end for
    the idle time: 60 min by default, keep_idle_minutes in config.yaml, --idle-minutes."""
    first = _keep(cli, "--max-runtime", "10")
    wait_for(lambda: len(aws.rearms()) == 2, timeout=20, what="the re-arm after the job")
    assert aws.rearms() == ["40", "60"]
    cli.ok("down", first)
    aws.write_config(keep_idle_minutes=5)
    second = _keep(cli, "--max-runtime", "10")
    wait_for(lambda: len(aws.rearms()) == 4, timeout=20, what="the re-arm after the job")
    assert aws.rearms()[2:] == ["40", "5"]
    assert cli.job(second)["spec"]["idle_minutes"] == 5
    help_text = " ".join(cli.ok("launch", "--help").stdout.split())
    assert "--keep / --no-keep" in help_text and "keep_idle_minutes: 60" in help_text


def test_U40_status_learns_that_a_kept_instance_powered_itself_off(cli, aws, ct_home):
    """Once its power-off time has passed, `status` asks EC2 (once, not on every call while
    it cannot) and, the instance gone, settles the job's cost: no longer kept or billing."""
    job = _keep(cli, "--idle-minutes", "1")
    assert "succeeded, kept" in cli.ok("status").stdout
    (raw,) = aws.instances()
    aws.ec2.terminate_instances(InstanceIds=[raw["InstanceId"]])  # what its timer did
    with _db(ct_home) as db:  # ... some minutes ago: its idle minute and the grace passed
        db.execute("UPDATE jobs SET ended_at = ended_at - 600 WHERE id = ?", (job,))
    out = cli.ok("status").stdout
    row = next(line for line in out.splitlines() if line.startswith(job))
    assert ", kept" not in out and "kept:" not in out and "succeeded" in row
    assert "~" not in row  # its cost settled
    (inst,) = [dict(r) for r in _db(ct_home).execute("SELECT * FROM instances")]
    assert inst["state"] == "terminated" and inst["terminated_at"]


# -- U39 ----------------------------------------------------------------------------------------


def test_U39_on_keeps_the_instance_by_default_and_no_keep_powers_it_off(cli, aws):
    """U39: `launch --on JOB` without --keep powered the kept instance off after the new job,
    and nothing said so. It keeps it (with the same idle time) unless --no-keep."""
    first = _keep(cli, "--idle-minutes", "7")
    second = cli("launch", "--on", first, "--follow", "--quiet", "--", "echo", "second")
    assert second.returncode == 0, second.stderr
    second_id = second.stdout.splitlines()[0]
    wait_for(lambda: len(aws.rearms()) == 4, timeout=20, what="the second job's idle re-arm")
    assert aws.rearms()[3] == "7"  # the instance's idle time, inherited
    assert _state(aws) == "running" and aws.shutdowns() == []
    assert "succeeded, kept" in next(l for l in cli.ok("status").stdout.splitlines()
                                     if l.startswith(second_id))
    third = cli("launch", "--on", second_id, "--no-keep", "--follow", "--quiet", "--", "true")
    assert third.returncode == 0, third.stderr
    third_id = third.stdout.splitlines()[0]
    wait_for(lambda: _state(aws) == "terminated", timeout=30, what="the power-off")
    assert [s["job"] for s in aws.shutdowns()] == [third_id]
    proc = cli("launch", "--on", first, "--", "true")
    assert proc.returncode == 2 and "its instance is gone" in proc.stderr


def test_U39_F41_down_of_the_job_an_instance_was_handed_to_terminates_it(cli, aws):
    """The instance `launch --on` hands over wears the tag of the job that launched it (EC2
    tags are written at launch only), and F41's `release` spares a recorded instance EC2
    shows with another job's tag: `down` of the job holding it now must still end it."""
    first = _keep(cli)
    second = cli("launch", "--on", first, "--follow", "--quiet", "--", "echo", "second")
    assert second.returncode == 0, second.stderr
    second_id = second.stdout.splitlines()[0]
    assert _state(aws) == "running"
    cli.ok("down", second_id)
    wait_for(lambda: _state(aws) in ("shutting-down", "terminated"), timeout=30,
             what="the kept instance's termination")
    events = " ".join(e["detail"] or "" for e in cli.job(second_id)["timeline"])
    assert "NOT terminated" not in events


def test_U39_the_on_plan_says_what_happens_to_the_instance_and_what_it_costs(cli, aws):
    """U39: the --on dry run had only job, backend, region and instance: no power-off, no
    price, no at-most line."""
    first = _keep(cli)
    (raw,) = aws.instances()
    out = cli.ok("launch", "--on", first, "--max-runtime", "60", "--dry-run", "--", "true").stdout
    rows = {line[:12].strip(): " ".join(line[12:].split()) for line in out.splitlines()
            if line.startswith(" ")}
    assert rows["instance"].startswith(f"{raw['InstanceId']} (g5.xlarge: 1x A10G), kept by job "
                                       f"{first} (--on)")
    assert rows["price"].startswith("$1.0060/h")
    assert rows["at most"] == ("$2.03: one instance of up to 120 min (the max runtime of 60 "
                               "min + 60 idle until the kept instance powers itself off), with "
                               "its 100 GB gp3 disk ($0.0110/h)")
    assert rows["shutdown"].startswith("kept after the job: it bills until it powers itself "
                                       "off 60 min after its last job ends")
    out = cli.ok("launch", "--on", first, "--no-keep", "--dry-run", "--", "true").stdout
    shutdown = " ".join(next(l for l in out.splitlines() if "shutdown" in l).split())
    assert "the agent powers the kept instance off after this job (--no-keep" in shutdown


# -- the queue ------------------------------------------------------------------------------------


def _gated(tmp_path, then: str = "true") -> list[str]:
    """A job that runs until the test opens its gate (a file), then runs `then`."""
    gate = tmp_path / "gate"
    return ["bash", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done; {then}"]


def _instance_file(aws, job: str, name: str) -> str:
    """A file of a job's directory on the lab's instance (this machine's disk)."""
    path = aws.work / "remote" / "jobs" / job / name
    return path.read_text() if path.exists() else ""


def test_on_a_busy_kept_instance_the_job_is_queued_there_and_runs_with_this_machine_off(
        cli, aws, tmp_path):
    """Issue 34 (SkyPilot's `exec`/`queue`): `launch --on JOB` while the kept instance runs a
    job queues the new one behind it, on the instance: with no cloudtrain process running
    after the launch (the laptop closed), the instance starts it when the first job ends.
    `status` shows it queued, then running on the instance it took over."""
    first = cli.launch("--instance", "g5.xlarge", "--keep", "--name", "busy", "--",
                       *_gated(tmp_path, "echo first-done"))
    wait_for(lambda: cli.job(first)["state"] == "running", timeout=30, what="the first job")
    plan = cli.ok("launch", "--on", "busy", "--dry-run", "--", "true").stdout
    queue = " ".join(next(l for l in plan.splitlines() if l.startswith("  queue")).split())
    assert queue.startswith(f"queue job {first} runs on it now: this job is queued behind, on "
                            "the instance, and starts there when they have ended, whether or "
                            "not this machine is on")
    proc = cli("launch", "--on", "busy", "--", "bash", "-c", "echo second-ran")
    assert proc.returncode == 0, proc.stderr
    second = re.search(r"queued job ([0-9a-f]+)", proc.stdout).group(1)
    assert f"behind job {first}" in proc.stdout and "whether or not this machine is on" in \
        proc.stdout
    assert cli.job(second)["state"] == "queued"
    assert cli.job(second)["state"] == "queued"  # `status JOB` leaves it queued
    out = cli.ok("status", env={"COLUMNS": "200"}).stdout
    assert " queued " in next(l for l in out.splitlines() if l.startswith(second))
    assert f"queue: " in out and f"runs job {first} (busy); queued behind it: {second}" in \
        " ".join(out.split())
    (listed,) = [j for j in json.loads(cli.ok("status", "--json").stdout) if j["id"] == second]
    assert listed["queue"]["position"] == 1 and listed["queue"]["running"] == first

    # No cloudtrain command from here on: only the instance's own agents.
    (tmp_path / "gate").write_text("")
    wait_for(lambda: "second-ran" in _instance_file(aws, second, "output.log"), timeout=40,
             interval=0.5, what="the instance to start the queued job by itself")
    first_status = json.loads(_instance_file(aws, first, "status.json"))
    second_status = json.loads(_instance_file(aws, second, "status.json"))
    assert second_status["started_at"] >= first_status["ended_at"]
    assert _state(aws) == "running"  # the first job kept it, and the second keeps it

    job = cli.wait(second)
    assert job["state"] == "succeeded"
    (raw,) = aws.instances()
    assert any(p["name"] == "instance" and f"{raw['InstanceId']} taken over from job {first}"
               in (p.get("detail") or "") for p in job["timeline"])
    assert job["kept"]["instance"] == raw["InstanceId"]  # the instance is kept by the last job
    assert cli.job(first)["state"] == "succeeded"


def test_down_of_a_queued_job_takes_it_out_of_the_queue(cli, aws, tmp_path):
    first = cli.launch("--instance", "g5.xlarge", "--keep", "--", *_gated(tmp_path))
    wait_for(lambda: cli.job(first)["state"] == "running", timeout=30, what="the first job")
    second = cli("launch", "--on", first, "--quiet", "--", "echo", "never")
    assert second.returncode == 0, second.stderr
    second_id = second.stdout.split()[-1]
    out = cli.ok("down", second_id).stdout
    assert f"{second_id}: cancelled; taken out of the kept instance's queue (it never ran)" in out
    detail = cli.job(second_id)
    assert detail["state"] == "cancelled" and "taken out" not in detail["log_tail"]
    (tmp_path / "gate").write_text("")
    cli.wait(first)
    time.sleep(1)
    assert _instance_file(aws, second_id, "status.json") == ""  # the instance never started it
    assert _state(aws) == "running"  # the first job's instance is still kept


def test_down_of_the_running_job_terminates_the_instance_and_cancels_the_queue(cli, aws,
                                                                                tmp_path):
    first = cli.launch("--instance", "g5.xlarge", "--keep", "--", *_gated(tmp_path))
    wait_for(lambda: cli.job(first)["state"] == "running", timeout=30, what="the first job")
    second = cli("launch", "--on", first, "--quiet", "--", "echo", "never")
    second_id = second.stdout.split()[-1]
    out = " ".join(cli.ok("down", first).stdout.split())
    assert f"queued there, never run, cancelled: {second_id}" in out
    assert _state(aws) == "terminated"
    assert cli.job(second_id)["state"] == "cancelled"


def test_launch_on_a_busy_instance_with_follow_waits_its_turn_then_follows(cli, aws, tmp_path):
    import threading

    first = cli.launch("--instance", "g5.xlarge", "--keep", "--", *_gated(tmp_path))
    wait_for(lambda: cli.job(first)["state"] == "running", timeout=30, what="the first job")
    threading.Timer(4.0, lambda: (tmp_path / "gate").write_text("")).start()
    proc = cli("launch", "--on", first, "--follow", "--", "echo", "followed")
    assert proc.returncode == 0, proc.stderr
    assert "followed" in proc.stdout and "queued job" in proc.stderr
    assert proc.stderr.rstrip().endswith("succeeded")


def test_down_all_stops_a_busy_kept_instance_and_its_queue_once(cli, aws, tmp_path):
    first = cli.launch("--instance", "g5.xlarge", "--keep", "--", *_gated(tmp_path))
    wait_for(lambda: cli.job(first)["state"] == "running", timeout=30, what="the first job")
    second = cli("launch", "--on", first, "--quiet", "--", "echo", "never").stdout.split()[-1]
    started = time.monotonic()
    out = cli.ok("down", "--all", "-y").stdout
    assert time.monotonic() - started < 60
    assert cli.job(first)["state"] == "cancelled" and cli.job(second)["state"] == "cancelled"
    assert "could not be reached" not in out and _state(aws) == "terminated"
