"""The accelerator side of the prefetcher: one code path for CUDA and Ascend NPU through the device's
torch module (`torch.cuda`, `torch.npu`), and the seam the tests replace with a recording fake."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..batch import Batch

DEVICES = ("cuda", "npu", "cpu")


def device_module(device_type: str):
    """The torch module with the device's Stream/Event API (torch.cuda, torch.npu); torch_npu is
    imported here, and only for "npu". Raises ImportError / RuntimeError naming what is missing."""
    if device_type == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError as e:
            raise ImportError(f"device 'npu' needs torch_npu: pip install fastfeed[npu] ({e})") from e
    mod = getattr(torch, device_type, None)
    if mod is None or not hasattr(mod, "Stream"):
        raise ValueError(f"device type {device_type!r} has no stream API; valid devices: {', '.join(DEVICES)}")
    if not mod.is_available():
        raise RuntimeError(f"torch {torch.__version__} sees no {device_type} device; use device='cpu'")
    return mod


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
