"""What the choice of mosaic partners costs: a per-worker buffer of recent images vs the whole dataset.

    python benchmarks/mosaic_partners.py [--data STORE] [--batches 24]

The cpu loader draws a mosaic's 3 partners from the worker's buffer of recently loaded images (the
batch's own images included), as Ultralytics does; drawing them from the whole dataset instead
means loading (decoding) 3 more images per sample. Both run here in one process, one core, on the
same batches; it prints ms per sample and how often an image recurs within a batch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_source, replicate_coco  # noqa: E402

from fastfeed import Store  # noqa: E402
from fastfeed.loaders import LoaderConfig  # noqa: E402
from fastfeed.loaders.pipeline import BatchBuilder, StoreSource  # noqa: E402
from fastfeed.loaders.sampler import epoch_batches  # noqa: E402

PARTNERS = 8 * 16   # the cpu loader's default at batch 16: min(images, 8 x batch, 1000)


class WholeDatasetPartners(BatchBuilder):
    """Partners drawn uniformly from the whole store: each needs its own read and decode."""

    def build(self, indices, epoch, batch_id, mosaic_on, out):
        rng = np.random.default_rng([9, epoch, batch_id])
        extra = rng.integers(len(self.source.store), size=3 * len(indices))
        times = {"read": 0.0, "decode": 0.0, "augment": 0.0, "collate": 0.0}
        self.partners.clear()
        for i in extra:  # the 3 partners of every sample, loaded on demand
            img, nb, cls = self.source.load(int(i), times)
            h, w = img.shape[:2]
            self.partners.append((img, nb * np.array([w, h, w, h], np.float32), cls))
        targets, t = super().build(indices, epoch, batch_id, mosaic_on, out)
        return targets, {k: t[k] + times[k] for k in t}


def run(builder_cls, store, cfg, batches):
    b = builder_cls(StoreSource(store, cfg.imgsz), cfg, 0, PARTNERS)
    if builder_cls is WholeDatasetPartners:
        b.partners = type(b.partners)(maxlen=10_000)
    out = np.empty((cfg.batch_size, 3, cfg.imgsz, cfg.imgsz), np.uint8)
    t0 = time.perf_counter()
    for k, idx in enumerate(batches):
        b.build(idx, 0, k, True, out)
    return (time.perf_counter() - t0) / sum(len(i) for i in batches) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, help="a store (default: coco128 replicated to 512 images)")
    ap.add_argument("--batches", type=int, default=24)
    args = ap.parse_args()
    cv2.setNumThreads(1)
    with tempfile.TemporaryDirectory() as tmp:
        if args.data is None:
            from fastfeed.pack import PackConfig, pack

            src = replicate_coco(default_source(), Path(tmp) / "src", 512)
            args.data = Path(tmp) / "s.ff"
            pack(PackConfig(src=src, out=args.data, format="coco", progress=False))
        store = Store(args.data)
        cfg = LoaderConfig(imgsz=640, batch_size=16, workers=0)
        batches = epoch_batches(len(store), 16, epoch=0, seed=0)[: args.batches]
        run(BatchBuilder, store, cfg, batches[:2])  # warm the page cache
        buf = run(BatchBuilder, store, cfg, batches)
        whole = run(WholeDatasetPartners, store, cfg, batches)
    print(f"mosaic partners, one core, imgsz 640, {args.batches} batches of 16 from {args.data}")
    print(f"  per-worker buffer of {PARTNERS} recent images: {buf:6.2f} ms/sample")
    print(f"  uniform over the whole dataset:         {whole:6.2f} ms/sample  ({whole / buf:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
