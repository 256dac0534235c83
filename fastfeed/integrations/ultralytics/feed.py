"""`FastfeedTrainLoader`: a fastfeed loader wearing what Ultralytics' trainer touches on its train loader.

The trainer reads `len(loader)`, `loader.batch_size`, `loader.drop_last`, `loader.num_workers`,
`len(loader.sampler)` (samples this rank draws), `loader.sampler.set_epoch()` (DDP), `loader.reset()`,
`loader.close()`, and from `loader.dataset`: `len()`, `labels` (plots, class weights, the max_det
check) and `mosaic` / `close_mosaic(hyp)` (its close_mosaic epochs). Everything else is iteration.

What it says about the feed, the reason to use it: per epoch the images fed, images/s and the share of the epoch it
waited for data (a line after Ultralytics' progress bar, a row of `fastfeed.csv` beside results.csv), and the shm
cache's size and build time. "Waited": from the trainer asking for a batch to having it (loader, collation, the
previous batch's device copy) against the epoch's training time; near 0 is healthy (the model limits).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from time import perf_counter

import torch

from ... import tasks
from ...augment.masks import mask_side
from ...cache.budget import gib
from ...devices import copy_fence
from ...loaders import LoaderConfig, create_loader
from ...loaders.base import MIXING
from ...store.remote.link import link_words
from ...train.guards import source_failure
from .args import log
from .batches import ClassFilter, collate, labels, read_records

FEED_CSV = "fastfeed.csv"
COLUMNS = ("epoch", "loader", "images", "seconds", "images_per_s", "data_wait_s", "data_wait_frac")


@dataclass
class FeedClock:
    """One epoch of the feed: images handed out, seconds waited for them, and the epoch's span so far."""

    start: float
    last: float
    images: int = 0
    waited: float = 0.0

    @classmethod
    def started(cls) -> FeedClock:
        now = perf_counter()
        return cls(now, now)

    def batch(self, waited: float, images: int) -> None:
        self.waited += waited
        self.images += images
        self.last = perf_counter()

    def resumed(self) -> float:
        """The trainer asks for the next batch (or is done with the last): now."""
        self.last = perf_counter()
        return self.last

    def row(self, epoch: int, loader: str) -> dict:
        seconds = max(self.last - self.start, 1e-9)
        return {"epoch": epoch, "loader": loader, "images": self.images, "seconds": round(seconds, 3),
                "images_per_s": round(self.images / seconds, 2), "data_wait_s": round(self.waited, 3),
                "data_wait_frac": round(min(self.waited / seconds, 1.0), 4)}


def epoch_line(row: dict, epochs: int, link: dict | None = None) -> str:
    """The epoch's feed line; `link`: a URL store's link figures (`ReadAhead.figures`), said after it."""
    verdict = ("the feed keeps up" if row["data_wait_frac"] < 0.05 else
               "the training step waited for the loader: more workers, or cache=True (the shm loader)"
               if row["data_wait_frac"] >= 0.2 else "")
    return (f"fastfeed: epoch {row['epoch']}/{epochs}: the {row['loader']} loader fed {row['images']} images, "
            f"{row['images_per_s']:.1f} images/s; data wait {row['data_wait_frac']:.1%} of the epoch "
            f"({row['data_wait_s']:.2f} of {row['seconds']:.2f} s)" + (f": {verdict}" if verdict else "")
            + (f"; the store's link: {link_words(link)}" if link else ""))


def append_row(path: Path, row: dict) -> None:
    new = not path.exists()
    with open(path, "a", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        w.writerow(row)


def shm_cache_line(loader, seconds: float) -> str | None:
    """The shm cache a loader reads (None for a loader without one): its size, and the time it took to build
    it here, or that it was already built (by an earlier run, another rank or a `fastfeed cache build`)."""
    lease = getattr(loader, "lease", None)
    if lease is None:
        return None
    h = lease.header
    how = f"built in {seconds:.1f} s" if lease.built else "already built, mapped"
    part = f" (a partial shm cache: {h.n_cached} of {h.n_records} images)" if h.n_cached < h.n_records else ""
    return (f"fastfeed: shm cache {lease.path}: {gib(lease.size)}, {h.n_records} images at imgsz "
            f"{h.imgsz}, {how}{part}")


class StoreDataset:
    """`train_loader.dataset`: the size and labels of the records trained on (`fraction`'s first ones), and the
    switch that closes mosaic."""

    def __init__(self, feed: FastfeedTrainLoader):
        self._feed = feed

    def __len__(self) -> int:
        return self._feed.records

    @cached_property
    def labels(self) -> list[dict]:
        return labels(self._feed.info, self._feed.class_filter)[:self._feed.records]

    @property
    def mosaic(self) -> bool:
        return self._feed.cfg.hyp.mosaic > 0 and not self._feed.mosaic_closed

    @mosaic.setter
    def mosaic(self, on: bool) -> None:
        if not on:
            self._feed.close_mosaic()

    def close_mosaic(self, hyp=None) -> None:
        self._feed.close_mosaic()


class EpochSampler:
    """`train_loader.sampler`: how many samples this rank draws per epoch; `set_epoch` as DistributedSampler's."""

    def __init__(self, feed: FastfeedTrainLoader):
        self._feed = feed

    def __len__(self) -> int:
        return self._feed.loader.order.samples()

    def set_epoch(self, epoch: int) -> None:
        self._feed.epoch = int(epoch)


class FastfeedTrainLoader:
    """Iterating gives one epoch of trainer batches (dicts) from `create_loader(name, store, cfg)`.

    The epoch is `epoch_of()` (the trainer's current epoch) when given, else the last `sampler.set_epoch`.
    A batch's `img` is the loader's uint8 buffer: valid until the next batch is requested; after a
    non-blocking device copy, call `copy_issued()` so the buffer is not reused before the copy is done.
    From a loader that is `on_device` (the device loader) it is float images on the device, fresh each batch.
    Under DDP a data source lost for good does not raise: `lost` is its message, and the batches are blank (a real
    one's shapes and keys, no object), so this rank's collectives meet the others' until all stop (stopping.py).
    """

    def __init__(self, name: str, store, cfg: LoaderConfig, *, epoch_of: Callable[[], int] | None = None,
                 image_dir: Path | None = None, class_filter: ClassFilter | None = None, options: dict | None = None,
                 records: int | None = None):
        self.name, self.store, self.cfg, self.options = name, store, cfg, dict(options or {})
        self.records = len(store) if records is None else int(records)   # the first ones: `fraction`
        self.rank, self.world_size = cfg.resolved_rank()
        self.info = read_records(store, image_dir)
        self.class_filter = class_filter or ClassFilter()
        self.epoch = 0
        self._resumed: dict | None = None   # the loader state resumed from, until its epoch begins (there)
        self.mosaic_closed = False
        self._epoch_of = epoch_of
        self._copy_event = None
        self.lost: str | None = None
        self._given = 0   # batches of the epoch given (`position` once lost: the loader counts them otherwise)
        t0 = perf_counter()
        self.loader = create_loader(name, store, cfg, **self.options)   # the fastfeed Loader (stage_times(), ...)
        self.shm_cache_line = shm_cache_line(self.loader, perf_counter() - t0)   # the shm cache's size and build time
        self.clock = FeedClock.started()                # the current (or last) epoch's feed figures
        self.dataset = StoreDataset(self)
        self.sampler = EpochSampler(self)

    batch_size = property(lambda self: self.cfg.batch_size)
    drop_last = property(lambda self: self.cfg.drop_last)
    num_workers = property(lambda self: self.cfg.workers)

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def on_device(self) -> bool:
        """The batches are on the trainer's device already, finished (the device loader)."""
        return bool(self.loader.on_device)

    @property
    def position(self) -> int:
        """Batches of `epoch` handed out so far (a mid-epoch checkpoint's position): the loader's count, or blanks."""
        return self.loader.handed if self.lost is None else self._given

    def __iter__(self):
        return self._batches()   # a generator: nothing runs until the first batch is asked for

    def resume_from(self, state: dict) -> str:
        """Continue where a loader `state` left off (`Loader.load_state_dict`: exactly on the same order, else the
        interrupted epoch's untrained records re-dealt to these ranks; the batches before it are neither built nor
        trained); returns the line saying what it does."""
        self._resumed = state
        return self.loader.load_state_dict(state)

    def _batches(self):
        epoch = self.epoch = int(self._epoch_of()) if self._epoch_of is not None else self.epoch
        resumed, self._resumed = self._resumed, None
        loader = self.loader
        start = loader.start if resumed is not None and loader.epoch == epoch else 0
        clock = self.clock = FeedClock.started()
        asked = clock.start
        self._given = 0 if self.lost is not None else start   # (lost in an earlier epoch: blank batches only)
        if self.lost is None:
            try:
                loader.set_epoch(epoch, start)
                for batch in loader:   # im_file, ori_shape...: of the records the batch says it holds, in its order
                    images, targets, indices = batch.images, batch.targets, getattr(batch, "indices", None)
                    if indices is None or len(indices) != len(images):
                        raise RuntimeError(f"fastfeed {self.name} loader gave a batch of {len(images)} images without "
                                           f"the record index of each (Batch.indices: {indices!r}); FastfeedTrainer "
                                           "needs them to name the images")
                    out = collate(images, targets, indices.tolist(), self.info, self.class_filter, batch.extras(),
                                  self.cfg.overlap_mask)
                    clock.batch(perf_counter() - asked, len(images))
                    self._given += 1
                    yield out
                    asked = clock.resumed()
                    if self._copy_event is not None:   # the next request lets the loader reuse this batch's buffer
                        self._copy_event.synchronize()
                        self._copy_event = None
                return
            except Exception as e:
                if (message := source_failure(e)) is None or self.world_size == 1:
                    raise   # one process: the trainer saves and raises (stopping.py)
                self.lost = message
                log.warning(f"fastfeed: rank {self.rank}: {message}; blank batches until the ranks stop together")
        while self._given < len(self):
            self._given += 1
            yield self._blank()

    def _blank(self) -> dict:
        """Blank images without objects: a real batch's shapes, dtypes and keys (the task's extras as empty)."""
        cfg, n, s, spec = self.cfg, self.cfg.batch_size, self.cfg.imgsz, tasks.get(self.loader.task)
        dtype, on = (self.loader.dtype, cfg.device) if self.on_device else (torch.uint8, "cpu")   # (the device loader's)
        side, extras = mask_side(s, cfg.mask_ratio), {}
        if spec.extra == "masks" and cfg.overlap_mask:
            extras["masks"] = torch.zeros((n, side, side), dtype=torch.int16, device=on)
        elif spec.extra is not None:
            extras[spec.extra] = torch.from_numpy(spec.empty_extra(self.store.manifest.kpt_shape, side)).to(on)
        return collate(torch.zeros((n, 3, s, s), dtype=dtype, device=on), torch.zeros((0, 6), device=on), [0] * n,
                       self.info, self.class_filter, extras, cfg.overlap_mask)

    def copy_issued(self, device: torch.device) -> None:
        """The trainer has queued this batch's copy to `device`; wait for it before the buffer is reused."""
        if device.type in ("cuda", "npu"):
            self._copy_event = copy_fence(device)

    def close_mosaic(self) -> None:
        """Ultralytics' close_mosaic: the loader's own schedule (epochs, close_mosaic) normally already does it;
        if the trainer closes earlier than that schedule (its `time` mode re-plans epochs), switch loaders."""
        self.mosaic_closed = True
        epoch = int(self._epoch_of()) if self._epoch_of is not None else self.epoch
        if self.cfg.mosaic_on(epoch):
            off = dict.fromkeys(("mosaic", *MIXING), 0.0)   # as Ultralytics closes them
            self.cfg = replace(self.cfg, hyp=replace(self.cfg.hyp, **off))
            old, self.loader = self.loader, create_loader(self.name, self.store, self.cfg, **self.options)
            old.close()          # after the new one holds its own lease on an shm cache
            if self._resumed is not None:   # the resumed epoch, not begun yet: the new loader continues it too
                self.loader.load_state_dict(self._resumed)
            log.info(f"fastfeed: mosaic off from epoch {epoch + 1}")

    def reset(self) -> None:
        """Ultralytics re-creates its iterator here; fastfeed plans each epoch afresh anyway."""

    def close(self) -> None:
        self.loader.close()
