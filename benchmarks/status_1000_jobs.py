"""CPU time of the whole `cloudtrain status` process with 1,000 jobs in the store.

Goal (issue 26): `status` costs at most 0.15 s of CPU (user + sys of the process, from
resource.getrusage(RUSAGE_CHILDREN)), so that a loaded machine does not make it slow; the
floor is `python -c 'import cloudtrain.cli'`. Each figure is the median of --runs runs (after
one that warms the page cache), the checkouts given with --tree taking turns so that the load
of the machine falls on each alike.

Usage:
    python benchmarks/status_1000_jobs.py [--jobs N] [--runs R] [--tree DIR ...]

Measured on 2 cores while the whole test suite ran beside it, both trees in the same run
(`git archive ed37304 | tar -x -C /tmp/before`, main before issue 26's restructuring):
    python benchmarks/status_1000_jobs.py --tree /tmp/before --tree .
                        before (ed37304)      after (issue 26: lifecycle/, cli/, splits)
    status              0.084 s               0.080 s
    status -a           0.141 s               0.140 s
    floor               0.075 s               0.072 s
Nearly all of `status` is the floor: Python, click, the views, state and config. The status
path imports one host-side module, host/job_status.py (stdlib, with host/safefile.py), for
as_time and fmt_duration: the agent formats the same values on the instance, where nothing
outside cloudtrain/host/ exists, so their one definition lives there.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cloudtrain.state import Store  # noqa: E402

COMMANDS = {
    "status": ["-m", "cloudtrain", "status"],
    "status -a": ["-m", "cloudtrain", "status", "-a"],
    "floor (import cloudtrain.cli)": ["-c", "import cloudtrain.cli"],
}


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


def cpu_of(argv: list[str], cwd: Path, env: dict) -> float:
    """User + system CPU seconds of one child process (and anything it started)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", action="append", type=Path, default=None,
                    help="a checkout whose cloudtrain to measure (repeatable; default: this one)")
    args = ap.parse_args()
    trees = [t.resolve() for t in args.tree or [ROOT]]
    with tempfile.TemporaryDirectory() as tmp:
        # the warm-up run writes each tree's bytecode, as an installed package has it
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHONDONTWRITEBYTECODE")}
        env["NO_COLOR"] = "1"
        # A store of its own for each tree, filled alike: a newer tree's schema is refused
        # by an older tree.
        homes = {tree: Path(tmp) / str(i) for i, tree in enumerate(trees)}
        for tree, home in homes.items():  # by the tree's own code, at its own schema
            subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "sys.path.insert(0, 'benchmarks'); from status_1000_jobs import fill; "
                            f"fill(Path({str(home)!r}), {int(args.jobs)})"],
                           cwd=tree, env=env, check=True)
        cpu: dict[tuple[Path, str], list[float]] = {}
        for run in range(args.runs + 1):
            for tree in trees:
                for what, argv in COMMANDS.items():
                    took = cpu_of([sys.executable, *argv], tree,
                                  {**env, "CLOUDTRAIN_HOME": str(homes[tree])})
                    if run:  # the first run warms the page cache
                        cpu.setdefault((tree, what), []).append(took)
        print(f"{args.jobs} jobs, CPU seconds (user+sys) of the whole process, median of "
              f"{args.runs} (min-max):")
        for tree in trees:
            print(f"  {tree}")
            for what in COMMANDS:
                t = cpu[tree, what]
                print(f"    {what:32} {statistics.median(t):.3f} s ({min(t):.3f}-{max(t):.3f})")
        print("goal: status <= 0.15 s")


if __name__ == "__main__":
    main()
