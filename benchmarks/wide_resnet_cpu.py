#!/usr/bin/env python3
"""WRN-22-6 on the CPU: parameters, FLOPs per image and training throughput of the full model.

For recipes/wide-resnet34/train.py at full size (depth 22, widen 6) in float32: count the
parameters, count the FLOPs of one image's forward pass (and of a forward + backward pass)
with torch.utils.flop_counter.FlopCounterMode, then train at the per-GPU batch size of the
8gpu entry (128): one warm-up step on a random batch, then --steps timed steps (forward,
cross-entropy, backward, fp32 master-weight SGD with momentum and L2, exactly the recipe's
train_step). Data loading and augmentation are not timed. Prints images per second.

    python benchmarks/wide_resnet_cpu.py                 # batch 128, 3 timed steps
    python benchmarks/wide_resnet_cpu.py --steps 5 --threads 2 --depth 34
"""
import argparse
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from cpu_figures import load_recipe


def flops_per_image(train, depth: int, widen: int) -> tuple:
    """(forward FLOPs, forward + backward FLOPs) of one 32x32 image, counted by torch."""
    model = train.build_model(depth, widen).train()
    x = torch.randn(1, 3, 32, 32)
    with FlopCounterMode(display=False) as forward:
        model(x)
    with FlopCounterMode(display=False) as both:
        model(x).sum().backward()
    return forward.get_total_flops(), both.get_total_flops()


def step_times(train, depth: int, widen: int, batch_size: int, steps: int) -> list:
    hyp = train.HYP["8gpu"]
    torch.manual_seed(0)
    model = train.build_model(depth, widen).train()
    master = train.MasterWeights(model)
    opt = train.make_optimizer(master, hyp)
    x = torch.randn(batch_size, 3, 32, 32)
    y = torch.randint(0, 10, (batch_size,))
    nb = 1960
    lr, mom = train.schedule(10, nb, hyp["lr"], hyp["clr"])
    train.train_step(model, opt, master, x, y, lr, mom, 1.0)  # warm-up: allocations, oneDNN
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        train.train_step(model, opt, master, x, y, lr, mom, 1.0)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up")
    parser.add_argument("--batch-size", type=int, default=128, help="8gpu: 128 per GPU")
    parser.add_argument("--depth", type=int, default=22)
    parser.add_argument("--widen", type=int, default=6)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    train = load_recipe("wide-resnet34")
    params = train.count_params(train.build_model(args.depth, args.widen))[0]
    fwd, fwd_bwd = flops_per_image(train, args.depth, args.widen)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, "
          f"WRN-{args.depth}-{args.widen}")
    print(f"parameters               {params:,}")
    print(f"forward FLOPs / image    {fwd / 1e9:.3f} G ({fwd:,}; a multiply-add counts 2)")
    print(f"fwd+bwd FLOPs / image    {fwd_bwd / 1e9:.3f} G")
    times = step_times(train, args.depth, args.widen, args.batch_size, args.steps)
    median = statistics.median(times)
    rate = args.batch_size / median
    print(f"training, batch {args.batch_size}: {args.steps} timed steps after 1 warm-up, "
          f"s/step {', '.join(f'{t:.2f}' for t in times)}")
    print(f"images/s (median step)   {rate:.1f}  ({rate * fwd_bwd / 1e9:.1f} GFLOP/s counted; "
          f"the optimiser step is not counted)", flush=True)


if __name__ == "__main__":
    main()
