"""Issue 27: a spot interruption recovered by AWS Auto Scaling with the laptop closed, against
the supervisor on a laptop that stays on (benchmarks/recovery.py's case), in the same lab.

Runs on namespace hosts (root only), through the real AWS path against moto, with
tests/labs/asg.py playing AWS Auto Scaling (tests/e2e/test_autoscaled_recovery.py's lab). A
job of your own code (a step every 0.15 s, a checkpoint every 5 steps; test_spot_recovery's)
is launched into its group; every cloudtrain process of the launching machine is killed; its
instance is taken back without a notice mid-way between two checkpoints. Prints, per case:

  total      termination -> the first training step on the replacement
  wait       the instance's own wait, excluded from the overhead: for the group, the
             replacement's launch -> its user-data's start (AWS's boot); for the supervisor,
             RunInstances answered -> SSH answered
  overhead   total - wait: for the group, noticing the loss (the lab's AWS: a 0.1 s tick),
             the boot loader, bootstrap (the bundle fetched and checked, the checkpoint
             restored), agent and job start; for the supervisor, detection, the relaunch's
             EC2 calls, sync, setup, restore, agent and job start

    sudo .venv/bin/python benchmarks/autoscaled_recovery.py [--runs N] [--nodes N]

With --nodes N (issue 27's jobs on several nodes) the job runs on N nodes of one group; node 0
is taken back; total is termination -> the first step of rank 0 (the replacement) once the
other nodes have seen the new attempt, stopped their part and met it through the job store.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e"), str(ROOT / "benchmarks")]

PROFILE = "ct-instance"


def _first_step_after(path: Path, t0: float) -> float | None:
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    except (OSError, ValueError):
        return None
    return next((r["time"] for r in rows if r.get("time", 0) > t0), None)


def grouped(nodes: int = 1) -> dict:
    import boto3

    from labs.cloud import bench_home, cloud_lab
    from labs.credentials import CLIENT_CREDS, REGION
    from labs.polling import wait_for
    from test_spot_recovery import _own_job

    with bench_home("autoscaled") as (tmp, home, mp, cli, socket):
        with cloud_lab(cli, home, tmp, mp, [], socket, autoscaling=True) as lab:
            iam = boto3.client("iam", endpoint_url=lab.endpoint, region_name=REGION,
                               **CLIENT_CREDS)
            iam.create_role(RoleName="ct-role", AssumeRolePolicyDocument="{}")
            iam.create_instance_profile(InstanceProfileName=PROFILE)
            iam.add_role_to_instance_profile(InstanceProfileName=PROFILE, RoleName="ct-role")
            if nodes > 1:  # a cluster placement group holds the group's nodes
                from labs.moto_placement import PlacementGroups

                lab.asg.placement = PlacementGroups().install(mp)
                lab.host_env["OMP_NUM_THREADS"] = "1"
            config = home / "config.yaml"
            config.write_text("".join(l for l in config.read_text().splitlines(keepends=True)
                                      if not l.startswith("remote_root:"))
                              + f"instance_profile: {PROFILE}\n"
                              "remote_root: /home/ubuntu/.cloudtrain\n")
            work = _own_job(tmp, 80)
            job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--workdir", str(work),
                                "--nodes", str(nodes), "--", "python3", "job.py", "80",
                                timeout=300)
            name = f"cloudtrain-{job_id}"
            members = lab.asg.wait_for_group(name, nodes)
            zero = cli.job(job_id)["nodes"][0]["instance"] if nodes > 1 else members[0].id
            (first,) = [i for i in members if i.id == zero]  # node 0: its metrics are rank 0's
            wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0) >= 20,
                     timeout=60, what="a checkpoint at step 20")
            lab.asg.kill_launching_machine()
            time.sleep(0.4)  # mid-way between two checkpoints
            t0 = time.time()
            lab.take_back({"InstanceId": first.id, "PrivateIpAddress": first.ip})
            new = wait_for(lambda: next((i for i in lab.asg.live(name)
                                         if i.id not in {m.id for m in members}), None),
                           timeout=60, what="the replacement")
            metrics = lab.homes[new.ip] / ".cloudtrain" / "jobs" / job_id / "metrics.jsonl"
            step = wait_for(lambda: _first_step_after(metrics, t0), timeout=120,
                            interval=0.05, what="the replacement's first step")
            launched = next(e["t"] for e in lab.asg.log("launch") if e["instance"] == new.id)
            started = next(e["t"] for e in lab.asg.log("user-data-start")
                           if e["instance"] == new.id)
            wait_for(lambda: not any(lab.asg.leftovers().values()), timeout=180,
                     what="the job's end, nothing left")
            job = cli.job(job_id)
            assert job["state"] == "succeeded", job["reason"]
            return {"total_s": step - t0, "wait_s": started - launched,
                    "overhead_s": step - t0 - (started - launched)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=1,
                        help="a job on N nodes: node 0 is taken back, the replacement takes "
                             "rank 0 once the nodes have met again (the supervisor's case "
                             "is then not run)")
    args = parser.parse_args()
    from labs.netns import require_netns

    require_netns()
    import recovery  # benchmarks/recovery.py: the supervisor on a laptop that stays on

    print(f"{'case':<34} {'total s':>8} {'wait s':>8} {'overhead s':>20}  "
          "(medians of runs; overhead min-max)")
    cases = [("AWS Auto Scaling, laptop closed", grouped),
             ("supervisor here, laptop on", lambda: recovery.one("no-notice"))]
    if args.nodes > 1:
        cases = [(f"AWS Auto Scaling, {args.nodes} nodes, laptop closed",
                  lambda: grouped(args.nodes))]
    for case, run in cases:
        got = [run() for _ in range(args.runs)]
        total = [g.get("total_s", g["overhead_s"] + g.get("instance_wait_s", 0)) for g in got]
        wait = [g.get("wait_s", g.get("instance_wait_s", 0.0)) for g in got]
        over = [g["overhead_s"] for g in got]
        print(f"{case:<34} {statistics.median(total):>8.2f} {statistics.median(wait):>8.2f} "
              f"{statistics.median(over):>8.2f} ({min(over):.2f}-{max(over):.2f})")


if __name__ == "__main__":
    main()
