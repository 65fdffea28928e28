"""lifecycle/group.py (issue 26): the hosts of one attempt as one value whatever their number,
so that each launch step is written once; a job on one machine is a group of one, whose
steps run in the caller's thread, and whose record is its host's, as before the group."""

from __future__ import annotations

import threading

from cloudtrain.local_host import LocalHost
from cloudtrain.lifecycle import group
from cloudtrain.lifecycle.group import NodeGroup
from cloudtrain.state import open_store


def _group(n: int) -> NodeGroup:
    hosts = [LocalHost(f"sock{i}") for i in range(n)]
    return NodeGroup("ab12cd34", hosts, [f"/jobs/{i}" for i in range(n)],
                     [f"/data/{i}" for i in range(n)],
                     [f"10.0.0.{i}" for i in range(n)] if n > 1 else [None],
                     [f"i-{i}" for i in range(n)] if n > 1 else [None])


def test_a_group_of_one_runs_each_step_in_the_callers_thread():
    """Issue 26: a single-node launch starts no thread (nor pays for one) per step."""
    caller = threading.current_thread()
    before = threading.active_count()
    assert _group(1).each(lambda i: (i, threading.current_thread())) == [(0, caller)]
    assert threading.active_count() == before


def test_a_group_of_several_runs_each_step_on_every_node_in_node_order():
    caller = threading.current_thread()
    out = _group(3).each(lambda i: (i, threading.current_thread() is caller))
    assert out == [(0, False), (1, False), (2, False)]


def test_the_record_of_one_node_is_its_host_and_of_several_lists_each_node():
    """The host record of a job on one machine stays its host's description (no "nodes");
    on several, each node's: how to reach it, its job directory, address, instance, and
    its network interface once set up."""
    one = _group(1)
    assert one.record() == LocalHost("sock0").describe()
    many = _group(2)
    rec = many.record()
    assert rec["tmux_socket"] == "sock0"
    assert [(n["tmux_socket"], n["jobdir"], n["address"], n["instance"]) for n in rec["nodes"]] \
        == [("sock0", "/jobs/0", "10.0.0.0", "i-0"), ("sock1", "/jobs/1", "10.0.0.1", "i-1")]
    assert all("iface" not in n for n in rec["nodes"])
    many.ifaces = ["eth0", None]
    assert [n["iface"] for n in many.record()["nodes"]] == ["eth0", None]


def test_a_kept_host_is_the_jobs_host_until_forgotten(ct_home):
    """One connection per host for the whole process: the host the launch opened is the one
    every later step gets, until it is forgotten."""
    host = LocalHost("kept")
    with open_store(ct_home) as store:
        job = store.create_job(name=None, kind="command", recipe=None, command="true",
                               backend="local", spec={})
        store.update_job(job.id, host=host.describe())
        job = store.job(job.id)
    group.keep(job.id, 0, host)
    try:
        assert group.opened(job.id) is host and group.host_of(job) is host
        assert group.node_host(job, 0) is host
    finally:
        group.forget(job.id)
    assert group.opened(job.id) is None
    assert group.host_of(job) is not host
    group.forget(job.id)
