"""`cloudtrain status` with 10,000 jobs in the store (issue 16: job history).

Goal: the whole `python -m cloudtrain status` process under 0.3 s in its default view (active
jobs and the recent finished ones, history.DEFAULT_VIEW). Also timed: `status -a` (every
row), history.select on the same store in this process (the store's share of the time), and
a prune of the jobs older than 30 days.

Usage: python benchmarks/status_10k_jobs.py [--jobs N] [--active N] [--runs R]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloudtrain import history, state  # noqa: E402
from cloudtrain.state import Store  # noqa: E402

RECIPES = ("resnet9", "airbench94", "wide-resnet34")

def fill(home: Path, n: int, active: int) -> None:
    """n jobs over the last 90 days, the newest `active` of them still running; each with its
    events, one instance (terminated once the job ended) and one attempt, as a launch leaves
    them; written in one transaction (the store's own methods take one each: minutes)."""
    store = Store(home / "state.db")
    rng = random.Random(0)
    now = time.time()
    t0 = now - 90 * 86400
    step = (now - 3600 - t0) / n
    ids = set()
    while len(ids) < n:
        ids.add(f"{rng.getrandbits(32):08x}")
    with store.transaction() as db:
        for i, job_id in enumerate(sorted(ids, key=lambda _: rng.random())):
            at = t0 + i * step
            running = i >= n - active
            end = None if running else at + rng.uniform(60, 3000)
            final = state.RUNNING if running else rng.choice(
                [state.SUCCEEDED, state.SUCCEEDED, state.FAILED, state.CANCELLED])
            recipe = rng.choice(RECIPES)
            db.execute(
                "INSERT INTO jobs (id, name, kind, recipe, command, backend, state, created_at,"
                " started_at, ended_at, exit_code, spec, metrics, cost, cost_settled) VALUES "
                "(?, ?, 'recipe', ?, ?, 'local', ?, ?, ?, ?, ?, ?, ?, 0.0, ?)",
                (job_id, f"exp-{i}", recipe, f"{recipe} (smoke)", final, at, at + 5, end,
                 None if running else 0, json.dumps({"kind": "recipe", "recipe": recipe}),
                 json.dumps({"epoch": 10, "epochs": 10, "train_loss": rng.random(),
                             "test_acc": rng.random()}), 0 if running else 1))
            for phase, when in ((state.PENDING, at), (state.RUNNING, at + 5),
                                (final, end)):
                if when is not None:
                    db.execute("INSERT INTO events (job_id, phase, at) VALUES (?, ?, ?)",
                               (job_id, phase, when))
            db.execute(
                "INSERT INTO instances (id, job_id, provider, instance_type, market, state,"
                " launched_at, terminated_at, price_per_hour) VALUES "
                "(?, ?, 'local', 'local', 'local', ?, ?, ?, 0.0)",
                (f"local-{job_id}", job_id, "running" if running else "terminated", at, end))
            db.execute("INSERT INTO attempts (job_id, n, started_at, ended_at, outcome) "
                       "VALUES (?, 1, ?, ?, ?)", (job_id, at, end, None if running else final))
    store.close()


def timed(call, runs: int) -> tuple[list[float], object]:
    times, out = [], None
    for _ in range(runs + 1):
        t = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t)
    return times[1:], out  # the first run warms the page cache


def figures(times: list[float]) -> str:
    return (f"median {statistics.median(times):.3f} s, min {min(times):.3f} s, "
            f"max {max(times):.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--active", type=int, default=5, help="how many of them still run")
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        fill(home, args.jobs, args.active)
        # The active jobs here are not real: `status` would probe them (and fail them, their
        # launcher being gone) on the first run. The benchmark measures reading, so they stay
        # "running" from the store's point of view: no host, no launcher, no lease.
        env = {**os.environ, "CLOUDTRAIN_HOME": str(home)}
        for argv in (["status"], ["status", "-a"]):
            cmd = [sys.executable, "-m", "cloudtrain", *argv]

            def run(cmd=cmd):
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                return proc

            times, proc = timed(run, args.runs)
            if proc.returncode != 0:
                raise SystemExit(f"cloudtrain {' '.join(argv)}: exit {proc.returncode}: "
                                 f"{proc.stderr.strip()[-300:]}")
            rows = len(proc.stdout.splitlines()) - 1
            what = f"cloudtrain {' '.join(argv)}"
            print(f"process  {what:<33} {args.jobs} jobs, {rows} lines after the header, "
                  f"{args.runs} runs: {figures(times)} (goal < 0.3 s)")
        base = [sys.executable, "-c", "import cloudtrain.cli"]
        times, _ = timed(lambda: subprocess.run(base, env=env, check=True), args.runs)
        print(f"process  python -c 'import cloudtrain.cli' (the floor): {figures(times)}")
        store = Store(home / "state.db")
        try:
            times, (shown, hidden) = timed(lambda: history.select(store), args.runs)
            print(f"in-proc  history.select (default view): {len(shown)} jobs, {hidden} "
                  f"hidden: {figures(times)}")
            times, (shown, hidden) = timed(lambda: history.select(store, all_=True), args.runs)
            print(f"in-proc  history.select(all_=True):     {len(shown)} jobs: "
                  f"{figures(times)}")
            times, every = timed(store.jobs, args.runs)
            print(f"in-proc  Store.jobs() (every row):       {len(every)} jobs: "
                  f"{figures(times)}")
            t = time.perf_counter()
            plan = history.plan_removal(store, older_than="30d", home=home)
            planned = time.perf_counter() - t
            t = time.perf_counter()
            summary = history.remove(store, plan, home=home)
            print(f"in-proc  prune --older-than 30d: plan {len(plan.removals)} jobs in "
                  f"{planned:.2f} s, removed {len(summary.removed)} jobs ({summary.rows} rows) "
                  f"in {time.perf_counter() - t:.2f} s (once)")
        finally:
            store.close()


if __name__ == "__main__":
    main()
