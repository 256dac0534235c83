"""CutMix (Ultralytics' `cutmix`): a rectangle of a second sample, drawn where the first shows no object, pasted
over the first, with the second sample's objects the rectangle shows (clipped to it). The plan draws AREAS
candidates (`draw_cut_rects`: the CutMix paper's box, side sqrt(1 - lam) of the output, lam ~ Beta(1, 1)) and a
uniform `pick`; `cut_in` takes the `pick`-th share of those that overlap none of the first sample's boxes, and skips
the cut when none is free or it shows too little of every second object (under 10% of its box, 1% if segmented).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from .boxes import box_ioa
from .labels import Labels
from .points import paste_labels

AREAS = 3   # candidate rectangles per sample (Ultralytics' num_areas)


def draw_cut_rects(rng: np.random.Generator, size: int) -> tuple[tuple[int, int, int, int], ...]:
    """AREAS candidate rectangles (x1, y1, x2, y2 whole pixels of the size x size output), in draw order."""
    rects = []
    for _ in range(AREAS):
        half = int(size * math.sqrt(1.0 - rng.beta(1.0, 1.0))) // 2
        cx, cy = (int(v) for v in rng.integers(size, size=2))
        rects.append((max(cx - half, 0), max(cy - half, 0), min(cx + half, size), min(cy + half, size)))
    return tuple(rects)


def cut_rect(labels: Labels, labels2: Labels, rects, pick: float):
    """The rectangle a cut pastes ((x1, y1, x2, y2), and the second sample's objects it keeps: a bool mask), or
    None when the cut is skipped."""
    free = [r for r in rects if not (box_ioa(r, labels.boxes) > 0).any()]
    if not free:
        return None
    rect = free[int(pick * len(free))]
    keep = box_ioa(rect, labels2.boxes)[0] >= (0.01 if labels2.polygons is not None else 0.1)
    return (rect, keep) if keep.any() else None


def clip_corners(corners: np.ndarray, rect) -> np.ndarray:
    """Oriented boxes [N,4,2] cut to `rect` (x1, y1, x2, y2) as Ultralytics cuts them (preserve_obb): the box along
    its own axes that bounds the part inside the rectangle (a box wholly outside: 4 times its first corner)."""
    x1, y1, x2, y2 = rect
    canvas = np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], np.float32)
    out = np.array(corners, np.float32)
    for i, q in enumerate(out):
        area, seen = cv2.intersectConvexConvex(cv2.convexHull(q), canvas)
        if seen is None or area <= 0:
            out[i] = q[0]
            continue
        dx, dy = q[1] - q[0]
        norm = math.hypot(dx, dy) or 1.0
        basis = np.array([[dx, -dy], [dy, dx]], np.float32) / norm   # columns: the box's own axes
        (u1, v1), (u2, v2) = (a := seen.reshape(-1, 2) @ basis).min(0), a.max(0)
        out[i] = np.array([[u1, v1], [u2, v1], [u2, v2], [u1, v2]], np.float32) @ basis.T
    return out


def cut_in(res: np.ndarray, labels: Labels, res2: np.ndarray, labels2: Labels, rects, pick: float, hyp
           ) -> tuple[np.ndarray, Labels]:
    """The cut of rendered sample (res, labels) with second sample (res2, labels2), both in output pixels: `res`
    changed in place, the labels joined (the second's clipped to the rectangle, by `points.paste_labels`; oriented
    boxes first by `clip_corners`)."""
    chosen = cut_rect(labels, labels2, rects, pick)
    if chosen is None:
        return res, labels
    (x1, y1, x2, y2), keep = chosen
    res[y1:y2, x1:x2] = res2[y1:y2, x1:x2]
    rect = (float(x1), float(y1), float(x2), float(y2))
    labels2 = labels2.take(keep)
    if labels2.corners is not None:   # oriented boxes: cut along their own axes, as Ultralytics does
        labels2.corners = clip_corners(labels2.corners, rect)
    shown = paste_labels([labels2], [np.eye(3)], [rect], res.shape[0], hyp, [rect])
    return res, Labels.concat([labels, shown])
