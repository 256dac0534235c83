"""The accelerator side of the prefetcher: one code path for CUDA and Ascend NPU through the device's
torch module (`torch.cuda`, `torch.npu`, from `fastfeed.devices`), and the seam the tests replace with a
recording fake."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..batch import Batch


class StreamOps:
    """What the prefetcher asks of an accelerator. The seam for tests: they pass a recording fake (`ops=`)."""

    def __init__(self, mod, device: torch.device):
        self.mod, self.device = mod, device

    def new_stream(self):
        return self.mod.Stream(device=self.device)

    def current_stream(self):
        return self.mod.current_stream(self.device)

    def use(self, stream):
        return self.mod.stream(stream)

    def event(self):
        return self.mod.Event()

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True)

    def record(self, t: torch.Tensor, stream) -> None:
        t.record_stream(stream)


class InFlight(NamedTuple):
    batch: Batch    # on the device, maybe still being written on the side stream
    copied: object  # event: the H2D copies are done, the loader may reuse the host memory
    ready: object   # event: conversion and augmentation are done, the batch may be used


def pinned(t: torch.Tensor) -> bool:
    try:
        return t.is_pinned()
    except RuntimeError:
        return False
