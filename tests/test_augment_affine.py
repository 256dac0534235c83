"""The single-image random affine: boxes on their paint, determinism, out= buffers, bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
from augment_helpers import COLOURS, ROTATED, check_contract, check_painted, painted_tile, random_affine

from fastfeed.augment import AugmentHyp

# --- random affine (single image) ------------------------------------------------------------------

@pytest.mark.parametrize("hyp,rotated", [
    (AugmentHyp(), False),
    (AugmentHyp(fliplr=1.0, translate=0.3, scale=0.6), False),
    (AugmentHyp(degrees=5), True),
    (ROTATED, True),
])
def test_random_affine_boxes_frame_paint(hyp, rotated):
    kept = clipped = 0
    for seed in range(25):
        img, boxes, classes = painted_tile(300, 420, (150, 90, 260, 200), COLOURS[0], 0, seed)
        out, b, c = random_affine(img, boxes, classes, 256, np.random.default_rng(seed), hyp)
        check_contract(out, b, c, 256)
        k, cl = check_painted(out, b, c, 256, rotated)
        kept, clipped = kept + k, clipped + cl
    assert kept >= 15


def test_random_affine_flip_mirrors():
    img, boxes, classes = painted_tile(200, 200, (20, 30, 80, 90), COLOURS[1], 1)
    plain = AugmentHyp(translate=0.0, scale=0.0, fliplr=0.0)
    a, ab, _ = random_affine(img, boxes, classes, 200, np.random.default_rng(0), plain)
    b, bb, _ = random_affine(img, boxes, classes, 200, np.random.default_rng(0), AugmentHyp(translate=0.0, scale=0.0, fliplr=1.0))
    np.testing.assert_allclose(ab, boxes)  # identity map: the same pixels, the same box
    assert (a == img).all()
    np.testing.assert_allclose(bb, [[120, 30, 180, 90]])
    assert (b == img[:, ::-1]).all()
    c, cb, _ = random_affine(img, boxes, classes, 200, np.random.default_rng(0), AugmentHyp(translate=0.0, scale=0.0, fliplr=0.0, flipud=1.0))
    np.testing.assert_allclose(cb, [[20, 110, 80, 170]])
    assert (c == img[::-1]).all()


def test_random_affine_drops_boxes_that_leave_and_classes_follow():
    img = np.random.default_rng(0).integers(120, 181, (200, 200, 3), dtype=np.uint8)
    boxes = np.array([[0, 0, 30, 30], [85, 85, 115, 115], [170, 0, 200, 30]], np.float32)
    classes = np.array([7, 8, 9])
    hyp = AugmentHyp(translate=0.45, scale=0.0)
    seen_drop = False
    for seed in range(30):
        out, b, c = random_affine(img, boxes, classes, 200, np.random.default_rng(seed), hyp)
        check_contract(out, b, c, 200)
        assert set(c.tolist()) <= {7, 8, 9} and len(set(c.tolist())) == len(c)
        seen_drop |= len(c) < 3
        if 8 in c.tolist():  # the centre box moves rigidly (no scale): same size unless clipped
            w, h = b[c == 8][0, 2:] - b[c == 8][0, :2]
            assert w <= 30.01 and h <= 30.01
    assert seen_drop
