"""Draw one loader batch with its labels into a PNG grid, to see that mosaic and labels look right.

    python tools/show_batch.py --data coco128.ff -o batch.png [--loader cpu] [--imgsz 640] [--batch 16]
                               [--epoch 0] [--no-augment] [--seed 0] [--no-overlap-mask] [--no-skeleton]

Boxes for every store; and by the store's task: segment, each object's mask tinted in its class colour
(from the batch's masks, at 1/mask_ratio of the image, scaled up); pose, the keypoints as dots (hidden
ones left out) joined by COCO's skeleton when there are 17; obb, the rotated boxes instead of the upright ones.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import cv2
import numpy as np

from fastfeed import Store
from fastfeed.checks import imgsz_error
from fastfeed.loaders import LoaderConfig, create_loader, list_loaders
from fastfeed.store.format import FormatError

_PALETTE = [(255, 56, 56), (255, 157, 151), (255, 112, 31), (255, 178, 29), (207, 210, 49), (72, 249, 10),
            (146, 204, 23), (61, 219, 134), (26, 147, 52), (0, 212, 187), (44, 153, 168), (0, 194, 255),
            (52, 69, 147), (100, 115, 255), (0, 24, 236), (132, 56, 255), (82, 0, 133), (203, 56, 255)]


# COCO's person skeleton (0-based keypoint pairs), drawn when a pose store has its 17 keypoints.
COCO_SKELETON = ((15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8), (7, 9),
                 (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6))
MASK_ALPHA = 0.45


def _tint(tile: np.ndarray, mask: np.ndarray, colour) -> None:
    """Blend `colour` into `tile` (RGB, in place) where `mask` (any size, nearest-scaled to the tile) is set."""
    s = tile.shape[0]
    on = cv2.resize(mask.astype(np.uint8), (s, s), interpolation=cv2.INTER_NEAREST).astype(bool)
    tile[on] = (tile[on] * (1 - MASK_ALPHA) + np.float32(colour) * MASK_ALPHA).astype(np.uint8)


def _rotated_corners(rbox: np.ndarray, s: int) -> np.ndarray:
    """cx, cy, w, h (0..1 of the side), angle (radians) -> int32 [4, 2] pixel corners (cv2's rotated-rect rule)."""
    cx, cy, w, h, angle = (float(v) for v in rbox)
    return np.round(cv2.boxPoints(((cx * s, cy * s), (w * s, h * s), np.degrees(angle)))).astype(np.int32)


def _draw_keypoints(tile: np.ndarray, kpts: np.ndarray, colour, thick: int, skeleton: bool) -> None:
    s = tile.shape[0]
    xy = kpts[:, :2] * s
    shown = kpts[:, 2] > 0 if kpts.shape[1] == 3 else (kpts[:, :2] != 0).any(1)
    if skeleton and len(kpts) == 17:
        for a, b in COCO_SKELETON:
            if shown[a] and shown[b]:
                cv2.line(tile, tuple(map(int, xy[a])), tuple(map(int, xy[b])), colour, thick, cv2.LINE_AA)
    for k in np.flatnonzero(shown):
        cv2.circle(tile, tuple(map(int, xy[k])), 2 * thick + 1, _PALETTE[k % len(_PALETTE)], -1, cv2.LINE_AA)


def draw_batch(images: np.ndarray, targets: np.ndarray, names: list[str], cols: int | None = None, *,
               masks: np.ndarray | None = None, keypoints: np.ndarray | None = None, rboxes: np.ndarray | None = None,
               skeleton: bool = True) -> np.ndarray:
    """images uint8 [B,3,S,S], targets [M,6] (img_idx, cls, cx, cy, w, h in 0..1) -> RGB grid.

    The task's fields, rows in targets' order (`fastfeed.batch.Batch`): masks int16 [B, S/r, S/r] (overlap: value
    j+1 where the image's j-th object is) or uint8 [M, S/r, S/r]; keypoints [M,K,D] in 0..1; rboxes [M,5]."""
    b, _, s, _ = images.shape
    cols = cols or math.ceil(math.sqrt(b))
    rows = math.ceil(b / cols)
    grid = np.full((rows * s, cols * s, 3), 255, np.uint8)
    thick = max(1, s // 320)
    overlap = masks is not None and masks.dtype == np.int16
    for i in range(b):
        tile = np.ascontiguousarray(images[i].transpose(1, 2, 0))
        rows_i = np.flatnonzero(targets[:, 0] == i)
        for j, m in enumerate(rows_i):
            colour = _PALETTE[int(targets[m, 1]) % len(_PALETTE)]
            if masks is not None:
                _tint(tile, masks[i] == j + 1 if overlap else masks[m], colour)
        for m in rows_i:
            _, c, cx, cy, w, h = targets[m]
            colour = _PALETTE[int(c) % len(_PALETTE)]
            if rboxes is not None:
                corners = _rotated_corners(rboxes[m], s)
                cv2.polylines(tile, [corners], True, colour, thick, cv2.LINE_AA)
                p1 = tuple(int(v) for v in corners[corners[:, 1].argmin()])
            else:
                p1 = (int((cx - w / 2) * s), int((cy - h / 2) * s))
                p2 = (int((cx + w / 2) * s), int((cy + h / 2) * s))
                cv2.rectangle(tile, p1, p2, colour, thick)
            if keypoints is not None:
                _draw_keypoints(tile, keypoints[m], colour, thick, skeleton)
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
    ap.add_argument("--no-overlap-mask", action="store_true",
                    help="segment: one mask per object (overlap_mask False) instead of one per image")
    ap.add_argument("--no-skeleton", action="store_true", help="pose: dots only, no COCO skeleton lines")
    args = ap.parse_args(argv)
    if (msg := imgsz_error(args.imgsz)) is not None:   # the rule every fastfeed command applies
        ap.error(msg)
    try:
        store = Store(args.data)
        cfg = LoaderConfig(imgsz=args.imgsz, batch_size=args.batch, workers=args.workers, seed=args.seed,
                           augment=not args.no_augment, drop_last=False, overlap_mask=not args.no_overlap_mask)
        with create_loader(args.loader, store, cfg) as loader:
            loader.set_epoch(args.epoch)
            batch = next(iter(loader))
            images, targets = batch
            extras = {k: v.numpy() for k, v in batch.extras().items()}
            grid = draw_batch(images.numpy(), targets.numpy(), store.class_names, skeleton=not args.no_skeleton,
                              **extras)
    except (ValueError, FormatError) as e:
        print(f"show_batch: error: {e}", file=sys.stderr)
        return 1
    cv2.imwrite(str(args.out), cv2.cvtColor(grid, cv2.COLOR_RGB2BGR))
    drawn = "".join(f", {k} {list(v.shape)}" for k, v in extras.items())
    print(f"wrote {args.out}: task {store.manifest.task}, {len(images)} images, {len(targets)} boxes{drawn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
