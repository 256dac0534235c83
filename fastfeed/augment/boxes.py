"""Box geometry: affine transform, clipping, the "box candidates" filter, format conversions.

Boxes are float32 [N,4] x1,y1,x2,y2 in continuous pixel coordinates: pixel (i, j) covers
[j, j+1) x [i, i+1), so a box framing a whole W x H image is (0, 0, W, H). Matrices are 3x3
(or 2x3) float64 mapping those continuous coordinates, the same convention as the pixel warps,
so a box follows its pixels exactly through any chain of scale, flip, rotation and shear.
"""

from __future__ import annotations

import numpy as np

# Corner picking: (x, y) column indices of the 4 corners of an x1,y1,x2,y2 box.
_CORNER_X = np.array([0, 2, 0, 2])
_CORNER_Y = np.array([1, 1, 3, 3])


def transform_boxes(boxes: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Map boxes by an affine (or perspective) matrix; returns the axis-aligned box enclosing each mapped rectangle.

    `matrix` is one 3x3 (or 2x3) map, or one per box ([N,3,3] / [N,2,3]) so boxes from several
    tiles go through in a single vectorised call. Under rotation or shear the enclosing box grows:
    the usual YOLO trade-off, the box still frames the object's pixels, loosely.
    """
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    m = np.asarray(matrix, np.float64)
    m = m[None] if m.ndim == 2 else m
    if len(b) == 0:
        return np.zeros((0, 4), np.float32)
    cx = b[:, _CORNER_X].astype(np.float64)
    cy = b[:, _CORNER_Y].astype(np.float64)
    x = cx * m[:, 0, 0, None] + cy * m[:, 0, 1, None] + m[:, 0, 2, None]
    y = cx * m[:, 1, 0, None] + cy * m[:, 1, 1, None] + m[:, 1, 2, None]
    if m.shape[1] == 3 and (m[:, 2, :2] != 0).any():   # perspective: divide by the projective row
        z = cx * m[:, 2, 0, None] + cy * m[:, 2, 1, None] + m[:, 2, 2, None]
        x, y = x / z, y / z
    return np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], axis=1).astype(np.float32)


def box_ioa(a, b) -> np.ndarray:
    """[N, M]: the area of box a_i inside box b_j as a share of b_j's area (Ultralytics' bbox_ioa), boxes x1,y1,x2,y2."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    w = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    h = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    return np.clip(w, 0, None) * np.clip(h, 0, None) / np.maximum((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]), 1e-9)


def clip_boxes_to(boxes: np.ndarray, rect) -> np.ndarray:
    """Clip boxes to a rectangle x1,y1,x2,y2 ([4], or [N,4]: one per box); returns a new array."""
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    r = np.asarray(rect, np.float32)
    return np.clip(b, r[..., [0, 1, 0, 1]], r[..., [2, 3, 2, 3]])


def clip_boxes(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Clip boxes to a width x height image."""
    return clip_boxes_to(boxes, (0.0, 0.0, width, height))


def box_candidates(before: np.ndarray, after: np.ndarray, *, min_side: float = 2.0,
                   min_area_ratio: float | np.ndarray = 0.1, max_aspect: float = 100.0) -> np.ndarray:
    """Keep mask for boxes that survive a transform.

    `before` is each box mapped without any clipping, `after` the same box clipped, both in output
    pixels. A box is dropped when a side is <= min_side, when less than min_area_ratio of its
    area is left (mostly cut off by a crop or the image border), or when it is thinner than
    1:max_aspect; such labels point at slivers the model cannot see. `min_area_ratio` may be one per box.
    """
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    eps = 1e-9
    aspect = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return ((w2 > min_side) & (h2 > min_side) & (w2 * h2 > min_area_ratio * (w1 * h1) + eps)
            & (aspect < max_aspect))


# --- conversions and the targets layout: one definition for numpy arrays and torch tensors alike ---------------
# (written with indexing and arithmetic only, so they serve both without importing torch here)

TARGET_COLUMNS = ("img_idx", "cls", "cx", "cy", "w", "h")   # Batch.targets: float32 [M,6], boxes normalised 0..1


def _is_tensor(x) -> bool:
    return hasattr(x, "new_empty")   # a torch.Tensor (numpy arrays have no new_empty)


def _as_boxes(boxes):
    """Boxes as [..., 4] of a floating type: a tensor or array as it is when floating point (float16/32/64 keep
    their precision), else as float32; its values are only read."""
    if _is_tensor(boxes):
        b = boxes if boxes.is_floating_point() else boxes.float()
        return b.reshape(-1, 4) if b.dim() < 2 else b
    b = np.asarray(boxes)
    b = b if np.issubdtype(b.dtype, np.floating) else b.astype(np.float32)
    return b.reshape(-1, 4) if b.ndim < 2 else b


def _empty(like, shape, dtype=None):
    """An uninitialised array/tensor of `shape` like `like` (its dtype, or float32 for `dtype="float32"`)."""
    if _is_tensor(like):
        return like.new_empty(shape) if dtype is None else like.new_empty(shape).float()
    return np.empty(shape, like.dtype if dtype is None else np.float32)


def xyxy_to_cxcywh(boxes, width: float = 1.0, height: float = 1.0):
    """x1,y1,x2,y2 (pixels of a width x height image) -> normalised cx,cy,w,h (the YOLO label / Batch.targets
    layout). numpy [..., 4] or torch [..., 4] in, the same kind and floating type out."""
    b = _as_boxes(boxes)
    out = _empty(b, b.shape)
    out[..., 0] = (b[..., 0] + b[..., 2]) * (0.5 / width)
    out[..., 1] = (b[..., 1] + b[..., 3]) * (0.5 / height)
    out[..., 2] = (b[..., 2] - b[..., 0]) * (1.0 / width)
    out[..., 3] = (b[..., 3] - b[..., 1]) * (1.0 / height)
    return out


def cxcywh_to_xyxy(boxes, width: float = 1.0, height: float = 1.0):
    """Normalised cx,cy,w,h -> x1,y1,x2,y2 in pixels of a width x height image (default 1 x 1: stays
    normalised). numpy or torch [..., 4] in (extra columns past the 4th are ignored), the same kind out."""
    b = _as_boxes(boxes)[..., :4]
    out = _empty(b, b.shape)
    half_w, half_h = b[..., 2] * 0.5, b[..., 3] * 0.5
    out[..., 0] = (b[..., 0] - half_w) * width
    out[..., 1] = (b[..., 1] - half_h) * height
    out[..., 2] = (b[..., 0] + half_w) * width
    out[..., 3] = (b[..., 1] + half_h) * height
    return out


def make_targets(sample, classes, boxes, size: float):
    """Batch.targets (float32 [M,6]: img_idx, cls, cx, cy, w, h normalised, see TARGET_COLUMNS) from per-box
    sample indices (an int or [M]), classes [M] and x1,y1,x2,y2 boxes in pixels of the size x size output.
    numpy or torch, after `boxes`."""
    b = _as_boxes(boxes)
    t = _empty(b, (len(b), 6), "float32")
    t[:, 0] = sample
    t[:, 1] = classes
    t[:, 2:] = xyxy_to_cxcywh(b, size, size)
    return t
