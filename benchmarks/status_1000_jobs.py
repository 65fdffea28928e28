"""Wall time of the whole `cloudtrain status` process with 1,000 jobs in the store.

Goal (issue 2): under 0.3 s. Usage: python benchmarks/status_1000_jobs.py [--jobs N] [--runs R]
"""

from __future__ import annotations

import argparse
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
    store = Store(home / "state.db")
    rng = random.Random(0)
    t0 = time.time() - 30 * 86400
    for i in range(n):
        at = t0 + i * 60
        job = store.create_job(name=f"exp-{i}", kind="recipe", recipe="resnet9",
                               command="resnet9 (smoke)", backend="local",
                               spec={"kind": "recipe", "recipe": "resnet9"}, at=at)
        store.set_state(job.id, "running", at=at + 1)
        store.set_state(job.id, rng.choice(["succeeded", "failed", "cancelled"]), at=at + 50,
                        started_at=at + 1, exit_code=0, cost=0.0,
                        metrics={"epoch": 10, "epochs": 10, "train_loss": rng.random(),
                                 "test_acc": rng.random()})
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        fill(home, args.jobs)
        env = {**os.environ, "CLOUDTRAIN_HOME": str(home)}
        cmd = [sys.executable, "-m", "cloudtrain", "status"]
        times, lines = [], 0
        for _ in range(args.runs + 1):
            t = time.perf_counter()
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            times.append(time.perf_counter() - t)
            lines = len(out.splitlines())
        times = times[1:]  # the first run warms the page cache
        print(f"cloudtrain status, {args.jobs} jobs ({lines - 1} rows shown), "
              f"{args.runs} runs: median {statistics.median(times):.3f} s, "
              f"min {min(times):.3f} s, max {max(times):.3f} s (goal < 0.3 s)")


if __name__ == "__main__":
    main()
