"""What resuming mid-epoch costs before the first new step: the trainer's feed replaying the epoch and
discarding the batches already trained (fastfeed <= the trainer split), against starting the epoch at the
checkpoint's batch (`set_epoch(epoch, start)`, what `fastfeed train --resume` does now).

    .venv/bin/python benchmarks/train_resume.py [--images 1024] [--batch 16] [--workers 2] [--rounds 3]

A COCO layout of --images files (coco128 cycled; the bundled sample without it) is packed once, then in
one process, alternating for --rounds rounds, each way gets the trainer's own feed (the cpu loader with
mosaic on, through `device_batches` on the CPU) a fresh loader, and is timed from set_epoch to the first
batch after the skip, for a resume in the middle of the epoch. Figures: seconds (median over rounds) and
their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, default_source, machine, replicate_coco  # noqa: E402

sys.path.insert(0, str(REPO))
from fastfeed import Store  # noqa: E402
from fastfeed.loaders import LoaderConfig, create_loader  # noqa: E402
from fastfeed.pack import PackConfig, pack  # noqa: E402
from fastfeed.train.device import device_batches  # noqa: E402


def first_batch_after(store, cfg: LoaderConfig, skip: int, replay: bool) -> float:
    loader = create_loader("cpu", store, cfg)
    feed = device_batches(loader, torch.device("cpu"))
    try:
        t = time.perf_counter()
        if replay:   # the old way: the epoch from batch 0, the first `skip` batches built and thrown away
            feed.set_epoch(0)
            it = iter(feed)
            for _ in range(skip):
                next(it)
        else:
            feed.set_epoch(0, start=skip)
            it = iter(feed)
        next(it)
        took = time.perf_counter() - t
        it.close()
        return took
    finally:
        feed.close()
        loader.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        src = replicate_coco(default_source(), Path(tmp) / "src", args.images)
        pack(PackConfig(src=src, out=Path(tmp) / "s.ff", format="coco", progress=False))
        store = Store(Path(tmp) / "s.ff")
        cfg = LoaderConfig(imgsz=args.imgsz, batch_size=args.batch, workers=args.workers, seed=0)
        nb = len(store) // args.batch
        skip = nb // 2
        print(f"{machine()}\n{len(store)} images, {nb} batches of {args.batch} per epoch, resuming at batch {skip} "
              f"(mosaic on, {args.workers} workers, imgsz {args.imgsz})", flush=True)
        times = {"replay": [], "start": []}
        for r in range(args.rounds):
            for way in ("replay", "start") if r % 2 == 0 else ("start", "replay"):
                times[way].append(first_batch_after(store, cfg, skip, way == "replay"))
                print(f"  round {r}: {way:6} {times[way][-1]:.2f} s", flush=True)
    old, new = statistics.median(times["replay"]), statistics.median(times["start"])
    print(f"\nfirst batch after resuming at batch {skip} of {nb}: replaying {old:.2f} s, set_epoch(start) {new:.2f} s "
          f"({old / new:.1f}x faster; {1e3 * (old - new) / skip:.0f} ms saved per skipped batch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
