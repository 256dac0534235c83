"""What a resumed FastfeedTrainer run needs to train exactly as the uninterrupted one did (why: docs/training.md,
'Resuming', and docs/design.md, 'Under DDP the ranks stop together'). A mid-epoch last.pt adds,
under `STATE_KEY`, the weights, EMA and optimizer state in their training dtype, every rank's random generators,
the batch count at the last optimizer step, the epoch's mean loss so far and the gradients trained since the last
step. On resume they replace what Ultralytics restored, and `Rhythm` sets, before each batch's optimizer-step check,
the accumulation (and in a moved warmup ramp the learning rates and momentum) the uninterrupted run has there.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from ultralytics.utils.torch_utils import unwrap_model

from ...devices import set_rng_state

STATE_KEY = "fastfeed_state"   # beside Ultralytics' entries and the position (resume.KEY) in a mid-epoch last.pt
NO_STEP = sys.maxsize           # an accumulation no batch count reaches: the loop takes no step at this batch


def _cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value)
    return value


def training_state(trainer, rngs: list) -> dict:
    """The state a mid-epoch last.pt of FastfeedTrainer `trainer` keeps for an exact resume (`rngs`: every rank's
    generators, gathered where the ranks met)."""
    rhythm, feed = trainer.ff_rhythm, trainer.train_loader
    epoch_loss = rhythm.epoch_mean(trainer.epoch, trainer.tloss, feed.position) if rhythm else trainer.tloss
    return {"model": _cpu(unwrap_model(trainer.model).state_dict()), "ema": _cpu(trainer.ema.ema.state_dict()),
            "updates": int(trainer.ema.updates), "optimizer": _cpu(trainer.optimizer.state_dict()),
            "scaler": trainer.scaler.state_dict(), "rng": rngs,
            "last_step": int(trainer.ff_last_step),
            "epoch_loss": _cpu(epoch_loss),   # and the gradients of batches after the last step (at an epoch's end)
            "grads": [_cpu(p.grad) for p in unwrap_model(trainer.model).parameters()]}


def restore_training_state(trainer, state: dict, rank: int) -> None:
    """After Ultralytics' resume: the weights, EMA, optimizer and scaler as they were when the checkpoint was
    written (Ultralytics restored them from fp16 copies), and rank `rank`'s random generators (-1: one process; a
    rank the checkpoint has none for keeps Ultralytics' seeding, as does every DDP rank given a checkpoint from
    before each rank's were kept)."""
    unwrap_model(trainer.model).load_state_dict(state["model"])
    trainer.ema.ema.load_state_dict(state["ema"])
    trainer.ema.updates = state["updates"]
    saved = state["optimizer"]
    for theirs, ours in zip(saved["param_groups"], trainer.optimizer.param_groups):
        if "fused" in ours:
            theirs["fused"] = ours["fused"]   # the kernel follows this run's device
    trainer.optimizer.load_state_dict(saved)
    if state.get("scaler"):
        trainer.scaler.load_state_dict(state["scaler"])
    saved = state["rng"] if isinstance(state["rng"], list) else [state["rng"]] if rank == -1 else []
    if max(rank, 0) < len(saved):
        set_rng_state(saved[max(rank, 0)], torch.device(trainer.device))


class Rhythm:
    """The optimizer-step schedule of the uninterrupted run, continued after a mid-epoch resume.

    The loop decides a step by `its batch count - its count at the last step >= trainer.accumulate`; after the
    resume its count is short by `start` batches in the resumed epoch and its last step is unknown to it.
    `before_check` (called once per batch after the loop's warmup code, before its check) sets
    `trainer.accumulate` to 1 when the uninterrupted run steps at this batch and to NO_STEP when it does not;
    after the batch, `on_event` puts back the accumulation the uninterrupted run shows there (`nominal`)."""

    def __init__(self, epoch: int, start: int, acc0: int, warmup: int, epoch_loss=None):
        self.epoch, self.start, self.acc0, self.warmup = epoch, start, acc0, warmup
        self.epoch_loss = epoch_loss          # the resumed epoch's mean loss over its first `start` batches
        self.nominal = acc0
        self.grads = None          # gradients accumulated before the stop, added back before the first backward

    @classmethod
    def resumed(cls, trainer, state: dict, epoch: int, start: int) -> Rhythm:
        """For a trainer resumed at batch `start` of `epoch` (its accumulate: the nominal one, before any warmup)."""
        warmup = trainer._get_warmup_iterations(len(trainer.train_loader))
        rhythm = cls(epoch, start, trainer.accumulate, warmup, state.get("epoch_loss"))
        if any(g is not None for g in state.get("grads") or ()):
            rhythm.grads = state["grads"]
        return rhythm

    def before_check(self, trainer, count: int) -> None:
        """Batch count `count` (epoch x batches per epoch + batch) is in flight; the last step was at
        `trainer.ff_last_step`."""
        if self.grads is not None:   # the loop zeroed them at its start; this batch's backward adds to them
            for p, g in zip(unwrap_model(trainer.model).parameters(), self.grads):
                p.grad = None if g is None else g.to(p.device)
            self.grads = None
        epoch = trainer.epoch
        behind = self.start if epoch == self.epoch else 0   # how far the loop's count is behind ours
        if self.warmup and count - behind <= self.warmup:
            self._ramp(trainer, count, epoch)   # the loop ramped at its own count: set the values at ours
        else:
            self.nominal = self.acc0
        trainer.accumulate = 1 if count - trainer.ff_last_step >= self.nominal else NO_STEP

    def _ramp(self, trainer, count: int, epoch: int) -> None:
        """The warmup's values at batch count `count` (past the ramp: its end values)."""
        span = (0, self.warmup)
        self.nominal = max(1, round(float(np.interp(count, span, (1, self.acc0)))))
        args = trainer.args
        for group in trainer.optimizer.param_groups:
            first = args.warmup_bias_lr if group.get("param_group") == "bias" else 0.0
            group["lr"] = float(np.interp(count, span, (first, group["initial_lr"] * trainer.lf(epoch))))
            if "momentum" in group:
                group["momentum"] = float(np.interp(count, span, (args.warmup_momentum, args.momentum)))

    def on_event(self, trainer, event: str) -> None:
        if event == "on_train_batch_end":
            trainer.accumulate = self.nominal   # the loop's check has read Rhythm's step-or-not
        elif event == "on_train_epoch_end":     # the resumed epoch's mean loss over all its batches
            trainer.tloss = self.epoch_mean(trainer.epoch, trainer.tloss, trainer.train_loader.position)

    def epoch_mean(self, epoch: int, tloss, done: int):
        """The resumed epoch's mean loss over all its `done` batches (the loop's covers those after the resume)."""
        if epoch != self.epoch or not self.start or self.epoch_loss is None or tloss is None or done <= self.start:
            return tloss
        after = done - self.start
        return {k: (self.epoch_loss[k].to(v.device) * self.start + v * after) / done for k, v in tloss.items()}
