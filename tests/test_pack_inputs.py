"""Inputs users bring (issue #11): every image packs right or is rejected by name, and no one file
stops the pack. Each case is a generated file; see docs/inputs.md for the table these check."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import image_bytes, jpeg_bytes, paint_image, png_claiming
from test_pack import by_name, rejects, run_pack

from fastfeed import Store
from fastfeed.pack import check

# --- COCO JSON edited by hand ----------------------------------------------------------------------


def test_duplicate_image_ids_reject_every_image_of_the_id_by_name(coco_builder, tmp_path):
    b = coco_builder
    b.add_image("a.jpg", seed=1, boxes=[(1, [10, 10, 20, 20])])
    b.add_image("b.jpg", seed=2, boxes=[(3, [30, 30, 20, 20])])
    b.add_image("c.jpg", seed=3, boxes=[(18, [5, 5, 40, 40])])
    b.data["images"][1]["id"] = 1            # b.jpg now shares a.jpg's id: whose boxes are whose?
    for a in b.data["annotations"]:
        a["image_id"] = 1 if a["image_id"] == 2 else a["image_id"]
    res = run_pack(b.write(), tmp_path / "out")
    store = Store(tmp_path / "out")
    assert [store[i].file_name for i in range(len(store))] == ["c.jpg"]
    np.testing.assert_allclose(store[0].boxes, [[5 / 160, 5 / 120, 45 / 160, 45 / 120]], atol=1e-6)
    got = {(r["file"], r["reason"], r["kind"]) for r in rejects(tmp_path / "out")}
    assert got == {("a.jpg", "duplicate_image_id", "image"), ("b.jpg", "duplicate_image_id", "image")}
    detail = rejects(tmp_path / "out")[0]["detail"]
    assert "image id 1" in detail and "a.jpg, b.jpg" in detail and "2 annotation(s)" in detail
    assert res.report.counts["orphan_annotation"] == 0 and res.report.images_rejected == 2


def test_one_file_listed_twice_is_rejected_not_packed_twice_with_half_its_boxes(coco_builder, tmp_path):
    b = coco_builder
    b.add_image("a.jpg", seed=1, boxes=[(1, [10, 10, 20, 20])])
    b.add_image("a.jpg", seed=1, boxes=[(3, [60, 60, 20, 20])])   # same file, second id, other boxes
    b.add_image("ok.jpg", seed=2, boxes=[(3, [60, 60, 20, 20])])
    res = run_pack(b.write(), tmp_path / "out")
    assert [s.file_name for s in by_name(Store(tmp_path / "out")).values()] == ["ok.jpg"]
    rows = rejects(tmp_path / "out")
    assert [(r["file"], r["reason"]) for r in rows] == [("a.jpg", "duplicate_file_name")] * 2
    assert "ids 1, 2" in rows[0]["detail"] and res.report.counts["unlisted_image"] == 0


def test_annotation_with_a_list_for_image_id_is_malformed_not_a_crash(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 5, 5])])
    coco_builder.data["annotations"].append({"id": 9, "image_id": [1], "category_id": 1, "bbox": [1, 1, 2, 2]})
    res = run_pack(coco_builder.write(), tmp_path / "out")
    assert res.report.counts["malformed_annotation"] == 1 and len(Store(tmp_path / "out")) == 1


# --- one bad file is that file's rejection ---------------------------------------------------------


def test_empty_truncated_and_bomb_files_are_rejected_each_by_name(coco_builder, tmp_path):
    b = coco_builder
    png = image_bytes(paint_image(120, 160, seed=5), "png")
    tif = image_bytes(paint_image(120, 160, seed=6), "tif")
    b.add_image("good.jpg", boxes=[(1, [1, 1, 10, 10])])
    b.add_image("empty.jpg", data=b"")                       # a 0-byte file ended the whole pack with cv2.error
    b.add_image("empty.png", data=b"")
    b.add_image("cut.png", data=png[: len(png) // 2])
    b.add_image("cut.tif", data=tif[:200])
    b.add_image("bomb.png", 100_000, 100_000, data=png_claiming(100_000, 100_000))
    res = run_pack(b.write(), tmp_path / "out", workers=2)
    assert [s.file_name for s in by_name(Store(tmp_path / "out")).values()] == ["good.jpg"]
    got = {r["file"]: (r["reason"], r["detail"]) for r in rejects(tmp_path / "out")}
    assert {k: v[0] for k, v in got.items()} == {
        "empty.jpg": "corrupt_image", "empty.png": "corrupt_image", "cut.png": "corrupt_image",
        "cut.tif": "corrupt_image", "bomb.png": "image_too_large"}
    assert got["empty.jpg"][1] == "DecodeError: empty file (0 bytes)"
    assert "100000x100000 = 10000.0 MP (from the header, not decoded)" in got["bomb.png"][1]
    assert res.report.images_rejected == 5


def test_max_pixels_refuses_from_the_header_and_can_be_raised(coco_builder, tmp_path):
    coco_builder.add_image("big.jpg", 120, 160, boxes=[(1, [1, 1, 10, 10])])
    coco_builder.add_image("small.png", 40, 50, data=image_bytes(paint_image(40, 50), "png"))
    src = coco_builder.write()
    res = run_pack(src, tmp_path / "a", max_pixels=160 * 120 - 1)
    assert [s.file_name for s in by_name(Store(tmp_path / "a")).values()] == ["small.png"]
    assert res.report.counts["image_too_large"] == 1 and "--max-pixels 19199" in rejects(tmp_path / "a")[0]["detail"]
    assert res.manifest["pack_options"]["max_pixels"] == 19199
    assert len(Store(run_pack(src, tmp_path / "b", max_pixels=160 * 120).out)) == 2
    with pytest.raises(ValueError, match="max_pixels must be >= 1"):
        run_pack(src, tmp_path / "c", max_pixels=0)


@pytest.mark.parametrize("exc, reason", [(RuntimeError("boom"), "check_failed"), (MemoryError("no room"), "image_too_large")])
def test_any_exception_on_one_file_rejects_that_file_with_its_type(coco_builder, tmp_path, monkeypatch, exc, reason):
    coco_builder.add_image("a.jpg", seed=1, boxes=[(1, [1, 1, 10, 10])])
    coco_builder.add_image("odd.png", data=image_bytes(paint_image(120, 160), "png"))
    real = check.formats.header_size

    def header_size(data, fmt):
        if fmt == "png":
            raise exc
        return real(data, fmt)

    monkeypatch.setattr(check.formats, "header_size", header_size)
    run_pack(coco_builder.write(), tmp_path / "out")
    assert len(Store(tmp_path / "out")) == 1
    assert [(r["file"], r["reason"], r["detail"]) for r in rejects(tmp_path / "out")] == [
        ("odd.png", reason, f"{type(exc).__name__}: {exc}")]


def test_a_bug_outside_the_image_check_still_surfaces(coco_builder, tmp_path, monkeypatch):
    """The catch-all covers reading the image only: a bug in box handling is not hidden as a rejection."""
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 10, 10])])
    monkeypatch.setattr("fastfeed.pack.process._clean_boxes", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_pack(coco_builder.write(), tmp_path / "out")


def test_decoded_pixels_of_a_good_jpeg_are_unchanged_by_the_check(coco_builder, tmp_path):
    data = jpeg_bytes(paint_image(64, 64, seed=9))
    coco_builder.add_image("a.jpg", 64, 64, data=data)
    run_pack(coco_builder.write(), tmp_path / "out")
    assert Store(tmp_path / "out").get(0, decode=False).data == data
