"""`StoppableMixin`: an Ultralytics trainer (any task's) that stops between optimizer steps and resumes mid-epoch;
FASTFEED_SAVE_EVERY_MIN=N saves every N minutes. What a checkpoint holds
is resume.py's, an exact resume exact.py's. `train_loader` must be a `FastfeedTrainLoader` (its `position` and its
loader's state are what is saved). A data source lost for good stops the run with last.pt at the last optimizer step,
under DDP every rank at the same step (docs/design.md, 'Under DDP the ranks stop together').
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from ultralytics.utils import DEFAULT_CFG, RANK
from ultralytics.utils.torch_utils import unwrap_model

from ...devices import rng_state, set_rng_state
from ...loaders.position import same_order
from ...preempt import SaveTimer, StopSignals
from ...train import distributed
from ...train.checkpoint import check_intact, write_atomically
from ...train.guards import DataSourceFailed, ranks_lost, source_failure
from ...train.oom import BufferSnapshot
from .args import log
from .exact import STATE_KEY, Rhythm, restore_training_state, training_state
from .resume import (
    STOP_FILE,
    Preempted,
    captured_save,
    describe_stop,
    launch_ranks,
    mid_epoch_checkpoint,
    position_of,
    save_every_min,
    saved_state,
    write_stop_file,
)


class StoppableMixin:
    """Stopping on a signal, saving and resuming mid-epoch (see the module); no loader of its own. Put it before
    an Ultralytics trainer class in the bases: `class T(StoppableMixin, SegmentationTrainer)`."""

    _ff_signals = None
    _ff_timer = None
    _ff_done = (-1, 0)   # (epoch, batches) at the last optimizer step
    ff_last_step = -1   # the loop's batch count (epoch x batches per epoch + batch) at the last optimizer step
    ff_rhythm = None    # after a mid-epoch resume: the uninterrupted run's step schedule, continued (exact.py)
    _ff_buffers = _ff_began = None   # BatchNorm statistics, generators at the last step (or epoch's start): _ff_mark

    def __init__(self, cfg=DEFAULT_CFG, overrides=None, _callbacks=None):
        self._ff_every = save_every_min()   # a bad value fails here, before anything is built
        super().__init__(cfg, overrides, _callbacks)

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
            done = super()._do_train()
        except (Preempted, DataSourceFailed):   # every rank stopped together, last.pt written
            self._ff_close()
            self._ff_let_go()
            raise
        except Exception as e:
            message = source_failure(e)   # the store failed for good (object storage out): save first, as a stop does
            self._ff_close()   # any failure: the workers and the shm cache go now, not when the process ends (a notebook)
            if message is None:
                raise
            raise DataSourceFailed(self._ff_lost_source(message)) from None   # (one process; DDP: _ff_agree)
        self._ff_let_go()
        return done

    def _ff_let_go(self) -> None:
        """A DDP rank whose training ended (or that stopped with the others): the DDP wrapper dropped and the process
        group Ultralytics made destroyed, which Ultralytics 8.4 leaves to the interpreter's exit, where a collective
        backend's thread freeing its last all-reduce can abort the rank (train/setup._release_ddp says how)."""
        if self.world_size > 1 and RANK != -1 and torch.distributed.is_initialized():
            self.model = unwrap_model(self.model)
            torch.distributed.destroy_process_group()

    def _ff_close(self) -> None:
        for loader in (getattr(self, "train_loader", None), getattr(self, "test_loader", None)):
            if hasattr(loader, "close"):
                loader.close()

    def _ff_lost_source(self, message: str) -> str:
        """Every rank (under DDP where they agreed): the batches after the last optimizer step undone (they are
        trained again on resume, so their gradients are not kept: they would count twice; the BatchNorm statistics
        and random generators as that step left them); rank 0: a mid-epoch last.pt there; the error's message."""
        self.optimizer.zero_grad()
        if self._ff_began is not None:
            self._ff_buffers.restore()
            set_rng_state(self._ff_began, torch.device(self.device))
        rngs = self._ff_rngs()
        epoch, batches = self._ff_done if self._ff_done[0] == self.epoch else (self.epoch, 0)
        pos = self._ff_position("data source failed", epoch_end=False) | {"epoch": epoch, "batches": batches}
        if not self.args.save:
            return f"{message}; training stopped after {batches} batches of epoch {epoch + 1} (save=False: no last.pt)"
        if RANK in (-1, 0):
            mid_epoch_checkpoint(self, super().save_model, pos, training_state(self, rngs) | {"grads": None})
        return (f"{message}; training stopped after {batches} batches of epoch {epoch + 1}: {self.last} holds them: "
                f"continue with YOLO({str(self.last)!r}).train(resume=True, trainer={type(self).__name__}) once it "
                "is reachable")

    def _ff_mark(self) -> None:
        """The BatchNorm statistics and random generators now (after an optimizer step, at an epoch's start): what
        a lost source puts back (one fused copy and the generators' state: 0.1-0.2 ms for yolov8n on a CPU)."""
        if self._ff_buffers is None:
            self._ff_buffers = BufferSnapshot(unwrap_model(self.model))
        self._ff_buffers.take()
        self._ff_began = rng_state(torch.device(self.device))

    def optimizer_step(self):
        stop, save = self._ff_agree(epoch_end=False)   # before the step: one a rank trained blank is never applied
        super().optimizer_step()
        self._ff_done = (self.epoch, getattr(self.train_loader, "position", 0))   # where a lost source saves
        self.ff_last_step = self.epoch * len(self.train_loader) + self._ff_done[1] - 1
        self._ff_mark()
        self._ff_act(stop, save, epoch_end=False)

    def run_callbacks(self, event: str):
        if self.ff_rhythm is not None:
            self.ff_rhythm.on_event(self, event)
        if event == "on_train_epoch_start":
            self._ff_mark()
        elif event == "on_train_epoch_end":   # a source lost after the epoch's last step stops every rank here (a
            self._ff_agree(epoch_end=True)    # signal is acted on after validation)
        super().run_callbacks(event)
        if event == "on_fit_epoch_end":   # every rank, after validation and the epoch's save_model
            self._ff_act(*self._ff_agree(epoch_end=True), epoch_end=True)

    def _ff_dist(self) -> distributed.Dist:
        return distributed.Dist(max(RANK, 0), self.world_size if RANK != -1 else 1)

    def _ff_agree(self, epoch_end: bool) -> tuple[bool, bool]:
        """(stop, save) as every rank agrees: a signal to any rank, rank 0's --save-every-min timer (not at an
        epoch's end). Under DDP one all-reduce of three numbers per optimizer step, the third a data source lost on
        any rank (its feed trains blank batches meanwhile): then no rank applies the step, rank 0 writes last.pt
        and the stop file (which the launching process reads), and every rank raises the same DataSourceFailed."""
        signals, timer, d = self._ff_signals, self._ff_timer, self._ff_dist()   # (None: _do_train without train())
        stop = signals is not None and signals.requested is not None
        save = not epoch_end and RANK in (-1, 0) and timer is not None and timer.due()
        if d.world_size > 1:
            lost = getattr(self.train_loader, "lost", None)
            agreed = distributed.all_mean(torch.tensor([stop, save, lost is not None], dtype=torch.float32,
                                                       device=self.device), d).tolist()
            if agreed[2] > 0:
                message = self._ff_lost_source(ranks_lost(lost, d))
                if RANK == 0:
                    write_stop_file(self.save_dir, {"why": "data source failed", "message": message,
                                                    "saved_at": time.time()})
                distributed.barrier(d)   # nobody leaves before last.pt is on disk
                raise DataSourceFailed(message)
            stop, save = agreed[0] > 0, agreed[1] > 0
        return stop, save

    def _ff_act(self, stop: bool, save: bool, epoch_end: bool) -> None:
        """After an optimizer step (or an epoch's end): stop on an agreed signal, or save on the timer."""
        if stop:
            self._ff_signals.note(1.0)
            if epoch_end and self.epoch + 1 >= self.epochs:
                return   # the last epoch is done: let the run finish (resume would have nothing to do)
            self._ff_stop(epoch_end)
        elif save:
            rngs = self._ff_rngs()
            if RANK in (-1, 0):
                self._ff_save("timer", rngs)

    def _ff_rngs(self) -> list:
        """Every rank's random generators, for the checkpoint (every rank calls it where they meet: one
        all_gather_object under DDP)."""
        return distributed.gather(rng_state(torch.device(self.device)), self._ff_dist())

    def _ff_position(self, why: str, epoch_end: bool) -> dict:
        feed = self.train_loader
        epoch, batches = (self.epoch + 1, 0) if epoch_end else (self.epoch, feed.position)   # the loader's count
        return {"epoch": epoch, "batches": batches, "batch_size": feed.batch_size, "world_size": feed.world_size,
                "loader": feed.loader.state_dict(epoch, batches),
                "stopped_by": self._ff_signals.reason() if why == "signal" else None, "why": why,
                "saved_at": time.time()}

    def _ff_save(self, why: str, rngs: list) -> dict:
        """Rank 0: a mid-epoch last.pt at the loader's position (`rngs`: every rank's generators)."""
        pos = self._ff_position(why, epoch_end=False)
        if not self.args.save:
            log.warning("fastfeed: save=False: no mid-epoch last.pt written")
            return pos
        seconds = mid_epoch_checkpoint(self, super().save_model, pos, training_state(self, rngs))
        self._ff_timer.saved()
        log.info(f"fastfeed: {self.last} at epoch {pos['epoch'] + 1}, batch {pos['batches']} of {len(self.train_loader)} "
                 f"({why}; written in {seconds:.2f} s)")
        return pos

    def _ff_stop(self, epoch_end: bool) -> None:
        """Every rank: rank 0 writes (mid-epoch: last.pt; at an epoch's end Ultralytics' last.pt again, with what
        an exact resume needs) and leaves STOP_FILE; then all raise Preempted together."""
        pos = self._ff_position("signal", epoch_end)
        rngs = self._ff_rngs()
        if RANK in (-1, 0):
            if not epoch_end:
                self._ff_save("signal", rngs)
            elif self.args.save:
                mid_epoch_checkpoint(self, super().save_model, pos, training_state(self, rngs))
            write_stop_file(self.save_dir, pos)
        distributed.barrier(self._ff_dist())   # nobody leaves before last.pt is on disk
        message = describe_stop(pos, self.last, type(self).__name__)
        if RANK in (-1, 0):
            log.warning(message)
        raise Preempted(message)

    def save_model(self):
        """Ultralytics' save_model, every file it writes written atomically."""
        saved, files = captured_save(self, super().save_model)
        for path, data in files.items():
            write_atomically(path, lambda f, data=data: f.write(data), size=len(data))
        if self._ff_timer is not None:
            self._ff_timer.saved()
        return saved

    def check_resume(self, overrides):
        """Ultralytics' resume (which reads only the arguments of last.pt), refused when a record of last.pt does not
        match its CRC-32: torch.load checks none, and would resume from silently different weights."""
        super().check_resume(overrides)
        if self.resume:
            check_intact(self.args.resume)

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
            restore_training_state(self, state, RANK)
        exact = same_order(self.train_loader.loader, saved_state(pos, self.train_loader.loader))
        if batches:   # the loader's contract says what changed and continues the epoch
            line = self.train_loader.resume_from(saved_state(pos, self.train_loader.loader))
            self._ff_done = (epoch, self.train_loader.loader.start)   # a source lost before the first step keeps it
            log.info(f"fastfeed: {line} ({len(self.train_loader)} batches an epoch)")
        if state is not None and exact:   # the loop counts from 0 again: continue the uninterrupted run's steps
            self.ff_last_step, self.ff_rhythm = state["last_step"], Rhythm.resumed(self, state, epoch, batches)
