"""Micro-batches, out-of-memory recovery, and --batch auto (docs/training.md, "One optimizer step" and "Out of
memory": what a replay frees, restores and halves, when it stops, and the DDP ranks' agreement). The slicing leaves
the step's gradient as it is (a sum over images: step.py), BatchNorm aside: it normalises each micro-batch alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..devices import accelerator_module, empty_cache, is_out_of_memory, reset_peak_memory, to_channels_last
from .device import TrainError, forward_loss

MAX_HALVINGS = 2
AUTO_MARGIN = 0.85   # --batch auto: the share of the device's memory the chosen micro-batch may peak at


@dataclass
class MicroBatches:
    batch: int          # images per loader batch
    size: int           # images per micro-batch
    halvings: int = 0
    history: list = field(default_factory=list)   # the sizes before each halving

    @property
    def per_batch(self) -> int:
        return math.ceil(self.batch / self.size)

    def chunks(self, n: int) -> list[tuple[int, int]]:
        """[start, end) image ranges of a loader batch of n images."""
        return [(s, min(s + self.size, n)) for s in range(0, n, self.size)]

    def halve(self, where: str, accum: int, memory: str) -> str:
        """Halve the micro-batch after an OOM at `where`; the log message. TrainError with the numbers when
        it was halved MAX_HALVINGS times already (or is one image)."""
        if self.halvings >= MAX_HALVINGS or self.size == 1:
            sizes = " -> ".join(str(k) for k in [*self.history, self.size])
            raise TrainError(f"out of memory at {where} with micro-batches of {self.size} image(s), after halving "
                             f"{self.halvings} time(s) ({sizes}){memory}. Free memory first: --amp, --grad-ckpt, "
                             "a smaller --imgsz, or start with a smaller --micro-batch / --batch")
        old, self.size = self.size, math.ceil(self.size / 2)
        self.history.append(old)
        self.halvings += 1
        return (f"out of memory at {where} with micro-batches of {old}{memory}: replaying the step with micro-batches "
                f"of {self.size} ({self.per_batch * accum} per optimizer step instead of "
                f"{math.ceil(self.batch / old) * accum}, the same {self.batch * accum} images per step and rank)")


def slice_batch(images: torch.Tensor, targets: torch.Tensor, start: int, end: int):
    """Images start:end of a batch and their targets (img_idx renumbered from 0)."""
    keep = (targets[:, 0] >= start) & (targets[:, 0] < end)
    t = targets[keep]
    t[:, 0] -= start
    return images[start:end], t


class BufferSnapshot:
    """The model's buffers (BatchNorm running statistics) at the start of an optimizer step, to put back
    when an OOM makes the step replay (a forward that ran part-way had already updated some)."""

    def __init__(self, model: torch.nn.Module):
        self.live = list(model.buffers())
        self.saved = [b.detach().clone() for b in self.live]

    def take(self) -> None:
        torch._foreach_copy_(self.saved, self.live)   # one fused copy per dtype, not one per buffer

    def restore(self) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self.live, self.saved)


def fit_batch(probe, budget: float, limit: int) -> tuple[int, dict]:
    """The largest batch <= `limit` whose `probe(b)` (peak bytes of one training micro-step at batch b;
    raises on OOM) stays within `budget`: doubling from 1 while the affine fit of the last two points
    predicts a fit, then the fit's batch at the budget, kept if a last probe confirms it.
    Returns (batch, {b: peak bytes measured})."""
    def measure(b):
        try:
            return probe(b)
        except Exception as e:
            if is_out_of_memory(e):
                return None
            raise

    def affine(b):
        (b0, m0), (b1, m1) = sorted(pts.items())[-2:]
        slope = (m1 - m0) / (b1 - b0)
        return slope, m1 + slope * (b - b1)

    pts, b = {}, 1
    while True:
        peak = measure(b)
        if peak is None or peak > budget:
            break
        pts[b] = peak
        nb = min(2 * b, limit)
        if nb == b or (len(pts) >= 2 and affine(nb)[1] > budget):
            break
        b = nb
    if not pts:
        raise TrainError(f"--batch auto: one image does not fit within {budget / 2**20:.0f} MiB "
                         f"({AUTO_MARGIN:.0%} of the device): try --amp, --grad-ckpt or a smaller --imgsz")
    best = max(pts)
    if len(pts) >= 2:
        slope, _ = affine(best)
        if slope > 0:
            est = min(limit, int(best + (budget - pts[best]) / slope))
            if est > best and (peak := measure(est)) is not None and peak <= budget:
                pts[est] = peak
                best = est
    return best, pts


def auto_batch(model, loss_fn, device: torch.device, imgsz: int, *, amp: str | None, channels_last: bool, limit: int,
               state_bytes: int) -> tuple[int, dict]:
    """--batch auto on an accelerator: `fit_batch` over real forward+backward passes of `model` on random
    images at `imgsz` with a few boxes each, peak allocated memory plus `state_bytes` (optimizer state and
    EMA, not yet allocated) against AUTO_MARGIN of the device's total (of this process's share, under
    set_per_process_memory_fraction). The model's BatchNorm statistics are put back and its gradients
    dropped afterwards. Returns (batch, {batch: peak bytes measured})."""
    mod = accelerator_module(device)
    if mod is None:
        raise TrainError("--batch auto measures the accelerator's memory; on the CPU give --batch N")
    total = mod.get_device_properties(device).total_memory
    fraction = getattr(mod, "get_per_process_memory_fraction", None)   # a cap set on this process counts
    total *= fraction(device) if fraction is not None else 1.0
    snapshot = BufferSnapshot(model)
    model.train()

    def probe(b: int) -> int:
        g = torch.Generator().manual_seed(b)
        n = 6 * b
        targets = torch.cat([torch.arange(b).repeat_interleave(6)[:, None].float(), torch.zeros(n, 1),
                             0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.05 + 0.3 * torch.rand(n, 2, generator=g)], 1)
        images = torch.rand(b, 3, imgsz, imgsz, generator=g).to(device)
        if channels_last:
            images = to_channels_last(images, device)
        try:
            reset_peak_memory(device)
            loss, _ = forward_loss(model, loss_fn, images, targets.to(device), device=device, amp=amp)
            loss.backward()
            return mod.max_memory_allocated(device) + state_bytes
        finally:
            snapshot.restore()   # the probes must not move the BatchNorm statistics

    try:
        return fit_batch(probe, AUTO_MARGIN * total, max(1, limit))
    finally:
        model.zero_grad(set_to_none=True)
        empty_cache(device)
