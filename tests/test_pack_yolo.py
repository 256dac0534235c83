"""YOLO layouts, layout detection, and the real coco128 sample in both layouts."""

from __future__ import annotations

import json

import numpy as np
import pytest
from store_helpers import by_name, rejects, run_pack

from fastfeed import Store, codec
from fastfeed.pack import PackError


def test_yolo_labels_parsed_with_names_from_data_yaml(yolo_builder, tmp_path):
    b = yolo_builder(names=["cat", "dog"])
    b.add("0001", ["0 0.5 0.5 0.2 0.4", "1 0.25 0.25 0.1 0.1"], h=100, w=200)
    b.add("0002", None)                                   # no label file: background
    b.add("0003", ["1 0.1 0.1 0.2 0.2 0.3 0.1"], h=50)     # a polygon -> its bounding box
    res = run_pack(b.root, tmp_path / "out")
    store = Store(tmp_path / "out")
    assert store.class_names == ["cat", "dog"] and len(store) == 3
    s = by_name(store)
    np.testing.assert_allclose(s["0001.jpg"].boxes, [[0.4, 0.3, 0.6, 0.7], [0.2, 0.2, 0.3, 0.3]], atol=1e-6)
    assert s["0001.jpg"].classes.tolist() == [0, 1] and s["0001.jpg"].image_id == 1
    np.testing.assert_allclose(s["0003.jpg"].boxes, [[0.1, 0.1, 0.3, 0.2]], atol=1e-6)
    assert len(s["0002.jpg"].boxes) == 0
    assert res.report.counts["background"] == 1 and res.report.counts["polygon_to_box"] == 1


def test_yolo_box_problems_duplicates_and_orphans(yolo_builder, tmp_path):
    b = yolo_builder(names=["a", "b"])
    b.add("img", ["0 0.5 0.5 0.2 0.2",
                  "0 0.5 0.5 0.2 0.2",      # duplicate
                  "1 0.5 0.5 0 0.2",        # zero width
                  "1 1.5 0.5 0.2 0.2",      # fully outside
                  "1 0.95 0.5 0.2 0.2"])    # partly outside: clipped
    b.add("lonely", ["0 0.5 0.5 0.1 0.1"], image=False)
    res = run_pack(b.root, tmp_path / "out")
    c = res.report.counts
    assert c["duplicate_box"] == 1 and c["box_degenerate"] == 1 and c["box_outside"] == 1 and c["box_clipped"] == 1
    assert c["label_without_image"] == 1
    s = Store(tmp_path / "out")[0]
    np.testing.assert_allclose(s.boxes, [[0.4, 0.4, 0.6, 0.6], [0.85, 0.4, 1.0, 0.6]], atol=1e-6)


BAD_LINES = {"short": ("1 0.5 0.5 0.2", "malformed_line", "short.txt:2: 4 values, expected 5"),
             "extra": ("0 0.5 0.5 0.2 0.2 0.7", "malformed_line", "extra.txt:2: 6 values, expected 5"),
             "noclass": ("0.5 0.5 0.2 0.2", "malformed_line", "noclass.txt:2: 4 values, expected 5 (cls cx cy w h)"),
             "word": ("x 0.5 0.5 0.2 0.2", "malformed_line", "word.txt:2: not numbers"),
             "negative": ("-1 0.5 0.5 0.2 0.2", "malformed_line", "negative.txt:2: bad class"),
             "nan": ("0 nan 0.5 0.2 0.2", "malformed_line", "nan.txt:2: bad class or non-finite"),
             "beyond": ("5 0.5 0.5 0.2 0.2", "unknown_class", "beyond.txt:2: class 5, but data.yaml names 2 class(es)")}


def test_a_file_name_that_is_not_utf8_packs_under_an_escaped_name(yolo_builder, tmp_path):
    """A zip made on another system can hold names whose bytes are not UTF-8: the image packs (its name written with
    \\xNN escapes), a label file without an image is rejected by that name, and the rest of the set packs."""
    b = yolo_builder(names=["a"])
    for k in range(10):
        b.add(f"good{k}", ["0 0.5 0.5 0.2 0.2"])
    images, labels = (bytes(d) for d in (b.images_dir, b.labels_dir))
    with open(images + b"/bad\xffname.jpg", "wb") as f:
        f.write((b.images_dir / "good0.jpg").read_bytes())
    with open(labels + b"/bad\xffname.txt", "w") as f:
        f.write("0 0.25 0.25 0.1 0.1\n")
    with open(labels + b"/lonely\xfe.txt", "w") as f:
        f.write("0 0.5 0.5 0.2 0.2\n")
    res = run_pack(b.root, tmp_path / "out")
    store = Store(tmp_path / "out")
    names = by_name(store)
    assert len(store) == 11 and "bad\\xffname.jpg" in names
    np.testing.assert_allclose(names["bad\\xffname.jpg"].boxes, [[0.2, 0.2, 0.3, 0.3]], atol=1e-6)
    assert res.report.counts["label_without_image"] == 1
    assert [r["file"] for r in rejects(tmp_path / "out")] == ["lonely\\xfe.txt"]


def test_without_names_a_huge_class_id_is_a_named_typo_not_a_store_of_that_many_classes(yolo_builder, tmp_path):
    b = yolo_builder()   # no data.yaml: the classes are the ids used
    for k in range(30):
        b.add(f"good{k:02d}", [f"{k % 3} 0.5 0.5 0.2 0.2"])
    b.add("typo", ["1 0.5 0.5 0.2 0.2", "99999999999 0.5 0.5 0.2 0.2"])
    b.add("edge", ["9999 0.5 0.5 0.2 0.2"])   # the largest id still taken as a class
    res = run_pack(b.root, tmp_path / "out")
    assert res.report.counts["unknown_class"] == 1
    row = next(r for r in rejects(tmp_path / "out") if r["file"] == "typo.jpg")
    assert row["reason"] == "unknown_class" and row["detail"].startswith(
        "typo.txt:2: class 99999999999, and no data.yaml names the classes"), row
    store = Store(tmp_path / "out")
    assert len(store) == 31 and len(store.manifest.classes) == 10000


def test_an_image_whose_label_file_cannot_be_read_is_rejected_whole_by_name_not_kept_as_background(
        yolo_builder, tmp_path, capsys):
    from fastfeed.cli import main

    b = yolo_builder(names=["a", "b"])
    for k in range(60):
        b.add(f"good{k:02d}", ["0 0.5 0.5 0.2 0.2"])
    for name, (line, _, _) in BAD_LINES.items():
        b.add(name, ["0 0.5 0.5 0.2 0.2", line, "5 0.1 0.1 0.1 0.1"])   # a good line first: the image still goes
    assert main(["pack", str(b.root), "-o", str(tmp_path / "out"), "--workers", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"{len(BAD_LINES)} image(s) skipped" in out and "malformed_line: label line that is not numbers" in out
    assert "unknown_class: label line whose class id is beyond data.yaml's names, or 10000 or more without names" in out
    store = Store(tmp_path / "out")
    assert len(store) == 60 and not set(BAD_LINES) & {n.split(".")[0] for n in by_name(store)}
    rows = {r["file"]: r for r in rejects(tmp_path / "out")}
    for name, (_, reason, detail) in BAD_LINES.items():
        row = rows[f"{name}.jpg"]
        assert (row["reason"], row["kind"]) == (reason, "image") and row["detail"].startswith(detail), row
        assert row["detail"].endswith("1 more line(s) of it fail too")   # one rejection per image, every line counted


def test_yolo_without_names_takes_classes_from_labels_flat_layout(yolo_builder, tmp_path):
    b = yolo_builder(split=None)
    b.add("a", ["3 0.5 0.5 0.2 0.2"]).add("b", ["0 0.5 0.5 0.2 0.2"], ext=".png",
                                           data=codec.encode_jpeg(np.zeros((8, 8, 3), np.uint8), 90))
    run_pack(b.root, tmp_path / "out")
    store = Store(tmp_path / "out")
    assert store.class_names == ["0", "1", "2", "3"] and len(store) == 2


def test_layout_errors_say_what_was_expected(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackError, match="cannot tell the layout"):
        run_pack(tmp_path / "empty", tmp_path / "o")
    with pytest.raises(PackError, match="nope does not exist; expected a dataset folder"):
        run_pack(tmp_path / "nope", tmp_path / "o")
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(PackError, match="a.txt is a file, not a directory; expected a dataset folder"):
        run_pack(tmp_path / "a.txt", tmp_path / "o")
    with pytest.raises(PackError, match="no dataset given"):
        run_pack(None, tmp_path / "o")


def test_split_choice(coco_builder, tmp_path):
    from conftest import CocoBuilder

    for split in ("train2017", "val2017"):
        b = CocoBuilder(tmp_path / "c", split=split)
        b.add_image(f"{split}.jpg", boxes=[(1, [1, 1, 5, 5])])
        b.write()
    run_pack(tmp_path / "c", tmp_path / "t")  # default train2017 when several
    assert Store(tmp_path / "t")[0].file_name == "train2017.jpg"
    run_pack(tmp_path / "c", tmp_path / "v", split="val2017")
    assert Store(tmp_path / "v")[0].file_name == "val2017.jpg"
    with pytest.raises(PackError, match="available: train2017, val2017"):
        run_pack(tmp_path / "c", tmp_path / "x", split="test")


def test_explicit_ann_and_images(coco_builder, tmp_path):
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 5, 5])])
    root = coco_builder.write()
    run_pack(None, tmp_path / "o", ann=root / "annotations" / "instances_train2017.json", images=coco_builder.images_dir)
    assert len(Store(tmp_path / "o")) == 1
    with pytest.raises(PackError, match="go together"):
        run_pack(None, tmp_path / "p", ann=root / "annotations" / "instances_train2017.json")


# --- the real sample ------------------------------------------------------------------------------

def test_bundled_sample_packs_clean(sample_dir, tmp_path):
    res = run_pack(sample_dir, tmp_path / "s", workers=2)
    assert res.manifest.num_images == 16 and res.report.errors == []
    assert res.report.counts["converted_grayscale"] == 1 and res.report.counts["crowd"] == 1
    attribution = (sample_dir / "ATTRIBUTION.md").read_text()
    ann = json.loads((sample_dir / "annotations" / "instances_train2017.json").read_text())
    assert all(im["license"] in (4, 5, 7) and im["file_name"] in attribution for im in ann["images"])
    assert sum(p.stat().st_size for p in (sample_dir / "images").rglob("*.jpg")) <= 3 * 2**20


def test_coco128_coco_and_yolo_layouts_agree(coco128, tmp_path):
    rc = run_pack(coco128, tmp_path / "c", format="coco", workers=2)   # it holds labels/ too: two layouts
    ry = run_pack(coco128, tmp_path / "y", format="yolo", workers=2)
    c, y = Store(tmp_path / "c"), Store(tmp_path / "y")
    assert len(c) == len(y) == 128
    assert rc.manifest.num_crowd == 10 and rc.manifest.num_boxes == 929 == ry.manifest.num_boxes
    assert ry.report.counts["label_without_image"] == 2 and ry.report.counts["background"] == 2
    ys = by_name(y)
    for i in range(len(c)):
        a = c[i]
        b = ys[a.file_name]
        assert a.image_id == b.image_id and a.orig_size == b.orig_size
        ka, kb = (np.lexsort(np.round(s.boxes, 3).T[::-1]) for s in (a, b))  # same order despite float noise
        np.testing.assert_allclose(a.boxes[ka], b.boxes[kb], atol=2e-4)
        assert a.classes[ka].tolist() == b.classes[kb].tolist()


def test_coco128_every_record_equals_its_source(coco128, tmp_path):
    run_pack(coco128, tmp_path / "c", format="coco", workers=2)
    store = Store(tmp_path / "c")
    ann = json.loads((coco128 / "annotations" / "instances_train2017.json").read_text())
    ids = {c["id"]: k for k, c in enumerate(sorted(ann["categories"], key=lambda c: c["id"]))}
    images = {im["id"]: im for im in ann["images"]}
    for i in range(len(store)):
        s = store.get(i, decode=False)
        im = images[s.image_id]
        assert s.data == (coco128 / "images" / "train2017" / im["file_name"]).read_bytes()
        anns = [a for a in ann["annotations"] if a["image_id"] == s.image_id and not a["iscrowd"]]
        w, h = im["width"], im["height"]
        expect = np.array([[a["bbox"][0] / w, a["bbox"][1] / h, (a["bbox"][0] + a["bbox"][2]) / w,
                            (a["bbox"][1] + a["bbox"][3]) / h] for a in anns]).reshape(-1, 4)
        np.testing.assert_allclose(s.boxes, np.clip(expect, 0, 1), atol=1e-6)
        assert s.classes.tolist() == [ids[a["category_id"]] for a in anns]


def test_source_fingerprint_follows_label_edits(yolo_builder, tmp_path):
    b = yolo_builder(names=["a"])
    b.add("img", ["0 0.5 0.5 0.2 0.2"])
    first = run_pack(b.root, tmp_path / "a").manifest
    again = run_pack(b.root, tmp_path / "b").manifest
    b.add("img", ["0 0.5 0.5 0.3 0.2"], image=False)
    edited = run_pack(b.root, tmp_path / "c").manifest
    assert first.source_fingerprint == again.source_fingerprint != edited.source_fingerprint
    assert first.fingerprint == again.fingerprint != edited.fingerprint
