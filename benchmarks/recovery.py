"""Spot recovery (issue 13): what an interruption costs in our own overhead and in lost work.

Runs on namespace hosts (root only), through the real AWS path against moto, the same lab as
tests/e2e/test_spot_recovery.py: a job of your own code (a step every 0.15 s, a checkpoint
every 5 steps) is interrupted on its first instance, once without a notice and once with the
2-minute notice, and continues on the other instance. Prints, per case:

  overhead   termination -> the first new training step on the next host, minus the
             instance's own wait (RunInstances answered -> SSH answered): detection, the
             relaunch's EC2 calls, sync, setup, checkpoint restore, agent and job start
  lost       steps redone after the checkpoint the next attempt resumed from (the checkpoint
             stream as a user has it: checkpoint_settle_seconds 2)

    sudo .venv/bin/python benchmarks/recovery.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]


def one(case: str) -> dict:
    from labs.cloud import bench_home, cloud_lab
    from labs.polling import wait_for
    from test_spot_recovery import HOSTS, _own_job

    with bench_home("recovery") as (tmp, home, mp, cli, socket):
        with cloud_lab(cli, home, tmp, mp, list(HOSTS.values()), socket) as lab:
            for ip in HOSTS.values():
                lab.start(ip)
            config = home / "config.yaml"  # the checkpoint stream as a user has it
            config.write_text("".join(l for l in config.read_text().splitlines(keepends=True)
                                      if not l.startswith("checkpoint_settle_seconds:")))
            work = _own_job(tmp, 80)
            job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--workdir", str(work),
                                "--", "python3", "job.py", "80")
            first = lab.current(job_id)
            wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0) >= 20,
                     timeout=60, what="a checkpoint at step 20")
            time.sleep(0.4)  # mid-way between two checkpoints
            if case == "notice":
                lab.imds.announce(first["PrivateIpAddress"])
                wait_for(lambda: lab.log.exists(), timeout=60, what="the power-off")
            t0 = time.time()
            lab.take_back(first)
            job = wait_for(lambda: (lambda j: j if j["state"] in (
                "succeeded", "failed") else None)(cli.job(job_id)), timeout=180,
                interval=0.5, what="the job's end")
            assert job["state"] == "succeeded", job["reason"]
            a1, a2 = job["attempts"][:2]
            rows = [json.loads(l) for l in
                    (home / "jobs" / job_id / "metrics.jsonl").read_text().splitlines()]
            resumed = next(r["time"] for r in rows
                           if r["step"] == (a2["resumed_step"] or 0) + 1 and r["time"] > t0)
            marks = {}
            for p in job["timeline"]:  # --json's times are ISO 8601 UTC
                start = datetime.fromisoformat(p["start"]).timestamp()
                if start > t0:
                    marks.setdefault(p["name"], start)
            wait_s = marks["host-key"] - marks["instance"]
            return {"case": case, "overhead_s": resumed - t0 - wait_s,
                    "instance_wait_s": wait_s, "lost_steps": a1["redone_steps"],
                    "checkpoint_step": a2["resumed_step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from labs.netns import require_netns

    require_netns()
    print(f"{'case':<10} {'overhead s':>12} {'instance wait s':>16} {'lost steps':>11}  "
          "(each a median of runs; min-max)")
    for case in ("no-notice", "notice"):
        got = [one(case) for _ in range(args.runs)]
        over = [g["overhead_s"] for g in got]
        lost = [g["lost_steps"] for g in got]
        wait = [g["instance_wait_s"] for g in got]
        print(f"{case:<10} {statistics.median(over):>7.2f} ({min(over):.2f}-{max(over):.2f})"
              f" {statistics.median(wait):>10.2f} {statistics.median(lost):>7g} "
              f"({min(lost)}-{max(lost)})")


if __name__ == "__main__":
    main()
