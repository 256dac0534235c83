"""The mosaic's geometry: where 4 tiles go in the virtual 2S x 2S canvas, and its random centre. The canvas is
only a coordinate frame; the tiles are drawn straight into the output by render.py (docs/design.md, 'Mosaic
without a canvas'). Decode tiles within 2x of S (JPEG DCT scaling) to avoid aliasing.
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
