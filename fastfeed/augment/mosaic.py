"""The mosaic's geometry: where 4 tiles go in the virtual canvas, and its random centre.

The classic recipe lays 4 images (long side S each) around a random centre of a 2S x 2S canvas,
then warps the canvas to S x S: 4 resizes, a 4.9 MB canvas (S=640) and a 2S->S warp per sample. Here the
canvas is only a coordinate frame: each tile's placement and the random affine are composed into
one map and the tile is drawn straight into its part of the output (see paste.py), so about S*S
pixels are produced in total and a tile may come at any resolution (its own scale S/long_side is
part of the map). Decode tiles within 2x of S (e.g. JPEG DCT scaling) to avoid aliasing. The pixels
are drawn by render.py (`render_labels`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
