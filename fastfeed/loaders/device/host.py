"""The device loader's host side: the worker-pool loader (`pool.PoolLoader`, docs/design.md, 'One worker pool,
hooks instead of overrides'), with `plan.Planner` as the workers' builder and byte slots for the new records'
payloads. A `HostBatch`'s slot is valid until the next host batch is asked for, as are a segment store's overlap
masks beside it (rasterised by the planner into the pool's mask slot).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from ...store.reader import Store
from ..base import LoaderConfig
from ..pool import CpuOptions, PoolLoader
from .plan import SHIP_DECODED, SHIP_NONE, Plan, Planner


@dataclass
class HostBatch:
    slot: torch.Tensor       # uint8 [slot_bytes]: the payloads the plan's items point into
    plan: Plan
    indices: torch.Tensor    # int64 [B]: the batch's records
    masks: torch.Tensor | None = None   # a segment store's overlap masks: int16 [B, S/r, S/r], a view of the pool's slot


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


def _host_batch(slot: torch.Tensor, count: int, plan: Plan, indices: torch.Tensor) -> HostBatch:
    return HostBatch(slot, plan, indices)


class HostLoader(PoolLoader):
    """Plans (not images) from the worker pool; `ship` says what the workers send (plan.SHIP_*)."""

    def __init__(self, store: Store, cfg: LoaderConfig, opts: CpuOptions, ship: str, order=None):
        rank, _ = cfg.resolved_rank()
        super().__init__(store, cfg, opts, partial(_planner, store, cfg, rank, opts, ship), order=order,
                         slot_shape=(slot_bytes(store, cfg, ship),), pin=cfg.pin() and ship != SHIP_NONE,
                         make_batch=_host_batch)
        self.ship = ship
        self.slot_bytes = self.slot_shape[0]

    @property
    def device_hyp(self):
        return None   # the device loader does all the augmentation itself
