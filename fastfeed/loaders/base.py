"""The loader contract: `Batch`, `LoaderConfig`, the `Loader` interface and the registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from importlib import import_module

import torch

from ..augment.hyp import AugmentHyp
from ..batch import Batch
from ..devices import parse_device, resolve_device
from ..procs import usable_cores
from .sampler import batches_per_epoch

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
    return max(1, min(usable_cores(), 8))


@dataclass
class LoaderConfig:
    """What every loader accepts (a loader's own settings are its options: `create_loader(name, store,
    cfg, **options)`). Invalid values raise ValueError naming the field."""

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
    device: str = "auto"             # where the batches are for: auto | cpu | cuda[:N] | npu[:N] (see fastfeed.devices)
    pin_memory: bool | None = None   # None: when `device` is a CUDA GPU
    device_augment: bool = False     # leave HSV jitter and the horizontal flip to the DevicePrefetcher
    timeout: float = 300.0           # seconds without a batch before a worker counts as hung

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
        need(self.timeout > 0, "timeout", "must be > 0")
        need(isinstance(self.hyp, AugmentHyp), "hyp", "must be an AugmentHyp")
        try:
            parse_device(self.device)
        except ValueError as e:
            raise ValueError(f"LoaderConfig.device: {e}") from None

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

    def resolved_device(self) -> torch.device:
        """`device` as a checked torch.device ('auto': the GPU/NPU when there is one, else the CPU)."""
        return resolve_device(self.device)

    def pin(self) -> bool:
        """Page-lock the host batches: asked for, or by default when they are for a CUDA GPU."""
        if self.pin_memory is not None:
            return self.pin_memory
        return parse_device(self.device)[0] in ("auto", "cuda") and torch.cuda.is_available()

    def closed(self, epoch: int) -> bool:
        """One of the last `close_mosaic` epochs: plain samples, no mosaic and no mixup (as Ultralytics)."""
        return bool(self.close_mosaic and self.epochs and epoch >= self.epochs - self.close_mosaic)

    def mosaic_on(self, epoch: int) -> bool:
        return self.augment and self.hyp.mosaic > 0 and not self.closed(epoch)

    def mixup_on(self, epoch: int) -> bool:
        """Mixup (with probability hyp.mixup, a blend with a second sample made the same way)."""
        return self.augment and self.hyp.mixup > 0 and not self.closed(epoch)

    def to_dict(self) -> dict:
        return {f.name: (getattr(self, f.name).__dict__ if f.name == "hyp" else getattr(self, f.name))
                for f in fields(self)}


def check_epoch(store, cfg: LoaderConfig) -> int:
    """Batches per epoch of this rank; a ValueError saying what to change when that would be none
    (call it before any expensive set-up: `Loader.__init__` does)."""
    n = len(store)
    rank, world = cfg.resolved_rank()
    count = batches_per_epoch(n, cfg.batch_size, world, cfg.drop_last)
    if count == 0:
        b = cfg.batch_size
        raise ValueError(f"batch_size {b} x world_size {world} needs at least {b * world} images per epoch with "
                         f"drop_last=True; the store holds {n}: use a smaller batch_size, fewer processes, "
                         "or drop_last=False (which yields the short batch)" if n else "the store holds no images")
    return count


class Loader(ABC):
    """An iterable of `Batch` over one rank's share of an epoch.

    What a consumer (the DevicePrefetcher, a trainer) may rely on: `store`, `cfg` (the LoaderConfig),
    `rank` / `world_size` (this process's share), `len()`, `set_epoch(epoch, start)`, iteration,
    `close()`, `device_hyp` (augmentation left for the device to do) and `on_device` (batches that
    are already on the device: no prefetcher needed). A subclass calls
    `Loader.__init__`, which also refuses a config that would give empty epochs.
    """

    def __init__(self, store, cfg: LoaderConfig):
        self.store, self.cfg = store, cfg
        self.rank, self.world_size = cfg.resolved_rank()
        self.epoch = self.start = 0
        check_epoch(store, cfg)

    @abstractmethod
    def __iter__(self) -> Iterator[Batch]: ...

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return batches_per_epoch(len(self.store), self.cfg.batch_size, self.world_size, self.cfg.drop_last)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Reshuffle (and apply close_mosaic) for `epoch`; call before iterating it. `start`: the first
        batch to yield (resuming mid-epoch): the batches are those an uninterrupted run yields from there,
        without building the ones skipped."""
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= len(self):
            raise ValueError(f"start must be a batch index in 0..{len(self)}, got {start!r}")
        self.epoch, self.start = int(epoch), start

    #: True for a loader whose batches are already on `cfg.device`, images float in [0,1] (it does what the
    #: DevicePrefetcher does itself): iterate it directly. False: uint8 host batches, for a DevicePrefetcher.
    on_device: bool = False

    @property
    def device_hyp(self) -> AugmentHyp | None:
        """The augmentation gains whose HSV jitter and flip this loader leaves to the device
        (`cfg.device_augment` on training batches), else None."""
        return self.cfg.hyp if (self.cfg.device_augment and self.cfg.augment) else None

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

@dataclass(frozen=True)
class LoaderInfo:
    """A registered loader: what `fastfeed loaders` lists."""

    name: str
    summary: str
    options: dict                  # option name -> default
    unavailable: str | None        # why it cannot run here, or None

    @property
    def available(self) -> bool:
        return self.unavailable is None


@dataclass(frozen=True)
class _Entry:
    factory: Callable
    options: type | None
    summary: str
    check: Callable[[], str | None] | None


_LOADERS: dict[str, _Entry] = {}
_BUILTIN = ("cpu", "shm", "dali", "device")   # registered on first use of the registry: importing fastfeed.loaders
_builtins_loaded = False             # stays light (torch + numpy), so device code imports the Loader ABC


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for name in _BUILTIN:
            import_module(f"fastfeed.loaders.{name}")


def register_loader(name: str, factory: Callable | None = None, *, options: type | None = None, summary: str = "",
                    check: Callable[[], str | None] | None = None):
    """Register `factory(store, cfg, opts) -> Loader` under `name` (usable as a decorator).

    `options`: the loader's own options, a dataclass whose fields have defaults and whose __post_init__
    validates them (None: the loader has none; the factory then gets opts=None). `check()`: why the
    loader cannot run on this machine (a missing package...), or None; it must be cheap.
    """
    def add(f):
        _load_builtins()
        if name in _LOADERS:
            raise ValueError(f"loader {name!r} is already registered")
        _LOADERS[name] = _Entry(f, options, summary, check)
        return f

    return add(factory) if factory is not None else add


def list_loaders() -> list[str]:
    _load_builtins()
    return sorted(_LOADERS)


def loader_info() -> list[LoaderInfo]:
    """Every registered loader with its options and whether it can run here (and why not)."""
    out = []
    for name in list_loaders():
        e = _LOADERS[name]
        opts = {f.name: f.default for f in fields(e.options)} if e.options else {}
        out.append(LoaderInfo(name, e.summary, opts, e.check() if e.check else None))
    return out


def loader_options(name: str, **options):
    """The options object of loader `name` from keyword arguments; unknown names raise ValueError
    saying which loader they belong to."""
    _load_builtins()
    if name not in _LOADERS:
        raise ValueError(f"unknown loader {name!r}; valid loaders: {', '.join(list_loaders())}")
    cls = _LOADERS[name].options
    known = {f.name for f in fields(cls)} if cls else set()
    for key in options:
        if key not in known:
            owners = [n for n, e in _LOADERS.items() if e.options and key in {f.name for f in fields(e.options)}]
            where = f"it is an option of: {', '.join(sorted(owners))}" if owners else "no loader has it"
            mine = f"{name}'s options: {', '.join(sorted(known))}" if known else f"{name} takes no options"
            raise ValueError(f"loader {name!r} has no option {key!r} ({where}); {mine}")
    return cls(**options) if cls else None


def create_loader(name: str, store, cfg: LoaderConfig | None = None, **options) -> Loader:
    """The loader `name` over `store`: `cfg` for what every loader shares, `options` for its own."""
    opts = loader_options(name, **options)
    return _LOADERS[name].factory(store, cfg or LoaderConfig(), opts)
