"""Watching a job (cloudtrain/lifecycle/watch.py: `status` refreshes, reaps a job whose
agent died, checks an unfinished launch's launcher) on the local backend: read-only commands
never change a healthy job (F11), and a broken job directory never breaks them (F19)."""

from __future__ import annotations

import json
import re
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from cloudtrain import config, state
from conftest import unix_time
from cloudtrain.lifecycle import watch
from labs.aws import ec2_provider, moto_endpoint  # noqa: F401  (fixtures)
from labs.polling import wait_for
from test_lifecycle_autoscaled import activities, grouped  # noqa: F401  (fixtures)


def test_F11_a_status_acting_on_an_old_snapshot_never_fails_a_job_that_moved_on(ct_home):
    """`status` lists the active jobs, then checks each one's launcher. If the launcher
    finished the launch (RUNNING) and exited in between, the stale snapshot must not fail the
    job: the check is a compare-and-set on the state it saw."""
    settings = config.Settings.load()
    with state.open_store(config.home()) as store:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
        job = store.create_job(name=None, kind="command", recipe=None, command="true",
                               backend="local", spec={}, launcher=f"{socket.gethostname()}:{dead}")
        store.set_state(job.id, state.SYNCING)
        snapshot = store.job(job.id)  # what status listed
        store.set_state(job.id, state.SETTING_UP)
        store.set_state(job.id, state.RUNNING)  # the launcher finished, then exited
        after = watch._check_launcher(store, snapshot)
        assert after.state == state.RUNNING
        assert store.job(job.id).state == state.RUNNING
        # The same check on a current snapshot does fail an abandoned launch.
        other = store.create_job(name=None, kind="command", recipe=None, command="true",
                                 backend="local", spec={},
                                 launcher=f"{socket.gethostname()}:{dead}")
        store.set_state(other.id, state.SYNCING)
        assert watch.refresh(store, settings, store.job(other.id)).state == state.FAILED


@pytest.mark.parametrize("moved", ["attempt", "host"])
def test_F13_a_status_acting_on_the_run_before_a_relaunch_never_ends_the_next(cli, ct_home,
                                                                                moved):
    """CI, test_F13_termination_without_notice_resumes_from_the_last_upload: `status` listed
    a spot job running on attempt 1; its instance was taken back and the supervisor relaunched
    the job at the same address (moto, like a subnet, hands a terminated instance's address
    to the next). That `status` then probed the new instance before its agent started and
    ended the job with "the agent never started": the compare-and-set was on the state alone,
    and the job was `running` again. A decision on a probe's answer holds only for the run the
    snapshot saw: the same attempt and host record."""
    settings = config.Settings.load()
    job_id = cli.launch("--", "sleep", "30")
    jobdir = ct_home / "jobs" / job_id
    status = wait_for(lambda: json.loads((jobdir / "status.json").read_text())
                      if (jobdir / "status.json").exists() else None, what="status.json")
    with state.open_store(config.home()) as store:
        snapshot = store.job(job_id)  # what `status` listed: attempt 1, running
        assert snapshot.state == state.RUNNING
        # The instance is gone; the relaunch's instance, at the same address, has the job's
        # files but no agent yet.
        os.killpg(status["pgid"], signal.SIGKILL)
        os.kill(status["agent_pid"], signal.SIGKILL)
        subprocess.run(["tmux", "-L", (snapshot.host or {}).get("tmux_socket", "cloudtrain"),
                        "kill-session", "-t", f"ct-{job_id}"],
                       capture_output=True)
        time.sleep(0.3)
        (jobdir / "status.json").unlink()
        if moved == "attempt":
            store.record_facts(job_id, attempt=2)
        else:  # AWS Auto Scaling's replacement: the record follows it (another host key)
            store.update_job(job_id, host={**(snapshot.host or {}), "host_key": "another"})
        after = watch.refresh(store, settings, snapshot)
        assert after.state == state.RUNNING, after.reason
        assert store.job(job_id).state == state.RUNNING
        # The same probe for the run the store holds does end it: the check can fail.
        (jobdir / "status.json").unlink(missing_ok=True)
        ended = watch.refresh(store, settings, store.job(job_id))
        assert ended.state == state.FAILED and "the agent never started" in ended.reason


@pytest.fixture
def dead_agent_job(cli, ct_home):
    """A running local job whose agent was killed: the next status reaps it."""
    job_id = cli.launch("--", "sleep", "30")
    jobdir = ct_home / "jobs" / job_id
    status = wait_for(lambda: json.loads((jobdir / "status.json").read_text())
                      if (jobdir / "status.json").exists() else None, what="status.json")
    os.killpg(status["pgid"], signal.SIGKILL)
    os.kill(status["agent_pid"], signal.SIGKILL)
    time.sleep(0.3)
    return job_id, jobdir


@pytest.mark.parametrize("damage", ["status.json is a directory", "output.log is a directory",
                                    "the job directory is gone"])
def test_F19_a_broken_job_directory_never_breaks_status(cli, dead_agent_job, damage):
    job_id, jobdir = dead_agent_job
    if damage == "the job directory is gone":
        shutil.rmtree(jobdir)
    else:
        name = damage.split()[0]
        (jobdir / name).unlink()
        (jobdir / name).mkdir()
    for args in (("status",), ("status", job_id), ("status", "--json"), ("logs", job_id)):
        proc = cli(*args)
        assert "internal error" not in proc.stderr, (args, proc.stderr)
    assert cli.job(job_id)["state"] in ("failed", "running")


def test_a_job_that_answers_again_with_its_end_is_recorded_not_an_internal_error(cli, ct_home):
    """A job marked "host unreachable" (a probe that got no answer) whose host answers again
    with the job's end: the end is recorded with the agent's reason. The refresh once passed
    `reason` twice to set_state and `launch --follow` ended in 'internal error: TypeError'
    (seen when the lab's connection dropped as the job ended)."""
    job_id = cli.launch("--", "sh", "-c", "sleep 1; exit 3")
    with state.open_store(config.home()) as store:
        store.update_job(job_id, reason=f"{watch.UNREACHABLE}: no answer in 5 s")
    time.sleep(2.5)  # the job ends meanwhile
    job = wait_for(lambda: (lambda j: j if j["state"] == "failed" else None)(cli.job(job_id)),
                   what="the job's end recorded")
    assert job["exit_code"] == 3
    assert not (job["reason"] or "").startswith(watch.UNREACHABLE)


def test_u49_a_job_s_setup_shows_as_setting_up_then_running(cli, ct_home):
    """U49: while a job's `setup:` ran, `status` showed the job `running`: a 10-minute pip
    install looked like training with no epochs. It is `setting-up` until run.sh says the
    setup is done, then `running` from the setup's own end (the timeline and the cost's
    setup phase with it); `--state setting-up` finds it; a failing setup's job still has
    its log."""
    job_id = cli.launch("--setup", "sleep 8", "--", "sleep", "1")
    seen = cli.wait(job_id, states=("setting-up",), timeout=30)
    assert seen["state"] == "setting-up", seen
    # refreshed again from its host (the launch is over): still setting up, listed as that
    assert job_id in cli.ok("status", "--state", "setting-up").stdout
    cli.wait(job_id, states=("running", "succeeded"), timeout=30)
    job = cli.wait(job_id, timeout=30)
    assert job["state"] == "succeeded", job
    phases = {p["name"]: p for p in job["timeline"]}
    assert [p["name"] for p in job["timeline"]][-3:] == ["setting-up", "running", "succeeded"]
    assert re.fullmatch(r"setup done in [0-9]+ s", phases["running"]["detail"]), phases
    took = unix_time(phases["running"]["start"]) - unix_time(phases["setting-up"]["start"])
    # The setup's end is run.sh's `date +%s` (whole seconds, portable), so an 8 s setup
    # shows as at least 7 s after the launcher's start; a loaded machine saw 7.2-7.4 s.
    assert 7.0 <= took < 30, phases
    # with data staged first: staging, then the setup, then the command
    (ct_home / "mine").mkdir()
    staged = cli.launch("--data", f"mine={ct_home / 'mine'}", "--setup", "sleep 2", "--",
                        "true")
    job = cli.wait(staged, timeout=60)
    assert [p["name"] for p in job["timeline"]][-4:] == ["staging", "setting-up", "running",
                                                        "succeeded"], job["timeline"]
    failing = cli.launch("--setup", "exit 3", "--", "true")
    job = cli.wait(failing, timeout=30)
    assert job["state"] == "failed" and job["reason"].startswith("setup failed (exit code 3")
    assert "cloudtrain: setup failed (exit code 3)" in cli.ok("logs", failing).stdout


def test_status_refreshes_every_job_with_one_provider_per_backend(ct_home, monkeypatch):
    """`status` with several jobs whose hosts are gone (the laptop reopened after a night of
    recoveries) asked the cloud about each with a provider of its own: on AWS a session each,
    its credentials resolved (a role assumed) and its clients made again. One per backend
    now, for the whole refresh."""
    from cloudtrain import providers

    made = []
    real = providers._made

    def counting(name, settings):
        made.append(name)
        return real(name, settings)

    monkeypatch.setattr(providers, "_made", counting)
    settings = config.Settings.load()
    with state.open_store(config.home()) as store:
        ids = []
        for _ in range(3):
            job = store.create_job(name=None, kind="command", recipe=None, command="true",
                                   backend="local", spec={})
            store.update_job(job.id, host={"kind": "a host nobody can reach"},
                             jobdir=str(ct_home / "gone"))
            store.set_state(job.id, state.RUNNING)
            ids.append(job.id)
        watch.refresh_active(store, settings)
        assert made == ["local"]
        # each was looked up with it: no instance of its is left, so each job has ended
        assert [store.job(i).state for i in ids] == [state.FAILED] * 3


def test_a_group_job_closed_on_while_staging_ends_at_the_first_look(grouped, ct_home):
    """A job of an Auto Scaling group whose launching machine closed while it was `staging`:
    it staged, trained and ended on its instance, which stored its files and final.json,
    and the agent deleted the group. The first `status` after reads the stored files (the
    stager's end moves the job to `running` at that time) and then the end: the job is
    succeeded at once. (The end was a compare-and-set on the snapshot's `staging`, which the
    files' own step had just moved on: the job stayed `running` until a second look, and
    the e2e test of a laptop closed mid-staging saw it.)"""
    import getpass

    from cloudtrain.host import agent_control
    from labs.loopback import free_port

    g = grouped
    key = ct_home / "id_ed25519"
    key.write_text("not a key: the host never answers\n")
    g.store.update_job(g.id, jobdir="/home/ubuntu/.cloudtrain/jobs/" + g.id, host={
        "kind": "SSHHost", "host": "127.0.0.1", "port": free_port(), "user": getpass.getuser(),
        "key_path": str(key)})
    g.store.update_instance(g.i1, details={"auto_scaling_group": g.group,
                                           "address": "127.0.0.1"})
    g.store.set_state(g.id, state.STAGING)
    staged_at = time.time() - 60
    g.put(agent_control.STAGING_STATUS, {"state": "staged", "ended_at": staged_at,
                                         "bytes": 10, "total_bytes": 10})
    g.put("status.json", {"state": "succeeded", "exit_code": 0, "ended_at": staged_at + 30})
    g.final(state="succeeded", exit_code=0, attempt=1, instance=g.i1, ended_at=staged_at + 30)
    g.ec2.terminate_instances(InstanceIds=[g.i1])
    g.delete_group()
    settings = config.Settings.load()
    job = watch.refresh(g.store, settings, g.job)
    assert job.state == state.SUCCEEDED, (job.state, job.reason)
    phases = [e.phase for e in g.store.events(g.id)]
    assert phases.index(state.RUNNING) < phases.index(state.SUCCEEDED), phases


def _spot_job_taken_back(g) -> None:
    """`grouped`'s job as one this machine's supervisor relaunches, its instance taken back
    without a notice after it streamed some metrics (and no status.json)."""
    from labs.cloud import SPOT_REASON, terminate_with_reason
    from labs.loopback import free_port

    g.store.record_facts(g.id, auto_scaling_group=None)
    g.store.update_job(g.id, jobdir="/home/ubuntu/.cloudtrain/jobs/" + g.id,
                       spec={**g.job.spec.to_dict(), "recover": True, "max_restarts": 3},
                       host={"kind": "SSHHost", "host": "127.0.0.1", "port": free_port(),
                             "user": "ubuntu"})  # nothing answers there
    g.put("metrics.jsonl", b'{"step": 12, "time": 1}\n')
    terminate_with_reason(g.i1, SPOT_REASON)


@pytest.mark.parametrize("looks", ["another look first", "the same look"])
def test_F13_a_job_whose_files_came_home_from_the_store_is_decided_not_probed(grouped, ct_home,
                                                                               looks):
    """CI, and every run of test_F13_termination_without_notice_resumes_from_the_last_upload
    on a fresh machine: a spot instance taken back without a notice. One look at the job (a
    `status`) read its files from the job store, so its host record became this machine's
    copy, and had not decided yet; the supervisor's look then probed that copy as if an agent
    ran here: no status.json (the upload was cut short) and no agent, "the agent never
    started", and the job failed instead of recovering. A job whose files came home is
    decided as a lost host; the first look, going on from its snapshot, changes nothing more
    (and alone, it decides: the files' coming home is no other run)."""
    from cloudtrain.lifecycle import collect

    g = grouped
    _spot_job_taken_back(g)
    settings = config.Settings.load()
    snapshot = g.job  # the first look's
    assert collect.from_job_store(g.store, snapshot) is None  # ... cut short here
    assert g.job.host["collected_from"] == snapshot.host
    if looks == "another look first":
        job = watch.refresh(g.store, settings, g.job)
        assert job.state == state.RECOVERING, (job.state, job.reason)
    job = watch.interrupted(g.store, settings, snapshot, {}, "spot instance interrupted "
                            "without a notice", host_alive=False, gone={g.i1})
    assert job.state == state.RECOVERING, (job.state, job.reason)
    assert "without a notice" in job.reason and "never started" not in job.reason
    assert [e.phase for e in g.store.events(g.id)].count(state.RECOVERING) == 1
    [first] = g.store.attempts(g.id)
    assert first.outcome == "interrupted" and first.ended_at is not None
    # Brought home twice, the record still says from where (not from this machine's copy).
    collect.from_job_store(g.store, g.job)
    assert g.job.host["collected_from"] == snapshot.host
    assert g.job.host["remote_jobdir"] == "/home/ubuntu/.cloudtrain/jobs/" + g.id


def test_F13_a_look_at_the_lost_run_never_rewrites_the_relaunch_s_record(grouped, ct_home):
    """The same CI test, its next failure: `status` and the supervisor both saw the instance
    gone while the job was `running`; the supervisor decided first and relaunched, and the
    `status` then brought the files home from the job store and pointed the job's record
    (host, job directory) at this machine's copy, under the relaunch that was syncing. The
    relaunch set its host again but not its directory, and the next probe of the new
    instance asked for this machine's path there: "the agent never started". What a look
    learnt about one run lands only on that run, in the state it saw."""
    from cloudtrain.lifecycle import collect

    g = grouped
    _spot_job_taken_back(g)
    settings = config.Settings.load()
    late = g.job  # the `status`'s snapshot: running, attempt 1
    first = watch.refresh(g.store, settings, g.job)  # the supervisor's look decides
    assert first.state == state.RECOVERING, (first.state, first.reason)
    # The relaunch: attempt 2 on a new instance (what recovery and launch record).
    g.store.set_state(g.id, state.SYNCING)
    g.store.record_facts(g.id, attempt=2)
    relaunch = {"kind": "SSHHost", "host": "10.0.0.10", "port": 22, "user": "ubuntu"}
    g.store.update_job(g.id, host=relaunch, jobdir="/home/ubuntu/.cloudtrain/jobs/" + g.id)
    # The late look goes on from its snapshot.
    collect.from_job_store(g.store, late)
    job = watch.interrupted(g.store, settings, late, {}, "spot instance interrupted without "
                            "a notice", host_alive=False, gone={g.i1})
    assert (job.state, job.host, job.jobdir) == (
        state.SYNCING, relaunch, "/home/ubuntu/.cloudtrain/jobs/" + g.id)
    assert [e.phase for e in g.store.events(g.id)].count("results") == 1  # the first look's
