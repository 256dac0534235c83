"""What a run reports: metrics.jsonl rows, the log line every --log-every steps (loss, lr, images/s, and
the step split into data / copy / compute / communication with utilisation and memory), and the final
summary with its bottleneck verdict."""

from __future__ import annotations

import json
import logging
import time

from tqdm import tqdm

from ..devices import memory_report, synchronize
from ..procs import usable_cores
from .metrics import Meter
from .resume import run_config
from .verdict import verdict

log = logging.getLogger(__name__)


class Reporter:
    """Meters for the log interval (`window`) and the whole run (`total`), metrics.jsonl and the progress bar
    (rank 0 only)."""

    def __init__(self, run, stack):
        self.run, self.window, self.total, self.evals, self.last_row = run, Meter(), Meter(), [], {}
        main = run.dd.main
        self.file = stack.enter_context(open(run.out / "metrics.jsonl", "a")) if main else None
        limit = run.cfg.max_steps or run.total_steps
        self.bar = stack.enter_context(tqdm(total=min(run.total_steps, limit), initial=run.step, unit="step",
                                            desc="train", disable=not (run.cfg.progress and main)))
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
        self.record({"event": "resume" if r.cfg.resume else "start", "config": run_config(r), "params": r.params,
                     "gflops": r.gflops, "world_size": r.dd.world_size, "epoch": r.epoch, "step": r.step,
                     "steps_per_epoch": r.steps_per_epoch, "images_per_step": r.images_per_step,
                     "micro_batch": r.micro.size, "batch_auto": r.batch_auto})

    # --- what the step adds ---------------------------------------------------------------------------------

    def add_time(self, **seconds: float) -> None:
        for m in (self.window, self.total):
            m.add_time(**seconds)

    def add_step(self, losses: list, batches: int, images: int, util: float | None) -> None:
        """A finished optimizer step: its micro-batches' loss terms, its loader batches, the images it trained
        on (all ranks), the accelerator's utilisation after it (None: not known)."""
        for m in (self.window, self.total):
            for items in losses:
                m.add_loss(items)
            m.batches += batches
            m.images += images
            m.add_util(util)
        self.bar.update(1)

    # --- the log line -------------------------------------------------------------------------------------

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
        r.say("epoch %d step %d loss %.4f (box %.4f obj %.4f cls %.4f) lr %.2e %.0f img/s; per batch: data %.1f ms, "
              "copy %.1f ms, compute %.1f ms, comm %.1f ms%s", r.epoch, r.step, row["loss"], row["box"], row["obj"],
              row["cls"], lr, row["images_per_s"], row["data_ms"], row["h2d_ms"], row["compute_ms"], row["comm_ms"],
              extra)
        self.window.reset()

    def eval_done(self, res: dict) -> None:
        r = self.run
        self.evals.append({"epoch": r.epoch, "step": r.step, **{k: res[k] for k in ("map50", "map")}})
        self.record({"event": "eval", **self.evals[-1]})
        log.info("epoch %d: mAP@0.5 %.4f, mAP@0.5:0.95 %.4f", r.epoch, res["map50"], res["map"])

    # --- the summary --------------------------------------------------------------------------------------

    def context(self) -> dict:
        """What the verdict's advice needs to know about the run."""
        r, c = self.run, self.run.cfg
        return {"loader": c.loader, "workers": r.loader.cfg.workers, "cores": usable_cores(), "device": r.device.type,
                "amp": c.amp, "channels_last": c.channels_last, "device_augment": c.device_augment,
                "batch_auto": r.batch_auto is not None}

    def summary(self) -> dict:
        r = self.run
        synchronize(r.device)
        tot = self.total.row()
        mem = memory_report(r.device)
        judged = verdict(tot | mem, r.micro.batch, self.context())
        s = {"mode": "train", "run_dir": str(r.out), "model": r.cfg.model, "params": r.params, "gflops": r.gflops,
             "imgsz": r.cfg.imgsz, "device": str(r.device), "world_size": r.dd.world_size, "batch": r.micro.batch,
             "micro_batch": r.micro.size, "accum": r.accum, "micro_batches_per_step": r.micro.per_batch * r.accum,
             "images_per_step": r.images_per_step, "epoch": r.epoch, "step": r.step, "images": self.total.images,
             "wall_s": time.perf_counter() - self.t_start,
             "images_per_s": self.total.images / max(self.total.busy, 1e-9),
             **{k: tot[k] for k in ("data_wait_frac", "data_ms", "h2d_ms", "compute_ms", "comm_ms", "util_pct")},
             "loss": self.last_row.get("loss"), "last_checkpoint": str(r.out / "last.pt"),
             "best_map": r.best if r.best >= 0 else None, "evals": self.evals, **mem, "bottleneck": judged}
        if self.evals:
            s.update(map50=self.evals[-1]["map50"], map=self.evals[-1]["map"])
        self.record({"event": "summary", **s})
        r.say("%s", judged["text"])
        return s
