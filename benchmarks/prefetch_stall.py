"""Stall of the cpu loader with and without the DevicePrefetcher's thread, and what device augmentation
saves the workers.

    .venv/bin/fastfeed pack ../shared/data/coco128 --format coco -o /tmp/coco128.ff      # once
    .venv/bin/python benchmarks/prefetch_stall.py [--data /tmp/coco128.ff] [--batches 48] [--rounds 2]

1. Calibrate: the loader alone (imgsz 640, batch 16, 2 workers), batches/s over --batches batches.
2. Stall: a simulated accelerator step of exactly that period (time.sleep: the host is free, as while
   a GPU computes), fed straight from the loader or through DevicePrefetcher(loader, "cpu"), with the
   images kept uint8 (the prefetcher then only copies them out of the loader's slot) or converted to
   float32 (by the step loop itself when direct, outside the timed wait; in the thread when
   prefetched). Variants alternate for --rounds rounds; the stall fraction is the share of wall time
   the step loop spent waiting for its next batch.
3. Device augmentation: the workers' augment ms per sample (loader.stage_times()) with
   LoaderConfig(device_augment=False) and True (HSV jitter and flip left to the device), and what the
   same DeviceAugment costs in torch on this CPU, for comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fastfeed import Store  # noqa: E402
from fastfeed.device_augment import DeviceAugment  # noqa: E402
from fastfeed.loaders import LoaderConfig, create_loader  # noqa: E402
from fastfeed.prefetch import DevicePrefetcher  # noqa: E402

COCO128 = Path(os.environ.get("FASTFEED_COCO128", REPO.parent / "shared" / "data" / "coco128"))


def forever(source):
    """Batches across epochs, set_epoch each time (on the prefetcher when there is one)."""
    epoch = 0
    while True:
        source.set_epoch(epoch)
        yield from source
        epoch += 1


def loader_rate(store, cfg: LoaderConfig, batches: int, warmup: int = 8) -> tuple[float, dict]:
    """Batches/s of the loader alone, and the workers' stage ms per sample over the same window."""
    with create_loader("cpu", store, cfg) as loader:
        gen = forever(loader)
        for _ in range(warmup):
            next(gen)
        st0 = loader.stage_times()
        t0 = time.perf_counter()
        for _ in range(batches):
            next(gen)
        dt = time.perf_counter() - t0
        st1 = loader.stage_times()
        gen.close()
    n = max(st1.samples - st0.samples, 1)
    stages = {k: 1e3 * (st1.seconds[k] - st0.seconds.get(k, 0.0)) / n for k in st1.seconds}
    return batches / dt, stages


def stall_run(store, cfg: LoaderConfig, step_s: float, batches: int, variant: str, warmup: int = 8) -> dict:
    """variant: "direct uint8" (the loader's batch as is), "direct float32" (the step loop converts it
    itself, outside the wait), "prefetch uint8" / "prefetch float32" (DevicePrefetcher's thread)."""
    how, kind = variant.split()
    dtype = torch.uint8 if kind == "uint8" else torch.float32
    with create_loader("cpu", store, cfg) as loader:
        pf = DevicePrefetcher(loader, "cpu", depth=2, dtype=dtype) if how == "prefetch" else None
        gen = forever(pf or loader)
        convert = how == "direct" and dtype != torch.uint8

        def step():
            if convert:                           # the loop's own conversion: not a wait, but it costs
                batch.images.to(torch.float32).div_(255)
            time.sleep(step_s)                    # the accelerator's step: the host is free meanwhile

        for _ in range(warmup):
            batch = next(gen)
            step()
        wait = 0.0
        t0 = time.perf_counter()
        for _ in range(batches):
            t = time.perf_counter()
            batch = next(gen)
            wait += time.perf_counter() - t
            step()
        wall = time.perf_counter() - t0
        gen.close()
        if pf is not None:
            pf.close()
    return {"stall": wait / wall, "steps_s": batches / wall}


def augment_cpu_cost(shape, reps: int = 3) -> float:
    """ms per sample of DeviceAugment in torch on this CPU (what the device saves the workers costs here)."""
    aug, x, t = DeviceAugment(), torch.rand(shape), torch.zeros(0, 6)
    aug(x, t)
    t0 = time.perf_counter()
    for _ in range(reps):
        aug(x, t)
    return (time.perf_counter() - t0) / reps / shape[0] * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/tmp/coco128.ff"), help="a packed store (packed from "
                    "coco128 here if it does not exist)")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=48, help="timed batches per run")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of the stall variants")
    ap.add_argument("--step-ms", type=float, help="the simulated step (default: the loader's own period)")
    ap.add_argument("--skip-augment", action="store_true", help="skip part 3")
    args = ap.parse_args()

    if not (args.data / "manifest.json").is_file():
        from fastfeed.pack import PackConfig, pack

        print(f"packing {COCO128} -> {args.data}", flush=True)
        pack(PackConfig(src=COCO128, out=args.data, format="coco", progress=False))
    store = Store(args.data)
    cfg = LoaderConfig(imgsz=args.imgsz, batch_size=args.batch, workers=args.workers)
    print(f"store {args.data} ({len(store)} images); imgsz {args.imgsz}, batch {args.batch}, {args.workers} "
          f"workers; load average {os.getloadavg()[0]:.2f}; torch threads {torch.get_num_threads()}", flush=True)

    # --- 1. the loader's own rate -------------------------------------------------------------------
    rate, stages = loader_rate(store, cfg, args.batches)
    step_s = args.step_ms / 1e3 if args.step_ms else 1.0 / rate
    print(f"loader alone: {rate:.2f} batches/s ({rate * args.batch:.0f} images/s); step {step_s * 1e3:.1f} ms",
          flush=True)

    # --- 2. stall at that step, alternating variants ----------------------------------------------------
    variants = ("direct uint8", "prefetch uint8", "direct float32", "prefetch float32")
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            runs[v].append(stall_run(store, cfg, step_s, args.batches, v))
            print(f"  round {r + 1} {v:<17} stall {runs[v][-1]['stall']:6.1%}  {runs[v][-1]['steps_s']:.2f} steps/s",
                  flush=True)

    # --- 3. what device augmentation saves the workers ---------------------------------------------------
    aug_rows = []
    if not args.skip_augment:
        for device_augment in (False, True):
            r, st = loader_rate(store, replace(cfg, device_augment=device_augment), args.batches)
            aug_rows.append((device_augment, r * args.batch, st))
        torch_ms = augment_cpu_cost((4, 3, args.imgsz, args.imgsz))

    # --- the table, last ---
    step_only = 1.0 / step_s
    print(f"\n== stall at a {step_s * 1e3:.1f} ms simulated step (step alone: {step_only:.2f} steps/s); "
          f"median of {args.rounds} round(s) x {args.batches} batches ==")
    print(f"{'variant':<18} {'stall':>7} {'steps/s':>8} {'of step-only':>13}")
    for v in variants:
        stall = statistics.median(x["stall"] for x in runs[v])
        sps = statistics.median(x["steps_s"] for x in runs[v])
        print(f"{v:<18} {stall:7.1%} {sps:8.2f} {sps / step_only:13.0%}")
    if aug_rows:
        print("\n== workers' ms per sample (loader alone) ==")
        print(f"{'device_augment':<15} {'images/s':>9} {'augment':>8} {'all stages':>11}")
        for device_augment, ips, st in aug_rows:
            print(f"{device_augment!s:<15} {ips:9.0f} {st['augment']:8.2f} {sum(st.values()):11.2f}")
        saved = aug_rows[0][2]["augment"] - aug_rows[1][2]["augment"]
        print(f"saved on the workers: {saved:.2f} ms/sample; the same HSV+flip in float32 torch on this CPU: "
              f"{torch_ms:.1f} ms/sample (on an accelerator it is a few kernels per batch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
