"""A worker's partner buffer and the batch's plans: the part of building a batch every planning loader shares
(docs/design.md, "Partners from a buffer, sized like Ultralytics'"). A batch is

    load every record of the batch (each appended to the buffer)     PartnerBuffer.load
    draw every sample's plan, partners indexed into the buffer        augment.draw_batch

so the plans are the same whatever the loader holds in the buffer (decoded images on the cpu, record indices
for the device planner); `history` gives a worker's buffer at any batch from the order alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from ..augment import AugmentHyp, SamplePlan, batch_rng, draw_batch


class PartnerBuffer:
    """The last `size` items `load(index, times)` returned (kept only when `keep`: training batches). `order(indices)`:
    the positions of a batch's indices in the order to load them (`Store.arrival`: as their shards arrive); they are
    kept in the batch's order whatever it is."""

    def __init__(self, size: int, load: Callable, keep: bool, order: Callable | None = None):
        self.items: deque = deque(maxlen=size)
        self._load, self.keep = load, keep
        self._order = order or (lambda indices: range(len(indices)))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, k: int):
        return self.items[k]

    def read(self, index: int, times: dict):
        """Record `index` loaded, not kept."""
        return self._load(int(index), times)

    def load(self, index: int, times: dict):
        item = self.read(index, times)
        if self.keep:
            self.items.append(item)
        return item

    def warm(self, indices, reset: bool) -> None:
        """Load `indices` into the buffer only (nothing is built): what resuming mid-run replays so the buffer
        holds what an uninterrupted run's would. `reset` empties it first."""
        if reset:
            self.items.clear()
        times = dict.fromkeys(("read", "decode"), 0.0)
        for index in indices:
            self.load(index, times)

    def plan_batch(self, indices, times: dict, *, seed: int, rank: int, epoch: int, batch: int, hyp: AugmentHyp,
                   size: int, augment: bool, mosaic_on: bool, mixup_on: bool) -> tuple[list, list[SamplePlan] | None]:
        """Load batch `batch` of `epoch` (the whole batch first: partners may be any of it), then draw its plans
        (None for evaluation batches, which draw nothing). Returns (the loaded items, the plans)."""
        loaded = [None] * len(indices)
        for p in self._order(indices):
            loaded[p] = self.read(indices[p], times)
        if self.keep:
            self.items.extend(loaded)
        if not augment:
            return loaded, None
        return loaded, draw_batch(batch_rng(seed, rank, epoch, batch), len(loaded), hyp, size, mosaic_on=mosaic_on,
                                  mixup_on=mixup_on, candidates=len(self.items))


def history(batches_of: Callable[[int], Sequence], epoch: int, before: int, worker: int, workers: int,
            size: int) -> np.ndarray:
    """The record indices in `worker`'s partner buffer (of `workers`; it builds batches worker, worker + workers,
    ...) once it has loaded every batch of `epoch` before batch `before`, oldest first, at most `size`: its own
    batches' records, earlier epochs' too, as `PartnerBuffer` keeps them. `batches_of(e)`: epoch e's batches
    (index arrays) in order. After loading batch k: `history(..., k + 1, k % workers, ...)`."""
    parts, need = [], size
    e, batches = epoch, batches_of(epoch)
    last = before - 1
    while need > 0 and e >= 0:
        j = last - ((last - worker) % workers)    # the last batch up to `last` that `worker` built
        while j >= 0 and need > 0:
            parts.append(np.asarray(batches[j], np.int64))
            need -= len(batches[j])
            j -= workers
        e -= 1
        if e >= 0 and need > 0:
            batches = batches_of(e)
            last = len(batches) - 1
    return np.concatenate(parts[::-1])[-size:] if parts else np.zeros(0, np.int64)
