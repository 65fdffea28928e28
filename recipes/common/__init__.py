"""Helpers shared by the bundled recipes: metrics log, checkpoints, CIFAR-10 on disk.

A recipe puts the `recipes/` folder on sys.path and imports `common.metrics` etc. `metrics`
is stdlib only; `checkpoint` needs torch; `cifar10` needs numpy (and torchvision to download).
"""
