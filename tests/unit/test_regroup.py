"""host/regroup.py alone (issue 27, a job on several nodes of an Auto Scaling group): every node
ranks the attempt's records the same way whatever order it listed them in, and a node's
job.json for its rank says the rendezvous, its interface, where its results go and who streams
the checkpoint (a node's record, checked: test_job_records.py)."""

from __future__ import annotations

import copy

from hypothesis import given, settings, strategies as st

from cloudtrain.host import regroup


def instance_ids(min_size: int = 0, max_size: int = 8):
    return st.lists(st.from_regex(r"i-[0-9a-f]{8,17}", fullmatch=True), min_size=min_size,
                    max_size=max_size, unique=True)


@st.composite
def meetings(draw):
    """(the members as listed, nodes): distinct instances, each claiming no rank, a rank of
    the job, or one another member claims too; sometimes not exactly `nodes` of them."""
    nodes = draw(st.integers(1, 8))
    count = draw(st.sampled_from([nodes, nodes, nodes, max(0, nodes - 1), nodes + 1]))
    ids = draw(instance_ids(count, count))
    found = [{"instance": i, "rank": draw(st.none() | st.integers(0, nodes - 1)),
              "address": "10.0.0.%d" % k, "port": 29500 + k,
              "iface": draw(st.none() | st.just("eth0"))} for k, i in enumerate(ids)]
    return found, nodes


@settings(max_examples=400, deadline=None)
@given(meetings(), st.randoms(use_true_random=False))
def test_every_node_ranks_the_same_records_the_same_way(meeting, rnd):
    found, nodes = meeting
    before = copy.deepcopy(found)
    out = regroup.ranked(found, nodes)
    assert found == before  # the caller's records are not changed
    if len(found) != nodes:
        assert out is None
        return
    shuffled = list(found)
    rnd.shuffle(shuffled)
    assert regroup.ranked(shuffled, nodes) == out  # the order a node listed them in is moot
    assert [m["rank"] for m in out] == list(range(nodes))  # each rank once, in order
    by_id = {m["instance"]: m for m in found}
    assert sorted(m["instance"] for m in out) == sorted(by_id)
    for m in out:  # only the rank is the ranking's own
        assert {k: v for k, v in m.items() if k != "rank"} == \
            {k: v for k, v in by_id[m["instance"]].items() if k != "rank"}
    new_rank = {m["instance"]: m["rank"] for m in out}
    kept = set()
    for m in sorted(found, key=lambda m: m["instance"]):
        claimed = m["rank"]
        if claimed is not None and not any(o["rank"] == claimed and o["instance"] <
                                           m["instance"] for o in found):
            assert new_rank[m["instance"]] == claimed, (m, out)  # it keeps its rank
            kept.add(m["instance"])
    # the others take the free ranks in instance-id order
    others = sorted(i for i in by_id if i not in kept)
    assert [new_rank[i] for i in others] == sorted(new_rank[i] for i in others)


def test_a_replacement_takes_the_lost_nodes_rank_and_the_smaller_id_wins_a_claim():
    def m(inst, rank):
        return {"instance": inst, "rank": rank, "address": "10.0.0.1", "port": 1,
                "iface": None}

    a, b, c = "i-0000000a", "i-0000000b", "i-0000000c"
    assert [x["instance"] for x in regroup.ranked([m(c, 0), m(b, None), m(a, 2)], 3)] == \
        [c, b, a]
    assert [x["instance"] for x in regroup.ranked([m(b, 1), m(a, 1), m(c, None)], 3)] == \
        [b, a, c]  # a keeps 1 (smaller id); b and c take 0 and 2 in id order
    assert regroup.ranked([m(a, 0), m(b, 1)], 3) is None


GRANT = {"url": "https://b.s3.amazonaws.com/", "fields": {"policy": "p"},
         "prefix": "jobs/o/j1/", "max_bytes": 1 << 30}
JOB = {"job_id": "j1", "env": {"CLOUDTRAIN_ATTEMPT": "3", "GLOO_SOCKET_IFNAME": "stale0",
                               "NCCL_SOCKET_IFNAME": "stale0", "KEEP": "me"},
       "results_store": GRANT, "checkpoint_stream": {"attempt": 2, "start_seq": 4},
       "auto_scaling": {"group": "cloudtrain-j1", "region": "us-east-1", "nodes": 3, "rank": 1,
                        "prefix": "jobs/o/j1/", "members": [],
                        "stream": {"settle_s": 2.0, "start_seq": 7}}}
RANKS = [{"instance": "i-0000000c", "rank": 0, "address": "10.0.0.3", "port": 29507,
          "iface": "ens5"},
         {"instance": "i-0000000a", "rank": 1, "address": "10.0.0.1", "port": 29500,
          "iface": None},
         {"instance": "i-0000000b", "rank": 2, "address": "10.0.0.2", "port": 29500,
          "iface": "eth1"}]


def test_rank_0_takes_the_jobs_results_prefix_and_the_checkpoint_stream():
    job = copy.deepcopy(JOB)
    out = regroup.take_part(job, "jobs/o/j1/", 0, RANKS, "ens5")
    assert job == JOB  # the job.json read is not changed in place
    env = out["env"]
    assert (env["CLOUDTRAIN_NODE_RANK"], env["CLOUDTRAIN_NODES"]) == ("0", "3")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.3", "29507")
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "ens5"
    assert (env["KEEP"], env["CLOUDTRAIN_ATTEMPT"]) == ("me", "3")
    assert out["results_store"] == dict(GRANT, prefix="jobs/o/j1/")
    assert out["checkpoint_stream"] == {"settle_s": 2.0, "start_seq": 7}  # auto_scaling's
    conf = out["auto_scaling"]
    assert conf["rank"] == 0 and conf["stream"] == JOB["auto_scaling"]["stream"]
    assert conf["members"] == [{"rank": m["rank"], "instance": m["instance"],
                                "address": m["address"]} for m in RANKS]


def test_another_rank_stores_below_nodes_k_streams_nothing_and_loses_a_stale_interface():
    out = regroup.take_part(copy.deepcopy(JOB), "jobs/o/j1/", 1, RANKS)
    env = out["env"]
    assert (env["CLOUDTRAIN_NODE_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
        "1", "10.0.0.3", "29507")  # rank 0's rendezvous, not its own
    assert "GLOO_SOCKET_IFNAME" not in env and "NCCL_SOCKET_IFNAME" not in env
    assert out["results_store"]["prefix"] == "jobs/o/j1/nodes/1/"
    assert "checkpoint_stream" not in out
    assert out["auto_scaling"]["rank"] == 1
    two = regroup.take_part(copy.deepcopy(JOB), "jobs/o/j1/", 2, RANKS, "eth1")
    assert two["env"]["GLOO_SOCKET_IFNAME"] == "eth1"
    assert two["results_store"]["prefix"] == "jobs/o/j1/nodes/2/"


def test_F42_a_node_takes_its_interface_from_itself_never_from_a_record():
    """F42: node b rewrote c's record with `iface: lo`; before, c took GLOO_SOCKET_IFNAME=lo
    from it. A node's interface is what it knows of itself (interface_of its own address),
    passed by the caller; records' `iface` is never read into an environment."""
    forged = [dict(m) for m in RANKS]
    forged[2]["iface"] = "lo"
    out = regroup.take_part(copy.deepcopy(JOB), "jobs/o/j1/", 2, forged, "ens5")
    assert out["env"]["GLOO_SOCKET_IFNAME"] == out["env"]["NCCL_SOCKET_IFNAME"] == "ens5"
    out = regroup.take_part(copy.deepcopy(JOB), "jobs/o/j1/", 2, forged)  # none known
    assert "GLOO_SOCKET_IFNAME" not in out["env"] and "NCCL_SOCKET_IFNAME" not in out["env"]
    bad = regroup.take_part(copy.deepcopy(JOB), "jobs/o/j1/", 2, RANKS, "eth0; rm -rf /")
    assert "GLOO_SOCKET_IFNAME" not in bad["env"]


def test_rank_0_without_a_stream_in_its_setting_streams_nothing():
    job = copy.deepcopy(JOB)
    del job["auto_scaling"]["stream"]
    assert "checkpoint_stream" not in regroup.take_part(job, "jobs/o/j1/", 0, RANKS)


def test_a_teams_waits_are_job_jsons_timing_else_this_modules():
    """auto_scaling.timing (config.yaml's regroup_*_seconds) sets a Team's waits; one it
    leaves out, or a job.json without it, keeps regroup.py's own."""
    class Agent:
        def __init__(self, conf):
            self.conf = conf

        def group(self):
            return self.conf

    team = regroup.Team(Agent({"nodes": 3, "timing": {"lost_wait_s": 5.0}}), None, None, None,
                        {}, None)
    assert team.timing("lost_wait_s", regroup.LOST_WAIT_S) == 5.0
    assert team.timing("watch_s", regroup.WATCH_S) == regroup.WATCH_S
    team = regroup.Team(Agent(None), {"nodes": 3}, None, None, {}, None)
    assert team.timing("peers_s", regroup.PEERS_S) == regroup.PEERS_S
