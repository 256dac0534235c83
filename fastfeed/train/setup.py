"""Setting a run up: devices and processes, stores, the model as the flags shape it, the batch (measured
with --batch auto), the loader and its device feed, loss, optimizer, EMA, DDP. Everything the loop
needs ends up in one `Run`."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import tasks
from ..checks import is_int
from ..devices import resolve_device, use_expandable_segments
from ..preempt import SaveTimer, StopSignals
from ..store import publish
from . import distributed
from .checkpoint import CheckpointError, load_checkpoint, remove_stale_temporaries
from .config import NOMINAL_BATCH, TrainConfig
from .device import AMP_DTYPES, TrainError, device_batches, grad_scaler, size_range
from .guards import check_out
from .loss import YoloLoss
from .model import build_model, count_flops, count_parameters, prepare_model
from .oom import BufferSnapshot, MicroBatches, auto_batch
from .optim import ModelEMA, build_optimizer
from .resume import resolve_imgsz
from .step import CommTimer, DeviceClock

log = logging.getLogger(__name__)


@dataclass
class Run:
    """A run in progress: what set_up built, and the counters that place it (epoch, step, skip)."""

    cfg: TrainConfig
    device: torch.device
    dd: distributed.Dist
    out: Path
    store: object
    val_store: object
    model: torch.nn.Module = None        # DDP-wrapped under torchrun
    raw_model: torch.nn.Module = None
    loss_fn: YoloLoss = None
    optimizer: torch.optim.Optimizer = None
    scaler: object = None
    ema: ModelEMA | None = None
    loader: object = None
    feed: object = None                  # the loader's batches on the device
    micro: MicroBatches = None
    accum: int = 1                       # loader batches per optimizer step
    nb: int = 0                          # loader batches per epoch on this rank
    steps_per_epoch: int = 0
    total_steps: int = 0
    warmup: int = 0
    images_per_step: int = 0
    params: int = 0
    gflops: float = 0.0
    ckpt: dict | None = None             # the checkpoint being resumed, until restored
    batch_auto: dict | None = None       # what --batch auto measured
    clock: DeviceClock = None
    comm: CommTimer | None = None
    snapshot: BufferSnapshot = None
    report: object = None                # report.Reporter
    epoch: int = 0
    step: int = 0
    skip: int = 0                        # loader batches of `epoch` already trained (resuming mid-epoch)
    best: float = -1.0
    stop: bool = False
    signals: StopSignals = field(default_factory=StopSignals)   # the run's stop request (train() installs it)
    timer: SaveTimer = field(default_factory=lambda: SaveTimer(None))   # --save-every-min
    stopped_by: str | None = None        # the signal that stopped the run (agreed by every rank)
    rngs: list = field(default_factory=list)   # every rank's random generators where they last met (resume.gather_rngs)
    save_due: bool = False               # under DDP: rank 0's --save-every-min timer, agreed in the loss all-reduce
    failed: Exception | None = None      # under DDP: this rank's data source failed for good (guards.RankSourceFailed)
    eval_pending: bool = False           # the resumed checkpoint's end-of-epoch evaluation is still to do
    resumed: bool = False                # continued from a checkpoint (--resume)
    step_s: float | None = None          # the measured seconds of an optimizer step (a moving average)
    cost_said: bool = False              # the smaller settings were named before the first step (guards.estimate)

    @property
    def say(self):
        return log.info if self.dd.main else log.debug   # rank 0 speaks for the run

    def eval_kw(self) -> dict:
        c = self.cfg
        return dict(imgsz=c.imgsz, batch_size=self.micro.size if self.micro else c.batch, device=self.device,
                    workers=c.workers, loader=c.loader, amp=c.amp, conf_thres=c.conf_thres, iou_thres=c.iou_thres,
                    progress=c.progress, channels_last=c.channels_last)


def open_run(cfg: TrainConfig, stack) -> Run:
    """Devices, processes, the run directory and the stores."""
    from ..store.reader import Store

    device = resolve_device(cfg.device, distributed.local_rank())
    if alloc := use_expandable_segments(device):   # before the first allocation on the device
        log.debug("CUDA allocator: %s", alloc)
    dd = distributed.setup(device)
    stack.callback(distributed.teardown, dd)
    # The stores first: a --data that is not a store is named before the run directory exists.
    val_store = Store(cfg.val, options=cfg.store_options) if cfg.val is not None else None
    store = Store(cfg.data, options=cfg.store_options) if not cfg.eval_only else val_store
    if val_store is not None and val_store.class_names != store.class_names:
        raise TrainError(f"--val {cfg.val} has other classes than --data {cfg.data}: pack both with the same "
                         "categories")
    out = Path(cfg.out)
    if dd.main:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:   # a file there, a read-only or missing parent
            why = "a file is there" if out.is_file() else f"{e.strerror}: {e.filename}"
            raise TrainError(f"--out {out} cannot be the run's folder ({why}): give another --out") from None
        try:   # one run per --out: two would interleave metrics.jsonl and overwrite each other's last.pt
            if not cfg.eval_only:
                stack.enter_context(publish.locked(out, path=out / ".train.lock"))
        except publish.LockBusy as e:
            raise TrainError(f"--out {out} is in use by another training run (pid {e.pid or '?'}): let it finish, or "
                             "give another --out") from None
        remove_stale_temporaries(out)   # what a kill during a checkpoint write left
    torch.manual_seed(cfg.seed)   # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    return Run(cfg, device, dd, out, store, val_store)


def resume_path(run: Run) -> Path:
    return run.out / "last.pt" if run.cfg.resume in (True, "auto") else Path(run.cfg.resume)


def same_classes(ckpt: dict, path, store, flag: str, fix: str) -> None:
    """CheckpointError unless the checkpoint was trained on `store`'s classes, in its order (one that does not say:
    taken as it is)."""
    theirs, ours = ckpt.get("class_names"), list(store.class_names)
    if theirs is None or list(theirs) == ours:
        return
    k = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), None)
    what = f"class {k} is {theirs[k]!r} there, {ours[k]!r} here" if k is not None else \
        f"{len(theirs)} classes there, {len(ours)} here"
    raise CheckpointError(f"{path} was trained on other classes than {flag} ({what}): {fix}")


def resuming(run: Run) -> bool:
    """--resume: yes. --resume auto: when OUT/last.pt exists (the same command starts a run and continues it
    after a preemption), on every rank or none: ranks that disagree would train different runs."""
    if run.cfg.resume != "auto":
        return bool(run.cfg.resume)
    path = resume_path(run)
    here = path.is_file()
    everywhere = bool(distributed.all_min(int(here), run.dd, run.device))
    if here != everywhere or distributed.any_true(here, run.dd, run.device) != everywhere:
        raise TrainError(f"--resume auto: {path} exists for some processes and not for others; put --out on a "
                         "filesystem every node shares")
    if not here:
        run.say("--resume auto: no %s yet, starting a new run", path)
    return here


def set_up(cfg: TrainConfig, stack) -> Run:
    """A Run ready for its first step (a checkpoint to resume from is read here, restored by resume.py)."""
    from ..loaders import LoaderConfig, create_loader
    from ..loaders.renders import store_task

    run = open_run(cfg, stack)
    device, dd, nc = run.device, run.dd, len(run.store.class_names)
    if resuming(run):   # read first: its imgsz is the run's unless --imgsz is given
        path = resume_path(run)
        run.ckpt = load_checkpoint(path, device)
        if (run.ckpt["model_name"], run.ckpt["nc"]) != (cfg.model, nc):
            raise CheckpointError(f"{path} is a {run.ckpt['model_name']} with {run.ckpt['nc']} classes, not a "
                                  f"{cfg.model} with {nc}: resume with the run's --model and --data")
        same_classes(run.ckpt, path, run.store, f"--data {cfg.data}", "resume with the run's --data")
    check_out(run)   # before anything is built: a new run in an --out that holds one needs --force
    resolve_imgsz(cfg, run.ckpt, resume_path(run) if run.ckpt is not None else None, "resuming")
    model = build_model(cfg.model, nc).to(device)
    run.params, run.gflops = count_parameters(model), count_flops(cfg.model, nc, cfg.imgsz)
    run.say("%s: %.1f M parameters, %.1f GFLOPs per image at %d", cfg.model, run.params / 1e6, run.gflops, cfg.imgsz)
    run.raw_model = model = prepare_model(model, cfg, device, dd.world_size, distributed.backend(dd, device))
    run.loss_fn = YoloLoss(model, cfg.imgsz, box=cfg.box, obj=cfg.obj, cls=cfg.cls, anchor_t=cfg.anchor_t)

    # --- the batch: given, the resumed run's, or measured (--batch auto) ----------------------------------
    batch, micro = cfg.batch, cfg.micro_batch
    if batch == "auto":
        batch = run.ckpt["config"]["batch"] if run.ckpt is not None else measure_batch(run)
    asked = run.ckpt and (run.ckpt["config"].get("micro_batch") or run.ckpt["config"].get("batch"))   # the run's own
    halved = bool(run.ckpt and run.ckpt.get("micro_batch")) and (not is_int(asked) or run.ckpt["micro_batch"] < asked)
    if halved and run.ckpt["micro_batch"] < (micro or batch):
        micro = run.ckpt["micro_batch"]
        log.warning("resuming with micro-batches of %d images (the run halved them after running out of memory)", micro)
    run.micro = MicroBatches(batch, min(micro or batch, batch))
    if len(run.store) < batch * dd.world_size:
        raise TrainError(f"--batch {batch} x {dd.world_size} process(es) is more than the store's "
                         f"{len(run.store)} images; use a smaller --batch")

    # --- the loader and its feed onto the device ----------------------------------------------------------
    # Boxes alone (task="detect"), whatever the store's task: the bundled models detect, and a segment, pose or
    # OBB store trains them without masks, keypoints or rotated boxes drawn for nothing.
    run.loader = create_loader(cfg.loader, run.store, LoaderConfig(
        imgsz=cfg.imgsz, batch_size=batch, augment=cfg.augment, seed=cfg.seed, epochs=cfg.epochs,
        close_mosaic=cfg.close_mosaic, device_augment=cfg.device_augment, device=str(device), task="detect",
        local_world_size=run.dd.local_world_size,
        **({} if cfg.workers is None else {"workers": cfg.workers}), **({} if cfg.hyp is None else {"hyp": cfg.hyp})))
    stack.callback(run.loader.close)
    if tasks.get(store_task(run.store)).field:
        run.say("%s is a store of %s labels: training on its boxes alone (the bundled models detect)", run.store.path,
                store_task(run.store))
    run.nb = len(run.loader)                                  # loader batches per epoch on this rank
    # A step never spans two epochs: with fewer batches in an epoch than --accum asks for (a small store), a
    # step takes the epoch's batches, and that is what images_per_step (and the weight decay) count.
    run.accum = min(cfg.resolved_accum(dd.world_size, batch), run.nb)
    if cfg.accum is not None and cfg.accum > run.nb:
        log.warning("--accum %d, but an epoch has only %d batches of %d per process: each step takes the epoch's %d",
                    cfg.accum, run.nb, batch, run.nb)
    run.steps_per_epoch = math.ceil(run.nb / run.accum)      # an epoch's tail makes a short last step
    run.total_steps = cfg.epochs * run.steps_per_epoch
    run.warmup = round(cfg.warmup_epochs * run.steps_per_epoch)
    run.images_per_step = batch * run.accum * dd.world_size

    # --- optimizer, EMA, mixed precision -------------------------------------------------------------------
    # Weight decay is set per 64 images: the gradient is a sum over images, the decay is not.
    wd = cfg.weight_decay * run.images_per_step / NOMINAL_BATCH
    run.optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.momentum, wd)
    run.scaler = grad_scaler(device, cfg.amp)
    run.ema = ModelEMA(model) if (cfg.ema and dd.main) else None
    run.snapshot = BufferSnapshot(model)
    run.clock = DeviceClock(device)
    return run


def start(run: Run, stack) -> None:
    """After the weights are in place: DDP (with the comm timer), checkpointing, the device feed."""
    cfg, dd, device = run.cfg, run.dd, run.device
    run.model = run.raw_model
    if dd.world_size > 1:
        run.model = DDP(run.raw_model, device_ids=[device.index] if device.type != "cpu" else None)
        run.comm = CommTimer(run.clock)
        run.model.register_comm_hook(None, run.comm.hook)
        stack.callback(_release_ddp, run)
    run.raw_model.grad_ckpt = cfg.grad_ckpt
    dtype = AMP_DTYPES[cfg.amp] if cfg.amp else torch.float32
    run.feed = device_batches(run.loader, device, dtype, channels_last=cfg.channels_last)
    stack.callback(run.feed.close)


def _release_ddp(run: Run) -> None:
    """Let DDP go when the run ends, before its process group is destroyed (by teardown, or by the caller that owns
    it): `run` outlives train() in reference cycles until a garbage collection, and its DDP with it (the reducer,
    the gloo group it holds, the comm hook's futures). One left to the interpreter's exit aborted a rank now and then
    ("terminate called without an active exception", SIGABRT: a run that had finished failed under torchrun)."""
    run.model = run.raw_model


def measure_batch(run: Run) -> int:
    """--batch auto: the largest micro-batch whose training step peaks within oom.AUTO_MARGIN of the device's
    memory (at the largest --multi-scale size), the same on every rank (their smallest)."""
    cfg = run.cfg
    size = size_range(cfg.imgsz, max(run.raw_model.detect.strides))[1] if cfg.multi_scale else cfg.imgsz
    param_bytes = sum(p.numel() * p.element_size() for p in run.raw_model.parameters())
    state = param_bytes * (2 if cfg.optimizer == "adamw" else 1) + (param_bytes if cfg.ema else 0)
    limit = min(1024, len(run.store) // run.dd.world_size)
    batch, pts = auto_batch(run.raw_model, run.loss_fn, run.device, size, amp=cfg.amp,
                            channels_last=cfg.channels_last, limit=limit, state_bytes=state)
    batch = distributed.all_min(batch, run.dd, run.device)
    run.batch_auto = {"batch": batch, "imgsz": size, "peak_mb": {b: m / 2**20 for b, m in pts.items()}}
    run.say("--batch auto: %d images per batch (peak MiB by batch measured: %s)", batch,
            ", ".join(f"{b}: {m / 2**20:.0f}" for b, m in sorted(pts.items())))
    return batch
