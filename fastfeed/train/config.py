"""`TrainConfig`: everything `fastfeed train` accepts, checked once, with errors naming the flag."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields
from pathlib import Path

from .model import MODELS

OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "linear")
AMPS = ("bf16", "fp16")
DEFAULT_LR = {"sgd": 0.01, "adamw": 0.001}
NOMINAL_BATCH = 64   # images per optimizer step the default lr and weight decay are tuned for


@dataclass
class TrainConfig:
    data: Path | str | None = None       # the training store (not needed with eval_only)
    val: Path | str | None = None        # a store evaluated after each epoch (COCO mAP)
    loader: str = "cpu"
    model: str = "yolov3"
    imgsz: int = 640
    batch: int = 16                      # per process (per rank under torchrun)
    epochs: int = 300
    workers: int | None = None           # None: LoaderConfig's default (one per core, up to 8)
    device: str = "cpu"
    amp: str | None = None               # None | 'bf16' | 'fp16'
    grad_ckpt: bool = False
    accum: int | None = None             # micro-batches per optimizer step; None: to a nominal 64 images
    optimizer: str = "sgd"
    lr: float | None = None              # None: 0.01 for SGD, 0.001 for AdamW
    lrf: float = 0.01                    # final lr = lr x lrf
    schedule: str = "cosine"
    momentum: float = 0.937              # SGD momentum / AdamW beta1
    weight_decay: float = 5e-4           # per 64 images: scaled by batch x accum x world / 64
    warmup_epochs: float = 3.0
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    box: float = 0.05
    obj: float = 1.0
    cls: float = 0.5
    anchor_t: float = 4.0
    ema: bool = True
    augment: bool = True                 # False: letterboxed training batches (debugging, overfitting)
    close_mosaic: int = 10
    seed: int = 0
    out: Path | str = Path("runs/train")
    resume: bool | Path | str = False    # True: OUT/last.pt; or a checkpoint path
    eval_only: bool = False
    weights: Path | str | None = None    # a checkpoint to start from / to evaluate
    log_every: int = 10
    max_steps: int | None = None         # stop after this many optimizer steps (schedule still spans epochs)
    eval_every: int = 1                  # epochs between evaluations on --val
    conf_thres: float = 0.001
    iou_thres: float = 0.6
    progress: bool = False

    def __post_init__(self):
        def need(ok, flag, rule, value):
            if not ok:
                raise ValueError(f"--{flag} {rule}, got {value!r}")

        def is_int(v):
            return isinstance(v, numbers.Integral) and not isinstance(v, bool)

        def is_num(v):
            return isinstance(v, numbers.Real) and not isinstance(v, bool)

        for name in ("data", "val", "out", "weights"):
            v = getattr(self, name)
            setattr(self, name, Path(v) if v is not None else None)
        if isinstance(self.resume, str):
            self.resume = Path(self.resume)
        need(self.eval_only or self.data is not None, "data", "is required (a store made by `fastfeed pack`)",
             self.data)
        need(not self.eval_only or (self.weights is not None and self.val is not None), "eval-only",
             "needs --weights CKPT and --val STORE", (self.weights, self.val))
        need(self.model in MODELS, "model", f"must be one of {', '.join(MODELS)}", self.model)
        need(is_int(self.imgsz) and self.imgsz >= 32 and self.imgsz % 32 == 0, "imgsz",
             "must be a positive multiple of 32 (the largest stride)", self.imgsz)
        need(is_int(self.batch) and self.batch >= 1, "batch", "must be >= 1", self.batch)
        need(is_int(self.epochs) and self.epochs >= 1, "epochs", "must be >= 1", self.epochs)
        need(self.workers is None or (is_int(self.workers) and self.workers >= 0), "workers",
             "must be >= 0 (0: in the training process)", self.workers)
        need(isinstance(self.device, str) and self.device.split(":")[0] in ("cpu", "cuda", "npu"), "device",
             "must be cpu, cuda[:N] or npu[:N]", self.device)
        need(self.amp is None or self.amp in AMPS, "amp", f"must be one of {', '.join(AMPS)}", self.amp)
        need(self.accum is None or (is_int(self.accum) and self.accum >= 1), "accum", "must be >= 1", self.accum)
        need(self.optimizer in OPTIMIZERS, "optimizer", f"must be one of {', '.join(OPTIMIZERS)}", self.optimizer)
        if self.lr is None:
            self.lr = DEFAULT_LR[self.optimizer]
        need(is_num(self.lr) and self.lr > 0, "lr", "must be > 0", self.lr)
        need(is_num(self.lrf) and 0 < self.lrf <= 1, "lrf", "must be in (0, 1]", self.lrf)
        need(self.schedule in SCHEDULES, "schedule", f"must be one of {', '.join(SCHEDULES)}", self.schedule)
        need(is_num(self.momentum) and 0 <= self.momentum < 1, "momentum", "must be in [0, 1)", self.momentum)
        need(is_num(self.weight_decay) and self.weight_decay >= 0, "weight-decay", "must be >= 0", self.weight_decay)
        need(is_num(self.warmup_epochs) and self.warmup_epochs >= 0, "warmup-epochs", "must be >= 0",
             self.warmup_epochs)
        need(is_int(self.log_every) and self.log_every >= 1, "log-every", "must be >= 1", self.log_every)
        need(self.max_steps is None or (is_int(self.max_steps) and self.max_steps >= 1), "max-steps", "must be >= 1",
             self.max_steps)
        need(is_int(self.eval_every) and self.eval_every >= 1, "eval-every", "must be >= 1", self.eval_every)
        need(is_int(self.close_mosaic) and self.close_mosaic >= 0, "close-mosaic", "must be >= 0", self.close_mosaic)
        need(is_num(self.conf_thres) and 0 <= self.conf_thres < 1, "conf", "must be in [0, 1)", self.conf_thres)
        need(is_num(self.iou_thres) and 0 < self.iou_thres <= 1, "iou", "must be in (0, 1]", self.iou_thres)
        need(not (self.resume and self.weights is not None and not self.eval_only), "resume",
             "and --weights exclude each other (--resume restores everything from the run's checkpoint)",
             (self.resume, self.weights))

    def resolved_accum(self, world_size: int) -> int:
        """--accum, or enough micro-batches to reach NOMINAL_BATCH images per optimizer step."""
        if self.accum is not None:
            return self.accum
        return max(1, round(NOMINAL_BATCH / (self.batch * world_size)))

    def to_dict(self) -> dict:
        """Strings, numbers, bools and None only (it goes into checkpoints and metrics.jsonl)."""
        return {f.name: (str(v) if isinstance(v, Path) else v) for f in fields(self) for v in [getattr(self, f.name)]}
