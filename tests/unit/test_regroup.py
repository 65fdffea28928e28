"""host/regroup.py alone (issue 27, a job on several nodes of an Auto Scaling group): every node
ranks the attempt's records the same way whatever order it listed them in, a record from the
job store is kept only with every field checked, and a node's job.json for its rank says the
rendezvous, its interface, where its results go and who streams the checkpoint."""

from __future__ import annotations

import copy
import ipaddress
import json

from hypothesis import given, settings, strategies as st

from cloudtrain.host import job_records, regroup

FIELDS = {"instance", "rank", "address", "port", "iface"}


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


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() |
                    st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) |
                    st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
NEAR = {  # values close to the ones a node writes, good and bad, to reach every check
    "instance": st.from_regex(r"i-[0-9a-f]{8,17}", fullmatch=True) | st.sampled_from(
        ["i-0123", "i-0123456789abcdef0; rm", "I-0123456789", ""]) | JSON,
    "rank": st.none() | st.integers(-3, 70) | st.booleans() | st.floats() | JSON,
    "address": st.ip_addresses(v=4).map(str) | st.ip_addresses(v=6).map(str) |
    st.ip_addresses(network="10.0.0.0/8").map(str) |
    st.ip_addresses(network="172.16.0.0/12").map(str) |
    st.sampled_from(["10.0.0.1 ", "10.0.0", "localhost", "1.2.3.4/8"]) | st.integers() |
    st.booleans() | JSON,
    "port": st.integers(-2, 70000) | st.booleans() | st.sampled_from(["80", 80.0]) | JSON,
    "iface": st.none() | st.from_regex(r"[A-Za-z0-9_.:@-]{1,15}", fullmatch=True) |
    st.sampled_from(["eth0; rm -rf /", "x" * 16, "", "eth 0"]) | JSON,
}
RECORDS = JSON | st.fixed_dictionaries(NEAR, optional={"at": JSON, "extra": JSON}) | \
    st.fixed_dictionaries({}, optional=NEAR)


@settings(max_examples=800, deadline=None)
@given(RECORDS, st.integers(1, 64))
def test_a_record_from_the_job_store_is_kept_only_with_every_field_checked(doc, nodes):
    out = job_records.check_member(doc, nodes)  # never raises
    if out is None:
        return
    assert set(out) == FIELDS
    assert job_records.INSTANCE.fullmatch(out["instance"])
    # the address is the IPv4 address the record wrote, as EC2 writes one, and a VPC's
    assert isinstance(doc["address"], str) and out["address"] == doc["address"]
    assert str(ipaddress.IPv4Address(out["address"])) == out["address"]
    assert any(ipaddress.IPv4Address(out["address"]) in ipaddress.IPv4Network(n)
               for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"))
    assert type(out["port"]) is int and 1 <= out["port"] <= 65535
    assert out["iface"] is None or (type(out["iface"]) is str
                                    and job_records.IFACE.fullmatch(out["iface"]))
    assert out["rank"] is None or (type(out["rank"]) is int and 0 <= out["rank"] < nodes)
    json.dumps(out)


def test_a_good_record_is_kept_and_a_bad_rank_or_interface_only_forgotten():
    doc = {"instance": "i-0123456789abcdef0", "rank": 2, "address": "10.0.1.7",
           "port": 29501, "iface": "ens5", "at": 1.0}
    assert job_records.check_member(doc, 3) == {k: doc[k] for k in FIELDS}
    assert job_records.check_member(dict(doc, rank=3), 3)["rank"] is None  # not a rank of 3
    assert job_records.check_member(dict(doc, iface="ens5; rm"), 3)["iface"] is None
    for bad in ({"port": 0}, {"port": True}, {"address": 167837959}, {"address": "::1"},
                {"instance": "i-xyz"}):
        assert job_records.check_member(dict(doc, **bad), 3) is None, bad


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


def test_F42_only_an_address_a_vpc_may_give_is_a_members():
    """F42: check_member took any IPv4 address: public, loopback, the IMDS, broadcast,
    multicast. A VPC's instances have RFC 1918 (or RFC 6598) addresses."""
    doc = {"instance": "i-0123456789abcdef0", "rank": 0, "port": 29500}
    for good in ("10.0.1.7", "172.16.5.4", "172.31.255.254", "192.168.1.2", "100.64.3.3"):
        assert job_records.check_member(dict(doc, address=good), 3)["address"] == good
    for bad in ("8.8.8.8", "127.0.0.1", "169.254.169.254", "0.0.0.0", "255.255.255.255",
                "224.0.0.1", "203.0.113.66", "198.51.100.7", "172.32.0.1", "10.0.0.0",
                "10.255.255.255", "192.168.255.255"):
        assert job_records.check_member(dict(doc, address=bad), 3) is None, bad


def test_rank_0_without_a_stream_in_its_setting_streams_nothing():
    job = copy.deepcopy(JOB)
    del job["auto_scaling"]["stream"]
    assert "checkpoint_stream" not in regroup.take_part(job, "jobs/o/j1/", 0, RANKS)


def test_the_records_keys_are_below_the_attempt():
    assert job_records.member_key("jobs/o/j1/", 4, "i-0000000a") == \
        "jobs/o/j1/attempts/4/i-0000000a.json"
    assert job_records.ended_key("jobs/o/j1/", 4, 2) == "jobs/o/j1/attempts/4/ended-2.json"
    assert job_records.MEMBER_NAME.fullmatch("i-0000000a.json") and not job_records.MEMBER_NAME.fullmatch(
        "ended-2.json")
