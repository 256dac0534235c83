"""The `shm` loader: the `cpu` loader's workers and augmentation, reading decoded images from the node's shm
cache (`fastfeed.cache`; docs/design.md, "The shm cache is one file per node") instead of decoding JPEGs.

A sample is a zero-copy view into the slab: the "read" stage is all there is, "decode" stays 0. With
`cache_partial`, records past the cached prefix are decoded from the store as the `cpu` loader does.
Options (`create_loader("shm", store, cfg, cache_dir=..., ...)`): see `ShmOptions`.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from functools import partial
from time import perf_counter

import numpy as np

from ..augment import Labels
from ..cache import CacheHandle, CacheLease, acquire
from ..checks import field_need, is_num
from ..store.reader import Store
from ..tasks import get as task_spec
from .base import LoaderConfig, check_epoch
from .pipeline import BatchBuilder, StoreSource
from .pool import CpuOptions, PoolLoader
from .registry import register_loader


@dataclass(frozen=True)
class ShmOptions(CpuOptions):
    """The shm loader's own options (and the cpu loader's partner_buffer)."""

    cache_dir: str = "/dev/shm"    # where the decoded-image cache lives (a tmpfs), shared node-wide
    cache_partial: bool = False    # if the cache does not fit, cache what fits and decode the rest
    cache_wait: float = 600.0      # seconds to wait for another process that is building the cache
    cache_keep: bool = False       # leave the cache for the next run (`fastfeed cache clear` removes it)

    def __post_init__(self):
        super().__post_init__()
        need = field_need(self, "shm option ")
        need(isinstance(self.cache_dir, (str, os.PathLike)) and os.fspath(self.cache_dir) != "", "cache_dir",
             "must be a directory path")
        object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        need(isinstance(self.cache_partial, bool), "cache_partial", "must be True or False")
        need(is_num(self.cache_wait) and self.cache_wait > 0, "cache_wait", "must be > 0 seconds")
        need(isinstance(self.cache_keep, bool), "cache_keep", "must be True or False")


class ShmSource:
    """`StoreSource.load()` from the shared cache: views into the slab, mapped on first use in
    each process; records past the cached prefix (a partial cache) fall back to the store. The cache holds
    pixels and boxes: a task's geometry (polygons, points) is read from the store's record, without its CRC
    check or a decode."""

    def __init__(self, handle: CacheHandle, store: Store, imgsz: int, task: str = "detect"):
        self.handle, self.task = handle, task
        self.n_cached = handle.header.n_cached
        self.fallback = StoreSource(store, imgsz, task)
        self.geometry = task_spec(task).field is not None

    def arrival(self, indices):
        """`StoreSource.arrival` where a load reads the store (a record past the cached prefix, or a task's
        geometry); else the batch's order."""
        if self.geometry or any(int(i) >= self.n_cached for i in indices):
            return self.fallback.arrival(indices)
        return range(len(indices))

    def load(self, index: int, times: dict) -> tuple[np.ndarray, Labels]:
        """(image HWC RGB, its `augment.Labels` in its pixels) of record `index`."""
        if index >= self.n_cached:
            return self.fallback.load(index, times)
        t0 = perf_counter()
        img, boxes, classes = self.handle.view().record(index)
        h, w = img.shape[:2]
        if self.geometry:
            labels = Labels.of_record(self.fallback.store.record(index, check_crc=False), w, h, self.task)
        else:
            labels = Labels(boxes * np.array([w, h, w, h], np.float32), classes)
        times["read"] += perf_counter() - t0
        return img, labels


def _shm_builder(handle: CacheHandle, store: Store, cfg: LoaderConfig, rank: int, opts: ShmOptions) -> BatchBuilder:
    return BatchBuilder(ShmSource(handle, store, cfg.imgsz, cfg.task), cfg, rank, opts.partner_buffer, store.manifest)


class ShmLoader(PoolLoader):
    """A `PoolLoader` over the shared cache; holds this process's lease on it until `close()`."""

    def __init__(self, store: Store, cfg: LoaderConfig, opts: ShmOptions, lease: CacheLease, rank: int, order=None):
        self.lease = lease
        self._handle = lease.handle()
        super().__init__(store, cfg, opts, partial(_shm_builder, self._handle, store, cfg, rank, opts), order=order)
        self._detach = weakref.finalize(self, lease.release)

    def shared_bytes(self) -> int:
        return self.lease.size

    def iter_batches(self):
        if not self._detach.alive:
            raise RuntimeError("this shm loader is closed (close() gave back its lease on the cache, which may be "
                               "gone): create a new loader to iterate again")
        return super().iter_batches()

    def close(self) -> None:
        super().close()
        self._handle.detach()
        self._detach()


def _no_shm() -> str | None:
    return None if os.path.isdir("/dev/shm") else "no /dev/shm here (give the cache_dir option a tmpfs folder)"


@register_loader("shm", options=ShmOptions, check=_no_shm,
                 summary="the cpu loader over one decoded-image cache in /dev/shm shared by every worker and rank")
def create_shm_loader(store: Store, cfg: LoaderConfig, opts: ShmOptions, order=None) -> ShmLoader:
    check_epoch(store, cfg)   # before building a cache for nothing
    cfg = cfg.for_store(store)
    opts = opts.resolved(len(store), cfg.batch_size)
    rank, _ = cfg.resolved_rank()
    lease = acquire(store, cfg.imgsz, opts.cache_dir, partial=opts.cache_partial, wait=opts.cache_wait,
                    keep=opts.cache_keep)
    try:
        return ShmLoader(store, cfg, opts, lease, rank, order)
    except BaseException:
        lease.release()
        raise
