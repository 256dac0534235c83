"""benchmarks/task_sets.py's painted pose and OBB sets (issue 28's A/Bs inside Ultralytics' trainer): each label is
the paint: keypoints on the triangles' corners, in an order flip_idx maps right under a mirror; OBB corners
bounding exactly the painted rectangle; data.yaml with the pose keys."""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import task_sets  # noqa: E402

H, W = 240, 320
GREY = 128


def painted(paint, seed):
    """One painted image on plain grey, its label rows as arrays (pixels), and the painted pixels' mask."""
    img = np.full((H, W, 3), GREY, np.uint8)
    lines = paint(img, np.random.default_rng(seed))
    rows = [np.float32(ln.split()) for ln in lines]
    return img, rows, (img != GREY).any(-1)


def objects(mask):
    n, lab = cv2.connectedComponents(mask.astype(np.uint8))
    return [lab == k for k in range(1, n)]


@pytest.mark.parametrize("seed", range(6))
def test_pose_keypoints_are_the_painted_triangles_corners(seed):
    img, rows, mask = painted(task_sets.paint_pose, seed)
    assert rows and len(objects(mask)) == len(rows)
    for r in rows:
        kpts = r[5:].reshape(3, 3)
        assert r[0] == 0 and (kpts[:, 2] == 2).all()
        xy = kpts[:, :2] * [W, H]
        np.testing.assert_allclose(r[1:5], [*(xy.min(0) + xy.max(0)) / 2 / [W, H], *np.ptp(xy, 0) / [W, H]], atol=2e-6)
        centre = xy.mean(0)
        for p in xy:   # a corner is on the paint, a step outside of it is not
            inside, outside = centre + 0.9 * (p - centre), centre + 1.15 * (p - centre)
            assert mask[int(inside[1]), int(inside[0])]
            if 0 <= outside[0] < W and 0 <= outside[1] < H:
                assert not mask[int(outside[1]), int(outside[0])]
        assert xy[1, 0] < xy[2, 0], "the left base has the smaller x"
        assert xy[0, 1] < xy[1:, 1].min(), "the apex is above the base"


def test_flip_idx_names_a_mirrored_triangles_keypoints():
    """A mirrored triangle's keypoints, reordered by flip_idx, are those of the triangle painted mirrored."""
    for angle in (-30, -12.5, 0, 20, 30):
        x1, y1, side = 40.0, 30.0, 90.0
        kpts = task_sets.pose_triangle(x1, y1, side, angle)
        mirrored = np.stack([W - kpts[:, 0], kpts[:, 1]], 1)[task_sets.POSE_FLIP_IDX]
        np.testing.assert_allclose(mirrored, task_sets.pose_triangle(W - x1 - side, y1, side, -angle), atol=1e-3)
        assert mirrored[1, 0] < mirrored[2, 0]


@pytest.mark.parametrize("seed", range(6))
def test_obb_corners_bound_exactly_the_painted_rectangle(seed):
    img, rows, mask = painted(task_sets.paint_obb, seed)
    blobs = objects(mask)
    assert rows and len(blobs) == len(rows)
    for r in rows:
        corners = (r[1:].reshape(4, 2) * [W, H]).astype(np.float32)
        rect = cv2.minAreaRect(corners)
        (long_side, short_side) = sorted(rect[1], reverse=True)
        lo, hi = task_sets._OBB_ASPECT[int(r[0])]
        assert lo - 0.01 <= long_side / short_side <= hi + 0.01
        inside = np.zeros((H, W), np.uint8)
        cv2.fillPoly(inside, [np.round(corners).astype(np.int32)], 1)
        blob = max(blobs, key=lambda b: (b & inside.astype(bool)).sum())
        grown = cv2.dilate(inside, np.ones((3, 3), np.uint8)).astype(bool)
        assert not (blob & ~grown).any(), "paint outside the labelled corners"
        core = cv2.erode(inside, np.ones((3, 3), np.uint8)).astype(bool)
        assert core.any() and not (core & ~blob).any(), "the labelled rectangle is not all painted"


def test_shapes_pose_and_obb_sets_data_yaml(tmp_path):
    backgrounds = []
    for k in range(4):
        backgrounds.append(tmp_path / f"bg{k}.jpg")
        cv2.imwrite(str(backgrounds[-1]), np.full((H, W, 3), 40 * k, np.uint8))
    (tmp_path / "src" / "images" / "train2017").mkdir(parents=True)
    for p in backgrounds:
        p.rename(tmp_path / "src" / "images" / "train2017" / p.name)
    pose = yaml.safe_load(task_sets.make_shapes_pose(tmp_path / "pose", tmp_path / "src", 6, 2).read_text())
    assert pose["kpt_shape"] == [3, 3] and pose["flip_idx"] == [0, 2, 1] and pose["names"] == {0: "triangle"}
    obb = yaml.safe_load(task_sets.make_shapes_obb(tmp_path / "obb", tmp_path / "src", 6, 2).read_text())
    assert obb["names"] == {0: "rectangle", 1: "bar"} and "kpt_shape" not in obb
    for name, width in (("pose", 1 + 4 + 9), ("obb", 1 + 8)):
        labels = sorted((tmp_path / name / "labels").rglob("*.txt"))
        assert len(labels) == 8
        rows = [ln.split() for p in labels for ln in p.read_text().splitlines()]
        assert rows and all(len(r) == width for r in rows)
        coords = [v for r in rows for k, v in enumerate(r[1:]) if name == "obb" or k < 4 or (k - 4) % 3 != 2]
        assert all(0 <= float(v) <= 1 for v in coords)
        assert name == "obb" or {r[k] for r in rows for k in (7, 10, 13)} == {"2"}
