"""What a detection model saves by reading a segment store's boxes alone (`LoaderConfig(task="detect")`, what
`fastfeed train`, the detect `FastfeedTrainer` and `fastfeed bench --model` ask for) instead of its masks too:
images/s of the same loader on the same store, both ways, measured in turns in one process (A B A B ...: a
machine that drifts shifts both), the ratio printed against the store's own task.

    .venv/bin/python benchmarks/boxes_alone.py [--src DIR] [--loader cpu] [--imgsz 640] [--seconds 10] [--rounds 2]

The source defaults to coco128 beside the repository (its COCO polygons), packed once with --task segment.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import default_source

from fastfeed import Store
from fastfeed.bench.measure import measure
from fastfeed.loaders import LoaderConfig
from fastfeed.pack import PackConfig, pack


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", type=Path, default=None, help="a COCO dataset with polygons (default: coco128)")
    p.add_argument("--loader", default="cpu")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2, help="turns of (masks, boxes alone)")
    args = p.parse_args()

    src = args.src or default_source()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "seg.ff"
        pack(PackConfig(src=src, out=out, task="segment", format="coco", progress=False))
        store = Store(out)
        print(f"{args.loader} loader, {len(store)} images of {src} packed --task segment, imgsz {args.imgsz}, "
              f"batch {args.batch}, {args.workers} worker(s), {args.seconds:g} s a turn, {args.rounds} rounds")
        rates: dict[str, list[float]] = {"segment": [], "detect": []}
        for r in range(args.rounds):
            for task in ("segment", "detect"):
                cfg = LoaderConfig(imgsz=args.imgsz, batch_size=args.batch, workers=args.workers, device="cpu",
                                   seed=r, task=task)
                res = measure(args.loader, store, cfg, seconds=args.seconds, batches=None, warmup=2, progress=False,
                              label=f"{args.loader} {task}")
                if not res.ok:
                    raise SystemExit(f"{args.loader} ({task}) failed: {res.error}")
                rates[task].append(res.images_per_s.overall)
                print(f"  round {r}: {task:<8} {res.images_per_s.overall:7.1f} images/s")
    seg, det = statistics.median(rates["segment"]), statistics.median(rates["detect"])
    print(f"median images/s: masks too (task segment) {seg:.1f}, boxes alone (task detect) {det:.1f}: "
          f"{det / seg:.2f}x")


if __name__ == "__main__":
    main()
