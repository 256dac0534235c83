"""The `device` loader against the `cpu` loader on the same store, in the same process: images/s and host
CPU per image, rounds alternating, ratios; plus what planning alone costs the host per image (the work
that stays on the host when the rest runs on an accelerator).

    .venv/bin/python benchmarks/device_loader.py                       # coco128 x 8 (1,024 files), this CPU
    .venv/bin/python benchmarks/device_loader.py --data coco.ff --device cuda --batch 64 --workers 8

On a machine without an accelerator the device loader's "device" is the CPU: its decode stays on the host
(the workers' libjpeg-turbo, as the cpu loader's) and its per-pixel work runs as float32 torch ops on the
main process's cores, so it is slower there by design; the figures say by how much and where the time goes.
Both loaders are measured with `fastfeed.bench` (the same timer, warm-up and CPU accounting as `fastfeed bench`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_source, replicate_coco  # noqa: E402

from fastfeed.bench import BenchConfig, run_bench  # noqa: E402
from fastfeed.loaders import LoaderConfig  # noqa: E402
from fastfeed.loaders.device.plan import SHIP_ENCODED, SHIP_NONE, Planner  # noqa: E402
from fastfeed.loaders.sampler import epoch_batches  # noqa: E402
from fastfeed.store import Store  # noqa: E402


def planning_cost(store: Store, imgsz: int, batch: int, ship: str, batches: int = 30) -> dict:
    """Host CPU ms per image of one planning worker (read + draws + geometry + boxes, payloads copied into
    a slot), measured in this process: what the device loader costs the host besides launching kernels."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # as in a worker process
    try:
        return _planning_cost(store, imgsz, batch, ship, batches)
    finally:
        torch.set_num_threads(threads)


def _planning_cost(store: Store, imgsz: int, batch: int, ship: str, batches: int) -> dict:
    cfg = LoaderConfig(imgsz=imgsz, batch_size=batch, workers=1)
    planner = Planner(store, cfg, 0, 64, ship)
    slot = np.empty(batch * 512 * 1024, np.uint8)
    order = [b for e in range(8) for b in epoch_batches(len(store), batch, epoch=e, seed=0)]
    for k in range(3):
        planner.build(order[k], 0, k, True, slot)
    sums, t0 = {"read": 0.0, "plan": 0.0}, time.process_time()
    for k in range(batches):
        _, times = planner.build(order[(k + 3) % len(order)], 0, k + 3, True, slot)
        for key in sums:
            sums[key] += times[key]
    n = batches * batch
    return {"cpu_ms": 1e3 * (time.process_time() - t0) / n, **{k: 1e3 * v / n for k, v in sums.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, help="a packed store (default: coco128, or the bundled sample, x8 packed)")
    ap.add_argument("--images", type=int, default=1024, help="files in the replicated source (default 1024)")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0, help="timed seconds per loader and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="where the device loader runs (and the cpu loader's batches go)")
    ap.add_argument("--threads", type=int, help="torch intra-op threads of this process (default: torch's)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            from fastfeed.pack import PackConfig, pack

            src = replicate_coco(default_source(), Path(tmp) / "src", args.images)
            data = Path(tmp) / "s.ff"
            pack(PackConfig(src=src, out=data, format="coco", workers=args.workers, progress=False))
        store = Store(data)
        print(f"device_loader: {data} ({len(store)} images), imgsz {args.imgsz}, batch {args.batch}, "
              f"{args.workers} workers, device {args.device}, torch {torch.__version__} with "
              f"{torch.get_num_threads()} threads", flush=True)
        rounds: dict[str, list] = {"cpu": [], "device": []}
        for r in range(args.rounds):
            for name in rounds:
                res = run_bench(BenchConfig(data=data, loaders=(name,), imgsz=args.imgsz, batch_size=args.batch,
                                            workers=args.workers, seconds=args.seconds, device=args.device,
                                            warmup=3, progress=False)).results[0]
                if not res.ok:
                    print(f"{name}: {res.status}: {res.error}")
                    return 1
                rounds[name].append(res)
                print(f"  round {r + 1} {name:6}: {res.images_per_s.overall:7.1f} images/s, host CPU "
                      f"{res.cpu_ms_per_sample['total']:.2f} ms/image", flush=True)
        plan = {ship: planning_cost(store, args.imgsz, 64, ship) for ship in (SHIP_ENCODED, SHIP_NONE)}

    def med(name, f):
        return statistics.median(f(x) for x in rounds[name])

    summary = {}
    for name in rounds:
        summary[name] = {"images_per_s": [x.images_per_s.overall for x in rounds[name]],
                         "median_images_per_s": med(name, lambda x: x.images_per_s.overall),
                         "host_cpu_ms_per_image": med(name, lambda x: x.cpu_ms_per_sample["total"]),
                         "stage_ms_per_sample": {k: med(name, lambda x, k=k: x.stage_ms_per_sample.get(k, 0.0))
                                                 for k in ("read", "plan", "decode", "augment", "collate")}}
    c, d = summary["cpu"], summary["device"]
    print("\n| loader | images/s per round | median | vs cpu | host CPU ms/image |")
    print("|---|---|---|---|---|")
    for name, s in summary.items():
        ratio = s["median_images_per_s"] / c["median_images_per_s"]
        print(f"| `{name}` | {', '.join(f'{v:.0f}' for v in s['images_per_s'])} | {s['median_images_per_s']:.0f} | "
              f"{ratio:.2f}x | {s['host_cpu_ms_per_image']:.2f} |")
    for name, s in summary.items():
        print(f"{name} stages, ms per sample: " + ", ".join(f"{k} {v:.2f}" for k, v in s["stage_ms_per_sample"].items() if v))
    for ship, p in plan.items():
        print(f"planning alone, batch 64, {'JPEG bytes shipped' if ship == SHIP_ENCODED else 'VRAM cache'}: "
              f"{p['cpu_ms']:.3f} ms host CPU/image (read {p['read']:.3f}, plan {p['plan']:.3f})")
    print(f"device vs cpu: {d['median_images_per_s'] / c['median_images_per_s']:.2f}x images/s, "
          f"{d['host_cpu_ms_per_image'] / c['host_cpu_ms_per_image']:.2f}x host CPU per image")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "loaders": summary,
                                         "planning": plan}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
