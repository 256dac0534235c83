"""`TrainConfig`: everything `fastfeed train` accepts, checked once, with errors naming the flag.

Standard library only (the CLI reads its defaults and choices here without importing torch, and a bare
GPU machine builds one); augmentation gains given as `hyp` import fastfeed.augment to be checked.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from ..checks import check_imgsz, is_int, is_num, need
from ..store.urls import location

MODELS = ("yolov3", "yolov3-tiny")   # the networks model.build_model builds
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "linear")
AMPS = ("bf16", "fp16")
DEFAULT_LR = {"sgd": 0.01, "adamw": 0.001}
NOMINAL_BATCH = 64   # images per optimizer step the default lr and weight decay are tuned for
DEFAULT_IMGSZ = 640  # --imgsz of a new run; --eval-only and --resume take the checkpoint's unless it is given


def load_hyp(hyp):
    """An AugmentHyp from an AugmentHyp, a dict of its fields, or a YAML file of them (`--hyp FILE`).
    Unknown keys are an error naming them; each value is checked by AugmentHyp (its valid range)."""
    from ..augment.hyp import AugmentHyp

    if isinstance(hyp, AugmentHyp):
        return hyp
    where = "--hyp"
    if isinstance(hyp, (str, Path)):
        import yaml

        where = f"--hyp {hyp}"
        try:
            hyp = yaml.safe_load(Path(hyp).read_text(encoding="utf-8"))
        except OSError as e:
            raise ValueError(f"{where}: cannot read it ({e.strerror or e})") from None
        except yaml.YAMLError as e:
            raise ValueError(f"{where} is not valid YAML: {e}") from None
        hyp = {} if hyp is None else hyp
    if not isinstance(hyp, dict):
        raise ValueError(f"{where} must be a mapping of augmentation gains (e.g. 'mosaic: 1.0'), got {type(hyp).__name__}")
    known = [f.name for f in fields(AugmentHyp)]
    unknown = sorted(str(k) for k in hyp if k not in known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(known)}")
    return AugmentHyp(**hyp)


@dataclass
class TrainConfig:
    data: Path | str | None = None       # the training store (not needed with eval_only)
    val: Path | str | None = None        # a store evaluated after each epoch (COCO mAP)
    loader: str = "cpu"
    model: str = "yolov3"
    imgsz: int | None = None             # None: DEFAULT_IMGSZ, or the checkpoint's (--eval-only, --resume)
    batch: int | str = 16                # images per loader batch and process; 'auto': the most that fits the device
    micro_batch: int | None = None       # images per forward/backward: each batch is split in these; None: = batch
    epochs: int = 300
    workers: int | None = None           # None: LoaderConfig's default (one per core, up to 8)
    hyp: object = None                   # AugmentHyp, a dict of its fields, or a YAML file; None: the defaults
    device_augment: bool = False         # HSV jitter and flip on the device instead of in the loader's workers
    device: str = "cpu"
    amp: str | None = None               # None | 'bf16' | 'fp16'
    grad_ckpt: bool = False
    channels_last: bool = False          # model and batches in channels-last (NHWC) memory format
    multi_scale: bool = False            # each optimizer step at a size drawn from 0.5-1.5 x imgsz
    sync_bn: bool = False                # SyncBatchNorm across DDP processes (CUDA / NPU)
    freeze_bn: bool = False              # BatchNorm keeps its running statistics and affine weights
    accum: int | None = None             # loader batches per optimizer step; None: to a nominal 64 images
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
    resume: bool | Path | str = False    # True: OUT/last.pt; 'auto': OUT/last.pt if it exists; or a checkpoint path
    force: bool = False                  # start a new run in an --out that holds one (its last.pt, metrics.jsonl)
    save_every_min: float | None = None  # also write last.pt every N minutes, mid-epoch (for kills with no notice)
    eval_only: bool = False
    weights: Path | str | None = None    # a checkpoint to start from / to evaluate
    log_every: int = 10
    max_steps: int | None = None         # stop after this many optimizer steps (schedule still spans epochs)
    eval_every: int = 1                  # epochs between evaluations on --val
    conf_thres: float = 0.001
    iou_thres: float = 0.6
    progress: bool = False
    store_options: object = None         # StoreOptions for --data/--val at a URL (never in to_dict: credentials)

    def __post_init__(self):
        for name in ("data", "val"):   # a store folder, or a store's URL (s3://...), which stays a string
            setattr(self, name, location(getattr(self, name)))
        for name in ("out", "weights"):
            v = getattr(self, name)
            setattr(self, name, Path(v) if v is not None else None)
        if isinstance(self.resume, str) and self.resume != "auto":
            self.resume = Path(self.resume)
        for name in ("augment", "device_augment", "ema", "grad_ckpt", "channels_last", "multi_scale", "sync_bn",
                     "freeze_bn", "force", "eval_only", "progress"):   # 'no' was True, or refused as LoaderConfig's
            need(isinstance(v := getattr(self, name), bool), f"TrainConfig.{name}", "must be True or False", v)
        need(self.eval_only or self.data is not None, "--data", "is required (a store made by `fastfeed pack`)",
             self.data)
        if self.eval_only and (missing := [f for f, v in (("--weights CKPT", self.weights), ("--val STORE", self.val))
                                           if v is None]):
            raise ValueError(f"--eval-only evaluates --weights CKPT on --val STORE: give {' and '.join(missing)}")
        need(self.model in MODELS, "--model", f"must be one of {', '.join(MODELS)}", self.model)
        if self.imgsz is None and not (self.eval_only or self.resume):   # else resume.resolve_imgsz decides
            self.imgsz = DEFAULT_IMGSZ
        if self.imgsz is not None:
            check_imgsz(self.imgsz)
        need(self.batch == "auto" or (is_int(self.batch) and self.batch >= 1), "--batch", "must be >= 1 or 'auto'",
             self.batch)
        need(self.micro_batch is None or (is_int(self.micro_batch) and self.micro_batch >= 1), "--micro-batch",
             "must be >= 1", self.micro_batch)
        need(self.micro_batch is None or self.batch == "auto" or self.micro_batch <= self.batch, "--micro-batch",
             f"must be <= --batch {self.batch} (a micro-batch is a slice of a loader batch)", self.micro_batch)
        need(is_int(self.epochs) and self.epochs >= 1, "--epochs", "must be >= 1", self.epochs)
        need(is_int(self.seed) and self.seed >= 0, "--seed", "must be an integer >= 0", self.seed)
        need(self.workers is None or (is_int(self.workers) and self.workers >= 0), "--workers",
             "must be >= 0 (0: in the training process)", self.workers)
        if self.hyp is not None:
            self.hyp = load_hyp(self.hyp)
        need(isinstance(self.device, str) and self.device.split(":")[0] in ("cpu", "cuda", "npu"), "--device",
             "must be cpu, cuda[:N] or npu[:N]", self.device)
        need(self.amp is None or self.amp in AMPS, "--amp", f"must be one of {', '.join(AMPS)}", self.amp)
        need(not (self.sync_bn and self.freeze_bn), "--sync-bn", "and --freeze-bn exclude each other (frozen "
             "BatchNorm uses its running statistics: there is nothing to synchronise)", (self.sync_bn, self.freeze_bn))
        need(self.accum is None or (is_int(self.accum) and self.accum >= 1), "--accum", "must be >= 1", self.accum)
        need(self.optimizer in OPTIMIZERS, "--optimizer", f"must be one of {', '.join(OPTIMIZERS)}", self.optimizer)
        if self.lr is None:
            self.lr = DEFAULT_LR[self.optimizer]
        need(is_num(self.lr) and self.lr > 0, "--lr", "must be > 0", self.lr)
        need(is_num(self.lrf) and 0 < self.lrf <= 1, "--lrf", "must be in (0, 1]", self.lrf)
        need(self.schedule in SCHEDULES, "--schedule", f"must be one of {', '.join(SCHEDULES)}", self.schedule)
        need(is_num(self.momentum) and 0 <= self.momentum < 1, "--momentum", "must be in [0, 1)", self.momentum)
        need(is_num(self.weight_decay) and self.weight_decay >= 0, "--weight-decay", "must be >= 0", self.weight_decay)
        need(is_num(self.warmup_epochs) and self.warmup_epochs >= 0, "--warmup-epochs", "must be >= 0",
             self.warmup_epochs)
        need(is_int(self.log_every) and self.log_every >= 1, "--log-every", "must be >= 1", self.log_every)
        need(self.max_steps is None or (is_int(self.max_steps) and self.max_steps >= 1), "--max-steps", "must be >= 1",
             self.max_steps)
        need(is_int(self.eval_every) and self.eval_every >= 1, "--eval-every", "must be >= 1", self.eval_every)
        need(self.save_every_min is None or (is_num(self.save_every_min) and self.save_every_min > 0),
             "--save-every-min", "must be a number of minutes > 0", self.save_every_min)
        need(is_int(self.close_mosaic) and self.close_mosaic >= 0, "--close-mosaic", "must be >= 0", self.close_mosaic)
        need(is_num(self.conf_thres) and 0 <= self.conf_thres < 1, "--conf", "must be in [0, 1)", self.conf_thres)
        need(is_num(self.iou_thres) and 0 < self.iou_thres <= 1, "--iou", "must be in (0, 1]", self.iou_thres)
        need(not (self.resume and self.weights is not None and not self.eval_only), "--resume",
             "and --weights exclude each other (--resume restores everything from the run's checkpoint)",
             (self.resume, self.weights))
        need(not (self.resume and (self.force or self.eval_only)), "--resume", "continues the run in --out; --force "
             "(start a new one there) and --eval-only (evaluate --weights) do something else: give one", self.resume)

    def resolved_accum(self, world_size: int, batch: int | None = None) -> int:
        """--accum, or enough loader batches to reach NOMINAL_BATCH images per optimizer step (`batch`:
        the resolved --batch, for 'auto')."""
        if self.accum is not None:
            return self.accum
        return max(1, round(NOMINAL_BATCH / ((batch or self.batch) * world_size)))

    def to_dict(self) -> dict:
        """Strings, numbers, bools and None only (it goes into checkpoints and metrics.jsonl)."""
        def plain(v):
            return str(v) if isinstance(v, Path) else dict(vars(v)) if hasattr(v, "__dataclass_fields__") else v

        return {f.name: plain(getattr(self, f.name)) for f in fields(self) if f.name != "store_options"}
