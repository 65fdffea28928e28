"""Issue 17: benchmarks/gpu.py's code path runs without a GPU (the smoke profiles on the
CPU), and its table parses; the startup row it reads is the recipe's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow(seconds=30)
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


@pytest.mark.slow(seconds=25)
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


def _gpu_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_benchmark", REPO / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compile_figures_read_cold_then_cached_and_paste_into_recipe_yaml(tmp_path):
    """issue 17: with --runs N the compile column says the first run's compile (a cold
    inductor cache) and the later runs' mean (warm); --yaml writes entries that the recipe
    loader accepts and `recipes NAME` shows as what compile costs."""
    gpu = _gpu_module()
    assert gpu.compile_cell([40.0, 3.0, 5.0]) == "40.00/4.00"
    assert gpu.compile_cell([None, None]) == "-" and gpu.compile_cell([7.0]) == "7.00"
    runs = [{"train": 1.70, "compile": 61.5}, {"train": 1.72, "compile": 4.1}]
    text = gpu.yaml_entries([("airbench94 compile=step", {"compile": True,
                                                          "compile_scope": "step"}, runs)],
                            "NVIDIA H100 80GB HBM3", "torch 2.14.1 + CUDA 13.0")
    assert text.splitlines()[0] == "# airbench94"
    body = "\n".join(text.splitlines()[1:])
    recipe_dir = tmp_path / "recipes" / "airbench94"
    recipe_dir.mkdir(parents=True)
    src = (REPO / "recipes" / "airbench94" / "recipe.yaml").read_text()
    assert "\nmeasured:\n" in src
    (recipe_dir / "recipe.yaml").write_text(src.replace("\nmeasured:\n",
                                                        "\nmeasured:\n" + body + "\n"))
    (recipe_dir / "train.py").write_text("")
    sys.path.insert(0, str(REPO))
    from cloudtrain import catalog_views, recipes

    rec = recipes.parse_recipe(recipe_dir / "recipe.yaml")
    (cost,) = [c for c in rec.compile_costs() if c.get("gpu")]  # beside the CPU's figure
    assert cost["compile_seconds"] == 61.5 and cost["compile_cached_seconds"] == 4.1
    assert cost["gpu"] == "H100"  # the catalog's name, which estimate matches on
    assert cost["seconds"] == 1.71 and cost["when"] == {"compile": True,
                                                        "compile_scope": "step"}
    shown = catalog_views.recipe_detail(rec)
    assert ("H100 [compile=true compile_scope=step]: 61.5 s the first time, "
            "4.1 s from the data dir's cache") in shown
    assert "not measured yet" not in shown


def test_recipes_says_when_compile_was_not_measured_on_a_gpu():
    """issue 17: `recipes airbench94` says what compile=true costs, or that nobody measured
    it on a GPU yet and the command that does."""
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "recipes", "resnet9"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "compile=true costs, before the first step" in out
    assert "on a GPU: not measured yet; `python benchmarks/gpu.py --compile --runs 2`" in out


def test_device_names_become_the_catalogs_gpu_names():
    """issue 17: a pasted entry names the GPU as the catalog does, or estimate never uses it."""
    gpu = _gpu_module()
    for device, name in (("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"),
                         ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA A100-SXM4-40GB",
                                                                   "A100"),
                         ("Tesla V100-SXM2-16GB", "V100"), ("Tesla V100-SXM2-32GB",
                                                            "V100-32GB"),
                         ("Tesla T4", "T4"), ("NVIDIA A10G", "A10G"), ("NVIDIA L4", "L4"),
                         ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 4090",
                                                   "NVIDIA GeForce RTX 4090")):
        assert gpu.catalog_gpu(device) == name, device


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every process below `root`."""
    from cloudtrain.host.job_processes import descendants

    found = {}
    for pid in descendants(root):
        try:
            found[pid] = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(
                "utf-8", "replace").replace("\0", " ")
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.slow(seconds=40)
def test_U37_sigterm_to_the_benchmark_stops_its_recipe_and_the_recipes_loader_workers():
    """U37: `timeout` (SIGTERM to the benchmark alone here) left the recipe and its loader
    worker running, the recipe waiting on the worker for ever. The benchmark forwards the
    signal to the recipe's process group and waits for it, workers included."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--recipe",
                             "imagenet", "--cpu"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            now = _descendants(proc.pid)
            seen.update(now)
            if len([c for c in now.values() if "train.py" in c]) >= 2:  # the recipe + a worker
                break
            time.sleep(0.2)
        assert len([c for c in seen.values() if "train.py" in c]) >= 2, (seen, proc.poll())
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        for pid in seen:  # whatever the benchmark left: not for the next test
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err)
    assert "stopped by SIGTERM" in err and "Traceback" not in err, err
    assert [pid for pid in seen if _alive(pid)] == []


@pytest.mark.slow(seconds=40)
def test_U37_a_recipe_whose_output_pipe_is_gone_ends_with_its_workers(tmp_path):
    """U37, as `timeout` around the old benchmark did it: the reader of a recipe's output is
    gone and SIGTERM reaches the recipe's whole group. The recipe stops at a step boundary,
    its print fails, and it ends, its loader worker too: the worker ignores SIGTERM (so that
    a stop reaches the training loop), and multiprocessing's exit sent it just that, then
    waited on it for ever."""
    import signal
    import time

    sys.path.insert(0, str(REPO))
    from cloudtrain import recipes

    rec = recipes.load("imagenet")
    argv = [sys.executable, str(rec.path / rec.entry), *rec.script_args(rec.resolve("smoke"))]
    (tmp_path / "job").mkdir()
    env = {**os.environ, "CLOUDTRAIN_JOB_DIR": str(tmp_path / "job"),
           "CLOUDTRAIN_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path / "job", stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    seen: dict[int, str] = {}
    metrics = tmp_path / "job" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 240  # training (the startup row is written just before
        while time.monotonic() < deadline and proc.poll() is None:  # step one), a worker up
            seen.update(_descendants(proc.pid))
            if seen and metrics.exists() and '"startup"' in metrics.read_text():
                break
            time.sleep(0.2)
        assert seen and proc.poll() is None, "no loader worker started"
        proc.stdout.close()  # the reader is gone
        os.killpg(proc.pid, signal.SIGTERM)  # and the stop reaches the group
        proc.wait(timeout=120)
        deadline = time.monotonic() + 30  # the worker notices its parent is gone
        while time.monotonic() < deadline and any(_alive(pid) for pid in seen):
            time.sleep(0.2)
    finally:
        proc.kill()
        for pid in seen:
            if _alive(pid):
                os.kill(pid, 9)
    assert proc.returncode != 0 and [pid for pid in seen if _alive(pid)] == []
