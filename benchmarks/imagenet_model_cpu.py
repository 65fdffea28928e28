#!/usr/bin/env python3
"""ResNet-50 on the CPU: images per second of a training step and of an evaluation forward pass
at the ImageNet recipes' three sizes (128, 224 and 288 px), NCHW and channels_last.

The model is recipes/imagenet/model.py's build_model("resnet50") in float32 (add --blurpool
for FF's variant). A training step is the recipes' step without data: forward, cross-entropy,
backward and SGD (momentum 0.9, weight decay 1e-4 on every parameter, FI's rule); evaluation is
a forward pass in eval mode under no_grad. Each (size, layout) gets fresh weights, --warmup
untimed steps (allocations, oneDNN's kernel choice) and then --steps timed ones; the figure is
the batch over the median step. Random images, so decoding and augmentation are not timed.
torch runs on every core unless --threads says otherwise; the load average before and after
is printed because other processes on the machine make the steps slower and noisier. Forward FLOPs per image come from
torch.utils.flop_counter.FlopCounterMode (a multiply-add counts 2).

    python benchmarks/imagenet_model_cpu.py                  # batch 16, 3 timed steps
    python benchmarks/imagenet_model_cpu.py --sizes 128 --steps 5 --threads 1
"""
import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def load_model_module():
    """recipes/imagenet/model.py (it imports common.training, so recipes/ goes on the path)."""
    sys.path.insert(0, str(RECIPES))
    spec = importlib.util.spec_from_file_location("imagenet_model",
                                                  RECIPES / "imagenet" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    """1, 5 and 15 minute load averages: above the core count, something else was running."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def forward_gflops(model, size: int) -> float:
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, size, size))
    return counter.get_total_flops() / 1e9


def timed(fn, warmup: int, steps: int) -> list:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def measure(mod, size: int, batch: int, channels_last: bool, blurpool: bool, warmup: int,
            steps: int) -> tuple:
    """(training step times, evaluation step times) in seconds."""
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = mod.build_model("resnet50", blurpool=blurpool).to(memory_format=fmt)
    opt = torch.optim.SGD(mod.param_groups(model, 1e-4, "all"), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, size, size).contiguous(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,))

    def train_step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    @torch.no_grad()
    def eval_step():
        model(x)

    model.train()
    train_times = timed(train_step, warmup, steps)
    model.eval()
    return train_times, timed(eval_step, warmup, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 224, 288])
    parser.add_argument("--steps", type=int, default=3, help="timed steps (the median counts)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--threads", type=int, default=None, help="default: every core")
    parser.add_argument("--blurpool", action="store_true", help="FF's BlurPool variant")
    args = parser.parse_args()
    if args.batch_size < 2 or args.steps < 1 or args.warmup < 0 or min(args.sizes) < 32:
        raise SystemExit("imagenet_model_cpu: need batch >= 2 (BatchNorm), steps >= 1, "
                         "warmup >= 0 and sizes >= 32")
    cores = os.cpu_count() or 1
    torch.set_num_threads(args.threads or cores)
    mod = load_model_module()
    model = mod.build_model("resnet50", blurpool=args.blurpool)
    print(f"{cpu_name()}, {cores} cores, torch {torch.__version__} on {torch.get_num_threads()} "
          f"threads, Python {platform.python_version()}; load average {load_average()}")
    print(f"ResNet-50{' + BlurPool' if args.blurpool else ''} float32, "
          f"{mod.count_params(model):,} parameters, batch {args.batch_size}, "
          f"{args.warmup} warm-up + {args.steps} timed steps, median")
    print(f"{'size':>5} {'layout':<14} {'GFLOP fwd/img':>13} {'train img/s':>11} "
          f"{'eval img/s':>10}   train s/step; eval s/step")
    for size in args.sizes:
        gflops = forward_gflops(model, size)
        for channels_last in (False, True):
            train_t, eval_t = measure(mod, size, args.batch_size, channels_last, args.blurpool,
                                      args.warmup, args.steps)
            train_rate = args.batch_size / statistics.median(train_t)
            eval_rate = args.batch_size / statistics.median(eval_t)
            print(f"{size:>5} {'channels_last' if channels_last else 'NCHW':<14} "
                  f"{gflops:>13.2f} {train_rate:>11.1f} {eval_rate:>10.1f}   "
                  f"{', '.join(f'{t:.2f}' for t in train_t)}; "
                  f"{', '.join(f'{t:.2f}' for t in eval_t)}", flush=True)
    print(f"load average at the end {load_average()}")


if __name__ == "__main__":
    main()
