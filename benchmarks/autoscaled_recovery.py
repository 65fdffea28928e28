"""Issues 27 and 34: a spot job recovered by AWS Auto Scaling with the laptop closed, through
several interruptions in a row, against the supervisor on a laptop that stays on
(benchmarks/recovery.py's case), in the same lab.

Runs on namespace hosts (root only), through the real AWS path against moto, with
tests/labs/asg.py playing AWS Auto Scaling (tests/e2e/test_autoscaled_recovery.py's lab). A
job of your own code (a step every 0.15 s, a checkpoint every 5 steps; test_spot_recovery's)
is launched into its group with the default checkpoint stream (checkpoint_settle_seconds 2,
as a user has it); every cloudtrain process of the launching machine is killed; then its
instance is taken back --faults times in a row, each time mid-way between two checkpoints,
without a notice or (--notice) 2 s after one. Prints, per recovery:

  total      termination -> the first training step on the replacement
  wait       the instance's own wait, excluded from the overhead: for the group, the
             replacement's launch -> its user-data's start (AWS's boot); for the supervisor,
             RunInstances answered -> SSH answered
  overhead   total - wait: for the group, noticing the loss (the lab's AWS: a 0.1 s tick),
             the boot loader, bootstrap (the bundle fetched and checked, the checkpoint
             restored), agent and job start; for the supervisor, detection, the relaunch's
             EC2 calls, sync, setup, restore, agent and job start
  redone     steps redone: the last step taken before the loss - the step resumed from
             (goal: at most the checkpoint interval, 5, whatever came before)

and, under each, what `status --json` says of that attempt once the launching machine is
back (issue 34: its last step from the job store, the next one's resumed step, the steps
redone), and whether it agrees with the figures measured here.

    sudo .venv/bin/python benchmarks/autoscaled_recovery.py [--runs N] [--faults K] [--notice]
    sudo .venv/bin/python benchmarks/autoscaled_recovery.py --nodes 3 --lose 1 [--ddp]

With --nodes N (issue 27's jobs on several nodes) the job runs on N nodes of one group; the
node of rank --lose is taken back; total is termination -> rank 0's first step once the nodes
have met again. --ddp runs resnet9 over the N nodes (torchrun, gloo: the e2e's job) instead
of your own code, and the lines after each recovery say where the time went on every node
(its status.json's regroup timeline; the replacement's boot), in seconds after the loss.
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
INTERVAL = 5  # the own job's checkpoint interval, in steps
DDP = ("--recipe", "resnet9", "--profile", "smoke", "--set", "epochs=12")


def _rows(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    except (OSError, ValueError):
        return []


def _first_step_after(path: Path, t0: float) -> dict | None:
    return next((r for r in _rows(path) if r.get("time", 0) > t0 and "step" in r), None)


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _job(cli, job_id: str) -> dict:
    """`status --json`, asked again where it met the launching machine's supervisor
    recording the same attempt (C2, the laptop side's: its database is fine)."""
    for _ in range(4):
        try:
            return cli.job(job_id)
        except AssertionError:
            time.sleep(1.0)
    return cli.job(job_id)


def grouped(nodes: int = 1, faults: int = 3, notice: bool = False, lose: int = 0,
            ddp: bool = False) -> list[dict]:
    """One job through `faults` losses in a row; a dict per recovery."""
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
            config.write_text("".join(
                l for l in config.read_text().splitlines(keepends=True)
                if not l.startswith(("remote_root:", "checkpoint_settle_seconds:")))
                + f"instance_profile: {PROFILE}\nremote_root: /home/ubuntu/.cloudtrain\n")
            steps = 60 + 40 * faults
            if ddp:
                job_id = cli.launch(*DDP, "--set", f"gpus={nodes}", "--nodes", str(nodes),
                                    "--instance", "g5.xlarge", "--spot",
                                    "--max-restarts", str(faults + 1), timeout=300)
            else:
                work = _own_job(tmp, steps)
                job_id = cli.launch("--instance", "g5.xlarge", "--spot", "--workdir",
                                    str(work), "--nodes", str(nodes), "--max-restarts",
                                    str(faults + 1), "--", "python3", "job.py", str(steps),
                                    timeout=300)
            name = f"cloudtrain-{job_id}"
            members = lab.asg.wait_for_group(name, nodes)
            ranks = {k: n["instance"] for k, n in enumerate(_job(cli, job_id)["nodes"])} \
                if nodes > 1 else {0: members[0].id}
            seen = {i.id for i in members}
            by_id = {i.id: i for i in members}
            lab.asg.kill_launching_machine()
            out = []

            def jobdir(inst) -> Path:
                return lab.homes[inst.ip] / ".cloudtrain" / "jobs" / job_id

            for fault in range(faults):
                zero = by_id[ranks[0]]
                floor = (lab.stored_checkpoint(job_id) or {}).get("step") or 0
                wait_for(lambda: (lab.stored_checkpoint(job_id) or {}).get("step", 0)
                         >= floor + 3 * INTERVAL, timeout=600, interval=0.1,
                         what="a streamed checkpoint three intervals on")
                if not ddp:  # mid-way between two checkpoints
                    wait_for(lambda: (_rows(jobdir(zero) / "metrics.jsonl") or [{}])[-1]
                             .get("step", 1) % INTERVAL == 2, timeout=30, interval=0.02,
                             what="a step mid-way between two checkpoints")
                victim = by_id[ranks[lose]]
                steps = jobdir(zero) / "metrics.jsonl"
                last = max([r["step"] for r in _rows(steps) if "step" in r] or [0])
                if notice:  # the job stops, its agent stores the checkpoint and powers off
                    lab.imds.announce(victim.ip)
                    until = time.time() + 2.0
                    while time.time() < until:
                        last = max([last] + [r["step"] for r in _rows(steps) if "step" in r])
                        time.sleep(0.05)
                t0 = time.time()
                if victim.id in {i.id for i in lab.asg.live(name)}:
                    lab.take_back({"InstanceId": victim.id, "PrivateIpAddress": victim.ip})
                else:  # it powered off within the 2 s: that was its end
                    t0 = next((e["t"] for e in lab.asg.log("power-off", "terminated")
                               if e.get("instance") == victim.id), t0)
                new = wait_for(lambda: next((i for i in lab.asg.live(name)
                                             if i.id not in seen), None),
                               timeout=120, what="the replacement")
                seen.add(new.id)
                by_id[new.id] = new
                ranks[lose] = new.id
                first = wait_for(lambda: _first_step_after(
                    jobdir(by_id[ranks[0]]) / "metrics.jsonl", t0),
                    timeout=600, interval=0.05, what="rank 0's first step after the loss")
                resumed = first["step"] - 1
                if ddp:  # the checkpoint every node restored (the replacement's, as any)
                    resumed = (wait_for(lambda: _json(jobdir(new) / "bootstrap-status.json")
                                        .get("restored"), timeout=60, what="the restore")
                               .get("step") or 0)
                launched = next(e["t"] for e in lab.asg.log("launch")
                                if e["instance"] == new.id)
                started = next(e["t"] for e in lab.asg.log("user-data-start")
                               if e["instance"] == new.id)
                got = {"fault": fault + 1, "total_s": first["time"] - t0,
                       "wait_s": started - launched,
                       "overhead_s": first["time"] - t0 - (started - launched),
                       "redone": last - resumed, "resumed": resumed, "last": last,
                       "phases": {"launch": launched - t0, "user-data": started - t0}}
                boot = _json(jobdir(new) / "bootstrap-status.json")
                if boot.get("at"):
                    got["phases"]["bootstrap done"] = boot["at"] - t0
                for k, ident in sorted(ranks.items()):
                    status = _json(jobdir(by_id[ident]) / "status.json")
                    line = dict((status.get("regroup") or {}) if ident != new.id else {})
                    line["run started"] = status.get("started_at")
                    got["phases"][f"rank {k}"] = {
                        p: round(v - t0, 2) for p, v in line.items()
                        if isinstance(v, (int, float)) and v > t0 and p not in ("to", "attempt")}
                startup = [r for r in _rows(jobdir(by_id[ranks[0]]) / "metrics.jsonl")
                           if r.get("event") == "startup"]
                if startup:  # the job's own start (import, data, warm-up): the first, this
                    got["phases"]["job start, first attempt"] = startup[0].get("to_first_step")
                    got["phases"]["job start, now"] = startup[-1].get("to_first_step")
                out.append(got)
            wait_for(lambda: not any(lab.asg.leftovers().values()), timeout=900,
                     what="the job's end, nothing left")
            job = _job(cli, job_id)
            assert job["state"] == "succeeded", job["reason"]
            assert len(job["attempts"]) == faults + 1, job["attempts"]
            shown = {a["attempt"]: a for a in job["attempts"]}
            for got in out:  # attempt n was the one lost at fault n
                row, after = shown.get(got["fault"], {}), shown.get(got["fault"] + 1, {})
                got["status"] = {"last": row.get("last_step"), "redone": row.get("redone_steps"),
                                 "resumed": after.get("resumed_step")}
            return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--faults", type=int, default=3, help="interruptions in a row")
    parser.add_argument("--notice", action="store_true", help="a spot notice 2 s before each")
    parser.add_argument("--nodes", type=int, default=1,
                        help="a job on N nodes (the supervisor's case is then not run)")
    parser.add_argument("--lose", type=int, default=0, help="the rank taken back")
    parser.add_argument("--ddp", action="store_true", help="resnet9 over the nodes (gloo)")
    parser.add_argument("--no-supervisor", action="store_true")
    args = parser.parse_args()
    from labs.netns import require_netns

    require_netns()
    case = (f"AWS Auto Scaling, {args.nodes} node(s), rank {args.lose} lost, "
            f"{'notice' if args.notice else 'no notice'}")
    print(case)
    print(f"{'recovery':>8} {'total s':>8} {'wait s':>7} {'overhead s':>10} {'redone':>7} "
          f"{'resumed':>8}")
    got = [grouped(args.nodes, args.faults, args.notice, args.lose, args.ddp)
           for _ in range(args.runs)]
    for run in got:
        for g in run:
            print(f"{g['fault']:>8} {g['total_s']:>8.2f} {g['wait_s']:>7.2f} "
                  f"{g['overhead_s']:>10.2f} {g['redone']:>7} {g['resumed']:>8}")
            st = g["status"]
            print(f"         status --json, the laptop back: last step {st['last']}, resumed "
                  f"{st['resumed']}, redone {st['redone']} (here: last {g['last']}, resumed "
                  f"{g['resumed']}, redone {g['redone']}): "
                  + ("agrees" if (st["last"], st["resumed"], st["redone"]) ==
                     (g["last"], g["resumed"], g["redone"]) else "differs"))
            if args.nodes > 1:
                print("         where the time went (s after the loss):",
                      json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                                  for k, v in g["phases"].items()}))
    flat = [g for run in got for g in run]
    print(f"{'median':>8} {statistics.median(g['total_s'] for g in flat):>8.2f} "
          f"{statistics.median(g['wait_s'] for g in flat):>7.2f} "
          f"{statistics.median(g['overhead_s'] for g in flat):>10.2f} "
          f"{statistics.median(g['redone'] for g in flat):>7g}   "
          f"(redone max {max(g['redone'] for g in flat)})")
    if args.nodes == 1 and not args.no_supervisor:
        import recovery  # benchmarks/recovery.py: the supervisor on a laptop that stays on

        case = "notice" if args.notice else "no-notice"
        sup = [recovery.one(case) for _ in range(args.runs)]
        print(f"supervisor here, laptop on ({case}): overhead "
              f"{statistics.median(g['overhead_s'] for g in sup):.2f} s, redone "
              f"{statistics.median(g['lost_steps'] for g in sup):g} steps")


if __name__ == "__main__":
    main()
