"""Per-sample geometry for the DALI graph: fastfeed plans, DALI draws the pixels.

This module turns a sample's `augment.DaliSample` (the cpu loader's plan for the same seed) into per-sample
arguments for DALI and moves the boxes in numpy before DALI sees them: the same numbers move boxes and pixels,
through the composition `augment.render_labels` uses (docs/design.md, "Mosaic without a canvas"). Rotation and
shear warp the S x S result; the cpu loader warps the tiles themselves, so here the corners that a rotation
brings in from outside the S x S frame are grey fill.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...augment import (
    AugmentHyp,
    Geometry,
    box_candidates,
    clip_boxes,
    letterbox_boxes,
    letterbox_geometry,
    sample_layout,
    transform_boxes,
)
from ...augment.paste import paste_boxes, pixel_span, region_crop

# geom row of one tile: roi y0, x0, y1, x1 (source pixels), resized h, w. A slot that shows nothing
# resizes one source pixel to one pixel and pastes an empty region.
UNUSED = (0.0, 0.0, 1.0, 1.0, 1.0, 1.0)


@dataclass
class DaliSample:
    geom: np.ndarray      # float32 [K,6] per tile: roi_start(y,x), roi_end(y,x), size(h,w)
    paste: np.ndarray     # int32 [2,K+1,2]: region shapes (h,w) and out anchors (y,x); entry 0 is the fill
    boxes: np.ndarray     # float32 [M,4] x1,y1,x2,y2 normalised to the output, before the flips
    classes: np.ndarray   # int32 [M]
    flip: np.ndarray      # int32 [2]: horizontal, vertical
    hsv: np.ndarray       # float32 [3]: hue shift (degrees), saturation and value factors
    warp: np.ndarray      # float32 [2,3]: forward map for fn.warp_affine (identity when unused)


def _axis(m: float, b: float, r: float, o: float, lo: float, hi: float, n_src: int, size: int):
    """One axis of one tile. The mid frame (canvas) maps to the output by x -> m*x + b, the tile into
    the mid frame by u -> r*u + o, and [lo, hi) is the tile's region in the mid frame. Returns output
    span [o0, o1), source span [u0, u1) and the realised tile->output scale and shift, or None."""
    o0, o1 = pixel_span(m * lo + b, m * hi + b, size)
    a, c = m * r, m * o + b
    u0, u1 = max((o0 - c) / a, 0.0), min((o1 - c) / a, float(n_src))
    if o1 <= o0 or u1 - u0 <= 1e-6:
        return None
    k = (o1 - o0) / (u1 - u0)
    return o0, o1, u0, u1, k, o0 - k * u0


def tile_op(zoom: float, shift: tuple[float, float], place, region, hw: tuple[int, int], size: int):
    """Resize + paste of one tile under the axis-aligned map x -> zoom*x + shift (mid frame -> output).
    Returns (geom row, (shape, anchor), realised 3x3 tile->output, crop shown in tile pixels)."""
    r, ox, oy = place
    ax = _axis(zoom, shift[0], r, ox, region[0], region[2], hw[1], size)
    ay = _axis(zoom, shift[1], r, oy, region[1], region[3], hw[0], size)
    if ax is None or ay is None:
        return UNUSED, ((0, 0), (0, 0)), np.eye(3), (0.0, 0.0, 0.0, 0.0)
    j0, j1, u0, u1, kx, bx = ax
    i0, i1, v0, v1, ky, by = ay
    realised = np.array([[kx, 0.0, bx], [0.0, ky, by], [0.0, 0.0, 1.0]])
    return (v0, u0, v1, u1, i1 - i0, j1 - j0), ((i1 - i0, j1 - j0), (i0, j0)), realised, (u0, v0, u1, v1)


def _assemble(rows, pastes, size, boxes, classes, flip=(0, 0), hsv=(0.0, 1.0, 1.0), warp=None) -> DaliSample:
    shapes = [(size, size)] + [p[0] for p in pastes]
    anchors = [(0, 0)] + [p[1] for p in pastes]
    b = np.clip(np.asarray(boxes, np.float32).reshape(-1, 4) / size, 0.0, 1.0)
    return DaliSample(np.asarray(rows, np.float32), np.array([shapes, anchors], np.int32), b,
                      np.asarray(classes, np.int32), np.asarray(flip, np.int32), np.asarray(hsv, np.float32),
                      np.asarray(warp if warp is not None else [[1, 0, 0], [0, 1, 0]], np.float32))


def plan_eval(hw: tuple[int, int], boxes: np.ndarray, classes: np.ndarray, size: int) -> DaliSample:
    """Letterbox: long side to `size`, centred on the fill; what `augment.letterbox` computes."""
    h, w = hw
    nw, nh, left, top, _, _, _ = letterbox_geometry(h, w, size)
    rows, pastes = [(0.0, 0.0, float(h), float(w), float(nh), float(nw))], [((nh, nw), (top, left))]
    return _assemble(rows, pastes, size, letterbox_boxes(boxes, (nw / w, nh / h), (left, top)), classes)


def plan_train(geometry: Geometry, tiles: list, size: int, hyp: AugmentHyp, hsv=None) -> DaliSample:
    """A plan's geometry (mosaic: 4 tiles, else 1) as DALI arguments, with its boxes moved and filtered.

    tiles: [(hw, boxes in tile pixels x1y1x2y2, classes)], own image first. hsv: the plan's jitter (None: none).
    """
    layout, c, _ = sample_layout(geometry, [t[0] for t in tiles], size, hyp)
    d = geometry.affine   # flips and any rotation are DALI ops after the paste; zoom and shift are the resize
    zoom, t = d.zoom, np.array([d.tx, d.ty])
    shift = (t[0] - zoom * c[0], t[1] - zoom * c[1])

    ops = [tile_op(zoom, shift, place, region, hw, size) for (hw, _, _), (place, region) in zip(tiles, layout)]
    rows, pastes, realised, crops = zip(*ops)   # per tile: its geom row, (shape, anchor), realised map, crop shown
    regions = [region_crop(place, region, hw) for (hw, _, _), (place, region) in zip(tiles, layout)]
    boxes, classes = paste_boxes([x[1] for x in tiles], [x[2] for x in tiles], realised, crops, size, hyp, regions)

    warp = None
    if not hyp.axis_aligned:   # rotation/shear about the shifted centre t: W(y) = L (y - t) + t
        lin = d.linear() / zoom   # the zoom is already in the tiles' resize
        warp = np.concatenate([lin, (t - lin @ t)[:, None]], axis=1)
        before = transform_boxes(boxes, warp)
        after = clip_boxes(before, size, size)
        keep = box_candidates(before, after, min_side=hyp.min_box_side, min_area_ratio=hyp.min_box_area_ratio,
                              max_aspect=hyp.max_box_aspect)
        boxes, classes = after[keep], classes[keep]

    flip = (int(d.flip_lr), int(d.flip_ud))
    jitter = (0.0, 1.0, 1.0) if hsv is None else (hsv[0] * 360.0, hsv[1], hsv[2])
    return _assemble(rows, pastes, size, boxes, classes, flip, jitter, warp)


def route_partners(plan: DaliSample, from_store: list[bool]) -> DaliSample:
    """Spread a plan's tiles (own image + 0 or 3 partners) over the mosaic graph's 7 resize+paste
    branches; the branch a partner does not take shows nothing."""
    rows, shapes, anchors = [plan.geom[0]], [plan.paste[0, 0], plan.paste[0, 1]], [plan.paste[1, 0], plan.paste[1, 1]]
    empty = np.zeros(2, np.int32)
    for s in range(3):
        real = s < len(from_store)
        for branch_reads in (False, True):
            take = real and from_store[s] == branch_reads
            rows.append(plan.geom[s + 1] if take else np.asarray(UNUSED, np.float32))
            shapes.append(plan.paste[0, s + 2] if take else empty)
            anchors.append(plan.paste[1, s + 2] if take else empty)
    plan.geom = np.stack(rows)
    plan.paste = np.array([shapes, anchors], np.int32)
    return plan


def empty_plan(k: int, size: int) -> DaliSample:
    """`k` tiles that show nothing, no boxes, no flips, no warp: a mixup branch's arguments for a sample that is
    not mixed (its weight 1 leaves the sample as it is)."""
    none = np.zeros((0, 4), np.float32)
    return _assemble([UNUSED] * k, [((0, 0), (0, 0))] * k, size, none, np.zeros(0, np.int32))


def pad_tiles(plan: DaliSample, k: int) -> DaliSample:
    """A plan with fewer than `k` tiles (a non-mosaic mixup sample in a mosaic graph) padded with tiles that
    show nothing."""
    n = len(plan.geom)
    if n < k:
        plan.geom = np.concatenate([plan.geom, np.tile(np.asarray(UNUSED, np.float32), (k - n, 1))])
        plan.paste = np.concatenate([plan.paste, np.zeros((2, k - n, 2), np.int32)], axis=1)
    return plan
