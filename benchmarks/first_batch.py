"""Time to the first batch of the `cpu` loader (create the loader, fork its workers, build batch 0), with the
workers' output slots as they are now (`workers.shared_zeros`: an anonymous shared mapping the forked workers
inherit) against the way they were made before 8297a71 (a tensor copied into /dev/shm by `share_memory_()` before
the fork), alternated in one process.

    .venv/bin/python benchmarks/first_batch.py --workers 1 2 4 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_source, machine, replicate_coco  # noqa: E402


def copied_into_shm(shape, dtype, forked):   # the slots before 8297a71
    import torch

    return torch.empty(shape, dtype=dtype).share_memory_()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    import fastfeed.loaders.workers as workers
    from fastfeed import Store
    from fastfeed.loaders import LoaderConfig, create_loader

    ways = {"before (share_memory_)": copied_into_shm, "now (shared mapping)": workers.shared_zeros}
    with tempfile.TemporaryDirectory(prefix="ff-first-batch-") as tmp:
        data = replicate_coco(default_source(), Path(tmp) / "data", args.images)
        subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(data), "--format", "coco", "-o", f"{tmp}/s.ff", "--quiet"],
                       check=True, capture_output=True)
        store = Store(f"{tmp}/s.ff")
        print(f"{machine()}\n{args.images} images, imgsz {args.imgsz}, batch 16, median (min) of {args.rounds} "
              "alternated rounds\n")
        print("| workers | " + " | ".join(f"{w}, s" for w in ways) + " | now / before |")
        print("|---|---|---|---|")
        for n in args.workers:
            times: dict[str, list] = {w: [] for w in ways}
            for r in range(args.rounds):
                for way, make in ways.items():
                    workers.shared_zeros = make
                    cfg = LoaderConfig(imgsz=args.imgsz, batch_size=16, workers=n, seed=r)
                    t0 = time.perf_counter()
                    with create_loader("cpu", store, cfg) as loader:
                        next(iter(loader))
                        times[way].append(time.perf_counter() - t0)
            med = [statistics.median(v) for v in times.values()]
            print(f"| {n} | " + " | ".join(f"{statistics.median(v):.3f} ({min(v):.3f})" for v in times.values())
                  + f" | {med[1] / med[0]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
