"""The sample plan: every random draw one training sample needs, made here, in one order, for every loader. The
order of the draws and why the renderers take plans and none draws: docs/design.md, 'One sample plan'. The plan
holds only draws (indices into the candidate list, numbers), never pixels or shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .albu import Albu
from .albu import draw as draw_albu
from .cutmix import draw_cut_rects
from .hsv import draw_hsv
from .hyp import AugmentHyp
from .paste import Place, Rect


def batch_rng(seed: int, rank: int, epoch: int, batch: int) -> np.random.Generator:
    """The generator of one batch's draws: a function of (seed, rank, epoch, batch index) only, so a batch is
    the same however many workers build it and wherever an epoch is started."""
    return np.random.default_rng([seed, rank, epoch, batch])


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


@dataclass(frozen=True)
class Geometry:
    """One geometric sample: the own image alone, or a mosaic of it and 3 partners, under a random affine."""

    partners: tuple[int, int, int] | None   # mosaic partners: indices into the candidates; None: no mosaic
    centre: tuple[float, float] | None      # the mosaic centre in the 2S x 2S canvas (None: no mosaic)
    affine: AffineDraw
    paste_flip: bool = False                # copy-paste mode "flip" on its mid frame (`copypaste.flip_in`)

    @property
    def mosaic(self) -> bool:
        return self.partners is not None


@dataclass(frozen=True)
class Paste:
    """Copy-paste mode "mixup": objects of a second geometric sample whose own image is candidate `other`."""

    other: int
    geometry: Geometry


@dataclass(frozen=True)
class Mix:
    """Mixup: blend with a second geometric sample whose own image is candidate `other`."""

    other: int
    geometry: Geometry
    weight: float                           # of the first sample's pixels
    paste: Paste | None = None              # the second sample's own copy-paste (mode "mixup")


@dataclass(frozen=True)
class Cut:
    """CutMix: a rectangle of a second geometric sample whose own image is candidate `other` (`cutmix.cut_in`)."""

    other: int
    geometry: Geometry
    rects: tuple                            # candidate (x1, y1, x2, y2), output pixels
    pick: float                             # which of the free candidates, as a share of them
    paste: Paste | None = None              # the second sample's own copy-paste (mode "mixup")


@dataclass(frozen=True)
class SamplePlan:
    """Everything drawn for one training sample (the order: docs/design.md, 'One sample plan')."""

    geometry: Geometry
    mix: Mix | None
    hsv: tuple[float, float, float] | None   # hue turn, saturation and value factors; None: no jitter
    bgr: bool = False                        # the channels in BGR order instead of RGB
    cut: Cut | None = None
    paste: Paste | None = None
    albu: Albu | None = None                 # the Albumentations transforms that fire (`albu.py`)

    def records(self, own: int, candidates) -> list[int]:
        """The items every tile of this sample shows: `own` first, then the picked `candidates` entries
        (mosaic partners; then the copy-paste, mixup and cutmix samples' own images and partners)."""
        out = [own] + [candidates[k] for k in self.geometry.partners or ()]
        for second in (self.paste, self.mix, self.mix and self.mix.paste, self.cut, self.cut and self.cut.paste):
            if second is not None:
                out += [candidates[second.other]] + [candidates[k] for k in second.geometry.partners or ()]
        return out


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


def draw_mosaic_centre(rng: np.random.Generator, size: int) -> tuple[float, float]:
    """The mosaic centre in the virtual 2S x 2S canvas: uniform in [S/2, 3S/2] on both axes (drawn
    before the affine, on every path that builds mosaics)."""
    x, y = rng.uniform(0.5 * size, 1.5 * size, 2)
    return float(x), float(y)


def draw_mixup_weight(rng: np.random.Generator) -> float:
    """The weight of the first image in a mixup: Beta(32, 32), close to 0.5 (as YOLO does)."""
    return float(rng.beta(32.0, 32.0))


def draw_geometry(rng: np.random.Generator, hyp: AugmentHyp, size: int, mosaic_on: bool, candidates: int,
                  paste_flip: bool = False) -> Geometry:
    """Mosaic or not (with probability hyp.mosaic when `mosaic_on`), its partners among `candidates` items and
    its centre, then the affine."""
    if mosaic_on and rng.random() < hyp.mosaic:
        partners = tuple(int(k) for k in rng.integers(candidates, size=3))
        return Geometry(partners, draw_mosaic_centre(rng, size), draw_affine(rng, hyp, size), paste_flip)
    return Geometry(None, None, draw_affine(rng, hyp, size), paste_flip)


def draw_sample(rng: np.random.Generator, hyp: AugmentHyp, size: int, *, mosaic_on: bool, mixup_on: bool,
                candidates: int) -> SamplePlan:
    """One training sample's plan. `candidates`: how many items the partner list holds (the loader's buffer,
    the batch's own images included); `mosaic_on` / `mixup_on`: whether this epoch may use them (mixup_on: the
    mixing ones, copy-paste, mixup and cutmix)."""
    if candidates < 1 and (mosaic_on or mixup_on):
        raise ValueError("a mosaic or mixup plan needs at least one candidate to pick partners from")
    flip = bool(mixup_on and hyp.copy_paste and hyp.copy_paste_mode == "flip")
    geometry = draw_geometry(rng, hyp, size, mosaic_on, candidates, flip)
    mix = cut = None

    def draw_paste() -> Paste | None:   # mode "mixup"
        if mixup_on and hyp.copy_paste and not flip and rng.random() < hyp.copy_paste:
            return Paste(int(rng.integers(candidates)), draw_geometry(rng, hyp, size, mosaic_on, candidates))

    def draw_second() -> tuple:   # a mixup or cutmix sample: (its own image, its geometry, its own copy-paste)
        return int(rng.integers(candidates)), draw_geometry(rng, hyp, size, mosaic_on, candidates, flip), draw_paste()

    paste = draw_paste()
    if mixup_on and hyp.mixup and rng.random() < hyp.mixup:
        other, second, paste2 = draw_second()
        mix = Mix(other, second, draw_mixup_weight(rng), paste2)
    if mixup_on and hyp.cutmix and rng.random() < hyp.cutmix:
        other, second, paste2 = draw_second()
        cut = Cut(other, second, draw_cut_rects(rng, size), float(rng.random()), paste2)
    albu = draw_albu(rng, hyp.albumentations) if hyp.albumentations else None
    hsv = draw_hsv(rng, hyp.hsv_h, hyp.hsv_s, hyp.hsv_v)
    return SamplePlan(geometry, mix, hsv, bool(hyp.bgr and rng.random() < hyp.bgr), cut, paste, albu)


def draw_batch(rng: np.random.Generator, n: int, hyp: AugmentHyp, size: int, *, mosaic_on: bool, mixup_on: bool,
               candidates: int) -> list[SamplePlan]:
    """The plans of a batch of `n` samples, drawn sample after sample from the batch's generator."""
    return [draw_sample(rng, hyp, size, mosaic_on=mosaic_on, mixup_on=mixup_on, candidates=candidates)
            for _ in range(n)]


# --- geometry: where a plan's tiles go, given their shapes (`paste.Place`, `paste.Rect`) ------------------------

def mosaic_layout(shapes: Sequence[tuple[int, int]], size: int, centre: tuple[float, float]):
    """Canvas placement of 4 tiles around `centre` in the virtual 2S x 2S canvas, only a coordinate frame: the
    tiles are drawn straight into the output (docs/design.md, 'Mosaic without a canvas').

    Tile k goes top-left, top-right, bottom-left, bottom-right of the centre, scaled so its long
    side is S, touching the centre with one corner; its region is its placed rectangle cut to the
    canvas. Returns [(place, region)]: place = (scale, ox, oy) maps tile pixels into the canvas.
    """
    xc, yc = centre
    limit = 2.0 * size
    layout = []
    for k, (h, w) in enumerate(shapes):
        r = size / max(h, w)
        pw, ph = w * r, h * r
        ox = xc - pw if k in (0, 2) else xc
        oy = yc - ph if k in (0, 1) else yc
        region = (max(ox, 0.0), max(oy, 0.0), min(ox + pw, limit), min(oy + ph, limit))
        layout.append(((r, ox, oy), region))
    return layout


def single_layout(hw: tuple[int, int], size: int) -> tuple[list[tuple[Place, Rect]], tuple[float, float]]:
    """The non-mosaic sample's frame: the image scaled so its long side is `size`, at the origin. Returns
    ([(place, region)], the centre the affine takes to its shift)."""
    h, w = hw
    r = size / max(h, w)
    return [((r, 0.0, 0.0), (0.0, 0.0, w * r, h * r))], (w * r / 2, h * r / 2)


def affine_matrix(d: AffineDraw, center: tuple[float, float], size: int, axis_aligned: bool) -> np.ndarray:
    """The 3x3 map of draw `d` taking `center` of a source frame to (tx, ty) of a size x size output: shift by
    -center, perspective (`d.px`, `d.py`), zoom-rotate-shear, shift to (tx, ty) (Ultralytics' T S R P C), flips
    applied last: folded into the map, flips move pixels and boxes alike (the resize fast path mirrors each drawn
    rectangle in place with cv2.flip, ~0.04 ms per 640^2). `axis_aligned` (no rotation/shear/perspective asked
    for) zeroes the off-diagonal exactly."""
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


def sample_layout(geometry: Geometry, shapes, size: int, hyp: AugmentHyp
                  ) -> tuple[list[tuple[Place, Rect]], tuple[float, float], np.ndarray]:
    """([(place, region)] per tile, the centre of the mid frame the affine is drawn about, the 3x3 map from the
    mid frame (the mosaic canvas, or the scaled image) to the size x size output, flips included) of a geometry
    whose tiles (own image first, then the partners) have `shapes` (h, w)."""
    if geometry.mosaic:
        layout, centre = mosaic_layout(shapes[:4], size, geometry.centre), (float(size), float(size))
    else:
        layout, centre = single_layout(shapes[0], size)
    return layout, centre, affine_matrix(geometry.affine, centre, size, hyp.axis_aligned)
