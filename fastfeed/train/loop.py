"""The training loop, top to bottom: set up, resume (or start from weights), then epoch by epoch:
optimizer steps over the loader's batches (step.py), and at the end of each epoch an evaluation and
a checkpoint; a summary with the bottleneck verdict at the end.

    set_up         setup.py    devices, stores, model (--sync-bn/--freeze-bn/--channels-last), batch, loader, optimizer
    start_from     resume.py   --resume: the checkpoint's state; --weights: those weights
    train_epoch    here        the epoch's optimizer steps, from batch `skip` when resuming mid-epoch
    optimizer_step step.py     data wait, micro-batches (multi-scale, OOM replay), forward/backward, step, EMA
    end_of_epoch   here        evaluate on --val when due, best.pt, last.pt
    Reporter       report.py   log lines, metrics.jsonl, the summary and its verdict (verdict.py)

A "step" is an optimizer step. The LR schedule, warmup, EMA, --multi-scale's draw and --max-steps
count those. The lr and weight decay are tuned for 64 images per step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from ..devices import synchronize
from . import distributed
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig
from .evaluate import evaluate
from .model import build_model
from .report import Reporter
from .resume import checkpoint_state, load_weights, start_from
from .setup import open_run, set_up, start
from .step import TrainingDiverged, micro_step, optimizer_step

__all__ = ["TrainResult", "TrainingDiverged", "micro_step", "train"]


@dataclass
class TrainResult:
    summary: dict                                  # what the CLI prints; also the last line of metrics.jsonl
    model: torch.nn.Module | None = None           # the trained model (unwrapped, on its device)
    ema: torch.nn.Module | None = None             # its EMA (rank 0 only)
    evals: list = field(default_factory=list)


def train(cfg: TrainConfig) -> TrainResult:
    with contextlib.ExitStack() as stack:   # closes what is opened below, last first, also on errors
        if cfg.eval_only:
            return evaluate_checkpoint(cfg, stack)
        run = set_up(cfg, stack)
        start_from(run)
        start(run, stack)
        run.report = Reporter(run, stack)
        run.report.started()
        run.stop = cfg.max_steps is not None and run.step >= cfg.max_steps
        while run.epoch < cfg.epochs and not run.stop:
            done = train_epoch(run)
            end_of_epoch(run, done)
        summary = run.report.summary()
        return TrainResult(summary, run.raw_model, run.ema.ema if run.ema else None, run.report.evals)


def train_epoch(run) -> int:
    """The optimizer steps of `run.epoch` from loader batch `run.skip` on (until --max-steps); returns the
    loader batches done in the epoch when it stopped early, 0 when it finished."""
    cfg, nb = run.cfg, run.nb
    # Resuming mid-epoch: the loader starts at batch `skip` and gives exactly what an uninterrupted run gives
    # from there, without decoding or augmenting the batches before it.
    run.feed.set_epoch(run.epoch, start=run.skip)
    run.model.train()
    run.report.window.reset()   # images/s counts training time, not the evaluation's
    batches = iter(run.feed)
    done = run.skip
    try:
        while done < nb:
            n = min(run.accum, nb - done)   # this step's loader batches: accum, or what is left of the epoch
            lr = optimizer_step(run, batches, n)
            done += n
            run.report.step_done(lr, end_of_epoch=done == nb)
            if cfg.max_steps is not None and run.step >= cfg.max_steps:
                run.stop = True
                break
    finally:
        if hasattr(batches, "close"):
            batches.close()   # an abandoned epoch (--max-steps, an error) releases its batches
    return done if done < nb else 0


def end_of_epoch(run, done: int) -> None:
    """--- end of an epoch (or of --max-steps): evaluate on --val when due, keep best.pt, write last.pt."""
    cfg = run.cfg
    if done == 0:
        run.epoch += 1
    last_epoch = run.epoch >= cfg.epochs or run.stop
    if run.dd.main:
        if run.val_store is not None and (last_epoch or (done == 0 and run.epoch % cfg.eval_every == 0)):
            synchronize(run.device)
            res = evaluate(run.ema.ema if run.ema else run.raw_model, run.val_store, **run.eval_kw())
            run.report.eval_done(res)
            if res["map"] > run.best:
                run.best = res["map"]
                save_checkpoint(run.out / "best.pt", checkpoint_state(run, done))
        save_checkpoint(run.out / "last.pt", checkpoint_state(run, done))
    distributed.barrier(run.dd)
    run.skip = done


def evaluate_checkpoint(cfg: TrainConfig, stack) -> TrainResult:
    """--eval-only: COCO mAP of --weights on --val (the network is the checkpoint's)."""
    run = open_run(cfg, stack)
    name = load_checkpoint(cfg.weights, "cpu")["model_name"]
    model = build_model(name, len(run.store.class_names)).to(run.device)
    load_weights(model, cfg.weights, run.device)
    batch = cfg.batch if cfg.batch != "auto" else TrainConfig.batch   # nothing to measure: the default
    kw = dict(imgsz=cfg.imgsz, batch_size=batch, device=run.device,
              workers=cfg.workers, loader=cfg.loader, amp=cfg.amp, conf_thres=cfg.conf_thres,
              iou_thres=cfg.iou_thres, progress=cfg.progress)
    res = evaluate(model, run.val_store, **kw) if run.dd.main else {}
    summary = {"mode": "eval", "weights": str(cfg.weights), "val": str(cfg.val), "model": name, "imgsz": cfg.imgsz,
               **res}
    return TrainResult(summary, model)
