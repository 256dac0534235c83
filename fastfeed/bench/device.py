"""The consumer side of a bench: the host->device copy (`make_copy`) and the step (`make_step`: simulated or the
bundled model)."""

from __future__ import annotations

import time

import torch

from ..devices import resolve_device, synchronize
from .config import BenchConfig


def copy_device(name: str) -> torch.device | None:
    """The accelerator to copy to, or None for --device cpu (the copy stage does not apply)."""
    device = resolve_device(name)
    return None if device.type == "cpu" else device


def make_copy(device: torch.device | None):
    """(batch) -> (images, targets) on `device`, synchronised so the time is the copy's; None on cpu.

    The DevicePrefetcher's own path, one batch at a time: its side stream, a non-blocking copy from the
    loader's pinned memory, uint8 -> float /255 on the device. The bench hands batches over one by one,
    so this measures the copy and conversion, not their overlap with the step (that needs the measure
    loop to iterate `DevicePrefetcher(loader, device)` instead of the loader).
    """
    if device is None:
        return None
    from ..prefetch import DevicePrefetcher

    prefetcher = DevicePrefetcher((), device)

    def copy(batch):
        images, targets = prefetcher.transfer(batch)
        synchronize(device)
        return images, targets

    return copy


def make_step(cfg: BenchConfig, device: torch.device | None):
    """(images, targets) -> None: the bundled model's real training step (`fastfeed.train.bench_step`: forward,
    backward and the optimizer step, synchronised), a sleep of step_ms (the host is free meanwhile, as with a
    real accelerator; not a busy-wait), or None for a pure throughput run."""
    if cfg.model is not None:
        from ..train import bench_step

        return bench_step(cfg.model, device or torch.device("cpu"), cfg.imgsz, cfg.batch_size)
    if cfg.step_ms is None:
        return None
    seconds = cfg.step_ms / 1e3

    def step(images, targets):
        if seconds > 0:
            time.sleep(seconds)

    return step
