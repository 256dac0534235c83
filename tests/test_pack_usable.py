"""Packs whose boxes could not train stop by name, with `fastfeed pack` as a user types it: label files that
yield no box (empty, commas, pixels), COCO bboxes written as fractions, and a folder holding two layouts.
Each stop writes nothing; the option it names packs the same set."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import CocoBuilder, YoloBuilder
from store_helpers import run_pack

from fastfeed import Store
from fastfeed.cli import main
from fastfeed.pack import PackError


def pack_cli(*args) -> int:
    return main(["pack", *map(str, args), "--quiet", "--workers", "1"])


def yolo_set(root, lines_of, n=6, **kw):
    b = YoloBuilder(root, split=None, **kw)
    for k in range(n):
        b.add(f"{k}", lines_of(k), seed=k)
    return b.root


# --- label files that yield no box ----------------------------------------------------------------------------------

def test_label_files_written_with_commas_stop_naming_the_line_and_old_store_stays(tmp_path, capsys):
    good = yolo_set(tmp_path / "good", lambda k: ["0 0.5 0.5 0.2 0.2"])
    out = tmp_path / "x.ff"
    assert pack_cli(good, "-o", out) == 0
    src = yolo_set(tmp_path / "commas", lambda k: [f"{k % 2},0.5,0.5,0.2,0.3"])
    capsys.readouterr()
    assert pack_cli(src, "-o", out, "--force") == 1
    cap = capsys.readouterr()
    assert "nothing usable was packed: all 6 images were rejected" in cap.err and f"{out} is unchanged" in cap.err
    assert ("error      6  malformed_line: label line that is not numbers or has another count of values (image "
            "skipped" in cap.out)
    assert ("0.jpg: malformed_line (0.txt:1: not numbers: '0,0.5,0.5,0.2,0.3': values separated by commas; YOLO "
            "lines are 'class cx cy w h' separated by spaces)") in cap.out
    with Store(out) as st:                                   # --force over a store: the old one is left as it was
        assert len(st) == 6 and st.manifest.num_boxes == 6
    assert pack_cli(src, "-o", tmp_path / "bg.ff", "--allow-background-only") == 1   # not background: unread labels


def test_label_files_in_pixels_are_named_as_pixels(tmp_path, capsys):
    src = yolo_set(tmp_path / "px", lambda k: ["0 70 50 20 10", "1 12 30 8 6"])   # 140x100 images, boxes in px
    assert pack_cli(src, "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert "the labels look like pixels, YOLO wants 0..1: 12 of 12 lines have coordinates over 1" in err
    assert "(e.g. labels/0.txt:1: '0 70 50 20 10')" in err and "box_outside x" in err
    assert not (tmp_path / "x.ff").exists()


def test_empty_label_files_stop_and_are_counted(tmp_path, capsys):
    src = yolo_set(tmp_path / "empty", lambda k: [] if k else None)   # 5 empty files, 1 image without one
    assert pack_cli(src, "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert "1 image(s) have no label file; 5 of the 5 label files are empty." in err
    assert not (tmp_path / "x.ff").exists()


def test_the_rule_is_one_percent_of_packed_images_with_a_kept_box(tmp_path, capsys):
    b = YoloBuilder(tmp_path / "y", split=None)
    for k in range(101):                  # every image has a label file, only image 0 a usable line
        b.add(f"{k:03d}", ["0 0.5 0.5 0.2 0.2"] if k == 0 else ["0 0.5 0.5 0 0.2"], h=32, w=32, seed=k)
    assert pack_cli(b.root, "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert "no boxes: only 1 of the 101 images packed kept a box (under 1%)" in err and "box_degenerate x100" in err
    b.add("001", ["0 0.5 0.5 0.2 0.2"], image=False)             # 2 of 101: a set with a few boxes packs
    assert pack_cli(b.root, "-o", tmp_path / "y.ff") == 1                # ... once its 99 dropped boxes are allowed
    assert "too much dropped: box_degenerate took 99 of the split's 101 boxes (98%, over --max-dropped 0.1)" in (
        capsys.readouterr().err)
    assert pack_cli(b.root, "-o", tmp_path / "y.ff", "--max-dropped", "1") == 0
    assert Store(tmp_path / "y.ff").manifest.num_boxes == 2


def test_a_coco_set_whose_every_box_is_dropped_stops(coco_builder, tmp_path, capsys):
    for k in range(4):
        coco_builder.add_image(f"{k}.jpg", boxes=[(1, [10, 10, 0, 20]), (3, [5, 5, 20, 0])], seed=k)
    assert pack_cli(coco_builder.write(), "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert "no boxes: none of the 4 images packed kept a box" in err and "lists 8 usable annotation(s)" in err
    assert "box_degenerate x8" in err


def test_a_pack_into_a_bucket_that_keeps_no_box_publishes_nothing(s3, bucket, tmp_path, remote_env):
    src = yolo_set(tmp_path / "empty", lambda k: [])
    with pytest.raises(PackError, match="no boxes: none of the 6 images"):
        run_pack(src, f"s3://{bucket}/x.ff")
    def published(prefix):
        listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        return [o["Key"] for o in listed if o["Key"].endswith((".mdb", "manifest.json"))]

    assert published("x.ff/") == []
    run_pack(src, f"s3://{bucket}/bg.ff", allow_background_only=True)     # the same pack, meant: published
    assert "bg.ff/manifest.json" in published("bg.ff/") and len(published("bg.ff/")) == 2


# --- COCO bboxes written as fractions ---------------------------------------------------------------------------------

def _normalised_coco(root):
    b = CocoBuilder(root)
    for k in range(3):
        b.add_image(f"{k}.jpg", h=300, w=400, boxes=[(1, [0.1, 0.2, 0.3, 0.4]), (3, [0.5, 0.5, 0.25, 0.25])], seed=k)
    return b.write()


def test_coco_bboxes_in_0_1_stop_and_coco_boxes_normalized_reads_them(tmp_path, capsys):
    src = _normalised_coco(tmp_path / "norm")
    assert pack_cli(src, "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert "look normalised to 0..1, not in pixels: all 6 fit inside 1x1 pixel on images 300 px or more across" in err
    assert "(e.g. 0.jpg: bbox [0.1, 0.2, 0.3, 0.4])" in err and "--coco-boxes normalized" in err
    assert not (tmp_path / "x.ff").exists()
    assert pack_cli(src, "-o", tmp_path / "x.ff", "--coco-boxes", "normalized") == 0
    with Store(tmp_path / "x.ff") as st:
        assert st.manifest.pack_options["coco_boxes"] == "normalized"
        np.testing.assert_allclose(st[0].boxes, [[0.1, 0.2, 0.4, 0.6], [0.5, 0.5, 0.75, 0.75]], atol=1e-6)


def test_coco_boxes_normalized_on_a_pixel_set_or_a_yolo_set_is_refused(coco_builder, tmp_path, capsys):
    for k in range(3):
        coco_builder.add_image(f"{k}.jpg", boxes=[(1, [10, 10, 40, 30])], seed=k)
    assert pack_cli(coco_builder.write(), "-o", tmp_path / "x.ff", "--coco-boxes", "normalized") == 1
    assert "all 3 bboxes" not in (err := capsys.readouterr().err) and "3 of the 3 bboxes" in err
    assert "they are in pixels; drop --coco-boxes" in err
    src = yolo_set(tmp_path / "y", lambda k: ["0 0.5 0.5 0.2 0.2"])
    assert pack_cli(src, "-o", tmp_path / "y.ff", "--coco-boxes", "normalized") == 1
    assert "--coco-boxes normalized is for a COCO JSON" in capsys.readouterr().err


# --- a folder with two layouts --------------------------------------------------------------------------------------

def _coco_export_with_yolo_labels(root):
    """A flat COCO export (annotations.json + images/) to which YOLO labels/ were added."""
    b = CocoBuilder(tmp := root.parent / f".build-{root.name}")
    for k in range(3):
        b.add_image(f"{k}.jpg", boxes=[(3, [2, 2, 30, 30])], seed=k)
    b.write()
    shutil.copytree(b.images_dir, root / "images")
    shutil.copy(tmp / "annotations" / "instances_train2017.json", root / "annotations.json")
    (root / "labels").mkdir()
    for k in range(3):
        (root / "labels" / f"{k}.txt").write_text("0 0.5 0.5 0.2 0.2\n0 0.3 0.3 0.1 0.1\n")
    shutil.rmtree(tmp)
    return root


def test_a_folder_with_a_coco_json_and_yolo_labels_stops_naming_both(tmp_path, capsys):
    src = _coco_export_with_yolo_labels(tmp_path / "export")
    assert pack_cli(src, "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert (f"{src} holds two layouts, a COCO JSON ({src / 'annotations.json'}) and YOLO labels ({src / 'labels'}/)"
            in err and "choose one with --format coco or --format yolo" in err)
    assert not (tmp_path / "x.ff").exists()
    assert pack_cli(src, "-o", tmp_path / "c.ff", "--format", "coco") == 0
    assert pack_cli(src, "-o", tmp_path / "y.ff", "--format", "yolo") == 0
    assert Store(tmp_path / "c.ff").manifest.num_boxes == 3 and Store(tmp_path / "y.ff").manifest.num_boxes == 6


def test_two_layouts_in_a_split_folder_and_in_the_coco_layout_stop_too(tmp_path, capsys):
    rf = _coco_export_with_yolo_labels(tmp_path / "rf" / "train")   # Roboflow's COCO export: one folder per split
    assert pack_cli(tmp_path / "rf", "-o", tmp_path / "x.ff") == 1
    assert f"{rf} holds two layouts" in capsys.readouterr().err
    b = CocoBuilder(tmp_path / "coco")                              # instances_<split>.json beside labels/<split>/
    for k in range(2):
        b.add_image(f"{k}.jpg", boxes=[(1, [2, 2, 30, 30])], seed=k)
    b.write()
    (b.root / "labels" / "train2017").mkdir(parents=True)
    (b.root / "labels" / "train2017" / "0.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    assert pack_cli(b.root, "-o", tmp_path / "y.ff") == 1
    assert "instances_train2017.json) and YOLO labels" in capsys.readouterr().err
    assert pack_cli(b.root, "-o", tmp_path / "y.ff", "--format", "coco") == 0


def test_roboflows_coco_json_in_the_images_folder_beside_labels_stops_as_two_layouts(tmp_path, capsys):
    from conftest import roboflow_export

    root = roboflow_export(tmp_path / "rf")                      # train/images/ + train/labels/, a data.yaml
    ann = root / "train" / "images" / "_annotations.coco.json"   # the COCO export's file, left in the images folder
    ann.write_text('{"images": [], "annotations": [], "categories": []}')
    assert pack_cli(root, "-o", tmp_path / "x.ff") == 1
    assert (f"{root / 'train'} holds two layouts, a COCO JSON ({ann}) and YOLO labels ({root / 'train' / 'labels'}/)"
            in capsys.readouterr().err)
    assert pack_cli(root, "-o", tmp_path / "y.ff", "--format", "yolo") == 0


# --- how much was dropped -------------------------------------------------------------------------------------------

def test_class_ids_beyond_names_in_over_10_percent_of_images_stop_naming_the_share(tmp_path, capsys):
    src = yolo_set(tmp_path / "ids", lambda k: [f"{3 if k < 2 else 0} 0.5 0.5 0.2 0.2"], n=12, names=["ship"])
    assert pack_cli(src, "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert ("too much dropped: unknown_class took 2 of the split's 12 images (17%, over --max-dropped 0.1)" in err
            and "e.g. 0.jpg: unknown_class (0.txt:1: class 3, but data.yaml names 1 class(es): ids 0..0)" in err)
    assert "give data.yaml's `names` every class the labels use" in err and "--max-dropped 0.17" in err
    assert not (tmp_path / "x.ff").exists()
    assert pack_cli(src, "-o", tmp_path / "x.ff", "--max-dropped", "0.17") == 0
    assert Store(tmp_path / "x.ff").manifest.num_images == 10
    assert pack_cli(src, "-o", tmp_path / "y.ff", "--max-dropped", "1.5") == 2
    assert "max_dropped is a share of the images or boxes, 0..1" in capsys.readouterr().err


def test_dropped_boxes_are_counted_against_the_boxes_not_the_images(tmp_path, capsys):
    lines = ["0 0.5 0.5 0.2 0.2", "0 0.3 0.3 0.2 0.2", "0 0.7 0.7 0.2 0.2", "0 0.2 0.7 0.2 0.2"]
    src = yolo_set(tmp_path / "b", lambda k: lines + (["0 0.5 0.5 0 0.2"] if k < 2 else []), n=6)   # 2 of 26 boxes
    assert pack_cli(src, "-o", tmp_path / "x.ff") == 0                       # 8%: packed
    src = yolo_set(tmp_path / "c", lambda k: lines + (["0 0.5 0.5 0 0.2"] if k < 3 else []), n=6)   # 3 of 27 boxes
    assert pack_cli(src, "-o", tmp_path / "y.ff") == 1
    assert "box_degenerate took 3 of the split's 27 boxes (11%, over --max-dropped 0.1)" in capsys.readouterr().err


def test_over_10_percent_of_images_without_a_label_file_warn_with_the_share_and_an_example(tmp_path, caplog):
    src = yolo_set(tmp_path / "s", lambda k: None if k < 2 else ["0 0.5 0.5 0.2 0.2"], n=12)
    assert pack_cli(src, "-o", tmp_path / "x.ff") == 0
    assert [r.levelname for r in caplog.records if "no label file" in r.message] == ["WARNING"]
    assert (f"2 of the 12 images (17%) have no label file, e.g. {src / 'images' / '0.jpg'} has no "
            f"{src / 'labels' / '0.txt'}: they are packed as background" in caplog.text)
    caplog.clear()
    src = yolo_set(tmp_path / "t", lambda k: None if k < 1 else ["0 0.5 0.5 0.2 0.2"], n=12)     # 8%: no warning
    assert pack_cli(src, "-o", tmp_path / "y.ff") == 0
    assert "no label file" not in caplog.text
