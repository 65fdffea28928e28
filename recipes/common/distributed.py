"""One process per GPU under torchrun, or a single process: the same recipe code for both.

`setup(device)` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).
Without it (plain `python train.py`) it returns a world of one and creates no process group, so
a single-process run pays nothing. With it, rank r uses cuda:LOCAL_RANK and NCCL on GPUs, or
the CPU and gloo (tests, 2 processes on 2 cores).

The recipes average or sum gradients themselves where the source did (see each train.py); the
helpers here are the collective primitives they need.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as td


@dataclass
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None  # None: single process, no process group
    control: object = None  # under NCCL: a gloo group for small CPU-side agreements

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            td.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank if it is True on any rank. On the CPU (gloo; under NCCL the
        `control` group), so asking at every step never waits for the GPU's queue."""
        if self.world_size == 1:
            return bool(flag)
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        td.all_reduce(t, op=td.ReduceOp.MAX, group=self.control)
        return bool(t.item())

    def gather_objects(self, obj) -> list:
        """Every rank's `obj` (picklable, small), in rank order, on every rank."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        td.all_gather_object(out, obj, group=self.control)
        return out

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """In place, and returned: the sum over ranks."""
        if self.world_size > 1:
            td.all_reduce(tensor, op=td.ReduceOp.SUM)
        return tensor

    def broadcast_module(self, module: torch.nn.Module, src: int = 0) -> None:
        """Every parameter and buffer takes rank src's values (identical initial weights)."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                td.broadcast(t.data, src=src)

    def broadcast_object(self, obj, src: int = 0):
        if self.world_size == 1:
            return obj
        box = [obj]
        td.broadcast_object_list(box, src=src)
        return box[0]

    def agreement(self, module: torch.nn.Module) -> dict:
        """What every rank ends with, gathered on every rank: its node (torchrun's
        GROUP_RANK) and a sha256 of its module's parameters. A run over several processes or
        machines writes it at its end: the ranks agree when every digest is the same."""
        digest = hashlib.sha256()
        for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            digest.update(name.encode())
            digest.update(p.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                          .numpy().tobytes())
        mine = {"rank": self.rank, "node": int(os.environ.get("GROUP_RANK", "0") or 0),
                "weights_sha256": digest.hexdigest()}
        ranks = sorted(self.gather_objects(mine), key=lambda r: r["rank"])
        return {"world_size": self.world_size, "nodes": len({r["node"] for r in ranks}),
                "ranks": ranks, "identical": len({r["weights_sha256"] for r in ranks}) == 1}

    def close(self) -> None:
        if self.backend is not None and td.is_initialized():
            td.destroy_process_group()


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


# The device node NVIDIA's driver makes for the first GPU: a host that has one has a GPU.
NVIDIA_DEVICE = "/dev/nvidia0"


def pick_device(requested: str, local_rank: int = 0) -> torch.device:
    """auto: cuda:LOCAL_RANK when CUDA is available, else the CPU. Not silently the CPU on a
    host that has paid-for GPUs (CLOUDTRAIN_GPUS) and an NVIDIA device torch cannot use (a
    wheel built for another CUDA than the driver's): that would bill GPU hours for a CPU run."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
        paid = int(os.environ.get("CLOUDTRAIN_GPUS") or 0)
        if requested == "cpu" and paid and os.path.exists(NVIDIA_DEVICE):
            raise SystemExit(
                f"this host has {paid} GPU(s) and an NVIDIA device ({NVIDIA_DEVICE}), but torch "
                f"{torch.__version__} (CUDA {torch.version.cuda or 'none'}) sees no CUDA device: "
                "its CUDA build and the driver do not match (nvidia-smi says the driver's). "
                "Not training on the CPU at GPU prices; --set device=cpu runs it there anyway")
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda but torch sees no CUDA device")
        if local_rank >= torch.cuda.device_count():
            raise SystemExit(f"LOCAL_RANK {local_rank} but this host has "
                             f"{torch.cuda.device_count()} GPU(s)")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def setup(requested_device: str = "auto", timeout_s: float = 600) -> World:
    """The world this process is in. Under torchrun: init the process group (NCCL on CUDA,
    gloo on CPU) from the env:// rendezvous torchrun set up."""
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        local = int(os.environ.get("LOCAL_RANK", 0))
        return World(device=pick_device(requested_device, local))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = pick_device(requested_device, local)
    backend = "nccl" if device.type == "cuda" else "gloo"
    td.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world,
                          timeout=timedelta(seconds=timeout_s))
    control = td.new_group(backend="gloo") if backend == "nccl" else None
    return World(rank=rank, world_size=world, local_rank=local, device=device, backend=backend,
                 control=control)


def epoch_indices(n: int, world_size: int, rank: int, seed: int, epoch: int) -> list:
    """This rank's image indices for an epoch, in order: torch's DistributedSampler (shuffled
    with seed + epoch; padded with repeats when n does not divide by world_size)."""
    sampler = torch.utils.data.DistributedSampler(range(n), num_replicas=world_size, rank=rank,
                                                  shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)
