"""`DeviceLoader`: the Loader contract, batches finished on the accelerator (`on_device`)."""

from __future__ import annotations

import logging

import torch

from ...store.reader import Store
from ..base import Loader, LoaderConfig, StageTimes
from ..renders import DEVICE
from . import DTYPES, DeviceOptions
from .decode import make_decoder
from .feed import DeviceFeed
from .plan import SHIP_DECODED, SHIP_ENCODED, SHIP_NONE, HostLoader
from .vram_cache import build_vram_cache

log = logging.getLogger(__name__)


class DeviceLoader(Loader):
    """Batches of `dtype` images in [0,1] and float32 targets on `cfg.device` (the package's docstring says how).
    Use it directly: it replaces loader + prefetcher.

    Batches are new tensors (two are prepared ahead): unlike the host loaders' they stay valid after the next
    one is asked for. `device_augment` does not apply: every augmentation runs on the device already, with
    LoaderConfig.hyp's gains and the cpu loader's draws. `pin_memory` pins the workers'
    payload slots (default: on CUDA). `ops`/`device`: test seams (a fake accelerator; tensors stay on the CPU).
    """

    on_device = True
    renders = DEVICE

    def __init__(self, store: Store, cfg: LoaderConfig, opts, *, order=None, ops=None, device: torch.device | None = None):
        super().__init__(store, cfg, order)
        cfg = self.cfg   # as it applies to this store (Loader.__init__: a pose store without flip_idx does not flip)
        self.opts = opts
        self.device = device if device is not None else cfg.resolved_device()
        compute = self.device if ops is None else torch.device("cpu")
        self.decoder = make_decoder(opts.decoder, self.device)
        self.dtype = DTYPES[opts.dtype]
        if cfg.device_augment:
            log.info("device loader: LoaderConfig.device_augment does not apply (everything runs on the device)")
        upload = (lambda t: t.to(compute, non_blocking=False)) if compute.type != "cpu" else (lambda t: t.clone())
        self.cache = None
        if opts.cache == "device":
            self.cache = build_vram_cache(store, cfg.imgsz, cfg.batch_size, compute, self.decoder, upload,
                                     reserve_gb=opts.cache_reserve_gb, workers=cfg.workers or None)
        elif opts.cache_reserve_gb != DeviceOptions.cache_reserve_gb:   # set, but without the cache it is for
            log.warning("device loader: cache_reserve_gb=%s does nothing without cache='device' (the device memory "
                        "the VRAM cache leaves free): pass cache='device', or leave it out", opts.cache_reserve_gb)
        ship = SHIP_NONE if self.cache is not None else SHIP_DECODED if self.decoder.on_host else SHIP_ENCODED
        self.host = HostLoader(store, cfg, opts, ship, self.order)
        self.feed = DeviceFeed(self.host, self.device, dtype=self.dtype, decoder=self.decoder, cache=self.cache,
                               compute=compute, timing=ops is None, ops=ops)
        log.info("device loader on %s: decoder %s, %s", self.device, self.decoder.name,
                 "VRAM cache" if self.cache is not None else f"workers ship {ship} payloads")

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch, start)
        self.feed.set_epoch(epoch, start)

    def use_order(self, order) -> None:
        super().use_order(order)
        self.host.use_order(order)   # the planning workers' loader reads the order itself

    def iter_batches(self):
        if self.opts.cache == "device" and self.cache is None:
            raise RuntimeError("this device loader was closed, which freed its VRAM cache; create a new loader")
        return iter(self.feed)

    def stage_times(self) -> StageTimes:
        """read / plan (and decode, with the host decoder): the planning workers' own clocks, summed. decode
        and augment: the device's work, timed with events on the side stream on an accelerator (batches still
        in flight are counted once they complete), with the host clock on the CPU; not measured behind a
        test's fake accelerator. decode also holds the copy of pixels to the device."""
        st = self.host.stage_times()
        st.add(self.feed.device_seconds(), 0)
        return st

    def memory_pids(self) -> list[int]:
        return self.host.memory_pids()

    @property
    def vram_bytes(self) -> int:
        """Device memory held by the VRAM cache (0 without one). Not `shared_bytes`: that is host shared memory."""
        return self.cache.nbytes if self.cache is not None else 0

    def close(self) -> None:
        """Stop the iteration, the workers; free the decoded images (the VRAM cache too). Idempotent."""
        self.feed.close()
        self.host.close()
        self.feed.release()
        self.feed.cache = self.cache = None
