"""Does a cache fit: free space in the cache directory and available RAM, against the bytes needed.

A tmpfs holds its files in RAM (or swap), so both limits apply: the filesystem's free space (its
`size=` mount option) and the RAM the machine can still give. RAM_HEADROOM of the available RAM is
left for the training processes themselves.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

import psutil

from ..store.remote.sizes import gib
from .users import CacheError

RAM_HEADROOM = 0.10


class CacheBudgetError(CacheError):
    """The cache does not fit in the cache directory or in RAM; the message gives the numbers."""


def free_bytes(cache_dir) -> int:
    """Bytes an unprivileged process can still write in `cache_dir` (statvfs)."""
    st = os.statvfs(cache_dir)
    return st.f_bavail * st.f_frsize


def available_ram() -> int:
    return psutil.virtual_memory().available


@dataclass(frozen=True)
class Budget:
    free: int          # bytes free in the cache directory
    ram: int           # bytes of RAM available

    @property
    def limit(self) -> int:
        return min(self.free, int(self.ram * (1 - RAM_HEADROOM)))

    def fits(self, needed: int) -> bool:
        return needed <= self.limit


def measure(cache_dir) -> Budget:
    return Budget(free_bytes(cache_dir), available_ram())


def too_big(needed: int, budget: Budget, cache_dir, imgsz: int, smaller: dict[int, int]) -> CacheBudgetError:
    """The error for a cache that does not fit: both numbers, and the ways out.

    `smaller` maps smaller imgsz values to the bytes their caches would need.
    """
    alternatives = ", ".join(f"{s}: {gib(b)}" for s, b in sorted(smaller.items(), reverse=True) if budget.fits(b))
    return CacheBudgetError(
        f"the shm cache needs {gib(needed)} ({needed} bytes) at imgsz {imgsz}, but {cache_dir} has {gib(budget.free)} "
        f"({budget.free} bytes) free and the machine {gib(budget.ram)} ({budget.ram} bytes) of RAM available "
        f"(the cache may use {1 - RAM_HEADROOM:.0%} of it). Options: a smaller imgsz"
        + (f" ({alternatives} would fit)" if alternatives else "")
        + "; a partial cache (the shm loader's option cache_partial=True, `fastfeed cache build --partial`) to cache "
          "the first images that fit and decode the rest on the fly; the `cpu` loader, which needs no cache; or a "
          f"larger tmpfs: {_remount(cache_dir, needed)}.")


def _remount(cache_dir, needed: int) -> str:
    """The command that makes the tmpfs `cache_dir` hold what it holds now and `needed` bytes more (10% spare)."""
    with contextlib.suppress(OSError):
        st = os.statvfs(cache_dir)
        needed += (st.f_blocks - st.f_bfree) * st.f_frsize
    return f"`sudo mount -o remount,size={math.ceil(needed / 2**30 * 1.1) or 1}G {cache_dir}` (RAM permitting)"


def disk_full(cache_dir, needed: int | None, e: OSError) -> CacheBudgetError:
    """The error for a cache directory that filled up while a slab was built (the partial slab removed)."""
    try:
        free = f"{gib(free_bytes(cache_dir))} free now"
    except OSError:
        free = "its free space unknown"
    return CacheBudgetError(
        f"the shm cache's filesystem {cache_dir} filled up while the cache was built ({e.strerror}; "
        + (f"the slab needs {gib(needed)} ({needed} bytes), " if needed else "")
        + f"{free}); the partial slab was removed. Free space there, use a smaller cache (a smaller imgsz, or "
          "cache_partial=True, `--partial`), point the shm loader's cache_dir (`--shm-dir`) at a larger tmpfs, "
          f"or enlarge it: {_remount(cache_dir, needed or 0)}")
