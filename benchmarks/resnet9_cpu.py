#!/usr/bin/env python3
"""ResNet9 on the CPU: parameter counts, forward FLOPs and training throughput at full size.

For every variant of recipes/resnet9/train.py: build the full-width model in float32, take one
warm-up training step on a random batch, then time --steps more (forward, summed loss,
backward, Page's Nesterov update, and the EMA update on its steps for bag-of-tricks).
Data loading and augmentation are not timed. Prints images per second.

apple-8gpu is measured as one of its 8 ranks: a single process at the per-GPU batch of 256,
without the gradient all-reduce (there is no second rank), i.e. per-GPU throughput.

    python benchmarks/resnet9_cpu.py              # each variant's batch (512, 512, 256 per GPU)
    python benchmarks/resnet9_cpu.py --steps 5 --threads 2
"""
import argparse

import torch

from cpu_figures import forward_flops_per_image, images_per_second, load_recipe


def throughput(train, variant: str, batch_size: int, steps: int) -> float:
    hyp = train.HYP[variant]
    torch.manual_seed(0)
    model = train.build_model(variant, width_div=1, ghost_splits=16).train()
    ema = train.build_model(variant, width_div=1, ghost_splits=16) if hyp["ema_every"] else None
    opt = train.NesterovSGD(train.param_groups(model, hyp, batch_size), hyp["momentum"])
    x = torch.randn(batch_size, 3, 32, 32)
    y = torch.randint(0, 10, (batch_size,))
    lr = train.lr_at(2, 24, hyp, hyp["epochs"], batch_size)  # early warm-up lr: any value

    def step(n):
        train.train_step(model, opt, x, y, lr, hyp["label_smoothing"])
        if ema is not None and train.is_ema_step(n, hyp["ema_every"]):
            train.ema_update(ema, model, hyp["ema_momentum"] ** hyp["ema_every"])

    return images_per_second(step, batch_size, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="default: each variant's own (per GPU for apple-8gpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    train = load_recipe("resnet9")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, "
          f"{args.steps} timed steps after 1 warm-up step")
    print(f"{'variant':<15}{'batch':>7}{'params':>12}{'trainable':>12}{'GFLOPs/fwd':>12}"
          f"{'images/s':>10}{'s/step':>8}")
    for variant in ("bag-of-tricks", "dawn", "apple-8gpu"):
        batch = args.batch_size or train.HYP[variant]["batch_size"]
        model = train.build_model(variant)
        total, trainable = train.count_params(model)
        fwd = forward_flops_per_image(model)
        rate = throughput(train, variant, batch, args.steps)
        print(f"{variant:<15}{batch:>7}{total:>12,}{trainable:>12,}{fwd / 1e9:>12.3f}"
              f"{rate:>10.1f}{batch / rate:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
