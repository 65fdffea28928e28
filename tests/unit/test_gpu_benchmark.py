"""Issue 17: benchmarks/gpu.py's code path runs without a GPU (the smoke profiles on the
CPU), and its table parses; the startup row it reads is the recipe's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_benchmark_runs_on_the_cpu_and_its_table_parses():
    """issue 17: one row per recipe with the recipe's own train time, the first step's wall
    time, steps/s and the process's wall time; no GPU here, so no memory or compile."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--recipe",
                           "airbench94", "--runs", "2", "--cpu"],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    header = [c.strip() for c in lines[0].split("  ") if c.strip()]
    assert header == ["RECIPE", "DEVICE", "TRAIN S", "FIRST STEP S", "STEPS/S", "PEAK MEM MB",
                      "COMPILE S", "WALL S"]
    cells = lines[1].split()
    assert cells[:2] == ["airbench94", "cpu"] and len(lines) == 2
    train, first, steps, mem, compile_, wall = cells[2:]
    for text in (train, first, steps, wall):  # mean±sd of 2 runs
        mean, sd = (float(x) for x in text.split("±"))
        assert mean > 0 and sd >= 0
    assert float(first.split("±")[0]) < float(wall.split("±")[0])
    assert mem == "-" and compile_ == "-"


def test_airbench_writes_its_startup_breakdown(tmp_path):
    """issue 17: the job's startup (import, data, warm-up, first step) as a metrics row, the
    data cached ready to load on first use and read from it the next time."""
    sys.path.insert(0, str(REPO))
    from cloudtrain import recipes

    rec = recipes.load("airbench94")
    argv = [sys.executable, str(rec.path / rec.entry), *rec.script_args(rec.resolve("smoke"))]
    data = tmp_path / "data"
    rows = []
    for i in range(2):
        job = tmp_path / f"job{i}"
        job.mkdir()
        env = {"CLOUDTRAIN_JOB_DIR": str(job), "CLOUDTRAIN_DATA_DIR": str(data),
               "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "startup: import" in proc.stdout
        events = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
        rows.append([e for e in events if e.get("event") == "startup"][0])
    for row in rows:
        assert row["device"] == "cpu" and set(row) >= {"import", "data", "to_first_step"}
        assert 0 <= row["data"] < row["to_first_step"] and row["import"] > 0
    assert list(data.rglob("*.ready.npz")), "the data was not cached ready to load"
