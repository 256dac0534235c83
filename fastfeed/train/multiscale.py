"""--multi-scale: each optimizer step at its own square size drawn from (seed, step) only, the loader's batch resized
to it on the device (docs/training.md, `--multi-scale`: the range, why targets hold, the same on every rank)."""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

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
