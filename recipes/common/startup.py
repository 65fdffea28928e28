"""What a job pays for before its first training step (issue 17), as one metrics row.

A recipe marks its phases as they end (`import`, `data`, `warm_up` or `compile`) and writes
the row just before its first step:

    {"event": "startup", "import": 2.1, "data": 0.4, "warm_up": 1.3, "to_first_step": 3.9,
     "device": "cuda", "peak_mem_mb": 812.0}

Seconds count from the moment the agent started the job ($CLOUDTRAIN_STARTED_AT, set by
cloudtrain's agent), or from the script's first line when run by hand, so `import` includes
the interpreter's start. `cloudtrain status JOB` shows the row (render.startup_text).
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


class Startup:
    """Phase marks from the job's start to its first step."""

    def __init__(self, t_start: float, env=os.environ):
        self.started = job_started_at(t_start, env)
        self.phases: dict[str, float] = {}
        self._last = self.started

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
               "to_first_step": round(time.time() - self.started, 3), "device": device.type}
        if device.type == "cuda":
            import torch
            row["peak_mem_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        return row


def describe(row: dict) -> str:
    """One line for the job's log."""
    parts = [f"{k.replace('_', '-')} {row[k]:.2f} s" for k in PHASES if k in row]
    return f"startup: {', '.join(parts)}; first step {row['to_first_step']:.2f} s after start"
