"""fastfeed.augment: hyp validation, box geometry, letterbox, HSV, mixup, API hygiene.

Geometry of the random affine and the mosaic lives in test_augment_mosaic.py.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
from hsv_reference import hsv_jitter, hsv_lut  # the textbook HSV jitter the package's RGB one is checked against

import fastfeed.augment as aug
from fastfeed.augment import (
    AugmentHyp,
    box_candidates,
    clip_boxes,
    cxcywh_to_xyxy,
    letterbox,
    letterbox_boxes,
    mixup,
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


# --- HSV -------------------------------------------------------------------------------------------

def test_hsv_zero_gains_is_identity_and_draws_nothing():
    img = noisy(40, 50, lo=0, hi=255)
    before = img.copy()
    rng = np.random.default_rng(3)
    state = rng.bit_generator.state
    assert hsv_jitter(img, rng, 0, 0, 0) is img
    assert (img == before).all() and rng.bit_generator.state == state


def test_hsv_lut_wraps_hue_and_clips():
    lut = hsv_lut(5, 2.0, 0.5)
    assert lut.shape == (3, 256) and lut.dtype == np.uint8
    assert lut[0, 178] == 3 and lut[0, 0] == 5
    assert hsv_lut(-5, 1, 1)[0, 2] == 177
    assert lut[1, 100] == 200 and lut[1, 200] == 255 and lut[2, 255] == 128


def test_hsv_jitter_matches_reference_and_stays_in_range():
    img = noisy(64, 80, lo=0, hi=255)
    for seed in range(5):
        work = img.copy()
        out = hsv_jitter(work, np.random.default_rng(seed), 0.5, 1.0, 1.0)
        assert out is work and out.dtype == np.uint8 and out.shape == img.shape
        dh, fs, fv = np.random.default_rng(seed).uniform(-1, 1, 3) * (0.5, 1.0, 1.0)
        hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV).astype(np.int32)
        hsv[..., 0] = (hsv[..., 0] + int(round(dh * 180))) % 180
        hsv[..., 1] = np.clip(np.rint(hsv[..., 1] * (1 + fs)), 0, 255)
        hsv[..., 2] = np.clip(np.rint(hsv[..., 2] * (1 + fv)), 0, 255)
        ref = cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2RGB)
        assert (out == ref).all()
    assert not (out == img).all()


def test_hsv_hue_wraps_end_to_end():
    # pure hue 175 (a red-magenta): a +10 shift must land on hue 5 (orange-red), not clip at 179.
    hsv = np.full((8, 8, 3), (175, 255, 255), np.uint8)
    img = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    seed = next(s for s in range(1000) if round(np.random.default_rng(s).uniform(-1, 1) * 0.1 * 180) == 10)
    hsv_jitter(img, np.random.default_rng(seed), 0.1, 0.0, 0.0)
    assert abs(int(cv2.cvtColor(img, cv2.COLOR_RGB2HSV)[0, 0, 0]) - 5) <= 1


def test_hsv_writes_back_into_views_and_validates():
    rgba = np.random.default_rng(0).integers(0, 256, (30, 40, 4), dtype=np.uint8)
    view = rgba[..., :3]  # pixel stride 4: OpenCV cannot write it in place
    ref = np.ascontiguousarray(view)
    hsv_jitter(ref, np.random.default_rng(1), 0.2, 0.5, 0.5)
    alpha = rgba[..., 3].copy()
    hsv_jitter(view, np.random.default_rng(1), 0.2, 0.5, 0.5)
    assert (view == ref).all() and (rgba[..., 3] == alpha).all()
    with pytest.raises(ValueError, match="hgain"):
        hsv_jitter(ref, np.random.default_rng(0), 0.7, 0.5, 0.5)
    with pytest.raises(ValueError, match="vgain"):
        hsv_jitter(ref, np.random.default_rng(0), 0.1, 0.5, -1)
    with pytest.raises(ValueError, match="rng"):
        hsv_jitter(ref, 0, 0.1, 0.5, 0.5)


# --- mixup -----------------------------------------------------------------------------------------

def test_mixup_blends_and_concatenates():
    a, b = np.full((32, 32, 3), 0, np.uint8), np.full((32, 32, 3), 200, np.uint8)
    ab, bb = np.array([[1, 1, 5, 5]], np.float32), np.array([[2, 2, 9, 9], [3, 3, 8, 8]], np.float32)
    img, boxes, cls = mixup(a, ab, [1], b, bb, [2, 3], np.random.default_rng(0))
    assert img.dtype == np.uint8 and 60 < img[0, 0, 0] < 140 and (img == img[0, 0, 0]).all()
    assert boxes.shape == (3, 4) and boxes.dtype == np.float32 and cls.tolist() == [1, 2, 3]
    img2, _, _ = mixup(a, ab, [1], b, bb, [2, 3], np.random.default_rng(0), out=a)
    assert img2 is a and (a == img).all()
    _, eb, ec = mixup(a, np.zeros((0, 4)), [], b, np.zeros((0, 4)), [], np.random.default_rng(0))
    assert eb.shape == (0, 4) and ec.shape == (0,)
    with pytest.raises(ValueError, match="same shape"):
        mixup(a, ab, [1], b[:16], bb, [2, 3], np.random.default_rng(0))
    with pytest.raises(ValueError, match="classes"):
        mixup(a, ab, [1, 2], b, bb, [2, 3], np.random.default_rng(0))


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
