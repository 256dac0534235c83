"""The `cpu` loader: worker processes decode from the store, apply YOLO augmentation, and write
whole batches into shared (pinned, when an accelerator is present) buffers."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

import torch

from ..store.reader import Store
from .base import Batch, Loader, LoaderConfig, StageTimes, register_loader
from .pipeline import BatchBuilder, StoreSource
from .sampler import batches_per_epoch, epoch_batches
from .workers import WorkerPool


def _store_builder(store: Store, cfg: LoaderConfig, rank: int) -> BatchBuilder:
    return BatchBuilder(StoreSource(store, cfg.imgsz), cfg, rank)


@dataclass
class _Epoch:
    """One epoch's batches, how many are queued, and the finished ones not yet handed out."""

    epoch: int
    batches: list
    mosaic: bool
    submitted: int = 0
    done: dict = field(default_factory=dict)


class PoolLoader(Loader):
    """Batches from `make_builder()`-built workers; subclasses choose the sample source."""

    def __init__(self, store: Store, cfg: LoaderConfig, make_builder):
        self.store, self.cfg = store, cfg
        self.rank, self.world_size = cfg.resolved_rank()
        self.epoch = 0
        self._make_builder = make_builder
        self._pool: WorkerPool | None = None
        self._local = None          # workers == 0: (builder, buffer)
        self._times = StageTimes()
        self._finalizer = None
        self._active = False
        self._ahead: _Epoch | None = None   # the next epoch, already queued when this one ended

    def __len__(self) -> int:
        return batches_per_epoch(len(self.store), self.cfg.batch_size, self.world_size, self.cfg.drop_last)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def stage_times(self) -> StageTimes:
        """A snapshot: per-stage seconds summed over workers since the loader was created."""
        return StageTimes(dict(self._times.seconds), self._times.samples)

    def memory_pids(self) -> list[int]:
        """Worker pids; empty until the first iteration starts the pool."""
        return self._pool.pids() if self._pool else []

    def _pin(self) -> bool:
        if self.cfg.pin_memory is not None:
            return self.cfg.pin_memory
        return torch.cuda.is_available()

    def __iter__(self) -> Iterator[Batch]:
        if self.cfg.workers == 0:
            return self._iter_local()
        return self._iter_pool()

    def _iter_local(self) -> Iterator[Batch]:
        c = self.cfg
        if self._local is None:
            buf = torch.empty((c.batch_size, 3, c.imgsz, c.imgsz), dtype=torch.uint8)
            self._local = (self._make_builder(), buf.pin_memory() if self._pin() else buf)
        builder, buf = self._local
        ep = self._plan(self.epoch)
        for k, indices in enumerate(ep.batches):
            targets, times = builder.build(indices, ep.epoch, k, ep.mosaic, buf.numpy())
            self._times.add(times, len(indices))
            yield Batch(buf[:len(indices)], torch.from_numpy(targets))

    def _plan(self, epoch: int) -> _Epoch:
        c = self.cfg
        batches = epoch_batches(len(self.store), c.batch_size, epoch=epoch, seed=c.seed, rank=self.rank,
                                world_size=self.world_size, shuffle=c.shuffle, drop_last=c.drop_last)
        return _Epoch(epoch, batches, c.mosaic_on(epoch))

    def _iter_pool(self) -> Iterator[Batch]:
        c = self.cfg
        if self._pool is None:
            self._pool = WorkerPool(c.workers, self._make_builder, (c.batch_size, 3, c.imgsz, c.imgsz),
                                    c.prefetch, c.timeout, pin=self._pin())
            self._finalizer = weakref.finalize(self, WorkerPool.close, self._pool)
        pool = self._pool
        cur, self._ahead = self._ahead, None
        if cur is None or cur.epoch != self.epoch or self._active:
            if pool.outstanding:
                pool.new_generation()   # abandoned epoch, or a set_epoch() other than the one queued
            cur = self._plan(self.epoch)
        self._active = True
        nxt = None  # once this epoch is all queued, the workers go on with the next one
        held = None
        try:
            for k in range(len(cur.batches)):
                if held is not None:      # the consumer asked for batch k: batch k-1's slot is free again
                    pool.release(held)
                    held = None
                while True:
                    if cur.submitted < len(cur.batches):
                        ep = cur
                    else:
                        nxt = nxt or self._plan(cur.epoch + 1)
                        ep = nxt
                    if ep.submitted >= len(ep.batches) or not pool.submit(ep.epoch, ep.submitted,
                                                                          ep.batches[ep.submitted], ep.mosaic):
                        break
                    ep.submitted += 1
                while k not in cur.done:
                    (epoch, j), slot, targets, times, count = pool.next_result()
                    (cur if epoch == cur.epoch else nxt).done[j] = (slot, targets, count)
                    self._times.add(times, count)
                slot, targets, count = cur.done.pop(k)
                held = slot
                yield Batch(pool.slots[slot, :count], torch.from_numpy(targets))
            if held is not None:
                pool.release(held)
            self._active = False
            self._ahead = nxt
        except GeneratorExit:
            raise          # abandoned mid-epoch: the next iteration drains what is still in flight
        except BaseException:
            self.close()   # a failed pool is not reused: the error reaches the consumer, nothing hangs
            raise

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._pool = None
        self._local = None
        self._ahead = None


@register_loader("cpu")
def create_cpu_loader(store: Store, cfg: LoaderConfig) -> PoolLoader:
    rank, _ = cfg.resolved_rank()
    return PoolLoader(store, cfg, partial(_store_builder, store, cfg, rank))
