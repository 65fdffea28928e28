"""From `cloudtrain launch` to the job's first line of output, on the local backend.

Goal (issue 2): under 1 s plus Python/torch import time. The ResNet9 recipe prints its
first line before importing torch, so its figure is cloudtrain's overhead plus one Python
start-up. Usage: python benchmarks/launch_first_output.py [--runs R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def first_output(env: dict, args: list[str]) -> float:
    t0 = time.perf_counter()
    job_id = subprocess.run([sys.executable, "-m", "cloudtrain", "launch", "--quiet", *args],
                            env=env, capture_output=True, text=True, check=True,
                            cwd=REPO).stdout.strip()
    log = Path(env["CLOUDTRAIN_HOME"]) / "jobs" / job_id / "output.log"
    while not (log.exists() and b"\n" in log.read_bytes()):
        if time.perf_counter() - t0 > 60:
            raise SystemExit(f"no output from job {job_id} in 60 s")
        time.sleep(0.002)
    took = time.perf_counter() - t0
    subprocess.run([sys.executable, "-m", "cloudtrain", "down", job_id], env=env,
                   capture_output=True, cwd=REPO)
    return took


def python_startup() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    socket = f"cloudtrain-bench-{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "CLOUDTRAIN_HOME": tmp, "CLOUDTRAIN_TMUX_SOCKET": socket}
        cases = {
            "command (python -c print)": ["--", sys.executable, "-c", "print('first')"],
            "resnet9 --profile smoke": ["--recipe", "resnet9", "--profile", "smoke"],
        }
        try:
            for label, launch_args in cases.items():
                times = [first_output(env, launch_args) for _ in range(args.runs)]
                print(f"launch -> first output, {label}: median {statistics.median(times):.3f} s "
                      f"(min {min(times):.3f}, max {max(times):.3f}, {args.runs} runs)")
        finally:
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    startup = statistics.median(python_startup() for _ in range(5))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, torchvision"], check=True)
    print(f"for reference: python start-up {startup:.3f} s; "
          f"python + import torch, torchvision {time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    main()
