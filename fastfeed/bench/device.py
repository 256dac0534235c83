"""The consumer side of a bench: the host->device copy and the step (simulated or the bundled model).

`make_copy` uses the DevicePrefetcher's transfer path one batch at a time (so the copy stage is
timed on its own); the bundled trainer plugs in through `model_step` (one function).
"""

from __future__ import annotations

import time

import torch

from .config import BenchConfig, BenchError


def resolve_device(name: str) -> torch.device | None:
    """The accelerator to copy to, or None for --device cpu (the copy stage does not apply)."""
    if name.startswith("cpu"):
        return None
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BenchError(f"--device {name}: torch {torch.__version__} sees no CUDA device; install a CUDA "
                             "build of torch (make TORCH_SPEC='torch>=2.6') or use --device cpu")
        return torch.device(name)
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError as e:
        raise ImportError(f"--device {name} needs torch_npu: pip install fastfeed[npu] ({e})") from e
    if not torch.npu.is_available():
        raise BenchError(f"--device {name}: torch_npu sees no Ascend NPU; use --device cpu")
    return torch.device(name)


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
    sync = torch.cuda.synchronize if device.type == "cuda" else torch.npu.synchronize

    def copy(batch):
        images, targets = prefetcher.transfer(batch)
        sync(device)
        return images, targets

    return copy


def model_step(model: str, device: torch.device | None, imgsz: int, batch_size: int):
    """One real training step of the bundled model. The single hook the trainer must provide:
    `fastfeed.train.bench_step(model, device, imgsz, batch_size) -> callable(images, targets)`
    running forward, backward and the optimizer step, synchronised."""
    try:
        from ..train import bench_step
    except ImportError as e:
        raise BenchError(f"--model {model}: the bundled model arrives with `fastfeed train`; use --step-ms to "
                         f"simulate a step ({e})") from None
    return bench_step(model, device or torch.device("cpu"), imgsz, batch_size)


def make_step(cfg: BenchConfig, device: torch.device | None):
    """(images, targets) -> None: the model's step, a sleep of step_ms (the host is free meanwhile, as
    with a real accelerator; not a busy-wait), or None for a pure throughput run."""
    if cfg.model is not None:
        return model_step(cfg.model, device, cfg.imgsz, cfg.batch_size)
    if cfg.step_ms is None:
        return None
    seconds = cfg.step_ms / 1e3

    def step(images, targets):
        if seconds > 0:
            time.sleep(seconds)

    return step
