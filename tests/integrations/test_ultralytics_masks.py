"""The masks FastfeedSegmentationTrainer trains on are the ones Ultralytics' validator scores against: the same
polygons give, pixel for pixel, what Ultralytics' own dataset code draws from them (resampled to 1,000 points as
its datasets do, then drawn; overlap and per object)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ultralytics")

from ultralytics.cfg import get_cfg  # noqa: E402
from ultralytics.data.utils import polygons2masks, polygons2masks_overlap  # noqa: E402
from ultralytics.utils.ops import resample_segments  # noqa: E402

from fastfeed.augment.masks import rasterise  # noqa: E402
from fastfeed.integrations.ultralytics.args import task_fields  # noqa: E402


def _polygons(seed: int, size: int, n: int = 10):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        c, r = rng.uniform(0, size, 2), rng.uniform(3, size / 4)
        t = np.linspace(0, 2 * np.pi, int(rng.integers(3, 40)), endpoint=False)
        rad = r * rng.uniform(0.5, 1.0, len(t))
        out.append(np.clip(np.stack([c[0] + rad * np.cos(t), c[1] + rad * np.sin(t)], 1), 0, size).astype(np.float32))
    return out


@pytest.mark.parametrize("ratio", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_segment_trainers_masks_are_ultralytics_own_for_the_same_polygons(seed, ratio):
    size = 128
    polygons = _polygons(seed, size)
    dense = resample_segments([p.copy() for p in polygons])                  # what its datasets hold
    theirs = polygons2masks((size, size), [p.reshape(-1) for p in dense], 1, ratio)
    np.testing.assert_array_equal(rasterise(polygons, size, ratio, False, rule="ultralytics"), theirs)
    over, order = polygons2masks_overlap((size, size), np.stack(dense), ratio)
    ours = rasterise(polygons, size, ratio, True, rule="ultralytics")
    # Ultralytics reorders the objects (largest first) and numbers them in that order; fastfeed keeps the targets'
    # order and numbers by it: the same pixels, renamed
    renamed = np.zeros_like(ours)
    for k, j in enumerate(order):
        renamed[over == k + 1] = j + 1
    np.testing.assert_array_equal(ours, renamed)
    # the exact (centre) rule differs: it is what the trainer must not use
    assert not np.array_equal(rasterise(polygons, size, ratio, False), theirs)


def test_the_segment_trainer_asks_for_ultralytics_mask_rule():
    args = get_cfg(overrides={"mask_ratio": 4, "overlap_mask": True})
    assert task_fields(args, "segment") == {"mask_ratio": 4, "overlap_mask": True, "mask_rule": "ultralytics"}
    assert task_fields(args, "pose") == {}
