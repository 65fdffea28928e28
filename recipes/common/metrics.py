"""The metrics log a recipe writes: one JSON object per line in <job dir>/metrics.jsonl.

Stdlib only, so the orchestrator can import it too. Each row gets `time` (unix seconds);
every line is flushed as soon as it is written, so a reader tailing the file over SSH sees
complete rows only (a reader should still skip a partial last line: see `read_metrics`).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

JOB_DIR_ENV = "CLOUDTRAIN_JOB_DIR"
DEFAULT_JOB_DIR = "./cloudtrain-run"
METRICS_FILE = "metrics.jsonl"


def job_dir(override: str | os.PathLike | None = None) -> Path:
    """Where a job's outputs go: the flag, else $CLOUDTRAIN_JOB_DIR, else ./cloudtrain-run."""
    return Path(override or os.environ.get(JOB_DIR_ENV) or DEFAULT_JOB_DIR)


def _plain(value):
    # numpy and torch scalars (and 0-d arrays) carry .item(); anything else is a bug upstream.
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class MetricsWriter:
    """Append rows to a metrics.jsonl file. Use as a context manager or call close()."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, **fields) -> dict:
        row = {"time": round(time.time(), 3), **fields}
        self._file.write(json.dumps(row, default=_plain) + "\n")
        self._file.flush()
        return row

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All complete rows of a metrics.jsonl; a partial last line (writer mid-write) is skipped."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            if line.strip():
                rows.append(json.loads(line))
    return rows
