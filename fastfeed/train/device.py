"""Mixed precision and batches on the device, for the trainer (devices themselves: fastfeed.devices)."""

from __future__ import annotations

from contextlib import nullcontext

import torch


class TrainError(RuntimeError):
    """Training cannot run as asked, or stopped (the message says why and what to do)."""


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, amp: str | None):
    """Mixed precision for the forward pass: convs and matmuls in bf16/fp16, while the parameters,
    BatchNorm's statistics and the loss stay fp32 (autocast casts per op; nothing is converted)."""
    if amp is None:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[amp])


def grad_scaler(device: torch.device, amp: str | None):
    """fp16 gradients underflow without loss scaling; bf16 has fp32's range and needs none."""
    return torch.amp.GradScaler(device.type, enabled=amp == "fp16")


def device_batches(loader, device: torch.device, dtype: torch.dtype = torch.float32, *, channels_last: bool = False):
    """The loader's batches on `device`, images float in [0,1]: copies on a side stream, double-buffered,
    in the channels-last layout if asked (a loader whose batches are already there, `loader.on_device`, is
    used as it is; the trainer lays those out itself). The device augmentation, if any, takes the loader's seed."""
    from ..prefetch import DevicePrefetcher

    if loader.on_device:
        return loader
    return DevicePrefetcher(loader, device, depth=2, dtype=dtype, channels_last=channels_last)
