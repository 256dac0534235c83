"""augment.masks.rasterise: masks match the polygons they came from (the pixel-centre rule, areas, overlap order)."""

import cv2
import numpy as np
import pytest

from fastfeed.augment.masks import mask_side, rasterise


def centres_inside(poly, side, ratio):
    """Reference: which mask pixels' centres lie inside `poly` (even-odd ray casting, output pixels)."""
    jj, ii = np.meshgrid(np.arange(side), np.arange(side))
    px, py = (jj + 0.5) * ratio, (ii + 0.5) * ratio
    x, y = poly[:, 0].astype(np.float64), poly[:, 1].astype(np.float64)
    x2, y2 = np.roll(x, -1), np.roll(y, -1)
    inside = np.zeros(px.shape, bool)
    for a, b, c, d in zip(x, y, x2, y2):
        if b == d:
            continue
        crosses = (b > py) != (d > py)
        xi = a + (py - b) * (c - a) / (d - b)
        inside ^= crosses & (px < xi)
    return inside


def star(rng, size, n=None):
    n = n or int(rng.integers(3, 30))
    cx, cy = rng.uniform(-0.1 * size, 1.1 * size, 2)   # some reach past the output's edges
    rad = rng.uniform(2, size / 3)
    ang = np.sort(rng.uniform(0, 2 * np.pi, n))
    r = rad * rng.uniform(0.3, 1.0, n)
    return np.stack([cx + r * np.cos(ang), cy + r * np.sin(ang)], 1).astype(np.float32)


def square(x1, y1, x2, y2):
    return np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], np.float32)


@pytest.mark.parametrize("ratio", [1, 2, 4, 8])
def test_a_mask_pixel_is_set_exactly_when_its_centre_is_inside_the_polygon(ratio):
    rng = np.random.default_rng(ratio)
    size = 64
    checked = 0
    for _ in range(60):
        poly = star(rng, size)
        mask = rasterise([poly], size, ratio, overlap=False)[0]
        ref = centres_inside(poly, size // ratio, ratio)
        np.testing.assert_array_equal(mask.astype(bool), ref)
        checked += ref.sum()
    assert checked > (size // ratio) ** 2 // 2  # the polygons covered pixels: not a comparison of empty masks


def test_mask_area_matches_the_polygon_area():
    rng = np.random.default_rng(1)
    for _ in range(20):
        poly = star(rng, 160, n=40) * 0.5 + 40   # well inside a 160 output
        area = 0.5 * abs(np.dot(poly[:, 0], np.roll(poly[:, 1], -1)) - np.dot(poly[:, 1], np.roll(poly[:, 0], -1)))
        if area < 400:
            continue
        mask = rasterise([poly], 160, 1, overlap=False)[0]
        assert abs(int(mask.sum()) - area) < 0.08 * area + 20


def test_a_square_on_pixel_edges_covers_exactly_its_pixels():
    m = rasterise([square(8, 4, 24, 20)], 32, 4, overlap=False)[0]
    expected = np.zeros((8, 8), np.uint8)
    expected[1:5, 2:6] = 1
    np.testing.assert_array_equal(m, expected)


def test_overlap_draws_the_smaller_object_on_top_with_its_row_number():
    big, small = square(0, 0, 32, 32), square(8, 8, 16, 16)
    for polys, big_v, small_v in (([big, small], 1, 2), ([small, big], 2, 1)):   # whatever order the rows come in
        m = rasterise(polys, 32, 1, overlap=True)
        assert m.dtype == np.int16 and m.shape == (32, 32)
        assert (m[8:16, 8:16] == small_v).all()
        assert (m[:8] == big_v).all() and (m[16:] == big_v).all()
        assert set(np.unique(m)) == {big_v, small_v}


def test_not_overlap_gives_one_full_mask_per_object():
    big, small = square(0, 0, 32, 32), square(8, 8, 16, 16)
    m = rasterise([big, small], 32, 2, overlap=False)
    assert m.dtype == np.uint8 and m.shape == (2, 16, 16)
    assert m[0].all()                       # the big one whole, under the small one too
    assert m[1].sum() == 16 and m[1][4:8, 4:8].all()


def test_objects_without_a_polygon_get_no_mask():
    empty = np.zeros((0, 2), np.float32)
    m = rasterise([empty, square(0, 0, 8, 8), empty[:0]], 16, 1, overlap=True)
    assert set(np.unique(m)) == {0, 2}
    per = rasterise([empty, square(0, 0, 8, 8)], 16, 1, overlap=False)
    assert per[0].sum() == 0 and per[1].sum() == 64
    assert rasterise([], 16, 4, overlap=False).shape == (0, 4, 4)
    assert not rasterise([], 16, 4, overlap=True).any()


def test_out_is_written_in_place_and_cleared_first():
    out = np.full((8, 8), 7, np.int16)
    res = rasterise([square(0, 0, 8, 8)], 32, 4, overlap=True, out=out)
    assert res is out
    assert (out[:2, :2] == 1).all() and out[2:].sum() == 0
    with pytest.raises(ValueError, match="out must be a contiguous int16 \\[8, 8\\]"):
        rasterise([square(0, 0, 8, 8)], 32, 4, overlap=True, out=np.zeros((8, 8), np.uint8))


@pytest.mark.parametrize("ratio", [0, 3, 2.0, True])
def test_a_ratio_that_does_not_divide_the_size_is_refused_by_name(ratio):
    with pytest.raises(ValueError, match="mask ratio must be an integer >= 1 dividing the image size 32"):
        rasterise([square(0, 0, 8, 8)], 32, ratio, overlap=True)
    assert mask_side(640, 4) == 160


def _full_size_reference(polygons, size, ratio):
    """The ultralytics rule by its definition: each object resampled to 1,000 points, truncated, filled on a
    full-size canvas, then shrunk."""
    out = []
    for p in polygons:
        canvas = np.zeros((size, size), np.uint8)
        ring = np.concatenate([p, p[:1]]).astype(np.float64)
        idx = np.arange(len(ring))
        at = np.sort(np.concatenate([np.linspace(0, len(ring) - 1, 1000 - len(ring)), idx]))   # 1000 points
        dense = np.stack([np.interp(at, idx, ring[:, 0]), np.interp(at, idx, ring[:, 1])], 1).astype(np.float32)
        cv2.fillPoly(canvas, [dense.astype(np.int32)], 1)
        out.append(cv2.resize(canvas, (size // ratio, size // ratio)))
    return np.array(out, np.uint8).reshape(len(polygons), size // ratio, size // ratio)


@pytest.mark.parametrize("ratio", [1, 2, 4, 8])
def test_the_ultralytics_rule_is_a_full_size_fill_shrunk_and_layers_smaller_objects_on_top(ratio):
    rng = np.random.default_rng(ratio)
    size = 96
    polygons = []
    for _ in range(12):
        c, r = rng.uniform(0, size, 2), rng.uniform(2, 30)
        t = np.sort(rng.uniform(0, 2 * np.pi, rng.integers(3, 9)))
        polygons.append(np.clip(np.stack([c[0] + r * np.cos(t), c[1] + r * np.sin(t)], 1), 0, size).astype(np.float32))
    ref = _full_size_reference(polygons, size, ratio)
    np.testing.assert_array_equal(rasterise(polygons, size, ratio, False, rule="ultralytics"), ref)
    layered = np.zeros((size // ratio, size // ratio), np.int16)
    for j in np.argsort(-ref.reshape(len(ref), -1).sum(1), kind="stable"):
        layered[ref[j] > 0] = j + 1
    np.testing.assert_array_equal(rasterise(polygons, size, ratio, True, rule="ultralytics"), layered)
    # it over-covers where the centre rule does not: more mask pixels than the polygons' exact areas
    assert ref.sum() > rasterise(polygons, size, ratio, False).sum()


def test_an_unknown_mask_rule_is_named():
    with pytest.raises(ValueError, match="mask rule must be one of centre, ultralytics"):
        rasterise([np.float32([[0, 0], [8, 0], [8, 8]])], 16, 4, True, rule="exact")
