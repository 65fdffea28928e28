"""Issue 37 (★, with --nodes 2): `check --launch --nodes 2` proves a job on several nodes on the
user's account, here against the namespace lab: moto's EC2 and S3 on the bridge, placement
groups (tests/labs/moto_placement.py), each node a network namespace with its own sshd, home
and tmux, reaching the others over the bridge as a cluster's nodes reach each other."""

from __future__ import annotations

import os
import re

import pytest

from labs.cloud import cloud_lab
from labs.moto_placement import PlacementGroups
from labs.netns import lab_ip, netns_available
from labs.polling import wait_for

reason = netns_available()
pytestmark = [pytest.mark.skipif(reason is not None, reason=reason or ""),
              pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd"),
              pytest.mark.slow]

ZONE_A = [lab_ip(4), lab_ip(5), lab_ip(6)]  # moto's first three in us-east-1a
STEP_LINE = re.compile(r"^(?P<name>\S.{0,19}?) +(?P<seconds>\d+\.\d) s  "
                       r"(?P<verdict>ok  |FAILED: )(?P<detail>.*)$")


@pytest.fixture
def lab(cli, ct_home, tmp_path, monkeypatch):
    groups = PlacementGroups().install(monkeypatch)
    with cloud_lab(cli, ct_home, tmp_path, monkeypatch, ZONE_A,
                   f"ct-e2e-check-nodes-{os.getpid()}") as lab:
        lab.groups = groups
        yield lab


def test_check_launch_nodes_two_nodes_meet_in_one_placement_group_and_nothing_is_left(
        lab, cli, ct_home):
    """Issue 37 (★): two c6a.large from one RunInstances in one AZ and one cluster placement
    group (a T type is refused by one), each running the script that meets node 0 at the
    rendezvous port and on a second port node 0 opens, 1 MiB echoed each way; every step
    timed and ok, both nodes' logs home, both instances terminated, the placement group
    gone, the bill for both."""
    for ip in ZONE_A[:2]:
        lab.start(ip)
    proc = cli("check", "--launch", "--nodes", "2", "--yes", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [m.groupdict() for m in map(STEP_LINE.match, proc.stdout.splitlines()) if m]
    names = [s["name"] for s in steps]
    assert names[:3] == ["credentials", "instance type", "nodes"], names
    assert names[-6:] == ["placement", "meeting", "collect", "terminate", "cleanup", "bill"]
    assert all(s["verdict"] == "ok  " for s in steps), proc.stdout
    by = {s["name"]: s["detail"] for s in steps}
    assert by["instance type"].startswith("c6a.large on-demand in us-east-1: $")
    assert by["nodes"].startswith("2 nodes of c6a.large from one RunInstances, in one AZ")
    assert "one cluster placement group" in by["placement"]
    met = re.fullmatch(r"node 1 met node 0 at (\S+) on ports (\d+) and (\d+), 1 MiB each way "
                       r"in \d+ ms", by["meeting"])
    assert met and met[1] == ZONE_A[0] and met[2] != met[3], by["meeting"]
    raw = lab.aws.instances()
    assert len(raw) == 2 and {r["InstanceType"] for r in raw} == {"c6a.large"}
    assert {r["Placement"]["AvailabilityZone"] for r in raw} == {"us-east-1a"}
    wait_for(lambda: {r["State"]["Name"] for r in lab.aws.instances()} == {"terminated"},
             timeout=60, what="both instances terminated")
    assert not lab.groups.live()
    assert by["bill"].count("60 s billed") == 2, by["bill"]
    (log,) = (ct_home / "jobs").glob("*/nodes/1/output.log")  # node 1's, brought home
    assert "met node 0" in log.read_text()
