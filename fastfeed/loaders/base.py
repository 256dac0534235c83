"""The loader contract: `Batch`, `LoaderConfig`, the `Loader` interface and the registry."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace

import torch

from ..augment import AugmentHyp
from ..batch import Batch

STAGES = ("read", "decode", "augment", "collate")


@dataclass
class StageTimes:
    """Seconds spent per stage, summed over every worker, and the samples they produced."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    samples: int = 0

    def add(self, seconds: dict[str, float], samples: int) -> None:
        for k, v in seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v
        self.samples += samples

    def per_sample_ms(self) -> dict[str, float]:
        n = max(self.samples, 1)
        return {k: 1e3 * v / n for k, v in self.seconds.items()}


def _default_workers() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, 8))


@dataclass
class LoaderConfig:
    """What every loader accepts. Invalid values raise ValueError naming the field."""

    imgsz: int = 640                 # output side S (a multiple of 32)
    batch_size: int = 16
    workers: int = field(default_factory=_default_workers)
    augment: bool = True             # False: letterboxed evaluation batches
    seed: int = 0
    rank: int | None = None          # None: from torch.distributed when initialised, else 0
    world_size: int | None = None
    shuffle: bool = True
    drop_last: bool = True
    epochs: int | None = None        # with close_mosaic: when to switch mosaic off
    close_mosaic: int = 0            # the last N epochs train on plain (non-mosaic) samples
    hyp: AugmentHyp = field(default_factory=AugmentHyp)
    prefetch: int = 2                # batches in flight per worker
    pin_memory: bool | None = None   # None: when an accelerator is present
    partner_buffer: int = 64         # mosaic partners come from this many recent images per worker
    device_augment: bool = False     # leave HSV jitter and the horizontal flip to the DevicePrefetcher
    timeout: float = 300.0           # seconds without a batch before a worker counts as hung
    cache_dir: str = "/dev/shm"      # shm: where the decoded-image cache lives (a tmpfs), shared node-wide
    cache_partial: bool = False      # shm: if the cache does not fit, cache what fits and decode the rest
    cache_wait: float = 600.0        # shm: seconds to wait for another process that is building the cache
    cache_keep: bool = False         # shm: leave the cache for the next run (`fastfeed cache clear` removes it)

    def __post_init__(self):
        def need(ok: bool, name: str, rule: str):
            if not ok:
                raise ValueError(f"LoaderConfig.{name} {rule}, got {getattr(self, name)!r}")

        need(isinstance(self.imgsz, int) and self.imgsz >= 32 and self.imgsz % 32 == 0, "imgsz",
             "must be a positive multiple of 32")
        need(isinstance(self.batch_size, int) and self.batch_size >= 1, "batch_size", "must be >= 1")
        need(isinstance(self.workers, int) and self.workers >= 0, "workers", "must be >= 0 (0: in the main process)")
        need(isinstance(self.prefetch, int) and self.prefetch >= 1, "prefetch", "must be >= 1")
        need(self.world_size is None or (isinstance(self.world_size, int) and self.world_size >= 1),
             "world_size", "must be >= 1")
        need(self.rank is None or (isinstance(self.rank, int) and 0 <= self.rank < (self.world_size or 1)),
             "rank", f"must be in 0..world_size-1 (world_size {self.world_size})")
        need(isinstance(self.close_mosaic, int) and self.close_mosaic >= 0, "close_mosaic", "must be >= 0")
        need(self.epochs is None or (isinstance(self.epochs, int) and self.epochs >= 1), "epochs", "must be >= 1")
        need(isinstance(self.partner_buffer, int) and self.partner_buffer >= 4, "partner_buffer", "must be >= 4")
        need(self.timeout > 0, "timeout", "must be > 0")
        need(isinstance(self.hyp, AugmentHyp), "hyp", "must be an AugmentHyp")
        need(isinstance(self.cache_dir, (str, os.PathLike)) and os.fspath(self.cache_dir) != "", "cache_dir",
             "must be a directory path")
        self.cache_dir = os.fspath(self.cache_dir)
        need(isinstance(self.cache_partial, bool), "cache_partial", "must be True or False")
        need(isinstance(self.cache_wait, (int, float)) and not isinstance(self.cache_wait, bool) and self.cache_wait > 0,
             "cache_wait", "must be > 0 seconds")
        need(isinstance(self.cache_keep, bool), "cache_keep", "must be True or False")

    def worker_hyp(self) -> AugmentHyp:
        """The augmentation the workers apply: all of `hyp`, or without what the device will do."""
        if not self.device_augment:
            return self.hyp
        return replace(self.hyp, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)

    def resolved_rank(self) -> tuple[int, int]:
        """(rank, world_size): from the config, else from torch.distributed, else (0, 1)."""
        if self.world_size is not None:
            return self.rank or 0, self.world_size
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1

    def mosaic_on(self, epoch: int) -> bool:
        if not self.augment or self.hyp.mosaic <= 0:
            return False
        return not (self.close_mosaic and self.epochs and epoch >= self.epochs - self.close_mosaic)

    def to_dict(self) -> dict:
        return {f.name: (getattr(self, f.name).__dict__ if f.name == "hyp" else getattr(self, f.name))
                for f in fields(self)}


class Loader(ABC):
    """An iterable of `Batch` over one rank's share of an epoch."""

    @abstractmethod
    def __iter__(self) -> Iterator[Batch]: ...

    @abstractmethod
    def __len__(self) -> int:
        """Batches per epoch for this rank."""

    @abstractmethod
    def set_epoch(self, epoch: int) -> None:
        """Reshuffle (and apply close_mosaic) for `epoch`; call before iterating it."""

    @abstractmethod
    def close(self) -> None:
        """Stop workers and free shared buffers; idempotent."""

    def stage_times(self) -> StageTimes:
        """Per-stage seconds summed over workers since creation (what `fastfeed bench` reports)."""
        return StageTimes()

    def memory_pids(self) -> list[int]:
        """Processes whose memory belongs to this loader (its workers), for the bench's RSS figure."""
        return []

    def shared_bytes(self) -> int:
        """Bytes of any shared cache this loader maps (0 when none)."""
        return 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- registry -------------------------------------------------------------------------------------

_LOADERS: dict[str, Callable] = {}


def register_loader(name: str, factory: Callable | None = None):
    """Register `factory(store, cfg) -> Loader` under `name`; usable as a decorator."""
    def add(f):
        if name in _LOADERS:
            raise ValueError(f"loader {name!r} is already registered")
        _LOADERS[name] = f
        return f

    return add(factory) if factory is not None else add


def list_loaders() -> list[str]:
    return sorted(_LOADERS)


def create_loader(name: str, store, cfg: LoaderConfig | None = None) -> Loader:
    if name not in _LOADERS:
        raise ValueError(f"unknown loader {name!r}; valid loaders: {', '.join(list_loaders())}")
    return _LOADERS[name](store, cfg or LoaderConfig())
