"""Devices (cpu | cuda | npu), their sync and memory figures, mixed precision, and batches on the device."""

from __future__ import annotations

import logging
from contextlib import nullcontext

import torch

log = logging.getLogger(__name__)


class TrainError(RuntimeError):
    """Training cannot run as asked, or stopped (the message says why and what to do)."""


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'cpu', 'cuda', 'cuda:1', 'npu'... -> a checked torch.device. Under torchrun each process
    takes the accelerator of its local rank. torch_npu is imported only for an NPU."""
    kind = name.split(":")[0]
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise TrainError(f"--device {name}: torch {torch.__version__} sees no CUDA device; install a CUDA "
                             "build of torch (make TORCH_SPEC='torch>=2.6') or use --device cpu")
        return torch.device(name if ":" in name else f"cuda:{local_rank}")
    if kind == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError as e:
            raise ImportError(f"--device {name} needs torch_npu: pip install fastfeed[npu] ({e})") from e
        if not torch.npu.is_available():
            raise TrainError(f"--device {name}: torch_npu sees no Ascend NPU; use --device cpu")
        return torch.device(name if ":" in name else f"npu:{local_rank}")
    raise ValueError(f"--device must be cpu, cuda[:N] or npu[:N], got {name!r}")


def accel_module(device: torch.device):
    """torch.cuda / torch.npu for an accelerator, None for the CPU."""
    return getattr(torch, device.type) if device.type in ("cuda", "npu") else None


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work. Kernels run asynchronously: without this a timer around a
    step measures only how long the host took to *queue* it."""
    mod = accel_module(device)
    if mod is not None:
        mod.synchronize(device)


def memory_mb(device: torch.device) -> dict:
    """Allocated / reserved / peak-allocated MiB on an accelerator; {} on the CPU."""
    mod = accel_module(device)
    if mod is None:
        return {}
    return {"mem_alloc_mb": mod.memory_allocated(device) / 2**20, "mem_reserved_mb": mod.memory_reserved(device) / 2**20,
            "mem_peak_mb": mod.max_memory_allocated(device) / 2**20}


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, amp: str | None):
    """Mixed precision for the forward pass: convs and matmuls in bf16/fp16, while the parameters,
    BatchNorm's statistics and the loss stay fp32 (autocast casts per op; nothing is converted)."""
    if amp is None:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[amp])


def grad_scaler(device: torch.device, amp: str | None):
    """fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none."""
    enabled = amp == "fp16"
    return torch.amp.GradScaler(device.type, enabled=enabled)


class _LocalFeed:
    """Until fastfeed.prefetch lands: uint8 -> float in [0,1] on the device, one batch at a time, on
    the default stream (no overlap of the copy with compute)."""

    def __init__(self, loader, device: torch.device, dtype: torch.dtype):
        self.loader, self.device, self.dtype = loader, device, dtype

    def __len__(self):
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __iter__(self):
        from ..batch import Batch

        nb = self.device.type != "cpu"
        for images, targets in self.loader:
            images = images.to(self.device, non_blocking=nb).to(self.dtype).div_(255)
            yield Batch(images, targets.to(self.device, non_blocking=nb))

    def close(self) -> None:
        pass   # the loader belongs to the caller


def _device_batches(loader, device: torch.device, dtype: torch.dtype = torch.float32):
    """The loader's batches on `device`, images float in [0,1]: through fastfeed.prefetch's
    DevicePrefetcher (copies on a side stream, double-buffered) when it is there."""
    try:
        from ..prefetch import DevicePrefetcher
    except ImportError:
        log.debug("fastfeed.prefetch not available: copying batches on the default stream")
        return _LocalFeed(loader, device, dtype)
    return DevicePrefetcher(loader, device, depth=2, dtype=dtype)
