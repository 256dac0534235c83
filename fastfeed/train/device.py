"""Mixed precision and batches on the device, for the trainer (devices themselves: fastfeed.devices), and
--multi-scale: each optimizer step at its own square size drawn from (seed, step) only, the loader's batch resized
to it on the device (docs/training.md, `--multi-scale`: the range, why targets hold, the same on every rank)."""

from __future__ import annotations

import math
import random
from contextlib import nullcontext

import torch
import torch.nn.functional as F


class TrainError(RuntimeError):
    """Training cannot run as asked, or stopped (the message says why and what to do)."""


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, amp: str | None):
    """Mixed precision for the forward pass: convs and matmuls in bf16/fp16, while the parameters,
    BatchNorm's statistics and the loss stay fp32 (autocast casts per op; nothing is converted)."""
    if amp is None:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[amp])


def forward_loss(model, loss_fn, images, targets, *, device, amp):
    """Forward (under autocast) and the loss (in fp32): (loss to backward, detached [box, obj, cls])."""
    with autocast(device, amp):
        preds = model(images)
    return loss_fn(preds, targets)


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


LOW, HIGH = 0.5, 1.5


def size_range(imgsz: int, stride: int, low: float = LOW, high: float = HIGH) -> tuple[int, int]:
    """The smallest and largest multiple of `stride` within [low, high] x imgsz (at least one stride)."""
    lo = max(stride, math.ceil(low * imgsz / stride) * stride)
    return lo, max(lo, math.floor(high * imgsz / stride) * stride)


def step_size(seed: int, step: int, imgsz: int, stride: int, low: float = LOW, high: float = HIGH) -> int:
    """The training size of optimizer step `step`: uniform over the multiples of `stride` in range (`low`,
    `high`: Ultralytics' multi_scale m is 1 - m, 1 + m)."""
    lo, hi = size_range(imgsz, stride, low, high)
    return random.Random(f"fastfeed multi-scale {seed} {step}").randrange(lo, hi + 1, stride)


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """[B,3,S,S] float images -> [B,3,size,size], bilinear (antialiasing off, as YOLO trainers do), on
    their device and in their memory format; unchanged when already that size."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
