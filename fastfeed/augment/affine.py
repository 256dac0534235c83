"""The random affine of YOLO training (rotate, zoom, shear, shift, flip) as one matrix.

Flips are folded into the matrix, which moves pixels and boxes alike: the warp path gets them for
free, the resize fast path mirrors each drawn rectangle in place with cv2.flip (~0.04 ms per 640^2,
against ~1.2 ms for a numpy [:, ::-1] copy). A single image (no mosaic) is fitted by its long side to the
output first (`plan.single_layout`), in the same map: one pixel pass.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .hyp import AugmentHyp


class AffineDraw(NamedTuple):
    """The random parameters of one training affine, in the order they are drawn."""

    angle: float      # radians, positive turns the image anticlockwise as displayed
    zoom: float
    shear_x: float    # tan of the x / y shear angles
    shear_y: float
    tx: float         # where the centre goes in the size x size output
    ty: float
    flip_lr: bool
    flip_ud: bool
    px: float = 0.0   # perspective: the projective row's x / y terms, in the centred frame (Ultralytics' P)
    py: float = 0.0

    def linear(self) -> np.ndarray:
        """The 2x2 zoom-rotate-shear part."""
        cos, sin = self.zoom * math.cos(self.angle), self.zoom * math.sin(self.angle)
        return np.array([[1.0, self.shear_x], [self.shear_y, 1.0]]) @ np.array([[cos, sin], [-sin, cos]])


def draw_affine(rng: np.random.Generator, hyp: AugmentHyp, size: int) -> AffineDraw:
    """Draw, in this fixed order (so a seed means the same sample whatever the gains, on every path
    that augments: the workers, the DALI plan): angle in +-degrees, zoom in [1-scale, 1+scale], x/y
    shear in +-shear degrees, x/y shift in +-translate*size, the horizontal and vertical flips, then (only when
    hyp.perspective is set) the x/y perspective terms in +-perspective."""
    angle = math.radians(rng.uniform(-hyp.degrees, hyp.degrees))
    zoom = rng.uniform(1.0 - hyp.scale, 1.0 + hyp.scale)
    shx, shy = np.tan(np.radians(rng.uniform(-hyp.shear, hyp.shear, 2)))
    tx, ty = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate, 2) * size
    flip_lr = rng.random() < hyp.fliplr
    flip_ud = rng.random() < hyp.flipud
    px, py = rng.uniform(-hyp.perspective, hyp.perspective, 2) if hyp.perspective else (0.0, 0.0)
    return AffineDraw(angle, zoom, float(shx), float(shy), float(tx), float(ty), bool(flip_lr), bool(flip_ud),
                      float(px), float(py))


def affine_matrix(d: AffineDraw, center: tuple[float, float], size: int, axis_aligned: bool) -> np.ndarray:
    """The 3x3 map of draw `d` taking `center` of a source frame to (tx, ty) of a size x size output: shift by
    -center, perspective (`d.px`, `d.py`), zoom-rotate-shear, shift to (tx, ty) (Ultralytics' T S R P C), flips
    applied last. `axis_aligned` (no rotation/shear/perspective asked for) zeroes the off-diagonal exactly."""
    lin = d.linear()
    if axis_aligned:
        lin[0, 1] = lin[1, 0] = 0.0  # exactly diagonal: selects the resize fast path downstream
    m = np.eye(3)
    m[:2, :2] = lin
    m[:2, 2] = (d.tx, d.ty)
    cx, cy = center
    m = m @ np.array([[1.0, 0.0, -cx], [0.0, 1.0, -cy], [d.px, d.py, 1.0 - d.px * cx - d.py * cy]])
    if d.flip_lr:  # x -> size - x, after everything else (x = row0 / row2)
        m[0] = size * m[2] - m[0]
    if d.flip_ud:
        m[1] = size * m[2] - m[1]
    return m
