"""Polygons, keypoints and oriented corners through a plan's maps: the one rule for every task's geometry
(docs/design.md, 'Task geometry goes through the plans' realised maps': what each field does).

`paste_labels` is `paste.paste_boxes` for `Labels`: each tile's objects go through that tile's realised map
(the one `paste_tile` returns, or the drawn one where a renderer realises it exactly, as the device loader's),
and one keep mask, `box_candidates` on hyp's thresholds, drops an object from every field at once. An object
whose polygon vanishes is dropped; one without a polygon (P = 0) keeps the box rule (`paste.move_boxes`); an
oriented box's axis-aligned box is the bounds of its corner quad clipped as a polygon. The judged-before box of
a shaped object is the bounds of its polygon clipped to the shown part and mapped without the output clip: how
much of what the canvas held is left, as for boxes.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from .boxes import box_candidates
from .hyp import AugmentHyp
from .labels import Labels
from .paste import move_boxes

# (axis, which rect column, +1: keep coordinate >= bound, -1: keep <= bound) for the 4 edges of x1,y1,x2,y2
_EDGES = ((0, 0, 1.0), (1, 1, 1.0), (0, 2, -1.0), (1, 3, -1.0))


def clip_polygons(points: np.ndarray, counts: np.ndarray, rects: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Clip polygons to axis-aligned rectangles (Sutherland-Hodgman, all polygons in one vectorised pass).

    `points` [T,2] are the polygons' vertices one after the other, `counts` [n] how many each has, `rects`
    x1,y1,x2,y2 ([4] for all, or [n,4]: one per polygon). Returns (points float64 [T',2], counts [n]); a
    polygon wholly outside its rectangle gets 0 points. Points on a rectangle's edge count as inside."""
    pts = np.asarray(points, np.float64).reshape(-1, 2)
    cnt = np.asarray(counts, np.int64).reshape(-1)
    r = np.broadcast_to(np.asarray(rects, np.float64), (len(cnt), 4))
    for axis, col, sign in _EDGES:
        if not len(pts):
            break
        owner = np.repeat(np.arange(len(cnt)), cnt)
        starts = np.cumsum(cnt) - cnt
        prev = np.arange(len(pts)) - 1
        live = cnt > 0
        prev[starts[live]] = starts[live] + cnt[live] - 1        # each polygon's first vertex follows its last
        bound = r[owner, col]
        d = (pts[:, axis] - bound) * sign                         # >= 0: inside this edge
        inside = d >= 0
        cross = inside != inside[prev]
        emit = cross.astype(np.int64) + inside                    # per vertex: [the crossing], [the vertex]
        pos = np.cumsum(emit) - emit
        out = np.empty((int(emit.sum()), 2))
        if cross.any():
            a, b = pts[prev[cross]], pts[cross]
            t = d[prev[cross]] / (d[prev[cross]] - d[cross])
            hit = a + t[:, None] * (b - a)
            hit[:, axis] = bound[cross]                           # exactly on the edge
            out[pos[cross]] = hit
        out[pos[inside] + cross[inside]] = pts[inside]
        cnt = np.bincount(owner, weights=emit, minlength=len(cnt)).astype(np.int64)
        pts = out
    return pts, cnt


def polygon_bounds(points: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """x1,y1,x2,y2 [n,4] float32 of each polygon (the rows of polygons with no point are 0)."""
    cnt = np.asarray(counts, np.int64)
    out = np.zeros((len(cnt), 4), np.float32)
    nz = cnt > 0
    if nz.any():
        starts = (np.cumsum(cnt) - cnt)[nz]
        for k, ufunc in enumerate((np.minimum, np.minimum, np.maximum, np.maximum)):
            out[nz, k] = ufunc.reduceat(points[:, k % 2], starts)
    return out


def _map(points: np.ndarray, m: np.ndarray) -> np.ndarray:
    """points [T,2] each by its own 3x3 (or 2x3) matrix m [T,...] (a perspective one: divided by its last row)."""
    x, y = points[:, 0], points[:, 1]
    out = np.stack([m[:, 0, 0] * x + m[:, 0, 1] * y + m[:, 0, 2], m[:, 1, 0] * x + m[:, 1, 1] * y + m[:, 1, 2]], 1)
    if m.shape[1] == 3:
        out /= (m[:, 2, 0] * x + m[:, 2, 1] * y + m[:, 2, 2])[:, None]
    return out


def paste_labels(labels: Sequence[Labels], realised: Sequence[np.ndarray], crops, size: int, hyp: AugmentHyp,
                 regions=None, *, flip_lr: bool = False, flip_idx=None) -> Labels:
    """The objects of pasted tiles (one `Labels` per tile, in tile pixels) in the size x size output, filtered
    (see the module docstring). `realised` [3x3] per tile maps tile pixels to the output, `crops` (tile pixels)
    is what of each tile was drawn, `regions` what the mosaic canvas holds of it (`paste.region_crop`; default:
    the crops), as `paste.paste_boxes` takes them. `flip_lr`: whether the maps mirror left and right (the plan's
    affine), which renames keypoints by `flip_idx` (required then, for labels with keypoints)."""
    counts = [len(x) for x in labels]
    every = Labels.concat(labels)
    n = len(every)
    if every.keypoints is not None and flip_lr and flip_idx is None and every.keypoints.shape[1] > 1:
        raise ValueError("a left-right flip of keypoints needs flip_idx (which keypoint each becomes when "
                         "mirrored): give the dataset's flip_idx, or set fliplr to 0")
    if n == 0:
        return every
    m = np.repeat(np.stack([np.asarray(x, np.float64) for x in realised]), counts, axis=0)
    crop = np.repeat(np.asarray(crops, np.float64).reshape(-1, 4), counts, axis=0)
    region = crop if regions is None else np.repeat(np.asarray(regions, np.float64).reshape(-1, 4), counts, axis=0)
    before, after = move_boxes(every.boxes, m, crop.astype(np.float32), region.astype(np.float32), size)
    shown = np.concatenate([np.maximum(crop[:, :2], region[:, :2]), np.minimum(crop[:, 2:], region[:, 2:])], 1)
    keep = np.ones(n, bool)
    polygons, corners, keypoints = None, None, None
    shapes = every.polygons if every.polygons is not None else every.corners
    if shapes is not None:
        npts = np.array([len(p) for p in shapes], np.int64)
        flat = np.concatenate(list(shapes)).reshape(-1, 2) if npts.sum() else np.zeros((0, 2))
        pts, c = clip_polygons(flat, npts, shown)
        pts = _map(pts, np.repeat(m, c, axis=0))
        judged = polygon_bounds(pts, c)
        pts, c = clip_polygons(pts, c, (0.0, 0.0, float(size), float(size)))
        has = npts > 0
        before[has], after[has] = judged[has], polygon_bounds(pts, c)[has]
        keep &= ~has | (c > 0)
        if every.polygons is not None:
            polygons = np.split(pts.astype(np.float32), np.cumsum(c)[:-1])
        else:
            corners = _map(every.corners.reshape(-1, 2).astype(np.float64), np.repeat(m, 4, axis=0))
            corners = corners.reshape(-1, 4, 2).astype(np.float32)
    if every.keypoints is not None:
        keypoints = _move_keypoints(every.keypoints, m, shown, size, flip_lr, flip_idx)
    area = np.full(n, hyp.min_box_area_ratio)
    if every.polygons is not None:   # segmented objects: Ultralytics' threshold for them (AugmentHyp)
        area[has] = hyp.min_segment_area_ratio
    keep &= box_candidates(before, after, min_side=hyp.min_box_side, min_area_ratio=area,
                           max_aspect=hyp.max_box_aspect)
    return Labels(after, every.classes, polygons, keypoints, corners).take(keep)


def _move_keypoints(kp: np.ndarray, m: np.ndarray, shown: np.ndarray, size: int, flip_lr: bool, flip_idx):
    n, k, d = kp.shape
    xy = kp[..., :2].reshape(-1, 2).astype(np.float64)
    rect = np.repeat(shown, k, axis=0)
    seen = (xy >= rect[:, :2]).all(1) & (xy <= rect[:, 2:]).all(1)
    moved = _map(xy, np.repeat(m, k, axis=0))
    seen &= (moved >= 0).all(1) & (moved <= size).all(1)
    out = kp.astype(np.float32, copy=True)
    out[..., :2] = moved.reshape(n, k, 2)
    out[~seen.reshape(n, k)] = 0.0
    if flip_lr and flip_idx is not None:
        out = out[:, np.asarray(flip_idx, np.int64)]
    return out


def corners_to_rboxes(corners: np.ndarray) -> np.ndarray:
    """Oriented boxes [M,5] float32 cx, cy, w, h (pixels), angle in radians in [0, pi/2), from corner quads
    [M,4,2]: the minimum-area rectangle of each quad (cv2.minAreaRect), its angle brought into [0, pi/2) by
    swapping w and h where OpenCV says 90 degrees (the same rectangle): the layout of Ultralytics' rotated
    boxes (`xywhr`)."""
    c = np.asarray(corners, np.float32).reshape(-1, 4, 2)
    out = np.zeros((len(c), 5), np.float32)
    for i, quad in enumerate(c):
        (cx, cy), (w, h), angle = cv2.minAreaRect(quad)
        angle = angle % 180.0
        if angle >= 90.0:
            angle, w, h = angle - 90.0, h, w
        out[i] = cx, cy, w, h, np.deg2rad(angle)
    turn = out[:, 4] >= np.float32(np.pi / 2)       # 89.99999 degrees rounded up in float32: the same box at 0
    out[turn, 2], out[turn, 3], out[turn, 4] = out[turn, 3], out[turn, 2].copy(), 0.0
    return out


def batch_rows(labels: Labels, size: int) -> np.ndarray | None:
    """The per-object rows a `Batch` carries besides its targets for labels in pixels of a size x size output,
    in the labels' order: pose keypoints [N,K,D] with x, y normalised 0..1 (a keypoint whose visibility is 0,
    unlabelled or hidden by the augmentation, is 0, 0, 0); obb rotated boxes [N,5] cx, cy, w, h normalised and
    the angle in radians (`corners_to_rboxes`); None for detect and segment (masks are drawn instead).
    Every loader that fills a Batch calls this."""
    if labels.keypoints is not None:
        kp = np.array(labels.keypoints, np.float32, copy=True)
        kp[..., :2] /= size
        if kp.shape[-1] == 3:
            kp[kp[..., 2] == 0] = 0
        return kp
    if labels.corners is not None:
        rb = corners_to_rboxes(labels.corners)
        rb[:, :4] /= size
        return rb
    return None
