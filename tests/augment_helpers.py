"""What the augmentation tests share: painted tiles and the checks of a mosaic/affine result."""

from __future__ import annotations

import numpy as np

from fastfeed.augment import (
    AugmentHyp,
    Geometry,
    Labels,
    draw_affine,
    draw_hsv,
    draw_mosaic_centre,
    hsv_to_planes,
    render_labels,
)
from fastfeed.augment.hyp import DEFAULT_HYP


def paint_bbox(img, colour, thr=60):
    m = np.abs(img.astype(np.int16) - np.array(colour)).max(-1) < thr
    if not m.any():
        return None, 0
    ys, xs = np.nonzero(m)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32), int(m.sum())


COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]


ROTATED = AugmentHyp(degrees=12, shear=3, fliplr=0.5, flipud=0.5)


def painted_tile(h, w, box, colour, cls, seed=0):
    """Noise in 120..180 (never grey 114, far from every paint colour) with one painted rectangle."""
    img = np.random.default_rng(seed).integers(120, 181, (h, w, 3), dtype=np.uint8)
    x1, y1, x2, y2 = box
    img[y1:y2, x1:x2] = colour
    return img, np.array([box], np.float32), np.array([cls])


def check_contract(out, boxes, classes, size):
    assert out.dtype == np.uint8 and out.shape == (size, size, 3)
    assert boxes.dtype == np.float32 and boxes.ndim == 2 and boxes.shape[1] == 4
    assert len(classes) == len(boxes)
    assert (boxes >= 0).all() and (boxes <= size).all()
    assert (boxes[:, 2] > boxes[:, 0]).all() and (boxes[:, 3] > boxes[:, 1]).all()


def check_painted(out, boxes, classes, size, rotated, tol=2.0):
    """Every returned box frames its paint; returns (#kept, #clipped at the border)."""
    kept = clipped = 0
    for cls, colour in enumerate(COLOURS):
        sel = boxes[classes == cls]
        assert len(sel) <= 1
        if not len(sel):
            continue
        box = sel[0]
        found, _ = paint_bbox(out, colour)
        assert found is not None, f"class {cls} box {box} has no paint"
        kept += 1
        clipped += bool((box[:2] <= 0).any() or (box[2:] >= size).any())
        # the paint never sticks out of its box ...
        assert (found[:2] >= box[:2] - tol).all() and (found[2:] <= box[2:] + tol).all(), (cls, box, found)
        # ... and fits it tightly, except where a rotated box's corner was cut by the output border
        if not rotated or ((box[:2] > 1).all() and (box[2:] < size - 1).all()):
            np.testing.assert_allclose(found, box, atol=tol)
    return kept, clipped


def shoelace(p):
    x, y = p[:, 0], p[:, 1]
    return 0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def rect_corners(cx, cy, w, h, angle):
    c, s = np.cos(angle), np.sin(angle)
    half = np.array([[-w, -h], [w, -h], [w, h], [-w, h]]) / 2
    return (half @ np.array([[c, s], [-s, c]]) + (cx, cy)).astype(np.float32)


def render_geometry(tiles, geometry, size, hyp, out=None):
    """`render_labels` of (img, boxes, classes) tiles: (out, boxes, classes)."""
    tiles = [(t[0], Labels(np.asarray(t[1], np.float32).reshape(-1, 4), np.asarray(t[2]))) for t in tiles]
    out, labels = render_labels(tiles, geometry, size, hyp, np.empty((size, size, 3), np.uint8) if out is None else out)
    return out, labels.boxes, labels.classes


def mosaic(tiles, size, rng, hyp=DEFAULT_HYP, out=None):
    """A 4-tile mosaic under the random affine, drawn as a plan draws them (centre, then `draw_affine`) from
    `rng`, rendered by `render_labels`: (out, boxes, classes)."""
    return render_geometry(tiles, Geometry((1, 2, 3), draw_mosaic_centre(rng, size), draw_affine(rng, hyp, size)), size, hyp,
                   out)


def random_affine(img, boxes, classes, size, rng, hyp=DEFAULT_HYP, out=None):
    """One image under the random affine (a plan without mosaic), rendered by `render_labels`."""
    return render_geometry([(img, boxes, classes)], Geometry(None, None, draw_affine(rng, hyp, size)), size, hyp, out)


def hsv_jitter_to_planes(img, planes, rng, hgain, sgain, vgain, scratch):
    """`hsv_to_planes` of a jitter drawn from `rng` (`draw_hsv`)."""
    hsv_to_planes(img, planes, draw_hsv(rng, hgain, sgain, vgain), scratch)
