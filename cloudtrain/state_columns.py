"""The state database's column values, read defensively and written in a form SQLite stores.

Imports only the standard library; state.Store reads every row through `read_row` and binds
every value it writes through `bindable`.
"""

from __future__ import annotations

import json
import math
import sqlite3

# The database is a file the user (or a crash, or another tool) can change under us. A value
# of the wrong type in one row must not break `status` for every job: every row passes through
# `read_row`, which turns what cannot be right into NULL (a JSON column that is not a JSON object,
# text in a REAL column), so each reader sees either a sound value or None.

JSON_COLUMNS = frozenset({"spec", "host", "metrics", "cost_detail", "details", "checkpoint"})
REAL_COLUMNS = frozenset({"created_at", "started_at", "ended_at", "cost", "lease_until", "at",
                          "launched_at", "terminated_at", "price_per_hour", "running_at"})
MONEY_COLUMNS = frozenset({"cost", "price_per_hour"})
LATEST_TIME = 253402300799.0  # 9999-12-31: later, time.localtime() fails
INTEGER_COLUMNS = frozenset({"exit_code", "cost_settled", "n", "resumed_step", "resumed_seq",
                             "last_step"})
TEXT_COLUMNS = frozenset({"id", "job_id", "name", "kind", "recipe", "command", "backend",
                          "state", "reason", "jobdir", "launcher", "phase", "detail", "provider",
                          "region", "zone", "instance_type", "market", "instance_id",
                          "outcome", "end_reason"})
# Metrics the status table shows as numbers: a cached value that is not one is dropped.
NUMERIC_METRICS = frozenset({"epoch", "epochs", "step", "train_loss", "loss", "test_acc",
                             "accuracy", "time"})


def json_column(text) -> dict | None:
    """A JSON column's value: the object it holds, or None (empty, not JSON, not an object)."""
    if not isinstance(text, (str, bytes)) or not text:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _clean(name: str, value):
    if value is None:
        return None
    if name in JSON_COLUMNS:
        obj = json_column(value)
        if obj is None:
            return None
        if name == "details":
            fixed = _details(obj)
            return value if fixed == obj else json.dumps(fixed)
        return value
    if name in REAL_COLUMNS:  # times (epoch seconds) and dollars: never negative
        ok = isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 and \
            (name in MONEY_COLUMNS or value <= LATEST_TIME)
        return float(value) if ok else None
    if name in INTEGER_COLUMNS:
        return value if isinstance(value, int) else (0 if name == "cost_settled" else None)
    if name in TEXT_COLUMNS and not isinstance(value, str):
        value = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    if name == "jobdir" and not value.startswith(("/", "~")):
        return None  # a relative job directory would resolve against wherever `status` runs
    return value


def read_row(cursor: sqlite3.Cursor, values: tuple) -> sqlite3.Row:
    names = [d[0] for d in cursor.description]
    return sqlite3.Row(cursor, tuple(_clean(n, v) for n, v in zip(names, values)))


def cached_metrics(row: dict) -> dict:
    """A cached metrics row as status can show it: numbers stay numbers (finite), other values
    are kept only where they are not expected to be numbers."""
    out = {}
    for key, value in row.items():
        if isinstance(value, float) and not math.isfinite(value):
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number or (key not in NUMERIC_METRICS and isinstance(value, (str, bool))):
            out[key] = value
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) and value >= 0


def _details(details: dict) -> dict:
    """An instance's details as the bill reads them: the volume's size and price are numbers,
    the spot price history a list of [time, price] pairs (anything else is left out)."""
    out = {k: v for k, v in details.items()
           if k not in ("disk_gb", "gp3_per_gb_month") or _number(v)}
    if "spot_history" in details:
        history = details["spot_history"]
        out["spot_history"] = [p for p in history if isinstance(p, list) and len(p) == 2
                               and all(_number(x) for x in p)] \
            if isinstance(history, list) else []
    return out


def bindable(value):
    """A value SQLite can store: dicts and lists as JSON, ints beyond 64 bits as floats, and
    anything else as its text."""
    if value is None or isinstance(value, (str, bytes, float, bool)):
        return value
    if isinstance(value, int):
        return value if -(1 << 63) <= value < (1 << 63) else float(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    if hasattr(value, "to_dict"):  # a record (job_spec.JobSpec)
        return json.dumps(value.to_dict(), default=str)
    return str(value)
