"""Repeated runs (`--runs N`), reported as the records are: the mean accuracy over runs
(airbench, n=1000 etc.) and the fraction of runs reaching the target (Page, Apple: "35 of 50
runs >= 94%"). Stdlib only.
"""
from __future__ import annotations

import math
import statistics


def run_seed(seed: int, run: int) -> int:
    """Run r of a multi-run job trains with seed + r: run 0 is exactly a single run's seed."""
    return seed + run


def summarise(accuracies: list[float], target: float) -> dict:
    """Mean, standard deviation, min, max, median and the fraction of runs >= target."""
    if not accuracies:
        raise ValueError("no runs to summarise")
    n = len(accuracies)
    reached = sum(1 for a in accuracies if a >= target)
    return {
        "runs": n,
        "mean_acc": statistics.fmean(accuracies),
        "std_acc": statistics.stdev(accuracies) if n > 1 else 0.0,
        "min_acc": min(accuracies),
        "median_acc": statistics.median(accuracies),
        "max_acc": max(accuracies),
        "reached": reached,
        "fraction_reached": reached / n,
        "target": target,
    }


def describe(summary: dict) -> str:
    """One line: `5 runs: mean 94.02% (sd 0.14), 4 of 5 >= 94.00%`."""
    s = summary
    sem = s["std_acc"] / math.sqrt(s["runs"]) if s["runs"] > 1 else 0.0
    return (f"{s['runs']} run{'s' if s['runs'] != 1 else ''}: mean {s['mean_acc']:.2%} "
            f"(sd {s['std_acc']:.2%}, s.e. {sem:.2%}), min {s['min_acc']:.2%}, max "
            f"{s['max_acc']:.2%}, {s['reached']} of {s['runs']} >= {s['target']:.2%}")
