"""The one rule for coordinates reaching outside their image, for boxes and for the points of polygons, keypoints
and oriented boxes alike: within `CLIP_TOLERANCE_PX` of an edge is float noise, clipped silently; further is
clipped and counted; more than `FAR_OUTSIDE` of the image beyond an edge is not this image's (another unit or
frame) and the object is dropped, by name. Boxes also drop when degenerate or wholly outside; polygons and
oriented boxes when degenerate (under 3 points, or no area); keypoints are not clipped but hidden (visibility 0),
since a clipped keypoint would mark a wrong place."""

from __future__ import annotations

import numpy as np

from .. import tasks
from .report import Problem

CLIP_TOLERANCE_PX = 0.5  # COCO boxes often overshoot by float noise; that is not worth a note
FAR_OUTSIDE = 0.5        # a corner further than half the image beyond an edge: not a box of this image
_MIN_AREA_PX = 1e-6      # px^2: a polygon or oriented box of less area is a line or a point


def overshoot_px(pts: np.ndarray, w: int, h: int) -> np.ndarray:
    """How far (px) each row of normalised x, y points [..., N, 2] reaches beyond the image, per row ([...])."""
    x, y = pts[..., 0], pts[..., 1]
    return np.maximum(np.maximum(-x, x - 1).max(-1) * w, np.maximum(-y, y - 1).max(-1) * h)


def far_outside(pts: np.ndarray) -> np.ndarray:
    """Per row of `pts` ([N, ...] normalised coordinates): any value more than FAR_OUTSIDE beyond 0..1."""
    out = (pts < -FAR_OUTSIDE) | (pts > 1 + FAR_OUTSIDE)
    return out.reshape(len(pts), -1).any(1) if out.size else np.zeros(len(pts), bool)


def clean_boxes(xyxy: np.ndarray, classes, crowd, size, name: str, problems: list[Problem], where=None):
    """Drop degenerate, outside and far-reaching boxes, clip the rest; xyxy normalised, float64. `where`:
    the `file:line` of each box (YOLO), for the details. Returns (boxes, classes, crowd, the kept mask)."""
    h, w = size
    bw, bh = xyxy[:, 2] - xyxy[:, 0], xyxy[:, 3] - xyxy[:, 1]
    degenerate = ~((bw > 0) & (bh > 0))
    outside = ~degenerate & ((xyxy[:, 2] <= 0) | (xyxy[:, 3] <= 0) | (xyxy[:, 0] >= 1) | (xyxy[:, 1] >= 1))
    far = ~degenerate & ~outside & far_outside(xyxy)
    clipped = ~degenerate & ~outside & ~far & (overshoot_px(xyxy.reshape(-1, 2, 2), w, h) > CLIP_TOLERANCE_PX)
    for reason, mask in (("box_degenerate", degenerate), ("box_outside", outside), ("box_far_outside", far),
                         ("box_clipped", clipped)):
        for i in np.flatnonzero(mask):
            x1, y1, x2, y2 = xyxy[i] * (w, h, w, h)
            at = f"{where[i]}: " if where else ""
            detail = f"{at}class {classes[i]} box x1={x1:.1f} y1={y1:.1f} x2={x2:.1f} y2={y2:.1f}"
            if reason == "box_far_outside":
                detail += (f" on a {w}x{h} image, normalised {', '.join(f'{v:.3g}' for v in xyxy[i])}: far outside "
                           "0..1, not a box of this image (pixels where fractions of the image belong?)")
            problems.append(Problem(reason, name, detail))
    keep = ~degenerate & ~outside & ~far
    return np.clip(xyxy[keep], 0.0, 1.0), classes[keep], crowd[keep], keep


def clean_geometry(task: str, geometry: list, classes, size, name: str, problems: list[Problem], where=None):
    """Check each training object's points (normalised float64: segment [P,2] (P 0: no polygon), pose [K,D], obb
    [4,2]) by the rule above, each task's parts of it its own (`fastfeed.tasks`: which points count, what is
    degenerate). Returns (the kept mask, the cleaned geometry of the kept objects)."""
    h, w = size
    spec = tasks.get(task)
    keep, out = np.ones(len(geometry), bool), []
    for i, g in enumerate(geometry):
        at = f"{where[i]}: " if where else ""
        what = f"{at}class {classes[i]}"
        if len(g) == 0 and spec.box_alone:   # an object with its box and no points (segment: Ultralytics' too)
            out.append(g)
            continue
        active = spec.active(g)
        pts = g[:, :2]
        if far_outside(pts[active][None]).any():
            problems.append(Problem("points_far_outside", name, (
                f"{what}: a point at {', '.join(f'{v:.3g}' for v in pts[active][far_outside(pts[active])][0])} on a "
                f"{w}x{h} image, far outside 0..1 (pixels where fractions of the image belong?)")))
            keep[i] = False
            continue
        if spec.degenerate(g, w, h, _MIN_AREA_PX):
            problems.append(Problem(spec.degenerate_reason, name, f"{what}: {len(g)} points enclosing no area"))
            keep[i] = False
            continue
        beyond = active & (overshoot_px(pts[:, None], w, h) > CLIP_TOLERANCE_PX)
        g, note = spec.settle(g, active, beyond)
        if note:
            problems.append(Problem(note[0], name, f"{what}: {note[1]}"))
        out.append(g)
    return keep, out
