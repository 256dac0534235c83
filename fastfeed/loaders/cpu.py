"""The `cpu` loader: worker processes decode from the store, apply YOLO augmentation, and write
whole batches into shared (pinned, when the batches are for a CUDA GPU) buffers."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from ..store.reader import Store
from .base import Batch, Loader, LoaderConfig, StageTimes, register_loader
from .pipeline import BatchBuilder, StoreSource
from .sampler import epoch_batches
from .workers import WorkerPool


@dataclass(frozen=True)
class CpuOptions:
    """The cpu loader's own options (also the shm loader's, which shares its workers).

    partner_buffer: mosaic partners come from this many recently loaded images per worker. None (the
    default) sizes it as Ultralytics does, min(images, 8 x batch_size, 1000). It costs that many
    decoded images per worker: about 0.9 MB each at imgsz 640 (a 640x480 photo), so ~120 MB per
    worker at batch 16, at most ~0.9 GB.
    """

    partner_buffer: int | None = None

    def __post_init__(self):
        pb = self.partner_buffer
        if pb is not None and (isinstance(pb, bool) or not isinstance(pb, int) or pb < 4):
            raise ValueError(f"option partner_buffer must be an integer >= 4 or None (automatic), got {pb!r}")

    def resolved(self, images: int, batch_size: int) -> CpuOptions:
        """These options with partner_buffer decided for a store of `images` and a batch of `batch_size`."""
        if self.partner_buffer is not None:
            return self
        return replace(self, partner_buffer=max(4, min(images, 8 * batch_size, 1000)))


def _store_builder(store: Store, cfg: LoaderConfig, rank: int, opts: CpuOptions) -> BatchBuilder:
    return BatchBuilder(StoreSource(store, cfg.imgsz), cfg, rank, opts.partner_buffer)


@dataclass
class _Epoch:
    """One epoch's batches (from `start` on), how many are queued, and the finished ones not yet handed out."""

    epoch: int
    batches: list
    mosaic: bool
    start: int = 0
    submitted: int = 0
    done: dict = field(default_factory=dict)

    def __post_init__(self):
        self.submitted = self.start


class PoolLoader(Loader):
    """Batches from `make_builder()`-built workers; subclasses choose the sample source.

    Batch k of an epoch is built by worker k % workers, whose mosaic partners are the images it
    loaded last. So that an epoch started anywhere (`set_epoch(e, start)`, a fresh pool on a later
    epoch, an abandoned epoch) gives the batches an uninterrupted run gives, the workers first
    *load* (no augmentation) the images their buffers would hold at that point: at most
    partner_buffer images per worker, whatever the number of batches skipped.
    """

    def __init__(self, store: Store, cfg: LoaderConfig, opts: CpuOptions, make_builder):
        super().__init__(store, cfg)
        self.opts = opts
        self._make_builder = make_builder
        self._pool: WorkerPool | None = None
        self._local = None          # workers == 0: (builder, buffer)
        self._times = StageTimes()
        self._finalizer = None
        self._active = False
        self._ahead: _Epoch | None = None   # the next epoch, already queued when this one ended
        self._pos: tuple[int, int] | None = (0, 0)   # where the workers' history continues (None: unknown)

    def stage_times(self) -> StageTimes:
        """A snapshot: per-stage seconds summed over workers since the loader was created."""
        return StageTimes(dict(self._times.seconds), self._times.samples)

    def memory_pids(self) -> list[int]:
        """Worker pids; empty until the first iteration starts the pool."""
        return self._pool.pids() if self._pool else []

    def _plan(self, epoch: int, start: int = 0) -> _Epoch:
        c = self.cfg
        batches = epoch_batches(len(self.store), c.batch_size, epoch=epoch, seed=c.seed, rank=self.rank,
                                world_size=self.world_size, shuffle=c.shuffle, drop_last=c.drop_last)
        return _Epoch(epoch, batches, c.mosaic_on(epoch), start)

    def _warm_plan(self, epoch: int, start: int, n_workers: int) -> list[list]:
        """Per worker, the batches (indices) before (epoch, start) whose images its partner buffer holds."""
        per_worker: list[list] = [[] for _ in range(n_workers)]
        if not self.cfg.augment:
            return per_worker
        need = [self.opts.partner_buffer] * n_workers
        e, batches, k = epoch, self._plan(epoch).batches, start
        while e >= 0 and any(n > 0 for n in need):
            for j in range(k - 1, -1, -1):
                w = j % n_workers
                if need[w] > 0:
                    per_worker[w].append(batches[j])
                    need[w] -= len(batches[j])
            e -= 1
            if e >= 0:
                batches = self._plan(e).batches
                k = len(batches)
        return [list(reversed(b)) for b in per_worker]

    def _advance(self, ep: _Epoch) -> None:
        """Record that batch ep.submitted of ep was handed to a worker."""
        k = ep.submitted + 1
        self._pos = (ep.epoch, k) if k < len(ep.batches) else (ep.epoch + 1, 0)

    def __iter__(self) -> Iterator[Batch]:
        if self.cfg.workers == 0:
            return self._iter_local()
        return self._iter_pool()

    def _iter_local(self) -> Iterator[Batch]:
        c = self.cfg
        if self._local is None:
            buf = torch.empty((c.batch_size, 3, c.imgsz, c.imgsz), dtype=torch.uint8)
            self._local = (self._make_builder(), buf.pin_memory() if c.pin() else buf)
        builder, buf = self._local
        ep = self._plan(self.epoch, self.start)
        if self._pos != (ep.epoch, ep.start):
            builder.warm([i for b in self._warm_plan(ep.epoch, ep.start, 1)[0] for i in b], reset=True)
        for k in range(ep.start, len(ep.batches)):
            indices = ep.batches[k]
            self._pos = None   # if building fails half-way, the partner buffer is unknown
            targets, times = builder.build(indices, ep.epoch, k, ep.mosaic, buf.numpy())
            ep.submitted = k
            self._advance(ep)
            self._times.add(times, len(indices))
            yield Batch(buf[:len(indices)], torch.from_numpy(targets))

    def _iter_pool(self) -> Iterator[Batch]:
        c = self.cfg
        if self._pool is None:
            self._pool = WorkerPool(c.workers, self._make_builder, (c.batch_size, 3, c.imgsz, c.imgsz),
                                    c.prefetch, c.timeout, pin=c.pin())
            self._finalizer = weakref.finalize(self, WorkerPool.close, self._pool)
        pool = self._pool
        cur, self._ahead = self._ahead, None
        if cur is None or cur.epoch != self.epoch or self.start or self._active:
            if pool.outstanding:    # abandoned epoch, or a set_epoch() other than the one queued: the
                pool.new_generation()   # workers still build what was queued (their history stays `_pos`)
            cur = self._plan(self.epoch, self.start)
            if self._pos != (cur.epoch, cur.start):
                for w, batches in enumerate(self._warm_plan(cur.epoch, cur.start, pool.n)):
                    pool.warm(w, cur.epoch, [i for b in batches for i in b])
                self._pos = (cur.epoch, cur.start)
        self._active = True
        nxt = None  # once this epoch is all queued, the workers go on with the next one
        held = None
        try:
            for k in range(cur.start, len(cur.batches)):
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
                    self._advance(ep)
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
        self._pos = (0, 0)   # a new pool starts with empty partner buffers


@register_loader("cpu", options=CpuOptions,
                 summary="worker processes decode JPEGs (DCT-scaled) and augment into shared batch buffers")
def create_cpu_loader(store: Store, cfg: LoaderConfig, opts: CpuOptions) -> PoolLoader:
    opts = opts.resolved(len(store), cfg.batch_size)
    rank, _ = cfg.resolved_rank()
    return PoolLoader(store, cfg, opts, partial(_store_builder, store, cfg, rank, opts))
