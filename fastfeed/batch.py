"""The `Batch` every loader yields and the prefetcher moves: torch only, so device code and a bare
GPU machine can use it without the loaders' dependencies (OpenCV, LMDB, ...)."""

from __future__ import annotations

import torch


class Batch:
    """images: uint8 [B,3,S,S] RGB, contiguous; targets: float32 [M,6] img_idx, cls, cx, cy, w, h (0..1,
    `augment.boxes.TARGET_COLUMNS`); indices: int64 [B], the store records of the batch's samples in batch order
    (sample j shows record indices[j]; None from a source that does not know them).

    It unpacks as the pair it always was (`images, targets = batch`, `batch[0]`, `len(batch) == 2`); the
    record indices are an attribute. Valid until the next batch is requested: loaders reuse their
    (shared, maybe pinned) buffers.
    """

    __slots__ = ("images", "targets", "indices")

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor | None = None):
        self.images, self.targets = images, targets
        if indices is not None and not isinstance(indices, torch.Tensor):
            indices = torch.as_tensor(indices, dtype=torch.int64)
        self.indices = indices

    def __iter__(self):
        yield self.images
        yield self.targets

    def __len__(self) -> int:
        return 2

    def __getitem__(self, k):
        return (self.images, self.targets)[k]

    def __repr__(self) -> str:
        n = "?" if self.indices is None else len(self.indices)
        return f"Batch(images={tuple(self.images.shape)}, targets={tuple(self.targets.shape)}, indices=[{n}])"

    def with_tensors(self, images: torch.Tensor, targets: torch.Tensor) -> Batch:
        """The same samples (indices) with new tensors: what a prefetcher hands out after moving a batch."""
        return Batch(images, targets, self.indices)
