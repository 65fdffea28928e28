"""torch.compile for the recipes' `compile=true` (issue 17): the mode, the cache, the error.

* Mode. `compile_mode=auto` (the default) is 'max-autotune' on CUDA, as the published compiled
  airbench (autotuned Triton kernels and CUDA graphs), and torch's default mode on the CPU,
  where autotuning buys nothing and costs minutes. Any of torch's modes can be asked for.
* Cache. Inductor's caches (compiled graphs, autotuning results) go to
  <data dir>/inductor-cache, which outlives the job: `runs=N` compiles once, and the next job
  on a kept instance loads the graphs instead of compiling them again. A
  $TORCHINDUCTOR_CACHE_DIR the job was started with wins; import this module before torch,
  whose first look at its cache dir writes its default (/tmp/torchinductor_$USER) into the
  environment (torchvision's import does that look).
* Failure. torch.compile fails late, on the first call; `failure()` turns what it raised into
  one line that says how to run without it.
"""
from __future__ import annotations

import os
from pathlib import Path

MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_MODE = "max-autotune"  # as KellerJordan/cifar10-airbench legacy/airbench94_compiled.py
INDUCTOR_CACHE = "inductor-cache"  # in the data dir: a kept instance's next job reuses it
# What the job was started with, read before torch can write its default there.
STARTED_WITH_CACHE_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def mode_for(requested: str, cuda: bool) -> str:
    """The torch.compile mode a run uses: `auto` is max-autotune on CUDA, default elsewhere."""
    if requested not in MODES:
        raise SystemExit(f"compile_mode must be one of {', '.join(MODES)}, got {requested!r}")
    if requested == "auto":
        return CUDA_MODE if cuda else "default"
    return requested


def compiled(fn, data_root, cuda: bool, mode: str = "auto"):
    """torch.compile(fn) in the run's mode, with inductor's caches in the data dir."""
    import torch

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = (STARTED_WITH_CACHE_DIR
                                             or str(Path(data_root) / INDUCTOR_CACHE))
    chosen = mode_for(mode, cuda)
    return torch.compile(fn) if chosen == "default" else torch.compile(fn, mode=chosen)


def failure(recipe: str, exc: BaseException, device_type: str) -> SystemExit:
    """The one-line exit for a compile that failed on its first call."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return SystemExit(
        f"{recipe}: compile=true failed on {device_type} ({type(exc).__name__}: {first}). "
        + ("On the CPU torch.compile needs a working C++ compiler. " if device_type == "cpu"
           else "") + "Rerun with compile=false (the default).")


def warm_up(recipe: str, fwd, model, batches: list[tuple], dtype, device,
            steps: int = 2) -> None:
    """Compile fwd's training graphs (forward and backward) before the clock starts: `steps`
    forward+backward passes of the real model in train mode on random contiguous batches of
    each shape in `batches` (the full batch, and a smaller last one where the loader keeps
    it: a shape first met in training would compile there, on the clock), then its state
    put back (a train-mode forward moves the BatchNorm statistics) and its gradients dropped.
    A copy of the model would be another module to compile. No optimizer step. Under DDP
    every rank must call it: the backward all-reduces."""
    import copy

    import torch
    import torch.nn.functional as F

    saved = copy.deepcopy(model.state_dict())
    was_training = model.training
    gen = torch.Generator(device=device).manual_seed(0)
    model.train()
    try:
        for shape in batches:
            for _ in range(steps):
                xb = torch.randn(*shape, device=device, generator=gen).to(dtype)
                logits = fwd(xb).float()
                yb = torch.randint(0, logits.shape[1], (shape[0],), device=device,
                                   generator=gen)
                F.cross_entropy(logits, yb).backward()
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:
        raise failure(recipe, exc, device.type) from exc
    finally:
        model.load_state_dict(saved)
        model.train(was_training)
        for p in model.parameters():
            p.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
