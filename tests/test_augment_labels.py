"""augment.Labels and the point geometry's pieces: polygon clipping, rotated boxes from corners, the letterbox
path, and labels read from a store record (the painted end-to-end checks are in test_augment_points.py)."""

from __future__ import annotations

import numpy as np
import pytest
from augment_helpers import rect_corners, shoelace

from fastfeed.augment import Labels, clip_polygons, corners_to_rboxes, letterbox_labels
from fastfeed.store.record import encode_record, parse_record


def test_corners_to_rboxes_convention():
    """cx, cy, w, h, angle in [0, pi/2): rebuilding the rectangle from them gives back the same corners."""
    rng = np.random.default_rng(0)
    quads = [rect_corners(*rng.uniform(20, 80, 2), *rng.uniform(5, 40, 2), a)
             for a in [0.0, np.pi / 2, np.pi / 3, -0.4, 2.5, *rng.uniform(-4, 4, 20)]]
    rb = corners_to_rboxes(np.stack(quads))
    assert rb.dtype == np.float32 and rb.shape == (25, 5)
    assert ((rb[:, 4] >= 0) & (rb[:, 4] < np.pi / 2)).all()
    np.testing.assert_allclose(rb[0], [*quads[0].mean(0), *rb[0, 2:4], 0.0], atol=1e-4)
    for q, (cx, cy, w, h, a) in zip(quads, rb):
        back = rect_corners(cx, cy, w, h, a)
        d = np.linalg.norm(q[:, None] - back[None], axis=2).min(1)
        assert d.max() < 1e-2
    assert corners_to_rboxes(np.zeros((0, 4, 2))).shape == (0, 5)


def test_clip_polygons():
    sq = np.array([[-5, -5], [5, -5], [5, 5], [-5, 5]], np.float64)
    tri = np.array([[20, 20], [30, 20], [25, 30]], np.float64)
    concave = np.array([[0, 0], [10, 0], [10, 10], [5, 2], [0, 10]], np.float64)
    pts, cnt = clip_polygons(np.concatenate([sq, np.zeros((0, 2)), tri, concave]), [4, 0, 3, 5],
                             [[0, 0, 10, 10], [0, 0, 1, 1], [0, 0, 10, 10], [0, 0, 10, 6]])
    assert cnt.tolist() == [4, 0, 0, 7]
    np.testing.assert_allclose(sorted(map(tuple, pts[:4])), [(0, 0), (0, 5), (5, 0), (5, 5)])
    # the notch of the concave one stays a notch: 10 x 6 less the part of the notch below y = 6
    np.testing.assert_allclose(pts[4:], [(0, 6), (0, 0), (10, 0), (10, 6), (7.5, 6), (5, 2), (2.5, 6)])
    assert shoelace(pts[4:]) == pytest.approx(60 - 1.25 * 8)


def test_letterbox_labels_and_labels_ops():
    kp = np.array([[[10, 20, 2], [0, 0, 0]]], np.float32)
    lab = Labels(np.array([[10, 20, 30, 40]], np.float32), np.array([3]), keypoints=kp)
    got = letterbox_labels(lab, (0.5, 0.25), (4, 8))
    np.testing.assert_allclose(got.boxes, [[9, 13, 19, 18]])
    np.testing.assert_allclose(got.keypoints, [[[9, 13, 2], [4, 8, 0]]])
    assert lab.keypoints[0, 0, 0] == 10   # not moved in place
    seg = Labels(np.zeros((2, 4), np.float32), np.array([0, 1]), [np.ones((3, 2), np.float32), np.zeros((0, 2))])
    np.testing.assert_allclose(letterbox_labels(seg, 2.0, (1, 1)).polygons[0], np.full((3, 2), 3.0))
    both = Labels.concat([seg, Labels.empty_like(seg), seg])
    assert len(both) == 4 and len(both.polygons) == 4 and both.task == "segment"
    assert both.take(np.array([False, True, True, False])).classes.tolist() == [1, 0]
    with pytest.raises(ValueError, match="tasks"):
        Labels.concat([seg, lab])


@pytest.mark.parametrize("task,extra", [("detect", {}), ("pose", {"keypoints": [[[0.5, 0.5, 2]], [[0, 0, 0]]]}),
                                        ("segment", {"polygons": [[[0, 0], [0.5, 0], [0.5, 0.5]], []]}),
                                        ("obb", {"corners": [[[0, 0], [1, 0], [1, 1], [0, 1]]] * 2})])
def test_labels_of_a_store_record(task, extra):
    buf = encode_record(codec="raw", height=2, width=4, orig_height=2, orig_width=4, image_id=1, file_name="a",
                        boxes=np.array([[0, 0, .5, .5], [.5, .5, 1, 1]], np.float32), classes=np.array([1, 2]),
                        crowd_boxes=np.zeros((0, 4), np.float32), crowd_classes=np.zeros(0, np.int64),
                        payload=bytes(24), task=task,
                        geometry=next(([np.array(v, np.float32) for v in x] for x in extra.values()), None))
    lab = Labels.of_record(parse_record(buf, 0, "s"), 400, 200)
    assert lab.task == task and lab.classes.dtype == np.int64 and lab.classes.tolist() == [1, 2]
    np.testing.assert_allclose(lab.boxes, [[0, 0, 200, 100], [200, 100, 400, 200]])
    if task == "pose":
        np.testing.assert_allclose(lab.keypoints, [[[200, 100, 2]], [[0, 0, 0]]])
    if task == "segment":
        np.testing.assert_allclose(lab.polygons[0], [[0, 0], [200, 0], [200, 100]])
        assert lab.polygons[1].shape == (0, 2)
    if task == "obb":
        np.testing.assert_allclose(lab.corners[1], [[0, 0], [400, 0], [400, 200], [0, 200]])


def test_a_segmented_object_is_judged_by_the_segment_area_threshold_and_a_box_only_one_by_the_box_threshold():
    from fastfeed.augment import AugmentHyp, Labels, paste_labels
    # two identical 40 x 40 squares at x 90..130, one with its polygon, one box only (P = 0), shifted left so
    # that 5 px of their 40 stay in the 64 px output (12.5%: both kept), then 3 px (7.5%: only the segment's
    # 1% threshold keeps it; at a segment threshold of 10% neither is kept).
    square = np.float32([[90, 10], [130, 10], [130, 50], [90, 50]])
    for shift, kept in ((-125.0, (True, True)), (-127.0, (True, False))):
        labels = Labels(np.float32([[90, 10, 130, 50]] * 2), np.int64([0, 1]), [square, np.zeros((0, 2), np.float32)])
        m = np.array([[1.0, 0, shift], [0, 1.0, 0], [0, 0, 1.0]])
        for hyp, expect in ((AugmentHyp(), kept), (AugmentHyp(min_segment_area_ratio=0.1), (kept[1], kept[1]))):
            out = paste_labels([labels], [m], [(0.0, 0.0, 130.0, 60.0)], 64, hyp)
            assert tuple(c in out.classes for c in (0, 1)) == expect, (shift, hyp.min_segment_area_ratio)
