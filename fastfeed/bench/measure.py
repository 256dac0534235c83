"""One loader, one timed run: first-batch latency, warm-up, then a window of batches consumed the
way a training loop would (wait for the batch, copy it to the device, run or simulate the step)."""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter

import numpy as np
import psutil

from ..devices import synchronize
from ..loaders import LoaderConfig, create_loader
from ..progress import bar as progress_bar
from .monitor import ResourceMonitor
from .result import LoaderResult, Rate, Stall, doubt

log = logging.getLogger(__name__)

Copy = Callable  # (batch) -> (images, targets) on the device, synchronised
Step = Callable  # (images, targets) -> None


def _forever(loader):
    """Batches across epochs (set_epoch each time), as a multi-epoch training run would ask for them."""
    for epoch in itertools.count():
        loader.set_epoch(epoch)
        yield from loader


def _stage_snapshot(loader) -> tuple[dict[str, float], int]:
    st = loader.stage_times()
    return dict(st.seconds), int(st.samples)


def _cpu_seconds(pids) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


SLICES = 10            # the window is cut into at most this many equal slices for the spread
BATCHES_PER_SLICE = 5  # ... and into fewer when there are fewer batches, so a slice holds five on average


def rate_stats(t0: float, ends: list[float], counts: list[int], wall: float) -> Rate:
    """The rate over the whole window (the headline) and its spread over equal slices of it (`Rate` says how to
    read them); batch k counts in the slice its end time `ends[k]` falls in."""
    total = sum(counts)
    if wall <= 0:
        return Rate(overall=0.0, slice_s=0.0, slices=[0.0], slice_median=0.0, slice_p25=0.0, slice_p75=0.0,
                    slice_min=0.0, slice_max=0.0, empty_slices=0)
    m = max(1, min(SLICES, len(ends) // BATCHES_PER_SLICE))
    width = wall / m
    where = np.clip(((np.asarray(ends, dtype=float) - t0) / width).astype(int), 0, m - 1)
    per = np.zeros(m)
    np.add.at(per, where, np.asarray(counts, dtype=float))
    a = per / width
    p25, med, p75 = np.percentile(a, [25, 50, 75])
    return Rate(overall=total / wall, slice_s=width, slices=[float(x) for x in a], slice_median=float(med),
                slice_p25=float(p25), slice_p75=float(p75), slice_min=float(a.min()), slice_max=float(a.max()),
                empty_slices=int((per == 0).sum()) if total else 0)


def _failed(res: LoaderResult, e: BaseException) -> LoaderResult:
    if isinstance(e, ImportError):
        res.status, res.error = "unavailable", str(e) or type(e).__name__
        log.warning("loader %s unavailable: %s", res.name, res.error)
    else:
        res.status, res.error = "failed", f"{type(e).__name__}: {getattr(e, 'summary', e)}"   # a worker's: one line
        log.warning("loader %s failed: %s", res.name, res.error, exc_info=log.isEnabledFor(logging.DEBUG))
    return res


@dataclass
class _Window:
    """What the timed window saw: batch end times and sizes, the time spent waiting / copying / stepping, the
    loader's stage counters and the CPU seconds of its workers and of this process, at both ends."""

    t0: float
    t1: float = 0.0
    ends: list = field(default_factory=list)
    counts: list = field(default_factory=list)
    wait: float = 0.0
    copy_s: float = 0.0
    step_s: float = 0.0
    stages: tuple = ()
    cpu: tuple = ()


def measure(name: str, store, lcfg: LoaderConfig, *, seconds: float, batches: int | None, warmup: int,
            copy: Copy | None = None, step: Step | None = None, step_ms: float | None = None,
            interval: float = 0.2, progress: bool = True, label: str | None = None) -> LoaderResult:
    """Run loader `name` on `store` and measure it. Never raises for the loader's own failures:
    a missing optional dependency (ImportError) gives status 'unavailable', anything else 'failed'."""
    res = LoaderResult(name=name, workers=lcfg.workers, loader_config=lcfg.to_dict(), copy_applicable=copy is not None)
    mon = ResourceMonitor(interval).start()
    loader = gen = None
    try:
        try:   # time to the first batch (loader creation and worker start included), then the warm-up
            t_create = perf_counter()
            loader = create_loader(name, store, lcfg)
            ready = None
            if loader.on_device:   # no copy to time, and waiting for the device to finish a batch is waiting for data
                copy, ready, res.copy_applicable = None, lambda b: synchronize(b.images.device), False
                res.notes.append("batches come out on the device: no host->device copy; the wait for each batch "
                                 "includes the device finishing it")
            res.batches_per_epoch = len(loader)
            order = getattr(loader, "order", None)   # a fastfeed Loader's EpochOrder (a bare iterable has none)
            res.order = order.describe() if order is not None else None
            gen = _forever(loader)
            first = next(gen)
            res.first_batch_s = perf_counter() - t_create
            log.info("%s: first batch in %.2f s; timing %s", label or name, res.first_batch_s,
                     f"{batches} batches" if batches else f"{seconds:g} s")
            mon.set_pids(loader.memory_pids())
            res.warmup_batches = max(warmup, 1)   # untimed batches through the same copy/step path (the first counts)
            for batch in itertools.chain([first], itertools.islice(gen, res.warmup_batches - 1)):
                dev = copy(batch) if copy else batch
                if step:
                    step(*dev)
            win = _timed(loader, gen, mon, copy, step, ready, seconds=seconds, batches=batches,
                         label=label or name, progress=progress)
            if order is not None:   # again: a URL store's link figures are what its downloads did meanwhile
                res.order = order.describe()
        except Exception as e:  # ImportError included: reported as "unavailable"
            return _failed(res, e)
        res.shared_bytes = int(loader.shared_bytes())
    finally:
        if gen is not None:
            gen.close()
        if loader is not None:
            loader.close()
        mon.stop()
    _figures(res, win, lcfg, mon, copy, step_ms)
    log.info("%s: %d images in %.1f s, %.0f images/s%s", label or name, res.timed_images, res.wall_s,
             res.images_per_s.overall, f" (not a steady figure: {res.unreliable})" if res.unreliable else "")
    return res


def _timed(loader, gen, mon: ResourceMonitor, copy, step, ready, *, seconds: float, batches: int | None, label: str,
           progress: bool) -> _Window:
    """Consume batches as a training loop would (wait, copy, step) for `batches` batches or `seconds`."""
    timed_total = float(batches) if batches else float(seconds)
    bar = progress_bar(total=timed_total, desc=label, unit="batch" if batches else "s", leave=False, progress=progress,
                       bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} {unit}{postfix}" if batches
                       else "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s{postfix}")
    try:
        pids = loader.memory_pids()
        mon.set_pids(pids)
        main_pid = psutil.Process().pid
        stages0, cpu0 = _stage_snapshot(loader), (_cpu_seconds(pids), _cpu_seconds([main_pid]))
        win = _Window(mon.mark())
        done = 0
        while True:
            t_req = perf_counter()
            batch = next(gen)
            if ready is not None:
                ready(batch)
            t_got = perf_counter()
            dev = copy(batch) if copy else batch
            t_copied = perf_counter()
            if step:
                step(*dev)
            now = perf_counter()
            win.wait += t_got - t_req
            win.copy_s += t_copied - t_got
            win.step_s += now - t_copied
            win.ends.append(now)
            win.counts.append(int(batch.images.shape[0]))
            done += win.counts[-1]
            if batches:
                bar.update(1)
                if len(win.ends) >= batches:
                    break
            else:
                bar.update(min(now - win.t0, seconds) - bar.n)
                if now - win.t0 >= seconds:
                    break
            if len(win.ends) % 8 == 0:
                bar.set_postfix_str(f"{done / max(now - win.t0, 1e-9):.0f} img/s", refresh=False)
        win.t1 = mon.mark()
        win.stages = (stages0, _stage_snapshot(loader))
        cpu1 = (_cpu_seconds(loader.memory_pids()), _cpu_seconds([main_pid]))
        win.cpu = (max(cpu1[0] - cpu0[0], 0.0), max(cpu1[1] - cpu0[1], 0.0))
        return win
    finally:
        bar.close()


def _figures(res: LoaderResult, win: _Window, lcfg: LoaderConfig, mon: ResourceMonitor, copy, step_ms) -> None:
    wall = win.t1 - win.t0
    ends, counts = win.ends, win.counts
    images = sum(counts)
    res.timed_batches, res.timed_images, res.wall_s = len(ends), images, wall
    res.images_per_s = rate_stats(win.t0, ends, counts, wall)
    res.batches_per_s = rate_stats(win.t0, ends, [1] * len(ends), wall)

    # Stage times: the loader's cumulative counters, differenced over the window. They are added when
    # a batch reaches this process, so a batch built partly before the window counts inside it; over
    # many batches this edge effect is small (at most workers x batches_ahead batches).
    st0, st1 = win.stages
    secs = {k: st1[0].get(k, 0.0) - st0[0].get(k, 0.0) for k in st1[0]}
    res.stage_samples = n_stage = st1[1] - st0[1]
    if n_stage > 0:
        res.stage_ms_per_sample = {k: 1e3 * v / n_stage for k, v in secs.items()}
        res.stage_sum_ms = sum(res.stage_ms_per_sample.values())
        res.worker_busy_fraction = sum(secs.values()) / (max(lcfg.workers, 1) * wall) if wall > 0 else None
    else:
        res.stage_ms_per_sample = {}
        res.notes.append("the loader reports no stage times (stage_times() stayed empty)")
    res.stage_ms_per_sample["copy"] = 1e3 * win.copy_s / images if copy is not None and images else 0.0

    w, m = win.cpu
    if images:
        res.cpu_ms_per_sample = {"workers": 1e3 * w / images, "main": 1e3 * m / images, "total": 1e3 * (w + m) / images}
    res.cpu = mon.cpu_between(win.t0, win.t1)
    if wall > 0:   # what this bench's own processes used (the machine-wide figure includes other users)
        res.cpu["process_cores"] = {"workers": w / wall, "main": m / wall}
    res.memory = mon.memory()

    step_only = 1e3 / step_ms if step_ms else None
    sps = len(ends) / wall if wall > 0 else 0.0
    res.stall = Stall(step_ms=step_ms, stall_fraction=min(max(win.wait / wall, 0.0), 1.0) if wall > 0 else 0.0,
                      wait_s=win.wait, copy_s=win.copy_s, step_s=win.step_s, steps_per_s=sps, step_only_per_s=step_only,
                      efficiency=sps / step_only if step_only else None)

    res.unreliable = doubt(res.images_per_s, len(ends))
