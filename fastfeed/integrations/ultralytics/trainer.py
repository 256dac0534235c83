"""`FastfeedTrainer`: Ultralytics' DetectionTrainer with its training batches from a fastfeed loader; `FastfeedMixin`:
the same before any task's trainer (the segment, pose and OBB ones below, each packing and accepting only its task's
stores; the pose trainer takes the store's keypoint shape and flip order, which must be data.yaml's). Only the train
loader changes (docs/design.md, 'Ultralytics through a subclass, never a copy'), and checkpoints gain a mid-epoch
form (resume.py). How to call them: the package's docstring.

Under DDP, Ultralytics rebuilds the trainer in every rank process (8.4 cloudpickles the class, which pickles by
reference: this module must be importable there, as it is wherever fastfeed is installed); local rank 0 packs
first, the others wait and reuse the store, and each rank reads its own share of every epoch.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.models.yolo.obb import OBBTrainer
from ultralytics.models.yolo.pose import PoseTrainer
from ultralytics.models.yolo.segment import SegmentationTrainer
from ultralytics.nn.tasks import guess_model_task
from ultralytics.utils import DEFAULT_CFG, RANK
from ultralytics.utils.torch_utils import torch_distributed_zero_first

from ... import tasks
from ...loaders import LoaderConfig, ShuffledOrder
from ...store.options import StoreOptions
from ...train import distributed
from .args import augment_hyp, describe, loader_name, loader_workers, log, task_fields, train_count, warn_unsupported
from .batches import ClassFilter, read_records
from .device import NAME as DEVICE_LOADER
from .device import finish_batch, for_plots, loader_setup
from .feed import FEED_CSV, FastfeedTrainLoader, append_row, epoch_line
from .stopping import StoppableMixin
from .store import check_boxes, check_classes, check_data, check_kpt_shape, check_task, prepare_store


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
    log.info(epoch_line(row, trainer.epochs, feed.loader.order.describe().get("link")))
    append_row(Path(trainer.save_dir) / FEED_CSV, row)


class FastfeedMixin(StoppableMixin):
    """An Ultralytics trainer whose train loader is fastfeed's (put it first in the bases, before the trainer class;
    `fastfeed_task`: the store task it trains on, set by the task trainers below): `cache=False|'disk'` -> the `cpu`
    loader, `cache=True|'ram'` -> `shm` (one decoded copy per node), `FASTFEED_LOADER=cpu|shm|dali|device` overrides
    (device: batches decoded and augmented on the trainer's device, device.py).
    The train split is packed on first use (store.py; `FASTFEED_STORE=PATH`: use that one); the feed and its report are
    feed.py's, stopping and mid-epoch resume stopping.py's.
    `store_options` (a `StoreOptions`: shard cache, its limit, read-ahead, storage options) says how a store at
    a URL (FASTFEED_STORE=s3://...) is read; None, or a field left None, takes the environment's (resolved here, at
    the door: `StoreOptions.from_env`), else the built-in default.
    Ultralytics builds the trainer from its class, so give them on one: `FastfeedTrainer.with_store_options(...)`."""

    store_options: StoreOptions | None = None
    fastfeed_task: str = "detect"   # the store task this trainer trains on (the task trainers below set theirs)
    _ff_store = None

    @classmethod
    def with_store_options(cls, options: StoreOptions | None = None, **fields) -> type[FastfeedMixin]:
        """This trainer class with `store_options` set: `options` (or the class's) with the fields given over it,
        e.g. `trainer=FastfeedTrainer.with_store_options(shard_cache_limit="50G", read_ahead=4)`. An unknown field is
        a TypeError naming the known ones. The class (with its options) is pickled into Ultralytics' DDP state file
        for the ranks: give credentials the standard ways (environment, profile) rather than as storage options."""
        given = StoreOptions.of(options if options is not None else cls.store_options, **fields)
        return type(cls.__name__, (cls,), {"store_options": given, "__module__": cls.__module__,
                                           "__doc__": cls.__doc__})

    def __init__(self, cfg=DEFAULT_CFG, overrides=None, _callbacks=None):
        overrides = overrides or {}
        check_data(overrides.get("data"))   # else Ultralytics' 'No YAML file found in .../coco.ff'
        # the model's task as YOLO(model).train(...) gives it, before Ultralytics reads data.yaml ('No kpt_shape')
        self.check_model_task(overrides.get("task", self.fastfeed_task), overrides.get("model"))
        super().__init__(cfg, overrides, _callbacks)
        self.add_callback("on_train_start", _fresh_feed_file)
        self.add_callback("on_train_epoch_end", _feed_epoch_end)

    def train_store(self, dataset_path, rank: int = -1):
        """The store for the train split, prepared once per trainer (local rank 0 first under DDP); never one
        without boxes, nor one of another task (or another kpt_shape) than this trainer's."""
        if self._ff_store is None:
            with torch_distributed_zero_first(rank):
                # single_cls: Ultralytics reads every class id (its names are overridden to one), so the pack
                # takes the dataset's own names, and the batches' classes become 0 (ClassFilter)
                names = None if self.args.single_cls else self.data.get("names")
                self._ff_store = prepare_store(dataset_path, progress=RANK in (-1, 0), names=names,
                                               options=StoreOptions.from_env(os.environ, self.store_options),
                                               task=self.fastfeed_task,
                                               data_yaml=self.data.get("yaml_file"))
            check_task(self._ff_store, self.fastfeed_task, self.data, type(self).__name__)
            check_boxes(self._ff_store)
            if not self.args.single_cls:
                check_classes(self._ff_store, self.data["names"], self.data["nc"])
        return self._ff_store

    def get_model(self, cfg=None, weights=None, verbose=True):
        """Ultralytics' model, refused by name when built for another task than this trainer's."""
        model = super().get_model(cfg, weights, verbose)
        self.check_model_task(guess_model_task(model), self.args.model)
        return model

    @classmethod
    def check_model_task(cls, task: str, model) -> None:
        if task != cls.fastfeed_task:
            fit = next((c.__name__ for c in FastfeedMixin.__subclasses__() if c.fastfeed_task == task), None)
            raise ValueError(f"{cls.__name__} trains {cls.fastfeed_task} models, but {model} is a model for {task}: "
                             + (f"give trainer={fit}" if fit else "fastfeed feeds none"))

    def get_dataloader(self, dataset_path, batch_size: int = 16, rank: int = 0, mode: str = "train"):
        if mode != "train":
            return super().get_dataloader(dataset_path, batch_size, rank, mode)   # validation stays Ultralytics'
        store = self.train_store(dataset_path, rank)
        name = loader_name(self.args.cache)
        if RANK in (-1, 0):
            warn_unsupported(self.args, self.fastfeed_task, name)
        hyp = augment_hyp(self.args, name)
        options = loader_setup(self) if name == DEVICE_LOADER else {}   # batches finished on this device, in its dtype
        count = train_count(self.args, len(store))   # `fraction`: the first `count` records
        cfg = LoaderConfig(imgsz=int(self.args.imgsz), batch_size=max(1, min(batch_size, count)),
                           workers=loader_workers(self.args.workers, self.device), seed=int(self.args.seed),
                           shuffle=True, drop_last=bool(self.args.compile), epochs=int(self.epochs),
                           close_mosaic=max(0, int(self.args.close_mosaic)), hyp=hyp,   # < 0: never, as Ultralytics
                           device=str(self.device) if self.device.type in ("cuda", "npu") else "cpu",
                           pin_memory=self.device.type == "cuda", local_world_size=distributed.local_world_size(),
                           **task_fields(self.args, self.fastfeed_task))
        if count < len(store):
            options["order"] = ShuffledOrder.for_loader(count, cfg, *cfg.resolved_rank())
        ref = weakref.ref(self)
        image_dir = Path(dataset_path) if isinstance(dataset_path, (str, os.PathLike)) else None
        feed = FastfeedTrainLoader(name, store, cfg, epoch_of=lambda: getattr(ref(), "epoch", 0), options=options,
                                   image_dir=image_dir, records=count, class_filter=ClassFilter(self.args.classes, self.args.single_cls))
        if RANK in (-1, 0):
            where = f", {options['dtype']} images made on {self.device}" if feed.on_device else ""
            if tasks.get(cfg.task).extra == "masks":
                where += (f", masks at 1/{cfg.mask_ratio} ({'one per image' if cfg.overlap_mask else 'one per object'})"
                          " drawn as Ultralytics draws its validation masks")
            log.info(f"fastfeed: {name} loader over {store.path}: {count} images{'' if count == len(store) else f' of {len(store)} (fraction)'}, batch {cfg.batch_size} "
                     f"x {feed.world_size} rank(s), {cfg.workers} worker(s) per rank, imgsz {cfg.imgsz}, "
                     f"close_mosaic {cfg.close_mosaic}{where}; {describe(cfg.hyp)}")
            if feed.shm_cache_line:
                log.info(feed.shm_cache_line)
        return feed

    def preprocess_batch(self, batch: dict) -> dict:
        feed = getattr(self, "train_loader", None)
        if self.ff_rhythm is not None:   # after the loop's warmup code, before its optimizer-step check
            self.ff_rhythm.before_check(self, self.epoch * len(feed) + feed.position - 1)
        if isinstance(feed, FastfeedTrainLoader) and feed.on_device:
            return finish_batch(self, batch, feed)   # on the device in the training dtype: nothing to convert
        batch = super().preprocess_batch(batch)     # to the device, /255 there, multi_scale: Ultralytics' own
        if isinstance(feed, FastfeedTrainLoader):
            feed.copy_issued(self.device)
        return batch

    def plot_training_samples(self, batch: dict, ni: int) -> None:
        super().plot_training_samples(for_plots(batch), ni)

    def auto_batch(self):
        """Ultralytics' AutoBatch, with the object count read from the store instead of a second dataset."""
        store = self.train_store(self.data["train"], -1)
        info = read_records(store, None)
        max_num_obj = max((len(c) for c in info.classes), default=0) * 4   # 4: mosaic, as Ultralytics counts
        return super(DetectionTrainer, self).auto_batch(max_num_obj, dataset_size=len(store))


class FastfeedTrainer(FastfeedMixin, DetectionTrainer):
    """Ultralytics' DetectionTrainer fed by fastfeed (`FastfeedMixin`)."""


class FastfeedSegmentationTrainer(FastfeedMixin, SegmentationTrainer):
    """Ultralytics' SegmentationTrainer fed by fastfeed from a segment store."""

    fastfeed_task = "segment"


class FastfeedPoseTrainer(FastfeedMixin, PoseTrainer):
    """Ultralytics' PoseTrainer fed by fastfeed from a pose store (kpt_shape and flip_idx: data.yaml's)."""

    fastfeed_task = "pose"

    def get_dataset(self):   # Ultralytics' data.yaml, kpt_shape checked by fastfeed (PoseTrainer's KeyError skipped)
        return check_kpt_shape(super(PoseTrainer, self).get_dataset(), StoreOptions.from_env(os.environ, self.store_options))


class FastfeedOBBTrainer(FastfeedMixin, OBBTrainer):
    """Ultralytics' OBBTrainer fed by fastfeed from an OBB store (rotated boxes)."""

    fastfeed_task = "obb"
