"""One optimizer step: `accum` loader batches, each sliced into micro-batches for forward and backward
(at the step's --multi-scale size, in channels-last if asked), then unscale, clip, step, EMA (docs/training.md,
"One optimizer step", its one sync per micro-batch; "Out of memory", oom.py's replay).

The loss is a *sum* over images (loss.py multiplies the per-term means by the batch size), so micro-batches and
DDP ranks add up to the gradient of one big batch; DDP averages over ranks, hence the x world_size. The split is
timed by clocks: device-side marks for what the host cannot see (`DeviceClock`), and DDP's all-reduce through a
timing comm hook (`CommTimer`; docs/training.md, "The bottleneck verdict").
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..devices import accelerator_module, empty_cache, is_out_of_memory, memory_report, to_channels_last, utilization
from . import distributed
from .device import TrainError, forward_loss, resize, step_size
from .guards import RankSourceFailed, source_failure
from .oom import slice_batch
from .optim import set_lr

GRAD_CLIP = 10.0   # max gradient norm: a rare bad batch early on must not throw the weights away


class DeviceClock:
    """`mark()`: an event recorded on the device's current stream (an accelerator), or the host clock
    (the CPU, where work is synchronous). `seconds(a, b)` between two marks, once the device passed both
    (after a sync)."""

    def __init__(self, device):
        self.mod = accelerator_module(device)

    @property
    def accelerated(self) -> bool:
        return self.mod is not None

    def mark(self):
        if self.mod is None:
            return time.perf_counter()
        event = self.mod.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a, b) -> float:
        if a is None or b is None:
            return 0.0
        if self.mod is None:
            return b - a
        return a.elapsed_time(b) / 1e3


class CommTimer:
    """A DDP comm hook that all-reduces each gradient bucket exactly as DDP's default hook does, and marks
    when the last bucket of a backward was handed over (every gradient is computed by then). From that mark
    to backward()'s return (DDP waits there for every all-reduce) is the communication the backward did not
    hide: what the step pays for DDP.

        timer = CommTimer(clock); ddp.register_comm_hook(None, timer.hook)
        timer.arm(); loss.backward(); timer.stop(); ...sync...; seconds = timer.take()
    """

    def __init__(self, clock: DeviceClock):
        self.clock, self.last, self.end = clock, None, None

    def hook(self, process_group, bucket):
        self.last = self.clock.mark()
        return default_hooks.allreduce_hook(process_group, bucket)

    def arm(self) -> None:
        self.last = self.end = None

    def stop(self) -> None:
        if self.last is not None:
            self.end = self.clock.mark()

    def take(self) -> float:
        """Seconds of exposed all-reduce in the last backward (0 when it did not all-reduce: DDP no_sync)."""
        s = self.clock.seconds(self.last, self.end)
        self.arm()
        return s


class TrainingDiverged(TrainError):
    """The loss became NaN or infinite; the last good checkpoint is left as it was."""


def micro_step(model, loss_fn, images, targets, *, device, amp, scaler, loss_scale: float):
    """Forward + loss + backward of one micro-batch; gradients accumulate into .grad. Returns the
    detached [box, obj, cls] loss terms."""
    loss, items = forward_loss(model, loss_fn, images, targets, device=device, amp=amp)
    scaler.scale(loss * loss_scale).backward()
    return items


def _memory(run) -> str:
    m = memory_report(run.device)
    if not m:
        return ""
    return (f" ({m['mem_alloc_mb']:.0f} MiB allocated, {m['mem_reserved_mb']:.0f} reserved, peak "
            f"{m['mem_peak_mb']:.0f}, of {m['mem_total_mb']:.0f} MiB on {run.device})")


def next_batch(run, batches, keep: bool):
    """--- wait for data: time blocked here is time the device would idle. On an accelerator, device marks
    around it also catch the wait of the device's stream for this batch's copy (a copy not hidden).
    `keep`: the batch must outlive the next request (a replay after an OOM may need it)."""
    t0 = time.perf_counter()
    before = run.clock.mark() if run.clock.accelerated else None
    images, targets = next(batches)
    after = run.clock.mark() if run.clock.accelerated else None
    run.report.add_time(data=time.perf_counter() - t0)
    if keep and run.loader.on_device:   # such a loader may reuse its output (the prefetcher's are fresh)
        images, targets = images.clone(), targets.clone()
    return [images, targets, (before, after)]


def fetch(run, batches, keep: bool):
    """`next_batch`; under DDP, once this rank's data source failed for good, a blank batch (and no more reads): its
    collectives still meet the other ranks', and its flag in the loss all-reduce stops them all."""
    if run.failed is None:
        try:
            return next_batch(run, batches, keep)
        except Exception as e:
            if run.dd.world_size == 1 or source_failure(e) is None:
                raise
            run.failed = e
    s, on = run.cfg.imgsz, run.device
    return [torch.zeros((run.micro.batch, 3, s, s), device=on), torch.zeros((0, 6), device=on), (None, None)]


def _forward_backward(run, images, targets, sync: bool):
    """(loss terms, out of memory?) of one micro-batch; gradients accumulate."""
    cfg, dd, oom, items = run.cfg, run.dd, False, None
    try:
        loss, items = forward_loss(run.model, run.loss_fn, images, targets, device=run.device, amp=cfg.amp)
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        oom, loss = True, None
    if sync and dd.world_size > 1:   # every rank enters the backward that all-reduces, or none does
        oom = distributed.any_true(oom, dd, run.device)
    if not oom:
        try:
            if run.comm:
                run.comm.arm()
            run.scaler.scale(loss * dd.world_size).backward()
            if run.comm:
                run.comm.stop()
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            if sync and dd.world_size > 1:
                raise TrainError(f"out of memory in the backward pass that all-reduces gradients{_memory(run)}; "
                                 "under DDP it cannot be replayed (the other ranks are already communicating). "
                                 f"Restart with --micro-batch {max(1, run.micro.size // 2)} and --resume") from None
            oom = True
    return (torch.zeros(3, device=run.device) if items is None else items), oom


def train_batch(run, held: list, last: bool, size: int | None):
    """Forward and backward of one loader batch, micro-batch by micro-batch; its loss terms per micro-batch,
    or None when any rank ran out of memory."""
    images, targets, marks = held
    chunks = run.micro.chunks(len(images))
    out = []
    for c, (s, e) in enumerate(chunks):
        x, t = (images, targets) if len(chunks) == 1 else slice_batch(images, targets, s, e)
        if size is not None:
            x = resize(x, size)
        if run.cfg.channels_last:
            x = to_channels_last(x, run.device)
        sync = last and c == len(chunks) - 1   # DDP all-reduces gradients in this backward only
        t1 = time.perf_counter()
        with run.model.no_sync() if (run.dd.world_size > 1 and not sync) else contextlib.nullcontext():
            items, oom = _forward_backward(run, x, t, sync)
        # --- sync point: the loss terms and the OOM flag reach the host (averaged over ranks, so a NaN or an
        # OOM on any rank stops or replays every rank). Stopping here, before the optimizer step, keeps a NaN
        # out of the weights and the EMA. Under DDP the same all-reduce carries each rank's stop request
        # (preempt.py): every rank learns of a signal to any of them at the same micro-batch.
        if run.dd.world_size == 1:
            vals = torch.cat((items.detach().float().cpu(), torch.tensor([float(oom)])))
        else:
            # ... and this rank's lost data source, and rank 0's --save-every-min timer (one tensor, no new collective)
            flags = items.new_tensor([float(oom), run.signals.flag(), float(run.failed is not None),
                                      float(run.dd.main and run.timer.due())])
            vals = distributed.all_mean(torch.cat((items.detach().float(), flags)), run.dd).cpu()
            run.signals.note(float(vals[4]))
            run.save_due = bool(vals[6] > 0)
            if vals[5] > 0:
                raise RankSourceFailed
        comm = run.comm.take() if run.comm else 0.0
        h2d = run.clock.seconds(*marks) if c == 0 else 0.0
        held[2] = (None, None)   # the copy's wait is counted once, not again on a replay
        run.report.add_time(compute=time.perf_counter() - t1 - comm - h2d, comm=comm, h2d=h2d)
        if vals[3] > 0:
            return None
        if not torch.isfinite(vals[:3]).all():
            terms = vals[:3].tolist()
            run.report.record({"event": "diverged", "epoch": run.epoch, "step": run.step, "loss_terms": terms})
            raise TrainingDiverged(f"loss became non-finite at epoch {run.epoch}, step {run.step} (box, obj, cls = "
                                   f"{', '.join(f'{v:.4g}' for v in terms)}); stopped before the optimizer step. The "
                                   f"last good checkpoint is {run.out / 'last.pt'} (unchanged): resume from it with "
                                   "--resume, and try a lower --lr, a longer --warmup-epochs, or --amp bf16 / no --amp")
        out.append(vals[:3])
    return out


def replay_after_oom(run, where: str) -> None:
    """Undo the step so far (gradients, BatchNorm statistics), free the cache, halve the micro-batch."""
    run.optimizer.zero_grad(set_to_none=True)
    run.snapshot.restore()
    if run.dd.world_size > 1:
        # A rank whose all-reducing forward succeeded expects that backward; every rank resets DDP's reducer
        # instead (what DDP itself does to run a forward after a backward that never happened), and every rank
        # broadcasts buffers at the replay's first forward, as at any step's first forward.
        reset = getattr(getattr(run.model, "reducer", None), "_reset_state", None)
        if reset is None:
            raise TrainError(f"out of memory at {where}{_memory(run)}; this torch's DDP cannot skip the backward to "
                             f"replay the step: restart with --micro-batch {max(1, run.micro.size // 2)} and --resume")
        reset()
        run.model.require_forward_param_sync = True
    empty_cache(run.device)
    msg = run.micro.halve(where, run.accum, _memory(run))
    run.report.warn(msg, {"event": "oom", "epoch": run.epoch, "step": run.step, "micro_batch": run.micro.size,
                          "micro_batches_per_step": run.micro.per_batch * run.accum})


def optimizer_step(run, batches, n: int) -> float:
    """The next `n` loader batches (accum, or the epoch's tail) into one optimizer step; returns its lr."""
    cfg = run.cfg
    lr = set_lr(run.optimizer, run.step, run.total_steps, run.warmup, cfg.lr, cfg)
    size = step_size(cfg.seed, run.step, cfg.imgsz, max(run.raw_model.detect.strides)) if cfg.multi_scale else None
    run.snapshot.take()
    held, losses, j = [], [], 0
    while j < n:
        if j == len(held):
            held.append(fetch(run, batches, keep=j < n - 1))
        got = train_batch(run, held[j], last=j == n - 1, size=size)
        if got is None:   # out of memory on some rank: replay the step from its first batch
            replay_after_oom(run, f"epoch {run.epoch}, step {run.step}, batch {j + 1} of {n}")
            losses, j = [], 0
            continue
        losses += got
        j += 1

    # --- optimizer step: unscale (fp16), clip, step, EMA ---------------------------------------------------
    t = time.perf_counter()
    run.scaler.unscale_(run.optimizer)
    torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), GRAD_CLIP)
    run.scaler.step(run.optimizer)   # skipped by the scaler when fp16 gradients overflowed
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    if run.ema is not None:
        run.ema.update(run.raw_model)
    run.step += 1
    run.report.add_time(compute=time.perf_counter() - t)
    run.report.add_step(losses, n, n * run.micro.batch * run.dd.world_size, utilization(run.device))
    return lr
