"""The `shm` loader: the `cpu` loader's workers and augmentation, reading decoded images from a cache
in shared memory instead of decoding JPEGs.

The cache (fastfeed.cache) is one segment per store and imgsz in `cfg.cache_dir` (/dev/shm), built
once by the first process that asks and mapped by every worker of every rank on the node, so the
node holds one copy however many processes read it. A sample is a zero-copy view into the segment:
the "read" stage is all there is, "decode" stays 0. With `cache_partial`, records past the cached
prefix are decoded from the store as the `cpu` loader does.
"""

from __future__ import annotations

import weakref
from functools import partial
from time import perf_counter

import numpy as np

from ..cache import CacheHandle, CacheLease, acquire
from ..store.reader import Store
from .base import LoaderConfig, register_loader
from .cpu import PoolLoader
from .pipeline import BatchBuilder, StoreSource


class ShmSource:
    """`StoreSource.load()` from the shared cache: views into the segment, mapped on first use in
    each process; records past the cached prefix (a partial cache) fall back to the store."""

    def __init__(self, handle: CacheHandle, store: Store, imgsz: int):
        self.handle = handle
        self.n_cached = handle.n_cached
        self.fallback = StoreSource(store, imgsz)

    def load(self, index: int, times: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(image HWC RGB, boxes normalised xyxy float32, classes int64) of record `index`."""
        if index >= self.n_cached:
            return self.fallback.load(index, times)
        t0 = perf_counter()
        sample = self.handle.view().record(index)
        times["read"] += perf_counter() - t0
        return sample


def _shm_builder(handle: CacheHandle, store: Store, cfg: LoaderConfig, rank: int) -> BatchBuilder:
    return BatchBuilder(ShmSource(handle, store, cfg.imgsz), cfg, rank)


class ShmLoader(PoolLoader):
    """A `PoolLoader` over the shared cache; holds this process's lease on it until `close()`."""

    def __init__(self, store: Store, cfg: LoaderConfig, lease: CacheLease, rank: int):
        self.cache = lease
        self._handle = lease.handle()
        super().__init__(store, cfg, partial(_shm_builder, self._handle, store, cfg, rank))
        self._detach = weakref.finalize(self, lease.release)

    def shared_bytes(self) -> int:
        return self.cache.size

    def close(self) -> None:
        super().close()
        self._handle.detach()
        self._detach()


@register_loader("shm")
def create_shm_loader(store: Store, cfg: LoaderConfig) -> ShmLoader:
    rank, _ = cfg.resolved_rank()
    lease = acquire(store, cfg.imgsz, cfg.cache_dir, partial=cfg.cache_partial, wait=cfg.cache_wait,
                    keep=cfg.cache_keep)
    try:
        return ShmLoader(store, cfg, lease, rank)
    except BaseException:
        lease.release()
        raise
