#!/usr/bin/env python3
"""airbench on the CPU: parameter counts, forward FLOPs per image, training throughput.

For airbench94, airbench95 and airbench96 (recipes/common/airbench.py) at full size in float32:
  * parameters, frozen whitening weights and BN scales included, and the trainable ones;
  * forward FLOPs per image, counted by torch.utils.flop_counter.FlopCounterMode on an
    eval-mode forward pass (convolutions and the linear head; a multiply-add is 2 FLOPs).
    AB's airbench94_compiled.py header says "0.28 GFLOPs per forward pass", and the AB
    headers give the whole training as 0.36, 1.39 and 4.91 PFLOPs; we print 3 x forward x
    images trained on (a backward pass costs about twice a forward) beside them;
  * training images per second at the recipe's batch size (1024): one warm-up step, then
    --steps timed steps of the recipe's own step (forward, summed label-smoothed loss,
    backward, Nesterov SGD with LambdaLR, lookahead every 5 steps). The batch is random data
    already in memory: loading and augmentation are not timed.

    python benchmarks/airbench_cpu.py                 # all three, 2 timed steps each
    python benchmarks/airbench_cpu.py --variants airbench94 --steps 5 --threads 2
"""
import argparse
import functools
import sys

import torch

from cpu_figures import RECIPES, forward_flops_per_image, images_per_second

sys.path.insert(0, str(RECIPES))
from common import airbench as ab  # noqa: E402

PUBLISHED_TRAIN_PFLOPS = {"airbench94": 0.36, "airbench95": 1.39, "airbench96": 4.91}
README_FWD_GFLOPS = {"airbench94": 0.28}


def throughput(variant: str, batch_size: int, steps: int) -> float:
    hyp = ab.HYP[variant]
    torch.manual_seed(0)
    net = ab.build_net(hyp).train()
    total = ab.total_steps(50_000, batch_size, hyp["epochs"])
    opt = ab.make_optimizer(net, hyp, batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: ab.lr_factor(s, total, hyp))
    lookahead = ab.Lookahead(net)
    x = torch.randn(batch_size, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch_size,))

    forward = functools.partial(ab.forward_loss, net, label_smoothing=hyp["label_smoothing"])

    def step(n):
        ab.train_step(forward, opt, sched, x, y)
        if n % hyp["ema_every"] == 0:
            lookahead.update(net, ab.lookahead_alpha(n, total, hyp))

    return images_per_second(step, batch_size, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(ab.HYP), choices=list(ab.HYP))
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the warm-up")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, "
          f"batch {args.batch_size}, {args.steps} timed steps after 1 warm-up step")
    print(f"{'variant':<12}{'params':>12}{'trainable':>12}{'GFLOPs/fwd':>12}{'(AB)':>7}"
          f"{'train PFLOPs':>14}{'(AB)':>7}{'images/s':>10}{'s/step':>8}")
    for variant in args.variants:
        hyp = ab.HYP[variant]
        net = ab.build_net(hyp)
        total, trainable = ab.count_params(net)
        fwd = forward_flops_per_image(net)
        seen = ab.total_steps(50_000, 1024, hyp["epochs"]) * 1024
        train_pflops = 3 * fwd * seen / 1e15
        rate = throughput(variant, args.batch_size, args.steps)
        readme = README_FWD_GFLOPS.get(variant)
        print(f"{variant:<12}{total:>12,}{trainable:>12,}{fwd / 1e9:>12.3f}"
              f"{readme if readme else '-':>7}{train_pflops:>14.2f}"
              f"{PUBLISHED_TRAIN_PFLOPS[variant]:>7}{rate:>10.1f}"
              f"{args.batch_size / rate:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
