"""Draw one rectangle of a source image into an output through an affine (or perspective) map, and nothing else:
the engine under `render.render_labels`, every output pixel produced once (docs/design.md, 'Mosaic without a
canvas'). Two paths:

* axis-aligned maps (no rotation/shear, the YOLO default): `cv2.resize` into the exact output
  rectangle, then an in-place `cv2.flip` of that rectangle for a mirrored map. resize is 3-5x
  cheaper than warpAffine and reads only real tile pixels, so seams are clean. The source crop is
  snapped to whole pixels, which perturbs the drawn scale by under a pixel; the returned matrix is
  the realised one, so boxes still match pixels exactly.
* rotated/sheared/projective maps: `cv2.warpAffine` (`cv2.warpPerspective` under perspective) of the part of the
  crop the output samples, its edge replicated, into a scratch the size of the mapped quad's bounding rectangle
  within the output, with a constant border (2-3x cheaper than BORDER_TRANSPARENT, OpenCV's per-pixel path for 3
  channels); then only the quad, widened by half a pixel, is copied into the output (`cv2.fillConvexPoly` mask).
  Every pixel whose centre lies in the region shows the tile, never the border; at a seam the tile drawn later
  covers under a pixel of its neighbour, much like bilinear sampling across a canvas seam.

Downscaling by more than 2x aliases with bilinear sampling (the resize path switches to INTER_AREA,
the warp path cannot): callers should decode within 2x of the drawn size, e.g. by JPEG DCT scaling.
"""

from __future__ import annotations

import math
import threading

import cv2
import numpy as np

from .boxes import box_candidates, clip_boxes, clip_boxes_to, transform_boxes
from .hyp import AugmentHyp

# Placement of a tile into the intermediate ("mid", e.g. mosaic canvas) frame: u_mid = r*u + (ox, oy).
Place = tuple[float, float, float]
Rect = tuple[float, float, float, float]   # x1, y1, x2, y2
EDGE = 8       # source pixels around a warped tile's crop (see paste_tile)
SUBPIXEL = 8   # fractional bits of the quad's corners when it is filled


def place_matrix(place: Place) -> np.ndarray:
    """The 3x3 map of a tile's pixels into the mid frame: scale r, then offset (ox, oy)."""
    r, ox, oy = place
    return np.array([[r, 0.0, ox], [0.0, r, oy], [0.0, 0.0, 1.0]])


def pixel_span(a: float, b: float, size: int) -> tuple[int, int]:
    """Output pixels whose centres fall in [min(a,b), max(a,b)), clipped to [0, size): the one rule for which
    pixels a drawn edge covers (the resize and warp paths here, DALI's resize + paste)."""
    lo, hi = (a, b) if a <= b else (b, a)
    return min(max(math.ceil(lo - 0.5), 0), size), min(max(math.ceil(hi - 0.5), 0), size)


def paste_tile(out: np.ndarray, img: np.ndarray, place: Place, region: Rect,
               matrix: np.ndarray) -> tuple[np.ndarray, Rect]:
    """Draw the part of `img` that `place` puts inside `region` (mid frame) into `out` via `matrix`.

    `matrix` (3x3) maps the mid frame to `out`, flips included. Returns the realised 3x3 map from
    img coordinates to out coordinates and the crop of `img` actually shown (img coordinates), which
    is what the tile's boxes must be clipped to and then mapped by.
    """
    h, w = img.shape[:2]
    full = matrix @ place_matrix(place)
    x1, y1, x2, y2 = region
    projective = matrix[2, 0] != 0 or matrix[2, 1] != 0
    if matrix[0, 1] == 0 and matrix[1, 0] == 0 and not projective:
        return _paste_resize(out, img, full, (matrix[0, 0] * x1 + matrix[0, 2], matrix[0, 0] * x2 + matrix[0, 2]),
                             (matrix[1, 1] * y1 + matrix[1, 2], matrix[1, 1] * y2 + matrix[1, 2]))
    crop = region_crop(place, region, (h, w))
    if crop[2] <= crop[0] or crop[3] <= crop[1]:
        return full, (0.0, 0.0, 0.0, 0.0)
    f = full.tolist()   # plain floats: a tile's few corners cost less than numpy's per-call overhead
    corners = [_apply(f, crop[i], crop[k]) for i, k in ((0, 1), (2, 1), (2, 3), (0, 3))]   # the drawn part
    j0, j1 = pixel_span(min(c[0] for c in corners), max(c[0] for c in corners), out.shape[1])
    i0, i1 = pixel_span(min(c[1] for c in corners), max(c[1] for c in corners), out.shape[0])
    if j1 <= j0 or i1 <= i0:
        return full, (0.0, 0.0, 0.0, 0.0)
    # The crop widened by EDGE source pixels (the tile's own where it has them, its edge replicated beyond), so
    # every pixel the quad's fill takes samples the tile, never the warp's border; of those, only the ones the output
    # rectangle samples (a mosaic shows about half of each tile's crop, and the padding copies what it keeps).
    fx, fy, lx, ly = _sampled(f, (j0, i0, j1, i1), (math.floor(crop[0]) - EDGE, math.floor(crop[1]) - EDGE,
                                                    math.ceil(crop[2]) + EDGE, math.ceil(crop[3]) + EDGE), w, h)
    vx0, vy0, vx1, vy1 = max(fx, 0), max(fy, 0), min(lx, w), min(ly, h)
    src = img[vy0:vy1, vx0:vx1]
    pads = (vy0 - fy, ly - vy1, vx0 - fx, lx - vx1)   # top, bottom, left, right
    if any(pads):
        src = cv2.copyMakeBorder(src, *pads, cv2.BORDER_REPLICATE)
    # src pixel index -> src continuous (+0.5, the window's origin) -> out continuous -> roi pixel index (-0.5): `full`
    # between two shifts, in plain floats
    rows = [[u + t * v for u, v in zip(f[k], f[2])] for k, t in ((0, -j0 - 0.5), (1, -i0 - 0.5))] + [f[2]]
    m = np.array([[p, q, p * (fx + 0.5) + q * (fy + 0.5) + r] for p, q, r in rows])
    drawn, inside = _scratch(i1 - i0, j1 - j0, out.shape[2])
    warp = (cv2.warpPerspective, m) if projective else (cv2.warpAffine, m[:2])
    warp[0](src, warp[1], (j1 - j0, i1 - i0), dst=drawn, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    inside.fill(0)
    quad = [(round((x - j0 - 0.5) * (1 << SUBPIXEL)), round((y - i0 - 0.5) * (1 << SUBPIXEL)))
            for x, y in widened(corners, 0.5)]
    cv2.fillConvexPoly(inside, np.array(quad, np.int32), 1, cv2.LINE_8, SUBPIXEL)
    cv2.copyTo(drawn, inside, out[i0:i1, j0:j1])
    return full, crop


_LOCAL = threading.local()


def _scratch(h: int, w: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's (h, w, c) uint8 and (h, w) uint8 scratch, views of buffers kept between calls (fresh pages
    for every tile cost more than the copy they hold)."""
    img, mask = getattr(_LOCAL, "bufs", (np.empty((0, 0, c), np.uint8), np.empty((0, 0), np.uint8)))
    if img.shape[0] < h or img.shape[1] < w or img.shape[2] != c:
        hw = max(h, img.shape[0]), max(w, img.shape[1])
        _LOCAL.bufs = img, mask = np.empty((*hw, c), np.uint8), np.empty(hw, np.uint8)
    return img[:h, :w], mask[:h, :w]


def _apply(f, x: float, y: float) -> tuple[float, float]:
    """Point (x, y) mapped by the 3x3 map f (nested lists)."""
    d = f[2][0] * x + f[2][1] * y + f[2][2]
    return (f[0][0] * x + f[0][1] * y + f[0][2]) / d, (f[1][0] * x + f[1][1] * y + f[1][2]) / d


def _sampled(f, rect, box, w: int, h: int) -> tuple[int, int, int, int]:
    """The part of `box` (x0, y0, x1, y1: source pixel indices, ends excluded) that out rectangle `rect` (j0, i0,
    j1, i1) samples through the 3x3 map f (source -> out, nested lists) with bilinear taps, where that keeps some of
    the w x h source; else all of `box`."""
    (a, b, c), (d, e, g), (p, q, r) = f   # its inverse: the adjugate over the determinant
    det = a * (e * r - g * q) - b * (d * r - g * p) + c * (d * q - e * p)
    inv = [[v / det for v in row] for row in ((e * r - g * q, c * q - b * r, b * g - c * e),
                                              (g * p - d * r, a * r - c * p, c * d - a * g),
                                              (d * q - e * p, b * p - a * q, a * e - b * d))]
    corners = ((rect[0], rect[1]), (rect[2], rect[1]), (rect[2], rect[3]), (rect[0], rect[3]))
    if min(inv[2][0] * x + inv[2][1] * y + inv[2][2] for x, y in corners) <= 0:
        return box   # part of the rectangle maps from beyond the horizon
    xs, ys = zip(*(_apply(inv, x, y) for x, y in corners))
    g = (max(box[0], math.floor(min(xs)) - 2), max(box[1], math.floor(min(ys)) - 2),
         min(box[2], math.ceil(max(xs)) + 2), min(box[3], math.ceil(max(ys)) + 2))
    return g if max(g[0], 0) < min(g[2], w) and max(g[1], 0) < min(g[3], h) else box


def widened(quad: list, d: float) -> list[tuple[float, float]]:
    """A convex quadrilateral (4 (x, y) corners in turn) with every edge moved out by d (each corner where its moved
    edges meet)."""
    e = [(x1 - x0, y1 - y0) for (x0, y0), (x1, y1) in zip(quad, quad[1:] + quad[:1])]
    n = [(ey / k, -ex / k) for ex, ey in e for k in (max(math.hypot(ex, ey), 1e-12),)]
    if sum(a[0] * b[1] - a[1] * b[0] for a, b in zip(e, e[1:] + e[:1])) < 0:
        n = [(-x, -y) for x, y in n]   # outward whichever way the polygon turns
    out = []
    for (x, y), (px, py), (nx, ny) in zip(quad, n[-1:] + n[:-1], n):   # corner k joins edge k-1 and edge k
        k = max(1.0 + px * nx + py * ny, 1e-3)
        out.append((x + d * (px + nx) / k, y + d * (py + ny) / k))
    return out


def _axis(a: float, b: float, p0: float, p1: float, n_out: int, n_src: int):
    """Snap one axis: output span [o0, o1), whole-pixel source span [s0, s1), realised a', b'."""
    o0, o1 = pixel_span(p0, p1, n_out)
    if o1 <= o0:
        return None
    u0, u1 = (o0 - b) / a, (o1 - b) / a
    if u0 > u1:
        u0, u1 = u1, u0
    s0 = min(max(int(round(u0)), 0), n_src - 1)
    s1 = max(min(int(round(u1)), n_src), s0 + 1)
    scale = (o1 - o0) / (s1 - s0)
    # realised map u -> scale*u + shift, mirrored when the drawn map was.
    shift = o0 - scale * s0 if a > 0 else o1 + scale * s0
    return o0, o1, s0, s1, (scale if a > 0 else -scale), shift


def _paste_resize(out, img, full, xs, ys):
    h, w = img.shape[:2]
    ax = _axis(full[0, 0], full[0, 2], xs[0], xs[1], out.shape[1], w)
    ay = _axis(full[1, 1], full[1, 2], ys[0], ys[1], out.shape[0], h)
    if ax is None or ay is None:
        return full, (0.0, 0.0, 0.0, 0.0)
    j0, j1, sx0, sx1, kx, bx = ax
    i0, i1, sy0, sy1, ky, by = ay
    dst = out[i0:i1, j0:j1]
    shrink = abs(kx) < 0.5 and abs(ky) < 0.5
    cv2.resize(img[sy0:sy1, sx0:sx1], (j1 - j0, i1 - i0), dst=dst,
               interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    if kx < 0 or ky < 0:
        cv2.flip(dst, -1 if (kx < 0 and ky < 0) else (1 if kx < 0 else 0), dst=dst)
    realised = np.array([[kx, 0.0, bx], [0.0, ky, by], [0.0, 0.0, 1.0]])
    return realised, (float(sx0), float(sy0), float(sx1), float(sy1))


def region_crop(place, region, hw):
    """The part of a tile (h, w pixels) that `place` puts inside `region` of the mid frame, in tile pixels:
    for a mosaic tile, what the 2S canvas holds of it. Scalars give a tuple; arrays (place [..., 3], region
    [..., 4], hw [..., 2]: one row per tile) give an array [..., 4] (the device planner's batched form)."""
    if np.ndim(place) > 1 or np.ndim(hw) > 1:
        p, g, s = (np.asarray(a, np.float64) for a in (place, region, hw))
        r, ox, oy = p[..., 0], p[..., 1], p[..., 2]
        return np.stack([np.maximum((g[..., 0] - ox) / r, 0.0), np.maximum((g[..., 1] - oy) / r, 0.0),
                         np.minimum((g[..., 2] - ox) / r, s[..., 1]), np.minimum((g[..., 3] - oy) / r, s[..., 0])], -1)
    r, ox, oy = place
    h, w = hw
    return (max((region[0] - ox) / r, 0.0), max((region[1] - oy) / r, 0.0),
            min((region[2] - ox) / r, float(w)), min((region[3] - oy) / r, float(h)))


def paste_boxes(boxes: list[np.ndarray], classes: list[np.ndarray], realised: list[np.ndarray],
                crops: list[Rect], size: int, hyp: AugmentHyp, regions: list[Rect] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Boxes of pasted tiles in the size x size output, filtered; classes follow.

    Each tile's boxes are clipped to the crop that was drawn (`crops`, from `paste_tile`), mapped by the
    tile's realised matrix and clipped to the output: those are the boxes, on exactly the drawn pixels.
    `box_candidates` judges them against the box clipped to the tile's `regions` (`region_crop`: for a
    mosaic tile, what the 2S canvas holds of it; default: the drawn crop) and mapped without the output
    clip; under rotation or shear, against the whole box (why: docs/design.md, 'The box filter judges what
    the canvas held'). All tiles go through one vectorised pass (per-box crops and matrices).
    """
    counts = [len(b) for b in boxes]
    cls = np.concatenate(classes)
    if not any(counts):
        return np.zeros((0, 4), np.float32), cls
    per_box_m = np.repeat(np.stack(realised), counts, axis=0)
    per_box_crop = np.repeat(np.asarray(crops, np.float32), counts, axis=0)
    per_box_region = np.repeat(np.asarray(regions if regions is not None else crops, np.float32), counts, axis=0)
    before, after = move_boxes(np.concatenate(boxes), per_box_m, per_box_crop, per_box_region, size)
    keep = box_candidates(before, after, min_side=hyp.min_box_side,
                          min_area_ratio=hyp.min_box_area_ratio, max_aspect=hyp.max_box_aspect)
    return after[keep], cls[keep]


def move_boxes(b: np.ndarray, per_box_m: np.ndarray, per_box_crop: np.ndarray, per_box_region: np.ndarray,
               size: int) -> tuple[np.ndarray, np.ndarray]:
    """(before, after) of `paste_boxes`' rule for boxes [N,4] with one matrix [N,3,3], crop and region [N,4]
    each: what `box_candidates` judges (also `points.paste_labels`' rule for objects without a polygon)."""
    turned = (per_box_m[:, 0, 1] != 0) | (per_box_m[:, 1, 0] != 0) | (per_box_m[:, 2, :2] != 0).any(1)
    judged = np.where(turned[:, None], b, clip_boxes_to(b, per_box_region))
    n = len(b)
    both = transform_boxes(np.concatenate([judged, clip_boxes_to(b, per_box_crop)]), np.concatenate([per_box_m] * 2))
    return both[:n], clip_boxes(both[n:], size, size)
