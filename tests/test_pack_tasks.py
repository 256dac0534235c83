"""Packing YOLO segment, pose and OBB labels (issue 28): each format read back exactly, every named reject, the
task chosen by --task or data.yaml's kpt_shape, and what `fastfeed pack` / `inspect` / `verify` say."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import YoloBuilder
from store_helpers import rejects, run_pack

from fastfeed import Store
from fastfeed.cli import main
from fastfeed.pack import PackError

POLY = [0.1, 0.2, 0.5, 0.2, 0.45, 0.6, 0.15, 0.55]
OBB = [0.2, 0.1, 0.6, 0.3, 0.5, 0.5, 0.1, 0.3]
KPTS = [0.3, 0.3, 2, 0.35, 0.3, 1, 0.0, 0.0, 0]   # 3 keypoints: visible, hidden, unlabelled


def _line(cls, vals) -> str:
    return " ".join([str(cls), *map(str, vals)])


def _records(out):
    s = Store(out)
    return s, {s.record(i).file_name: s.record(i) for i in range(len(s))}


def _pose_yaml(root, kpt_shape="[3, 3]", flip="[0, 2, 1]"):
    text = f"names: [person]\nkpt_shape: {kpt_shape}\n" + (f"flip_idx: {flip}\n" if flip else "")
    (root / "data.yaml").write_text(text)


def test_segment_lines_pack_their_exact_points_and_box_lines_keep_no_polygon(tmp_path):
    b = YoloBuilder(tmp_path / "y", names=["a", "b"])
    b.add("1", [_line(0, POLY), "1 0.7 0.7 0.2 0.2"]).add("2", [_line(1, POLY[:6])])
    res = run_pack(tmp_path / "y", tmp_path / "o", task="segment")
    assert res.report.counts["box_without_polygon"] == 1 and not res.report.errors
    store, recs = _records(tmp_path / "o")
    assert store.manifest.task == "segment" and store.manifest.format_version == 4
    r = recs["1.jpg"]
    assert r.task == "segment" and len(r.polygons) == len(r.boxes) == 2
    np.testing.assert_array_equal(r.polygons[0], np.float32(POLY).reshape(-1, 2))
    np.testing.assert_allclose(r.boxes[0], [0.1, 0.2, 0.5, 0.6], atol=1e-7)   # the polygon's bounds
    assert r.polygons[1].shape == (0, 2)
    np.testing.assert_array_equal(recs["2.jpg"].polygons[0], np.float32(POLY[:6]).reshape(3, 2))
    assert store.manifest.stats["geometry"] == {"polygons": 2, "polygon_points": 7}


def test_a_polygon_in_a_detect_pack_is_its_box_and_a_record_holds_no_geometry(tmp_path):
    b = YoloBuilder(tmp_path / "y", names=["a"])
    b.add("1", [_line(0, POLY)])
    res = run_pack(tmp_path / "y", tmp_path / "o")
    assert res.report.counts["polygon_to_box"] == 1 and res.manifest.task == "detect"
    r = Store(tmp_path / "o").record(0)
    assert r.task == "detect" and r.polygons is None and r.keypoints is None and r.corners is None and r.geometry is None
    np.testing.assert_allclose(r.boxes[0], [0.1, 0.2, 0.5, 0.6], atol=1e-7)


def test_obb_lines_pack_their_corners_and_a_box_line_becomes_four(tmp_path):
    b = YoloBuilder(tmp_path / "y", names=["plane", "ship"])
    b.add("1", [_line(0, OBB), "1 0.7 0.7 0.2 0.2"])
    res = run_pack(tmp_path / "y", tmp_path / "o", task="obb")
    assert res.report.counts["box_to_obb"] == 1
    r = Store(tmp_path / "o").record(0)
    np.testing.assert_array_equal(r.corners[0], np.float32(OBB).reshape(4, 2))
    np.testing.assert_allclose(r.boxes[0], [0.1, 0.1, 0.6, 0.5], atol=1e-7)   # the corners' bounds
    np.testing.assert_allclose(r.corners[1], [[0.6, 0.6], [0.8, 0.6], [0.8, 0.8], [0.6, 0.8]], atol=1e-6)


def test_pose_is_chosen_by_data_yaml_and_packs_the_exact_keypoints(tmp_path):
    b = YoloBuilder(tmp_path / "y")
    _pose_yaml(tmp_path / "y")
    b.add("1", [_line(0, [0.4, 0.4, 0.3, 0.3, *KPTS])])
    res = run_pack(tmp_path / "y", tmp_path / "o")   # no --task: data.yaml's kpt_shape means pose
    m = res.manifest
    assert (m.task, m.kpt_shape, m.flip_idx) == ("pose", [3, 3], [0, 2, 1]) and not res.report.errors
    r = Store(tmp_path / "o").record(0)
    np.testing.assert_array_equal(r.keypoints, np.float32(KPTS).reshape(1, 3, 3))
    assert m.stats["geometry"] == {"posed": 1, "keypoints_labelled": 2}


def test_pose_with_two_values_per_keypoint(tmp_path):
    b = YoloBuilder(tmp_path / "y")
    _pose_yaml(tmp_path / "y", "[2, 2]", "[1, 0]")
    b.add("1", ["0 0.4 0.4 0.3 0.3 0.3 0.3 0.5 0.5"])
    run_pack(tmp_path / "y", tmp_path / "o")
    np.testing.assert_array_equal(Store(tmp_path / "o").record(0).keypoints, np.float32([[[0.3, 0.3], [0.5, 0.5]]]))


def test_a_pose_set_packed_for_detection_keeps_the_boxes(tmp_path):
    b = YoloBuilder(tmp_path / "y")
    _pose_yaml(tmp_path / "y")
    b.add("1", [_line(0, [0.4, 0.4, 0.3, 0.3, *KPTS])])
    res = run_pack(tmp_path / "y", tmp_path / "o", task="detect")
    assert res.report.counts["keypoints_dropped"] == 1 and res.manifest.num_boxes == 1 and res.manifest.kpt_shape is None


def test_each_geometry_reject_and_repair_is_named(tmp_path):
    b = YoloBuilder(tmp_path / "y", names=["a"])
    b.add("1", ["0 0.1 0.1 0.2 0.2 0.3 0.3",            # collinear: polygon_degenerate
                "0 -0.05 0.2 0.5 0.2 0.4 0.6",          # a point 8 px left of the image: clipped
                _line(0, POLY)])
    res = run_pack(tmp_path / "y", tmp_path / "s", task="segment")
    assert res.report.counts["polygon_degenerate"] == 1 and res.report.counts["points_clipped"] == 1
    assert [(x["reason"], x["kind"]) for x in rejects(tmp_path / "s")] == [("polygon_degenerate", "label")]
    r = Store(tmp_path / "s").record(0)
    assert len(r.polygons) == 2 and r.polygons[0].min() == 0.0 and len(r.boxes) == 2

    o = YoloBuilder(tmp_path / "obb", names=["a"])
    o.add("1", ["0 0.1 0.1 0.2 0.2 0.3 0.3 0.4 0.4", _line(0, OBB)])
    o.add("2", ["0 0.1 0.1 0.2 0.2 0.3", _line(0, OBB)])   # a line of 6 values: its image is rejected whole
    res = run_pack(tmp_path / "obb", tmp_path / "o", task="obb")
    assert res.report.counts["obb_degenerate"] == 1 and res.report.counts["malformed_line"] == 1
    assert [(x["file"], x["kind"]) for x in rejects(tmp_path / "o") if x["reason"] == "malformed_line"] == [
        ("2.jpg", "image")]

    p = YoloBuilder(tmp_path / "pose")
    _pose_yaml(tmp_path / "pose")
    p.add("1", [_line(0, [0.4, 0.4, 0.3, 0.3, 0.3, 0.3, 2, 3.0, 0.3, 2, 0, 0, 0]),  # 3.0: far outside
                _line(0, [0.5, 0.5, 0.3, 0.3, 0.3, 0.3, 2, 1.1, 0.3, 2, 0, 0, 0]),  # 1.1: outside, hidden
                _line(0, [0.6, 0.6, 0.3, 0.3, *KPTS])])
    p.add("2", [_line(0, [0.4, 0.4, 0.3, 0.3, 0.3, 0.3, 2]), _line(0, [0.6, 0.6, 0.3, 0.3, *KPTS])])  # 1 keypoint, not 3
    res = run_pack(tmp_path / "pose", tmp_path / "p")
    c = res.report.counts
    assert c["malformed_line"] == 1 and c["points_far_outside"] == 1 and c["keypoint_hidden"] == 1
    assert "2.txt:1: 8 values, expected 14" in res.report.examples["malformed_line"][0]   # image 2 rejected whole
    kp = Store(tmp_path / "p").record(0).keypoints
    assert kp.shape == (2, 3, 3) and kp[0, 1, 2] == 0 and kp[0, 0, 2] == 2


def test_a_pose_set_without_flip_idx_is_noted_and_a_wrong_one_stops_the_pack(tmp_path, capsys):
    b = YoloBuilder(tmp_path / "y")
    _pose_yaml(tmp_path / "y", flip=None)
    b.add("1", [_line(0, [0.4, 0.4, 0.3, 0.3, *KPTS])])
    assert main(["pack", str(tmp_path / "y"), "-o", str(tmp_path / "o"), "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "no_flip_idx" in out and "task pose: kpt_shape [3, 3], no flip_idx" in out
    assert Store(tmp_path / "o").manifest.flip_idx is None
    _pose_yaml(tmp_path / "y", flip="[0, 1]")
    assert main(["pack", str(tmp_path / "y"), "-o", str(tmp_path / "o2"), "--workers", "1", "--quiet"]) != 0
    assert "flip_idx [0, 1] is not an order of the 3 keypoints" in capsys.readouterr().err


def test_task_pose_without_a_keypoint_shape_stops_the_pack(tmp_path):
    b = YoloBuilder(tmp_path / "y", names=["a"])
    b.add("1", ["0 0.5 0.5 0.2 0.2"])
    with pytest.raises(PackError, match="--task pose, but .* gives no keypoint shape: add `kpt_shape"):
        run_pack(tmp_path / "y", tmp_path / "o", task="pose")
    assert not (tmp_path / "o").exists()


def test_inspect_and_verify_show_and_check_the_task(tmp_path, capsys):
    b = YoloBuilder(tmp_path / "y", names=["a"])
    b.add("1", [_line(0, POLY), _line(0, POLY[:6])])
    assert main(["pack", str(tmp_path / "y"), "-o", str(tmp_path / "o"), "--task", "segment", "--workers", "1",
                 "--quiet"]) == 0
    assert "task segment: 2 objects with a polygon, 3.5 points each" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "o")]) == 0
    assert "task segment: 2 objects with a polygon, 3.5 points each on average" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "o"), "--workers", "1", "--quiet"]) == 0


def test_verify_names_a_record_whose_polygon_leaves_the_image(tmp_path, capsys):
    from store_helpers import replace_record

    b = YoloBuilder(tmp_path / "y", names=["a"])
    b.add("1", [_line(0, POLY)])
    run_pack(tmp_path / "y", tmp_path / "o", task="segment")
    replace_record(tmp_path / "o", 0, geometry=[np.float32([[0.1, 0.2], [1.5, 0.2], [0.4, 0.6]])])
    assert main(["verify", str(tmp_path / "o"), "--workers", "1", "--quiet"]) != 0
    assert "1 polygons for 1 boxes, or points outside 0..1" in capsys.readouterr().out


def test_the_source_signature_names_the_task_so_a_detect_store_is_not_reused_for_segment(tmp_path):
    from fastfeed.pack.signature import source_signature
    b = YoloBuilder(tmp_path / "y", names=["a"])
    b.add("1", [_line(0, POLY)])
    sigs = {t: source_signature(tmp_path / "y", "yolo", task=t) for t in ("detect", "segment", "pose", "obb")}
    assert len(set(sigs.values())) == 4
    assert source_signature(tmp_path / "y", "yolo") == sigs["detect"]
