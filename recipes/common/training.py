"""Small pieces every recipe's training loop uses: parameter counts, fp16 with fp32
BatchNorm, fp32 master weights for a half model, and the clock that measures training time
the way the records do."""
from __future__ import annotations

import time

import torch
from torch import nn


def count_params(model: nn.Module) -> tuple[int, int]:
    """(all parameters, trainable ones); buffers such as running stats are not counted."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def to_half_keep_bn_float(model: nn.Module) -> nn.Module:
    """fp16 everywhere except BatchNorm, which stays fp32 (CF `Network.half`, fastai 0.7
    `batchnorm_to_fp32`, airbench): the mixed precision all the CIFAR records trained in."""
    model.half()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.float()
    return model


class MasterWeights:
    """fp32 copies of a model's parameters, which the optimiser steps. Make it after the
    weights are final on every rank (after DDP's broadcast or a checkpoint load)."""

    def __init__(self, model: nn.Module):
        self.model_params = list(model.parameters())
        self.params = [p.detach().float().clone().requires_grad_(True)
                       for p in self.model_params]

    @torch.no_grad()
    def pull_grads(self, loss_scale: float) -> None:
        """Model gradients (averaged over ranks by DDP) -> fp32 master gradients / scale."""
        for master, p in zip(self.params, self.model_params):
            master.grad = p.grad.to(torch.float32, copy=True).div_(loss_scale)
            p.grad = None

    @torch.no_grad()
    def push(self) -> None:
        for master, p in zip(self.params, self.model_params):
            p.copy_(master)

    @torch.no_grad()
    def load(self, saved: list) -> None:
        for master, s in zip(self.params, saved):
            master.copy_(s)
        self.push()


class TrainClock:
    """Seconds of training, accumulated over start/stop intervals (what each recipe counts
    is its own: see its header). Synchronises CUDA before every reading."""

    def __init__(self, total: float, cuda: bool):
        self.total, self.cuda, self._t0 = total, cuda, None

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self) -> None:
        self._t0 = self._now()

    def stop(self) -> float:
        self.total += self._now() - self._t0
        self._t0 = None
        return self.total

    def discard(self) -> None:
        self._t0 = None
