"""`fastfeed pack`: every bad-input case is detected, counted and reported; good input round-trips."""

from __future__ import annotations

import io
import json

import cv2
import numpy as np
import pytest
from conftest import jpeg_bytes, paint_image
from PIL import Image
from store_helpers import by_name, rejects, run_pack  # noqa: F401

from fastfeed import Store, codec
from fastfeed.pack import PackConfig, PackError
from fastfeed.store.format import FormatError

# --- COCO ----------------------------------------------------------------------------------------

def test_coco_round_trip_boxes_pixels_and_ids(coco_builder, tmp_path):
    b = coco_builder
    b.add_image("a.jpg", 120, 160, seed=1, boxes=[(1, [10, 20, 30, 40]), (18, [100.5, 50, 59.5, 70])])
    b.add_image("b.jpg", 90, 60, seed=2, boxes=[(3, [0, 0, 60, 90])])
    res = run_pack(b.write(), tmp_path / "out")
    store = Store(tmp_path / "out")
    assert len(store) == 2 and store.class_names == ["person", "car", "dog"]
    assert store.category_ids == [1, 3, 18]
    s = by_name(store)["a.jpg"]
    assert s.image_id == 1 and s.size == (120, 160) and s.orig_size == (120, 160) and s.codec == "jpeg"
    np.testing.assert_allclose(s.boxes, [[10 / 160, 20 / 120, 40 / 160, 60 / 120], [100.5 / 160, 50 / 120, 1.0, 1.0]], atol=1e-6)
    assert s.classes.tolist() == [0, 2]
    src = (b.images_dir / "a.jpg").read_bytes()
    assert np.array_equal(s.image, codec.decode_jpeg(src))  # original bytes, same pixels
    assert store.get(0, decode=False).data == src
    assert res.manifest.num_boxes == 3 and res.manifest.stats["class_boxes"] == [1, 1, 1]
    assert rejects(tmp_path / "out") == []


def test_corrupt_truncated_missing_and_size_mismatch_are_skipped(coco_builder, tmp_path):
    b = coco_builder
    good = jpeg_bytes(paint_image(64, 64))
    b.add_image("good.jpg", 64, 64, data=good, boxes=[(1, [1, 1, 10, 10])])
    b.add_image("truncated.jpg", 64, 64, data=good[: len(good) // 2])
    b.add_image("garbage.jpg", 64, 64, data=b"this is not an image at all")
    b.add_image("missing.jpg", 64, 64, write=False)
    b.add_image("wrongsize.jpg", 64, 64, ann_size=(50, 64))
    res = run_pack(b.write(), tmp_path / "out")
    assert len(Store(tmp_path / "out")) == 1
    got = {(r["file"], r["reason"]) for r in rejects(tmp_path / "out")}
    assert got == {("truncated.jpg", "corrupt_image"), ("garbage.jpg", "corrupt_image"),
                   ("missing.jpg", "missing_image"), ("wrongsize.jpg", "size_mismatch")}
    assert res.report.images_rejected == 4
    assert "64x50" in next(r for r in rejects(tmp_path / "out") if r["reason"] == "size_mismatch")["detail"]


def test_box_problems_dropped_clipped_and_crowd_kept_apart(coco_builder, tmp_path):
    b = coco_builder
    b.add_image("x.jpg", 100, 200, boxes=[
        (1, [10, 10, 0, 20]),          # zero width
        (1, [10, 10, 20, -5]),         # negative height
        (3, [250, 10, 20, 20]),        # fully outside (right)
        (3, [-20, -20, 10, 10]),       # fully outside (top-left)
        (18, [190, 90, 20, 20]),       # partly outside: clipped
        (99, [5, 5, 10, 10]),          # unknown category
        (1, [0, 0, 200, 100], 1),      # crowd
        (1, [20, 30, 40, 50]),         # fine
    ])
    res = run_pack(b.write(), tmp_path / "out")
    counts = res.report.counts
    assert counts["box_degenerate"] == 2 and counts["box_outside"] == 2 and counts["box_clipped"] == 1
    assert counts["unknown_category"] == 1 and counts["crowd"] == 1
    s = Store(tmp_path / "out")[0]
    np.testing.assert_allclose(s.boxes, [[190 / 200, 0.9, 1.0, 1.0], [0.1, 0.3, 0.3, 0.8]], atol=1e-6)
    assert s.classes.tolist() == [2, 0]
    np.testing.assert_allclose(s.crowd_boxes, [[0, 0, 1, 1]])
    reasons = {r["reason"] for r in rejects(tmp_path / "out")}
    assert reasons == {"box_degenerate", "box_outside", "unknown_category"}  # clipping is a repair, not a loss


def test_background_images_kept_and_counted(coco_builder, tmp_path):
    coco_builder.add_image("bg.jpg")
    coco_builder.add_image("obj.jpg", boxes=[(1, [1, 1, 5, 5])])
    res = run_pack(coco_builder.write(), tmp_path / "out")
    assert len(Store(tmp_path / "out")) == 2 and res.report.counts["background"] == 1


def test_malformed_json_stops_with_a_clear_error(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg")
    root = coco_builder.write()
    ann = root / "annotations" / "instances_train2017.json"
    ann.write_text(ann.read_text()[:-10])
    with pytest.raises(PackError, match="not valid JSON"):
        run_pack(root, tmp_path / "out")
    ann.write_text(json.dumps({"images": [], "annotations": []}))
    with pytest.raises(PackError, match="'categories'"):
        run_pack(root, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_malformed_annotation_entries_and_orphans(coco_builder, tmp_path):
    b = coco_builder
    b.add_image("a.jpg", boxes=[(1, [1, 1, 5, 5])])
    b.data["annotations"] += [{"id": 50, "image_id": 1, "category_id": 1, "bbox": [1, "x", 3, 4]},
                              {"id": 51, "image_id": 777, "category_id": 1, "bbox": [1, 1, 3, 4]},
                              {"id": 52, "category_id": 1}]
    b.data["images"].append({"file_name": "noid.jpg"})
    res = run_pack(b.write(), tmp_path / "out")
    assert res.report.counts["malformed_annotation"] == 3
    assert res.report.counts["orphan_annotation"] == 1
    assert len(Store(tmp_path / "out")) == 1


def _png(img, alpha=False, gray=False, bits16=False):
    arr = cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    if gray:
        arr = cv2.cvtColor(arr, cv2.COLOR_BGR2GRAY)
    if alpha:
        arr = np.dstack([arr, np.full(arr.shape[:2], 200, np.uint8)])
    if bits16:
        arr = arr.astype(np.uint16) * 257
    return cv2.imencode(".png", arr)[1].tobytes()


def test_grayscale_cmyk_png_rgba_converted_to_rgb(coco_builder, tmp_path):
    img = paint_image(48, 64, seed=3)
    buf = io.BytesIO()
    Image.fromarray(img).convert("CMYK").save(buf, "JPEG", quality=95)
    gray_jpeg = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2GRAY))[1].tobytes()  # a 1-channel JPEG
    b = coco_builder
    files = {"gray.jpg": gray_jpeg, "cmyk.jpg": buf.getvalue(), "rgb.png": _png(img), "rgba.png": _png(img, alpha=True),
             "gray16.png": _png(img, gray=True, bits16=True)}
    for name, data in files.items():
        b.add_image(name, 48, 64, data=data, boxes=[(1, [1, 1, 10, 10])])
    res = run_pack(b.write(), tmp_path / "out")
    c = res.report.counts
    assert c["converted_grayscale"] == 2 and c["converted_cmyk"] == 1 and c["converted_rgba"] == 1
    assert c["converted_format"] == 3 and c["converted_16bit"] == 1
    store = Store(tmp_path / "out")
    assert len(store) == 5
    for s in by_name(store).values():
        assert s.image.shape == (48, 64, 3) and s.image.dtype == np.uint8
    got = by_name(store)
    assert np.abs(got["rgb.png"].image.astype(int) - img).max() == 0       # lossless stays lossless
    assert np.abs(got["rgba.png"].image.astype(int) - img).max() == 0      # alpha dropped, colour kept
    assert np.abs(got["cmyk.jpg"].image.astype(int) - img).mean() < 6
    assert got["gray.jpg"].codec == "jpeg" and got["cmyk.jpg"].codec == "cv2"
    g = got["gray.jpg"].image
    assert (g[..., 0] == g[..., 1]).all() and (g[..., 1] == g[..., 2]).all()


def test_on_error_fail_stops_and_leaves_nothing(coco_builder, tmp_path):
    coco_builder.add_image("good.jpg", boxes=[(1, [1, 1, 5, 5])])
    coco_builder.add_image("bad.jpg", data=b"\xff\xd8 broken")
    with pytest.raises(PackError, match="bad.jpg: corrupt_image"):
        run_pack(coco_builder.write(), tmp_path / "out", on_error="fail")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coco"]  # no OUT, no temporary folder


def test_nothing_usable_is_an_error_and_the_reasons_are_still_listed(coco_builder, tmp_path):
    coco_builder.add_image("bad.jpg", data=b"nope")
    src = coco_builder.write()
    with pytest.raises(PackError, match="nothing usable") as e:
        run_pack(src, tmp_path / "out", allow_background_only=True)
    assert e.value.report.counts["corrupt_image"] == 1
    assert e.value.rejects == tmp_path / "out" / "rejects.jsonl" and str(e.value.rejects) in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coco", "out"]          # no lock, no temporary folder
    assert [(r["file"], r["reason"]) for r in rejects(tmp_path / "out")] == [("bad.jpg", "corrupt_image")]
    with pytest.raises(FormatError, match="not a fastfeed store"):
        Store(tmp_path / "out")
    (coco_builder.images_dir / "bad.jpg").write_bytes(jpeg_bytes(paint_image(120, 160)))   # fixed: packs, no --force
    run_pack(src, tmp_path / "out", allow_background_only=True)
    assert len(Store(tmp_path / "out")) == 1 and rejects(tmp_path / "out") == []


def test_nothing_usable_with_force_keeps_the_existing_store(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg")
    src = coco_builder.write()
    run_pack(src, tmp_path / "out", allow_background_only=True)
    (coco_builder.images_dir / "a.jpg").write_bytes(b"")
    with pytest.raises(PackError, match="out is unchanged") as e:
        run_pack(src, tmp_path / "out", overwrite=True, allow_background_only=True)
    assert e.value.rejects == tmp_path / "out.rejects.jsonl" and e.value.rejects.is_file()
    assert len(Store(tmp_path / "out")) == 1


def test_interrupted_pack_leaves_no_store(coco_builder, tmp_path, monkeypatch):
    for k in range(6):
        coco_builder.add_image(f"{k}.jpg", seed=k)
    from fastfeed.pack import writer

    calls = {"n": 0}
    real = writer.ShardWriter.append

    def boom(self, record):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(self, record)

    monkeypatch.setattr(writer.ShardWriter, "append", boom)
    with pytest.raises(KeyboardInterrupt):
        run_pack(coco_builder.write(), tmp_path / "out", allow_background_only=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coco"]


def test_existing_out_needs_force_and_must_be_a_store(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 5, 5])])
    src = coco_builder.write()
    run_pack(src, tmp_path / "out")
    with pytest.raises(PackError, match="already exists; pass --force"):
        run_pack(src, tmp_path / "out")
    run_pack(src, tmp_path / "out", overwrite=True, store="raw")
    assert Store(tmp_path / "out")[0].codec == "raw"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(PackError, match="not a fastfeed store"):
        run_pack(src, tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


@pytest.mark.parametrize("kw, match", [
    ({"store": "webp"}, "store must be one of"),
    ({"store": "original", "max_side": 320}, "max_side applies"),
    ({"store": "jpeg", "quality": 0}, "quality must be 1..100"),
    ({"shards": 0}, "shards must be >= 1"),
    ({"shard_mb": -1}, "shard_mb must be > 0"),
    ({"on_error": "ignore"}, "on_error must be"),
    ({"workers": -2}, "workers must be >= 0"),
    ({"format": "voc"}, "format must be"),
])
def test_bad_options_raise_value_error(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        PackConfig(src=tmp_path, out=tmp_path / "o", **kw)


def test_source_is_never_modified(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 5, 5])])
    src = coco_builder.write()
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    run_pack(src, tmp_path / "out", workers=2, store="jpeg", max_side=64)
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file()} == before


# --- payload modes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["jpeg", "raw"])
def test_resized_modes_keep_boxes_on_the_objects(coco_builder, tmp_path, mode):
    img = np.full((300, 400, 3), 90, np.uint8)
    img[60:180, 100:300] = (250, 20, 20)  # the object: a red rectangle
    coco_builder.add_image("r.jpg", 300, 400, data=jpeg_bytes(img, 95), boxes=[(1, [100, 60, 200, 120])])
    run_pack(coco_builder.write(), tmp_path / "out", store=mode, max_side=100, quality=90)
    s = Store(tmp_path / "out")[0]
    assert s.size == (75, 100) and s.orig_size == (300, 400) and s.codec == mode
    red = (s.image[..., 0] > 170) & (s.image[..., 1] < 90)
    ys, xs = np.nonzero(red)
    x1, y1, x2, y2 = s.boxes[0] * [100, 75, 100, 75]
    assert abs(xs.min() - x1) <= 1 and abs(xs.max() + 1 - x2) <= 1
    assert abs(ys.min() - y1) <= 1 and abs(ys.max() + 1 - y2) <= 1


def test_raw_mode_pixels_equal_the_resized_decode(coco_builder, tmp_path):
    data = jpeg_bytes(paint_image(200, 100, seed=5))
    coco_builder.add_image("a.jpg", 200, 100, data=data)
    run_pack(coco_builder.write(), tmp_path / "out", store="raw", max_side=64, allow_background_only=True)
    s = Store(tmp_path / "out")[0]
    expect, _, _ = codec.decode_fit(data, 64)
    assert s.image.shape == (64, 32, 3) and np.array_equal(s.image, expect)
    assert s.image.flags.writeable


def test_small_images_are_not_enlarged(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg", 40, 30)
    run_pack(coco_builder.write(), tmp_path / "out", store="jpeg", max_side=640, allow_background_only=True)
    assert Store(tmp_path / "out")[0].size == (40, 30)
