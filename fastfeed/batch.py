"""The `Batch` every loader yields and the prefetcher moves: torch only, so device code and a bare
GPU machine can use it without the loaders' dependencies (OpenCV, LMDB, ...)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Batch(NamedTuple):
    """images: uint8 [B,3,S,S] RGB, contiguous; targets: float32 [M,6] img_idx, cls, cx, cy, w, h (0..1).

    Valid until the next batch is requested: loaders reuse their (shared, maybe pinned) buffers.
    """

    images: torch.Tensor
    targets: torch.Tensor
