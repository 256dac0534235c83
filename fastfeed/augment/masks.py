"""Instance masks from polygons, at the trainer's reduced resolution (Ultralytics' `mask_ratio`, `overlap_mask`);
the two rules and why both: docs/design.md, 'Masks are scan-converted at the reduced resolution'.

Polygons are x, y in continuous pixels of the size x size output (`boxes.py`'s convention). `centre` (the default):
a mask pixel (side size // ratio) belongs to an object when its centre lies inside the polygon (even-odd rule, the
rule `paste.pixel_span` gives a drawn edge), scan-converted in numpy, all of an image's polygons at once.
`ultralytics`: each polygon resampled to 1,000 points along its vertices, truncated to whole pixels, filled at full
size by `cv2.fillPoly` and shrunk by bilinear `cv2.resize` (benchmarks/mask_rule.py), each object only over its
bounding box cut on the ratio grid, which gives the full-size fill's result at the cost of the object's area.
"""

from __future__ import annotations

import cv2
import numpy as np

MASK_RULES = ("centre", "ultralytics")
RESAMPLED = 1000   # points per polygon under the `ultralytics` rule (its datasets' segment resampling)


def mask_side(size: int, ratio: int) -> int:
    """The side of the masks for a size x size output with `ratio` (size must be a multiple of it)."""
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1 or size % ratio:
        raise ValueError(f"mask ratio must be an integer >= 1 dividing the image size {size}, got {ratio!r}")
    return size // ratio


def _spans(polygons, objs: list[int], ratio: int, side: int):
    """(object, row, first column, end column) of every run of mask pixels whose centres are inside the polygon of
    one of `objs`, grouped by object in object order, and each object's polygon area (mask pixels; 0 without one)."""
    area = np.zeros(len(polygons))
    counts = np.array([len(polygons[j]) for j in objs])
    a = np.concatenate([polygons[j] for j in objs]).astype(np.float64).reshape(-1, 2) / ratio
    nxt = np.arange(1, len(a) + 1)
    nxt[np.cumsum(counts) - 1] = np.cumsum(counts) - counts    # each vertex's next, the last closing its polygon
    b = a[nxt]                                                 # the edges a -> b
    obj = np.repeat(np.asarray(objs, np.int64), counts)
    cross = a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]
    area[objs] = 0.5 * np.abs(np.add.reduceat(cross, np.cumsum(counts) - counts))
    y0, y1 = a[:, 1], b[:, 1]
    # rows whose centre line y = i + 0.5 crosses the edge, half-open in y so a vertex counts once
    lo = np.clip(np.ceil(np.minimum(y0, y1) - 0.5), 0, side).astype(np.int64)
    hi = np.clip(np.ceil(np.maximum(y0, y1) - 0.5), 0, side).astype(np.int64)
    n = np.where(y0 != y1, hi - lo, 0)
    e = np.repeat(np.arange(len(a)), n)
    row = _flat(lo, n)
    t = (row + 0.5 - y0[e]) / (y1[e] - y0[e])
    x = a[e, 0] + t * (b[e, 0] - a[e, 0])
    order = np.lexsort((x, row, obj[e]))           # each (object, row) holds an even count: pair them up
    x, row, o = x[order], row[order], obj[e][order]
    j0 = np.clip(np.ceil(x[0::2] - 0.5), 0, side).astype(np.int64)
    j1 = np.clip(np.ceil(x[1::2] - 0.5), 0, side).astype(np.int64)
    keep = j1 > j0
    return (o[0::2][keep], row[0::2][keep], j0[keep], j1[keep]), area


def _flat(base: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """base[k] + 0 .. lengths[k]-1 for every k, concatenated."""
    starts = np.cumsum(lengths) - lengths
    return np.repeat(base, lengths) + (np.arange(int(lengths.sum())) - np.repeat(starts, lengths))


def _resampled(rings: list) -> list:
    """Each closed ring as `RESAMPLED` points, whole pixels: its vertices (the first repeated at the end) and,
    between them, points evenly spaced along the vertex sequence (by vertex index, not arc length), computed in
    float32 and truncated, then runs of one repeated pixel kept once (the same filled shape, fewer edges). Dense
    points matter: truncating each before the fill takes ~3% more area than truncating the vertices alone. All
    rings at once; a ring of RESAMPLED vertices or more is resampled without its vertices (exactly RESAMPLED: kept)."""
    n = RESAMPLED
    closed = [np.concatenate([r, r[:1]]).astype(np.float64) for r in rings]
    counts = np.array([len(c) for c in closed], np.int64)
    small = counts < n
    # a ring of c < n points: n - c positions u_i = i * (c-1)/(n-c-1) (numpy's linspace, the last exactly c - 1),
    # merged with the vertex positions 0 .. c-1 in order (a vertex before an equal u_i); the slots the u_i take
    # are i + floor(u_i) + 1 within the ring's n, the vertices fill the others in order
    m = np.where(small, n - counts, n)
    ring_u = np.repeat(np.arange(len(rings)), m)
    i = np.arange(len(ring_u)) - np.repeat(np.cumsum(m) - m, m)
    step = (counts - 1) / np.maximum(m - 1, 1)
    u = i * step[ring_u]
    ends = np.cumsum(m) - 1
    u[ends[m > 1]] = (counts - 1)[m > 1]
    exact = counts == n + 1                               # a ring of exactly n points stays as it is
    u[exact[ring_u]] = i[exact[ring_u]]
    at = np.empty(n * len(rings))
    slot = ring_u * n + np.where(small[ring_u], i + np.floor(u).astype(np.int64) + 1, i)
    at[slot] = u
    free = np.ones(len(at), bool)
    free[slot] = False
    vertex_slots = np.flatnonzero(free)                   # only small rings have free slots: c each, in ring order
    at[vertex_slots] = np.concatenate([np.arange(c, dtype=np.float64) for c in counts[small]]) if small.any() else []
    ring = np.repeat(np.arange(len(rings)), n)
    flat = np.concatenate(closed)
    start = np.cumsum(counts) - counts
    seg = np.minimum(np.floor(at).astype(np.int64), counts[ring] - 2)
    frac = (at - seg)[:, None]
    base = flat[start[ring] + seg]
    pts = (flat[start[ring] + seg + 1] - base) * frac + base
    last = at == counts[ring] - 1
    pts[last] = flat[start[ring[last]] + counts[ring[last]] - 1]
    pts = pts.astype(np.float32).astype(np.int32)
    keep = np.ones(len(pts), bool)
    keep[1:] = (pts[1:] != pts[:-1]).any(1) | (ring[1:] != ring[:-1])
    pts, ring = pts[keep], ring[keep]
    return np.split(pts, np.searchsorted(ring, np.arange(1, len(rings))))


def _filled(polygons, objs: list[int], size: int, ratio: int):
    """The `ultralytics` rule: (object, reduced row, reduced column) of every mask pixel of `objs` (the objects
    with a polygon), and each object's area in mask pixels (see the module docstring)."""
    area = np.zeros(len(polygons))
    parts = []
    for j, pts in zip(objs, _resampled([np.asarray(polygons[j], np.float64).reshape(-1, 2) for j in objs])):
        (x0, y0), (x1, y1) = pts.min(0).tolist(), pts.max(0).tolist()
        x0, y0 = min(max(x0 // ratio * ratio, 0), size), min(max(y0 // ratio * ratio, 0), size)
        x1, y1 = min(max((x1 // ratio + 1) * ratio, 0), size), min(max((y1 // ratio + 1) * ratio, 0), size)
        if x1 <= x0 or y1 <= y0:
            continue
        crop = np.zeros((y1 - y0, x1 - x0), np.uint8)
        cv2.fillPoly(crop, [pts - np.int32([x0, y0])], 1)
        small = cv2.resize(crop, ((x1 - x0) // ratio, (y1 - y0) // ratio)) if ratio > 1 else crop
        rows, cols = np.nonzero(small)
        area[j] = len(rows)
        parts.append((np.full(len(rows), j, np.int64), rows + y0 // ratio, cols + x0 // ratio))
    return (tuple(np.concatenate(c) for c in zip(*parts)) if parts else (np.zeros(0, np.int64),) * 3), area


def rasterise(polygons, size: int, ratio: int, overlap: bool, out: np.ndarray | None = None,
              rule: str = "centre") -> np.ndarray:
    """The masks of `polygons` (one float [P,2] per object in output pixels; fewer than 3 points: no mask), drawn by
    `rule` (`MASK_RULES`; see the module docstring).

    overlap: int16 [h, w] (h = w = size // ratio), 0 for background and j+1 where object j is; objects are
    drawn largest area first, so where two overlap the smaller one lies on top (as Ultralytics). Not overlap:
    uint8 [M, h, w] of 0/1, one per object. `out`: the array to write into (that shape and dtype), zeroed here.
    """
    side = mask_side(size, ratio)
    m = len(polygons)
    shape, dtype = ((side, side), np.int16) if overlap else ((m, side, side), np.uint8)
    if out is None:
        out = np.zeros(shape, dtype)
    else:
        if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a contiguous {np.dtype(dtype).name} {list(shape)}, "
                             f"got {out.dtype} {list(out.shape)}")
        out.fill(0)
    if overlap and m > np.iinfo(np.int16).max:
        raise ValueError(f"{m} objects in one image do not fit an int16 overlap mask (at most 32767)")
    if rule not in MASK_RULES:
        raise ValueError(f"mask rule must be one of {', '.join(MASK_RULES)}, got {rule!r}")
    objs = [j for j, p in enumerate(polygons) if len(p) >= 3]   # fewer than 3 points: no mask
    if not objs:
        return out
    if rule == "ultralytics":
        (obj, row, col), area = _filled(polygons, objs, size, ratio)
        pix = row * side + col
    else:
        (obj, row, j0, j1), area = _spans(polygons, objs, ratio, side)
        pix, obj = _flat(row * side + j0, j1 - j0), np.repeat(obj, j1 - j0)
    dst = out.reshape(-1)   # pixels come grouped by object, in object order (both rules)
    if not overlap:
        dst[obj * (side * side) + pix] = 1
        return out
    starts = np.searchsorted(obj, np.arange(m + 1))
    for j in np.argsort(-area, kind="stable").tolist():     # largest first: the smaller on top; ties keep object order
        dst[pix[starts[j]:starts[j + 1]]] = j + 1
    return out
