"""Wall time of the whole `cloudtrain cost-report` process over 10,000 jobs in the store.

Goal (issue 4): under 0.5 s. Usage: python benchmarks/cost_report_10k.py [--jobs N] [--runs R]
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

from cloudtrain.state import Store  # noqa: E402


def fill(home: Path, n: int) -> None:
    """n finished jobs, each with one terminated instance and a settled cost, in one go."""
    store = Store(home / "state.db")
    rng = random.Random(0)
    t0 = time.time() - 60 * 86400
    with store.transaction() as db:
        for i in range(n):
            at = t0 + i * 500
            job_id = f"{i:08x}"
            cost = rng.uniform(0.01, 5.0)
            db.execute(
                "INSERT INTO jobs (id, name, kind, recipe, command, backend, state, created_at,"
                " started_at, ended_at, spec, cost, cost_settled, cost_detail) VALUES "
                "(?, ?, 'recipe', ?, 'resnet9', 'aws', 'succeeded', ?, ?, ?, '{}', ?, 1, ?)",
                (job_id, f"exp{i}", rng.choice(["resnet9", "airbench94", "wide-resnet34"]), at,
                 at + 60, at + 400, cost, json.dumps({"to_target": cost * 0.8})))
            db.execute(
                "INSERT INTO instances (id, job_id, provider, region, zone, instance_type, market,"
                " state, launched_at, terminated_at, price_per_hour, details) VALUES "
                "(?, ?, 'aws', 'us-east-1', 'us-east-1a', 'g5.xlarge', 'on-demand', "
                "'terminated', ?, ?, 1.006, '{\"disk_gb\": 60}')",
                (f"i-{i:017x}", job_id, at, at + 420))
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fill(Path(tmp), args.jobs)
        env = {**os.environ, "CLOUDTRAIN_HOME": tmp}
        for by in ("job", "recipe", "month", "instance"):
            cmd = [sys.executable, "-m", "cloudtrain", "cost-report", "--by", by]
            times = []
            for _ in range(args.runs + 1):
                t = time.perf_counter()
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                times.append(time.perf_counter() - t)
            total = out.stdout.strip().splitlines()[-1]
            print(f"cost-report --by {by:<8} {args.jobs} jobs: median "
                  f"{statistics.median(times[1:]):.3f} s (goal < 0.5 s)  [{' '.join(total.split())}]")


if __name__ == "__main__":
    main()
