"""The random affine of YOLO training (rotate, zoom, shear, shift, flip) as one matrix.

Flips are folded into the matrix, which moves pixels and boxes alike: the warp path gets them for
free, the resize fast path mirrors each drawn rectangle in place with cv2.flip (~0.04 ms per 640^2,
against ~1.2 ms for a numpy [:, ::-1] copy). `random_affine` is the single-image (non-mosaic) path: fit the image's long
side to the output, apply the random affine, one pixel pass.
"""

from __future__ import annotations

import math

import numpy as np

from ._validate import check_boxes, check_image, check_out, check_rng, check_size
from .hyp import DEFAULT_HYP, AugmentHyp
from .paste import paste_boxes, paste_tile


def random_affine_matrix(rng: np.random.Generator, hyp: AugmentHyp, center: tuple[float, float],
                         size: int) -> np.ndarray:
    """A 3x3 map taking `center` of a source frame to near the centre of a size x size output.

    Draws, in this fixed order (so a seed means the same sample whatever the gains): angle in
    +-degrees, zoom in [1-scale, 1+scale], x/y shear in +-shear degrees, x/y shift in
    +-translate*size, then the horizontal and vertical flips. Coordinates are continuous pixels
    (see boxes.py); positive angles turn the image anticlockwise as displayed.
    """
    angle = math.radians(rng.uniform(-hyp.degrees, hyp.degrees))
    zoom = rng.uniform(1.0 - hyp.scale, 1.0 + hyp.scale)
    shx, shy = np.tan(np.radians(rng.uniform(-hyp.shear, hyp.shear, 2)))
    tx, ty = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate, 2) * size
    flip_lr = rng.random() < hyp.fliplr
    flip_ud = rng.random() < hyp.flipud

    cos, sin = zoom * math.cos(angle), zoom * math.sin(angle)
    rot = np.array([[cos, sin], [-sin, cos]])
    lin = np.array([[1.0, shx], [shy, 1.0]]) @ rot
    if hyp.degrees == 0 and hyp.shear == 0:
        lin[0, 1] = lin[1, 0] = 0.0  # exactly diagonal: selects the resize fast path downstream
    m = np.eye(3)
    m[:2, :2] = lin
    m[:2, 2] = (tx, ty) - lin @ np.asarray(center, np.float64)
    if flip_lr:  # x -> size - x, after everything else
        m[0] = -m[0]
        m[0, 2] += size
    if flip_ud:
        m[1] = -m[1]
        m[1, 2] += size
    return m


def random_affine(img: np.ndarray, boxes: np.ndarray, classes: np.ndarray, size: int,
                  rng: np.random.Generator, hyp: AugmentHyp = DEFAULT_HYP,
                  out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random affine of one image into a size x size uint8 output (the non-mosaic training path).

    The image is scaled so its long side is `size` (any input resolution; the scale is part of the
    matrix, so no separate resize pass), centred, then transformed by `random_affine_matrix`.
    Uncovered pixels get `hyp.fill`. Boxes follow, are clipped to the output and filtered by the
    hyp's box thresholds; classes follow their boxes. Returns (out, boxes float32 [M,4], classes [M]).
    """
    check_image(img)
    size = check_size(size)
    check_rng(rng)
    b, c = check_boxes(boxes, classes)
    out = check_out(out, (size, size, 3))
    h, w = img.shape[:2]
    r = size / max(h, w)
    matrix = random_affine_matrix(rng, hyp, (w * r / 2, h * r / 2), size)
    out.fill(hyp.fill)
    realised, crop = paste_tile(out, img, (r, 0.0, 0.0), (0.0, 0.0, w * r, h * r), matrix)
    return out, *paste_boxes([b], [c], [realised], [crop], size, hyp)

