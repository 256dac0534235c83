"""The training loop, top to bottom: set up (setup.py), resume or start from weights (resume.py), then per epoch the
optimizer steps over the loader's batches (`train_epoch`, each `optimizer_step` in step.py) and `end_of_epoch`
(last.pt, the evaluation when due, best.pt); a summary with the bottleneck verdict at the end (report.py). Where
each part is: docs/training.md, 'Where the code is'. A "step" is an optimizer step: the LR schedule, warmup, EMA,
--multi-scale's draw and --max-steps count those. Stopping early and --save-every-min: docs/design.md, 'A stop
signal costs at most the step in flight'.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import torch

from ..batch import close
from ..devices import rng_state, set_rng_state, synchronize
from ..preempt import SaveTimer, StopSignals
from . import distributed, guards
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig
from .evaluate import evaluate
from .guards import DataSourceFailed, RankSourceFailed, estimate, pace, ranks_lost, resume_hint, source_failure
from .model import build_model
from .report import Reporter
from .resume import checkpoint_state, gather_rngs, load_weights, resolve_imgsz, start_from
from .setup import open_run, same_classes, set_up, start
from .step import TrainingDiverged, micro_step, optimizer_step

__all__ = ["TrainResult", "TrainingDiverged", "micro_step", "train"]

log = logging.getLogger(__name__)


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
        signals = stack.enter_context(StopSignals())   # from here: a notice during set-up stops it too
        run = set_up(cfg, stack)
        run.signals, run.timer = signals, SaveTimer(cfg.save_every_min)
        start_from(run)
        if (done := finished(run)) is not None:
            return TrainResult(done, run.raw_model, run.ema.ema if run.ema else None)
        start(run, stack)
        guards.replace_old(run)   # --force: the old run's files go only now, the new one set up
        run.report = Reporter(run, stack)
        run.report.started()
        run.stop = cfg.max_steps is not None and run.step >= cfg.max_steps
        if not run.stop and run.device.type == "cpu" and run.dd.world_size == 1:   # (DDP's hooks would see its backward)
            run.cost_said = estimate(run)   # where a step is long: its cost before it is paid
        if run.eval_pending:   # a stop at the end of an epoch left its evaluation for now
            gather_rngs(run)   # evaluate_now writes last.pt again
            if run.dd.main:
                evaluate_now(run)
            distributed.barrier(run.dd)
        agree_to_stop(run)
        if run.stopped_by and not run.resumed:   # stopped before its first step: last.pt at step 0 for --resume
            gather_rngs(run)
            write_last(run, "signal")
        while run.epoch < cfg.epochs and not run.stop:
            done = train_epoch(run)
            end_of_epoch(run, done)
        summary = run.report.summary(**stopped(run))
        return TrainResult(summary, run.raw_model, run.ema.ema if run.ema else None, run.report.evals)


def train_epoch(run) -> int:
    """The optimizer steps of `run.epoch` from loader batch `run.skip` on (until --max-steps or a stop
    signal); returns the loader batches done in the epoch when it stopped early, 0 when it finished."""
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
            t0 = time.monotonic()
            run.signals.step_began(t0, run.step_s)   # a stop signal then says when this step should end
            began = rng_state(run.device)   # (tens of microseconds) what an undone step puts back
            try:
                lr = optimizer_step(run, batches, n)
            except Exception as e:
                lost_source(run, e, done, began)   # the data source failed for good: last.pt, then a named error
                raise
            took = time.monotonic() - t0
            if run.step_s is None:
                pace(run, took, "the first step took", tips=not run.cost_said)
            run.step_s = took if run.step_s is None else 0.7 * run.step_s + 0.3 * took
            done += n
            run.report.step_done(lr, end_of_epoch=done == nb)
            # --- step boundary: a stop signal (under DDP one every rank has: the same step on all), --max-steps,
            # the --save-every-min timer (rank 0's, agreed in the loss all-reduce: every rank gives its RNG states)
            if run.signals.stop_now(run.dd.world_size):
                run.stop, run.stopped_by = True, run.signals.reason()
                break
            if cfg.max_steps is not None and run.step >= cfg.max_steps:
                run.stop = True
                break
            if done < nb and (run.save_due if run.dd.world_size > 1 else run.timer.due()):
                gather_rngs(run)
                write_last(run, "timer")
    finally:
        close(batches)   # an abandoned epoch (--max-steps, a stop, an error) releases its batches
    return done if done < nb else 0


def lost_source(run, e: Exception, done: int, began: dict) -> None:
    """The training store failed for good mid-epoch (object storage still out after its retries, in this process
    or in a loader worker; under DDP on some rank, which every rank learnt at the same micro-batch: RankSourceFailed):
    on rank 0 last.pt at the last finished step (`done` batches; the step in flight is undone, as an out-of-memory
    replay undoes it, the random generators as they `began` it), as a stop signal would; then DataSourceFailed (on
    every rank, naming the rank whose source failed). The same for a loader worker that died, stalled or raised, in
    one process (LoaderFailed, with the worker's error). Anything else: nothing (the caller re-raises)."""
    from ..loaders.workers import WorkerError

    agreed, message = isinstance(e, RankSourceFailed), source_failure(run.failed or e)   # (run.failed: this rank's)
    worker = message is None and not agreed and isinstance(e, WorkerError)   # a worker died, stalled or raised
    if not agreed and (message is None and not worker or run.dd.world_size > 1):
        return
    run.optimizer.zero_grad(set_to_none=True)
    run.snapshot.restore()   # the BatchNorm statistics the unfinished step's forwards had moved
    set_rng_state(began, run.device)
    if agreed:   # every rank is here: which failed, and each rank's generators for last.pt
        message = ranks_lost(message, run.dd)
        gather_rngs(run)
    write_last(run, "loader failed" if worker else "data source failed", batches=done)   # the step in flight undone
    where = f"training stopped at epoch {run.epoch + 1}, step {run.step} ({done} of {run.nb} batches)"
    if worker:
        log.debug("the loader's error in full: %s", e)
        raise guards.LoaderFailed(f"{e.summary}\n{where}: {run.out / 'last.pt'} holds the last finished step: continue "
                                  "with the same command and --resume" + (" (-v shows the worker's traceback)" if
                                                                          str(e) != e.summary else "")) from None
    raise DataSourceFailed(f"{message}; {where}: {resume_hint(run.out / 'last.pt')}") from None


def end_of_epoch(run, done: int) -> None:
    """--- end of an epoch (or of --max-steps, or a stop signal): last.pt, then the evaluation on --val when due
    and best.pt. last.pt is written first, marked `eval_pending`, which a resumed run evaluates first (why:
    docs/design.md, 'A stop signal costs at most the step in flight')."""
    cfg = run.cfg
    if done == 0:
        run.epoch += 1
    finished = run.epoch >= cfg.epochs
    gather_rngs(run)   # every rank is here: their generators for last.pt (and best.pt)
    if run.stopped_by:   # a notice is short: no evaluation now; the one this epoch's end was due is pending
        pending = run.val_store is not None and done == 0 and (finished or run.epoch % cfg.eval_every == 0)
        write_last(run, "signal", eval_pending=pending)
    elif run.dd.main:
        due = run.val_store is not None and (finished or run.stop or (done == 0 and run.epoch % cfg.eval_every == 0))
        write_last(run, "epoch" if done == 0 else "stop", eval_pending=due)
        if due:
            evaluate_now(run)
    distributed.barrier(run.dd)
    run.skip = done
    agree_to_stop(run)


def evaluate_now(run) -> None:
    """Rank 0: evaluate on --val, keep best.pt, and write last.pt again with the evaluation done. A stop signal
    during it abandons it (last.pt, written before, keeps `eval_pending`)."""
    synchronize(run.device)
    model = run.ema.ema if run.ema else run.raw_model
    res = evaluate(model, run.val_store, **run.eval_kw(), stop=lambda: run.signals.requested is not None)
    if res is None:   # agree_to_stop, which every rank runs next, stops the run
        return
    run.report.eval_done(res)
    if res["map"] > run.best:
        run.best = res["map"]
        save_checkpoint(run.out / "best.pt", checkpoint_state(run))
    write_last(run, "eval")


def agree_to_stop(run) -> None:
    """Between epochs (and before the first step): a stop signal any rank got, say during rank 0's
    evaluation, stops every rank here (one all-reduce)."""
    if run.stop or run.dd.world_size <= 1 and run.signals.requested is None:
        return
    if distributed.any_true(run.signals.requested is not None, run.dd, run.device):
        run.signals.note(1.0)
        run.stop, run.stopped_by = True, run.signals.reason()


def write_last(run, why: str, eval_pending: bool = False, batches: int | None = None) -> None:
    """Rank 0 (the other ranks return): last.pt at the feed's position (`checkpoint_state`; `batches`: that many into
    `run.epoch`), and a metrics.jsonl row with what it cost."""
    if not run.dd.main:
        return
    t0 = time.perf_counter()
    path = run.out / "last.pt"
    state = checkpoint_state(run, batches=batches, eval_pending=eval_pending, stopped_by=run.stopped_by)
    save_checkpoint(path, state)
    seconds = time.perf_counter() - t0
    run.timer.saved()
    run.report.record({"event": "checkpoint", "why": why, "epoch": state["epoch"], "step": run.step, "batches_done":
                       state["batches_done"], "eval_pending": eval_pending, "seconds": seconds, "bytes": path.stat().st_size})
    if why == "timer":
        log.debug("--save-every-min: %s at epoch %d, batch %d in %.2f s", path, state["epoch"], state["batches_done"],
                  seconds)


def stopped(run) -> dict:
    """The summary's `stopped_by` (None: not stopped by a signal; the CLI exits with EXIT_PREEMPTED when it is
    set) and `stop_seconds` (from the signal to the checkpoint written), said once on rank 0."""
    if not run.stopped_by:
        return {"stopped_by": None}
    took = run.signals.seconds_since()
    if run.dd.main:
        log.warning("%s: stopped after step %d (epoch %d/%d, %d of %d batches)%s; %s holds it: continue with --resume",
                    run.stopped_by, run.step, run.epoch + 1, run.cfg.epochs, run.skip, run.nb,
                    "" if took is None else f", {took:.2f} s after the signal", run.out / "last.pt")
    return {"stopped_by": run.stopped_by, "stop_seconds": took}


def finished(run) -> dict | None:
    """A resumed run with nothing left to do (its epochs, or --max-steps, done; no evaluation pending): the
    summary that says so (where its weights are, its best mAP), instead of a run of zero steps."""
    cfg = run.cfg
    if not run.resumed or run.eval_pending or (run.epoch < cfg.epochs and (cfg.max_steps is None
                                                                            or run.step < cfg.max_steps)):
        return None
    best = run.out / "best.pt"
    return {"mode": "finished", "run_dir": str(run.out), "model": cfg.model, "epoch": run.epoch, "epochs": cfg.epochs,
            "step": run.step, "max_steps": cfg.max_steps, "best_map": run.best if run.best >= 0 else None,
            "best_checkpoint": str(best) if best.is_file() else None, "last_checkpoint": str(run.out / "last.pt")}


def evaluate_checkpoint(cfg: TrainConfig, stack) -> TrainResult:
    """--eval-only: COCO mAP of --weights on --val (the network is the checkpoint's)."""
    run = open_run(cfg, stack)
    ckpt = load_checkpoint(cfg.weights, "cpu")
    same_classes(ckpt, cfg.weights, run.store, f"--val {cfg.val}", "evaluate on a store of the classes it learnt")
    name = ckpt["model_name"]
    resolve_imgsz(cfg, ckpt, cfg.weights, "evaluating")
    del ckpt
    model = build_model(name, len(run.store.class_names)).to(run.device)
    load_weights(model, cfg.weights, run.device)
    batch = cfg.batch if cfg.batch != "auto" else TrainConfig.batch   # nothing to measure: the default
    kw = run.eval_kw() | {"batch_size": batch, "channels_last": False}   # a model built here, not channels-last
    res = evaluate(model, run.val_store, **kw) if run.dd.main else {}
    summary = {"mode": "eval", "weights": str(cfg.weights), "val": str(cfg.val), "model": name, "imgsz": cfg.imgsz,
               **res}
    return TrainResult(summary, model)
