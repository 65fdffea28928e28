"""Every bundled recipe on the GPU this machine has (issue 17), timed by its own timer.

On CUDA each CIFAR recipe runs full size on synthetic data made by the project's generator
(50,000 train / 10,000 test images), as issue 17's figures were taken; ImageNet runs its
`tiny` variant on generated JPEGs (the real set is 150 GB). Without a GPU the same code
runs each recipe's smoke profile on the CPU, so the script and its table are tested here.

For each recipe it prints one row: the recipe's own train time (the last metrics row's
`train_time`), the wall time from the start to the first training step (the recipe's
{"event": "startup"} row, where it writes one), steps per second, the peak GPU memory, the
compile time and the process's wall time; with --runs N, the mean and standard deviation
of N processes (the first also warms the data cache, which the others reuse: the steady
state of a kept instance). With --compile it adds each recipe that has a `compile`
argument with compile=true, and airbench94 once per compile_scope (model, step, eval, all:
which part gains most); their COMPILE S is "first run / the others' mean", the cold
inductor cache against the warm one. --yaml prints the figures as recipe.yaml `measured:`
entries.

Each recipe runs in a process group of its own, its output in files of its job directory.
Stopped by SIGTERM or SIGINT (`timeout`, Ctrl-C), the benchmark forwards the signal to that
group (the recipe checkpoints at a step boundary and ends; its loader workers with it), waits
for all of it (SIGKILL after GRACE_S) and exits 128 + the signal.

Usage: python benchmarks/gpu.py [--recipe NAME ...] [--runs N] [--compile] [--cpu] [--yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cloudtrain import catalog, recipes  # noqa: E402
from cloudtrain.host.job_processes import group_alive  # noqa: E402

COLUMNS = ("RECIPE", "DEVICE", "TRAIN S", "FIRST STEP S", "STEPS/S", "PEAK MEM MB",
           "COMPILE S", "WALL S")
FULL = {"data": "synthetic", "synthetic_train": "50000", "synthetic_test": "10000"}
GRACE_S = 120.0  # after a forwarded SIGTERM: the recipe's step boundary, its checkpoint
RUNNING: set = set()  # the recipe processes now running (one at a time)


class Stopped(Exception):
    """The benchmark was sent SIGTERM or SIGINT."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, frame) -> None:
    """Forward the signal to each running recipe's process group, then unwind to main."""
    for proc in list(RUNNING):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass
    raise Stopped(signum)


def wait_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """Wait for the recipe and everything in its process group (its loader workers); SIGKILL
    what is left after `grace_s`."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (proc.poll() is None or group_alive(proc.pid)):
        time.sleep(0.1)
    if proc.poll() is None or group_alive(proc.pid):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def command(name: str, cuda: bool, compile_: bool, scope: str | None = None
            ) -> tuple[str, list[str], dict]:
    """(label, argv, the settings that differ from the defaults) of one recipe's run: full
    size on CUDA, its smoke profile on the CPU."""
    rec = recipes.load(name)
    if cuda:
        sets = [f"{k}={v}" for k, v in FULL.items() if k in rec.arguments]
        if name == "imagenet":
            sets = ["variant=tiny", "data=synthetic"]
        profile = None
    else:
        sets, profile = [], "smoke" if "smoke" in rec.profiles else None
    if compile_:
        sets.append("compile=true")
    if scope:
        sets.append(f"compile_scope={scope}")
    if "device" in rec.arguments:
        sets.append("device=" + ("cuda" if cuda else "cpu"))
    args = rec.resolve(profile, tuple(sets))
    label = name + (f" compile={scope or 'true'}" if compile_ else "")
    when = ({"compile": True, **({"compile_scope": scope} if scope else {})} if compile_
            else {"compile": False} if "compile" in rec.arguments else {})
    return label, [sys.executable, str(rec.path / rec.entry), *rec.script_args(args)], when


def run_once(argv: list[str], job: Path, data: Path) -> dict:
    """One process; its figures from its metrics.jsonl."""
    job.mkdir(parents=True)
    env = {**os.environ, "CLOUDTRAIN_JOB_DIR": str(job), "CLOUDTRAIN_DATA_DIR": str(data),
           "PYTHONUNBUFFERED": "1", "CLOUDTRAIN_STARTED_AT": f"{time.time():.6f}"}
    t0 = time.perf_counter()
    # Output to files, not pipes: a benchmark killed outright leaves no recipe writing into a
    # pipe nobody reads. Its own process group: a signal forwarded reaches its workers too.
    with open(job / "stdout.txt", "wb") as out, open(job / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(argv, env=env, cwd=job, stdout=out, stderr=err,
                                start_new_session=True)
        RUNNING.add(proc)
        try:
            proc.wait()
        except Stopped:
            wait_group(proc)
            raise
        finally:
            RUNNING.discard(proc)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        text = ((job / "stderr.txt").read_text(errors="replace")
                or (job / "stdout.txt").read_text(errors="replace"))
        tail = text.strip().splitlines()[-3:]
        raise SystemExit(f"{Path(argv[1]).parent.name}: exit {proc.returncode}: "
                         + " | ".join(tail))
    rows, startup = [], {}
    for line in (job / "metrics.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("event") == "startup":
            startup = row
        elif "event" not in row:
            rows.append(row)
    last = next((r for r in reversed(rows) if isinstance(r.get("train_time"), (int, float))),
                rows[-1] if rows else {})
    train = last.get("train_time")
    step = last.get("step")
    return {"device": startup.get("device", "cuda" if "cuda" in " ".join(argv) else "cpu"),
            "train": train, "first": startup.get("to_first_step"),
            "steps_s": step / train if isinstance(step, (int, float)) and train else None,
            "mem": startup.get("peak_mem_mb"), "compile": startup.get("compile"),
            "wall": wall}


def cell(values: list) -> str:
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f}±{statistics.stdev(values):.2f}"


def compile_cell(values: list) -> str:
    """The first run's compile (a cold cache) / the later runs' mean (the cache warm)."""
    values = [v for v in values if isinstance(v, (int, float))]
    if len(values) < 2:
        return cell(values)
    return f"{values[0]:.2f}/{statistics.mean(values[1:]):.2f}"


def catalog_gpu(device_name: str) -> str:
    """torch's device name as the catalog spells the GPU, the name `estimate` matches a
    measured entry on: 'NVIDIA H100 80GB HBM3' -> H100, 'NVIDIA A100-SXM4-80GB' ->
    A100-80GB, 'Tesla V100-SXM2-16GB' -> V100, 'NVIDIA L40S' -> L40S (not L4); the device
    name itself when no catalog GPU fits."""
    upper = device_name.upper()
    for name in sorted(catalog.gpu_names(), key=len, reverse=True):
        model, _, memory = name.partition("-")
        if re.search(rf"(?<![A-Z0-9]){re.escape(model)}(?![A-Z0-9])", upper) and \
                (not memory or memory in upper):
            return name
    return device_name


def yaml_entries(results: list[tuple[str, dict, list[dict]]], gpu: str,
                 torch_version: str) -> str:
    """recipe.yaml `measured:` entries for the figures just taken (to paste, per recipe)."""
    out = []
    for label, when, got in results:
        name = label.split()[0]
        train = [g["train"] for g in got if isinstance(g["train"], (int, float))]
        compiles = [g["compile"] for g in got if isinstance(g["compile"], (int, float))]
        lines = [f"# {name}", (f"  - gpu: {catalog_gpu(gpu)}\n    hardware: \"{gpu}\""
                               if gpu else "  - hardware: CPU"), "    gpus: 1"]
        if gpu and train:
            lines.append(f"    seconds: {statistics.mean(train):.2f}")
        if when:
            lines.append("    when: {" + ", ".join(f"{k}: {str(v).lower()}"
                                              for k, v in when.items()) + "}")
        if compiles:
            lines.append(f"    compile_seconds: {compiles[0]:.1f}")
            if len(compiles) > 1:
                lines.append(f"    compile_cached_seconds: {statistics.mean(compiles[1:]):.1f}")
        lines += [f'    torch: "{torch_version}"', f'    date: "{time.strftime("%Y-%m")}"',
                  f'    source: "benchmarks/gpu.py, {len(got)} run(s)"']
        out.append("\n".join(lines))
    return "\n".join(out)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [list(COLUMNS), *rows]) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [list(COLUMNS), *rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", action="append", choices=recipes.names())
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--compile", action="store_true",
                    help="also compile=true where a recipe has it; airbench94 by scope")
    ap.add_argument("--cpu", action="store_true", help="the CPU path even with a GPU")
    ap.add_argument("--yaml", action="store_true", help="also print recipe.yaml entries")
    args = ap.parse_args()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)
    try:
        run(args)
    except Stopped as stop:
        print(f"# stopped by {signal.Signals(stop.signum).name}: the recipe was stopped and "
              "waited for", file=sys.stderr, flush=True)
        sys.exit(128 + stop.signum)


def run(args) -> None:
    cuda = cuda_available() and not args.cpu
    names = args.recipe or recipes.names()
    plan = [command(n, cuda, False) for n in names]
    if args.compile:
        for n in names:
            if "compile" not in recipes.load(n).arguments:
                continue
            scopes = ("model", "step", "eval", "all") if n == "airbench94" else (None,)
            plan += [command(n, cuda, True, scope) for scope in scopes]
    print(f"# {'CUDA, full size' if cuda else 'CPU, smoke profiles'}; {args.runs} run(s) each",
          flush=True)
    out, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, argv, when) in enumerate(plan):
            data = Path(tmp) / f"data-{i}"  # its own: the first run meets a cold cache
            got = [run_once(argv, Path(tmp) / f"job-{i}-{r}", data) for r in range(args.runs)]
            results.append((label, when, got))
            out.append([label, got[0]["device"], *(cell([g[k] for g in got]) for k in
                        ("train", "first", "steps_s", "mem")),
                        compile_cell([g["compile"] for g in got]),
                        cell([g["wall"] for g in got])])
    print(table(out))
    if args.yaml:
        import torch

        gpu = torch.cuda.get_device_name(0) if cuda else ""
        print(yaml_entries(results, gpu, f"torch {torch.__version__}"
                           + (f" + CUDA {torch.version.cuda}" if cuda else "")))


if __name__ == "__main__":
    main()
