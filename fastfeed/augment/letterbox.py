"""Letterbox: fit an image into a square (or stride-aligned) frame without distorting it.

Used for validation and the rectangular-batch path. One resize straight into the centre of the
output plus four border fills; with `out=` nothing is allocated.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import cv2
import numpy as np

from ..checks import is_int, need
from .labels import Labels

# --- argument checks: bad input raises ValueError naming the argument and what is valid, at the call that caused it
# rather than as an OpenCV assertion three frames down

def check_image(img, name: str = "img") -> np.ndarray:
    """An RGB uint8 HWC array of at least 1x1 pixel (views with positive strides are fine)."""
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        desc = f"{img.dtype} {img.shape}" if isinstance(img, np.ndarray) else type(img).__name__
        raise ValueError(f"{name} must be a uint8 array of shape [H,W,3] (RGB), got {desc}")
    if img.shape[0] < 1 or img.shape[1] < 1:
        raise ValueError(f"{name} must be at least 1x1 pixel, got shape {img.shape}")
    if any(s < 0 for s in img.strides):
        raise ValueError(f"{name} has a negative stride {img.strides}; pass np.ascontiguousarray({name})")
    return img


def check_out(out, shape: tuple[int, int, int], name: str = "out") -> np.ndarray:
    """A caller's uint8 buffer of exactly `shape` whose rows OpenCV can write in place.

    Rows may be strided (a view into a larger buffer) but the pixels of a row must be packed,
    otherwise OpenCV would silently write into a temporary copy.
    """
    if out is None:
        return np.empty(shape, np.uint8)
    if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != shape:
        desc = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ValueError(f"{name} must be a uint8 array of shape {shape}, got {desc}")
    if out.strides[2] != 1 or out.strides[1] != 3 or out.strides[0] < 3 * shape[1]:
        raise ValueError(f"{name} rows must be packed RGB pixels (strides [>={3 * shape[1]},3,1]), "
                         f"got strides {out.strides}")
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    return out


class LetterboxGeometry(NamedTuple):
    nw: int        # resized width and height
    nh: int
    left: int      # where the resized image starts in the output
    top: int
    out_w: int     # the output frame
    out_h: int
    scale: float   # the drawn scale (nw / w and nh / h are the realised ones)


def letterbox_geometry(h: int, w: int, size: int, *, scaleup: bool = True, stride: int | None = None
                       ) -> LetterboxGeometry:
    """Where an h x w image lands when letterboxed to `size`.

    The long side becomes `size` (never enlarged with scaleup=False), sizes rounded; the image is
    centred in a size x size frame, or with `stride` in the smallest stride-multiple frame holding it.
    Every letterboxing path (this module, the DALI plan, evaluation's mapping back) calls this.
    """
    r = size / max(h, w)
    if not scaleup:
        r = min(r, 1.0)
    nw, nh = max(1, min(size, round(w * r))), max(1, min(size, round(h * r)))
    ow, oh = (math.ceil(nw / stride) * stride, math.ceil(nh / stride) * stride) if stride else (size, size)
    return LetterboxGeometry(nw, nh, (ow - nw) // 2, (oh - nh) // 2, ow, oh, r)


def letterbox(img: np.ndarray, size: int, *, stride: int = 32, rect: bool = False, fill: int = 114,
              scaleup: bool = True, out: np.ndarray | None = None
              ) -> tuple[np.ndarray, tuple[float, float], tuple[int, int]]:
    """Resize so the long side is `size`, then pad centred with `fill`.

    `scaleup=False` never enlarges (upscaled validation images score differently). `rect=True`
    pads only to the smallest multiple of `stride` holding the resized image instead of the square,
    so the output shape varies per image: `out` must then have that shape.
    Returns (img, (ratio_x, ratio_y), (pad_x, pad_y)); the two ratios differ only by rounding of
    the resized size and map boxes exactly (see `letterbox_boxes`).
    """
    check_image(img)
    for name, side in (("size", size), ("stride", stride)):
        need(is_int(side) and side >= 1, name, "must be an integer >= 1", side)
    need(is_int(fill) and 0 <= fill <= 255, "fill", "must be an integer in [0, 255]", fill)
    size, stride, fill = int(size), int(stride), int(fill)
    h, w = img.shape[:2]
    nw, nh, left, top, ow, oh, r = letterbox_geometry(h, w, size, scaleup=scaleup, stride=stride if rect else None)
    out = check_out(out, (oh, ow, 3))
    # Fill only the border: the centre is overwritten by the resize anyway.
    out[:top] = fill
    out[top + nh:] = fill
    out[top:top + nh, :left] = fill
    out[top:top + nh, left + nw:] = fill
    dst = out[top:top + nh, left:left + nw]
    if (nw, nh) == (w, h):
        dst[...] = img
    else:
        # Bilinear aliases below half size; INTER_AREA is slower but correct there.
        cv2.resize(img, (nw, nh), dst=dst, interpolation=cv2.INTER_AREA if r < 0.5 else cv2.INTER_LINEAR)
    return out, (nw / w, nh / h), (left, top)


def letterbox_boxes(boxes: np.ndarray, ratio, pad: tuple[float, float]) -> np.ndarray:
    """Map x1,y1,x2,y2 boxes of the source image into the letterboxed image.

    `ratio` is the (ratio_x, ratio_y) that `letterbox` returned, or one number for both axes.
    """
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    rx, ry = (ratio, ratio) if isinstance(ratio, numbers.Real) else ratio
    return b * np.array([rx, ry] * 2, np.float32) + np.array([pad[0], pad[1]] * 2, np.float32)


def letterbox_labels(labels: Labels, ratio, pad: tuple[float, float]) -> Labels:
    """`letterbox_boxes` for every field of `labels` (polygons, keypoint x/y, corners): the no-augment path.
    Nothing is clipped or dropped (a letterbox shows the whole image); keypoint visibility is kept."""
    rx, ry = (ratio, ratio) if isinstance(ratio, numbers.Real) else ratio
    scale, shift = np.array([rx, ry], np.float32), np.array(pad[:2], np.float32)
    moved = labels.map_points(lambda p: (p * scale + shift).astype(np.float32, copy=False))
    moved.boxes = letterbox_boxes(labels.boxes, ratio, pad)
    return moved
