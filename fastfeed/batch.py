"""The `Batch` every loader yields and the prefetcher moves, and `BatchFeed`, what a fastfeed loader declares to
whoever moves its batches: torch only, so device code and a bare GPU machine can use them without the loaders'
dependencies (OpenCV, LMDB, ...), and the prefetcher without importing the loaders."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

EXTRAS = ("masks", "keypoints", "rboxes")   # a task's geometry beside the boxes, rows in the order of targets


class Batch:
    """images: uint8 [B,3,S,S] RGB, contiguous; targets: float32 [M,6] img_idx, cls, cx, cy, w, h (0..1,
    `augment.boxes.TARGET_COLUMNS`); indices: int64 [B], the store records of the batch's samples in batch order
    (sample j shows record indices[j]; None from a source that does not know them).

    A segment, pose or OBB store's batches carry its geometry too (None otherwise), rows in targets' order:
    masks: int16 [B, S/r, S/r] (overlap_mask: value j+1 where the image's j-th targets row is) or uint8
    [M, S/r, S/r] (one 0/1 mask per targets row), r = LoaderConfig.mask_ratio; keypoints: float32 [M,K,3] x, y
    normalised to the S x S image, visibility, 0, 0, 0 outside it; rboxes: float32 [M,5] cx, cy, w, h
    normalised, angle in radians. `extras()` gives those present.

    It unpacks as the pair it always was (`images, targets = batch`, `batch[0]`, `len(batch) == 2`); the
    record indices and the extras are attributes. Valid until the next batch is requested: loaders reuse their
    (shared, maybe pinned) buffers.
    """

    __slots__ = ("images", "targets", "indices", *EXTRAS)

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor | None = None, *,
                 masks: torch.Tensor | None = None, keypoints: torch.Tensor | None = None,
                 rboxes: torch.Tensor | None = None):
        self.images, self.targets = images, targets
        if indices is not None and not isinstance(indices, torch.Tensor):
            indices = torch.as_tensor(indices, dtype=torch.int64)
        self.indices = indices
        self.masks, self.keypoints, self.rboxes = masks, keypoints, rboxes

    def __iter__(self):
        yield self.images
        yield self.targets

    def __len__(self) -> int:
        return 2

    def __getitem__(self, k):
        return (self.images, self.targets)[k]

    def extras(self) -> dict[str, torch.Tensor]:
        """The task geometry this batch carries ({} for a detection batch): name -> tensor."""
        return {k: getattr(self, k) for k in EXTRAS if getattr(self, k) is not None}

    def __repr__(self) -> str:
        n = "?" if self.indices is None else len(self.indices)
        extra = "".join(f", {k}={tuple(v.shape)}" for k, v in self.extras().items())
        return f"Batch(images={tuple(self.images.shape)}, targets={tuple(self.targets.shape)}, indices=[{n}]{extra})"


class BatchFeed(ABC):
    """What a fastfeed loader (`loaders.base.Loader`) declares to whoever moves its batches (the DevicePrefetcher),
    beyond being an iterable of `Batch`es with a `len()`: `rank` (a device augmentation's draws are keyed by it),
    `on_device` (its batches are already on `cfg.device`: nothing to move), `device_hyp` (the gains whose HSV jitter
    and flip it leaves to the device, else None), `cfg` (`hyp`, `augment`, `device`) and `set_epoch(epoch, start)`
    (a `start` > 0 skips batches without building them; `epoch` and `start` say what was set last: its next
    iteration), `state_dict(epoch=None, batches=None)` / `load_state_dict(state)` (its position: by default after
    the last batch its iterator yielded). Any other iterable of batches declares none of these."""

    rank: int = 0
    epoch: int = 0
    start: int = 0
    #: True for a loader whose batches are already on `cfg.device`, images float in [0,1] (it does what the
    #: DevicePrefetcher does itself): iterate it directly. False: uint8 host batches, for a DevicePrefetcher.
    on_device: bool = False

    @property
    @abstractmethod
    def device_hyp(self):
        """The `AugmentHyp` whose HSV jitter and flip this feed leaves to the device, else None."""

    @abstractmethod
    def set_epoch(self, epoch: int, start: int = 0) -> None: ...


def counted(it, owner, attr: str):
    """`it`'s items, `owner.<attr>` counting each as it is handed out (before the yield); closing this closes `it`."""
    try:
        for item in it:
            setattr(owner, attr, getattr(owner, attr) + 1)
            yield item
    finally:
        close(it)


def close(it) -> None:
    """Close an iterator that can be closed (a generator: its `finally` runs now)."""
    if hasattr(it, "close"):
        it.close()
