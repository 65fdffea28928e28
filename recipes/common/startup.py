"""What a job pays for before its first training step (issue 17), as one metrics row.

A recipe marks its phases as they end (`import`, `data`, `warm_up` or `compile`) and writes
the row just before its first step:

    {"event": "startup", "import": 2.1, "data": 0.4, "warm_up": 1.3, "to_first_step": 3.9,
     "device": "cuda", "peak_mem_mb": 812.0,
     "threads": 1, "threads_from": "cores", "cores": 12, "procs": 8, "loader_workers": 11}

Seconds count from the moment the agent started the job ($CLOUDTRAIN_STARTED_AT, set by
cloudtrain's agent), or from the script's first line when run by hand, so `import` includes
the interpreter's start. `cloudtrain status JOB` shows the row (render.startup_text).

It also pins torch's intra-op threads (issue 28: the imagenet smoke took 6 min 38 s on a
busy 2-core machine with torch's default threads, 40.7 s with one): each process takes its
share of the host's cores less its loader workers (pin_threads), unless the job's own
OMP_NUM_THREADS says otherwise, and the row says which and why.
"""
from __future__ import annotations

import os
import time

PHASES = ("import", "data", "warm_up", "compile")


def job_started_at(t_start: float, env=os.environ) -> float:
    """When the agent started the job, if it says so and that is not later than the script's
    own start; else the script's start."""
    try:
        started = float(env.get("CLOUDTRAIN_STARTED_AT") or t_start)
    except ValueError:
        return t_start
    return min(started, t_start) if started == started else t_start  # NaN: the script's


def usable_cores() -> int:
    """This process's usable cores: its CPU affinity where the system has one."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _positive_int(text) -> int | None:
    try:
        n = int(str(text).strip())
    except ValueError:
        return None
    return n if n >= 1 else None


def thread_choice(loader_workers: int = 0, env=os.environ) -> dict:
    """torch's intra-op threads for this process, and why: the job's own OMP_NUM_THREADS
    (a job file's envs, or the shell that started it) where it set one, else this host's
    cores (cloudtrain's count in CLOUDTRAIN_CORES, run.sh's threads line, or this process's
    affinity) shared by the host's training processes (LOCAL_WORLD_SIZE, torchrun's), less
    this process's loader workers, at least 1: a worker decodes on a core of its own, and
    OpenMP threads that wait for a descheduled sibling spin (a step 10 to 30 times slower on
    a shared 2-core machine, tests/conftest.py one_torch_thread)."""
    own = _positive_int(env.get("OMP_NUM_THREADS", ""))
    if own is not None and not env.get("CLOUDTRAIN_CORES"):
        return {"threads": own, "threads_from": "job"}
    cores = _positive_int(env.get("CLOUDTRAIN_CORES", "")) or usable_cores()
    procs = _positive_int(env.get("LOCAL_WORLD_SIZE", "")) or 1
    workers = max(0, int(loader_workers))
    return {"threads": max(1, cores // procs - workers), "threads_from": "cores",
            "cores": cores, "procs": procs, "loader_workers": workers}


def pin_threads(loader_workers: int = 0, env=os.environ) -> dict:
    """Set torch's intra-op threads as thread_choice says; returns the choice."""
    import torch

    choice = thread_choice(loader_workers, env)
    torch.set_num_threads(choice["threads"])
    return choice


class Startup:
    """Phase marks from the job's start to its first step, and torch's threads pinned."""

    def __init__(self, t_start: float, env=os.environ, loader_workers: int = 0):
        self.started = job_started_at(t_start, env)
        self.phases: dict[str, float] = {}
        self._last = self.started
        self._env = env
        self.threads = pin_threads(loader_workers, env)

    def pin_threads(self, loader_workers: int) -> None:
        """Again, once the recipe knows its loader workers per process."""
        self.threads = pin_threads(loader_workers, self._env)

    def mark(self, phase: str, at: float | None = None) -> None:
        """`phase` ended now (or at `at`): its seconds are those since the previous mark. A
        phase marked twice adds up (e.g. data read, then data uploaded)."""
        if phase not in PHASES:
            raise ValueError(f"unknown startup phase {phase!r}")
        now = time.time() if at is None else at
        self.phases[phase] = round(self.phases.get(phase, 0.0) + max(0.0, now - self._last), 3)
        self._last = now

    def row(self, device) -> dict:
        """The {"event": "startup"} metrics row, with to_first_step up to now."""
        row = {"event": "startup", **self.phases,
               "to_first_step": round(time.time() - self.started, 3), "device": device.type,
               **self.threads}
        if device.type == "cuda":
            import torch
            row["peak_mem_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        return row


def describe(row: dict) -> str:
    """One line for the job's log."""
    parts = [f"{k.replace('_', '-')} {row[k]:.2f} s" for k in PHASES if k in row]
    return (f"startup: {', '.join(parts)}; first step {row['to_first_step']:.2f} s after start"
            f"; {threads_text(row)}")


def threads_text(row: dict) -> str:
    """The row's thread choice in words."""
    if row.get("threads_from") == "job":
        return f"torch threads {row['threads']} (the job's OMP_NUM_THREADS)"
    less = row.get("loader_workers") or 0
    return (f"torch threads {row['threads']} ({row['cores']} cores / {row['procs']} "
            f"processes" + (f", less {less} loader workers" if less else "") + ")")
