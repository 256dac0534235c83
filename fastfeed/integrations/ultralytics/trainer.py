"""`FastfeedTrainer`: Ultralytics' DetectionTrainer with its training batches from a fastfeed loader.

    YOLO("yolov8n.yaml").train(data="data.yaml", trainer=FastfeedTrainer, epochs=100, imgsz=640, batch=16)

Only the train loader changes. Validation, metrics, the model, loss, optimiser, EMA, checkpoints and
resume are Ultralytics' own. Under DDP, Ultralytics rebuilds the trainer in every rank process (8.4
cloudpickles the class, which pickles by reference: this module must be importable there, as it is
wherever fastfeed is installed); each rank then packs nothing (local rank 0 packs first, the others
wait and reuse the store), builds its own loader and reads its own share of every epoch.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.utils import RANK
from ultralytics.utils.torch_utils import torch_distributed_zero_first

from ...devices import device_count
from ...loaders import LoaderConfig
from .args import augment_hyp, describe, loader_name, log, warn_unsupported
from .batches import ClassFilter, read_records
from .feed import FastfeedTrainLoader
from .report import FEED_CSV, append_row, epoch_line
from .store import check_boxes, check_classes, prepare_store


def _workers(requested: int, device) -> int:
    """Ultralytics' cap, honoured as its loader does: at most the cores per local device."""
    if device.type in ("cpu", "mps"):
        return requested     # the trainer has already set 0 on CPU: the model step dominates there
    return max(0, min(requested, (os.cpu_count() or 1) // max(device_count(device), 1)))


def _fresh_feed_file(trainer) -> None:
    """A new run starts its fastfeed.csv afresh (a resumed one appends), as Ultralytics does its results.csv."""
    if RANK in (-1, 0) and not trainer.args.resume:
        (Path(trainer.save_dir) / FEED_CSV).unlink(missing_ok=True)


def _feed_epoch_end(trainer) -> None:
    """The epoch's feed figures: a line after Ultralytics' progress bar, a row of fastfeed.csv beside results.csv."""
    feed = getattr(trainer, "train_loader", None)
    if RANK not in (-1, 0) or not isinstance(feed, FastfeedTrainLoader):
        return
    row = feed.clock.row(trainer.epoch + 1, feed.name)
    log.info(epoch_line(row, trainer.epochs))
    append_row(Path(trainer.save_dir) / FEED_CSV, row)


class FastfeedTrainer(DetectionTrainer):
    """A DetectionTrainer whose train loader is fastfeed's: `cache=False|'disk'` -> the `cpu` loader,
    `cache=True|'ram'` -> `shm` (one decoded copy per node), `FASTFEED_LOADER=cpu|shm|dali` overrides.
    The data.yaml's train split is packed into a store on first use (`FASTFEED_STORE=PATH`: use that one).
    Each epoch logs the feed's images/s and data-wait share, also written to `<save_dir>/fastfeed.csv`."""

    _ff_store = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback("on_train_start", _fresh_feed_file)
        self.add_callback("on_train_epoch_end", _feed_epoch_end)

    def train_store(self, dataset_path, rank: int = -1):
        """The store for the train split, prepared once per trainer (local rank 0 first under DDP); never one
        without boxes."""
        if self._ff_store is None:
            with torch_distributed_zero_first(rank):
                self._ff_store = prepare_store(dataset_path, progress=RANK in (-1, 0), names=self.data.get("names"))
            check_boxes(self._ff_store)
            if not self.args.single_cls:
                check_classes(self._ff_store, self.data["names"], self.data["nc"])
        return self._ff_store

    def get_dataloader(self, dataset_path, batch_size: int = 16, rank: int = 0, mode: str = "train"):
        if mode != "train":
            return super().get_dataloader(dataset_path, batch_size, rank, mode)   # validation stays Ultralytics'
        store = self.train_store(dataset_path, rank)
        name = loader_name(self.args.cache)
        if RANK in (-1, 0):
            warn_unsupported(self.args)
        cfg = LoaderConfig(imgsz=int(self.args.imgsz), batch_size=max(1, min(batch_size, len(store))),
                           workers=_workers(self.args.workers, self.device), seed=int(self.args.seed),
                           shuffle=True, drop_last=bool(self.args.compile), epochs=int(self.epochs),
                           close_mosaic=int(self.args.close_mosaic), hyp=augment_hyp(self.args),
                           device=str(self.device) if self.device.type in ("cuda", "npu") else "cpu",
                           pin_memory=self.device.type == "cuda")
        ref = weakref.ref(self)
        image_dir = Path(dataset_path) if isinstance(dataset_path, (str, os.PathLike)) else None
        feed = FastfeedTrainLoader(name, store, cfg, epoch_of=lambda: getattr(ref(), "epoch", 0),
                                   image_dir=image_dir, class_filter=ClassFilter(self.args.classes, self.args.single_cls))
        if RANK in (-1, 0):
            log.info(f"fastfeed: {name} loader over {store.path}: {len(store)} images, batch {cfg.batch_size} "
                     f"x {feed.world_size} rank(s), {cfg.workers} worker(s) per rank, imgsz {cfg.imgsz}, "
                     f"close_mosaic {cfg.close_mosaic}; {describe(cfg.hyp)}")
            if feed.cache_line:
                log.info(feed.cache_line)
        return feed

    def preprocess_batch(self, batch: dict) -> dict:
        batch = super().preprocess_batch(batch)     # to the device, /255 there, multi_scale: Ultralytics' own
        feed = getattr(self, "train_loader", None)
        if isinstance(feed, FastfeedTrainLoader):
            feed.copy_issued(self.device)
        return batch

    def auto_batch(self):
        """Ultralytics' AutoBatch, with the object count read from the store instead of a second dataset."""
        store = self.train_store(self.data["train"], -1)
        info = read_records(store, None)
        max_num_obj = max((len(c) for c in info.classes), default=0) * 4   # 4: mosaic, as Ultralytics counts
        return super(DetectionTrainer, self).auto_batch(max_num_obj, dataset_size=len(store))
