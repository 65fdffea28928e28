"""host/regroup.py against moto's S3 and EC2 (issue 27, a job on several nodes of an Auto Scaling
group): the nodes meet through the job store as on an instance, each reading with the role's
credentials from the fake IMDS (bundle_reader.Bundle: signed GETs and ListObjectsV2) and
writing its record through the job's real presigned-POST grant; each meeting node runs in a
thread of its own. After a failed run, a real agent's Team asks EC2 whether a peer is gone."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import boto3
import pytest

from cloudtrain.host import auto_scaling, job_records, regroup
from cloudtrain.host.bundle_reader import EXIT_ENDED, EXIT_STORE, Bundle, Failed
from cloudtrain.host.awsapi import RoleCredentials
from labs.aws import instance_store, moto_endpoint
from labs.polling import wait_for

__all__ = ["moto_endpoint"]  # the lab's fixture

REGION = "us-east-1"
BUCKET = "cloudtrain-123456789012-us-east-1"
OWNER = "AIDAEXAMPLEOWNER0001"
JOB = "regroup01"
PREFIX = f"jobs/{OWNER}/{JOB}/"
GROUP = f"cloudtrain-{JOB}"
FAST = {"poll_s": 0.2, "wait_s": 30.0, "meet_s": 30.0}


@pytest.fixture
def lab(moto_endpoint, tmp_path, monkeypatch):
    s3, imds, grant = instance_store(moto_endpoint, monkeypatch, BUCKET, JOB, OWNER, REGION)
    lab = type("Lab", (), dict(s3=s3, imds=imds, grant=grant, endpoint=moto_endpoint,
                               tmp=tmp_path, ids=[], addresses={}))
    group(lab, 4)
    yield lab
    imds.close()


def ec2(lab):
    return boto3.client("ec2", region_name=REGION, endpoint_url=lab.endpoint)


def group(lab, count: int, name: str = GROUP, job: str = JOB) -> list[str]:
    """The job's Auto Scaling group in moto with `count` instances, which AWS tags with the
    group's name and the launch template with the job's (as groups.py makes them); their
    ids in lab.ids (node k's is lab.ids[k]) and private addresses in lab.addresses."""
    client = ec2(lab)
    vpc = client.create_vpc(CidrBlock="10.200.0.0/16")["Vpc"]["VpcId"]
    subnet = client.create_subnet(VpcId=vpc, CidrBlock="10.200.0.0/24",
                                  AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    client.create_launch_template(LaunchTemplateName=name, LaunchTemplateData={
        "ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge", "TagSpecifications": [
            {"ResourceType": "instance", "Tags": [{"Key": "cloudtrain:job", "Value": job}]}]})
    boto3.client("autoscaling", region_name=REGION, endpoint_url=lab.endpoint
                 ).create_auto_scaling_group(
        AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": name}, MinSize=count,
        MaxSize=count, DesiredCapacity=count, VPCZoneIdentifier=subnet)
    found = client.describe_instances(Filters=[
        {"Name": "tag:aws:autoscaling:groupName", "Values": [name]}])["Reservations"]
    made = sorted((i["InstanceId"], i["PrivateIpAddress"]) for r in found
                  for i in r["Instances"] if i["InstanceId"] not in lab.addresses)
    if name == GROUP:
        lab.ids.extend(i for i, _ in made)
    lab.addresses.update(made)
    return [i for i, _ in made]


def conf(lab) -> dict:
    return {"group": GROUP, "region": REGION, "endpoint": lab.endpoint, "prefix": PREFIX}


def put(lab, name: str, body) -> None:
    lab.s3.put_object(Bucket=BUCKET, Key=PREFIX + name,
                      Body=body if isinstance(body, bytes) else json.dumps(body))


def stored_keys(lab, below: str) -> list[str]:
    got = lab.s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX + below).get("Contents", [])
    return sorted(o["Key"][len(PREFIX + below):] for o in got)


def node(lab, k: int, rank: int | None) -> dict:
    """Node k's record as regroup.mine makes it: the group's k-th instance at its private
    address (which no interface here holds)."""
    ident = lab.ids[k]
    return regroup.mine({"instance": ident, "address": lab.addresses[ident]}, rank)


class Meeting:
    """Nodes meeting in threads, each with its own reader (its own role credentials)."""

    def __init__(self, lab, nodes: int):
        self.lab, self.nodes = lab, nodes
        self.grant = regroup.records_grant({"results_store": lab.grant}, PREFIX)
        self.out: dict[str, object] = {}
        self.threads: list[threading.Thread] = []

    def join(self, me: dict, at_least: int, **kw) -> None:
        reader = Bundle(BUCKET, PREFIX, REGION, self.lab.endpoint, self.lab.imds.url)
        peers = regroup.group_peers(conf(self.lab), RoleCredentials(self.lab.imds.url))

        def run():
            try:
                self.out[me["instance"]] = regroup.meet(reader, self.grant, PREFIX, at_least,
                                                        self.nodes, me, peers,
                                                        **dict(FAST, **kw))
            except Exception as exc:  # noqa: BLE001 - what the test looks at
                self.out[me["instance"]] = exc

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def results(self, timeout: float = 60) -> dict:
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), "a node is still meeting"
        return self.out


def test_three_nodes_meet_and_every_one_ranks_them_alike(lab):
    """Attempt 2: node a had rank 0, node c rank 2, b replaced the lost rank 1 (no rank)."""
    put(lab, "attempts/2.json", {"attempt": 2, "instance": node(lab, 1, None)["instance"]})
    a, b, c = node(lab, 0, 0), node(lab, 1, None), node(lab, 2, 2)
    meeting = Meeting(lab, 3)
    started = time.monotonic()
    for me in (c, b, a):
        meeting.join(me, 2)
    out = meeting.results()
    seconds = time.monotonic() - started
    assert all(isinstance(v, tuple) for v in out.values()), out
    (n, ranks), *others = out.values()
    assert n == 2 and all(o == (n, ranks) for o in others)  # the same answer on every node
    assert [m["instance"] for m in ranks] == [a["instance"], b["instance"], c["instance"]]
    assert ranks[0]["address"] == lab.addresses[a["instance"]]
    assert stored_keys(lab, "attempts/2/") == sorted(m["instance"] + ".json" for m in ranks)
    print(f"three nodes met in {seconds:.2f} s")


def test_a_newer_attempt_recorded_while_they_wait_moves_every_node_to_it(lab):
    """Two nodes have joined attempt 2 when one more node is lost and its replacement records
    attempt 3: both move to 3 and meet the replacement there."""
    put(lab, "attempts/2.json", {"attempt": 2})
    a, b, c = node(lab, 0, 0), node(lab, 1, 1), node(lab, 2, None)
    meeting = Meeting(lab, 3)
    meeting.join(a, 2)
    meeting.join(b, 2)
    assert wait_for(lambda: len(stored_keys(lab, "attempts/2/")) == 2, timeout=30)
    put(lab, "attempts/3.json", {"attempt": 3})
    meeting.join(c, 3)
    out = meeting.results()
    assert {v[0] if isinstance(v, tuple) else v for v in out.values()} == {3}, out
    assert len({json.dumps(v[1]) for v in out.values()}) == 1
    assert [m["instance"] for m in out[a["instance"]][1]] == [a["instance"], b["instance"],
                                                              c["instance"]]
    assert len(stored_keys(lab, "attempts/3/")) == 3


def test_the_jobs_end_recorded_while_a_node_waits_ends_its_wait(lab):
    put(lab, "attempts/2.json", {"attempt": 2})
    me = node(lab, 0, 0)
    meeting = Meeting(lab, 2)
    meeting.join(me, 2)
    assert wait_for(lambda: stored_keys(lab, "attempts/2/"), timeout=30)
    put(lab, job_records.FINAL, {"state": "succeeded"})
    exc = meeting.results(timeout=15)[me["instance"]]
    assert isinstance(exc, Failed) and exc.code == EXIT_ENDED, exc


def test_a_node_left_alone_stops_waiting_with_a_store_failure(lab):
    """Nobody else joins within meet_s; no attempt recorded at all within wait_s."""
    put(lab, "attempts/2.json", {"attempt": 2})
    meeting = Meeting(lab, 3)
    meeting.join(node(lab, 0, 0), 2, meet_s=1.0)
    meeting.join(node(lab, 1, 1), 3, wait_s=1.0)  # attempt 3 never comes
    out = meeting.results(timeout=20)
    alone, unreplaced = out[node(lab, 0, 0)["instance"]], out[node(lab, 1, 1)["instance"]]
    assert isinstance(alone, Failed) and alone.code == EXIT_STORE
    assert "not all 3 nodes met" in str(alone)
    assert isinstance(unreplaced, Failed) and unreplaced.code == EXIT_STORE
    assert "no replacement node recorded" in str(unreplaced)
    assert stored_keys(lab, "attempts/3/") == []  # nothing joined an attempt not recorded


def test_F43_a_writer_adding_attempts_does_not_hold_the_meeting_open(lab):
    """F43: meet moved to each newer attempt and started its clock again, so a writer adding
    attempts every 0.2 s kept the node waiting (its GPUs billing) for as long as it wrote.
    Newer attempts still move the meeting on, but its clock runs from the first join."""
    from cloudtrain.host.bundle_reader import EXIT_STORE

    put(lab, "attempts/2.json", {"attempt": 2})
    writing = threading.Event()
    writing.set()

    def forge():
        n = 3
        while writing.is_set() and n < job_records.MAX_ATTEMPTS:
            put(lab, f"attempts/{n}.json", {"attempt": n})
            n += 1
            time.sleep(0.2)

    meeting = Meeting(lab, 2)
    me = node(lab, 0, 0)
    meeting.join(me, 2, meet_s=1.5)
    assert wait_for(lambda: stored_keys(lab, "attempts/2/"), timeout=30)
    forger = threading.Thread(target=forge, daemon=True)
    began = time.time()
    forger.start()
    try:
        out = meeting.results(timeout=20)[me["instance"]]
    finally:
        writing.clear()
        forger.join(5)
    assert isinstance(out, Failed) and out.code == EXIT_STORE, out
    assert "not all 2 nodes met in 2 s" in str(out)
    assert time.time() - began < 8, "the meeting waited on past its 1.5 s"


def test_F43_a_regroup_past_max_restarts_ends_the_job_as_a_replacement_would(lab):
    """F43: regroups counted no restart: each one is an attempt, and past --max-restarts the
    nodes stop meeting with the end a replacement's bootstrap gives (final.json preempted)."""
    from cloudtrain.host.bundle_reader import EXIT_RESTARTS

    for n in (2, 3):
        put(lab, f"attempts/{n}.json", {"attempt": n})
    meeting = Meeting(lab, 2)
    me = node(lab, 0, 0)
    meeting.join(me, 2, max_restarts=1)
    out = meeting.results(timeout=20)[me["instance"]]
    assert isinstance(out, Failed) and out.code == EXIT_RESTARTS, out
    assert str(out) == "all 1 restarts used (--max-restarts 1)"
    assert stored_keys(lab, "attempts/3/") == []  # it joined no attempt past the limit
    within = Meeting(lab, 1)
    within.join(node(lab, 1, 0), 2, max_restarts=2)
    assert within.results(timeout=20)[lab.ids[1]][0] == 3


def test_junk_among_an_attempts_records_is_passed_over_not_fatal(lab):
    """Whatever else is under attempts/2/ (the grant lets any node write there) is not a
    node: two real nodes still meet as two."""
    good = {"instance": "i-00000000000000f1", "rank": 0, "address": "10.0.0.9", "port": 1}
    put(lab, "attempts/2.json", {"attempt": 2})
    put(lab, "attempts/2/i-00000000000000f1.json", b"{not json")
    put(lab, "attempts/2/i-00000000000000f2.json",
        dict(good, instance="i-00000000000000f2",
             pad="x" * (job_records.RECORD_MAX_BYTES + 1)))
    put(lab, "attempts/2/i-00000000000000f3.json", dict(good, instance="i-00000000000000f4"))
    put(lab, "attempts/2/notaninstance.json", dict(good, instance="i-00000000000000f5"))
    put(lab, "attempts/2/i-00000000000000f6 x.json", dict(good, instance="i-00000000000000f6"))
    put(lab, "attempts/2/sub/i-00000000000000f7.json", dict(good, instance="i-00000000000000f7"))
    put(lab, "attempts/2/ended-1.json", {"rank": 1})
    a, b = node(lab, 0, 0), node(lab, 1, 1)
    meeting = Meeting(lab, 2)
    meeting.join(a, 2)
    meeting.join(b, 2)
    out = meeting.results()
    assert all(isinstance(v, tuple) for v in out.values()), out
    assert [m["instance"] for m in out[a["instance"]][1]] == [a["instance"], b["instance"]]


# -- F42: a record counts only where EC2 agrees -------------------------------------------------

def test_F42_a_phantom_in_place_of_a_real_node_is_never_ranked(lab):
    """F42: node b (holding the job-wide grant) writes no record of its own, but one for
    an instance that is no node of the group, claiming rank 0: before, the phantom was
    ranked 0 and the others' rendezvous went there. EC2 does not list it in the job's
    group, so a and c wait for b, and meet it once b's own record is there."""
    put(lab, "attempts/2.json", {"attempt": 2})
    a, b, c = node(lab, 0, 0), node(lab, 1, 1), node(lab, 2, 2)
    for phantom, address in (("i-00000000000000001", "10.200.0.77"),
                             ("i-00000000000000002", "198.51.100.7")):
        put(lab, f"attempts/2/{phantom}.json", {"instance": phantom, "rank": 0,
                                                "address": address, "port": 4444})
    meeting = Meeting(lab, 3)
    meeting.join(a, 2, meet_s=3.0)
    meeting.join(c, 2, meet_s=3.0)
    out = meeting.results()
    for got in out.values():  # never met with the phantom: not all 3 nodes met
        assert isinstance(got, Failed) and "not all 3 nodes met" in str(got), got
    meeting = Meeting(lab, 3)
    for me in (a, b, c):
        meeting.join(me, 2)
    (n, ranks), *others = meeting.results().values()
    assert [m["instance"] for m in ranks] == [a["instance"], b["instance"], c["instance"]]
    assert all(o == (n, ranks) for o in others)


def test_F42_a_record_with_another_address_or_of_another_group_does_not_count(lab):
    """F42: a record rewritten with an address that is not its instance's (a private one
    EC2 does not give it, or a public one), or one of an instance of another job's group,
    or of an instance EC2 has taken back, is not a node of the meeting."""
    other = group(lab, 1, name="cloudtrain-other", job="other")[0]
    put(lab, "attempts/2.json", {"attempt": 2})
    a, b, c = node(lab, 0, 0), node(lab, 1, 1), node(lab, 2, 2)
    meeting = Meeting(lab, 3)
    meeting.join(a, 2, meet_s=3.0)
    meeting.join(b, 2, meet_s=3.0)
    assert wait_for(lambda: len(stored_keys(lab, "attempts/2/")) == 2, timeout=30)
    for forged in (dict(c, address="10.200.0.66"), dict(c, address="203.0.113.66"),
                   dict(node(lab, 2, 2), instance=other, address=lab.addresses[other])):
        put(lab, f"attempts/2/{forged['instance']}.json", forged)
    out = meeting.results()
    assert all(isinstance(v, Failed) and "not all 3 nodes met" in str(v)
               for v in out.values()), out
    # a node EC2 has taken back (shutting-down) is not one either
    ec2(lab).terminate_instances(InstanceIds=[c["instance"]])
    put(lab, f"attempts/2/{c['instance']}.json", c)
    meeting = Meeting(lab, 3)
    meeting.join(a, 2, meet_s=3.0)
    assert isinstance(meeting.results()[a["instance"]], Failed)


def test_F42_the_groups_instances_as_ec2_lists_them(lab):
    """auto_scaling.group_instances: the job's group, with the role, by tag: the group's
    live instances and their private addresses, not another group's."""
    group(lab, 1, name="cloudtrain-other", job="other")
    creds = RoleCredentials(lab.imds.url)
    found, why = auto_scaling.group_instances(conf(lab), creds)
    assert why == "" and found == {i: lab.addresses[i] for i in lab.ids}
    ec2(lab).terminate_instances(InstanceIds=lab.ids[:1])  # moto replaces it at once
    found, _ = auto_scaling.group_instances(conf(lab), creds)
    assert lab.ids[0] not in found and set(lab.ids[1:]) < set(found)
    broken = dict(conf(lab), endpoint="http://127.0.0.1:9/")
    found, why = auto_scaling.group_instances(broken, creds, clock=lambda s: None)
    assert found is None and "cannot reach" in why


# -- after a failed run: is a peer gone? (Team.look_for_loss, a real agent's Team) ----------

def agent_team(lab, monkeypatch, peers: list[str], me: str):
    """A real host/agent.Agent on a job directory of a job on 3 nodes (job.json as the launch
    and take_part write it), and its Team; the fake IMDS says this instance is `me`."""
    from cloudtrain.host.agent import Agent
    from cloudtrain.host.agent_store import shipped

    lab.imds.metadata["127.0.0.1"] = {"/latest/meta-data/instance-id": me,
                                      "/latest/meta-data/local-ipv4": "127.0.0.1"}
    jobdir = Path(lab.tmp, "jobs", JOB)
    jobdir.mkdir(parents=True)
    members = [{"rank": k, "instance": i, "address": "10.0.0.%d" % k}
               for k, i in enumerate([me] + peers)]
    (jobdir / "job.json").write_text(json.dumps({
        "job_id": JOB, "imds_url": lab.imds.url, "results_store": lab.grant,
        "env": {"CLOUDTRAIN_ATTEMPT": "2"},
        "auto_scaling": {"group": f"cloudtrain-{JOB}", "region": REGION,
                         "endpoint": lab.endpoint, "max_restarts": 3, "prefix": PREFIX,
                         "bucket": BUCKET, "nodes": 3, "rank": 0, "members": members}}))
    team = Agent(str(jobdir)).team()
    assert team is not None, (jobdir / "output.log").read_text()
    # the agent's regroup is the shipped module (imported by name, as on the host)
    monkeypatch.setattr(shipped("regroup"), "WATCH_S", 0.1)
    monkeypatch.setattr(shipped("regroup"), "LOST_WAIT_S", 1.0)
    return team, jobdir


def _ec2_instances(lab, count: int) -> tuple[list[str], object]:
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=lab.endpoint)
    return [i["InstanceId"] for i in ec2.run_instances(
        ImageId="ami-12c6146b", InstanceType="g5.xlarge", MinCount=count,
        MaxCount=count)["Instances"]], ec2


def test_a_peer_ec2_says_is_terminated_means_the_next_attempt(lab, monkeypatch):
    (me, p1, p2), ec2 = _ec2_instances(lab, 3)
    ec2.terminate_instances(InstanceIds=[p2])
    team, jobdir = agent_team(lab, monkeypatch, [p1, p2], me)
    assert team.look_for_loss() == 3
    assert f"node {p2} is gone (terminated)" in (jobdir / "output.log").read_text()


def test_a_newer_attempt_recorded_means_it_even_with_every_peer_running(lab, monkeypatch):
    (me, p1, p2), _ = _ec2_instances(lab, 3)
    team, _ = agent_team(lab, monkeypatch, [p1, p2], me)
    put(lab, "attempts/3.json", {"attempt": 3})
    assert team.look_for_loss() == 3


def test_every_peer_running_is_the_jobs_own_failure_after_lost_wait(lab, monkeypatch):
    (me, p1, p2), _ = _ec2_instances(lab, 3)
    team, jobdir = agent_team(lab, monkeypatch, [p1, p2], me)
    started = time.monotonic()
    assert team.look_for_loss() is None
    assert 1.0 <= time.monotonic() - started < 10
    log = jobdir / "output.log"
    assert not log.exists() or "is gone" not in log.read_text()


def test_a_peer_with_a_spot_notice_says_so_and_its_peers_go_on_at_once(lab, monkeypatch):
    """A node that had a spot notice still runs (it stores its checkpoint), so EC2 says
    running: its leaving-<rank>.json (Team.leaving, through the job's grant) is what tells
    the others at once that their failed run was its loss, not the job's own."""
    from cloudtrain.host import regroup

    (me, p1, p2), _ = _ec2_instances(lab, 3)
    team, jobdir = agent_team(lab, monkeypatch, [p1, p2], me)
    team.leaving()  # this node's own notice: its marker, rank 0 of attempt 2
    mine = json.loads(lab.s3.get_object(Bucket=BUCKET, Key=PREFIX + "attempts/2/leaving-0.json")
                      ["Body"].read())
    assert mine["rank"] == 0 and mine["instance"] == me
    assert team.look_for_loss() is None  # its own marker is not a peer's (LOST_WAIT_S 1 s)
    monkeypatch.setattr(shipped_regroup(), "LOST_WAIT_S", 30.0)
    put(lab, job_records.leaving_key(PREFIX, 2, 2)[len(PREFIX):], {"rank": 2, "instance": p2})
    started = time.monotonic()
    assert team.look_for_loss() == 3
    assert time.monotonic() - started < 10  # not LOST_WAIT_S
    assert f"node {p2} had a spot notice" in (jobdir / "output.log").read_text()


def shipped_regroup():
    from cloudtrain.host.agent_store import shipped

    return shipped("regroup")


# -- C3: a job on 3 nodes through faults, every order and timing one attempt per fault --------

# (rank lost, when: a step of rank 0's, or "end" once the other ranks have ended their part,
# seconds of notice before the reclaim or None for none)
FAULTS = [
    [(1, 12, None), (0, 28, 1.5)],  # C3: node 1 without notice, then node 0 after a notice
    [(1, 12, None), (0, "end", 1.5)],  # C3 as it went: node 0's notice after the others ended
    [(0, 10, None), (2, "end", 0.5)],
    [(0, "end", None)],  # the rendezvous lost without notice after the others ended
    [(2, 10, 0.3), (0, 22, None)],
]


@pytest.mark.parametrize("faults", FAULTS, ids=lambda f: "+".join(
    f"{r}@{at}{'' if s is None else '~%.1fs' % s}" for r, at, s in f))
def test_C3_three_nodes_recover_with_one_attempt_per_fault_and_succeed(moto_endpoint, tmp_path,
                                                                      monkeypatch, faults):
    """C3: a job on 3 nodes of its group (the real agent, Team and bootstrap on each, AWS's
    part played by labs.group_nodes) loses nodes in turn, the rendezvous (rank 0) among
    them, with or without a notice, mid-run or once the other ranks had ended their part.
    Each loss costs one replacement and one attempt at most, rank 0's replacement is met
    like any other, and the job ends succeeded with every step taken. Before, a rank k > 0 that had
    ended waited for a final.json that its lost rank 0 never wrote, then powered off: AWS
    replaced it, each power-off an attempt more (C3: two faults used three restarts, and the
    job ended preempted)."""
    from labs.group_nodes import GroupNodes

    with GroupNodes(moto_endpoint, tmp_path, monkeypatch, nodes=3, steps=40, end_s=1.0,
                    max_restarts=len(faults) + 1) as lab:
        for rank, at, notice_s in faults:
            if at == "end":
                lab.wait_step(lab.steps)
                time.sleep(0.3)  # the other ranks' part has ended; rank 0 is saving
            else:
                lab.wait_step(at)
            lab.take_back(lab.node(rank, running=at != "end"), notice_s)
        final = lab.wait_end(180)
        assert final["state"] == "succeeded", lab.describe()
        # one replacement and one attempt per fault at most (none for a node lost once the
        # job's end was recorded: its replacement finds final.json and ends)
        assert len(lab.attempts()) <= len(faults) + 1, lab.describe()
        assert len(lab.launched) <= 3 + len(faults), lab.describe()
        assert final["attempt"] == len(lab.attempts()), lab.describe()  # ended on the last
        assert lab.step() == lab.steps and lab.errors == []


def test_a_running_node_stops_its_part_once_ec2_says_a_peer_is_gone(lab, monkeypatch):
    """Issue 34's timing: a reclaimed peer's connections never close, so the job's
    collectives hang; the watch asks EC2 every PEERS_S and stops this node's part (to meet
    the others at the next attempt) without waiting for the replacement to record it."""
    import subprocess

    from cloudtrain.host.job_status import REGROUP

    (me, p1, p2), client = _ec2_instances(lab, 3)
    team, jobdir = agent_team(lab, monkeypatch, [p1, p2], me)
    monkeypatch.setattr(shipped_regroup(), "PEERS_S", 0.2)
    agent = team.agent
    agent.proc = subprocess.Popen(["sleep", "2"], start_new_session=True)
    team.watch()  # every peer runs: the run ends by itself
    assert agent.stop_reason is None and team.newer is None
    agent.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    client.terminate_instances(InstanceIds=[p2])
    started = time.monotonic()
    team.watch()
    assert time.monotonic() - started < 10
    assert agent.stop_state == REGROUP and team.newer == 3
    assert agent.proc.wait(timeout=10) != 0  # asked to stop
    assert f"node {p2} is gone (terminated)" in (jobdir / "output.log").read_text()
