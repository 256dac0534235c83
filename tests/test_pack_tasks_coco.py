"""COCO segmentation and keypoints packed (issue 28), coco128's own polygons read back, points of EXIF-turned
photos on their painted object, and a store written at format version 3 still read as before."""

from __future__ import annotations

import io
import json
import shutil
import struct
import sys

import cv2
import lmdb
import numpy as np
import pytest
from conftest import CocoBuilder, YoloBuilder
from PIL import Image
from store_helpers import run_pack

from fastfeed import Store, exif
from fastfeed.cli import main
from fastfeed.pack import PackError
from fastfeed.store import format as fmt
from fastfeed.store.format import sha256_file
from fastfeed.store.record import crc32

H, W = 120, 160
KEYPOINT_NAMES = ["nose", "left_eye", "right_eye"]


def _coco(tmp_path, keypoints=False) -> CocoBuilder:
    b = CocoBuilder(tmp_path / "coco", categories=((1, "person"), (3, "car")))
    if keypoints:
        b.data["categories"][0]["keypoints"] = KEYPOINT_NAMES
    return b


def _annotate(b: CocoBuilder, image_id: int, **fields) -> None:
    """Add fields (segmentation, keypoints) to image `image_id`'s annotations, in order."""
    anns = [a for a in b.data["annotations"] if a["image_id"] == image_id]
    for a, value in zip(anns, fields["values"]):
        a[fields["key"]] = value


def test_coco_polygons_rle_and_parts_pack_as_rings(tmp_path):
    b = _coco(tmp_path)
    b.add_image("a.jpg", H, W, boxes=[(1, [16, 24, 64, 48]), (3, [80, 10, 40, 40]), (1, [0, 0, 10, 10], 1),
                                      (3, [10, 60, 60, 40]), (1, [100, 70, 50, 40])])
    crowd = {"counts": [0, H * W], "size": [H, W]}
    square = np.zeros((H, W), np.uint8)
    square[20:40, 90:110] = 1   # an uncompressed RLE: column-major runs from background
    runs, flat = [], square.T.ravel()
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    polygon = [16, 24, 80, 24, 80, 72, 16, 72]
    _annotate(b, 1, key="segmentation", values=[
        [polygon], {"counts": runs, "size": [H, W]}, crowd,
        [[10, 60, 30, 60, 30, 100], [50, 60, 70, 60, 70, 100]], []])
    res = run_pack(b.write(), tmp_path / "o", task="segment")
    c = res.report.counts
    assert c["rle_to_polygon"] == 1 and c["polygon_parts_joined"] == 1 and c["box_without_polygon"] == 1
    assert c["crowd"] == 1   # the crowd region stays a crowd box, with no polygon
    r = Store(tmp_path / "o").record(0)
    assert len(r.boxes) == len(r.polygons) == 4 and len(r.crowd_boxes) == 1
    np.testing.assert_allclose(r.polygons[0], np.reshape(polygon, (-1, 2)) / (W, H), rtol=1e-6)
    mask = np.zeros((H, W), np.uint8)
    cv2.fillPoly(mask, [np.round(r.polygons[1] * (W, H)).astype(np.int32)], 1)
    assert (mask[20:40, 90:110] == 1).all() and mask.sum() <= 21 * 21   # the traced outline covers the square
    joined = np.zeros((H, W), np.uint8)
    cv2.fillPoly(joined, [np.round(r.polygons[2] * (W, H)).astype(np.int32)], 1)
    assert joined[90, 25] == 1 and joined[90, 65] == 1 and joined[90, 45] == 0   # both parts, not between
    assert r.polygons[3].shape == (0, 2)


def _square_rle_source(tmp_path, counts) -> CocoBuilder:
    b = _coco(tmp_path)
    b.add_image("a.jpg", H, W, boxes=[(1, [90, 20, 20, 20]), (3, [16, 24, 64, 48])])
    _annotate(b, 1, key="segmentation", values=[{"counts": counts, "size": [H, W]}, [[16, 24, 80, 24, 80, 72]]])
    return b.write()


def test_compressed_rle_is_traced_by_pycocotools(tmp_path):
    coco_mask = pytest.importorskip("pycocotools.mask")
    square = np.zeros((H, W), np.uint8)
    square[20:40, 90:110] = 1
    counts = coco_mask.encode(np.asfortranarray(square))["counts"].decode()
    res = run_pack(_square_rle_source(tmp_path, counts), tmp_path / "o", task="segment")
    assert res.report.counts["rle_to_polygon"] == 1
    poly = Store(tmp_path / "o").record(0).polygons[0] * (W, H)
    np.testing.assert_allclose([poly[:, 0].min(), poly[:, 1].min(), poly[:, 0].max(), poly[:, 1].max()],
                               [90, 20, 109, 39], atol=1e-4)


def test_compressed_rle_without_pycocotools_is_dropped_by_name(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pycocotools", None)   # not installed: its import fails
    res = run_pack(_square_rle_source(tmp_path, "Z8g1;000"), tmp_path / "o", task="segment")
    assert res.report.counts["rle_not_decoded"] == 1
    assert "pip install pycocotools" in res.report.examples["rle_not_decoded"][0]
    assert len(Store(tmp_path / "o").record(0).boxes) == 1


def test_coco_keypoints_pack_with_their_visibility_and_a_flip_from_their_names(tmp_path):
    b = _coco(tmp_path, keypoints=True)
    b.add_image("a.jpg", H, W, boxes=[(1, [16, 24, 64, 48]), (1, [80, 10, 40, 40]), (1, [10, 60, 60, 40]),
                                      (1, [5, 5, 20, 20])])
    _annotate(b, 1, key="keypoints", values=[[40, 30, 2, 50, 30, 1, 0, 0, 0], [90, 20, 2], None, ["a"] * 9])
    res = run_pack(b.write(), tmp_path / "o", task="pose")
    m = res.manifest
    assert (m.task, m.kpt_shape, m.flip_idx) == ("pose", [3, 3], [0, 2, 1])
    assert res.report.counts["keypoint_count"] == 1 and res.report.counts["box_without_keypoints"] == 1
    assert res.report.counts["malformed_annotation"] == 1   # nine values, not numbers: not a count to fix
    assert "keypoints that are not all numbers" in res.report.examples["malformed_annotation"][0]
    r = Store(tmp_path / "o").record(0)
    np.testing.assert_allclose(r.keypoints[0], [[40 / W, 30 / H, 2], [50 / W, 30 / H, 1], [0, 0, 0]], rtol=1e-6)
    assert len(r.boxes) == 2 and (r.keypoints[1] == 0).all()


def test_coco_pose_without_keypoint_names_and_coco_obb_stop(tmp_path):
    b = _coco(tmp_path)
    b.add_image("a.jpg", H, W, boxes=[(1, [16, 24, 64, 48])])
    b.write()
    with pytest.raises(PackError, match="no category lists 'keypoints'"):
        run_pack(tmp_path / "coco", tmp_path / "o", task="pose")
    with pytest.raises(PackError, match="--task obb reads YOLO labels .its oriented boxes are not a COCO field.*pack it with --task detect or segment"):
        run_pack(tmp_path / "coco", tmp_path / "o", task="obb")


def test_coco_polygon_far_outside_is_dropped_by_name(tmp_path):
    b = _coco(tmp_path)
    b.add_image("a.jpg", H, W, boxes=[(1, [16, 24, 64, 48]), (3, [80, 10, 40, 40])])
    _annotate(b, 1, key="segmentation", values=[[[16, 24, 800, 24, 80, 72]], [[80, 10, 120, 10, 120, 50]]])
    res = run_pack(b.write(), tmp_path / "o", task="segment")
    assert res.report.counts["points_far_outside"] == 1
    assert len(Store(tmp_path / "o").record(0).boxes) == 1


def test_coco128_polygons_read_back_as_the_json_has_them(coco128, tmp_path):
    res = run_pack(coco128, tmp_path / "o", format="coco", task="segment", workers=2)
    assert res.manifest.task == "segment" and res.manifest.stats["geometry"]["polygons"] > 500
    data = json.loads((coco128 / "annotations" / "instances_train2017.json").read_text())
    images = {im["id"]: im for im in data["images"]}
    store = Store(tmp_path / "o")
    by_name = {store.record(i).file_name: i for i in range(len(store))}
    checked = 0
    for a in data["annotations"]:
        seg = a["segmentation"]
        if a["iscrowd"] or not isinstance(seg, list) or len(seg) != 1 or checked >= 20:
            continue
        im = images[a["image_id"]]
        want = np.reshape(seg[0], (-1, 2)) / (im["width"], im["height"])
        if want.min() < 0 or want.max() > 1:
            continue   # clipped points are tested elsewhere
        r = store.record(by_name[im["file_name"]])
        found = [p for p in r.polygons if p.shape == want.shape and np.allclose(p, want, rtol=0, atol=1e-6)]
        assert found, f"{im['file_name']}: annotation {a['id']}'s polygon not in its record"
        np.testing.assert_array_equal(found[0], want.astype(np.float32))
        checked += 1
    assert checked == 20


def _turned_file(upright: np.ndarray, orientation: int) -> bytes:
    stored = exif.apply_orientation(upright, {6: 8, 8: 6}.get(orientation, orientation))
    tag = Image.Exif()
    tag[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(stored).save(buf, "PNG", exif=tag.tobytes())
    return buf.getvalue()


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_points_of_an_exif_turned_photo_land_on_their_object_as_its_box_does(tmp_path, orientation):
    img = np.full((H, W, 3), 120, np.uint8)
    tri = np.array([[30, 20], [90, 30], [50, 80]])
    cv2.fillPoly(img, [tri], (230, 20, 20))
    b = YoloBuilder(tmp_path / "y", names=["a"])
    b.add("1", [" ".join(["0", *map(str, (tri / (W, H)).ravel())])], data=_turned_file(img, orientation), ext=".png")
    (tmp_path / "y" / "data.yaml").write_text("names: [a]\nkpt_shape: [1, 3]\nflip_idx: [0]\n")
    res = run_pack(tmp_path / "y", tmp_path / "seg", task="segment")
    assert res.report.counts["oriented"] == 1
    r = Store(tmp_path / "seg").record(0)
    pixels = r.decode()
    assert pixels.shape[:2] == (H, W)
    red = (pixels[..., 0] > 180) & (pixels[..., 1] < 80)
    ys, xs = np.nonzero(red)
    np.testing.assert_allclose(r.boxes[0] * (W, H, W, H), [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], atol=1.5)
    for x, y in r.polygons[0] * (W, H) * 0.9 + tri.mean(0) * 0.1:   # just inside each corner: painted
        assert red[int(y), int(x)]
    centre = tri.mean(0) / (W, H)
    b.add("1", [f"0 0.4 0.4 0.5 0.6 {centre[0]} {centre[1]} 2"], data=_turned_file(img, orientation), ext=".png")
    run_pack(tmp_path / "y", tmp_path / "pose")
    kx, ky, _ = Store(tmp_path / "pose").record(0).keypoints[0, 0] * (W, H, 1)
    assert red[int(ky), int(kx)]


def _as_version_3(store_dir) -> None:
    """Rewrite every record in the FFR1 layout of versions 1-3 (written here from docs/format.md's table, not by
    fastfeed's encoder) and the manifest as version 3, with the shards' sizes and sha256."""
    store = Store(store_dir)
    records = [store.record(i) for i in range(len(store))]
    payloads = [bytes(r.payload) for r in records]
    store.close()
    m = fmt.read_manifest(store_dir / fmt.MANIFEST)
    for k, shard in enumerate(m.shards):
        env = lmdb.open(str(store_dir / shard.file), subdir=False, lock=False)
        with env.begin(write=True) as txn:
            for i in range(shard.start, shard.start + shard.count):
                r = records[i]
                name = r.file_name.encode()
                boxes = np.concatenate([r.boxes, r.crowd_boxes]).astype("<f4")
                classes = np.concatenate([r.classes, r.crowd_classes]).astype("<i4")
                head = struct.pack("<BBHIIIIqIIH", ("jpeg", "cv2", "raw").index(r.codec), 3, r.orientation,
                                   r.height, r.width, r.orig_height, r.orig_width, r.image_id, len(r.boxes),
                                   len(r.crowd_boxes), len(name))
                body = head + name + boxes.tobytes() + classes.tobytes() + payloads[i]
                txn.put(fmt.record_key(i - shard.start), b"FFR1" + struct.pack("<I", crc32(body)) + body)
        env.close()
        m.shards[k] = type(shard)(shard.file, shard.count, (store_dir / shard.file).stat().st_size, shard.start,
                                  sha256_file(store_dir / shard.file))
    d = m.to_json()
    for key in ("task", "kpt_shape", "flip_idx"):
        del d[key]
    d["format_version"] = 3
    (store_dir / fmt.MANIFEST).write_text(json.dumps(d))


def test_a_version_3_store_reads_the_same_boxes(sample_dir, tmp_path, capsys):
    run_pack(sample_dir, tmp_path / "v4")
    shutil.copytree(tmp_path / "v4", tmp_path / "v3")
    _as_version_3(tmp_path / "v3")
    with Store(tmp_path / "v3") as old, Store(tmp_path / "v4") as new:
        assert old.manifest.format_version == 3 and old.manifest.task == "detect" and len(old) == len(new) > 0
        for i in range(len(old)):
            a, b = old.record(i), new.record(i)
            assert a.task == "detect" and a.polygons is None and a.keypoints is None
            np.testing.assert_array_equal(a.boxes, b.boxes)
            np.testing.assert_array_equal(a.classes, b.classes)
            np.testing.assert_array_equal(a.crowd_boxes, b.crowd_boxes)
            assert bytes(a.payload) == bytes(b.payload) and a.file_name == b.file_name
    assert main(["verify", str(tmp_path / "v3"), "--workers", "1", "--quiet"]) == 0
    assert main(["inspect", str(tmp_path / "v3")]) == 0
    out = capsys.readouterr().out
    assert "format v3" in out and "task detect" in out
