"""One loader, one timed run: first-batch latency, warm-up, then a window of batches consumed the
way a training loop would (wait for the batch, copy it to the device, run or simulate the step)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from time import perf_counter

import numpy as np
import psutil
from tqdm import tqdm

from ..devices import synchronize
from ..loaders import LoaderConfig, create_loader
from .monitor import ResourceMonitor
from .result import LoaderResult, Rate, Stall

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
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return total


def rate_stats(t0: float, ends: list[float], counts: list[int], wall: float) -> Rate:
    """Overall rate and the spread over ~10 intervals of consecutive batches (exact: no binning)."""
    total = sum(counts)
    n = len(ends)
    group = max(1, n // 10)
    rates, prev, k = [], t0, 0
    while k + group <= n:
        dt = ends[k + group - 1] - prev
        if dt > 0:
            rates.append(sum(counts[k:k + group]) / dt)
        prev, k = ends[k + group - 1], k + group
    if not rates:
        rates = [total / wall] if wall > 0 else [0.0]
    a = np.asarray(rates)
    p25, med, p75 = np.percentile(a, [25, 50, 75])
    return Rate(overall=total / wall if wall > 0 else 0.0, median=float(med), p25=float(p25), p75=float(p75),
                min=float(a.min()), max=float(a.max()), intervals=[float(x) for x in a])


def _failed(res: LoaderResult, e: BaseException) -> LoaderResult:
    if isinstance(e, ImportError):
        res.status, res.error = "unavailable", str(e) or type(e).__name__
        log.warning("loader %s unavailable: %s", res.name, res.error)
    else:
        res.status, res.error = "failed", f"{type(e).__name__}: {e}"
        log.warning("loader %s failed: %s", res.name, res.error, exc_info=log.isEnabledFor(logging.DEBUG))
    return res


def measure(name: str, store, lcfg: LoaderConfig, *, seconds: float, batches: int | None, warmup: int,
            copy: Copy | None = None, step: Step | None = None, step_ms: float | None = None,
            interval: float = 0.2, progress: bool = True, label: str | None = None) -> LoaderResult:
    """Run loader `name` on `store` and measure it. Never raises for the loader's own failures:
    a missing optional dependency (ImportError) gives status 'unavailable', anything else 'failed'."""
    res = LoaderResult(name=name, workers=lcfg.workers, loader_config=lcfg.to_dict(),
                       copy_applicable=copy is not None)
    label = label or name
    mon = ResourceMonitor(interval).start()
    loader = gen = bar = None
    try:
        # --- start: time to the first batch, loader creation and worker start included ----------
        t_create = perf_counter()
        try:
            loader = create_loader(name, store, lcfg)
            ready = None
            if loader.on_device:   # its batches come out on the device: no copy to time; waiting for the
                copy, res.copy_applicable = None, False   # device to finish a batch is waiting for data
                res.notes.append("batches come out on the device: no host->device copy; the wait for each batch "
                                 "includes the device finishing it")

                def ready(b):
                    synchronize(b.images.device)
            res.batches_per_epoch = len(loader)
            if res.batches_per_epoch == 0:
                raise ValueError(f"no full batch: the store's {len(store)} images make 0 batches of {lcfg.batch_size}")
            gen = _forever(loader)
            first = next(gen)
            res.first_batch_s = perf_counter() - t_create
            pids = loader.memory_pids()
            mon.set_pids(pids)
            # --- warm-up: untimed batches through the same copy/step path (the first one counts) -
            res.warmup_batches = max(warmup, 1)
            batch = first
            for k in range(res.warmup_batches):
                if k:
                    batch = next(gen)
                dev = copy(batch) if copy else batch
                if step:
                    step(*dev)
        except Exception as e:  # ImportError included: reported as "unavailable"
            return _failed(res, e)

        # --- the timed window ------------------------------------------------------------------
        timed_total = float(batches) if batches else float(seconds)
        bar = tqdm(total=timed_total, desc=label, unit="batch" if batches else "s", leave=False, disable=not progress,
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} {unit}{postfix}" if batches
                   else "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s{postfix}")
        pids = loader.memory_pids()
        mon.set_pids(pids)
        st0 = _stage_snapshot(loader)
        main_pid = psutil.Process().pid
        cpu_w0, cpu_m0 = _cpu_seconds(pids), _cpu_seconds([main_pid])
        wait = copy_s = step_s = 0.0
        ends: list[float] = []
        counts: list[int] = []
        done = 0
        t0 = mon.mark()
        now = t0
        try:
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
                wait += t_got - t_req
                copy_s += t_copied - t_got
                step_s += now - t_copied
                ends.append(now)
                counts.append(int(batch.images.shape[0]))
                done += counts[-1]
                if batches:
                    bar.update(1)
                    if len(ends) >= batches:
                        break
                else:
                    bar.update(min(now - t0, seconds) - bar.n)
                    if now - t0 >= seconds:
                        break
                if len(ends) % 8 == 0:
                    bar.set_postfix_str(f"{done / (now - t0):.0f} img/s", refresh=False)
        except Exception as e:
            return _failed(res, e)
        t1 = mon.mark()
        st1 = _stage_snapshot(loader)
        pids_end = loader.memory_pids()
        cpu_w1, cpu_m1 = _cpu_seconds(pids_end), _cpu_seconds([main_pid])
        res.shared_bytes = int(loader.shared_bytes())
    finally:
        if bar is not None:
            bar.close()
        if gen is not None:
            gen.close()
        if loader is not None:
            loader.close()
        mon.stop()

    # --- figures ---------------------------------------------------------------------------------
    wall = t1 - t0
    images = sum(counts)
    res.timed_batches, res.timed_images, res.wall_s = len(ends), images, wall
    res.images_per_s = rate_stats(t0, ends, counts, wall)
    res.batches_per_s = rate_stats(t0, ends, [1] * len(ends), wall)

    # Stage times: the loader's cumulative counters, differenced over the window. They are added when
    # a batch reaches this process, so a batch built partly before the window counts inside it; over
    # many batches this edge effect is small (at most workers x prefetch batches).
    secs = {k: st1[0].get(k, 0.0) - st0[0].get(k, 0.0) for k in st1[0]}
    n_stage = st1[1] - st0[1]
    res.stage_samples = n_stage
    if n_stage > 0:
        res.stage_ms_per_sample = {k: 1e3 * v / n_stage for k, v in secs.items()}
        res.stage_sum_ms = sum(res.stage_ms_per_sample.values())
        res.worker_busy_fraction = sum(secs.values()) / (max(lcfg.workers, 1) * wall) if wall > 0 else None
    else:
        res.stage_ms_per_sample = {}
        res.notes.append("the loader reports no stage times (stage_times() stayed empty)")
    res.stage_ms_per_sample["copy"] = 1e3 * copy_s / images if copy is not None and images else 0.0

    if images:
        w, m = max(cpu_w1 - cpu_w0, 0.0), max(cpu_m1 - cpu_m0, 0.0)
        res.cpu_ms_per_sample = {"workers": 1e3 * w / images, "main": 1e3 * m / images,
                                 "total": 1e3 * (w + m) / images}
    res.cpu = mon.cpu_between(t0, t1)
    if wall > 0:   # what this bench's own processes used (the machine-wide figure includes other users)
        res.cpu["process_cores"] = {"workers": max(cpu_w1 - cpu_w0, 0.0) / wall, "main": max(cpu_m1 - cpu_m0, 0.0) / wall}
    res.memory = mon.memory()

    step_only = 1e3 / step_ms if step_ms else None
    sps = len(ends) / wall if wall > 0 else 0.0
    res.stall = Stall(step_ms=step_ms, stall_fraction=min(max(wait / wall, 0.0), 1.0) if wall > 0 else 0.0,
                      wait_s=wait, copy_s=copy_s, step_s=step_s, steps_per_s=sps, step_only_per_s=step_only,
                      efficiency=sps / step_only if step_only else None)

    if len(ends) < 5:
        res.notes.append(f"only {len(ends)} timed batch(es): the spread is not meaningful; run longer")
    return res
