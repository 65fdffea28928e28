"""Issue 15's pure parts: how a job's state follows from its nodes' agents, what each node's
run.sh starts, what comes back from a node's rendezvous probe (untrusted), and the
processes a recipe gets on each node."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloudtrain import nodes
from cloudtrain.errors import CloudtrainError, UsageError
from cloudtrain.lifecycle.scripts import run_script
from cloudtrain.spec import JobSpec


def _status(state, ended=None, reason=None, code=None, **kw):
    return {"state": state, "ended_at": ended, "reason": reason, "exit_code": code, **kw}


def test_every_node_succeeded_is_success_at_the_last_end():
    combined = nodes.combine([_status("succeeded", 10.0), _status("succeeded", 12.0),
                              _status("succeeded", 11.0)])
    assert combined["state"] == "succeeded" and combined["ended_at"] == 12.0


def test_node_0_done_while_others_finish_is_still_running():
    combined = nodes.combine([_status("succeeded", 10.0, code=0), _status("running")])
    assert combined["state"] == "running" and combined["ended_at"] is None


def test_the_first_node_to_fail_is_the_cause_and_is_named():
    """A node whose job dies first makes the others' collective calls fail after it: the
    earliest failure is the one the job reports."""
    combined = nodes.combine([_status("failed", 20.0, "exited with code 1", 1),
                              _status("running"),
                              _status("failed", 15.0, "exited with code 137", 137)])
    assert combined["state"] == "failed"
    assert combined["reason"] == "node 2: exited with code 137"
    assert combined["exit_code"] == 137


def test_a_node_whose_instance_is_gone_is_the_cause_though_found_after_the_others_fail():
    """Issue 15: node 2's instance dies; node 1's collective calls fail at once (exit 1),
    and node 2's end is known only when a probe cannot reach it and EC2 says it is gone,
    later. The job names node 2, not the failure its loss caused (a loaded machine made
    the probe slower than gloo, and the reason named node 1)."""
    combined = nodes.combine([_status("running"),
                              _status("failed", 20.0, "exited with code 1", 1),
                              _status("failed", 26.0, "its instance i-2 was terminated",
                                      instance_lost=True)])
    assert combined["reason"] == "node 2: its instance i-2 was terminated"
    assert combined["exit_code"] is None


def test_an_interruption_wins_over_the_failures_it_causes():
    """A spot node taken back: the others fail or are cancelled because of it; the job is
    interrupted (so a recovering job is relaunched, not failed)."""
    combined = nodes.combine([
        _status("cancelled", 30.0, "cancelled by user", checkpoint_stream={"final": True}),
        _status("preempted", 31.0, "spot interruption notice", interruption={"noticed_at": 29}),
        _status("failed", 28.0, "exited with code 1", 1)])
    assert combined["state"] == "preempted"
    assert combined["reason"] == "node 1: spot interruption notice"
    assert combined["interruption"] == {"noticed_at": 29}
    assert combined["checkpoint_stream"] == {"final": True}  # node 0's upload, for drained()


def test_a_node_not_heard_from_never_makes_the_job_succeed():
    assert nodes.combine([_status("succeeded", 1.0), None])["state"] == "running"


@given(st.lists(st.one_of(st.none(), st.builds(
    _status, st.sampled_from(["starting", "running", "succeeded", "failed", "cancelled",
                              "preempted"]),
    st.one_of(st.none(), st.floats(0, 1e9)))), min_size=1, max_size=16))
def test_combine_never_breaks_and_ends_only_as_a_node_did(statuses):
    combined = nodes.combine(statuses)
    states = {s["state"] for s in statuses if s}
    if combined.get("state") in ("failed", "cancelled", "preempted"):
        assert combined["state"] in states
    if combined.get("state") == "succeeded":
        assert states == {"succeeded"} and None not in statuses


@pytest.mark.parametrize("out, expected", [
    ("eth0\n29500\n", ("eth0", 29500)),
    ("ens5\n29501", ("ens5", 29501)),
    ("\n0\n", (None, None)),
    ("eth0; rm -rf /\n29500\n", (None, 29500)),  # from a host: never a shell word
    ("eth0\n99999\n", ("eth0", None)),
    ("", (None, None)),
    ("x" * 40 + "\n1\n", (None, 1)),
])
def test_rendezvous_answers_are_checked(out, expected):
    assert nodes.read_rendezvous(out) == expected


def test_each_node_runs_torchrun_with_its_rank_and_node_0_as_the_rendezvous():
    spec = JobSpec(kind="recipe", backend="aws", recipe="resnet9", args={"gpus": 4},
                   nodes=2, gpus_needed=4)
    text = run_script(spec, "/home/ubuntu/.cloudtrain/jobs/abcd1234", "/opt/py", procs=2,
                      node={"nodes": 2, "rank": 1, "master": "10.0.0.5", "port": 29501},
                      job_id="abcd1234")
    line = [l for l in text.splitlines() if l.startswith("exec ")][0]
    assert line.startswith("exec /opt/py -m torch.distributed.run --nnodes=2 --node-rank=1 "
                           "--nproc-per-node=2 --master-addr=10.0.0.5 --master-port=29501 "
                           "--rdzv-id=abcd1234 ")
    assert "--standalone" not in line


def test_a_recipes_gpus_count_all_nodes_and_each_node_starts_its_share():
    spec = JobSpec(kind="recipe", backend="aws", recipe="resnet9", nodes=2, gpus_needed=16,
                   gpus_exact=True)
    assert spec.processes(8) == 8
    with pytest.raises(UsageError, match="8 GPUs, but this host has 4"):
        spec.processes(4)
    per_node = JobSpec(kind="recipe", backend="aws", recipe="imagenet", nodes=4,
                       gpus_needed=8, gpus_exact=False)
    assert per_node.processes(8) == 8  # a variant's GPUs are per node


def test_environment_names_the_node_and_the_interface():
    env = nodes.environment(3, 2, "10.0.0.5", 29500, "ens5", {"FI_PROVIDER": "efa"})
    assert env == {"CLOUDTRAIN_NODES": "3", "CLOUDTRAIN_NODE_RANK": "2",
                   "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500",
                   "GLOO_SOCKET_IFNAME": "ens5", "NCCL_SOCKET_IFNAME": "ens5",
                   "FI_PROVIDER": "efa"}


def test_each_runs_every_node_and_names_the_first_that_failed():
    seen = []

    def step(i):
        seen.append(i)
        if i in (2, 3):
            raise CloudtrainError(f"broken {i}")
        return i * 10

    assert nodes.each(lambda i: i * 10, 4) == [0, 10, 20, 30]
    with pytest.raises(nodes.NodeError) as err:
        nodes.each(step, 5)
    assert sorted(seen) == [0, 1, 2, 3, 4]  # the others were not abandoned
    assert err.value.node == 2 and err.value.message == "node 2: broken 2"


def test_the_data_copy_is_said_per_node():
    from cloudtrain import datasets

    spec = JobSpec.of(kind="recipe", backend="aws", recipe="imagenet", nodes=4,
                   datasets=[{"name": "imagenet", "kind": "shards",
                              "location": "s3://b/imagenet"}],
                   staging={"imagenet": {"bytes": 150 * 10 ** 9, "files": 1000,
                                         "kind": "shards"}})
    line = datasets.staging_line(spec)
    assert "on each of 4 nodes, at the same time" in line and "600.0 GB read in all" in line
