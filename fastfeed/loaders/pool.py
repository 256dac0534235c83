"""`PoolLoader`: the worker-pool loader the cpu, shm and device loaders share (docs/design.md, "One worker pool,
hooks instead of overrides", and "Whole batches into shared slots" for batch k on worker k % W). The `cpu` loader is
the pool with `pipeline.BatchBuilder` over the store as each worker's builder: workers decode from the store, apply
YOLO augmentation, and write whole batches into shared (pinned, when for a CUDA GPU) buffers.

What differs between the loaders is given, not overridden: `make_builder` (called once in each worker),
`slot_shape` (uint8 shape of one slot: an image batch, or a byte buffer of payloads), `pin`, and
`make_batch(slot, count, result, indices)`, which turns a finished slot and what the builder returned
into what the iteration yields. An epoch started anywhere first has the workers *load* (no augmentation)
the records their partner buffers would hold there (`partners.history`: at most partner_buffer per worker).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from ..augment.masks import mask_side
from ..checks import is_int, need
from ..tasks import get as task_spec
from .base import Batch, Loader, LoaderConfig
from .partners import history
from .pipeline import BatchBuilder, StoreSource
from .registry import register_loader
from .renders import CPU
from .sampler import EpochOrder
from .workers import WorkerPool


@dataclass(frozen=True)
class CpuOptions:
    """The pool loaders' shared option (the cpu loader's own; shm and device extend it).

    partner_buffer: mosaic partners come from this many recently loaded images per worker. None (the
    default) sizes it as Ultralytics does, min(images, 8 x batch_size, 1000). It costs that many
    decoded images per worker: about 0.9 MB each at imgsz 640 (a 640x480 photo), so ~120 MB per
    worker at batch 16, at most ~0.9 GB.
    """

    partner_buffer: int | None = None

    def __post_init__(self):
        pb = self.partner_buffer
        need(pb is None or (is_int(pb) and pb >= 4), "option partner_buffer", "must be an integer >= 4 or None "
             "(automatic)", pb)
        object.__setattr__(self, "partner_buffer", None if pb is None else int(pb))   # a numpy integer too

    def resolved(self, images: int, batch_size: int) -> CpuOptions:
        """These options with partner_buffer decided for a store of `images` and a batch of `batch_size`."""
        auto = max(4, min(images, 8 * batch_size, 1000))
        return self if self.partner_buffer is not None else replace(self, partner_buffer=auto)


def image_batch(slot: torch.Tensor, count: int, result, indices) -> Batch:
    """The cpu and shm loaders' batch: the slot's first `count` images, the targets and extras the builder returned
    (`pipeline.BatchBuilder.build`: (targets, extras), numpy arrays)."""
    targets, extras = result
    return Batch(slot[:count], torch.from_numpy(targets), indices, **{k: torch.from_numpy(v) for k, v in extras.items()})


def mask_slot_shape(task: str, cfg: LoaderConfig) -> tuple | None:
    """[B, S/r, S/r]: the shared int16 mask slot of a segment store's batch with overlap_mask, else None."""
    if task_spec(task).extra != "masks" or not cfg.overlap_mask:
        return None
    side = mask_side(cfg.imgsz, cfg.mask_ratio)
    return cfg.batch_size, side, side


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

    @property
    def queued(self) -> bool:
        return self.submitted >= len(self.batches)


class PoolLoader(Loader):
    """Batches built by `make_builder()`-built workers into shared slots (see the module docstring)."""

    renders = CPU

    def __init__(self, store, cfg: LoaderConfig, opts: CpuOptions, make_builder: Callable, *,
                 order: EpochOrder | None = None, slot_shape: tuple | None = None, pin: bool | None = None,
                 make_batch: Callable = image_batch):
        super().__init__(store, cfg, order)
        self.opts = opts
        self.make_builder = make_builder
        self.slot_shape = tuple(slot_shape) if slot_shape is not None else (cfg.batch_size, 3, cfg.imgsz, cfg.imgsz)
        self.pin = cfg.pin() if pin is None else bool(pin)
        self.make_batch = make_batch
        self.mask_shape = mask_slot_shape(self.task, cfg)   # overlap masks: a shared int16 slot beside each image slot
        self._pool: WorkerPool | None = None
        self._local = None          # workers == 0: (builder, slot)
        self._finalizer = None
        self._active = False
        self._ahead: _Epoch | None = None   # the next epoch, already queued when this one ended
        self._pos: tuple[int, int] | None = (0, 0)   # where the workers' history continues (None: unknown)

    @property
    def pool(self) -> WorkerPool | None:
        """The running worker pool (None before the first iteration, with workers=0, after close)."""
        return self._pool

    def memory_pids(self) -> list[int]:
        """Worker pids; empty until the first iteration starts the pool."""
        return self._pool.pids() if self._pool else []

    def use_order(self, order) -> None:
        super().use_order(order)
        self._ahead, self._pos = None, None   # nothing queued from the old order; the partner buffers are replayed

    def _plan(self, epoch: int, start: int = 0) -> _Epoch:
        return _Epoch(epoch, self.order.batches(epoch), self.cfg.mosaic_on(epoch), start)

    def _history(self, epoch: int, start: int, workers: int) -> list:
        """Per worker, the records its partner buffer holds just before batch `start` of `epoch`."""
        if not self.cfg.augment:
            return [[] for _ in range(workers)]
        return [history(self.order.batches, epoch, start, w, workers, self.opts.partner_buffer) for w in range(workers)]

    def _advance(self, ep: _Epoch) -> None:
        """Record that batch ep.submitted of ep was handed to a worker."""
        k = ep.submitted + 1
        self._pos = (ep.epoch, k) if k < len(ep.batches) else (ep.epoch + 1, 0)

    def iter_batches(self) -> Iterator:
        return self._iter_local() if self.cfg.workers == 0 else self._iter_pool()

    def _iter_local(self) -> Iterator:
        if self._local is None:
            slot = torch.empty(self.slot_shape, dtype=torch.uint8)
            masks = torch.zeros(self.mask_shape, dtype=torch.int16) if self.mask_shape else None
            if self.pin:
                slot, masks = slot.pin_memory(), (masks.pin_memory() if masks is not None else None)
            self._local = (self.make_builder(), slot, masks)
        builder, slot, masks = self._local
        out = (slot.numpy(),) if masks is None else (slot.numpy(), masks.numpy())
        ep = self._plan(self.epoch, self.start)
        if self._pos != (ep.epoch, ep.start):
            builder.warm(self._history(ep.epoch, ep.start, 1)[0], reset=True)
        for k in range(ep.start, len(ep.batches)):
            indices = ep.batches[k]
            self.order.reached(ep.epoch, k)
            self._pos = None   # if building fails half-way, the partner buffer is unknown
            result, times = builder.build(indices, ep.epoch, k, ep.mosaic, *out)
            ep.submitted = k
            self._advance(ep)
            self._times.add(times, len(indices))
            yield self._batch(slot, masks, len(indices), result, indices)

    def _batch(self, slot: torch.Tensor, masks: torch.Tensor | None, count: int, result, indices) -> Batch:
        batch = self.make_batch(slot, count, result, torch.from_numpy(indices))
        if masks is not None:
            batch.masks = masks[:count]
        return batch

    def _start_pool(self) -> WorkerPool:
        if self._pool is None:
            c = self.cfg
            self._pool = WorkerPool(c.workers, self.make_builder, self.slot_shape, c.batches_ahead, c.timeout, pin=self.pin,
                                    mask_shape=self.mask_shape)
            self._finalizer = weakref.finalize(self, WorkerPool.close, self._pool)
        return self._pool

    def _begin(self, pool: WorkerPool) -> _Epoch:
        """The epoch to iterate now: the one already queued when it is the one asked for, else a fresh plan
        (what an abandoned epoch left in flight is discarded, the partner buffers replayed when needed)."""
        cur, self._ahead = self._ahead, None
        if cur is None or cur.epoch != self.epoch or self.start or self._active:
            if pool.outstanding:    # abandoned epoch, or a set_epoch() other than the one queued: the
                pool.new_generation()   # workers still build what was queued (their history stays `_pos`)
            cur = self._plan(self.epoch, self.start)
            self.order.reached(cur.epoch, cur.start)   # before the partner buffers' replay reads
            if self._pos != (cur.epoch, cur.start):
                for w, records in enumerate(self._history(cur.epoch, cur.start, pool.n)):
                    pool.warm(w, cur.epoch, records)
                self._pos = (cur.epoch, cur.start)
        return cur

    def _submit(self, pool: WorkerPool, cur: _Epoch, nxt: _Epoch | None) -> _Epoch | None:
        """Queue batches while slots are free: the rest of `cur`, then the next epoch (returned, planned on
        first need)."""
        while True:
            if cur.queued:
                nxt = nxt or self._plan(cur.epoch + 1)
            ep = nxt if cur.queued else cur
            if ep.queued or not pool.free:
                return nxt
            self.order.reached(ep.epoch, ep.submitted)   # a shard cache following the order pins and reads ahead
            pool.submit(ep.epoch, ep.submitted, ep.batches[ep.submitted], ep.mosaic)
            self._advance(ep)
            ep.submitted += 1

    def _iter_pool(self) -> Iterator:
        if self._pool is None:   # a shard cache following the order starts the first downloads while workers start
            self.order.reached(self.epoch, self.start)
        pool = self._start_pool()
        cur = self._begin(pool)
        self._active = True
        nxt = held = None  # nxt: once this epoch is all queued, the workers go on with the next one
        try:
            for k in range(cur.start, len(cur.batches)):
                if held is not None:      # the consumer asked for batch k: batch k-1's slot is free again
                    pool.release(held)
                    held = None
                nxt = self._submit(pool, cur, nxt)
                while k not in cur.done:
                    (epoch, j), slot, result, times, count = pool.next_result()
                    (cur if epoch == cur.epoch else nxt).done[j] = (slot, result, count)
                    self._times.add(times, count)
                held, result, count = cur.done.pop(k)   # its slot, released when the next batch is asked for
                yield self._batch(pool.slots[held], None if pool.masks is None else pool.masks[held], count, result,
                                  cur.batches[k])
            if held is not None:
                pool.release(held)
            self._active = False
            self._ahead = nxt
        except GeneratorExit:
            raise          # abandoned mid-epoch: the next iteration drains what is still in flight
        except BaseException:
            PoolLoader.close(self)   # a failed pool is not reused (the next iteration starts another; an shm
            raise                    # loader keeps its cache lease): the error reaches the consumer, nothing hangs

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._pool = self._local = self._ahead = None
        self._pos = (0, 0)   # a new pool starts with empty partner buffers


def _store_builder(store, cfg: LoaderConfig, rank: int, opts: CpuOptions) -> BatchBuilder:
    return BatchBuilder(StoreSource(store, cfg.imgsz, cfg.task), cfg, rank, opts.partner_buffer, store.manifest)


@register_loader("cpu", options=CpuOptions,
                 summary="worker processes decode JPEGs (DCT-scaled) and augment into shared batch buffers")
def create_cpu_loader(store, cfg: LoaderConfig, opts: CpuOptions, order=None) -> PoolLoader:
    cfg = cfg.for_store(store)   # what the workers build with (a pose store without flip_idx does not flip)
    opts = opts.resolved(len(store), cfg.batch_size)
    rank, _ = cfg.resolved_rank()
    return PoolLoader(store, cfg, opts, partial(_store_builder, store, cfg, rank, opts), order=order)
