"""host/auto_scaling.py alone: job.json's auto_scaling checked field by field, the attempt its
env says, the Query calls' retries (the job store's records: test_job_records.py)."""

from __future__ import annotations


import pytest
from hypothesis import given, settings, strategies as st

from cloudtrain.host import auto_scaling
from labs.loopback import answering

GOOD = {"group": "cloudtrain-j1", "region": "us-east-1", "endpoint": None, "max_restarts": 3,
        "prefix": "jobs/AIDAOWNER/j1/", "bucket": "cloudtrain-123456789012-us-east-1"}


ONE_NODE = {"nodes": 1, "rank": 0, "members": [], "stream": None,
            "store_region": "us-east-1", "timing": {}, "on_demand_at": None}


def test_a_good_setting_is_read_and_none_is_not_a_group():
    assert auto_scaling.settings({"auto_scaling": GOOD}) == dict(GOOD, **ONE_NODE)
    assert auto_scaling.settings({"auto_scaling": dict(GOOD, endpoint="http://127.0.0.1:5")}
                                 )["endpoint"] == "http://127.0.0.1:5"
    assert auto_scaling.settings({}) is None and auto_scaling.settings(None) is None
    # regroup's waits (config.yaml's regroup_*_seconds): the ones it knows, as seconds
    assert auto_scaling.settings({"auto_scaling": dict(GOOD, timing={
        "watch_s": 1, "lost_wait_s": 2.5, "other_s": 9})})["timing"] == {
        "watch_s": 1.0, "lost_wait_s": 2.5}


@pytest.mark.parametrize("field, value, words", [
    ("group", "a b", "group"), ("group", "x;rm -rf /", "group"), ("group", 7, "group"),
    ("region", "us-east-1; x", "region"), ("prefix", "jobs/../x/", "prefix"),
    ("prefix", "other/o/j/", "prefix"), ("bucket", "A_B", "bucket"),
    ("endpoint", "file:///etc/passwd", "endpoint"), ("endpoint", 5, "endpoint"),
    ("max_restarts", -1, "max_restarts"), ("max_restarts", True, "max_restarts"),
    ("max_restarts", 10 ** 9, "max_restarts"), ("max_restarts", "3", "max_restarts"),
    ("nodes", 0, "nodes"), ("nodes", 65, "nodes"), ("nodes", True, "nodes"),
    ("rank", 1, "rank"), ("rank", -1, "rank"), ("members", [{"instance": "x; y"}], "members"),
    ("members", "i-0123456789abcdef0", "members"), ("stream", [], "stream"),
    ("store_region", "us east", "store_region"),
    ("timing", [], "timing"), ("timing", {"watch_s": -1}, "timing"),
    ("timing", {"watch_s": "2"}, "timing"), ("timing", {"peers_s": float("nan")}, "timing"),
    ("timing", {"lost_wait_s": True}, "timing"), ("timing", {"watch_s": 10 ** 9}, "timing"),
    ("on_demand_at", "soon", "on_demand_at"), ("on_demand_at", True, "on_demand_at"),
    ("on_demand_at", float("nan"), "on_demand_at"), ("on_demand_at", -5, "on_demand_at"),
])
def test_a_setting_not_the_launchs_is_refused_naming_its_field(field, value, words):
    with pytest.raises(auto_scaling.Invalid, match=words):
        auto_scaling.settings({"auto_scaling": dict(GOOD, **{field: value})})


def test_a_job_on_several_nodes_says_its_rank_its_nodes_and_rank_0s_stream():
    """Issue 27: job.json of node 2 of 3 (host/regroup.py reads it)."""
    members = [{"instance": "i-%017x" % k, "rank": k, "address": "10.0.0.%d" % k}
               for k in range(3)]
    conf = auto_scaling.settings({"auto_scaling": dict(
        GOOD, nodes=3, rank=2, members=members, stream={"settle_s": 1})})
    assert (conf["nodes"], conf["rank"], conf["stream"]) == (3, 2, {"settle_s": 1})
    assert conf["members"] == [{"instance": m["instance"], "rank": m["rank"]} for m in members]
    with pytest.raises(auto_scaling.Invalid, match="members"):  # more members than nodes
        auto_scaling.settings({"auto_scaling": dict(GOOD, nodes=2, rank=0, members=members)})


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=30),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12),
                                                                        c, max_size=6)))
def test_any_json_as_auto_scaling_is_read_or_refused_never_a_crash(value):
    try:
        conf = auto_scaling.settings({"auto_scaling": value})
    except auto_scaling.Invalid:
        return
    assert conf is None or set(conf) == set(GOOD)


@pytest.mark.parametrize("env, n", [({"CLOUDTRAIN_ATTEMPT": "3"}, 3), ({}, None),
                                    ({"CLOUDTRAIN_ATTEMPT": "0"}, None),
                                    ({"CLOUDTRAIN_ATTEMPT": "x3"}, None),
                                    ({"CLOUDTRAIN_ATTEMPT": "9" * 9}, None)])
def test_the_attempt_a_run_is_comes_from_job_json_s_env(env, n):
    assert auto_scaling.attempt_number({"env": env}) == n
    assert auto_scaling.attempt_number({"env": "CLOUDTRAIN_ATTEMPT=3"}) is None


class _Creds:
    def get(self):
        return {"AccessKeyId": "AKIA", "SecretAccessKey": "s", "Token": None}


def _error(code):
    return f"<ErrorResponse><Error><Code>{code}</Code><Message>m</Message></Error>" \
           "</ErrorResponse>".encode()


def test_only_throttling_and_5xx_are_tried_again():
    slept = []
    url, server, seen = answering((400, _error("Throttling")), (503, b""), (200, b"<ok/>"))
    try:
        assert auto_scaling.call("autoscaling", {"Action": "X"}, "us-east-1", _Creds(), url,
                                 slept.append) == (True, "")
        assert len(seen) == 3 and slept == [1, 2]
    finally:
        server.close()
    url, server, seen = answering((403, _error("AccessDenied")))
    try:
        ok, why = auto_scaling.call("ec2", {"Action": "X"}, "us-east-1", _Creds(), url,
                                    slept.append)
        assert not ok and why == "AccessDenied: m" and len(seen) == 1
    finally:
        server.close()


def test_the_group_is_set_to_0_where_deleting_it_is_refused_and_the_template_goes_on():
    url, server, seen = answering((403, _error("AccessDenied")), (200, b""), (400, _error(
        auto_scaling.TEMPLATE_GONE)))
    try:
        steps = auto_scaling.end_group(dict(GOOD, endpoint=url), _Creds(), lambda s: None)
    finally:
        server.close()
    assert [q["Action"] for q in seen] == ["DeleteAutoScalingGroup", "UpdateAutoScalingGroup",
                                           "DeleteLaunchTemplate"]
    assert seen[1]["DesiredCapacity"] == seen[1]["MaxSize"] == seen[1]["MinSize"] == "0"
    assert [(s, ok) for s, ok, _ in steps] == [
        ("delete group", False), ("set group to 0", True), ("delete launch template", True)]
    assert "already" in steps[2][2]


@pytest.mark.parametrize("on_demand_at, lifecycle, at, due", [
    (None, "spot", 2e9, False),          # no deadline: never
    (1.7e9, "spot", 1.7e9 - 1, False),   # before the plan's switch: spot stays
    (1.7e9, "spot", 1.7e9, True),        # at it and after: the group goes on-demand
    (1.7e9, "on-demand", 1.8e9, False),  # an on-demand instance is what the switch asks for
    (1.7e9, None, 1.8e9, False),         # IMDS said nothing: nothing is changed on a guess
])
def test_a_switch_is_due_past_the_deadline_s_moment_on_a_spot_instance_only(
        on_demand_at, lifecycle, at, due):
    """Issue 38: job.json's on_demand_at is the plan's switch."""
    conf = auto_scaling.settings({"auto_scaling": dict(GOOD, on_demand_at=on_demand_at)})
    assert auto_scaling.switch_due(conf, lifecycle, at) is due


def test_the_switch_to_on_demand_names_the_distribution_only():
    """Issue 38: the update names the group and its instances distribution and nothing else
    (no size, type, subnet or template: the role may make no other update, job_role.py), so
    AWS keeps the rest of the group; a refusal is a line that says so."""
    conf = auto_scaling.settings({"auto_scaling": dict(GOOD, on_demand_at=1.7e9)})
    url, server, seen = answering((200, b""), (403, _error("AccessDenied")))
    try:
        ok, line = auto_scaling.to_on_demand(dict(conf, endpoint=url), _Creds(), lambda s: None)
        refused = auto_scaling.to_on_demand(dict(conf, endpoint=url), _Creds(), lambda s: None)
    finally:
        server.close()
    assert ok and line.startswith("group cloudtrain-j1 set to on-demand"), line
    assert seen[0] == {
        "Action": "UpdateAutoScalingGroup", "Version": auto_scaling.AUTOSCALING_VERSION,
        "AutoScalingGroupName": "cloudtrain-j1",
        "MixedInstancesPolicy.InstancesDistribution.OnDemandBaseCapacity": "0",
        "MixedInstancesPolicy.InstancesDistribution.OnDemandPercentageAboveBaseCapacity": "100"}
    assert refused == (False, "setting group cloudtrain-j1 to on-demand failed: AccessDenied: m")


def test_instance_states_read_only_the_asked_ids_and_a_refusal_is_none_and_why():
    """An answer that lists more than was asked (or lies about it) gives only the asked ids;
    EC2's refusal is (None, its code and message), asked once."""
    body = ("<DescribeInstancesResponse><reservationSet><item><instancesSet>"
            "<item><instanceId>i-0000000a</instanceId><imageId>ami-1</imageId>"
            "<instanceState><code>16</code><name>running</name></instanceState></item>"
            "<item><instanceId>i-0000000f</instanceId>"
            "<instanceState><code>48</code><name>terminated</name></instanceState></item>"
            "</instancesSet></item></reservationSet></DescribeInstancesResponse>").encode()
    url, server, seen = answering((200, body))
    try:
        conf = dict(GOOD, endpoint=url)
        assert auto_scaling.instance_states(conf, _Creds(), ["i-0000000a", "i-0000000b"]) == (
            {"i-0000000a": "running"}, "")
    finally:
        server.close()
    assert seen[0]["Action"] == "DescribeInstances"
    assert (seen[0]["InstanceId.1"], seen[0]["InstanceId.2"]) == ("i-0000000a", "i-0000000b")
    url, server, seen = answering((403, _error("UnauthorizedOperation")))
    try:
        assert auto_scaling.instance_states(dict(GOOD, endpoint=url), _Creds(), ["i-0000000a"],
                                            lambda s: None) == (None, "UnauthorizedOperation: m")
    finally:
        server.close()
    assert len(seen) == 1
