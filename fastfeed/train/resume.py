"""Resuming a run from its checkpoint, or starting one from given weights; what a checkpoint holds."""

from __future__ import annotations

import logging

from ..devices import rng_state, set_rng_state
from ..loaders.position import legacy_state
from . import distributed
from .checkpoint import CheckpointError, load_checkpoint
from .config import DEFAULT_IMGSZ
from .optim import ModelEMA

log = logging.getLogger(__name__)

CHECKED = ("accum", "optimizer", "lr", "epochs", "loader")   # a change here changes the run: say so (the loader's: its state)


def load_weights(model, path, device) -> dict:
    """Model weights from a checkpoint (its EMA when it has one: that is what was evaluated)."""
    ckpt = load_checkpoint(path, device)
    if ckpt["model_name"] != model.name or ckpt["nc"] != model.nc:
        raise CheckpointError(f"{path} holds a {ckpt['model_name']} with {ckpt['nc']} classes; this run builds a "
                              f"{model.name} with {model.nc} classes (the store's)")
    model.load_state_dict(ckpt["ema"] if ckpt.get("ema") is not None else ckpt["model"])
    return ckpt


def resolve_imgsz(cfg, ckpt: dict | None, path, doing: str) -> None:
    """The one size rule of a run that starts from a checkpoint (--resume, --eval-only): --imgsz when given,
    else the size the checkpoint was trained at (a new run: DEFAULT_IMGSZ), said in one line. A model trained
    at 128 and evaluated at 640 finds almost nothing: that must never happen by default."""
    theirs = None if ckpt is None else (ckpt.get("imgsz") or ckpt.get("config", {}).get("imgsz"))
    if cfg.imgsz is None:
        cfg.imgsz = theirs or DEFAULT_IMGSZ
        if theirs:
            log.info("%s at imgsz %d, the size %s was trained at (--imgsz to choose another)", doing, cfg.imgsz, path)
    elif theirs and cfg.imgsz != theirs and doing == "evaluating":   # a resume says it with the other CHECKED flags
        log.warning("evaluating at --imgsz %d; %s was trained at %d (without --imgsz it is evaluated at %d)",
                    cfg.imgsz, path, theirs, theirs)


def run_config(run) -> dict:
    """The run's configuration as checkpoints and metrics.jsonl keep it (with the resolved batch and accum)."""
    return run.cfg.to_dict() | {"batch": run.micro.batch, "accum": run.accum}


def gather_rngs(run) -> None:
    """Every rank's random generators (Python's, numpy's, torch's, the accelerator's), gathered where the ranks meet
    before a checkpoint (one all_gather_object; none with one process): rank 0 writes them, each rank restores its
    own. Between two such points rank 0 alone evaluates, so the others' are still the gathered ones then."""
    run.rngs = distributed.gather(rng_state(run.device), run.dd)


def checkpoint_state(run, *, batches: int | None = None, eval_pending: bool = False,
                     stopped_by: str | None = None) -> dict:
    """Everything `restore` needs to continue exactly where the run is: the loader's state after the last batch the
    feed handed to the step (`batches`: that many into `run.epoch` instead: a step in flight undone). `eval_pending`:
    the evaluation due at this epoch's end has not run; `stopped_by`: the signal that stopped the run, if one did."""
    ema = run.ema
    loader = run.feed.state_dict() if batches is None else run.loader.state_dict(run.epoch, batches)
    return {"model_name": run.cfg.model, "nc": run.raw_model.nc, "class_names": run.store.class_names,
            "imgsz": run.cfg.imgsz, "config": run_config(run), "model": run.raw_model.state_dict(),
            "ema": ema.ema.state_dict() if ema else None, "ema_updates": ema.updates if ema else 0,
            "optimizer": run.optimizer.state_dict(), "scaler": run.scaler.state_dict(), "epoch": loader["epoch"],
            "step": run.step, "batches_done": loader["batches"], "loader": loader,
            "micro_batch": run.micro.size, "best_map": run.best,
            "rng": [rng_state(run.device), *run.rngs[1:]], "eval_pending": eval_pending, "stopped_by": stopped_by}


def restore(run) -> None:
    """Weights, EMA, optimizer, scaler, counters and this rank's RNG states from the checkpoint set_up read."""
    ckpt, now = run.ckpt, run_config(run)
    for k in CHECKED:
        if ckpt["config"].get(k) != now[k]:
            log.warning("resuming with --%s %s; the run used %s", k, now[k], ckpt["config"].get(k))
    run.raw_model.load_state_dict(ckpt["model"])
    run.optimizer.load_state_dict(ckpt["optimizer"])
    run.scaler.load_state_dict(ckpt["scaler"])
    if run.ema is not None and ckpt.get("ema") is not None:
        run.ema.ema.load_state_dict(ckpt["ema"])
        run.ema.updates = ckpt["ema_updates"]
    run.step, run.best = ckpt["step"], ckpt["best_map"]
    # the loader's position and what made its batches, checked in one place (loaders/position.py); a checkpoint
    # from before it was kept: the position alone, taken as of this run's order with the run's batch size
    state = ckpt.get("loader") or legacy_state(run.loader, ckpt["epoch"], ckpt["batches_done"],
                                               batch_size=ckpt["config"].get("batch"))
    line = run.loader.load_state_dict(state)
    run.epoch, run.skip = run.loader.epoch, run.loader.start
    run.eval_pending = bool(ckpt.get("eval_pending")) and run.val_store is not None
    # each rank's generators (a checkpoint from before they were kept per rank: rank 0's on every rank); a rank the
    # stopped run did not have keeps the state set_up seeded
    saved = ckpt["rng"] if isinstance(ckpt["rng"], list) else [ckpt["rng"]] * run.dd.world_size
    if run.dd.rank < len(saved):
        set_rng_state(saved[run.dd.rank], run.device)
    if run.epoch < run.cfg.epochs or run.eval_pending:   # a finished run says so instead (loop.finished)
        run.say("resumed at step %d: %s%s", run.step, line,
                "; the evaluation of the epoch before is still to do" if run.eval_pending else "")
    run.ckpt, run.resumed = None, True   # its tensors are in place now


def start_from(run) -> None:
    """--resume: the checkpoint's state; --weights: those weights (and an EMA of them); else fresh weights."""
    if run.ckpt is not None:
        restore(run)
    elif run.cfg.weights is not None:
        load_weights(run.raw_model, run.cfg.weights, run.device)
        if run.ema is not None:
            run.ema = ModelEMA(run.raw_model)
