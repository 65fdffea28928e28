"""cloudtrain/launch_check_nodes.py: the script `check --launch --nodes N` runs on every node,
run here as N processes on loopback with the settings each node gets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cloudtrain import launch_check_nodes as nodes_check
from cloudtrain.errors import UsageError


def _run(tmp_path, n: int) -> list[subprocess.CompletedProcess]:
    from labs.loopback import free_port

    script = tmp_path / nodes_check.SCRIPT
    script.write_text(nodes_check.script("cloudtrain check --launch 1234"))
    port = free_port("127.0.0.1")
    procs = [subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "CLOUDTRAIN_NODES": str(n), "CLOUDTRAIN_NODE_RANK": str(r),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        for r in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_issue37_every_node_meets_node_0_on_two_ports_and_the_bytes_come_back(tmp_path, n):
    """Issue 37 (★): node i says hello at MASTER_PORT, learns a second port node 0 opened,
    sends 1 MiB there and gets the same bytes back; each node's line is what the check's
    `meeting` step reads (MET), then the check's own line."""
    done = _run(tmp_path, n)
    assert [p.returncode for p in done] == [0] * n, [p.stderr for p in done]
    for rank, p in enumerate(done[1:], start=1):
        met = nodes_check.MET.search(p.stdout)
        assert met and int(met[1]) == rank and met[2] == "127.0.0.1" and met[3] != met[4]
        assert p.stdout.rstrip().endswith("cloudtrain check --launch 1234")
    assert sorted(line.split()[4] for line in done[0].stdout.splitlines()
                  if line.startswith("node 0 met")) == [str(r) for r in range(1, n)]


def test_issue37_the_check_runs_on_2_to_4_nodes():
    for n in (0, 1, 5):
        with pytest.raises(UsageError, match=f"--nodes {n}: the check runs on 2 to 4 nodes"):
            nodes_check.run(n)
