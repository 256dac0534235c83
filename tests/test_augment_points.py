"""Polygons, keypoints and oriented boxes through mosaic + affine + flips land on their painted objects.

Each object is painted in a colour no background pixel can have (noise 120..180, grey fill 114), its labels
go through `render_labels` with the pixels, and the returned geometry is compared with the paint found in
the output: polygon points on their colour, rebuilt boxes framing the paint, keypoint dots under their
keypoints, oriented corners on the painted rectangle's corners.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from augment_helpers import paint_bbox, rect_corners, render_geometry, shoelace

from fastfeed.augment import (
    AugmentHyp,
    Geometry,
    Labels,
    corners_to_rboxes,
    draw_affine,
    draw_mosaic_centre,
    render_labels,
)

S = 256
# Each colour has a 0 and a 255 channel: far from the noise and the grey, and no blend of two is near a third.
PALETTE = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255), (0, 255, 255)]
TURNED = AugmentHyp(degrees=25, shear=4, scale=0.4, translate=0.15, fliplr=0.5, flipud=0.5)
HYPS = [AugmentHyp(fliplr=0.5, flipud=0.5), TURNED]


def colour_mask(img, colour, thr=60):
    return np.abs(img.astype(np.int16) - np.array(colour)).max(-1) < thr


def noise(h, w, seed):
    return np.random.default_rng(seed).integers(120, 181, (h, w, 3), dtype=np.uint8)


def blob(rng, cx, cy, radius, n=7):
    """A polygon around (cx, cy), not always convex but without needle tips, float32 [n,2]."""
    a = 2 * np.pi * (np.arange(n) + rng.uniform(-0.3, 0.3, n)) / n
    r = radius * rng.uniform(0.6, 1.0, n)
    return np.stack([cx + r * np.cos(a), cy + r * np.sin(a)], 1).astype(np.float32)


def geometry(rng, hyp, mosaic=True):
    centre = draw_mosaic_centre(rng, S) if mosaic else None
    return Geometry((1, 2, 3) if mosaic else None, centre, draw_affine(rng, hyp, S))


def segment_tiles(seed):
    """4 tiles of 2, 2, 1 and 1 painted polygons (6 colours; class = colour): (img, Labels with polygons)."""
    rng = np.random.default_rng(seed)
    tiles, cls = [], 0
    for k, n in enumerate((2, 2, 1, 1)):
        h, w = (int(v) for v in rng.integers(180, 360, 2))
        img = noise(h, w, seed * 4 + k)
        polys = [blob(rng, w * (0.28 + 0.44 * j), rng.uniform(0.3, 0.7) * h, min(h, w) * 0.22) for j in range(n)]
        for j, p in enumerate(polys):
            fill(img, p, PALETTE[cls + j])
        boxes = np.array([[*p.min(0), *p.max(0)] for p in polys], np.float32)
        tiles.append((img, Labels(boxes, np.arange(cls, cls + n), polys)))
        cls += n
    return tiles


def fill(img, poly, colour):
    """Paint the pixels whose centres lie inside `poly` (continuous pixel coordinates), sub-pixel exact."""
    cv2.fillPoly(img, [np.round((np.asarray(poly) - 0.5) * 16).astype(np.int32)], colour, cv2.LINE_8, 4)


def check_same_n(lab):
    n = len(lab.boxes)
    assert len(lab.classes) == n
    for f in (lab.polygons, lab.keypoints, lab.corners):
        assert f is None or len(f) == n


@pytest.mark.parametrize("hyp", HYPS)
def test_polygons_land_on_their_paint_and_boxes_frame_it(hyp):
    kept = cut = tighter = 0
    for seed in range(24):
        rng = np.random.default_rng(100 + seed)
        tiles = segment_tiles(seed)
        g = geometry(rng, hyp)
        out, lab = render_labels(tiles, g, S, hyp, np.empty((S, S, 3), np.uint8))
        check_same_n(lab)
        _, boxes, classes = render_geometry([(i, t.boxes, t.classes) for i, t in tiles], g, S, hyp,
                                            np.empty((S, S, 3), np.uint8))
        for box, cls, poly in zip(lab.boxes, lab.classes, lab.polygons):
            mask = colour_mask(out, PALETTE[cls])
            assert mask.any(), (seed, cls)
            assert (poly >= 0).all() and (poly <= S).all()
            # (a) every point on its object's paint (or its anti-aliased border)
            dist = cv2.distanceTransform((~mask).astype(np.uint8), cv2.DIST_L2, 5)
            ij = np.clip(np.floor(poly).astype(int), 0, S - 1)
            assert dist[ij[:, 1], ij[:, 0]].max() <= 2.5, (seed, cls)
            # clipped to what is shown: the polygon covers about the painted pixels, no more
            area, painted = shoelace(poly), mask.sum()
            perimeter = np.linalg.norm(np.diff(np.vstack([poly, poly[:1]]), axis=0), axis=1).sum()
            assert abs(area - painted) <= 1.2 * perimeter + 8, (seed, cls, area, painted)
            # (b) the rebuilt box is the polygon's bounds and frames the paint tightly
            np.testing.assert_allclose(box, [*poly.min(0), *poly.max(0)], atol=1e-3)
            found, _ = paint_bbox(out, PALETTE[cls])
            if (box[2:] - box[:2]).min() > 6:   # (a sliver's shallow edge blurs wider than 2 px along it)
                np.testing.assert_allclose(found, box, atol=2.0)
            kept += 1
            cut += bool((box[:2] <= 0).any() or (box[2:] >= S).any())
            moved = boxes[classes == cls]
            if len(moved):   # never looser than the moved box, much tighter under rotation
                assert (box[:2] >= moved[0, :2] - 1e-3).all() and (box[2:] <= moved[0, 2:] + 1e-3).all()
                tighter += np.prod(box[2:] - box[:2]) < 0.9 * np.prod(moved[0, 2:] - moved[0, :2])
    assert kept >= 50 and cut >= 10
    assert (tighter >= 20) == (hyp is TURNED)


def test_object_without_polygon_keeps_the_box_rule_and_vanished_polygons_drop():
    hyp = TURNED
    for seed in range(10):
        tiles = segment_tiles(seed)
        img, lab = tiles[0]
        tiles[0] = (img, Labels(lab.boxes, lab.classes, [np.zeros((0, 2), np.float32), lab.polygons[1]]))
        g = geometry(np.random.default_rng(seed), hyp)
        _, got = render_labels(tiles, g, S, hyp, np.empty((S, S, 3), np.uint8))
        _, boxes, classes = render_geometry([(i, t.boxes, t.classes) for i, t in tiles], g, S, hyp,
                                            np.empty((S, S, 3), np.uint8))
        sel = got.classes == 0
        np.testing.assert_array_equal(got.boxes[sel], boxes[classes == 0])
        assert all(len(p) == 0 for p in np.array(got.polygons, dtype=object)[sel])
    # a polygon far outside what its tile shows (off the image) vanishes: the object is dropped everywhere
    img = noise(200, 200, 0)
    far = np.array([[400, 400], [450, 400], [450, 450]], np.float32)
    near = np.array([[20, 20], [150, 30], [90, 160]], np.float32)
    lab = Labels(np.array([[20, 20, 150, 160], [20, 20, 150, 160]], np.float32), np.array([0, 1]), [far, near])
    _, got = render_labels([(img, lab)], geometry(np.random.default_rng(0), AugmentHyp(), mosaic=False), S,
                           AugmentHyp(), np.empty((S, S, 3), np.uint8))
    assert got.classes.tolist() == [1] and len(got.polygons) == 1


def pose_tiles(seed, k=2):
    """4 tiles, the first 3 with one object of k keypoint dots of their own colours (visibility 2), the last
    with no object."""
    rng = np.random.default_rng(seed)
    tiles = []
    for t in range(4):
        if t == 3:
            tiles.append((noise(200, 300, seed), Labels.empty_like(tiles[0][1])))
            continue
        h, w = (int(v) for v in rng.integers(180, 360, 2))
        img = noise(h, w, seed * 4 + t)
        pts = np.stack([rng.uniform(0.1, 0.9, k) * w, rng.uniform(0.1, 0.9, k) * h], 1).astype(np.float32)
        for i, (x, y) in enumerate(pts):
            cv2.circle(img, (int(x), int(y)), 5, PALETTE[t * k + i], -1)
        kp = np.concatenate([pts + 0.5, np.full((k, 1), 2.0, np.float32)], 1)[None]
        box = np.array([[*(pts.min(0) - 8), *(pts.max(0) + 8)]], np.float32)
        tiles.append((img, Labels(box, np.array([t]), keypoints=kp)))
    return tiles


@pytest.mark.parametrize("hyp", HYPS)
def test_keypoints_land_on_their_dots_and_outside_ones_are_zero(hyp):
    shown = hidden = 0
    for seed in range(30):
        tiles = pose_tiles(seed)
        g = geometry(np.random.default_rng(seed), hyp)
        out, lab = render_labels(tiles, g, S, hyp, np.empty((S, S, 3), np.uint8), flip_idx=[0, 1])
        check_same_n(lab)
        assert lab.keypoints.shape[1:] == (2, 3)
        for t, kps in zip(lab.classes, lab.keypoints):
            for i, (x, y, v) in enumerate(kps):
                mask = colour_mask(out, PALETTE[t * 2 + i], thr=40)
                if v == 0:
                    assert x == 0 and y == 0
                    # its dot's centre is not on show: at most about half of the dot is left
                    img = tiles[t][0]
                    scale = S / max(img.shape[:2]) * g.affine.zoom
                    whole = colour_mask(img, PALETTE[t * 2 + i], thr=40).sum() * scale ** 2
                    assert mask.sum() < 0.6 * whole, (seed, t, i, mask.sum(), whole)
                    hidden += 1
                    continue
                assert v == 2 and 0 <= x <= S and 0 <= y <= S
                ys, xs = np.nonzero(mask)
                assert len(xs), (seed, t, i)
                assert np.hypot(xs + 0.5 - x, ys + 0.5 - y).min() <= 1.5, (seed, t, i)
                shown += 1
    assert shown >= 60 and hidden >= 5


def test_a_flipped_pose_swaps_left_and_right():
    """Keypoint 0 is the left one (red dot), 1 the right one (blue dot), flip_idx [1, 0]: after a left-right
    flip keypoint 0 is still the left one, now on the blue dot."""
    img = noise(200, 300, 1)
    cv2.circle(img, (80, 100), 6, PALETTE[0], -1)
    cv2.circle(img, (220, 100), 6, PALETTE[2], -1)
    kp = np.array([[[80.5, 100.5, 2], [220.5, 100.5, 2]]], np.float32)
    lab = Labels(np.array([[60, 80, 240, 120]], np.float32), np.array([0]), keypoints=kp)
    for flip, dots in ((0.0, (0, 2)), (1.0, (2, 0))):
        hyp = AugmentHyp(fliplr=flip, scale=0.0, translate=0.0)
        for seed in range(3):
            g = geometry(np.random.default_rng(seed), hyp, mosaic=False)
            assert g.affine.flip_lr == bool(flip)
            out, got = render_labels([(img, lab)], g, S, hyp, np.empty((S, S, 3), np.uint8), flip_idx=[1, 0])
            (left, right), = got.keypoints[:, :, :2]
            assert left[0] < right[0] - 50
            for (x, y), dot in zip((left, right), dots):
                ys, xs = np.nonzero(colour_mask(out, PALETTE[dot]))
                assert abs(xs.mean() + 0.5 - x) < 1.5 and abs(ys.mean() + 0.5 - y) < 1.5
    with pytest.raises(ValueError, match="flip_idx"):
        render_labels([(img, lab)], geometry(np.random.default_rng(0), AugmentHyp(fliplr=1.0), mosaic=False),
                      S, AugmentHyp(fliplr=1.0), np.empty((S, S, 3), np.uint8))


@pytest.mark.parametrize("hyp", HYPS)
def test_oriented_corners_land_on_the_painted_rectangle(hyp):
    whole = 0
    for seed in range(24):
        rng = np.random.default_rng(seed)
        tiles = []
        for t in range(4):
            h, w = (int(v) for v in rng.integers(200, 360, 2))
            img = noise(h, w, seed * 4 + t)
            quad = rect_corners(w / 2, h / 2, w * 0.5, h * 0.25, rng.uniform(0, np.pi))
            fill(img, quad, PALETTE[t])
            tiles.append((img, Labels(np.array([[*quad.min(0), *quad.max(0)]], np.float32), np.array([t]),
                                      corners=quad[None])))
        out, lab = render_labels(tiles, geometry(rng, hyp), S, hyp, np.empty((S, S, 3), np.uint8))
        check_same_n(lab)
        rb = corners_to_rboxes(lab.corners)
        assert ((rb[:, 4] >= 0) & (rb[:, 4] < np.pi / 2)).all()
        for box, cls, quad, r in zip(lab.boxes, lab.classes, lab.corners, rb):
            mask = colour_mask(out, PALETTE[cls])
            found, _ = paint_bbox(out, PALETTE[cls])
            np.testing.assert_allclose(found, box, atol=2.0)
            if not ((quad >= 3).all() and (quad <= S - 3).all()):
                continue
            whole += 1
            dist = cv2.distanceTransform((~mask).astype(np.uint8), cv2.DIST_L2, 5)
            ij = np.floor(quad).astype(int)
            assert dist[ij[:, 1], ij[:, 0]].max() <= 2.0, (seed, cls)
            (cx, cy), (w, h), _ = cv2.minAreaRect(np.argwhere(mask)[:, ::-1].astype(np.float32) + 0.5)
            assert abs(r[0] - cx) < 1.5 and abs(r[1] - cy) < 1.5
            assert abs(max(r[2], r[3]) - max(w, h)) < 3 and abs(min(r[2], r[3]) - min(w, h)) < 3
    assert whole >= 15
