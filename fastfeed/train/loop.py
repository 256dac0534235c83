"""The training loop, top to bottom: set up, then for each epoch and micro-batch: wait for data,
forward, loss, backward; every `accum` micro-batches an optimizer step and an EMA update; at the
end of each epoch an evaluation and a checkpoint.

Conventions that shape it:
- The loss is a *sum* over images (loss.py multiplies the per-term means by the batch size), so
  accumulated micro-batches and DDP ranks add up to the gradient of one big batch; DDP averages
  over ranks, hence the x world_size. The lr and weight decay are tuned for 64 images per step.
- A "step" is an optimizer step. The LR schedule, warmup, EMA and --max-steps count those.
- One host-device sync per micro-batch: reading the loss. It is needed anyway to catch a NaN
  *before* the optimizer step spreads it into the weights, and it gives the step timer a real end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from ..devices import memory_mb, resolve_device, synchronize
from . import distributed
from .checkpoint import CheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import NOMINAL_BATCH, TrainConfig
from .device import AMP_DTYPES, TrainError, autocast, device_batches, grad_scaler
from .evaluate import evaluate
from .loss import YoloLoss
from .metrics import Meter
from .model import build_model, count_flops, count_parameters
from .optim import ModelEMA, build_optimizer, set_lr

log = logging.getLogger(__name__)

GRAD_CLIP = 10.0   # max gradient norm: a rare bad batch early on must not throw the weights away


class TrainingDiverged(TrainError):
    """The loss became NaN or infinite; the last good checkpoint is left as it was."""


@dataclass
class TrainResult:
    summary: dict                                  # what the CLI prints; also the last line of metrics.jsonl
    model: torch.nn.Module | None = None           # the trained model (unwrapped, on its device)
    ema: torch.nn.Module | None = None             # its EMA (rank 0 only)
    evals: list = field(default_factory=list)


def micro_step(model, loss_fn, images, targets, *, device, amp, scaler, loss_scale: float):
    """Forward + loss + backward of one micro-batch; gradients accumulate into .grad.
    Returns the detached [box, obj, cls] loss terms."""
    with autocast(device, amp):
        preds = model(images)
    loss, items = loss_fn(preds, targets)   # in fp32, outside autocast
    scaler.scale(loss * loss_scale).backward()
    return items


def load_weights(model, path, device) -> dict:
    """Model weights from a checkpoint (its EMA when it has one: that is what was evaluated)."""
    ckpt = load_checkpoint(path, device)
    if ckpt["model_name"] != model.name or ckpt["nc"] != model.nc:
        raise CheckpointError(f"{path} holds a {ckpt['model_name']} with {ckpt['nc']} classes; this run builds a "
                              f"{model.name} with {model.nc} classes (the store's)")
    model.load_state_dict(ckpt["ema"] if ckpt.get("ema") is not None else ckpt["model"])
    return ckpt


def _diverged(epoch: int, step: int, items: torch.Tensor, last: Path) -> str:
    terms = ", ".join(f"{v:.4g}" for v in items.tolist())
    return (f"loss became non-finite at epoch {epoch}, step {step} (box, obj, cls = {terms}); stopped before the "
            f"optimizer step. The last good checkpoint is {last} (unchanged): resume from it with --resume, and try "
            "a lower --lr, a longer --warmup-epochs, or --amp bf16 / no --amp")


def train(cfg: TrainConfig) -> TrainResult:
    from ..loaders import LoaderConfig, create_loader
    from ..store.reader import Store

    # --- devices and processes ----------------------------------------------------------------------
    device = resolve_device(cfg.device, distributed.local_rank())
    dd = distributed.setup(device)
    out = Path(cfg.out)
    with contextlib.ExitStack() as stack:   # closes what is opened below, last first, also on errors
        stack.callback(distributed.teardown, dd)
        if dd.main:
            out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.seed)   # the same initial weights on every rank (DDP broadcasts rank 0's anyway)

        # --- data ---------------------------------------------------------------------------------------
        val_store = Store(cfg.val) if cfg.val is not None else None
        store = Store(cfg.data) if not cfg.eval_only else val_store
        nc = len(store.class_names)
        if val_store is not None and val_store.class_names != store.class_names:
            raise TrainError(f"--val {cfg.val} has other classes than --data {cfg.data}: pack both with the same "
                             "categories")

        # --- model ------------------------------------------------------------------------------------
        eval_kw = dict(imgsz=cfg.imgsz, batch_size=cfg.batch, device=device, workers=cfg.workers, loader=cfg.loader,
                       amp=cfg.amp, conf_thres=cfg.conf_thres, iou_thres=cfg.iou_thres, progress=cfg.progress)
        if cfg.eval_only:   # --- evaluate a checkpoint and stop (the network is the checkpoint's) -------
            name = load_checkpoint(cfg.weights, "cpu")["model_name"]
            model = build_model(name, nc).to(device)
            load_weights(model, cfg.weights, device)
            res = evaluate(model, val_store, **eval_kw) if dd.main else {}
            summary = {"mode": "eval", "weights": str(cfg.weights), "val": str(cfg.val), "model": name,
                       "imgsz": cfg.imgsz, **res}
            return TrainResult(summary, model)

        model = build_model(cfg.model, nc).to(device)
        params, gflops = count_parameters(model), count_flops(cfg.model, nc, cfg.imgsz)
        say = log.info if dd.main else log.debug   # rank 0 speaks for the run
        say("%s: %.1f M parameters, %.1f GFLOPs per image at %d", cfg.model, params / 1e6, gflops, cfg.imgsz)

        if len(store) < cfg.batch * dd.world_size:
            raise TrainError(f"--batch {cfg.batch} x {dd.world_size} process(es) is more than the store's "
                             f"{len(store)} images; use a smaller --batch")
        accum = cfg.resolved_accum(dd.world_size)
        loader = create_loader(cfg.loader, store, LoaderConfig(
            imgsz=cfg.imgsz, batch_size=cfg.batch, augment=cfg.augment, seed=cfg.seed, epochs=cfg.epochs,
            close_mosaic=cfg.close_mosaic, **({} if cfg.workers is None else {"workers": cfg.workers})))
        stack.callback(loader.close)
        nb = len(loader)                                    # micro-batches per epoch on this rank
        steps_per_epoch = math.ceil(nb / accum)             # an epoch's tail makes a short last step
        total_steps = cfg.epochs * steps_per_epoch
        warmup = round(cfg.warmup_epochs * steps_per_epoch)
        images_per_step = cfg.batch * accum * dd.world_size

        # --- loss, optimizer, EMA, mixed precision -------------------------------------------------------
        loss_fn = YoloLoss(model, cfg.imgsz, box=cfg.box, obj=cfg.obj, cls=cfg.cls, anchor_t=cfg.anchor_t)
        # Weight decay is set per 64 images: the gradient is a sum over images, the decay is not.
        wd = cfg.weight_decay * images_per_step / NOMINAL_BATCH
        optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.momentum, wd)
        scaler = grad_scaler(device, cfg.amp)
        ema = ModelEMA(model) if (cfg.ema and dd.main) else None
        epoch, step, skip, best = 0, 0, 0, -1.0

        # --- resume, or start from given weights -------------------------------------------------------
        if cfg.resume:
            path = out / "last.pt" if cfg.resume is True else Path(cfg.resume)
            ckpt = load_checkpoint(path, device)
            if (ckpt["model_name"], ckpt["nc"]) != (cfg.model, nc):
                raise CheckpointError(f"{path} is a {ckpt['model_name']} with {ckpt['nc']} classes, not a "
                                      f"{cfg.model} with {nc}: resume with the run's --model and --data")
            now = cfg.to_dict() | {"accum": accum}
            for k in ("batch", "accum", "imgsz", "optimizer", "lr", "epochs"):
                if ckpt["config"].get(k) != now[k]:
                    log.warning("resuming with --%s %s; the run used %s", k, now[k], ckpt["config"].get(k))
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scaler.load_state_dict(ckpt["scaler"])
            if ema is not None and ckpt.get("ema") is not None:
                ema.ema.load_state_dict(ckpt["ema"])
                ema.updates = ckpt["ema_updates"]
            epoch, step, skip, best = ckpt["epoch"], ckpt["step"], ckpt["batches_done"], ckpt["best_map"]
            set_rng_state(ckpt["rng"], device)
            log.info("resumed %s at epoch %d, step %d", path, epoch, step)
        elif cfg.weights is not None:
            load_weights(model, cfg.weights, device)
            if ema is not None:
                ema = ModelEMA(model)

        raw_model = model
        if dd.world_size > 1:
            model = DDP(model, device_ids=[device.index] if device.type != "cpu" else None)
        raw_model.grad_ckpt = cfg.grad_ckpt
        loss_scale = dd.world_size   # DDP averages over ranks; the loss is meant to sum over images

        def state(batches_done: int) -> dict:
            return {"model_name": cfg.model, "nc": nc, "class_names": store.class_names, "imgsz": cfg.imgsz,
                    "config": cfg.to_dict() | {"accum": accum}, "model": raw_model.state_dict(),
                    "ema": ema.ema.state_dict() if ema else None, "ema_updates": ema.updates if ema else 0,
                    "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "epoch": epoch, "step": step,
                    "batches_done": batches_done, "best_map": best, "rng": rng_state(device)}

        metrics = stack.enter_context(open(out / "metrics.jsonl", "a")) if dd.main else None

        def record(row: dict) -> None:
            if metrics:
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()

        dtype = AMP_DTYPES[cfg.amp] if cfg.amp else torch.float32
        feed = device_batches(loader, device, dtype)
        stack.callback(feed.close)
        bar = stack.enter_context(tqdm(total=min(total_steps, cfg.max_steps or total_steps), initial=step,
                                       unit="step", desc="train", disable=not (cfg.progress and dd.main)))
        t_start, window, total, evals, last_row = time.perf_counter(), Meter(), Meter(), [], {}
        record({"event": "resume" if cfg.resume else "start", "config": cfg.to_dict() | {"accum": accum},
                "params": params, "gflops": gflops, "world_size": dd.world_size, "epoch": epoch, "step": step,
                "steps_per_epoch": steps_per_epoch, "images_per_step": images_per_step})
        stop = cfg.max_steps is not None and step >= cfg.max_steps

        # --- epochs ----------------------------------------------------------------------------------
        while epoch < cfg.epochs and not stop:
            feed.set_epoch(epoch)
            model.train()
            window.reset()   # images/s counts training time, not the evaluation's
            batches = iter(feed)
            for _ in range(skip):   # resuming mid-epoch: the loader replays the epoch, skip what was done
                next(batches)
            micro = skip
            while micro < nb:
                # The micro-batches of this optimizer step: `accum`, or what is left of the epoch.
                n_micro = min(accum, nb - micro)
                lr = set_lr(optimizer, step, total_steps, warmup, cfg.lr, cfg)
                for k in range(n_micro):
                    # --- wait for data: time blocked here is time the device would idle ---------------
                    t0 = time.perf_counter()
                    images, targets = next(batches)
                    t1 = time.perf_counter()
                    # --- forward, loss, backward (DDP all-reduces gradients only on the last micro-batch) -
                    last = k == n_micro - 1
                    with model.no_sync() if (dd.world_size > 1 and not last) else contextlib.nullcontext():
                        items = micro_step(model, loss_fn, images, targets, device=device, amp=cfg.amp, scaler=scaler,
                                           loss_scale=loss_scale)
                    # --- sync point: the loss terms reach the host (averaged over ranks, so a NaN on any
                    # rank stops every rank). Stopping here, before the optimizer step, keeps the NaN out of
                    # the weights and the EMA. It also ends the compute timer for real: t2 - t1 is forward
                    # + backward, plus whatever of the previous optimizer step was still queued.
                    items = distributed.all_mean(items, dd).cpu()
                    if not torch.isfinite(items).all():
                        record({"event": "diverged", "epoch": epoch, "step": step, "loss_terms": items.tolist()})
                        raise TrainingDiverged(_diverged(epoch, step, items, out / "last.pt"))
                    t2 = time.perf_counter()
                    micro += 1
                    for meter in (window, total):
                        meter.add(items, len(images) * dd.world_size, t1 - t0, t2 - t1)

                # --- optimizer step: unscale (fp16), clip, step, EMA -------------------------------------
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), GRAD_CLIP)
                scaler.step(optimizer)   # skipped by the scaler when fp16 gradients overflowed
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                if ema is not None:
                    ema.update(raw_model)
                step += 1
                bar.update(1)

                # --- log every --log-every steps -----------------------------------------------------
                if step % cfg.log_every == 0 or micro == nb or step == cfg.max_steps:
                    r = last_row = {"epoch": epoch, "step": step, "lr": lr, **window.row(), **memory_mb(device)}
                    record(r)
                    bar.set_postfix(loss=f"{r['loss']:.3f}", img_s=f"{r['images_per_s']:.0f}")
                    say("epoch %d step %d loss %.4f (box %.4f obj %.4f cls %.4f) lr %.2e %.0f img/s, per micro-batch "
                        "data %.1f ms compute %.1f ms", epoch, step, r["loss"], r["box"], r["obj"], r["cls"], lr,
                        r["images_per_s"], r["data_ms"], r["compute_ms"])
                    window.reset()

                if cfg.max_steps is not None and step >= cfg.max_steps:
                    stop = True
                    break
            if hasattr(batches, "close"):
                batches.close()   # an abandoned epoch (--max-steps) releases its batches

            # --- end of epoch (or of --max-steps): evaluate, checkpoint ----------------------------------
            done = micro if micro < nb else 0
            if done == 0:
                epoch += 1
            last_epoch = epoch >= cfg.epochs or stop
            if dd.main:
                if val_store is not None and (last_epoch or (done == 0 and epoch % cfg.eval_every == 0)):
                    synchronize(device)
                    res = evaluate(ema.ema if ema else raw_model, val_store, **eval_kw)
                    evals.append({"epoch": epoch, "step": step, **{k: res[k] for k in ("map50", "map")}})
                    record({"event": "eval", **evals[-1]})
                    log.info("epoch %d: mAP@0.5 %.4f, mAP@0.5:0.95 %.4f", epoch, res["map50"], res["map"])
                    if res["map"] > best:
                        best = res["map"]
                        save_checkpoint(out / "best.pt", state(done))
                save_checkpoint(out / "last.pt", state(done))
            distributed.barrier(dd)
            skip = done

        # --- summary ---------------------------------------------------------------------------------
        synchronize(device)
        wall, tot = time.perf_counter() - t_start, total.row()
        summary = {"mode": "train", "run_dir": str(out), "model": cfg.model, "params": params, "gflops": gflops,
                   "imgsz": cfg.imgsz, "device": str(device), "world_size": dd.world_size, "accum": accum,
                   "images_per_step": images_per_step, "epoch": epoch, "step": step, "images": total.images,
                   "wall_s": wall, "images_per_s": total.images / max(total.data + total.compute, 1e-9),
                   "data_wait_frac": tot["data_wait_frac"], "data_ms": tot["data_ms"], "compute_ms": tot["compute_ms"],
                   "loss": last_row.get("loss"), "last_checkpoint": str(out / "last.pt"),
                   "best_map": best if best >= 0 else None, "evals": evals, **memory_mb(device)}
        if evals:
            summary.update(map50=evals[-1]["map50"], map=evals[-1]["map"])
        record({"event": "summary", **summary})
        return TrainResult(summary, raw_model, ema.ema if ema else None, evals)
