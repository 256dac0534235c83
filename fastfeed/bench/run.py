"""`run_bench`: every asked loader in turn, in this process, on the same store and settings; the consumer side
of each: the host->device copy (`make_copy`) and the step (`make_step`: simulated or the bundled model)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime, timezone

import torch

from .. import __version__
from ..devices import resolve_device, synchronize
from ..loaders import LoaderConfig
from ..loaders.renders import batch_task
from ..procs import usable_cores
from ..store.reader import Store
from ..store.verify import task_summary
from .config import BATCH, BenchConfig
from .measure import measure
from .monitor import machine_info
from .result import BenchResult, LoaderResult, Sweep

log = logging.getLogger(__name__)

SWEEP_TOLERANCE = 0.05   # a smaller worker count within 5 % of the best wins: the difference is noise


def make_copy(device: torch.device | None):
    """(batch) -> (images, targets) on `device`, synchronised so the time is the copy's; None on cpu.

    `DevicePrefetcher.transfer`, one batch at a time: this measures the copy and the uint8 -> float conversion, not
    their overlap with the step (that needs the measure loop to iterate `DevicePrefetcher(loader, device)`).
    """
    if device is None:
        return None
    from ..prefetch import DevicePrefetcher

    prefetcher = DevicePrefetcher((), device)

    def copy(batch):
        images, targets = prefetcher.transfer(batch)
        synchronize(device)
        return images, targets

    return copy


def make_step(cfg: BenchConfig, device: torch.device | None):
    """(images, targets) -> None: the bundled model's real training step (`fastfeed.train.bench_step`: forward,
    backward and the optimizer step, synchronised), a sleep of step_ms (the host is free meanwhile, as with a
    real accelerator; not a busy-wait), or None for a pure throughput run."""
    if cfg.model is not None:
        from ..train import bench_step

        return bench_step(cfg.model, device or torch.device("cpu"), cfg.imgsz, cfg.batch_size)
    if cfg.step_ms is None:
        return None
    seconds = cfg.step_ms / 1e3

    def step(images, targets):
        if seconds > 0:
            time.sleep(seconds)

    return step


def auto_candidates(cores: int) -> list[int]:
    """1, 2, cores/2, cores, cores+1 (one over: a worker may block on I/O), bounded at 33."""
    return sorted({c for c in (1, 2, cores // 2, cores, cores + 1) if 1 <= c <= 33})


def sweep_workers(name: str, store, cfg: BenchConfig, base: LoaderConfig) -> tuple[Sweep | None, LoaderResult | None]:
    """Measure `name` at each candidate worker count (no step, no copy: the loader alone) and pick one.
    Returns (sweep, None), or (None, the failed/unavailable result) when the loader cannot run."""
    window, points = cfg.sweep_window, []
    for w in auto_candidates(usable_cores()):
        r = measure(name, store, replace(base, workers=w), seconds=window, batches=None, warmup=cfg.warmup,
                    interval=cfg.monitor_interval, progress=cfg.progress, label=f"{name} sweep workers={w}")
        if not r.ok:
            return None, r
        points.append({"workers": w, "images_per_s": r.images_per_s.overall, "spread": r.images_per_s.spread,
                       "unreliable": r.unreliable, "cpu_total_percent": r.cpu.get("total_percent"),
                       "peak_memory_bytes": r.memory.get("peak_bytes")})
    best = max(points, key=lambda p: p["images_per_s"])
    chosen = min((p for p in points if p["images_per_s"] >= (1 - SWEEP_TOLERANCE) * best["images_per_s"]),
                 key=lambda p: p["workers"])
    seen = ", ".join(f"{p['workers']}: {p['images_per_s']:.0f}" for p in points)
    reason = (f"{best['workers']} worker(s) gave the most images/s ({seen})" if chosen is best else
              f"{chosen['workers']} worker(s) came within {SWEEP_TOLERANCE:.0%} of the best ({best['workers']}: "
              f"{best['images_per_s']:.0f} images/s) with fewer processes, leaving cores and memory to the trainer ({seen})")
    return Sweep(window_s=window, points=points, chosen=chosen["workers"], reason=reason), None


def _rank(results: list[LoaderResult]) -> str | None:
    """Ratios against the first loader that ran and the fastest, both by images/s overall; returns the baseline."""
    ran = [r for r in results if r.ok]
    if not ran:
        return None
    base = ran[0].images_per_s.overall   # the headline: images over the whole timed window
    for r in ran:
        r.ratio = r.images_per_s.overall / base if base > 0 else None
    max(ran, key=lambda r: r.images_per_s.overall).fastest = True
    return ran[0].name


def run_bench(cfg: BenchConfig) -> BenchResult:
    """Measure each of `cfg.loaders` on `cfg.data`.

    Raises ValueError for an unknown loader (listing the valid ones) or a batch larger than the store,
    FormatError (a ValueError) for a path that is not a store, DeviceError/ImportError for a device
    that is not there. A loader that cannot run is reported in its result, not raised.
    """
    names = cfg.resolved_loaders()
    store = Store(cfg.data, options=cfg.store_options)
    if cfg.batch_size is None:   # the default fits the store (said); a batch asked for is never changed
        cfg = replace(cfg, batch_size=min(BATCH, len(store)))
        if cfg.batch_size < BATCH:
            log.warning("--batch %d, the store's size: the default %d is larger than the store", cfg.batch_size, BATCH)
    if len(store) < cfg.batch_size:
        raise ValueError(f"--batch {cfg.batch_size} is larger than the store ({len(store)} images); "
                         f"use --batch {len(store)} or less")
    device = None if (d := resolve_device(cfg.device)).type == "cpu" else d   # where to copy to: none on cpu
    step = make_step(cfg, device)
    copy = make_copy(device)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    base = LoaderConfig(imgsz=cfg.imgsz, batch_size=cfg.batch_size, augment=cfg.augment, seed=cfg.seed, device=cfg.device,
                        task=cfg.batch_task)
    batches = batch_task(store, base, setting="--task")   # a task the store does not hold: said before measuring

    results = []
    for name in names:
        sweep, workers = None, cfg.workers
        if workers == "auto":
            sweep, failed = sweep_workers(name, store, cfg, base)
            if failed is not None:
                results.append(failed)
                continue
            workers = sweep.chosen
        lcfg = base if workers is None else replace(base, workers=workers)
        log.info("bench %s: %d worker(s)", name, lcfg.workers)
        r = measure(name, store, lcfg, seconds=cfg.seconds, batches=cfg.batches, warmup=cfg.warmup, copy=copy,
                    step=step, step_ms=cfg.step_ms, interval=cfg.monitor_interval, progress=cfg.progress)
        r.sweep = sweep
        results.append(r)
    baseline = _rank(results)

    resolved = cfg.to_dict() | {"loaders": names, "workers_requested": cfg.workers,
                                "timed_by": "batches" if cfg.batches else "seconds",
                                "stall_mode": step is not None, "copy_device": str(device) if device else None}
    store_info = {"path": str(store.path), "images": len(store), "fingerprint": store.fingerprint,
                  "payload": store.manifest.payload, "task": task_summary(store.manifest),
                  "batches": batches}   # what the loaders' batches carried
    return BenchResult(created=started, fastfeed_version=__version__, machine=machine_info(cfg.device),
                       store=store_info, config=resolved, results=results, baseline=baseline)
