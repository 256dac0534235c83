"""The loader contract: `Batch`, `LoaderConfig`, the `Loader` interface (the registry: registry.py)."""

from __future__ import annotations

import logging
import weakref
from abc import abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields, replace

import torch

from ..augment.hyp import AugmentHyp
from ..augment.masks import MASK_RULES
from ..batch import Batch, BatchFeed, counted
from ..checks import check_imgsz, field_need, is_int, is_num, need
from ..devices import has_cuda, parse_device, resolve_device
from ..procs import usable_cores
from ..renamed import renamed
from ..tasks import TASKS
from ..tasks import get as task_spec
from .position import resume, state_of
from .renders import Renders, UnsupportedTask, batch_task
from .sampler import EpochOrder, batches_per_epoch
from .shard_order import default_order

log = logging.getLogger(__name__)
MIXING = ("mixup", "cutmix", "copy_paste")   # the augmentations Ultralytics closes with mosaic (close_mosaic)

STAGES = ("read", "decode", "augment", "collate")
@dataclass
class StageTimes:
    """Seconds spent per stage, summed over every worker, and the samples they produced."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    samples: int = 0

    def add(self, seconds: dict[str, float], samples: int) -> None:
        self.seconds.update({k: self.seconds.get(k, 0.0) + v for k, v in seconds.items()})
        self.samples += samples

    def per_sample_ms(self) -> dict[str, float]:
        return {k: 1e3 * v / max(self.samples, 1) for k, v in self.seconds.items()}


@renamed(prefetch="batches_ahead")
@dataclass
class LoaderConfig:
    """What every loader accepts (a loader's own settings are its options: `create_loader(name, store,
    cfg, **options)`). Invalid values raise ValueError naming the field. `prefetch`, the old name of
    `batches_ahead`, still works (a DeprecationWarning)."""

    imgsz: int = 640                 # output side S (a multiple of 32)
    batch_size: int = 16
    workers: int = field(default_factory=lambda: max(1, min(usable_cores(), 8)))   # the usable cores, 1..8
    augment: bool = True             # False: letterboxed evaluation batches
    seed: int = 0
    rank: int | None = None          # None: from torch.distributed when initialised, else 0
    world_size: int | None = None
    local_world_size: int | None = None   # the ranks on this node (torchrun's LOCAL_WORLD_SIZE); None: 1
    shuffle: bool = True
    drop_last: bool = True
    epochs: int | None = None        # with close_mosaic: when to switch mosaic off
    close_mosaic: int = 0            # the last N epochs train on plain (non-mosaic) samples
    hyp: AugmentHyp = field(default_factory=AugmentHyp)
    batches_ahead: int = 2           # batches each worker has queued ahead of the one trained on
    device: str = "auto"             # where the batches are for: auto | cpu | cuda[:N] | npu[:N] (see fastfeed.devices)
    pin_memory: bool | None = None   # None: when `device` is a CUDA GPU
    device_augment: bool = False     # leave HSV jitter and the horizontal flip to the DevicePrefetcher
    timeout: float = 300.0           # seconds without a batch before a worker counts as hung
    mask_ratio: int = 4              # a segment store's masks are imgsz / mask_ratio on a side (Ultralytics' mask_ratio)
    overlap_mask: bool = True        # one int16 mask per image (value j+1: its j-th object), else one per object
    mask_rule: str = "centre"        # which mask pixels an object takes (augment.masks.MASK_RULES): "centre" (exact),
                                     # "ultralytics" (as Ultralytics' datasets and validator draw them, larger)
    task: str | None = None          # what the batches carry: None, the store's task; "detect", boxes alone from a
                                     # store of any task (`batch_task`)

    def __post_init__(self):
        need = field_need(self, "LoaderConfig.")
        check_imgsz(self.imgsz, "LoaderConfig.imgsz")
        for name in ("imgsz", "batch_size", "workers", "seed", "batches_ahead", "close_mosaic", "mask_ratio", "rank",
                     "world_size", "local_world_size", "epochs"):   # numpy integers are ints; floats and bools are not
            value, optional = getattr(self, name), name in ("rank", "world_size", "local_world_size", "epochs")
            need(is_int(value) or (optional and value is None), name, "must be an integer" + " or None" * optional)
            setattr(self, name, None if value is None else int(value))
        for name in ("augment", "shuffle", "drop_last", "device_augment", "overlap_mask", "pin_memory"):
            need(isinstance(getattr(self, name), bool) or (name == "pin_memory" and self.pin_memory is None), name,
                 "must be True or False" + " (or None: when device is a CUDA GPU)" * (name == "pin_memory"))
        for name, least, rule in (("batch_size", 1, "must be >= 1"), ("seed", 0, "must be an integer >= 0"),
                                  ("workers", 0, "must be >= 0 (0: in the main process)"),
                                  ("batches_ahead", 1, "must be >= 1"), ("world_size", 1, "must be >= 1"),
                                  ("local_world_size", 1, "must be >= 1 (the ranks on this node)")):
            need(getattr(self, name) is None or getattr(self, name) >= least, name, rule)   # None: optional ones
        need(self.rank is None or 0 <= self.rank < (self.world_size or 1),
             "rank", f"must be in 0..world_size-1 (world_size {self.world_size})")
        need(self.close_mosaic >= 0, "close_mosaic", "must be >= 0")
        need(self.epochs is None or self.epochs >= 1, "epochs", "must be >= 1")
        need(is_num(self.timeout) and self.timeout > 0, "timeout", "must be a number of seconds > 0")
        need(isinstance(self.hyp, AugmentHyp), "hyp", "must be an AugmentHyp")
        need(self.mask_ratio >= 1 and self.imgsz % self.mask_ratio == 0, "mask_ratio",
             f"must be an integer >= 1 dividing imgsz {self.imgsz}")
        need(self.mask_rule in MASK_RULES, "mask_rule", f"must be one of {', '.join(MASK_RULES)}")
        need(self.task is None or self.task in TASKS, "task", f"must be None (the store's) or one of {', '.join(TASKS)}")
        try:
            parse_device(self.device)
        except ValueError as e:
            raise ValueError(f"LoaderConfig.device: {e}") from None

    def worker_hyp(self) -> AugmentHyp:
        """The augmentation the workers apply: all of `hyp`, or without what the device will do."""
        return replace(self.hyp, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0) if self.device_augment else self.hyp

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
        asked = self.pin_memory
        return asked if asked is not None else parse_device(self.device)[0] in ("auto", "cuda") and has_cuda()

    def closed(self, epoch: int) -> bool:
        """One of the last `close_mosaic` epochs: plain samples, no mosaic and no mixup (as Ultralytics)."""
        return bool(self.close_mosaic and self.epochs and epoch >= self.epochs - self.close_mosaic)

    def mosaic_on(self, epoch: int) -> bool:
        return self.augment and self.hyp.mosaic > 0 and not self.closed(epoch)

    def mixup_on(self, epoch: int) -> bool:
        """The mixing augmentations: mixup (with probability hyp.mixup, a blend with a second sample made the same
        way), cutmix (a rectangle of one, with probability hyp.cutmix) and copy-paste; off in the close_mosaic
        epochs."""
        return self.augment and any(getattr(self.hyp, k) > 0 for k in MIXING) and not self.closed(epoch)

    def for_store(self, store, prefetcher_augments: bool = True) -> LoaderConfig:
        """This config as a loader of `store` applies it: `task` set to what the batches carry (`batch_task`); a
        pose store without flip_idx flips nothing (a warning naming it, as Ultralytics does: a flip without the
        swap would put left keypoints on the right), nor do batches without polygons copy-paste (warned too), and
        the device augmentation, which moves pixels and boxes only, is refused for batches with task geometry
        (unless `prefetcher_augments` is False: a loader on the device, which ignores device_augment)."""
        task = batch_task(store, self)
        cfg = self if self.task == task else replace(self, task=task)
        spec, where = task_spec(task), getattr(store, "path", store)
        if self.augment and self.hyp.copy_paste and not spec.pastes:
            log.warning("the %s batches of %s carry no polygons: hyp.copy_paste=%s set to 0 (it pastes objects by "
                        "their polygons: a segment store's, as segment)", task, where, self.hyp.copy_paste)
            cfg = replace(cfg, hyp=replace(cfg.hyp, copy_paste=0.0))
        if spec.field is None:
            return cfg
        if self.device_augment and prefetcher_augments:
            raise UnsupportedTask(f"LoaderConfig.device_augment cannot flip the {spec.words} of a store of {task} "
                                  "labels: leave it False (the workers flip them), or read its boxes alone "
                                  "(task='detect')")
        if spec.keypoints and self.augment and self.hyp.fliplr > 0 and store.manifest.flip_idx is None:
            log.warning("pose store %s has no flip_idx: hyp.fliplr=%s set to 0 (a left-right flip cannot swap its "
                        "keypoints; pack it with flip_idx in data.yaml to flip)", where, self.hyp.fliplr)
            return replace(cfg, hyp=replace(cfg.hyp, fliplr=0.0))
        return cfg

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


class Loader(BatchFeed, AbstractContextManager):
    """An iterable of `Batch` over one rank's share of an epoch.

    What a consumer (the DevicePrefetcher, a trainer) may rely on: what `BatchFeed` declares (its position in
    position.py), `store` (anything with the `fastfeed.store.RecordSource` protocol), `rank` / `world_size`, `order`
    (the `EpochOrder` its batches follow), `len()`, `task` (what its batches carry: `batch_task`), iteration (each
    `Batch` with its record `indices`), `handed` (the batches of `epoch` its iterator has yielded: `start` before the
    first; one iterator at a time: a second `iter()` ends the first) and `close()`. A subclass calls `Loader.__init__`, which also refuses a config that would give empty
    epochs, and implements `iter_batches()` (the batches of `epoch` from `start`; `__iter__` counts them).
    """

    #: What its renderer draws (`renders.py`: tasks, augmentations, per-object masks); what it does not is refused.
    renders: Renders = Renders(("base",), ("detect",), frozenset(), False)

    def __init__(self, store, cfg: LoaderConfig, order: EpochOrder | None = None):
        self.task = batch_task(store, cfg)
        self.renders.refuse(store, cfg)
        cfg = cfg.for_store(store, prefetcher_augments=not self.on_device)
        self.store, self.cfg = store, cfg
        self.rank, self.world_size = cfg.resolved_rank()
        self.epoch = self.start = self.handed = 0
        self._times = StageTimes()   # what its builders report (a loader with other stages sets its own)
        check_epoch(store, cfg)
        self.order = order if order is not None else default_order(store, cfg, self.rank, self.world_size)
        if (self.order.rank, self.order.world_size) != (self.rank, self.world_size):
            raise ValueError(f"the order given is rank {self.order.rank} of {self.order.world_size}, the loader's "
                             f"config rank {self.rank} of {self.world_size}")
        if len(self.order) == 0:
            raise ValueError(f"the order {self.order.describe()} gives no batches per epoch")

    @abstractmethod
    def iter_batches(self) -> Iterator[Batch]:
        """The batches of `epoch` from batch `start` on (the subclass's work; `__iter__` counts what it yields)."""

    def _end_running(self) -> None:
        """One iteration at a time (the batches share the workers and buffers): a second, or a set_epoch, ends the
        one under way (its iterator stops)."""
        running = getattr(self, "_running", None)
        if running is not None and running() is not None:
            running().close()

    def __iter__(self) -> Iterator[Batch]:
        self._end_running()
        it = self.iter_batches()   # called now: a loader that cannot iterate says so at iter()
        self.handed = self.start
        out = counted(it, self, "handed")
        self._running = weakref.ref(out)
        return out

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return len(self.order)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Reshuffle (and apply close_mosaic) for `epoch`; call before iterating it. `start`: the first
        batch to yield (resuming mid-epoch): the batches are those an uninterrupted run yields from there,
        without building the ones skipped. An iteration under way ends."""
        need(is_int(epoch) and epoch >= 0, "epoch", "must be an integer >= 0", epoch)   # a numpy integer is one
        need(is_int(start) and 0 <= start <= len(self), "start", f"must be a batch index in 0..{len(self)}", start)
        self._end_running()   # its batches would be counted as this epoch's (a resume would skip untrained ones)
        self.epoch, self.start, self.handed = int(epoch), int(start), int(start)

    def state_dict(self, epoch: int | None = None, batches: int | None = None) -> dict:
        """The position (`batches` consumed into `epoch` on every rank: by default those its iterator has yielded,
        `handed`; a caller that knows better passes them) and what makes the batches (the order's identity, world
        size, batch size, seed, workers, partner buffer, imgsz): plain values, for a checkpoint (position.py)."""
        return state_of(self, self.epoch if epoch is None else int(epoch), self.handed if batches is None else int(batches))

    def load_state_dict(self, state: dict) -> str:
        """Continue where `state` (a `state_dict()`, maybe of another topology) left off: the exact continuation when
        the order is the same, else the records of the interrupted epoch not yet trained re-dealt to this loader's
        ranks (position.py). Sets the epoch and its first batch (`epoch`, `start`); returns the one line saying what
        changed and what the resume does about it. A `position.ResumeError` when it cannot."""
        return resume(self, state)

    def use_order(self, order: EpochOrder) -> None:
        """Follow `order` from now on (before the next iteration; a resumed epoch's remainder)."""
        self.order = order

    @property
    def device_hyp(self) -> AugmentHyp | None:
        """The augmentation gains whose HSV jitter and flip this loader leaves to the device
        (`cfg.device_augment` on training batches), else None (a loader `on_device` does them itself)."""
        return self.cfg.hyp if (self.cfg.device_augment and self.cfg.augment and not self.on_device) else None

    @abstractmethod
    def close(self) -> None:
        """Stop workers and free shared buffers; idempotent."""

    def stage_times(self) -> StageTimes:
        """A snapshot: per-stage seconds summed over workers since creation (what `fastfeed bench` reports)."""
        return StageTimes(dict(self._times.seconds), self._times.samples)

    def memory_pids(self) -> list[int]:
        """Processes whose memory belongs to this loader (its workers), for the bench's RSS figure."""
        return []

    def shared_bytes(self) -> int:
        """Bytes of any shared cache this loader maps (0 when none)."""
        return 0

    def __getstate__(self):   # its workers, queues and shared buffers are this process's
        raise TypeError(f"a fastfeed loader ({type(self).__name__}) does not pickle: create it in the process that "
                        "iterates it, from its Store and LoaderConfig (which pickle)")

    def __exit__(self, *exc):
        self.close()
