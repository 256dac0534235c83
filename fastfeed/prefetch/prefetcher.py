"""`DevicePrefetcher`: the loader's batches moved to the device, converted, ahead of the step (the stream protocol
and the buffer-reuse hazard: docs/design.md, 'The prefetcher copies on a side stream')."""

from __future__ import annotations

import logging
import weakref
from contextlib import AbstractContextManager

import torch

from ..batch import Batch, BatchFeed, counted
from ..checks import is_int, need
from ..device_augment import DeviceAugment
from ..devices import accelerator_module, parse_device, resolve_device, to_channels_last
from . import drivers
from .streams import InFlight, StreamOps, pinned

log = logging.getLogger(__name__)

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)   # uint8: no conversion
_use_count = getattr(torch._C, "_storage_Use_Count", None)


class DevicePrefetcher(AbstractContextManager):
    """Iterate `loader` (any iterable of uint8 `Batch`es) with the batches moved to `device` ahead of use.

    Yields `Batch(images [B,3,S,S] in [0,1] of `dtype` (uint8: 0..255, unconverted), targets float32 [M,6], and the
    batch's masks/keypoints/rboxes as they are)` on `device`: fresh tensors, not views of the loader's buffers, so
    they outlive the next request. `depth`: batches prepared ahead of the one in use. `device_augment`: None follows
    what a fastfeed `Loader` leaves to the device (`loader.device_hyp`: HSV jitter and flip), True forces that with
    `loader.cfg.hyp`'s gains, or a `DeviceAugment`; `seed` seeds it (with the epoch and the loader's rank; None: the
    loader's `cfg.seed`). Any iterable of batches works; only a fastfeed loader (a `BatchFeed`) declares augmentation,
    a rank and a position (`state_dict`). `thread`: run the loader in a background thread (default: on cpu only).
    `channels_last`: images in the device's channels-last layout (`fastfeed.devices.to_channels_last`). `ops`: a
    seam for tests (a fake stream API). Closing stops any background work; the loader stays open (the caller's).
    """

    def __init__(self, loader, device: str | torch.device = "cuda", depth: int = 2,
                 dtype: torch.dtype = torch.float32, device_augment: bool | DeviceAugment | None = None,
                 seed: int | None = None, thread: bool | None = None, *, channels_last: bool = False, ops=None):
        if isinstance(loader, BatchFeed) and loader.on_device:
            raise ValueError(f"the {type(loader).__name__} already yields batches on {loader.cfg.device}: iterate it "
                             "directly, without a DevicePrefetcher")
        self.loader = loader
        kind, _ = parse_device(device)   # ValueError naming the valid devices
        # checked (DeviceError: not here, an index past the count; imports torch_npu); a fake `ops` takes it as is
        self.device = resolve_device(device) if ops is None or kind == "auto" else torch.device(device)
        # a numpy integer is one; a float seed was truncated, a string seed failed in the augmentation
        need(is_int(depth) and depth >= 1, "depth", "must be an integer >= 1", depth)
        need(seed is None or is_int(seed), "seed", "must be an integer or None (the loader's cfg.seed)", seed)
        need(dtype in DTYPES, "dtype", f"must be one of {', '.join(map(str, DTYPES))}", dtype)
        need(isinstance(channels_last, bool), "channels_last", "must be True or False", channels_last)
        need(thread is None or isinstance(thread, bool), "thread", "must be True, False or None (on cpu only)", thread)
        self.depth, self.dtype, self.channels_last = int(depth), dtype, channels_last
        self.augment = resolve_augment(loader, device_augment, seed)
        self._rank = loader.rank if isinstance(loader, BatchFeed) else 0
        self.accelerated = ops is not None or self.device.type != "cpu"
        # the accelerator's stream API (StreamOps, or a test's fake) and the side stream: one for every epoch
        self.ops = (ops or StreamOps(accelerator_module(self.device.type), self.device)) if self.accelerated else None
        self.stream = self.ops.new_stream() if self.accelerated else None
        if self.augment is not None and not self.accelerated:
            log.warning("device augmentation on the CPU: float32 torch costs far more than the workers' uint8 "
                        "version; consider LoaderConfig(device_augment=False) without an accelerator")
        self.thread = (not self.accelerated) if thread is None else thread
        self._host = HostBuffers(keep=self.depth + 3)   # queue + producer + consumer + one spare
        self._active = None                   # weakref to the running iteration's generator
        self._warned_pageable = False
        self._epoch = self._start = self._k = 0   # the augmentation's draws are keyed by (epoch, rank, batch)
        self._handed: int | None = None   # batches of `_epoch` handed to the step; None: as the loader was positioned

    # --- the loader's interface -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Ends an unfinished iteration and passes `epoch` (and `start`, the first batch: resuming) to the
        loader; the device augmentation's draws are those of batch `start` of `epoch` on."""
        self._stop_active()
        if isinstance(self.loader, BatchFeed):
            self.loader.set_epoch(epoch, start)
        elif hasattr(self.loader, "set_epoch"):   # any other iterable of batches that has epochs
            if start:
                raise ValueError("start > 0 needs a fastfeed Loader (it skips batches without building them)")
            self.loader.set_epoch(epoch)
        self._epoch, self._start, self._handed = int(epoch), int(start), None

    def state_dict(self) -> dict:
        """Its loader's state after the last batch handed to the step (`Loader.state_dict()` less the batches
        prepared ahead); position the loader through this prefetcher (set_epoch, load_state_dict)."""
        loader = self._feed()
        return loader.state_dict() if self._handed is None else loader.state_dict(self._epoch, self._handed)

    def load_state_dict(self, state: dict) -> str:
        """`Loader.load_state_dict(state)`, whose line it returns."""
        self._stop_active()
        self._handed = None
        return self._feed().load_state_dict(state)

    def _feed(self) -> BatchFeed:
        if not isinstance(self.loader, BatchFeed):
            raise TypeError(f"a {type(self.loader).__name__} keeps no position: only a fastfeed Loader (a BatchFeed) "
                            "has state_dict() and load_state_dict()")
        return self.loader

    def __iter__(self):
        self._stop_active()
        if isinstance(self.loader, BatchFeed):   # where the loader stands, however it was positioned
            self._epoch, self._start = self.loader.epoch, self.loader.start
        self._k = self._handed = self._start
        it = counted(drivers.threaded(self) if self.thread else drivers.inline(self), self, "_handed")
        self._active = weakref.ref(it)   # weak: a consumer that breaks out and drops it stops it at once
        return it

    def close(self) -> None:
        """Stop the running iteration (its thread joined, pending copies finished); idempotent."""
        self._stop_active()

    def __exit__(self, *exc):
        self.close()

    def _stop_active(self) -> None:
        it, self._active = self._active and self._active(), None   # (the weakref's generator, or None)
        if it is not None:
            it.close()

    # --- one batch: produce (side stream / any thread), release the host memory, hand out -----------

    def _finish(self, images: torch.Tensor, targets: torch.Tensor, host: bool, indices=None,
                extras: dict | None = None) -> Batch:
        """uint8 -> `dtype` /255 (uint8: kept as is), with the device augmentation done in float32. `host`:
        write into a reused host buffer (the CPU path: that is also the copy out of the loader's buffer).
        `extras`: the batch's task geometry (`Batch.extras()`), already where it goes."""
        work = torch.float32 if self.augment is not None else self.dtype
        if host:
            x = self._host.get(images.shape, work).copy_(images)
        else:
            x = images.to(work)   # on the device: a new tensor unless it stays uint8 (then the copy is one)
        if work != torch.uint8:
            x = x.div_(255)
        k, self._k = self._k, self._k + 1   # this batch's index in the epoch
        if self.augment is not None:
            self.augment.reseed(self._epoch, self._rank, k)
            x, targets = self.augment(x, targets)
            x = (x.mul_(255).round_() if self.dtype == torch.uint8 else x).to(self.dtype)
        if self.channels_last:
            x = to_channels_last(x, self.device)
        return Batch(x, targets, indices, **(extras or {}))

    def produce(self, batch) -> Batch | InFlight:
        """The per-batch work, a hook for subclasses (the device loader's feed decodes and renders here): on the
        CPU the finished Batch; on an accelerator an `InFlight` queued on `self.stream` with `self.ops`, whose
        `copied` event says when the loader may reuse the host memory and `ready` when the batch may be used."""
        images, targets = _pair(batch)
        indices = getattr(batch, "indices", None)
        extras = batch.extras() if isinstance(batch, Batch) else {}   # the task geometry: masks, keypoints, rboxes
        if extras and self.augment is not None:
            raise ValueError(f"the device augmentation (HSV, flip) cannot move a batch's {', '.join(extras)}: "
                             "use LoaderConfig(device_augment=False) (the workers flip them) and "
                             "DevicePrefetcher(device_augment=False)")
        if not self.accelerated:   # copied: the loader may reuse its own
            return self._finish(images, targets.clone(), host=True, indices=indices,
                                extras={k: v.clone() for k, v in extras.items()})
        ops, side = self.ops, self.stream
        if not self._warned_pageable and not pinned(images):
            self._warned_pageable = True
            log.info("the loader's images are not in pinned memory: host-to-device copies are synchronous")
        with ops.use(side):
            images, targets = ops.to_device(images), ops.to_device(targets)
            extras = {k: ops.to_device(v) for k, v in extras.items()}
            copied = ops.event()
            copied.record(side)
            out = self._finish(images, targets, host=False, indices=indices, extras=extras)
            ready = ops.event()
            ready.record(side)
        return InFlight(out, copied, ready)

    def release_host(self, item) -> None:
        """Block until `item`'s host memory has been read, so the loader may overwrite it."""
        if isinstance(item, InFlight):
            item.copied.synchronize()

    def hand_out(self, item) -> Batch:
        """`item` (what `produce` gave) for the consumer: on an accelerator, usable on its current stream."""
        if not isinstance(item, InFlight):
            return item
        consumer = self.ops.current_stream()
        consumer.wait_event(item.ready)
        for t in (*item.batch, *item.batch.extras().values()):
            self.ops.record(t, consumer)
        return item.batch

    def transfer(self, batch) -> Batch:
        """One batch through the same path, without look-ahead; the loader may reuse `batch` on return."""
        item = self.produce(batch)
        self.release_host(item)
        return self.hand_out(item)


def _pair(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """A loader's batch as (images, targets); a ValueError saying what a batch is for anything else."""
    images, targets = batch if isinstance(batch, (Batch, tuple, list)) and len(batch) == 2 else (batch, None)
    if torch.is_tensor(images) and images.dtype == torch.uint8 and images.dim() == 4 and torch.is_tensor(targets):
        return images, targets
    got = f"images of {images.dtype} {list(images.shape)}" if torch.is_tensor(images) else f"a {type(batch).__name__}"
    raise ValueError(f"the loader's batches must be (images uint8 [B,3,H,W], targets [M,6]) tensor pairs (a fastfeed "
                     f"Batch); got {got}")


def resolve_augment(loader, device_augment, seed: int | None) -> DeviceAugment | None:
    """The DeviceAugment to apply: what a fastfeed `Loader` declares it leaves to the device (its
    `device_hyp`), or what the caller forces; any other iterable of batches declares nothing."""
    ours = isinstance(loader, BatchFeed)
    left = loader.device_hyp if ours else None
    if device_augment is None:
        device_augment = left is not None
    if device_augment is False:
        if left is not None:
            log.warning("the loader leaves HSV jitter and flip to the device (LoaderConfig.device_augment) but "
                        "device_augment=False: no HSV jitter or flip at all")
        return None
    if device_augment is True:
        if not ours:
            raise ValueError("device_augment=True takes its gains from a fastfeed Loader's LoaderConfig.hyp, and "
                             "this loader is not one; pass a DeviceAugment(...) instead")
        device_augment = DeviceAugment.from_hyp(loader.cfg.hyp, seed=loader.cfg.seed if seed is None else seed)
    if not isinstance(device_augment, DeviceAugment):
        raise ValueError(f"device_augment must be None, True, False or a DeviceAugment, got {device_augment!r}")
    if ours and loader.cfg.augment and left is None:
        log.warning("device augmentation on top of the workers' own HSV jitter and flip: set "
                    "LoaderConfig(device_augment=True) so the workers skip them")
    return device_augment if device_augment.active else None


def _uses(t: torch.Tensor) -> int:
    return _use_count(t.untyped_storage()._cdata)


class HostBuffers:
    """Host output buffers for the CPU path: `get(shape, dtype)`, a tensor to write a batch into; `keep` buffers
    are reused once nothing outside the prefetcher holds them. For one [16,3,640,640] batch (2 cores) a fresh
    float32 tensor costs ~24 ms, ~20 of them page faults (glibc maps allocations that large afresh), a reused one
    ~5 ms; a uint8 copy 5 ms against 0.8 ms. Batches are views of the pooled tensors, so one the consumer still
    holds keeps its storage's use count up; without torch's (private) use-count query every batch is fresh."""

    def __init__(self, keep: int):
        self.keep = keep
        self.pool: list[tuple[torch.Tensor, int]] = []   # (buffer, its use count when only the pool holds it)

    def get(self, shape, dtype: torch.dtype) -> torch.Tensor:
        shape = torch.Size(shape)
        for t, alone in self.pool:   # (empty without the use-count query)
            if t.shape == shape and t.dtype == dtype and _uses(t) == alone:
                return t.view(shape)   # a view: while the consumer holds it, the count stays up
        t = torch.empty(shape, dtype=dtype)
        if _use_count is not None:
            self.pool.append((t, _uses(t)))
            del self.pool[:-self.keep]
        return t.view(shape)
