"""host/auto_scaling.py with the agent (issue 27, item 3): a job run by an Auto Scaling group
whose job has truly ended writes final.json to the job store through its grant and deletes its
own group and launch template with the role's credentials (the fake IMDS's, no AWS keys on the
"instance"), then powers off; a preempted end leaves both, so that AWS's replacement goes on.
The agent runs from a folder of its own as a real process, against a ThreadedMotoServer."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from cloudtrain.host import auto_scaling, job_records
from cloudtrain.hosts import write_host_files
from labs.aws import group_with_template, instance_store, moto_endpoint

__all__ = ["moto_endpoint"]  # the lab's fixture

REGION = "us-east-1"
BUCKET = "cloudtrain-123456789012-us-east-1"
OWNER = "AIDAEXAMPLEOWNER0001"
JOB = "asg01"
PREFIX = f"jobs/{OWNER}/{JOB}/"
GROUP = f"cloudtrain-{JOB}"
INSTANCE = "i-0aaaabbbbccccdddd"

RECORDER = """import json, sys, time
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"argv": sys.argv[2:], "at": time.time()}) + "\\n")
"""


def stored(s3, key: str) -> dict | None:
    try:
        return json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    except s3.exceptions.NoSuchKey:
        return None


@pytest.fixture
def lab(moto_endpoint, tmp_path, monkeypatch):
    s3, imds, grant = instance_store(moto_endpoint, monkeypatch, BUCKET, JOB, OWNER, REGION)
    imds.metadata["127.0.0.1"] = {"/latest/meta-data/instance-id": INSTANCE,
                                  "/latest/meta-data/placement/availability-zone": "us-east-1b",
                                  "/latest/meta-data/instance-type": "g5.xlarge",
                                  "/latest/meta-data/instance-life-cycle": "spot"}
    asg, ec2, present = group_with_template(moto_endpoint, GROUP, REGION)
    yield type("Lab", (), dict(s3=s3, imds=imds, grant=grant, asg=asg, present=present,
                               endpoint=moto_endpoint, tmp=tmp_path))
    imds.close()


def group_conf(lab, **over) -> dict:
    return {"group": GROUP, "region": REGION, "endpoint": lab.endpoint, "max_restarts": 3,
            "prefix": PREFIX, "bucket": BUCKET, **over}


def run_agent(lab, run_sh: str, announce_after: float | None = None, **settings):
    """The agent, shipped into a folder of its own, run on `run_sh` with the group's
    job.json; no AWS keys in its environment. Returns (jobdir, status, power-offs)."""
    home = lab.tmp / "agent-x"
    home.mkdir()
    write_host_files(home)
    (lab.tmp / "rec.py").write_text(RECORDER)
    calls = lab.tmp / "calls.jsonl"
    jobdir = lab.tmp / "jobs" / JOB
    jobdir.mkdir(parents=True)
    (jobdir / "run.sh").write_text(run_sh)
    (jobdir / "job.json").write_text(json.dumps({
        "job_id": JOB, "heartbeat_s": 0.1, "grace_s": 5, "results_store": lab.grant,
        "imds_url": lab.imds.url, "spot_poll_s": 0.2, "shutdown_delay_s": 0,
        "collect_wait_s": 0, "env": {"CLOUDTRAIN_ATTEMPT": "2"},
        "shutdown_command": f"{shlex.quote(sys.executable)} {lab.tmp / 'rec.py'} {calls} off",
        "auto_scaling": group_conf(lab), **settings}))
    env = {"PATH": os.environ["PATH"], "HOME": str(lab.tmp), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen([sys.executable, str(home / "agent.py"), "run", str(jobdir)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if announce_after is not None:
        time.sleep(announce_after)
        lab.imds.announce("127.0.0.1")
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    status = json.loads((jobdir / "status.json").read_text())
    offs = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() \
        else []
    return jobdir, status, offs


@pytest.mark.parametrize("run_sh, state, code", [("exit 0\n", "succeeded", 0),
                                                ("exit 3\n", "failed", 3)])
def test_a_job_that_ends_stores_its_end_then_deletes_its_group_and_template(
        lab, run_sh, state, code):
    assert lab.present() == ([GROUP], [GROUP])
    jobdir, status, offs = run_agent(lab, run_sh)
    final = stored(lab.s3, PREFIX + job_records.FINAL)
    assert final is not None and final["state"] == state and final["exit_code"] == code
    assert (final["attempt"], final["instance"]) == (2, INSTANCE)
    assert lab.present() == ([], [])  # AWS relaunches nothing after the end
    assert len(offs) == 1 and status["group_ended"] is True
    assert status["final_stored"]["at"] <= status["shutdown_requested_at"] <= offs[0]["at"]
    assert "auto_scaling_errors" not in status
    # The results went up before final.json: a reader who sees the end finds them.
    assert stored(lab.s3, PREFIX + "manifest.json") is not None
    log = (jobdir / "output.log").read_text()
    assert f"group {GROUP} deleted" in log and f"launch template {GROUP} deleted" in log
    # Every metadata request carried the IMDSv2 token: the role's credentials, no keys.
    assert all(h for _, _, h in lab.imds.seen)


def test_a_preempted_end_leaves_the_group_for_its_replacement(lab):
    """A spot notice: the job stops as preempted; no final.json, the group and its template
    stay (AWS's replacement resumes the job), and the instance still powers off."""
    jobdir, status, offs = run_agent(lab, "sleep 30\n", announce_after=1.0)
    assert status["state"] == "preempted"
    assert stored(lab.s3, PREFIX + job_records.FINAL) is None
    assert lab.present() == ([GROUP], [GROUP])
    assert len(offs) == 1 and "group_ended" not in status


def test_a_sigterm_without_a_cancel_is_the_instance_going_away_not_an_end(lab):
    """AWS reclaims a spot instance without notice by shutting it down: the agent gets
    systemd's SIGTERM with no cancel file (only `down` writes one). A group's job then ends
    preempted and its group stays; a `down` (cancel file) is an end like any other."""
    home = lab.tmp / "agent-x"
    jobdir = lab.tmp / "jobs" / JOB
    import threading

    def term_agent():
        from labs.polling import wait_for

        status = wait_for(lambda: (jobdir / "status.json").exists() and json.loads(
            (jobdir / "status.json").read_text()).get("state") == "running", timeout=30)
        assert status
        pid = json.loads((jobdir / "status.json").read_text())["agent_pid"]
        os.kill(pid, 15)

    threading.Thread(target=term_agent, daemon=True).start()
    _, status, offs = run_agent(lab, "sleep 30\n")
    assert home.exists()
    assert status["state"] == "preempted" and "without a cancel" in status["reason"]
    assert stored(lab.s3, PREFIX + job_records.FINAL) is None
    assert lab.present() == ([GROUP], [GROUP])
    assert len(offs) == 1


# A job that trains `steps` steps (a metrics row each) and saves a checkpoint every 5, with
# its checkpoint-info.json; with a 4th argument it then waits for the agent's SIGTERM.
STEPS_JOB = """import json, os, sys, time
steps, wait = int(sys.argv[1]), len(sys.argv) > 2
os.makedirs("checkpoints", exist_ok=True)
with open("metrics.jsonl", "a") as m:
    for step in range(1, steps + 1):
        m.write(json.dumps({"step": step, "time": time.time()}) + "\\n")
        m.flush()
        if step % 5 == 0:
            for name, doc in (("last.pt", {"w": step}), ("checkpoint-info.json", {"step": step})):
                with open("checkpoints/." + name, "w") as f:
                    json.dump(doc, f)
                os.replace("checkpoints/." + name, "checkpoints/" + name)
        time.sleep(0.05)
while wait:
    time.sleep(0.1)
"""


@pytest.mark.parametrize("notice", [False, True])
def test_C1_rank_0_keeps_how_far_its_attempt_got_in_the_job_store(lab, notice):
    """C1 (issue 34): the launching machine, closed while AWS replaced instances, could not
    tell how far an attempt got. The agent of a group's job (rank 0 of one node) posts
    attempts/<n>/progress.json through the job's grant: at the run's end (here after a spot
    notice, or the job's own end), the step of the run's last metrics row and of the newest
    checkpoint it streamed, as the launching machine's checker reads them."""
    (lab.tmp / "job.py").write_text(STEPS_JOB)
    run_sh = f"exec {shlex.quote(sys.executable)} {lab.tmp / 'job.py'} 12" + \
        (" wait\n" if notice else "\n")
    jobdir, status, _ = run_agent(lab, run_sh, announce_after=4.0 if notice else None,
                                  checkpoint_stream={"settle_s": 0.2, "poll_s": 0.2,
                                                     "attempt": 2})
    assert status["state"] == ("preempted" if notice else "succeeded")
    got = job_records.check_progress(stored(lab.s3, PREFIX + "attempts/2/progress.json"), 2)
    assert got is not None, (jobdir / "output.log").read_text()
    assert (got["step"], got["checkpoint_step"]) == (12, 10)
    assert status["checkpoint_stream"]["step"] == 10  # what the stream stored last
    assert abs(got["at"] - time.time()) < 60


def test_a_store_that_does_not_answer_is_said_and_the_power_off_still_comes(lab):
    """final.json cannot be stored (nothing answers at the grant's URL): said in the log and
    status.json; the group is then left to the deadline's scheduled action (without a stored
    end a replacement would run the job again), and the power-off comes."""
    from labs.loopback import free_port

    dead = dict(lab.grant, url=f"http://127.0.0.1:{free_port()}/")
    jobdir, status, offs = run_agent(lab, "exit 0\n", results_store=dead)
    assert status["state"] == "succeeded" and len(offs) == 1
    assert [e["step"] for e in status["auto_scaling_errors"]] == ["final.json"]
    assert "final.json was not stored" in (jobdir / "output.log").read_text()
    assert lab.present() == ([GROUP], [GROUP])


def test_a_role_that_cannot_end_the_group_is_said_and_the_power_off_still_comes(lab):
    """No instance profile (IMDS has no role): final.json is stored through the grant, each
    of the group's calls fails with its line, and the power-off comes all the same."""
    lab.imds.roles["127.0.0.1"] = None
    jobdir, status, offs = run_agent(lab, "exit 0\n")
    assert stored(lab.s3, PREFIX + job_records.FINAL)["state"] == "succeeded"
    assert len(offs) == 1 and status["group_ended"] is False
    errors = status["auto_scaling_errors"]
    assert [e["step"] for e in errors] == ["delete group", "set group to 0",
                                           "delete launch template"]
    assert all("instance profile" in e["error"] for e in errors)
    assert lab.present() == ([GROUP], [GROUP])


def test_an_invalid_auto_scaling_setting_is_said_and_the_power_off_still_comes(lab):
    jobdir, status, offs = run_agent(lab, "exit 0\n", auto_scaling=group_conf(
        lab, group="bad name; rm -rf /"))
    assert len(offs) == 1
    assert status["auto_scaling_errors"][0]["step"] == "auto_scaling"
    assert "auto_scaling.group is not a group" in (jobdir / "output.log").read_text()
    assert lab.present() == ([GROUP], [GROUP])


def test_end_group_goes_on_to_the_template_when_the_group_is_gone_already(lab):
    """A replacement that ends the group after the agent did: "not found" is done, not a
    failure; the Query calls are signed with the role's credentials (RoleCredentials)."""
    from cloudtrain.host.awsapi import RoleCredentials

    lab.asg.delete_auto_scaling_group(AutoScalingGroupName=GROUP, ForceDelete=True)
    steps = auto_scaling.end_group(group_conf(lab), RoleCredentials(lab.imds.url),
                                   clock=lambda s: None)
    assert [(s, ok) for s, ok, _ in steps] == [("delete group", True),
                                               ("delete launch template", True)]
    assert "already" in steps[0][2]
    assert lab.present() == ([], [])


def test_end_group_sets_the_group_to_0_where_deleting_it_is_refused(lab, monkeypatch):
    calls = []
    real = auto_scaling.call

    def refuse_delete(service, params, *a, **k):
        calls.append(params["Action"])
        if params["Action"] == "DeleteAutoScalingGroup":
            return False, "AccessDenied: not allowed"
        return real(service, params, *a, **k)

    monkeypatch.setattr(auto_scaling, "call", refuse_delete)
    from cloudtrain.host.awsapi import RoleCredentials

    steps = auto_scaling.end_group(group_conf(lab), RoleCredentials(lab.imds.url))
    assert calls == ["DeleteAutoScalingGroup", "UpdateAutoScalingGroup", "DeleteLaunchTemplate"]
    assert [(s, ok) for s, ok, _ in steps] == [("delete group", False), ("set group to 0", True),
                                               ("delete launch template", True)]
    group = lab.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])[
        "AutoScalingGroups"][0]
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == (0, 0, 0)


# -- a job on several nodes (host/regroup.py): its peers as EC2 sees them, and this node ------

def _instances(lab, count: int) -> list[str]:
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=lab.endpoint)
    return [i["InstanceId"] for i in ec2.run_instances(
        ImageId="ami-12c6146b", InstanceType="g5.xlarge", MinCount=count,
        MaxCount=count)["Instances"]], ec2


def test_instance_states_are_ec2s_asked_with_the_role(lab):
    """DescribeInstances signed with the role's credentials (the fake IMDS's, no AWS keys):
    a running peer and a terminated one, each with EC2's state name; ids EC2 does not know
    make the whole call an InvalidInstanceID.NotFound, which is "gone", not a failure."""
    from cloudtrain.host.awsapi import RoleCredentials

    (up, down), ec2 = _instances(lab, 2)
    ec2.terminate_instances(InstanceIds=[down])
    creds = RoleCredentials(lab.imds.url)
    assert auto_scaling.instance_states(group_conf(lab), creds, [up, down]) == (
        {up: "running", down: "terminated"}, "")
    assert auto_scaling.instance_states(group_conf(lab), creds, [up]) == ({up: "running"}, "")
    assert auto_scaling.instance_states(group_conf(lab), creds, ["i-0123456789abcdef0"]) == (
        {}, "")
    assert any(p.startswith("/latest/meta-data/iam/security-credentials/")
               for _, p, _ in lab.imds.seen)


def test_instance_states_that_cannot_be_asked_are_none_and_why(lab):
    from cloudtrain.host.awsapi import RoleCredentials

    (up,), _ = _instances(lab, 1)
    lab.imds.roles["127.0.0.1"] = None  # no instance profile
    states, why = auto_scaling.instance_states(group_conf(lab), RoleCredentials(lab.imds.url),
                                               [up], clock=lambda s: None)
    assert states is None and "no role credentials" in why


def test_identity_says_this_instances_private_address(lab):
    lab.imds.metadata["127.0.0.1"]["/latest/meta-data/local-ipv4"] = "10.0.3.17"
    ident = auto_scaling.identity(lab.imds.url)
    assert (ident["instance"], ident["address"]) == (INSTANCE, "10.0.3.17")
    lab.imds.metadata["127.0.0.1"]["/latest/meta-data/local-ipv4"] = "10.0.3.17\n; rm -rf"
    assert auto_scaling.identity(lab.imds.url)["address"] is None
