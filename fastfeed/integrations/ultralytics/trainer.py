"""`FastfeedTrainer`: Ultralytics' DetectionTrainer with its training batches from a fastfeed loader.

    YOLO("yolov8n.yaml").train(data="data.yaml", trainer=FastfeedTrainer, epochs=100, imgsz=640, batch=16)

Only the train loader changes, and checkpoints gain a mid-epoch form (resume.py). Validation, metrics,
the model, loss, optimiser, EMA, the checkpoint format and resume are Ultralytics' own. Under DDP, Ultralytics rebuilds the trainer in every rank process (8.4
cloudpickles the class, which pickles by reference: this module must be importable there, as it is
wherever fastfeed is installed); each rank then packs nothing (local rank 0 packs first, the others
wait and reuse the store), builds its own loader and reads its own share of every epoch.
"""

from __future__ import annotations

import os
import time
import weakref
from pathlib import Path

from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.utils import DEFAULT_CFG, RANK
from ultralytics.utils.torch_utils import torch_distributed_zero_first, unwrap_model

from ...loaders import LoaderConfig
from ...loaders.position import same_order
from ...preempt import SaveTimer, StopSignals
from ...train import distributed
from ...train.guards import DataSourceFailed, source_failure
from .args import augment_hyp, describe, loader_name, loader_workers, log, warn_unsupported
from .batches import ClassFilter, read_records
from .device import NAME as DEVICE_LOADER
from .device import finish_batch, for_plots, loader_setup
from .exact import STATE_KEY, Rhythm, restore_training_state, training_state
from .feed import FastfeedTrainLoader
from .report import FEED_CSV, append_row, epoch_line
from .resume import (
    STOP_FILE,
    Preempted,
    captured_save,
    describe_stop,
    launch_ranks,
    mid_epoch_checkpoint,
    position_of,
    resume_feed,
    save_every_min,
    saved_state,
    write_files,
    write_stop_file,
)
from .store import check_boxes, check_classes, prepare_store


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
    `cache=True|'ram'` -> `shm` (one decoded copy per node), `FASTFEED_LOADER=cpu|shm|dali|device` overrides
    (device: batches decoded and augmented on the trainer's device, device.py).
    The data.yaml's train split is packed into a store on first use (`FASTFEED_STORE=PATH`: use that one).
    Each epoch logs the feed's images/s and data-wait share, also written to `<save_dir>/fastfeed.csv`.
    A stop signal ends training after the optimizer step in flight with a mid-epoch last.pt that
    `resume=True` continues from the next batch; FASTFEED_SAVE_EVERY_MIN=N writes one every N minutes
    (resume.py)."""

    _ff_store = None
    _ff_signals = None
    _ff_timer = None
    _ff_done = (-1, 0)   # (epoch, batches) at the last optimizer step
    _ff_last_step = -1   # the loop's batch count (epoch x batches per epoch + batch) at the last optimizer step
    _ff_rhythm = None    # after a mid-epoch resume: the uninterrupted run's step schedule, continued (exact.py)

    def __init__(self, cfg=DEFAULT_CFG, overrides=None, _callbacks=None):
        self._ff_every = save_every_min()   # a bad value fails here, before anything is built
        super().__init__(cfg, overrides, _callbacks)
        self.add_callback("on_train_start", _fresh_feed_file)
        self.add_callback("on_train_epoch_end", _feed_epoch_end)

    # --- stopping, saving and resuming mid-epoch (resume.py) --------------------------------------------------

    def train(self):
        if self.ddp:   # this process launches the ranks: it forwards signals and reads how they stopped
            return launch_ranks(self, super().train)
        self._ff_signals = StopSignals(what="finishing the optimizer step in flight and saving a mid-epoch last.pt")
        self._ff_timer = SaveTimer(self._ff_every)
        with self._ff_signals:
            return super().train()

    def _do_train(self):
        if RANK in (-1, 0):
            (Path(self.save_dir) / STOP_FILE).unlink(missing_ok=True)   # a previous stop's, now resumed
        try:
            return super()._do_train()
        except Preempted:
            self._ff_close()
            raise
        except Exception as e:
            message = source_failure(e)   # the store failed for good (object storage out): save first, as a stop does
            if message is None:
                raise
            self._ff_close()
            raise DataSourceFailed(self._ff_lost_source(message)) from None

    def _ff_close(self) -> None:
        for loader in (getattr(self, "train_loader", None), getattr(self, "test_loader", None)):
            if hasattr(loader, "close"):
                loader.close()

    def _ff_lost_source(self, message: str) -> str:
        """Rank 0: a mid-epoch last.pt at the last optimizer step (the batches after it are trained again on
        resume); the error's message."""
        epoch, batches = self._ff_done if self._ff_done[0] == self.epoch else (self.epoch, 0)
        pos = self._ff_position("data source failed", epoch_end=False) | {"epoch": epoch, "batches": batches}
        if not self.args.save:
            return f"{message}; training stopped after {batches} batches of epoch {epoch + 1} (save=False: no last.pt)"
        if RANK in (-1, 0):
            mid_epoch_checkpoint(self, super().save_model, pos, training_state(self))
        return (f"{message}; training stopped after {batches} batches of epoch {epoch + 1}: {self.last} holds them: "
                f"continue with YOLO({str(self.last)!r}).train(resume=True, trainer=FastfeedTrainer) once it is "
                "reachable")

    def optimizer_step(self):
        super().optimizer_step()
        self._ff_done = (self.epoch, getattr(self.train_loader, "position", 0))   # where a lost source saves
        self._ff_last_step = self.epoch * len(self.train_loader) + self._ff_done[1] - 1
        self._ff_step_boundary(epoch_end=False)

    def run_callbacks(self, event: str):
        if self._ff_rhythm is not None:
            self._ff_rhythm.on_event(self, event)
        super().run_callbacks(event)
        if event == "on_fit_epoch_end":   # every rank, after validation and the epoch's save_model
            self._ff_step_boundary(epoch_end=True)

    def _ff_step_boundary(self, epoch_end: bool) -> None:
        """After an optimizer step (or an epoch's end): stop on an agreed signal, or save on the timer."""
        signals = self._ff_signals
        if signals is None:   # _do_train called without train(): no handlers, nothing to do
            return
        world = self.world_size if RANK != -1 else 1
        stop = signals.requested is not None
        if world > 1:   # one all-reduce of one number per optimizer step: every rank stops after the same one
            stop = distributed.any_true(stop, distributed.Dist(RANK, world), self.device)
        if stop:
            signals.note(1.0)
            if epoch_end and self.epoch + 1 >= self.epochs:
                return   # the last epoch is done: let the run finish (resume would have nothing to do)
            self._ff_stop(epoch_end)
        elif not epoch_end and RANK in (-1, 0) and self._ff_timer.due():
            self._ff_save("timer")

    def _ff_position(self, why: str, epoch_end: bool) -> dict:
        feed = self.train_loader
        epoch, batches = (self.epoch + 1, 0) if epoch_end else (self.epoch, feed.position)
        return {"epoch": epoch, "batches": batches, "batch_size": feed.batch_size, "world_size": feed.world_size,
                "loader": feed.state_dict(epoch, batches),
                "stopped_by": self._ff_signals.reason() if why == "signal" else None, "why": why,
                "saved_at": time.time()}

    def _ff_save(self, why: str) -> dict:
        """Rank 0: a mid-epoch last.pt at the loader's position."""
        pos = self._ff_position(why, epoch_end=False)
        if not self.args.save:
            log.warning("fastfeed: save=False: no mid-epoch last.pt written")
            return pos
        seconds = mid_epoch_checkpoint(self, super().save_model, pos, training_state(self))
        self._ff_timer.saved()
        log.info(f"fastfeed: {self.last} at epoch {pos['epoch'] + 1}, batch {pos['batches']} of {len(self.train_loader)} "
                 f"({why}; written in {seconds:.2f} s)")
        return pos

    def _ff_stop(self, epoch_end: bool) -> None:
        """Every rank: rank 0 writes (mid-epoch: last.pt; at an epoch's end Ultralytics' last.pt again, with what
        an exact resume needs) and leaves STOP_FILE; then all raise Preempted together."""
        pos = self._ff_position("signal", epoch_end)
        if RANK in (-1, 0):
            if not epoch_end:
                self._ff_save("signal")
            elif self.args.save:
                mid_epoch_checkpoint(self, super().save_model, pos, training_state(self))
            write_stop_file(self.save_dir, pos)
        if self.world_size > 1 and RANK != -1:
            distributed.barrier(distributed.Dist(RANK, self.world_size))   # nobody leaves before last.pt is on disk
        message = describe_stop(pos, self.last)
        if RANK in (-1, 0):
            log.warning(message)
        raise Preempted(message)

    def save_model(self):
        """Ultralytics' save_model, every file it writes written atomically."""
        saved, files = captured_save(self, super().save_model)
        write_files(files)
        if self._ff_timer is not None:
            self._ff_timer.saved()
        return saved

    def resume_training(self, ckpt):
        """Ultralytics' resume; a mid-epoch checkpoint continues its epoch at the loader's position."""
        pos = position_of(ckpt) if self.resume else None
        if pos is None:
            return super().resume_training(ckpt)
        epoch, batches = int(pos["epoch"]), int(pos["batches"])
        model = unwrap_model(self.model)
        criterion, epochs = getattr(model, "criterion", None), self.epochs
        # Ultralytics resumes at ckpt["epoch"] + 1 and insists that is 1..epochs-1; in epoch 0 of a run ask
        # it for epoch 1 (and undo what that did to an end-to-end head's criterion, fresh in epoch 0).
        self.epochs = max(epochs, epoch + 2)
        try:
            super().resume_training({**ckpt, "epoch": max(epoch - 1, 0)})
        finally:
            self.epochs = epochs
        if epoch == 0 and getattr(model, "criterion", None) is not criterion:
            model.criterion = criterion
        self.start_epoch = epoch
        state = ckpt.get(STATE_KEY)
        if state is not None:   # the weights, EMA and optimizer as they were, not Ultralytics' fp16 copies
            restore_training_state(self, state, one_process=RANK == -1)
        exact = same_order(self.train_loader.loader, saved_state(pos, self.train_loader.loader))
        if batches:   # the loader's contract says what changed and continues the epoch (resume.resume_feed)
            line = resume_feed(pos, self.train_loader)
            self._ff_done = (epoch, self.train_loader.loader.start)   # a source lost before the first step keeps it
            log.info(f"fastfeed: {line} ({len(self.train_loader)} batches an epoch)")
        if state is not None and exact:   # the loop counts from 0 again: continue the uninterrupted run's steps
            self._ff_last_step, self._ff_rhythm = state["last_step"], Rhythm.resumed(self, state, epoch, batches)

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
        hyp, options = augment_hyp(self.args), {}
        if name == DEVICE_LOADER:   # batches finished on this trainer's device, in the dtype it trains in
            hyp, options = loader_setup(self, hyp)
        cfg = LoaderConfig(imgsz=int(self.args.imgsz), batch_size=max(1, min(batch_size, len(store))),
                           workers=loader_workers(self.args.workers, self.device), seed=int(self.args.seed),
                           shuffle=True, drop_last=bool(self.args.compile), epochs=int(self.epochs),
                           close_mosaic=int(self.args.close_mosaic), hyp=hyp,
                           device=str(self.device) if self.device.type in ("cuda", "npu") else "cpu",
                           pin_memory=self.device.type == "cuda")
        ref = weakref.ref(self)
        image_dir = Path(dataset_path) if isinstance(dataset_path, (str, os.PathLike)) else None
        feed = FastfeedTrainLoader(name, store, cfg, epoch_of=lambda: getattr(ref(), "epoch", 0), options=options,
                                   image_dir=image_dir, class_filter=ClassFilter(self.args.classes, self.args.single_cls))
        if RANK in (-1, 0):
            where = f", {options['dtype']} images made on {self.device}" if feed.on_device else ""
            log.info(f"fastfeed: {name} loader over {store.path}: {len(store)} images, batch {cfg.batch_size} "
                     f"x {feed.world_size} rank(s), {cfg.workers} worker(s) per rank, imgsz {cfg.imgsz}, "
                     f"close_mosaic {cfg.close_mosaic}{where}; {describe(cfg.hyp)}")
            if feed.cache_line:
                log.info(feed.cache_line)
        return feed

    def preprocess_batch(self, batch: dict) -> dict:
        feed = getattr(self, "train_loader", None)
        if self._ff_rhythm is not None:   # after the loop's warmup code, before its optimizer-step check
            self._ff_rhythm.before_check(self, self.epoch * len(feed) + feed.position - 1)
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
