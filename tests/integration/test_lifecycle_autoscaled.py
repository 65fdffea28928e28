"""lifecycle/autoscaled.py with a real Store and the AWS provider against moto in this process
(issue 27): what the job's instances wrote to the job store while the launching machine was off
becomes the job's record here, once (learn: attempts and instance rows, the previous attempt
ended interrupted at the next one's start, a resumed step learnt later); a group emptied at
the deadline or deleted with no final record is the job's end, said with why; a lost instance
(lost) is the job's end, its relaunch in progress, or its replacement not yet reachable."""

from __future__ import annotations

import json

import pytest

from labs.aws import ec2_provider, moto_endpoint  # noqa: F401  (fixtures)
from labs.credentials import REGION
from labs.moto_activities import ScalingActivities, forget_instance
from test_aws_group_launch_moto import T0, GroupJob
from cloudtrain.lifecycle import attempts, autoscaled
from cloudtrain.market import Market
from cloudtrain.state import Instance, Store

@pytest.fixture
def activities(monkeypatch) -> ScalingActivities:
    """What AWS Auto Scaling records of what each group did (moto keeps nothing)."""
    return ScalingActivities().install(monkeypatch)


@pytest.fixture
def grouped(activities, ec2_provider, ct_home):
    """A group's job as its launch recorded it: attempt 1 on the group's first instance (in
    moto, tagged with the job as groups.py tags them; `g.i1`); attempts/1.json in the job
    store; the group's scaling activities (`g.activities`). Short waits for the provider that
    `providers.get` makes from config.yaml."""
    with (ct_home / "config.yaml").open("a") as f:
        f.write(f"region: {REGION}\npoll_seconds: 0.05\ninstance_wait_seconds: 2\n"
                "ssh_wait_seconds: 1\n")
    with Store(ct_home / "state.db") as store:
        g = GroupJob(ec2_provider, store)
        g.activities = activities
        [g.i1] = g.make_group(desired=1)
        store.add_instance(Instance(
            id=g.i1, job_id=g.id, provider="aws", region=REGION, zone="us-east-1a",
            instance_type="g5.xlarge", market=Market.SPOT, state="running", launched_at=T0,
            terminated_at=None, price_per_hour=None,
            details={"auto_scaling_group": g.group}))
        store.add_attempt(g.id, 1, started_at=T0, instance_id=g.i1, region=REGION,
                          zone="us-east-1a", market="spot", instance_type="g5.xlarge")
        g.attempt(1, g.i1, T0)
        yield g


def rows(g: GroupJob) -> tuple[list, list[str], list[str]]:
    store = g.store
    return (store.attempts(g.id), [i.id for i in store.instances(g.id)],
            [e.detail for e in store.events(g.id) if e.phase == "instance"])


def test_the_store_s_attempts_become_attempt_and_instance_rows_once(grouped):
    i2 = grouped.replace(grouped.i1)
    i3 = grouped.replace(i2)
    grouped.attempt(2, i2, T0 + 100, zone="us-east-1b")
    grouped.attempt(3, i3, T0 + 250, zone="us-east-1a", lifecycle="on-demand",
                    type="g6.xlarge")
    assert autoscaled.learn(grouped.store, grouped.job) is None  # the group runs: no end
    first = rows(grouped)
    assert autoscaled.learn(grouped.store, grouped.job) is None
    assert rows(grouped) == first  # a second look adds nothing
    found, instances, events = first
    assert [a.n for a in found] == [1, 2, 3] and instances == [grouped.i1, i2, i3]
    assert len(events) == 2 and "attempt 2" in events[0] and "attempt 3" in events[1]
    one, two, three = found
    # Each attempt ended, interrupted, when the next one started (the bill's boundary).
    assert (one.ended_at, one.outcome, one.end_reason) == \
        (T0 + 100, attempts.INTERRUPTED, autoscaled.REPLACED)
    assert (two.ended_at, two.outcome) == (T0 + 250, attempts.INTERRUPTED)
    assert three.ended_at is None and three.outcome is None
    assert (two.instance_id, two.zone, two.market, two.started_at, two.running_at) == \
        (i2, "us-east-1b", "spot", T0 + 100, T0 + 100)
    assert (three.instance_id, three.market, three.instance_type, three.region) == \
        (i3, "on-demand", "g6.xlarge", REGION)
    third = next(i for i in grouped.store.instances(grouped.id) if i.id == i3)
    assert (third.market, third.launched_at, third.zone, third.instance_type) == \
        (Market.ON_DEMAND, T0 + 250, "us-east-1a", "g6.xlarge")
    assert third.details == {"auto_scaling_group": grouped.group, "attempt": 3}
    assert not [e for e in grouped.store.events(grouped.id) if e.phase == "passed-over"]


def test_attempts_seen_one_at_a_time_end_each_other_as_they_come(grouped):
    i2 = grouped.replace(grouped.i1)
    grouped.attempt(2, i2, T0 + 100)
    autoscaled.learn(grouped.store, grouped.job)
    assert grouped.store.attempt(grouped.id).n == 2
    assert grouped.store.attempt(grouped.id, 2).ended_at is None
    i3 = grouped.replace(i2)
    grouped.attempt(3, i3, T0 + 250)
    autoscaled.learn(grouped.store, grouped.job)
    two = grouped.store.attempt(grouped.id, 2)
    assert (two.ended_at, two.outcome) == (T0 + 250, attempts.INTERRUPTED)
    assert [i.id for i in grouped.store.instances(grouped.id)] == [grouped.i1, i2, i3]


def test_an_attempt_whose_record_is_missing_does_not_stop_the_next(grouped):
    """attempts/2.json never reached the store (its instance died first): attempt 3 is
    recorded, and the latest attempt known here (1) ends at 3's start."""
    i3 = grouped.replace(grouped.replace(grouped.i1))
    grouped.attempt(3, i3, T0 + 250)
    autoscaled.learn(grouped.store, grouped.job)
    assert [a.n for a in grouped.store.attempts(grouped.id)] == [1, 3]
    assert grouped.store.attempt(grouped.id, 1).ended_at == T0 + 250


def test_an_attempt_on_an_instance_already_recorded_adds_no_second_instance_row(grouped):
    """A restart on the same instance (bootstrap run again after a reboot) names the first
    attempt's instance: one instance row still, the attempt recorded on it."""
    grouped.attempt(2, grouped.i1, T0 + 100)
    autoscaled.learn(grouped.store, grouped.job)
    _, instances, events = rows(grouped)
    assert instances == [grouped.i1] and events == []
    assert grouped.store.attempt(grouped.id, 2).instance_id == grouped.i1


def test_the_resumed_step_said_after_the_restore_updates_the_row(grouped):
    """bootstrap posts attempts/<n>.json at boot, then again with where it resumed: the row
    made from the first gets the step from the second, once."""
    i2 = grouped.replace(grouped.i1)
    grouped.attempt(2, i2, T0 + 100)
    autoscaled.learn(grouped.store, grouped.job)
    assert grouped.store.attempt(grouped.id, 2).resumed_step is None
    grouped.attempt(2, i2, T0 + 100, resumed_step=1200, resumed_seq=4)
    autoscaled.learn(grouped.store, grouped.job)
    two = grouped.store.attempt(grouped.id, 2)
    assert (two.resumed_step, two.resumed_seq) == (1200, 4)
    grouped.attempt(2, i2, T0 + 100, resumed_step=5, resumed_seq=1)  # never moved back
    autoscaled.learn(grouped.store, grouped.job)
    assert grouped.store.attempt(grouped.id, 2).resumed_step == 1200
    assert len(grouped.store.attempts(grouped.id)) == 2


def test_garbage_in_the_store_records_nothing(grouped):
    grouped.put("attempts/2.json", b"\x1b[2J{")
    grouped.put("attempts/3.json", {"attempt": 3, "instance": "i-../../etc"})
    assert autoscaled.learn(grouped.store, grouped.job) is None
    assert [a.n for a in grouped.store.attempts(grouped.id)] == [1]
    assert [i.id for i in grouped.store.instances(grouped.id)] == [grouped.i1]


def test_the_final_record_is_the_job_s_end(grouped):
    i2 = grouped.replace(grouped.i1)
    grouped.attempt(2, i2, T0 + 100)
    grouped.final(state="failed", exit_code=3, reason="loss went NaN", attempt=2, instance=i2)
    final = autoscaled.learn(grouped.store, grouped.job)
    assert final == {"state": "failed", "exit_code": 3, "reason": "loss went NaN",
                     "ended_at": T0 + 900, "attempt": 2, "instance": i2}
    assert [a.n for a in grouped.store.attempts(grouped.id)] == [1, 2]  # recorded all the same


def test_a_group_emptied_with_no_final_record_is_a_failed_end_naming_the_scheduled_action(
        grouped):
    grouped.empty_group()
    final = autoscaled.learn(grouped.store, grouped.job)
    assert final["state"] == "failed" and final["exit_code"] is None
    assert "scheduled action" in final["reason"] and "max runtime" in final["reason"]


def test_a_deleted_group_with_no_final_record_is_a_failed_end_saying_so(grouped):
    grouped.delete_group()
    final = autoscaled.learn(grouped.store, grouped.job)
    assert final["state"] == "failed" and "group was deleted" in final["reason"]


def test_a_final_record_wins_over_the_group_s_state(grouped):
    """The agent records the end, then deletes its group: the end is the agent's."""
    grouped.final(state="succeeded", exit_code=0, attempt=1, instance=grouped.i1)
    grouped.delete_group()
    assert autoscaled.learn(grouped.store, grouped.job)["state"] == "succeeded"


def test_an_instance_lost_while_aws_relaunches_is_no_end(grouped):
    """The recorded instance is gone, its replacement not yet in the store: no end, and
    the job says AWS is relaunching it."""
    i1 = grouped.i1
    assert autoscaled.lost(grouped.store, grouped.job, {i1: {"state": "terminated"}},
                           f"{i1} was taken back") is None
    assert grouped.job.reason == f"{i1} was taken back; AWS Auto Scaling is relaunching it"
    assert grouped.job.state == "running"


def test_a_lost_instance_of_an_emptied_group_is_the_job_s_end(grouped):
    grouped.empty_group()
    final = autoscaled.lost(grouped.store, grouped.job, {grouped.i1: {"state": "terminated"}},
                            "gone")
    assert final["state"] == "failed" and "scheduled action" in final["reason"]


def test_a_replacement_running_but_not_reachable_yet_is_said_and_not_followed(grouped):
    """The group's replacement in moto (attempt 2 in the store): the job's host is not
    moved to it while SSH does not answer; the reason says so, and the next look tries
    again."""
    i1 = grouped.i1
    replacement = grouped.replace(i1)
    grouped.attempt(2, replacement, T0 + 100)
    host_before = grouped.job.host
    states = {i1: {"state": "terminated"}, replacement: {"state": "running"}}
    assert autoscaled.lost(grouped.store, grouped.job, states, f"{i1} was taken back") is None
    reason = grouped.job.reason
    assert reason.startswith(f"{i1} was taken back; AWS Auto Scaling relaunched it: attempt 2 "
                             f"on {replacement} (not reachable yet: ")
    assert grouped.job.host == host_before
    assert not [e for e in grouped.store.events(grouped.id) if e.phase == "replacement"]


def test_cost_report_refresh_prices_the_replacement_aws_put_in_while_nobody_looked(grouped):
    """`cost-report --refresh` brings running jobs up to date as `status` does: the job's
    recorded instance is gone (its host does not answer), the store holds attempt 2 on the
    group's replacement, and the report then counts that instance too (issue 27: cost-report
    alone did not read the store)."""
    import json

    from click.testing import CliRunner

    from cloudtrain.cli import cli
    from labs.loopback import free_port

    g = grouped
    replacement = g.replace(g.i1)
    g.attempt(2, replacement, T0 + 100)
    g.store.update_job(g.id, jobdir="/home/ubuntu/.cloudtrain/jobs/" + g.id, host={
        "kind": "SSHHost", "host": "127.0.0.1", "port": free_port(), "user": "ubuntu",
        "key_path": None, "host_key": None})
    before = {i.id for i in g.store.instances(g.id)}
    assert replacement not in before
    done = CliRunner().invoke(cli, ["cost-report", "--refresh", "--json"])
    assert done.exit_code == 0, done.output
    assert replacement in {i.id for i in g.store.instances(g.id)}
    assert [a.n for a in g.store.attempts(g.id)] == [1, 2]
    report = json.loads(done.output)
    assert g.id in json.dumps(report)


# -- F41: a record is believed only where EC2 agrees -----------------------------------------

def passed_over(g: GroupJob) -> list[str]:
    return [e.detail for e in g.store.events(g.id) if e.phase == autoscaled.PASSED_OVER]


def test_F41_a_forged_attempt_naming_an_instance_not_the_job_s_is_passed_over_and_spared(
        grouped):
    """F41 (the audit's reproduction): attempts/<n>.json is written through the job's grant,
    which any instance of the job holds. Records naming an untagged `prod-database` and
    another job's instance were recorded as the job's, priced, and terminated by `down` /
    the job's end. Now each is passed over, said once, neither recorded nor priced, and
    `release` leaves both running while it ends the job's own."""
    g = grouped
    prod = g.stranger(Name="prod-database")
    theirs = g.stranger(**{"cloudtrain:job": "0ther0b1", "Name": "another job"})
    g.attempt(2, prod, T0 + 100)
    g.attempt(3, theirs, T0 + 200)
    assert autoscaled.learn(g.store, g.job) is None
    assert autoscaled.learn(g.store, g.job) is None  # a second look says nothing new
    found, instances, events = rows(g)
    assert [a.n for a in found] == [1] and instances == [g.i1] and events == []
    assert found[0].ended_at is None  # nothing ended attempt 1
    said = passed_over(g)
    assert said == [
        f"attempts/2.json names {prod}, which EC2 does not show with the job's tag "
        f"(cloudtrain:job={g.id}; it stops listing an instance about an hour after its end), "
        f"nor the scaling activities of the job's group {g.group} (6 weeks of them) as one it "
        "launched: not taken as the job's (neither recorded nor priced)",
        f"attempts/3.json names {theirs}, which EC2 does not show with the job's tag "
        f"(cloudtrain:job={g.id}; it stops listing an instance about an hour after its end), "
        f"nor the scaling activities of the job's group {g.group} (6 weeks of them) as one it "
        "launched: not taken as the job's (neither recorded nor priced)"]
    g.provider.release(g.store, g.job)
    assert g.state_of(prod) == g.state_of(theirs) == "running"
    assert g.state_of(g.i1) == "terminated"


def test_F41_an_instance_of_the_job_but_outside_its_group_is_not_an_attempt(grouped):
    """The job's tag alone is not enough for a live instance of a grouped job: the group's
    own tag (aws:autoscaling:groupName, which only AWS sets) must name the job's group."""
    g = grouped
    loose = g.stranger(**{"cloudtrain:job": g.id})
    g.attempt(2, loose, T0 + 100)
    autoscaled.learn(g.store, g.job)
    assert [a.n for a in g.store.attempts(g.id)] == [1]
    assert passed_over(g) == [
        f"attempts/2.json names {loose}, which EC2 shows in no Auto Scaling group, not in the "
        f"job's {g.group}: not taken as the job's (neither recorded nor priced)"]


@pytest.mark.parametrize("forged, why", [
    (lambda g, i2: {"attempt": 7, "instance": i2}, "it names attempt 7, which the job does "
                                                   "not have"),
    (lambda g, i2: {"attempt": 2, "instance": g.stranger(Name="prod-database")},
     "which EC2 does not show with the job's tag"),
    (lambda g, i2: {"attempt": 1, "instance": g.i1},
     "attempt 2 of the job still runs on {i2} (final.json names attempt 1)"),
    (lambda g, i2: {"attempt": None, "instance": None},
     "a success that names no attempt or instance of the job"),
], ids=["unknown-attempt", "stranger-instance", "later-attempt-runs", "anonymous-success"])
def test_F41_a_forged_final_json_is_not_the_job_s_end(grouped, forged, why):
    """F41: a forged final.json (state: succeeded) was taken as the job's end, so the
    launching machine recorded a success for a job that had not finished. It is the end only
    where it fits what EC2 and the attempts say; else it is passed over, said once, and the
    job runs on (attempt 2 on the group's replacement, running)."""
    g = grouped
    i2 = g.replace(g.i1)
    g.attempt(2, i2, T0 + 100)
    g.final(state="succeeded", exit_code=0, **forged(g, i2))
    assert autoscaled.learn(g.store, g.job) is None
    assert autoscaled.learn(g.store, g.job) is None
    [said] = passed_over(g)
    assert said.startswith("final.json (succeeded) is not taken as the job's end: ")
    assert why.format(i2=i2) in said
    assert g.job.state == "running" and g.state_of(i2) == "running"


def test_F41_an_end_nothing_contradicts_is_the_end_though_ec2_forgot_its_instances(grouped):
    """The machine was off for longer than EC2 lists an ended instance (about an hour): the
    agent's final.json names an attempt and an instance that can no longer be checked. With
    the group deleted (the agent ends it) and no instance of the job live, nothing
    contradicts it: it is the end, not a failure for want of one. A success that names
    nothing is still refused."""
    g = grouped
    g.delete_group()  # moto keeps ended instances listed: these ids were never listed
    g.final(state="succeeded", exit_code=0, attempt=4, instance="i-0444444444444444d")
    assert autoscaled.learn(g.store, g.job)["state"] == "succeeded"
    g.final(state="succeeded", exit_code=0, attempt=None, instance=None)
    final = autoscaled.learn(g.store, g.job)
    assert final["state"] == "failed" and "group was deleted" in final["reason"]


def test_F41_true_ends_are_still_the_end(grouped):
    """What the agent writes (its attempt and its own instance, still shutting down), what
    an agent without CLOUDTRAIN_ATTEMPT writes (its instance only), and what a bootstrap
    that could not start the job writes (failed, naming nothing) are each the end."""
    g = grouped
    i2 = g.replace(g.i1)
    g.attempt(2, i2, T0 + 100)
    for doc in ({"state": "succeeded", "attempt": 2, "instance": i2},
                {"state": "succeeded", "attempt": None, "instance": i2},
                {"state": "failed", "attempt": None, "instance": None}):
        g.final(**doc)
        final = autoscaled.learn(g.store, g.job)
        assert final is not None and final["state"] == doc["state"], doc
    assert passed_over(g) == []


# -- F41: the witness AWS keeps: the group's scaling activities ------------------------------

LAUNCH, END = "Launching a new EC2 instance", "Terminating EC2 instance"


def activity(g: GroupJob, verb: str, instance: str, group: str | None = None) -> dict:
    """The activity `verb` of `instance` in the job's group (or `group`), as AWS keeps it."""
    [found] = [a for a in g.activities.activities(group or g.group)
               if a["Description"] == f"{verb}: {instance}"]
    return found


def instance_row(g: GroupJob, instance: str):
    return next(i for i in g.store.instances(g.id) if i.id == instance)


def test_F41_a_replacement_ec2_has_forgotten_is_the_job_s_by_its_group_s_activities_and_billed(
        grouped):
    """F41's weakness: EC2 stops listing an ended instance about an hour after its end, so
    with this machine off for longer, the attempts of that time were passed over and their
    instances left out of the bill (too low). AWS Auto Scaling's own record of the job's
    group (its scaling activities, kept 6 weeks, written by no principal) says the group
    launched that instance: the attempt is the job's, and its instance is billed from the
    group's launch of it to the group's termination of it."""
    import json

    from cloudtrain import cost, ledger

    g = grouped
    i2 = g.replace(g.i1)
    i3 = g.replace(i2)
    g.attempt(2, i2, T0 + 100)
    g.attempt(3, i3, T0 + 250, zone="us-east-1b")
    forget_instance(i2)  # an hour after its end
    assert autoscaled.learn(g.store, g.job) is None
    found, instances, events = rows(g)
    assert [a.n for a in found] == [1, 2, 3] and sorted(instances) == sorted([g.i1, i2, i3])
    assert passed_over(g) == [] and len(events) == 2
    assert (found[0].ended_at, found[1].ended_at) == (T0 + 100, T0 + 250)
    launched, ended = activity(g, LAUNCH, i2), activity(g, END, i2)
    start, end = launched["StartTime"].timestamp(), ended["StartTime"].timestamp()
    two = instance_row(g, i2)
    assert (two.state, two.launched_at, two.terminated_at, two.zone) == (
        "terminated", start, end, json.loads(launched["Details"])["Availability Zone"])
    assert two.details["seen_in"] == "scaling activities"
    assert instance_row(g, i3).state == "running"  # EC2 lists it: as before
    g.provider.record_ends(g.store, g.job)  # the job's end: EC2 has no times for i2
    [run] = [r for r in ledger.runs_of(g.store, g.job) if r.instance_id == i2]
    assert (run.start, run.end) == (start, end)
    assert run.spot_history  # its AZ's spot prices over its life
    billed = cost.instance_cost(run)
    assert billed.dollars > 0 and billed.billed_seconds == max(60.0, end - start)


def test_issue38_an_instance_ended_within_its_first_second_is_billed_not_refused(grouped):
    """Issue 38 (the laptop-closed deadline test found it): a spot replacement past the
    deadline's switch powers off within the second it started. The group's record gives
    whole seconds, so its end came before its recorded start (its attempt's started_at,
    fractional), and `status` failed with "interval ends before it starts". Its end is its
    start: billed AWS's 60-second minimum."""
    from cloudtrain import cost, ledger

    g = grouped
    i2 = g.replace(g.i1)
    g.replace(i2)
    ended = activity(g, END, i2)["StartTime"].timestamp()
    forget_instance(i2)
    g.attempt(2, i2, T0 + 100)
    autoscaled.learn(g.store, g.job)
    g.store.update_instance(i2, launched_at=ended + 0.68, terminated_at=None, state="running")
    g.provider.record_ends(g.store, g.job)
    assert instance_row(g, i2).terminated_at == ended + 0.68
    [run] = [r for r in ledger.runs_of(g.store, g.job) if r.instance_id == i2]
    assert cost.instance_cost(run).billed_seconds == 60.0


def test_F41_the_end_of_an_instance_ec2_forgot_is_its_group_s_termination_not_now(grouped):
    """An attempt recorded while EC2 listed its instance, whose end came while this machine
    was off for more than an hour: the bill took `now` as its termination (too high, by the
    hours the machine was off). The group's termination of it is its end."""
    g = grouped
    i2 = g.replace(g.i1)
    g.attempt(2, i2, T0 + 100)
    autoscaled.learn(g.store, g.job)
    assert instance_row(g, i2).state == "running"
    g.replace(i2)
    forget_instance(i2)
    forget_instance(g.i1)
    g.provider.record_ends(g.store, g.job)
    for instance in (g.i1, i2):
        row = instance_row(g, instance)
        assert (row.state, row.terminated_at) == (
            "terminated", activity(g, END, instance)["StartTime"].timestamp()), instance


def test_F41_down_after_hours_away_terminates_what_is_left_and_closes_what_ec2_forgot(grouped):
    """With this machine off for more than an hour, the job's first instances are gone from
    EC2's view, and TerminateInstances refuses the whole call when one id is unknown
    (InvalidInstanceID.NotFound, naming the ids): `down` (release) failed on them and
    terminated nothing, not even the replacement that still runs. The ids EC2 no longer
    knows are closed at the group's termination of them; the rest are terminated."""
    g = grouped
    i2 = g.replace(g.i1)
    g.attempt(2, i2, T0 + 100)
    autoscaled.learn(g.store, g.job)
    i3 = g.replace(i2)
    g.attempt(3, i3, T0 + 200)
    autoscaled.learn(g.store, g.job)
    forget_instance(i2)
    forget_instance(g.i1)
    g.provider.release(g.store, g.job, force=True)
    assert g.state_of(i3) in ("shutting-down", "terminated")
    for instance in (g.i1, i2):
        row = instance_row(g, instance)
        assert (row.state, row.terminated_at) == (
            "terminated", activity(g, END, instance)["StartTime"].timestamp()), instance


def test_F41_an_instance_ec2_does_not_show_yet_is_asked_for_again_not_dropped(grouped):
    """The other side of the same answer: a seconds-old instance EC2 does not show yet
    (eventually consistent) is InvalidInstanceID.NotFound too, and must still be terminated:
    asked again until EC2 knows it, not taken as long gone."""
    import time

    from botocore.awsrequest import AWSResponse

    g = grouped
    g.store.update_instance(g.i1, launched_at=time.time() - 5)
    g.provider.settings.poll_seconds = 0.05
    client = g.provider.aws.client("ec2", REGION)

    def not_yet(params, **_):  # the request as sent: InstanceId.1, ... in its query body
        asked = [v for k, v in sorted(params["body"].items()) if k.startswith("InstanceId.")]
        calls.append(asked)
        if len(calls) == 1:
            return (AWSResponse("https://ec2", 400, {}, None), {"Error": {
                "Code": "InvalidInstanceID.NotFound",
                "Message": f"The instance ID '{asked[0]}' does not exist"}})
        return None

    calls = []
    client.meta.events.register("before-call.ec2.TerminateInstances", not_yet)
    try:
        g.provider.release(g.store, g.job, force=True)
    finally:
        client.meta.events.unregister("before-call.ec2.TerminateInstances", not_yet)
    assert calls == [[g.i1], [g.i1]]  # asked again, and EC2 took it the second time


@pytest.mark.parametrize("whose", ["another-group", "no-group"])
def test_F41_an_instance_ec2_forgot_that_the_job_s_group_did_not_launch_is_passed_over(
        grouped, whose):
    """A forged attempt naming an ended instance EC2 no longer lists, launched by another
    job's group or by no group at all: the job's group's activities do not show it, so it is
    passed over as before, neither recorded nor priced."""
    g = grouped
    if whose == "another-group":
        other = GroupJob(g.provider, g.store)
        [victim] = other.make_group(desired=1)
        other.replace(victim)
        assert activity(g, LAUNCH, victim, group=other.group)  # AWS knows whose it was
    else:
        victim = g.stranger(Name="prod-database")
        g.ec2.terminate_instances(InstanceIds=[victim])
    forget_instance(victim)
    g.attempt(2, victim, T0 + 100)
    assert autoscaled.learn(g.store, g.job) is None
    assert [a.n for a in g.store.attempts(g.id)] == [1]
    assert [i.id for i in g.store.instances(g.id)] == [g.i1]
    assert passed_over(g) == [
        f"attempts/2.json names {victim}, which EC2 does not show with the job's tag "
        f"(cloudtrain:job={g.id}; it stops listing an instance about an hour after its end), "
        f"nor the scaling activities of the job's group {g.group} (6 weeks of them) as one it "
        "launched: not taken as the job's (neither recorded nor priced)"]


def test_F41_an_end_naming_an_instance_only_the_group_s_activities_still_know_is_the_end(
        grouped):
    """The agent of attempt 2 recorded the job's success and its instance ended; its group
    is still there (the agent could not delete it) and runs a replacement that started no
    attempt. EC2 has forgotten attempt 2's instance; the group's activities show it launched
    it: the end names the job's own attempt and instance, and is the end."""
    g = grouped
    i2 = g.replace(g.i1)
    g.attempt(2, i2, T0 + 100)
    g.replace(i2)
    forget_instance(i2)
    g.final(state="succeeded", exit_code=0, attempt=2, instance=i2)
    assert autoscaled.learn(g.store, g.job)["state"] == "succeeded"
    assert passed_over(g) == []


def test_F41_the_group_s_activities_are_read_to_their_last_page(grouped):
    """AWS gives at most 100 activities a page, newest first: the launch of the job's first
    replacement, 110 activities back, is on the second page."""
    g = grouped
    first = latest = g.replace(g.i1)
    for _ in range(54):
        latest = g.replace(latest)
    assert len(g.activities.activities(g.group)) > 100
    g.attempt(2, first, T0 + 100)
    forget_instance(first)
    autoscaled.learn(g.store, g.job)
    assert [a.n for a in g.store.attempts(g.id)] == [1, 2] and passed_over(g) == []
    asked = [c for c in g.activities.calls if c["group"] == g.group]
    assert [c["include_deleted"] for c in asked] == [True, True]
    assert asked[0]["token"] is None and asked[1]["token"]


def test_F41_without_the_permission_to_read_the_activities_one_warning_and_nothing_breaks(
        grouped):
    """The Auto Scaling policy without autoscaling:DescribeScalingActivities (attached before
    it had the action): AWS refuses the read. One warning line says so, once; an attempt EC2
    no longer lists is passed over as before; one EC2 lists is the job's as before."""
    g = grouped
    g.activities.denied = True
    i2 = g.replace(g.i1)
    i3 = g.replace(i2)
    g.attempt(2, i2, T0 + 100)
    g.attempt(3, i3, T0 + 250)
    forget_instance(i2)
    for _ in range(2):
        assert autoscaled.learn(g.store, g.job) is None
    assert [a.n for a in g.store.attempts(g.id)] == [1, 3]
    warning, skipped = passed_over(g)
    assert warning.startswith("WARNING: the scaling activities of the job's Auto Scaling group "
                              f"{g.group} could not be read (not allowed: "
                              "autoscaling:DescribeScalingActivities in us-east-1 "
                              "(AccessDenied)")
    assert warning.endswith("an attempt whose instance EC2 no longer lists is passed over "
                            "(infra/iam-policy-autoscaling.json allows it)")
    assert "\n" not in warning
    assert skipped.startswith(f"attempts/2.json names {i2}, which EC2 does not show")
    assert len(g.activities.calls) == 2  # asked at each look: the policy may be fixed since


# -- C2: `status` and the supervisor learn the same attempts at once --------------------------

def test_C2_recorders_learning_the_same_attempts_at_once_record_each_once(grouped):
    """C2: the first `status` after the machine came back and the supervisor it had just
    started both recorded the job store's attempts; the slower broke on "UNIQUE constraint
    failed: instances.id". Four threads, each on its own connection to the real state.db,
    learn the same five attempts at once, several times over: none fails, each attempt,
    instance and event is recorded once."""
    import threading

    g = grouped
    path = g.store.path
    for rnd in range(3):
        current = g.store.attempt(g.id)
        latest = current.instance_id
        for n in range(current.n + 1, current.n + 6):
            latest = g.replace(latest)
            g.attempt(n, latest, T0 + 100 * n)
        start = threading.Barrier(4)
        errors = []

        def one() -> None:
            with Store(path) as store:
                job = store.job(g.id)
                start.wait()
                try:
                    autoscaled.learn(store, job)
                except Exception as exc:  # noqa: BLE001 - the test reports it
                    errors.append(exc)

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [], (rnd, errors)
    found, instances, events = rows(g)
    assert [a.n for a in found] == list(range(1, 17))
    assert len(instances) == len(set(instances)) == 16
    assert len(events) == 15 and len(set(events)) == 15
    assert all(a.outcome == attempts.INTERRUPTED for a in found[:-1])


# -- C1: the steps an attempt that AWS replaced had run ---------------------------------------

def _stream(g: GroupJob, attempt: int, step: int) -> None:
    """stream/latest.json and its slot, as the agent's checkpoint stream leaves them."""
    import hashlib
    import json

    data = b"weights"
    g.put("stream/a/checkpoints/last.pt", data)
    g.put("stream/latest.json", json.dumps({
        "version": 1, "job_id": g.id, "seq": 3, "slot": "a", "step": step, "epoch": 0,
        "step_source": "checkpoint", "taken_at": T0, "uploaded_at": T0 + 1,
        "upload_seconds": 1.0, "bytes": len(data), "attempt": attempt, "final": False,
        "files": [{"path": "checkpoints/last.pt", "size": len(data),
                   "sha256": hashlib.sha256(data).hexdigest()}]}).encode())


def test_C1_an_attempt_aws_replaced_has_the_step_its_streamed_checkpoint_reached(grouped):
    """C1: `status --json` showed last_step and redone_steps null for every attempt of an
    Auto Scaling job. The last checkpoint attempt 1 streamed (its manifest names attempt 1)
    is its last known step; attempt 2 resumed from step 86."""
    g = grouped
    _stream(g, attempt=1, step=120)
    i2 = g.replace(g.i1)
    g.attempt(2, i2, T0 + 100, resumed_step=86, resumed_seq=2)
    autoscaled.learn(g.store, g.job)
    one, two = g.store.attempts(g.id)
    assert one.last_step == 120 and two.last_step is None
    rows_ = attempts.summary(g.store, g.job)
    assert (rows_[0]["last_step"], rows_[0]["redone_steps"]) == (120, 34)


def test_C1_a_checkpoint_of_another_attempt_says_nothing_of_this_one(grouped):
    g = grouped
    _stream(g, attempt=2, step=300)  # attempt 2 streamed since: its step is not 1's
    i2 = g.replace(g.i1)
    g.attempt(2, i2, T0 + 100, resumed_step=86)
    autoscaled.learn(g.store, g.job)
    assert g.store.attempt(g.id, 1).last_step is None


def test_C1_the_step_seen_here_on_the_attempt_s_own_instance_counts(grouped):
    """This machine followed attempt 1's instance (its metrics were refreshed from there, to
    step 131): that is attempt 1's last step, later than its streamed checkpoint's."""
    import json

    g = grouped
    g.store.update_instance(g.i1, details=json.dumps({"auto_scaling_group": g.group,
                                                       "address": "10.0.0.7"}))
    g.store.update_job(g.id, host={"kind": "SSHHost", "host": "10.0.0.7"},
                       metrics={"step": 131, "train_loss": 0.5})
    _stream(g, attempt=1, step=120)
    i2 = g.replace(g.i1)
    g.attempt(2, i2, T0 + 100, resumed_step=120)
    autoscaled.learn(g.store, g.job)
    assert g.store.attempt(g.id, 1).last_step == 131
    assert attempts.summary(g.store, g.job)[0]["redone_steps"] == 11


def _progress(g: GroupJob, n: int, step, checkpoint_step=None) -> None:
    """attempts/<n>/progress.json, as attempt n's rank 0 agent posts it (agent_progress)."""
    from cloudtrain.host import job_records

    g.put(job_records.progress_key("", n), job_records.progress_doc(n, step, checkpoint_step))


def test_C1_after_several_recoveries_unseen_each_attempt_has_the_step_it_reached(grouped):
    """C1 (issue 34): the laptop was closed while AWS replaced the instance three times; only
    the last streamed checkpoint's manifest was left, naming the last attempt. Each attempt's
    own progress record (and where the next one resumed from its checkpoint) gives every
    attempt its last step, and each recovery its steps redone."""
    g = grouped
    i2 = g.replace(g.i1)
    i3 = g.replace(i2)
    i4 = g.replace(i3)
    g.attempt(2, i2, T0 + 100, resumed_step=86, resumed_seq=2, resumed_attempt=1)
    g.attempt(3, i3, T0 + 200, resumed_step=170, resumed_seq=5, resumed_attempt=2)
    g.attempt(4, i4, T0 + 300, resumed_step=250, resumed_seq=8, resumed_attempt=3)
    _stream(g, attempt=4, step=255)
    _progress(g, 1, 120, 86)
    _progress(g, 2, 200, 170)
    _progress(g, 3, 255, 250)
    _progress(g, 4, 262, 255)
    autoscaled.learn(g.store, g.job)
    assert [a.last_step for a in g.store.attempts(g.id)] == [120, 200, 255, 262]
    got = attempts.summary(g.store, g.job)
    assert [(r["resumed_step"], r["last_step"], r["redone_steps"]) for r in got] == [
        (None, 120, 34), (86, 200, 30), (170, 255, 5), (250, 262, None)]


def test_C1_an_attempt_s_last_step_only_grows_as_its_records_come(grouped):
    """Attempt 1 ended when attempt 2 was learnt, at its streamed checkpoint's step; its
    progress record, posted at its run's end, says more, and a stale one less (never taken)."""
    g = grouped
    _stream(g, attempt=1, step=100)
    i2 = g.replace(g.i1)
    g.attempt(2, i2, T0 + 100, resumed_step=100)
    autoscaled.learn(g.store, g.job)
    assert g.store.attempt(g.id, 1).last_step == 100
    _progress(g, 1, 104, 100)
    autoscaled.learn(g.store, g.job)
    assert g.store.attempt(g.id, 1).last_step == 104
    _progress(g, 1, 90, None)
    autoscaled.learn(g.store, g.job)
    assert g.store.attempt(g.id, 1).last_step == 104
    assert attempts.summary(g.store, g.job)[0]["redone_steps"] == 4


def test_C1_an_attempt_that_said_nothing_reached_the_step_a_later_one_resumed_from(grouped):
    """Attempt 1 was taken back before its first progress record; attempt 2 resumed from its
    checkpoint at step 86 (resumed_attempt 1): attempt 1 reached 86 at least."""
    g = grouped
    i2 = g.replace(g.i1)
    g.attempt(2, i2, T0 + 100, resumed_step=86, resumed_attempt=1)
    autoscaled.learn(g.store, g.job)
    assert g.store.attempt(g.id, 1).last_step == 86
    assert attempts.summary(g.store, g.job)[0]["redone_steps"] == 0


def _laptop_record(store: Store, lab, home) -> None:
    """What the launching machine recorded of the lab's job (labs.group_nodes) before it was
    closed: the job, running on the group's first instance (attempt 1), whose address no
    longer answers SSH. Nothing more: every recovery happened while it was off."""
    import getpass

    from cloudtrain import state as state_module
    from labs import group_nodes
    from labs.loopback import free_port

    first = lab.launched[0]
    with pytest.MonkeyPatch.context() as m:  # the lab's job id, as the launch drew it
        m.setattr(state_module.secrets, "token_hex", lambda n: group_nodes.JOB_ID)
        job = store.create_job(name=None, kind="command", recipe=None, command="python3 job.py",
                               backend="aws", spec={}, launcher="test:1", at=lab.events[0][0])
    key = home / "id_ed25519"
    key.write_text("not a key: the host never answers\n")
    store.update_job(job.id, jobdir=str(lab.by_id[first].jobdir), spec={
        "region": REGION, "store_owner": group_nodes.OWNER, "instance_type": "g5.xlarge",
        "market": "spot", "auto_scaling_group": group_nodes.GROUP}, host={
        "kind": "SSHHost", "host": "127.0.0.1", "port": free_port(), "user": getpass.getuser(),
        "key_path": str(key)})
    store.set_state(job.id, "running", at=lab.events[0][0])
    store.add_instance(Instance(
        id=first, job_id=job.id, provider="aws", region=REGION, zone="us-east-1a",
        instance_type="g5.xlarge", market=Market.SPOT, state="running",
        launched_at=lab.events[0][0], terminated_at=None, price_per_hour=None,
        details={"auto_scaling_group": group_nodes.GROUP, "address": "127.0.0.1"}))
    store.add_attempt(job.id, 1, started_at=lab.events[0][0], instance_id=first, region=REGION,
                      zone="us-east-1a", market="spot", instance_type="g5.xlarge")


def test_C1_status_after_three_attempts_with_the_laptop_closed_shows_each_one_s_steps(
        moto_endpoint, tmp_path, monkeypatch, ct_home, cli):
    """C1 (issue 34): a job of an Auto Scaling group (the real agent and bootstrap on each
    instance, AWS's part played by labs.group_nodes against moto) is taken back without
    notice, then after a spot notice: three attempts, the launching machine closed all along.
    Back, `status --json` shows each attempt's last step: what its agent last said
    (attempts/<n>/progress.json), which after a notice is the step it stopped at and after a
    reclaim without notice at most PROGRESS_S (+ a look) behind it; and the steps each
    recovery redid, last step - the next attempt's resumed step. Before, only the last
    streamed checkpoint's manifest (attempt 3's at the end) was there: both were null."""
    from labs import group_nodes

    fast = {"agent_progress.PROGRESS_S": 0.1, "agent_progress.LOOK_S": 0.05}
    with group_nodes.GroupNodes(moto_endpoint, tmp_path, monkeypatch, nodes=1, steps=60,
                                every=5, step_s=0.1, max_restarts=4, timing=fast) as lab:
        def at(step: int) -> None:
            try:
                lab.wait_step(step, timeout=90)
            except AssertionError as exc:
                raise AssertionError(f"{exc}:\n{lab.describe()}") from None

        at(17)
        lab.take_back(lab.node(0))  # no notice: its agent says nothing more
        at(38)  # attempt 2, past the step attempt 1 reached
        lab.take_back(lab.node(0), notice_s=4.0)  # the job stops and stores, then powers off
        final = lab.wait_end(180)
        assert final["state"] == "succeeded" and final["attempt"] == 3, lab.describe()
        records = lab.attempts()
        rows_of = {}  # attempt -> the steps its job took, from every instance's metrics
        for node in lab.by_id.values():
            path = node.jobdir / "metrics.jsonl"
            for line in path.read_text().splitlines() if path.exists() else []:
                row = json.loads(line)
                rows_of.setdefault(int(row["attempt"]), set()).add(row["step"])
    truth = {n: max(steps) for n, steps in rows_of.items()}
    resumed = {r["attempt"]: r.get("resumed_step") for r in records}
    assert [r.get("resumed_attempt") for r in records] == [None, 1, 2]  # bootstrap says so
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    with (ct_home / "config.yaml").open("a") as f:
        f.write(f"region: {REGION}\npoll_seconds: 0.05\ninstance_wait_seconds: 2\n"
                "ssh_wait_seconds: 1\n")
    with Store(ct_home / "state.db") as store:
        _laptop_record(store, lab, ct_home)
    job = cli.job(group_nodes.JOB_ID)
    got = {a["attempt"]: a for a in job["attempts"]}
    said = f"truth {truth}, resumed {resumed}, status {job['attempts']}"
    assert job["state"] == "succeeded" and sorted(got) == [1, 2, 3], said
    slack = 10  # steps of 0.1 s: PROGRESS_S + a look + a POST, on a loaded machine
    assert truth[1] - slack <= got[1]["last_step"] <= truth[1], said  # no notice
    assert got[2]["last_step"] == truth[2], said  # a notice: its end said where it stopped
    assert got[3]["last_step"] == truth[3] == 60, said
    for n in (1, 2):
        assert got[n + 1]["resumed_step"] == resumed[n + 1], said
        assert got[n]["redone_steps"] == got[n]["last_step"] - resumed[n + 1] >= 0, said
    assert got[2]["redone_steps"] == 0, said  # its checkpoint at the notice was the step
