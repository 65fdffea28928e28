"""A job on N nodes against the same job on 1: launch -> first output of every node, and the
SSH connections each node gets, through the real AWS path (moto on the bridge, with
placement groups) onto network-namespace instances (root only).

Goal (issue 15): 8 nodes at most 1.3x the time of 1; one SSH connection per node per launch.

What is timed: `cloudtrain launch` (one RunInstances, the SSH waits, host keys, sync, setup,
the agents' start) until the last node's job has printed its first line. Each node's sshd logs
every accepted login ("Accepted publickey"), counted after the launch returns. Instances here
are running at once (moto), so the figure is cloudtrain's own overhead: on EC2 the boot
(about 1-2 min) comes on top, the same for every node.

Usage: sudo .venv/bin/python benchmarks/multinode_launch.py [--nodes 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]


def one(nodes: int, hosts: list[str]) -> dict:
    from labs.cloud import bench_home, cloud_lab
    from labs.moto_placement import PlacementGroups

    with bench_home("nodes") as (tmp, home, mp, cli, socket):
        PlacementGroups().install(mp)
        with cloud_lab(cli, home, tmp, mp, hosts[:nodes], socket) as lab:
            for ip in hosts[:nodes]:
                lab.start(ip)
            work = tmp / "work"
            work.mkdir()
            (work / "job.sh").write_text('echo "node $CLOUDTRAIN_NODE_RANK up"; sleep 300\n')
            t0, t0_wall = time.perf_counter(), time.time()
            job_id = cli.launch("--nodes", str(nodes), "--instance", "g5.xlarge",
                                "--workdir", str(work), "--", "bash", "job.sh", timeout=600)
            launched = time.perf_counter() - t0
            logs = [lab.homes[ip] / ".cloudtrain" / "jobs" / job_id / "output.log"
                    for ip in hosts[:nodes]]
            while not all(p.exists() and b"up" in p.read_bytes() for p in logs):
                if time.perf_counter() - t0 > 600:
                    raise SystemExit("a node printed nothing in 600 s")
                time.sleep(0.01)
            first = time.perf_counter() - t0
            logins = [lab.sshds[ip].connections() for ip in hosts[:nodes]]
            timeline = cli.job(job_id)["timeline"]
            phases = {}
            for p in timeline:
                if p["name"] in ("provisioning", "syncing", "setting-up") and \
                        p["duration"] is not None:
                    phases[p["name"]] = p["duration"]
            at = {id(p): datetime.fromisoformat(p["start"]).timestamp()  # ISO 8601 UTC
                  for p in timeline}
            running = next(at[id(p)] for p in timeline if p["name"] == "running")
            phases["start"] = t0_wall + first - running
            phases["before"] = at[id(timeline[0])] - t0_wall
            if os.environ.get("BENCH_VERBOSE"):
                print([(round(at[id(p)] - t0_wall, 2), p["name"]) for p in timeline])
            cli("down", job_id, timeout=120)
            return {"first_output_s": first, "launch_s": launched, "logins": logins,
                    "phases": phases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from labs.netns import lab_ip, require_netns

    require_netns()
    hosts = [lab_ip(4 + i) for i in range(args.nodes)]  # moto's order in us-east-1a
    rows = {}
    for n in (1, args.nodes):
        got = [one(n, hosts) for _ in range(args.runs)]
        rows[n] = got
        first = [g["first_output_s"] for g in got]
        logins = sorted({x for g in got for x in g["logins"]})
        print(f"{n:>2} node(s): launch -> every node's first output median "
              f"{statistics.median(first):.2f} s ({min(first):.2f}-{max(first):.2f}, "
              f"{args.runs} runs); launch returned after "
              f"{statistics.median(g['launch_s'] for g in got):.2f} s; SSH logins per node "
              f"{logins}")
        print("    by phase (median s): " + ", ".join(
            f"{k} {statistics.median(g['phases'].get(k, 0.0) for g in got):.2f}"
            for k in ("before", "provisioning", "syncing", "setting-up", "start")))
    ratio = statistics.median(g["first_output_s"] for g in rows[args.nodes]) / \
        statistics.median(g["first_output_s"] for g in rows[1])
    print(f"{args.nodes} nodes / 1 node: {ratio:.2f}x (goal <= 1.3x)")


if __name__ == "__main__":
    main()
