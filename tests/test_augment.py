"""fastfeed.augment: hyp validation, box geometry, letterbox, HSV, mixup, API hygiene.

Geometry of the random affine and the mosaic lives in test_augment_mosaic.py.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest
from augment_helpers import hsv_jitter_to_planes

import fastfeed.augment as aug
from fastfeed.augment import (
    AugmentHyp,
    box_candidates,
    clip_boxes,
    cxcywh_to_xyxy,
    letterbox,
    letterbox_boxes,
    transform_boxes,
    xyxy_to_cxcywh,
)

PAINT = np.array([255, 0, 255])


def noisy(h, w, seed=0, lo=90, hi=160):
    """Background far from the paint colour (and never exactly grey 114 when lo > 114)."""
    return np.random.default_rng(seed).integers(lo, hi + 1, (h, w, 3), dtype=np.uint8)


def paint_bbox(img, colour=PAINT, thr=60):
    m = np.abs(img.astype(np.int16) - colour).max(-1) < thr
    if not m.any():
        return None
    ys, xs = np.nonzero(m)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)


# --- hyp -------------------------------------------------------------------------------------------

def test_hyp_defaults_are_yolo_and_frozen():
    h = AugmentHyp()
    assert (h.mosaic, h.mixup, h.degrees, h.translate, h.scale, h.shear) == (1.0, 0.0, 0.0, 0.1, 0.5, 0.0)
    assert (h.fliplr, h.flipud, h.hsv_h, h.hsv_s, h.hsv_v, h.fill) == (0.5, 0.0, 0.015, 0.7, 0.4, 114)
    assert h.axis_aligned and not AugmentHyp(degrees=3).axis_aligned
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.scale = 0.9


@pytest.mark.parametrize("field,value", [
    ("mosaic", 1.5), ("mixup", -0.1), ("degrees", -1), ("degrees", 181), ("translate", 1.2),
    ("scale", 1.0), ("shear", 90), ("fliplr", 2), ("flipud", -1), ("hsv_h", 0.6), ("hsv_s", 1.5),
    ("hsv_v", -0.2), ("fill", 256), ("fill", 1.5), ("fill", True), ("min_box_side", -1),
    ("min_box_area_ratio", 1.1), ("max_box_aspect", 0.5), ("translate", math.nan), ("fliplr", "0.5"),
])
def test_hyp_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"AugmentHyp\.{field}=.*(valid|must be)"):
        AugmentHyp(**{field: value})


# --- boxes -----------------------------------------------------------------------------------------

def test_transform_boxes_scale_flip_rotate():
    b = np.array([[10, 20, 30, 60]], np.float32)
    assert transform_boxes(b, np.eye(3)).tolist() == b.tolist()
    flip = np.array([[-1, 0, 100], [0, 1, 0], [0, 0, 1.0]])
    np.testing.assert_allclose(transform_boxes(b, flip), [[70, 20, 90, 60]])
    rot90 = np.array([[0, 1, 0], [-1, 0, 100], [0, 0, 1.0]])  # (x, y) -> (y, 100 - x)
    np.testing.assert_allclose(transform_boxes(b, rot90), [[20, 70, 60, 90]])
    rot45 = np.array([[math.cos(0.785398), math.sin(0.785398), 0], [-math.sin(0.785398), math.cos(0.785398), 0]])
    out = transform_boxes(np.array([[0, 0, 10, 10]], np.float32), rot45)
    np.testing.assert_allclose(out[0, 2] - out[0, 0], 10 * math.sqrt(2), rtol=1e-5)  # encloses the diamond
    per_box = np.stack([np.eye(3), flip])
    np.testing.assert_allclose(transform_boxes(np.repeat(b, 2, 0), per_box), [[10, 20, 30, 60], [70, 20, 90, 60]])
    assert transform_boxes(np.zeros((0, 4)), flip).shape == (0, 4)
    assert transform_boxes(b, flip).dtype == np.float32


def test_clip_and_candidates():
    b = np.array([[-5, -5, 20, 20], [50, 50, 120, 70], [0, 0, 1.5, 40], [0, 0, 80, 0.5]], np.float32)
    c = clip_boxes(b, 100, 60)
    np.testing.assert_allclose(c, [[0, 0, 20, 20], [50, 50, 100, 60], [0, 0, 1.5, 40], [0, 0, 80, 0.5]])
    keep = box_candidates(b, c)
    # box 1 kept 500/1400 of its area; box 2 is 1.5 px wide; box 3 is 0.5 px high
    assert keep.tolist() == [True, True, False, False]
    assert box_candidates(b, c, min_area_ratio=0.5).tolist() == [True, False, False, False]
    thin = np.array([[0, 0, 500, 4]], np.float32)
    assert not box_candidates(thin, thin, max_aspect=100)[0] and box_candidates(thin, thin, max_aspect=200)[0]
    e = np.zeros((0, 4), np.float32)
    assert box_candidates(e, e).shape == (0,)


def test_cxcywh_roundtrip():
    b = np.array([[10, 20, 30, 60], [0, 0, 640, 480]], np.float32)
    n = xyxy_to_cxcywh(b, 640, 480)
    np.testing.assert_allclose(n[1], [0.5, 0.5, 1, 1])
    np.testing.assert_allclose(cxcywh_to_xyxy(n, 640, 480), b, atol=1e-4)
    assert xyxy_to_cxcywh(np.zeros((0, 4)), 10, 10).shape == (0, 4)


# --- letterbox -------------------------------------------------------------------------------------

@pytest.mark.parametrize("h,w", [(300, 400), (401, 200), (64, 64), (5, 7)])
def test_letterbox_frames_painted_rectangle(h, w):
    img = noisy(h, w)
    box = np.array([[w // 5, h // 4, w // 5 + max(2, w // 3), h // 4 + max(2, h // 2)]], np.float32)
    x1, y1, x2, y2 = box[0].astype(int)
    img[y1:y2, x1:x2] = PAINT
    out, ratio, pad = letterbox(img, 256)
    assert out.shape == (256, 256, 3) and out.dtype == np.uint8
    lb = letterbox_boxes(box, ratio, pad)
    # bilinear ramps are ~1 source pixel wide: the tolerance grows with the upscale factor
    np.testing.assert_allclose(paint_bbox(out), lb[0], atol=2 + 0.5 * max(ratio))
    # padding is fill, centred
    px, py = pad
    assert (out[:py] == 114).all() and (out[:, :px] == 114).all()
    assert abs((256 - round(w * ratio[0])) - 2 * px) <= 1 and abs((256 - round(h * ratio[1])) - 2 * py) <= 1


def test_letterbox_rect_scaleup_and_out_buffer():
    img = noisy(300, 500)
    out, ratio, pad = letterbox(img, 640, rect=True, stride=32)
    assert out.shape == (384, 640, 3) and pad == (0, (384 - 384) // 2)
    small, ratio, pad = letterbox(noisy(100, 120), 640, scaleup=False)
    assert ratio == (1.0, 1.0) and pad == (260, 270) and small.shape == (640, 640, 3)
    buf = np.zeros((640, 640, 3), np.uint8)
    res, _, _ = letterbox(img, 640, fill=0, out=buf)
    assert res is buf and buf[200, 320].any()
    batch = np.zeros((2, 640, 640, 3), np.uint8)
    res, _, _ = letterbox(img, 640, out=batch[1])
    assert np.shares_memory(res, batch) and batch[1].any() and not batch[0].any()
    with pytest.raises(ValueError, match="out must be a uint8 array of shape"):
        letterbox(img, 640, out=np.zeros((640, 600, 3), np.uint8))
    with pytest.raises(ValueError, match="size"):
        letterbox(img, 0)
    with pytest.raises(ValueError, match="fill"):
        letterbox(img, 64, fill=300)


def test_letterbox_noncontiguous_and_bad_images():
    big = noisy(400, 600)
    view = big[50:350, 100:500]
    a, _, _ = letterbox(view, 128)
    b, _, _ = letterbox(np.ascontiguousarray(view), 128)
    assert (a == b).all()
    with pytest.raises(ValueError, match="img must be a uint8 array"):
        letterbox(big.astype(np.float32), 128)
    with pytest.raises(ValueError, match="img must be a uint8 array"):
        letterbox(big[..., 0], 128)
    with pytest.raises(ValueError, match="negative stride"):
        letterbox(big[:, ::-1], 128)


# --- HSV (fastfeed.augment.hsv; its agreement with the textbook HSV round trip: test_augment_hsv_planes.py) --------

def _planes(img, draw):
    planes = [np.empty(img.shape[:2], np.uint8) for _ in range(3)]
    aug.hsv_to_planes(img.copy(), planes, draw, np.empty(img.shape[:2], np.uint8))
    return np.dstack(planes).astype(int)


def test_draw_hsv_zero_gains_draw_nothing_and_gains_bound_the_draws():
    rng = np.random.default_rng(3)
    state = rng.bit_generator.state
    assert aug.draw_hsv(rng, 0, 0, 0) is None and rng.bit_generator.state == state
    draws = np.array([aug.draw_hsv(np.random.default_rng(s), 0.1, 0.5, 0.25) for s in range(400)])
    assert (np.abs(draws[:, 0]) <= 0.1).all() and draws[:, 0].min() < -0.08 and draws[:, 0].max() > 0.08
    assert ((draws[:, 1] >= 0.5) & (draws[:, 1] <= 1.5)).all() and ((draws[:, 2] >= 0.75) & (draws[:, 2] <= 1.25)).all()
    assert aug.draw_hsv(np.random.default_rng(7), 0.1, 0.5, 0.25) == aug.draw_hsv(np.random.default_rng(7), 0.1, 0.5, 0.25)
    with pytest.raises(ValueError, match="hsv_h"):
        AugmentHyp(hsv_h=0.7)


def test_hsv_value_saturation_and_hue_act_as_their_names_say():
    img = noisy(16, 20, lo=20, hi=230)
    assert (_planes(img, None) == img).all()                                # no jitter: the planes are the image
    v = _planes(img, (0.0, 1.0, 0.5))                                         # value x 0.5: every channel halves
    assert np.abs(v - img * 0.5).max() <= 1
    grey = _planes(img, (0.0, 0.0, 1.0))                                      # saturation 0: grey at V (the max)
    assert np.abs(grey - img.max(-1, keepdims=True)).max() <= 1
    red = np.zeros((4, 4, 3), np.uint8)
    red[..., 0] = 200
    turned = _planes(red, (1 / 3, 1.0, 1.0))                                  # a third of the circle: red -> green
    assert turned[..., 1].min() >= 195 and turned[..., [0, 2]].max() <= 5
    assert (_planes(red, (1 / 3 + 1, 1.0, 1.0)) == turned).all()               # hue wraps: one more turn, the same


def test_hsv_jitter_writes_into_a_chw_slot_and_follows_its_draw():
    img = noisy(30, 40, lo=0, hi=255)
    slot = np.zeros((3, 30, 40), np.uint8)
    hsv_jitter_to_planes(img.copy(), [slot[0], slot[1], slot[2]], np.random.default_rng(5), 0.2, 0.5, 0.5,
                         np.empty((30, 40), np.uint8))
    draw = aug.draw_hsv(np.random.default_rng(5), 0.2, 0.5, 0.5)
    assert (np.moveaxis(slot, 0, -1) == _planes(img, draw)).all() and not (np.moveaxis(slot, 0, -1) == img).all()


# --- mixup -----------------------------------------------------------------------------------------

def test_blend_weights_the_first_image():
    a, b = np.full((32, 32, 3), 0, np.uint8), np.full((32, 32, 3), 200, np.uint8)
    assert (aug.blend(a, b, 0.25, np.empty_like(a)) == 150).all()
    assert aug.blend(a, b, aug.draw_mixup_weight(np.random.default_rng(0)), a) is a and 60 < a[0, 0, 0] < 140


# --- API hygiene -----------------------------------------------------------------------------------

def test_module_rules():
    src_dir = Path(aug.__file__).parent
    for path in src_dir.glob("*.py"):
        text = path.read_text()
        n_lines = len(text.splitlines())
        assert n_lines <= 300, f"{path.name} has {n_lines} lines"
        assert not re.search(r"^\s*(import torch|from torch|import random\b|from random\b)", text, re.M), path.name
        for bad in ("np.random.rand", "np.random.seed", "np.random.uniform", "np.random.randint",
                    "np.random.choice", "np.random.beta", "np.random.shuffle"):
            assert bad not in text, f"{path.name} uses global RNG {bad}"
