"""lifecycle/autoscaled.py with a real Store and the AWS provider against moto in this process
(issue 27): what the job's instances wrote to the job store while the launching machine was off
becomes the job's record here, once (learn: attempts and instance rows, the previous attempt
ended interrupted at the next one's start, a resumed step learnt later); a group emptied at
the deadline or deleted with no final record is the job's end, said with why; a lost instance
(lost) is the job's end, its relaunch in progress, or its replacement not yet reachable."""

from __future__ import annotations

import pytest

from labs.aws import ec2_provider  # noqa: F401  (fixture)
from labs.credentials import REGION
from test_aws_group_launch_moto import T0, GroupJob
from cloudtrain.lifecycle import attempts, autoscaled
from cloudtrain.market import Market
from cloudtrain.state import Instance, Store

I1, I2, I3 = "i-0111111111111111a", "i-0222222222222222b", "i-0333333333333333c"


@pytest.fixture
def grouped(ec2_provider, ct_home):
    """A group's job as its launch recorded it: attempt 1 on its first instance; its group
    in moto (one instance) and attempts/1.json in the job store. Short waits for the
    provider that `providers.get` makes from config.yaml."""
    with (ct_home / "config.yaml").open("a") as f:
        f.write(f"region: {REGION}\npoll_seconds: 0.05\ninstance_wait_seconds: 2\n"
                "ssh_wait_seconds: 1\n")
    with Store(ct_home / "state.db") as store:
        g = GroupJob(ec2_provider, store)
        g.make_group(desired=1)
        store.add_instance(Instance(
            id=I1, job_id=g.id, provider="aws", region=REGION, zone="us-east-1a",
            instance_type="g5.xlarge", market=Market.SPOT, state="running", launched_at=T0,
            terminated_at=None, price_per_hour=None,
            details={"auto_scaling_group": g.group}))
        store.add_attempt(g.id, 1, started_at=T0, instance_id=I1, region=REGION,
                          zone="us-east-1a", market="spot", instance_type="g5.xlarge")
        g.attempt(1, I1, T0)
        yield g


def rows(g: GroupJob) -> tuple[list, list[str], list[str]]:
    store = g.store
    return (store.attempts(g.id), [i.id for i in store.instances(g.id)],
            [e.detail for e in store.events(g.id) if e.phase == "instance"])


def test_the_store_s_attempts_become_attempt_and_instance_rows_once(grouped):
    grouped.attempt(2, I2, T0 + 100, zone="us-east-1b")
    grouped.attempt(3, I3, T0 + 250, zone="us-east-1a", lifecycle="on-demand",
                    type="g6.xlarge")
    assert autoscaled.learn(grouped.store, grouped.job) is None  # the group runs: no end
    first = rows(grouped)
    assert autoscaled.learn(grouped.store, grouped.job) is None
    assert rows(grouped) == first  # a second look adds nothing
    found, instances, events = first
    assert [a.n for a in found] == [1, 2, 3] and instances == [I1, I2, I3]
    assert len(events) == 2 and "attempt 2" in events[0] and "attempt 3" in events[1]
    one, two, three = found
    # Each attempt ended, interrupted, when the next one started (the bill's boundary).
    assert (one.ended_at, one.outcome, one.end_reason) == \
        (T0 + 100, attempts.INTERRUPTED, autoscaled.REPLACED)
    assert (two.ended_at, two.outcome) == (T0 + 250, attempts.INTERRUPTED)
    assert three.ended_at is None and three.outcome is None
    assert (two.instance_id, two.zone, two.market, two.started_at, two.running_at) == \
        (I2, "us-east-1b", "spot", T0 + 100, T0 + 100)
    assert (three.instance_id, three.market, three.instance_type, three.region) == \
        (I3, "on-demand", "g6.xlarge", REGION)
    third = next(i for i in grouped.store.instances(grouped.id) if i.id == I3)
    assert (third.market, third.launched_at, third.zone, third.instance_type) == \
        (Market.ON_DEMAND, T0 + 250, "us-east-1a", "g6.xlarge")
    assert third.details == {"auto_scaling_group": grouped.group, "attempt": 3}


def test_attempts_seen_one_at_a_time_end_each_other_as_they_come(grouped):
    grouped.attempt(2, I2, T0 + 100)
    autoscaled.learn(grouped.store, grouped.job)
    assert grouped.store.attempt(grouped.id).n == 2
    assert grouped.store.attempt(grouped.id, 2).ended_at is None
    grouped.attempt(3, I3, T0 + 250)
    autoscaled.learn(grouped.store, grouped.job)
    two = grouped.store.attempt(grouped.id, 2)
    assert (two.ended_at, two.outcome) == (T0 + 250, attempts.INTERRUPTED)
    assert [i.id for i in grouped.store.instances(grouped.id)] == [I1, I2, I3]


def test_an_attempt_whose_record_is_missing_does_not_stop_the_next(grouped):
    """attempts/2.json never reached the store (its instance died first): attempt 3 is
    recorded, and the latest attempt known here (1) ends at 3's start."""
    grouped.attempt(3, I3, T0 + 250)
    autoscaled.learn(grouped.store, grouped.job)
    assert [a.n for a in grouped.store.attempts(grouped.id)] == [1, 3]
    assert grouped.store.attempt(grouped.id, 1).ended_at == T0 + 250


def test_an_attempt_on_an_instance_already_recorded_adds_no_second_instance_row(grouped):
    """A restart on the same instance (bootstrap run again after a reboot) names the first
    attempt's instance: one instance row still, the attempt recorded on it."""
    grouped.attempt(2, I1, T0 + 100)
    autoscaled.learn(grouped.store, grouped.job)
    _, instances, events = rows(grouped)
    assert instances == [I1] and events == []
    assert grouped.store.attempt(grouped.id, 2).instance_id == I1


def test_the_resumed_step_said_after_the_restore_updates_the_row(grouped):
    """bootstrap posts attempts/<n>.json at boot, then again with where it resumed: the row
    made from the first gets the step from the second, once."""
    grouped.attempt(2, I2, T0 + 100)
    autoscaled.learn(grouped.store, grouped.job)
    assert grouped.store.attempt(grouped.id, 2).resumed_step is None
    grouped.attempt(2, I2, T0 + 100, resumed_step=1200, resumed_seq=4)
    autoscaled.learn(grouped.store, grouped.job)
    two = grouped.store.attempt(grouped.id, 2)
    assert (two.resumed_step, two.resumed_seq) == (1200, 4)
    grouped.attempt(2, I2, T0 + 100, resumed_step=5, resumed_seq=1)  # never moved back
    autoscaled.learn(grouped.store, grouped.job)
    assert grouped.store.attempt(grouped.id, 2).resumed_step == 1200
    assert len(grouped.store.attempts(grouped.id)) == 2


def test_garbage_in_the_store_records_nothing(grouped):
    grouped.put("attempts/2.json", b"\x1b[2J{")
    grouped.put("attempts/3.json", {"attempt": 3, "instance": "i-../../etc"})
    assert autoscaled.learn(grouped.store, grouped.job) is None
    assert [a.n for a in grouped.store.attempts(grouped.id)] == [1]
    assert [i.id for i in grouped.store.instances(grouped.id)] == [I1]


def test_the_final_record_is_the_job_s_end(grouped):
    grouped.attempt(2, I2, T0 + 100)
    grouped.final(state="failed", exit_code=3, reason="loss went NaN", attempt=2)
    final = autoscaled.learn(grouped.store, grouped.job)
    assert final == {"state": "failed", "exit_code": 3, "reason": "loss went NaN",
                     "ended_at": T0 + 900, "attempt": 2}
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
    grouped.final(state="succeeded", exit_code=0)
    grouped.delete_group()
    assert autoscaled.learn(grouped.store, grouped.job)["state"] == "succeeded"


def test_an_instance_lost_while_aws_relaunches_is_no_end(grouped):
    """The recorded instance is gone, its replacement not yet in the store: no end, and
    the job says AWS is relaunching it."""
    assert autoscaled.lost(grouped.store, grouped.job, {I1: {"state": "terminated"}},
                           f"{I1} was taken back") is None
    assert grouped.job.reason == f"{I1} was taken back; AWS Auto Scaling is relaunching it"
    assert grouped.job.state == "running"


def test_a_lost_instance_of_an_emptied_group_is_the_job_s_end(grouped):
    grouped.empty_group()
    final = autoscaled.lost(grouped.store, grouped.job, {I1: {"state": "terminated"}}, "gone")
    assert final["state"] == "failed" and "scheduled action" in final["reason"]


def test_a_replacement_running_but_not_reachable_yet_is_said_and_not_followed(grouped):
    """The group's own instance in moto is the replacement (attempt 2 in the store): the
    job's host is not moved to it while SSH does not answer; the reason says so, and the
    next look tries again."""
    [replacement] = grouped.members()
    grouped.attempt(2, replacement, T0 + 100)
    host_before = grouped.job.host
    states = {I1: {"state": "terminated"}, replacement: {"state": "running"}}
    assert autoscaled.lost(grouped.store, grouped.job, states, f"{I1} was taken back") is None
    reason = grouped.job.reason
    assert reason.startswith(f"{I1} was taken back; AWS Auto Scaling relaunched it: attempt 2 "
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
    [replacement] = g.members()
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
