"""`DeviceFeed`: the host batches (plans + payloads) turned into finished batches on the device: the
`DevicePrefetcher`'s drivers and stream protocol (docs/design.md, 'The prefetcher copies on a side stream'), with
its per-batch hook (`produce`) doing decode + render. Per batch, on the side stream: decode the new records' JPEGs
(or copy their pixels up), gather the pixels of every tile the batch shows into one flat buffer (or use the VRAM
cache's), copy the plan's parameters and targets up, record `copied` (the host slot may be reused from here),
render, record `ready`.

Decoded images are kept while a worker's partner buffer still lists them (each plan carries its
worker's buffer), so a record is decoded once per stay in a buffer, not once per tile that shows it.
A partner the device never saw (after a resume replayed a worker's buffer) is read and decoded here.
"""

from __future__ import annotations

from collections import deque
from time import perf_counter

import numpy as np
import torch

from ...batch import Batch
from ...prefetch import DevicePrefetcher
from ...prefetch.streams import InFlight
from ..workers import WorkerError
from .decode import load_items
from .plan import HostBatch, Item, Plan, read_item
from .render import Params, render


class _EventTimes:
    """Device seconds of decode and render, from timing events on the side stream, read once complete."""

    def __init__(self, mod):
        self.mod, self.pending = mod, deque()

    def mark(self, stream):
        e = self.mod.Event(enable_timing=True)
        e.record(stream)
        return e

    def collect(self, seconds: dict) -> None:
        while self.pending and self.pending[0][2].query():
            a, b, c = self.pending.popleft()
            seconds["decode"] += a.elapsed_time(b) / 1e3
            seconds["augment"] += b.elapsed_time(c) / 1e3


class DeviceFeed(DevicePrefetcher):
    """Iterate `host` (a HostLoader) as finished `dtype` batches on `device`. `compute`: where tensors are made
    (the device; the CPU behind a test's fake accelerator `ops`). `timing`: time the device work with events."""

    def __init__(self, host, device, *, dtype, decoder, cache, compute: torch.device, timing: bool, ops=None):
        super().__init__(host, device, depth=2, dtype=dtype, device_augment=False, thread=False, ops=ops)
        self.host, self.decoder, self.cache, self.compute = host, decoder, cache, compute
        cfg, h = host.cfg, host.cfg.hyp
        self.size, self.fill = cfg.imgsz, h.fill
        self.jitter = (cfg.augment and bool(h.hsv_h or h.hsv_s or h.hsv_v), bool(h.hsv_h))
        self.drawn = {"projective": cfg.augment and bool(h.perspective), "bgr": cfg.augment and bool(h.bgr)}
        self.images: dict[int, torch.Tensor] = {}   # decoded records a partner buffer still lists
        self.live: dict[int, set] = {}               # planning worker -> records in its partner buffer
        self.seconds = {"decode": 0.0, "augment": 0.0}
        self.decoded = self.reread = 0               # records decoded here; of those, read here (not shipped)
        self._events = _EventTimes(self.ops.mod) if timing and self.accelerated else None

    def _upload(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor (maybe a view of the slot) as a tensor of our own on the compute device."""
        return self.ops.to_device(t) if self.accelerated else t.clone()

    def produce(self, batch: HostBatch) -> Batch | InFlight:
        plan, slot = batch.plan, batch.slot
        if not self.accelerated:   # the CPU: synchronous, timed with the host clock
            t0 = perf_counter()
            pixels, base = self._pixels(plan, slot)
            t1 = perf_counter()
            images = self._render(plan, pixels, base)
            self.seconds["decode"] += t1 - t0
            self.seconds["augment"] += perf_counter() - t1
            return Batch(images, torch.from_numpy(plan.targets), batch.indices, **self._extras(batch))
        ops, side = self.ops, self.stream
        with ops.use(side):
            marks = [self._events.mark(side)] if self._events else []
            pixels, base = self._pixels(plan, slot)
            targets = ops.to_device(torch.from_numpy(plan.targets))
            extras = self._extras(batch)
            copied = ops.event()
            copied.record(side)
            if self._events:
                marks.append(self._events.mark(side))
            images = self._render(plan, pixels, base)
            ready = ops.event()
            ready.record(side)
            if self._events:
                marks.append(self._events.mark(side))
                self._events.pending.append(marks)
                self._events.collect(self.seconds)
        return InFlight(Batch(images, targets, batch.indices, **extras), copied, ready)

    def _extras(self, batch: HostBatch) -> dict[str, torch.Tensor]:
        """A task store's Batch extras on the compute device (the masks out of the pool's slot, before `copied`)."""
        out = {k: self._upload(torch.from_numpy(v)) for k, v in batch.plan.extras.items()}
        if batch.masks is not None:
            out["masks"] = self._upload(batch.masks)
        return out

    def _pixels(self, plan: Plan, slot: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
        """(flat uint8 [P,3] pixels on the device, int64 [B,4] first row of each tile in it)."""
        if self.cache is not None:
            return self.cache.pixels, self.cache.bases(plan.tiles)
        new = self._load(plan.items, slot)
        needed = list(dict.fromkeys(int(r) for r in plan.tiles.reshape(-1) if r >= 0))
        if missing := [r for r in needed if r not in new and r not in self.images]:   # never seen: read here
            self.reread += len(missing)
            new.update(self._load([read_item(self.host.store, i, self.size, self.host.ship) for i in missing], None))
        self.images.update(new)
        imgs = [self.images[r] for r in needed]
        starts = np.cumsum([0] + [im.shape[0] * im.shape[1] for im in imgs])
        where = dict(zip(needed, starts[:-1].tolist()))
        base = np.array([[where.get(int(r), 0) for r in row] for row in plan.tiles], np.int64)
        pixels = torch.cat([im.reshape(-1, 3) for im in imgs])
        self.live[plan.token] = set(plan.live.tolist())
        keep = set().union(*self.live.values())
        for r in [r for r in self.images if r not in keep]:
            del self.images[r]
        return pixels, base

    def _load(self, items: list[Item], slot) -> dict[int, torch.Tensor]:
        try:
            out = load_items(items, slot, self.decoder, self._upload, self.stream)
        except RuntimeError as e:
            raise WorkerError(f"device loader: {e}") from e
        self.decoded += len(out)
        return out

    def _render(self, plan: Plan, pixels: torch.Tensor, base: np.ndarray) -> torch.Tensor:
        b = len(plan.tiles)
        floats = np.concatenate([plan.minv.reshape(b, 9), plan.centre, plan.region.reshape(b, 16),
                                 plan.place.reshape(b, 12), plan.hsv, plan.bgr[:, None]], axis=1).astype(np.float32)
        ints = np.concatenate([base, plan.shapes.reshape(b, 8)], axis=1).astype(np.int64)
        f, i = (self._upload(torch.from_numpy(a)) if self.accelerated else torch.from_numpy(a) for a in (floats, ints))
        p = Params(f[:, 0:9].reshape(b, 3, 3), f[:, 9:11], f[:, 11:27].reshape(b, 4, 4), f[:, 27:39].reshape(b, 4, 3),
                   f[:, 39:42], i[:, 0:4], i[:, 4:12].reshape(b, 4, 2), f[:, 42])
        return render(pixels, p, self.size, self.fill, self.jitter, self.dtype, **self.drawn)

    def device_seconds(self) -> dict[str, float]:
        if self._events:
            self._events.collect(self.seconds)
        return dict(self.seconds)

    def release(self) -> None:
        """Drop the decoded images and partner bookkeeping (a new worker pool starts with empty buffers)."""
        self.images.clear()
        self.live.clear()
