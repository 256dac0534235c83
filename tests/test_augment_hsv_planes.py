"""The loaders' fast HSV jitter agrees with the HSV round trip it replaces."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from augment_helpers import hsv_jitter_to_planes
from hsv_reference import hsv_jitter

from fastfeed import codec
from fastfeed.augment import hue_rotation


@pytest.fixture(scope="module")
def photos(sample_dir):
    files = sorted((sample_dir / "images" / "train2017").glob("*.jpg"))[:8]
    return [cv2.resize(codec.decode_jpeg(f.read_bytes()), (320, 320)) for f in files]


def _fast(img, seed, gains):
    planes = [np.empty(img.shape[:2], np.uint8) for _ in range(3)]
    hsv_jitter_to_planes(img.copy(), planes, np.random.default_rng(seed), *gains, np.empty(img.shape[:2], np.uint8))
    return np.dstack(planes)


def test_agrees_with_the_hsv_round_trip_on_photos(photos):
    gains = (0.015, 0.7, 0.4)  # the YOLO defaults
    diffs, biases = [], []
    for img in photos:
        for seed in range(4):
            exact = hsv_jitter(img.copy(), np.random.default_rng(seed), *gains).astype(float)
            fast = _fast(img, seed, gains)
            diffs.append(np.abs(exact - fast).mean())
            biases.append(np.abs(exact.mean((0, 1)) - fast.mean((0, 1))).max())
    assert np.mean(diffs) < 2.0 and max(diffs) < 8.0      # levels out of 255
    assert np.mean(biases) < 1.5


def test_zero_gains_copy_and_draw_nothing(photos):
    rng = np.random.default_rng(0)
    planes = [np.empty((320, 320), np.uint8) for _ in range(3)]
    hsv_jitter_to_planes(photos[0].copy(), planes, rng, 0.0, 0.0, 0.0, np.empty((320, 320), np.uint8))
    assert np.array_equal(np.dstack(planes), photos[0])
    assert rng.random() == np.random.default_rng(0).random()


def test_value_and_saturation_alone_are_exact_hsv_scalings():
    img = np.array([[[200, 100, 50], [10, 20, 30], [114, 114, 114]]], np.uint8)
    hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV).astype(int)
    out = _fast(img, 3, (0.0, 0.5, 0.0))            # saturation only
    out_hsv = cv2.cvtColor(out, cv2.COLOR_RGB2HSV).astype(int)
    assert (np.abs(out_hsv[..., 2] - hsv[..., 2]) <= 1).all()        # value kept
    assert (np.abs(out_hsv[..., 0] - hsv[..., 0]) <= 2).all()        # hue kept
    assert out[0, 2].tolist() == [114, 114, 114]                      # grey stays grey


def test_hue_turns_red_toward_yellow_for_a_positive_turn():
    red = np.array([[[200, 30, 30]]], np.uint8)
    turned = cv2.transform(red, hue_rotation(0.02))
    assert cv2.cvtColor(turned, cv2.COLOR_RGB2HSV)[0, 0, 0] in (3, 4, 5)   # +7.2 degrees = +3.6 OpenCV units


def test_same_seed_same_output(photos):
    assert np.array_equal(_fast(photos[1], 5, (0.015, 0.7, 0.4)), _fast(photos[1], 5, (0.015, 0.7, 0.4)))
    assert not np.array_equal(_fast(photos[1], 5, (0.015, 0.7, 0.4)), _fast(photos[1], 6, (0.015, 0.7, 0.4)))
