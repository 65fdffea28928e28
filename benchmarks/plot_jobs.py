"""Wall time of plotting training curves (issue 16): 3 jobs x 100 epochs of metrics.jsonl.

Prints the median over --runs of:
  - the whole process: `python -c` importing cloudtrain.curves, reading the jobs' metrics.jsonl
    from $CLOUDTRAIN_HOME/jobs/<id>/ and writing the plot (matplotlib's import included),
    what `cloudtrain plot` costs apart from click and the job store;
  - the same process without the plot (`import cloudtrain.curves` and reading): the floor;
  - in this process, matplotlib already imported: plots.plot alone, and curves.table.

Usage: python benchmarks/plot_jobs.py [--jobs 3] [--epochs 100] [--runs 5] [--format png]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cloudtrain import curves, plots  # noqa: E402


def fill(home: Path, jobs: int, epochs: int) -> list[str]:
    """`jobs` job directories, each with a resnet9-shaped metrics.jsonl of `epochs` rows and a
    target_reached event."""
    ids = []
    t0 = 1_795_600_000.0
    for j in range(jobs):
        job_id = f"{0xbe0000 + j:08x}"
        rows, seconds = [], 0.9 + 0.3 * j
        for e in range(1, epochs + 1):
            acc = 0.5 + (0.45 - 0.01 * j) * (1 - math.exp(-e / (epochs / (4 + j))))
            rows.append({"time": round(t0 + e * seconds, 3), "run": 0, "epoch": e,
                         "epochs": epochs, "step": 97 * e, "lr": 0.4 * (1 - e / epochs),
                         "train_loss": 2.0 * math.exp(-e / 20) + 0.05, "train_acc": acc + 0.01,
                         "test_acc": acc, "test_loss": 1.8 * math.exp(-e / 25) + 0.1,
                         "train_time": round(0.8 * e, 4), "wall_time": round(3 + seconds * e, 4)})
        rows.insert(epochs // 2, {"time": t0, "event": "target_reached", "run": 0,
                                  "epoch": epochs // 2, "test_acc": 0.94})
        d = home / "jobs" / job_id
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        ids.append(job_id)
    return ids


def timed(cmd: list[str], env: dict, runs: int) -> list[float]:
    times = []
    for _ in range(runs + 1):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return times[1:]  # the first run warms the page cache (and matplotlib's font cache)


def figure(name: str, times: list[float]) -> str:
    return (f"{name}: median {statistics.median(times):.3f} s, min {min(times):.3f} s, "
            f"max {max(times):.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--format", choices=sorted(f.lstrip(".") for f in plots.FORMATS),
                    default="png")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        ids = fill(home, args.jobs, args.epochs)
        out = Path(tmp) / f"curves.{args.format}"
        env = {**os.environ, "CLOUDTRAIN_HOME": str(home), "PYTHONPATH": str(REPO)}
        read = f"jobs = [curves.read_job(i) for i in {ids!r}]"
        whole = timed([sys.executable, "-c", f"from cloudtrain import curves, plots; {read}; "
                       f"plots.plot(jobs, {str(out)!r}, target=0.94)"], env, args.runs)
        floor = timed([sys.executable, "-c", f"from cloudtrain import curves; {read}"], env,
                      args.runs)
        size = out.stat().st_size

        os.environ["CLOUDTRAIN_HOME"] = str(home)
        jobs = [curves.read_job(i) for i in ids]
        plots.plot(jobs, out, target=0.94)  # imports matplotlib
        in_plot, in_table = [], []
        for _ in range(args.runs):
            t = time.perf_counter()
            plots.plot(jobs, out, target=0.94)
            in_plot.append(time.perf_counter() - t)
            t = time.perf_counter()
            curves.table(jobs, width=120)
            in_table.append(time.perf_counter() - t)

    print(f"plot, {args.jobs} jobs x {args.epochs} epochs to .{args.format} ({size:,} bytes), "
          f"{args.runs} runs, python {sys.version.split()[0]}")
    print("  " + figure("whole process (import, read, plot)", whole))
    print("  " + figure("process without the plot (import curves, read)", floor))
    print("  " + figure("plots.plot in process (matplotlib imported)", in_plot))
    print("  " + figure("curves.table in process", in_table))


if __name__ == "__main__":
    main()
