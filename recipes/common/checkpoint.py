"""Checkpoints that survive being killed mid-write, and the RNG states that go in them.

`save_atomic` writes to a temporary file in the same folder, fsyncs it and renames it over the
target with os.replace, which is atomic on POSIX: a reader (or a resumed run) sees either the
old checkpoint or the new one, never half of one, even if SIGKILL lands mid-save.

A checkpoint dict with "step" and/or "epoch" also gets `checkpoint-info.json` beside it
({"step", "epoch", "file"}, written the same way, after the checkpoint): the agent's
checkpoint stream (cloudtrain/host/checkpoint_stream.py) reads where a streamed checkpoint is from
there without unpickling it.
"""
from __future__ import annotations

import json
import operator
import os
import pickle
import random
import re
from pathlib import Path

import numpy as np
import torch

CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"
INFO = "checkpoint-info.json"


def last_checkpoint_path(job_dir: str | os.PathLike) -> Path:
    return Path(job_dir) / CHECKPOINT_DIR / LAST


def save_atomic(obj, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_atomic(path, lambda f: torch.save(obj, f))
    if isinstance(obj, dict) and ("step" in obj or "epoch" in obj):
        info = {"step": _count(obj.get("step")), "epoch": _count(obj.get("epoch")),
                "file": path.name}
        _replace_atomic(path.with_name(INFO), lambda f: f.write(json.dumps(info).encode()))
    # Make the renames themselves durable (the directory entries), where the platform allows.
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    return path


def _replace_atomic(path: Path, write) -> None:
    """`write(f)` into a hidden temporary file beside `path`, fsync, rename over `path`. The
    name starts with ".": the checkpoint stream never uploads a save in progress."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _count(value) -> int | None:
    """An int (a python or numpy int, a one-element integer tensor) or None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return operator.index(value)
    except TypeError:
        pass
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def load(path: str | os.PathLike, map_location="cpu") -> dict:
    """The checkpoint at `path`, loaded as plain data: tensors, numbers, strings, lists, tuples
    and dicts (torch's weights_only loader). A checkpoint may come from the job store (a
    restored slot, --resume-from), which another principal or a compromised instance can write;
    unpickling it would run whatever its reduce calls, with this job's secrets in the
    environment. Anything else is refused with one line (SystemExit), and nothing runs: code,
    a damaged file (empty, truncated, sizes that do not add up), something other than a
    checkpoint's mapping, or a tensor that claims more elements than the file stores."""
    try:
        data = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))  # torch names what it would call
        what = f"a call to {found.group(1)}" if found else "other objects"
        raise SystemExit(f"{path}: refused to load the checkpoint: it holds {what}, not only "
                         "tensors, numbers, strings, lists and dicts (a checkpoint is never "
                         "unpickled)") from None
    except Exception as exc:  # noqa: BLE001 - any other failure is a damaged file
        # An empty file is EOFError; a truncated one, a record whose size does not match its
        # tensor, or a view torch cannot size is RuntimeError; a cut zip can be OSError.
        raise SystemExit(f"{path}: refused to load the checkpoint: it is damaged or not a "
                         f"checkpoint ({_first_line(exc)})") from None
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: refused to load the checkpoint: it holds "
                         f"{type(data).__name__}, not a checkpoint's mapping")
    claimed = _overlapping_view(data)
    if claimed is not None:
        raise SystemExit(f"{path}: refused to load the checkpoint: a tensor of {claimed} "
                         "elements over fewer stored (a view that copying would allocate "
                         "in full)")
    return data


def _first_line(exc: BaseException, most: int = 160) -> str:
    line = (str(exc).strip().splitlines() or [""])[0]
    line = line if len(line) <= most else line[:most - 3] + "..."
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def _overlapping_view(data, most_items: int = 1_000_000) -> int | None:
    """The element count of the first tensor that claims more elements than its storage
    holds (a stride-0 view of 10^14 elements over 4 floats loads at once, and the first
    copy asks for 400 TB); None when there is none."""
    stack, seen = [data], 0
    while stack and seen < most_items:
        item = stack.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            stored = item.untyped_storage().nbytes() // max(item.element_size(), 1)
            if item.numel() > stored:
                return item.numel()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


def count_of(items) -> int | None:
    """How many items a checkpoint's list holds (the runs it completed), None for anything
    else: check_schedule refuses that."""
    return len(items) if isinstance(items, (list, tuple)) else None


def check_schedule(path: str | os.PathLike, recipe: str, **counts: tuple) -> None:
    """Refuse to resume from a checkpoint whose counts are not whole numbers from 0 to this
    run's schedule: `step=(the saved step, the run's last step)`, `epoch=(..., epochs)`. A
    checkpoint whose step is past the end would end the training at once with the weights
    it holds, and the job would report success (whoever can write the job store could)."""
    for key, (saved, most) in counts.items():
        n = _count(saved)
        if n is None or not 0 <= n <= most:
            shown = repr(saved) if n is None else str(n)
            raise SystemExit(f"{recipe}: {path}: refused to resume: its {key} is "
                             f"{shown[:40]}, outside this run's schedule (0 to {most})")


def rng_states() -> dict:
    """Every RNG a training script may touch: python, numpy, torch CPU and the current CUDA
    device's (only that one: under torchrun each rank owns one GPU, and reading the others'
    generators would open a CUDA context on every GPU from every rank). Plain data only, so
    that `load` takes it without unpickling: numpy's key array goes in as a tensor."""
    cuda = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = torch.cuda.get_rng_state()
    name, key, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),  # (version, 625 ints, gauss): a tuple of numbers
        "numpy": {"name": name, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
        "cuda": cuda,
    }


def restore_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    state = states["numpy"]
    np.random.set_state((state["name"], state["key"].numpy().astype(np.uint32), state["pos"],
                         state["has_gauss"], state["gauss"]))
    torch.set_rng_state(states["torch"])
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)
