"""What a run reports: metrics.jsonl rows, the log line every --log-every steps (loss, lr, images/s, and
the step split into data / copy / compute / communication with utilisation and memory), and the final
summary with its bottleneck verdict. What the loop measures per log interval is a `Meter`: loss terms,
images/s, and where each loader batch's time went (waiting for data, the host->device copy the device
waited for, compute, DDP communication)."""

from __future__ import annotations

import json
import logging
import math
import time

import torch

from ..devices import memory_report, synchronize
from ..procs import usable_cores
from ..progress import bar
from .resume import run_config
from .verdict import PARTS, verdict

log = logging.getLogger(__name__)


class Meter:
    """Loss terms, loader batches, images and the seconds of each part of the step, summed since the last
    reset; accelerator utilisation samples (NVML) where the device reports them."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.items, self.n, self.batches, self.images = torch.zeros(3), 0, 0, 0
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self.util: list[float] = []
        self.t = time.perf_counter()

    @property
    def busy(self) -> float:
        """Seconds of the step accounted for (data + copy + compute + communication)."""
        return sum(self.seconds.values())

    def row(self) -> dict:
        """Mean loss terms per micro-batch; per loader batch, the ms of each part of the step; images/s
        over the wall time since the reset (evaluation excluded)."""
        terms = (self.items / max(self.n, 1)).tolist()
        per = 1e3 / max(self.batches, 1)
        return {"loss": sum(terms), "box": terms[0], "obj": terms[1], "cls": terms[2],
                "images_per_s": self.images / max(time.perf_counter() - self.t, 1e-9),
                **{f"{k}_ms": v * per for k, v in self.seconds.items()},
                "data_wait_frac": self.seconds["data"] / max(self.busy, 1e-9),
                "util_pct": sum(self.util) / len(self.util) if self.util else None}


class Reporter:
    """Meters for the log interval (`window`) and the whole run (`total`), metrics.jsonl and the progress bar
    (rank 0 only)."""

    def __init__(self, run, stack):
        self.run, self.window, self.total, self.evals, self.last_row = run, Meter(), Meter(), [], {}
        main = run.dd.main
        self.file = stack.enter_context(open(run.out / "metrics.jsonl", "a")) if main else None
        limit = run.cfg.max_steps or run.total_steps
        # A bar on a terminal only (progress.bar): in a log file the log lines say it, without carriage returns.
        self.bar = stack.enter_context(bar(total=min(run.total_steps, limit), initial=run.step, unit="step",
                                           desc="train", progress=run.cfg.progress and main))
        self.t_start = time.perf_counter()

    def record(self, row: dict) -> None:
        if self.file:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()

    def warn(self, message: str, row: dict) -> None:
        log.warning("%s", message)
        self.record(row)

    def started(self) -> None:
        r = self.run
        p = plan(r)
        self.record({"event": "resume" if r.resumed else "start", "config": run_config(r), "params": r.params,
                     "gflops": r.gflops, "world_size": r.dd.world_size, "epoch": r.epoch, "step": r.step,
                     "steps_per_epoch": r.steps_per_epoch, "images_per_step": r.images_per_step,
                     "micro_batch": r.micro.size, "batch_auto": r.batch_auto, "plan": p})
        r.say("%s", plan_text(p))
        if p["left_out"] >= 0.1 * p["images"] and r.dd.main:   # the start row's plan keeps both figures
            log.warning("%d of the store's %d images are left out of every epoch (an epoch is whole batches of %d x %d "
                        "process(es)); a --batch that divides %d leaves none out", p["left_out"], p["images"],
                        p["batch"], p["world_size"], p["images"] // p["world_size"])
        if p["mosaic"] and p["mosaic_epochs"] == 0 and r.dd.main:
            log.warning("mosaic is never used: --close-mosaic %d covers all %d epochs; give a smaller --close-mosaic "
                        "to train with mosaic", r.cfg.close_mosaic, r.cfg.epochs)

    def add_time(self, **seconds: float) -> None:
        for m in (self.window, self.total):
            for k, v in seconds.items():
                m.seconds[k] += max(v, 0.0)

    def add_step(self, losses: list, batches: int, images: int, util: float | None) -> None:
        """A finished optimizer step: its micro-batches' loss terms, its loader batches, the images it trained
        on (all ranks), the accelerator's utilisation after it (None: not known)."""
        for m in (self.window, self.total):
            for items in losses:   # each micro-batch's [box, obj, cls], averaged over ranks
                m.items += items
            m.n += len(losses)
            m.batches += batches
            m.images += images
            m.util += [] if util is None else [util]
        self.bar.update(1)

    def step_done(self, lr: float, end_of_epoch: bool) -> None:
        r = self.run
        if not (r.step % r.cfg.log_every == 0 or end_of_epoch or r.step == r.cfg.max_steps):
            return
        row = self.last_row = {"epoch": r.epoch, "step": r.step, "lr": lr, **self.window.row(),
                               **memory_report(r.device), "micro_batch": r.micro.size}
        self.record(row)
        self.bar.set_postfix(loss=f"{row['loss']:.3f}", img_s=f"{row['images_per_s']:.0f}")
        extra = "" if row["util_pct"] is None else f", busy {row['util_pct']:.0f}%"
        if "mem_frac" in row:
            extra += f", memory {row['mem_frac']:.0%} of {row['mem_total_mb'] / 1024:.0f} GiB"
        r.say("epoch %d/%d step %d loss %.4f (box %.4f obj %.4f cls %.4f) lr %.2e %.0f img/s; per batch: data %.1f ms, "
              "copy %.1f ms, compute %.1f ms, comm %.1f ms%s", r.epoch + 1, r.cfg.epochs, r.step, row["loss"], row["box"],
              row["obj"], row["cls"], lr, row["images_per_s"], row["data_ms"], row["h2d_ms"], row["compute_ms"],
              row["comm_ms"], extra)
        self.window.reset()

    def eval_done(self, res: dict) -> None:
        r = self.run
        self.evals.append({"epoch": r.epoch, "step": r.step, **{k: res[k] for k in ("map50", "map")}})
        self.record({"event": "eval", **self.evals[-1]})
        epoch = math.ceil(r.step / max(r.steps_per_epoch, 1))   # the epoch of the last step (1-based, as the log line)
        r.say("epoch %d/%d: mAP@0.5 %.4f, mAP@0.5:0.95 %.4f", epoch, r.cfg.epochs, res["map50"], res["map"])

    def context(self) -> dict:
        """What the verdict's advice needs to know about the run."""
        r, c = self.run, self.run.cfg
        return {"loader": c.loader, "workers": r.loader.cfg.workers, "cores": usable_cores(), "device": r.device.type,
                "amp": c.amp, "channels_last": c.channels_last, "device_augment": c.device_augment,
                "batch_auto": r.batch_auto is not None, "model": c.model, "imgsz": c.imgsz}

    def summary(self, **extra) -> dict:
        """The run's summary (plus `extra`, e.g. what stopped it), recorded as metrics.jsonl's last row."""
        r = self.run
        synchronize(r.device)
        tot = self.total.row()
        mem = memory_report(r.device)
        judged = verdict(tot | mem, r.micro.batch, self.context())
        s = {"mode": "train", "run_dir": str(r.out), "model": r.cfg.model, "params": r.params, "gflops": r.gflops,
             "imgsz": r.cfg.imgsz, "device": str(r.device), "world_size": r.dd.world_size, "batch": r.micro.batch,
             "micro_batch": r.micro.size, "accum": r.accum, "micro_batches_per_step": r.micro.per_batch * r.accum,
             "images_per_step": r.images_per_step, "epoch": r.epoch, "epochs": r.cfg.epochs, "step": r.step,
             "images": self.total.images, "resumed": r.resumed,
             "wall_s": time.perf_counter() - self.t_start,
             "images_per_s": self.total.images / max(self.total.busy, 1e-9),
             **{k: tot[k] for k in ("data_wait_frac", "data_ms", "h2d_ms", "compute_ms", "comm_ms", "util_pct")},
             "loss": self.last_row.get("loss"), "last_checkpoint": str(r.out / "last.pt"),
             "best_map": r.best if r.best >= 0 else None, "evals": self.evals, **mem, "bottleneck": judged}
        if self.evals:
            s.update(map50=self.evals[-1]["map50"], map=self.evals[-1]["map"])
        s.update(extra)
        self.record({"event": "summary", **s})
        log.debug("%s", judged["text"])   # the summary that carries it is what the CLI prints
        return s


def plan(run) -> dict:
    """What the run will really do, from what set_up built: batches per epoch and the images drop_last leaves
    out of each, optimizer steps and their images, the epochs with mosaic."""
    cfg, lcfg, world = run.cfg, run.loader.cfg, run.dd.world_size
    n, batch = len(run.store), run.micro.batch
    tail = run.nb % run.accum
    mosaic = lcfg.augment and lcfg.hyp.mosaic > 0
    mosaic_epochs = sum(lcfg.mosaic_on(e) for e in range(cfg.epochs)) if mosaic else 0
    return {"images": n, "batch": batch, "world_size": world, "batches_per_epoch": run.nb,
            "left_out": n - run.nb * batch * world if lcfg.drop_last else 0,
            "accum": run.accum, "steps_per_epoch": run.steps_per_epoch, "images_per_step": run.images_per_step,
            "last_step_images": tail * batch * world if tail else run.images_per_step,
            "epochs": cfg.epochs, "augment": lcfg.augment, "mosaic": mosaic, "mosaic_epochs": mosaic_epochs,
            "close_mosaic": lcfg.close_mosaic}


def plan_text(p: dict) -> str:
    procs = f" x {p['world_size']} processes" if p["world_size"] > 1 else ""
    text = (f"plan: {p['images']} images; per epoch {p['batches_per_epoch']} batches of {p['batch']}{procs}"
            + (f", {p['left_out']} images left out (whole batches only; other ones each epoch)" if p["left_out"] else "")
            + f"; {p['steps_per_epoch']} optimizer step(s) per epoch of {p['images_per_step']} images "
              f"({p['accum']} batch(es) each")
    if p["last_step_images"] != p["images_per_step"]:
        text += f", the epoch's last {p['last_step_images']}"
    text += f"); {p['epochs']} epochs, "
    if not p["augment"]:
        return text + "no augmentation (--no-augment)"
    if not p["mosaic"]:
        return text + "mosaic off (its gain is 0)"
    closed = p["epochs"] - p["mosaic_epochs"]
    if p["mosaic_epochs"] == 0:
        return text + f"none with mosaic (--close-mosaic {p['close_mosaic']} covers them all)"
    return text + (f"mosaic in epochs 1-{p['mosaic_epochs']}" + (f", without it in the last {closed} (--close-mosaic)"
                                                                  if closed else ""))
