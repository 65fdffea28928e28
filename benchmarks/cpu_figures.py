"""What the recipe benchmarks share: loading a recipe's train.py as a module, counting a
forward pass's FLOPs, and timing training steps (one warm-up step first)."""
import importlib.util
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def load_recipe(name: str):
    """recipes/<name>/train.py, imported without running its __main__ block."""
    path = RECIPES / name / "train.py"
    spec = importlib.util.spec_from_file_location(f"{name.replace('-', '_')}_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def forward_flops_per_image(model, images: int = 8) -> float:
    """FLOPs of an eval-mode forward pass per 32x32 image (torch's FlopCounterMode: the
    convolutions and linear layers; a multiply-add counts 2)."""
    was_training = model.training
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randn(images, 3, 32, 32))
    model.train(was_training)
    return counter.get_total_flops() / images


def images_per_second(step, batch_size: int, steps: int) -> float:
    """step(n) is one training step, n counting from 1; step 1 warms up (allocations, oneDNN
    kernel choice) and is not timed."""
    step(1)
    start = time.perf_counter()
    for n in range(2, steps + 2):
        step(n)
    return steps * batch_size / (time.perf_counter() - start)
