"""Every bundled recipe's smoke profile, launched as a user would on the local backend.

Goal (issue 2, recipes-spec): each smoke profile finishes in well under a minute on a CPU,
launch to `succeeded`. The tests check what the smoke runs produce; the time lives here.
Usage: python benchmarks/smoke_profiles.py [--runs R] [--recipe NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPES = ["resnet9", "airbench94", "airbench95", "airbench96", "wide-resnet34", "imagenet"]
GOAL_S = 60.0


def smoke_run(env: dict, recipe: str) -> tuple[float, str]:
    """Seconds from `launch --follow` to its return, and the job's final state."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "launch", "--recipe", recipe,
                           "--profile", "smoke", "--follow", "--quiet", "--yes"],
                          env=env, capture_output=True, text=True, cwd=REPO, timeout=600)
    took = time.perf_counter() - t0
    job_id = (proc.stdout.splitlines() or [""])[0].strip()
    shown = subprocess.run([sys.executable, "-m", "cloudtrain", "status", job_id, "--json"],
                           env=env, capture_output=True, text=True, cwd=REPO)
    try:
        state = json.loads(shown.stdout)["state"]
    except (ValueError, LookupError, TypeError):
        state = f"unknown (exit {proc.returncode}: {proc.stderr.strip()[-200:]})"
    return took, state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--recipe", action="append", choices=RECIPES)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "CLOUDTRAIN_HOME": tmp,
               "CLOUDTRAIN_TMUX_SOCKET": f"cloudtrain-bench-{os.getpid()}"}
        for recipe in args.recipe or RECIPES:
            runs = [smoke_run(env, recipe) for _ in range(args.runs)]
            times = [t for t, _ in runs]
            states = sorted({s for _, s in runs})
            verdict = "ok" if max(times) < GOAL_S and states == ["succeeded"] else "MISSED"
            print(f"{recipe} --profile smoke: median {statistics.median(times):.1f} s "
                  f"(max {max(times):.1f}, {args.runs} runs, {', '.join(states)}) "
                  f"goal < {GOAL_S:.0f} s: {verdict}", flush=True)


if __name__ == "__main__":
    main()
