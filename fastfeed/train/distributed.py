"""Multi-process data parallel: one process per device, started by torchrun.

    torchrun --nproc_per_node N -m fastfeed train --data coco.ff ...

torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE are read here, at the door (the loaders are given the
ranks on a node, `LoaderConfig.local_world_size`); the process group uses gloo on CPU, nccl on CUDA and hccl on
Ascend NPUs. Rank 0 alone evaluates, logs and writes checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..devices import set_device

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owned: bool = False         # this code initialised the process group, so it tears it down
    local_world_size: int = 1   # ranks on this node

    @property
    def main(self) -> bool:
        return self.rank == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def local_world_size() -> int:
    """The ranks on this node (torchrun's LOCAL_WORLD_SIZE; 1 without it), for `LoaderConfig.local_world_size`."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)


def setup(device: torch.device) -> Dist:
    """Join the process group torchrun describes (or use one the caller already initialised)."""
    owned = not (dist.is_available() and dist.is_initialized())
    if owned:
        if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
            return Dist()
        set_device(device)
        dist.init_process_group(BACKENDS[device.type])
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank(), owned=owned, local_world_size=local_world_size())


def all_mean(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """Mean over ranks (a NaN on any rank reaches every rank, so all stop together)."""
    if d.world_size > 1:
        t = t.clone()
        dist.all_reduce(t)
        t /= d.world_size
    return t


def any_true(flag: bool, d: Dist, device: torch.device) -> bool:
    """True on every rank when `flag` is True on any (one all-reduce; no collective with one process)."""
    return flag if d.world_size == 1 else all_min(-int(flag), d, device) < 0


def all_min(value: int, d: Dist, device: torch.device) -> int:
    """The smallest `value` over ranks (what every rank can afford; one all-reduce, none with one process)."""
    if d.world_size == 1:
        return value
    t = torch.tensor([value], device=device, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def gather(obj, d: Dist) -> list:
    """`obj` of every rank, in rank order, on every rank (one all_gather_object; none with one process)."""
    if d.world_size == 1:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


def backend(d: Dist, device: torch.device) -> str:
    """The process group's backend (or the one this device would get)."""
    if d.world_size > 1 and dist.is_initialized():
        return str(dist.get_backend())
    return BACKENDS[device.type]


def barrier(d: Dist) -> None:
    if d.world_size > 1:
        dist.barrier()


def teardown(d: Dist) -> None:
    if d.owned and dist.is_initialized():
        dist.destroy_process_group()
