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

from ._validate import check_fill, check_image, check_out, check_size
from .labels import Labels


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
    size = check_size(size)
    stride = check_size(stride, "stride")
    fill = check_fill(fill)
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
        interp = cv2.INTER_AREA if r < 0.5 else cv2.INTER_LINEAR
        cv2.resize(img, (nw, nh), dst=dst, interpolation=interp)
    return out, (nw / w, nh / h), (left, top)


def letterbox_boxes(boxes: np.ndarray, ratio, pad: tuple[float, float]) -> np.ndarray:
    """Map x1,y1,x2,y2 boxes of the source image into the letterboxed image.

    `ratio` is the (ratio_x, ratio_y) that `letterbox` returned, or one number for both axes.
    """
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    rx, ry = (ratio, ratio) if isinstance(ratio, numbers.Real) else ratio
    scale = np.array([rx, ry, rx, ry], np.float32)
    shift = np.array([pad[0], pad[1], pad[0], pad[1]], np.float32)
    return b * scale + shift


def letterbox_labels(labels: Labels, ratio, pad: tuple[float, float]) -> Labels:
    """`letterbox_boxes` for every field of `labels` (polygons, keypoint x/y, corners): the no-augment path.
    Nothing is clipped or dropped (a letterbox shows the whole image); keypoint visibility is kept."""
    rx, ry = (ratio, ratio) if isinstance(ratio, numbers.Real) else ratio
    scale, shift = np.array([rx, ry], np.float32), np.array(pad[:2], np.float32)
    moved = labels.map_points(lambda p: (p * scale + shift).astype(np.float32, copy=False))
    moved.boxes = letterbox_boxes(labels.boxes, ratio, pad)
    return moved
