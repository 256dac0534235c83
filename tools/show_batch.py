"""Draw one loader batch with its boxes into a PNG grid, to see that mosaic and boxes look right.

    python tools/show_batch.py --data coco128.ff -o batch.png [--loader cpu] [--imgsz 640] [--batch 16]
                               [--epoch 0] [--no-augment] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import cv2
import numpy as np

from fastfeed import Store
from fastfeed.imgsz import imgsz_error
from fastfeed.loaders import LoaderConfig, create_loader, list_loaders
from fastfeed.store.format import FormatError

_PALETTE = [(255, 56, 56), (255, 157, 151), (255, 112, 31), (255, 178, 29), (207, 210, 49), (72, 249, 10),
            (146, 204, 23), (61, 219, 134), (26, 147, 52), (0, 212, 187), (44, 153, 168), (0, 194, 255),
            (52, 69, 147), (100, 115, 255), (0, 24, 236), (132, 56, 255), (82, 0, 133), (203, 56, 255)]


def draw_batch(images: np.ndarray, targets: np.ndarray, names: list[str], cols: int | None = None) -> np.ndarray:
    """images uint8 [B,3,S,S], targets [M,6] (img_idx, cls, cx, cy, w, h in 0..1) -> RGB grid."""
    b, _, s, _ = images.shape
    cols = cols or math.ceil(math.sqrt(b))
    rows = math.ceil(b / cols)
    grid = np.full((rows * s, cols * s, 3), 255, np.uint8)
    thick = max(1, s // 320)
    for i in range(b):
        tile = np.ascontiguousarray(images[i].transpose(1, 2, 0))
        for _, c, cx, cy, w, h in targets[targets[:, 0] == i]:
            colour = _PALETTE[int(c) % len(_PALETTE)]
            p1 = (int((cx - w / 2) * s), int((cy - h / 2) * s))
            p2 = (int((cx + w / 2) * s), int((cy + h / 2) * s))
            cv2.rectangle(tile, p1, p2, colour, thick)
            label = names[int(c)] if int(c) < len(names) else str(int(c))
            cv2.putText(tile, label, (p1[0] + 2, max(p1[1] - 3, 10)), cv2.FONT_HERSHEY_SIMPLEX, 0.4 * thick,
                        colour, thick, cv2.LINE_AA)
        r, c = divmod(i, cols)
        grid[r * s:(r + 1) * s, c * s:(c + 1) * s] = tile
        cv2.rectangle(grid, (c * s, r * s), ((c + 1) * s - 1, (r + 1) * s - 1), (255, 255, 255), 2)
    return grid


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a store made by `fastfeed pack`")
    ap.add_argument("-o", "--out", type=Path, required=True, help="PNG to write")
    ap.add_argument("--loader", default="cpu", help=f"one of {', '.join(list_loaders())}")
    ap.add_argument("--imgsz", type=int, default=640, help="output side, a multiple of 32 (default 640)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epoch", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--no-augment", action="store_true", help="letterboxed evaluation batch instead")
    args = ap.parse_args(argv)
    if (msg := imgsz_error(args.imgsz)) is not None:   # the rule every fastfeed command applies
        ap.error(msg)
    try:
        store = Store(args.data)
        cfg = LoaderConfig(imgsz=args.imgsz, batch_size=args.batch, workers=args.workers, seed=args.seed,
                           augment=not args.no_augment, drop_last=False)
        with create_loader(args.loader, store, cfg) as loader:
            loader.set_epoch(args.epoch)
            images, targets = next(iter(loader))
            grid = draw_batch(images.numpy(), targets.numpy(), store.class_names)
    except (ValueError, FormatError) as e:
        print(f"show_batch: error: {e}", file=sys.stderr)
        return 1
    cv2.imwrite(str(args.out), cv2.cvtColor(grid, cv2.COLOR_RGB2BGR))
    print(f"wrote {args.out}: {len(images)} images, {len(targets)} boxes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
