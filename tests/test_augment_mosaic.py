"""fastfeed.augment geometry: random affine and mosaic keep boxes on their pixels.

The central check paints solid rectangles in colours no background pixel can have, runs the
augmentation, and compares each returned box with the bounding box of the paint in the output.
"""

from __future__ import annotations

import glob
from pathlib import Path

import cv2
import numpy as np
import pytest
from augment_helpers import (  # noqa: F401
    COLOURS,
    ROTATED,
    check_contract,
    check_painted,
    mosaic,
    paint_bbox,
    painted_tile,
    random_affine,
)
from conftest import COCO128 as COCO128_ROOT

from fastfeed.augment import AugmentHyp, affine_matrix, draw_affine, mosaic_layout
from fastfeed.augment.paste import paste_tile

COCO128 = COCO128_ROOT / "images" / "train2017"










def four_tiles(seed, sizes=None):
    rng = np.random.default_rng(seed)
    tiles = []
    for k in range(4):
        h, w = sizes[k] if sizes else rng.integers(150, 400, 2)
        bw, bh = rng.integers(20, w // 2), rng.integers(20, h // 2)
        x, y = rng.integers(0, w - bw), rng.integers(0, h - bh)
        tiles.append(painted_tile(h, w, (x, y, x + bw, y + bh), COLOURS[k], k, seed=seed * 4 + k))
    return tiles


# --- mosaic ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("hyp,rotated", [(AugmentHyp(), False), (AugmentHyp(fliplr=0.5, flipud=0.5), False),
                                         (ROTATED, True)])
def test_mosaic_boxes_frame_paint(hyp, rotated):
    kept = clipped = 0
    for seed in range(40):
        out, b, c = mosaic(four_tiles(seed), 256, np.random.default_rng(seed), hyp)
        check_contract(out, b, c, 256)
        k, cl = check_painted(out, b, c, 256, rotated)
        kept, clipped = kept + k, clipped + cl
    assert kept >= 60 and clipped >= 5  # the run did exercise clipping


def test_mosaic_without_box_filter_boxes_every_visible_rectangle():
    """With the filter off, a box exists iff its paint is visible; the default filter keeps a subset."""
    loose = AugmentHyp(min_box_side=0.0, min_box_area_ratio=0.0)
    for seed in range(30):
        tiles = four_tiles(seed)
        out, b, c = mosaic(tiles, 256, np.random.default_rng(seed), loose)
        for cls, colour in enumerate(COLOURS):
            found, n = paint_bbox(out, colour)
            sel = b[c == cls]
            if found is not None and n > 4:
                assert len(sel) == 1, (seed, cls, found)
            if len(sel) and ((sel[0, 2:] - sel[0, :2]) > 2).all():
                assert found is not None, (seed, cls, sel)
        out2, b2, c2 = mosaic(tiles, 256, np.random.default_rng(seed), AugmentHyp())
        assert (out2 == out).all() and set(c2.tolist()) <= set(c.tolist())
        for cls in c2.tolist():
            np.testing.assert_array_equal(b2[c2 == cls], b[c == cls])


@pytest.mark.parametrize("hyp", [AugmentHyp(fliplr=0.5, flipud=0.5), ROTATED,
                                 AugmentHyp(degrees=12, shear=3, perspective=0.0005, fliplr=0.5)])
def test_mosaic_has_no_seams_or_smear(hyp):
    """Each output pixel whose centre lands in a tile's region shows that tile, never the grey fill (exactly:
    the warp path copies the mapped quad widened by half a pixel, sampled with the tile's edge replicated).

    Tiles are flat colours with every channel in 160..250, so a blend with grey (114) shows as a
    channel below 150 and a blend with a neighbouring tile as a wrong colour.
    """
    size, m = 160, 6  # masks live on a grid m px wider than the output, so erosion sees past its border
    flat = [(250, 200, 160), (160, 250, 200), (200, 160, 250), (230, 230, 230)]
    empty = (np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    shapes_rng = np.random.default_rng(99)
    ys, xs = np.mgrid[-m:size + m, -m:size + m] + 0.5
    for seed in range(40):
        tiles = [(np.full((*shapes_rng.integers(40, 300, 2), 3), c, np.uint8), *empty) for c in flat]
        out, _, _ = mosaic(tiles, size, np.random.default_rng(seed), hyp)
        rng = np.random.default_rng(seed)
        centre = tuple(rng.uniform(0.5 * size, 1.5 * size, 2))
        matrix = affine_matrix(draw_affine(rng, hyp, size), (size, size), size, hyp.axis_aligned)
        inv = np.linalg.inv(matrix)
        w = inv[2, 0] * xs + inv[2, 1] * ys + inv[2, 2]
        cx = (inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2]) / w
        cy = (inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]) / w
        layout = mosaic_layout([t[0].shape[:2] for t in tiles], size, centre)
        if hyp.axis_aligned:
            edge = seam = np.ones((1, 1), np.uint8)  # exact: every pixel belongs to one tile
        else:
            # A tile drawn later overlaps its neighbour by under a pixel of its widened quad, plus its bilinear
            # footprint (~1.5 source px); never grey inside its own region.
            edge = np.ones((1, 1), np.uint8)
            reach = int(np.ceil(1.5 * max(p[0] for p, _ in layout) * np.sqrt(abs(np.linalg.det(matrix[:2, :2])))))
            seam = np.ones((2 * reach + 1,) * 2, np.uint8)
        outside = np.ones(xs.shape, np.uint8)
        for colour, (_, (x1, y1, x2, y2)) in zip(flat, layout):
            mine = ((cx >= x1) & (cx < x2) & (cy >= y1) & (cy < y2)).astype(np.uint8)
            outside &= 1 - mine
            greyish = out[cv2.erode(mine, edge)[m:-m, m:-m].astype(bool)].min(-1) < 150
            assert not greyish.any(), f"seed {seed}: {int(greyish.sum())} grey-smeared pixels in tile {colour}"
            wrong = np.abs(out[cv2.erode(mine, seam)[m:-m, m:-m].astype(bool)].astype(int) - colour).max(-1) > 1
            assert not wrong.any(), f"seed {seed}: {int(wrong.sum())} wrong pixels in tile {colour}"
        outside = cv2.erode(outside, seam)[m:-m, m:-m].astype(bool)
        assert (out[outside] == 114).all()  # nothing drawn outside the tiles


def test_mosaic_is_resolution_independent():
    """A tile decoded at half resolution (boxes halved) gives nearly the same sample."""
    for seed in range(6):
        tiles = four_tiles(seed, sizes=[(320, 480), (400, 300), (256, 256), (300, 420)])
        half = [(cv2.resize(img, (img.shape[1] // 2, img.shape[0] // 2), interpolation=cv2.INTER_AREA), b / 2, c)
                for img, b, c in tiles]
        a, ab, ac = mosaic(tiles, 256, np.random.default_rng(seed), AugmentHyp())
        h, hb, hc = mosaic(half, 256, np.random.default_rng(seed), AugmentHyp())
        assert np.abs(a.astype(int) - h).mean() < 12
        for cls in set(ac.tolist()) & set(hc.tolist()):
            np.testing.assert_allclose(ab[ac == cls], hb[hc == cls], atol=3.0)


def test_mosaic_deterministic_and_seed_sensitive():
    tiles = four_tiles(1)
    for hyp in (AugmentHyp(), ROTATED):
        a, ab, ac = mosaic(tiles, 128, np.random.default_rng(5), hyp)
        b, bb, bc = mosaic(tiles, 128, np.random.default_rng(5), hyp)
        c, cb, cc = mosaic(tiles, 128, np.random.default_rng(6), hyp)
        assert (a == b).all() and (ab == bb).all() and (ac == bc).all()
        assert not (a == c).all()
    x, xb, _ = random_affine(*tiles[0], 128, np.random.default_rng(5), ROTATED)
    y, yb, _ = random_affine(*tiles[0], 128, np.random.default_rng(5), ROTATED)
    z, _, _ = random_affine(*tiles[0], 128, np.random.default_rng(6), ROTATED)
    assert (x == y).all() and (xb == yb).all() and not (x == z).all()


def test_mosaic_odd_inputs():
    # empty boxes everywhere, grey-looking (R=G=B) tiles, tiny tiles, and strided views
    grey = np.repeat(np.random.default_rng(0).integers(0, 256, (90, 70, 1), dtype=np.uint8), 3, axis=2)
    big = np.random.default_rng(1).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    rgba = np.random.default_rng(2).integers(0, 256, (60, 80, 4), dtype=np.uint8)
    empty = (np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    tiles = [(grey, *empty), (np.full((5, 7, 3), 200, np.uint8), *empty), (big[10:250, 30:390], *empty),
             (rgba[..., :3], *empty)]
    for hyp in (AugmentHyp(), ROTATED):
        for seed in range(10):
            out, b, c = mosaic(tiles, 96, np.random.default_rng(seed), hyp)
            check_contract(out, b, c, 96)
            assert b.shape == (0, 4) and c.shape == (0,)
        contiguous = [(np.ascontiguousarray(t[0]), *empty) for t in tiles]
        assert (mosaic(tiles, 96, np.random.default_rng(3), hyp)[0]
                == mosaic(contiguous, 96, np.random.default_rng(3), hyp)[0]).all()
    out, b, c = random_affine(np.full((5, 7, 3), 9, np.uint8), [[1, 1, 6, 4]], [2], 64, np.random.default_rng(0))
    check_contract(out, b, c, 64)


def test_mosaic_and_affine_write_into_out():
    tiles = four_tiles(2)
    batch = np.zeros((3, 128, 128, 3), np.uint8)
    res, _, _ = mosaic(tiles, 128, np.random.default_rng(0), AugmentHyp(), out=batch[1])
    assert np.shares_memory(res, batch) and batch[1].any() and not batch[0].any() and not batch[2].any()
    wide = np.zeros((128, 200, 3), np.uint8)  # strided rows: a crop of a wider buffer
    res, _, _ = random_affine(*tiles[0], 128, np.random.default_rng(0), AugmentHyp(), out=wide[:, 20:148])
    assert np.shares_memory(res, wide) and wide[:, 20:148].any() and not wide[:, :20].any()


def test_paste_resize_path_matches_warp_with_realised_matrix():
    """The cv2.resize fast path draws exactly what warpAffine would with the matrix it returns."""
    rng = np.random.default_rng(0)
    for trial in range(16):
        h, w = rng.integers(50, 300, 2)
        img = cv2.resize(rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8), (int(w), int(h)),
                         interpolation=cv2.INTER_CUBIC)
        r, (ox, oy), s = rng.uniform(0.6, 1.2), rng.uniform(-100, 100, 2), rng.uniform(0.5, 1.3)
        region = (max(ox, 0), max(oy, 0), min(ox + w * r, 400), min(oy + h * r, 400))
        m = np.array([[s, 0, rng.uniform(-100, 50)], [0, s, rng.uniform(-100, 50)], [0, 0, 1.0]])
        if trial % 2:
            m[0], m[0, 2] = -m[0], 200 - m[0, 2]
        out = np.zeros((200, 200, 3), np.uint8)
        realised, crop = paste_tile(out, img, (r, ox, oy), region, m)
        cvm = realised.copy()
        cvm[:2, 2] += 0.5 * (cvm[:2, 0] + cvm[:2, 1]) - 0.5  # continuous -> OpenCV pixel-centre convention
        ref = cv2.warpAffine(img, cvm[:2], (200, 200), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        inner = cv2.erode(out.any(-1).astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
        if inner.any():
            assert np.abs(out.astype(int) - ref)[inner].mean() < 0.5


def test_paste_warp_path_keeps_region_clean():
    """Rotated + 6x zoom: bilinear samples at the crop edge must not pull the grey fill inside."""
    rng = np.random.default_rng(0)
    ys, xs = np.mgrid[0:200, 0:200] + 0.5
    for trial in range(8):
        img = np.full((20, 30, 3), (200, 220, 240), np.uint8)
        a = np.radians(rng.uniform(-30, 30))
        m = np.array([[6 * np.cos(a), 6 * np.sin(a), 0], [-6 * np.sin(a), 6 * np.cos(a), 0], [0, 0, 1.0]])
        m[:2, 2] = (100, 100) - m[:2, :2] @ (15, 10)
        region = (0.0, 0.0, 30.0, 20.0) if trial % 2 else (*rng.uniform(2, 6, 2), rng.uniform(22, 28), rng.uniform(14, 18))
        out = np.full((200, 200, 3), 114, np.uint8)
        paste_tile(out, img, (1.0, 0.0, 0.0), region, m)
        inv = np.linalg.inv(m)
        cx, cy = inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2], inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]
        x1, y1, x2, y2 = region
        inside = ((cx >= x1) & (cx < x2) & (cy >= y1) & (cy < y2)).astype(np.uint8)
        inside = cv2.erode(inside, np.ones((3, 3), np.uint8)).astype(bool)  # straddling pixels may mix
        assert (out[inside] == (200, 220, 240)).all()
        # outside, only the bilinear footprint of the edge pixels (<= 2 source px = 12 output px) is drawn
        far = cv2.erode((1 - inside).astype(np.uint8), np.ones((25, 25), np.uint8)).astype(bool)
        assert (out[far] == 114).all()


@pytest.mark.skipif(not COCO128.is_dir(), reason="coco128 sample images not found")
def test_mosaic_on_real_images():
    import simplejpeg

    files = sorted(glob.glob(str(COCO128 / "*.jpg")))[:8]
    imgs = [simplejpeg.decode_jpeg(Path(f).read_bytes(), colorspace="RGB") for f in files]
    for seed in range(4):
        tiles = []
        for k in range(4):
            img = imgs[(seed + k) % len(imgs)]
            h, w = img.shape[:2]
            tiles.append((img, np.array([[w * 0.2, h * 0.2, w * 0.6, h * 0.7]], np.float32), np.array([k])))
        for hyp in (AugmentHyp(), ROTATED):
            out, b, c = mosaic(tiles, 320, np.random.default_rng(seed), hyp)
            check_contract(out, b, c, 320)
            assert (out != 114).any(axis=-1).mean() > 0.3


def test_the_area_rule_judges_what_the_canvas_held_as_ultralytics_does():
    """The 10%-area rule asks what the output crop left of the part of a box the mosaic canvas held (its
    tile's region), as Ultralytics clips to its 2S canvas first. A box cut to 5% by the canvas, shown whole
    in the output, is kept; a box the output crop cuts to under 10% is dropped even though what is left is
    all that was drawn. Under rotation the rule stays against the whole box."""
    from fastfeed.augment.paste import paste_boxes

    box, region = np.array([[0.0, 0.0, 100.0, 10.0]], np.float32), (95.0, 0.0, 200.0, 10.0)
    shift = np.array([[1.0, 0.0, 20.0], [0.0, 1.0, 20.0], [0.0, 0.0, 1.0]])
    kept, cls = paste_boxes([box], [np.array([3])], [shift], [region], 200, AugmentHyp(), [region])
    np.testing.assert_allclose(kept, [[115.0, 20.0, 120.0, 30.0]])
    assert cls.tolist() == [3]
    off = shift.copy()
    off[0, 2] = 105.0                       # the output now shows only x 0..95 of the tile: 5% of the box
    drawn = (0.0, 0.0, 95.0, 10.0)
    kept, _ = paste_boxes([box], [np.array([3])], [off], [drawn], 200, AugmentHyp(), [(0.0, 0.0, 200.0, 10.0)])
    assert len(kept) == 1                   # 95% of it is in the output
    off[0, 2] = 195.0                       # only x 0..5 lands in the 200-px output
    kept, _ = paste_boxes([box], [np.array([3])], [off], [(0.0, 0.0, 5.0, 10.0)], 200, AugmentHyp(),
                          [(0.0, 0.0, 200.0, 10.0)])
    assert len(kept) == 0                   # 5% left by the output crop: dropped, as Ultralytics drops it
    turn = shift.copy()
    turn[:2, :2] = [[0.99, -0.14], [0.14, 0.99]]
    kept, _ = paste_boxes([box], [np.array([3])], [turn], [region], 200, AugmentHyp(), [region])
    assert len(kept) == 0
