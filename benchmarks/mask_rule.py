"""fastfeed's instance masks against Ultralytics' for the same polygons (issue 28), at the trainer's mask size.

    .venv-ultralytics/bin/python benchmarks/mask_rule.py [--imgsz 128 640] [--shapes 400]

Random shapes-seg polygons (squares, 32-gon discs, triangles; `task_sets.py`) anywhere in an imgsz square are
rasterised at 1/mask_ratio (4) by both: fastfeed's `augment.masks.rasterise` (pixel-centre rule on the exact
float polygon) and Ultralytics' `polygon2mask` (its training and validation masks: points truncated to
int, filled at full size, then resized down). Printed per imgsz: the median IoU of the two masks and each
one's area over the polygon's exact area. Ultralytics' validation scores predictions against its own masks,
so where the two rules differ, a model trained on fastfeed's masks is scored against masks of the other rule.
Runs in `.venv-ultralytics` (fastfeed importable there, as `make venv-ultralytics` installs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from task_sets import SHAPES, shape_polygon  # noqa: E402


def compare(imgsz: int, n: int, ratio: int = 4, seed: int = 0) -> dict:
    from ultralytics.data.utils import polygon2mask

    from fastfeed.augment.masks import rasterise

    rng = np.random.default_rng(seed)
    iou, area_ff, area_ul = [], [], []
    for _ in range(n):
        side = rng.uniform(0.06, 0.6) * imgsz
        x1, y1 = rng.uniform(0, imgsz - side, 2)
        poly = shape_polygon(int(rng.integers(len(SHAPES))), x1, y1, side)
        ff = rasterise([poly], imgsz, ratio, False)[0].astype(bool)
        ul = polygon2mask((imgsz, imgsz), [poly.reshape(-1)], downsample_ratio=ratio).astype(bool)
        exact = cv2.contourArea(poly) / ratio**2
        iou.append((ff & ul).sum() / max((ff | ul).sum(), 1))
        area_ff.append(ff.sum() / exact)
        area_ul.append(ul.sum() / exact)
    return {"imgsz": imgsz, "iou_median": float(np.median(iou)), "iou_p10": float(np.percentile(iou, 10)),
            "area_fastfeed": float(np.median(area_ff)), "area_ultralytics": float(np.median(area_ul))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--imgsz", type=int, nargs="+", default=[128, 160, 320, 640])
    ap.add_argument("--shapes", type=int, default=400)
    args = ap.parse_args()
    print("| imgsz | masks | IoU fastfeed vs Ultralytics, median (p10) | area / exact area: fastfeed | Ultralytics |")
    print("|---|---|---|---|---|")
    for s in args.imgsz:
        r = compare(s, args.shapes)
        print(f"| {s} | {s // 4} x {s // 4} | {r['iou_median']:.3f} ({r['iou_p10']:.3f}) | {r['area_fastfeed']:.3f} | "
              f"{r['area_ultralytics']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
