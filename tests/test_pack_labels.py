"""Label cases that must come out right or be rejected by name: normalised coordinates far outside 0..1,
COCO bboxes written as numeric strings, and two images that would take one YOLO label file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from store_helpers import rejects, run_pack

from fastfeed import Store
from fastfeed.pack import PackError


def test_a_yolo_box_far_outside_0_1_is_rejected_by_name_small_overshoots_still_clipped(yolo_builder, tmp_path):
    b = yolo_builder(names=["a", "b"])
    b.add("img", ["0 0.5 0.5 100 100",          # pixels where fractions belong: not a full-image box
                  "1 0.5 0.5 0.2 0.2",          # fine
                  "1 0.95 0.5 0.2 0.2",         # overshoots by 0.05: clipped, as before
                  "0 0.5 0.5 1.9 0.2"])         # reaches 0.45 beyond both sides: still clipped
    res = run_pack(b.root, tmp_path / "out")
    c = res.report.counts
    assert c["box_far_outside"] == 1 and c["box_clipped"] == 2
    (r,) = [r for r in rejects(tmp_path / "out") if r["reason"] == "box_far_outside"]
    assert r["file"] == "img.jpg" and r["detail"].startswith("img.txt:1: class 0") and "far outside 0..1" in r["detail"]
    s = Store(tmp_path / "out")[0]
    np.testing.assert_allclose(s.boxes, [[0.4, 0.4, 0.6, 0.6], [0.85, 0.4, 1.0, 0.6], [0.0, 0.4, 1.0, 0.6]],
                               atol=1e-6)


def test_a_coco_box_far_outside_the_image_is_rejected_too(coco_builder, tmp_path):
    coco_builder.add_image("x.jpg", 100, 200, boxes=[(1, [10, 10, 5000, 5000]), (1, [190, 90, 20, 20])])
    res = run_pack(coco_builder.write(), tmp_path / "out")
    assert res.report.counts["box_far_outside"] == 1 and res.report.counts["box_clipped"] == 1
    assert len(Store(tmp_path / "out")[0].boxes) == 1


def test_coco_bboxes_written_as_numeric_strings_are_read_as_numbers(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg", 100, 200, boxes=[(1, ["20", "30.5", "40", "50"]), (3, [" 5", "5", "10", 10])])
    coco_builder.add_image("b.jpg", 100, 200, seed=1, boxes=[(1, ["x", "1", "2", "3"]), (1, ["nan", "1", "2", "3"])])
    src = coco_builder.write()
    res = run_pack(src, tmp_path / "out")
    c = res.report.counts
    assert c["bbox_as_text"] == 2 and c["malformed_annotation"] == 2 and res.manifest.num_boxes == 2
    s = Store(tmp_path / "out")[0]
    np.testing.assert_allclose(s.boxes, [[0.1, 0.305, 0.3, 0.805], [0.025, 0.05, 0.075, 0.15]], atol=1e-6)
    # an export whose every bbox is a string packs its boxes, not an empty store
    data = json.loads(next((src / "annotations").glob("*.json")).read_text())
    assert all(isinstance(v, str) for v in data["annotations"][0]["bbox"])


@pytest.mark.parametrize("names", [("same.jpg", "same.png"), ("a.jpg", "a.JPG")])
def test_two_images_that_share_one_label_file_are_both_rejected_naming_both(yolo_builder, tmp_path, names):
    b = yolo_builder(names=["a"])
    stem = names[0].split(".")[0]
    b.add(stem, ["0 0.5 0.5 0.2 0.2"], ext="." + names[0].split(".")[1])
    b.add(stem, None, ext="." + names[1].split(".")[1], seed=3)
    b.add("other", ["0 0.3 0.3 0.2 0.2"])
    res = run_pack(b.root, tmp_path / "out")
    assert res.report.counts["ambiguous_label"] == 2 and res.report.images_rejected == 2
    found = [r for r in rejects(tmp_path / "out") if r["reason"] == "ambiguous_label"]
    assert sorted(r["file"] for r in found) == sorted(names) and all(r["kind"] == "image" for r in found)
    assert all(f"{names[0]} and {names[1]}" in r["detail"] or f"{names[1]} and {names[0]}" in r["detail"]
               for r in found) and f"labels/train/{stem}.txt" in found[0]["detail"]
    st = Store(tmp_path / "out")
    assert [st[i].file_name for i in range(len(st))] == ["other.jpg"]
    with pytest.raises(PackError, match="ambiguous_label"):
        run_pack(b.root, tmp_path / "strict", on_error="fail")


def test_two_images_of_one_stem_without_a_label_file_are_background_as_before(yolo_builder, tmp_path):
    b = yolo_builder(names=["a"])
    b.add("same", None, ext=".jpg")
    b.add("same", None, ext=".png", seed=2)
    b.add("boxed", ["0 0.5 0.5 0.2 0.2"])
    res = run_pack(b.root, tmp_path / "out")
    assert "ambiguous_label" not in res.report.counts and len(Store(tmp_path / "out")) == 3
