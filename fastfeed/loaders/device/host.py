"""The device loader's host side: the cpu loader's worker pool and epoch bookkeeping (`PoolLoader`:
batch k to worker k % W, partner buffers replayed on resume, the next epoch queued while one drains,
worker failures as `WorkerError`), with `plan.Planner` as the workers' builder.

A host batch is Batch(the first bytes of the batch's shared slot, the pickled `Plan`): `slot_of` gives
the whole slot, which holds the new records' payloads (JPEG bytes or pixels, see plan.py) and stays
valid until the next host batch is asked for.
"""

from __future__ import annotations

import weakref
from functools import partial

import torch

from ...store.reader import Store
from ..base import LoaderConfig
from ..cpu import CpuOptions, PoolLoader
from ..workers import WorkerPool
from .plan import SHIP_DECODED, SHIP_NONE, Planner


def slot_bytes(store: Store, cfg: LoaderConfig, ship: str) -> int:
    """Bytes of one batch's slot: what a batch's payloads take, with room to spare. A batch that needs more
    sends the rest through the result queue (correct, a little slower)."""
    b, s = cfg.batch_size, cfg.imgsz
    if ship == SHIP_NONE:
        return 64
    raw = store.manifest.store_mode == "raw"
    if ship == SHIP_DECODED and not raw:   # pixels at the decoded size: about imgsz^2 x 3 at most, as the cpu loader's
        return b * 3 * s * s
    total = store.manifest.stats.get("record_bytes") or sum(sh.bytes for sh in store.shards)
    per = int(total / max(len(store), 1) * (1.25 if raw else 2.0))   # raw pixels, or JPEG bytes
    return b * max(per, 64 << 10)


def _planner(store: Store, cfg: LoaderConfig, rank: int, opts: CpuOptions, ship: str) -> Planner:
    return Planner(store, cfg, rank, opts.partner_buffer, ship)


class HostLoader(PoolLoader):
    """Plans (not images) from the worker pool; `ship` says what the workers send (plan.SHIP_*)."""

    def __init__(self, store: Store, cfg: LoaderConfig, opts: CpuOptions, ship: str):
        rank, _ = cfg.resolved_rank()
        super().__init__(store, cfg, opts, partial(_planner, store, cfg, rank, opts, ship))
        self.ship = ship
        self.slot_bytes = slot_bytes(store, cfg, ship)
        self.pinned = cfg.pin() and ship != SHIP_NONE

    @property
    def device_hyp(self):
        return None   # the device loader does all the augmentation itself

    def _iter_local(self):
        if self._local is None:    # one slot in this process instead of the cpu loader's image buffer
            buf = torch.empty(self.slot_bytes, dtype=torch.uint8)
            self._local = (self._make_builder(), buf.pin_memory() if self.pinned else buf)
        return super()._iter_local()

    def _iter_pool(self):
        if self._pool is None:     # slots of payload bytes instead of the cpu loader's image slots
            c = self.cfg
            self._pool = WorkerPool(c.workers, self._make_builder, (self.slot_bytes,), c.prefetch, c.timeout,
                                    pin=self.pinned)
            self._finalizer = weakref.finalize(self, WorkerPool.close, self._pool)
        return super()._iter_pool()

    def slot_of(self, head: torch.Tensor) -> torch.Tensor:
        """The whole slot of which a host batch's `images` are the first bytes."""
        return head.as_strided((self.slot_bytes,), (1,))
