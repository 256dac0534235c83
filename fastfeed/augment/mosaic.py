"""YOLO mosaic + random affine in one pass over the output pixels.

The classic recipe lays 4 images (long side S each) around a random centre of a 2S x 2S canvas,
then warps the canvas to S x S: 4 resizes, a 4.9 MB canvas (S=640) and a 2S->S warp per sample. Here the
canvas is only a coordinate frame: each tile's placement and the random affine are composed into
one map and the tile is drawn straight into its part of the output (see paste.py), so about S*S
pixels are produced in total and a tile may come at any resolution (its own scale S/long_side is
part of the map). Decode tiles within 2x of S (e.g. JPEG DCT scaling) to avoid aliasing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._validate import check_boxes, check_image, check_out, check_rng, check_size
from .affine import random_affine_matrix
from .hyp import DEFAULT_HYP, AugmentHyp
from .paste import paste_boxes, paste_tile, region_crop

Tile = tuple[np.ndarray, np.ndarray, np.ndarray]  # (img, boxes [N,4] in img pixels, classes [N])


def mosaic_layout(shapes: Sequence[tuple[int, int]], size: int, centre: tuple[float, float]):
    """Canvas placement of 4 tiles around `centre` in the virtual 2S x 2S canvas.

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


def draw_mosaic_centre(rng: np.random.Generator, size: int) -> tuple[float, float]:
    """The mosaic centre in the virtual 2S x 2S canvas: uniform in [S/2, 3S/2] on both axes (drawn
    before the affine, on every path that builds mosaics)."""
    x, y = rng.uniform(0.5 * size, 1.5 * size, 2)
    return float(x), float(y)


def mosaic(tiles: Sequence[Tile], size: int, rng: np.random.Generator, hyp: AugmentHyp = DEFAULT_HYP,
           out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4-image mosaic followed by the random affine, into a size x size uint8 output.

    Draws the canvas centre uniformly in [S/2, 3S/2] on both axes, then `random_affine_matrix`
    about the canvas centre (so flips, zoom, rotation and shift come from `hyp`). Boxes follow
    their pixels, are clipped to the part of their tile that is shown and to the output, and are
    filtered by the hyp's box thresholds. Returns (out, boxes float32 [M,4], classes [M]).
    `out` (e.g. a slot of a batch buffer) is overwritten entirely and must not overlap a tile.
    hyp.mosaic and hyp.mixup are not read here: the loader draws whether to call mosaic/mixup.
    """
    if len(tiles) != 4:
        raise ValueError(f"tiles must hold exactly 4 (img, boxes, classes) tuples, got {len(tiles)}")
    size = check_size(size, lo=2)
    check_rng(rng)
    imgs, boxes, classes = [], [], []
    for k, tile in enumerate(tiles):
        if len(tile) != 3:
            raise ValueError(f"tiles[{k}] must be an (img, boxes, classes) tuple, got {len(tile)} items")
        imgs.append(check_image(tile[0], f"tiles[{k}] img"))
        b, c = check_boxes(tile[1], tile[2], f"tiles[{k}] boxes")
        boxes.append(b)
        classes.append(c)
    out = check_out(out, (size, size, 3))

    centre = draw_mosaic_centre(rng, size)
    matrix = random_affine_matrix(rng, hyp, (float(size), float(size)), size)
    out.fill(hyp.fill)
    realised, crops, regions = [], [], []
    for img, (place, region) in zip(imgs, mosaic_layout([i.shape[:2] for i in imgs], size, centre)):
        m, crop = paste_tile(out, img, place, region, matrix)
        realised.append(m)
        crops.append(crop)
        regions.append(region_crop(place, region, img.shape[:2]))
    return out, *paste_boxes(boxes, classes, realised, crops, size, hyp, regions)
