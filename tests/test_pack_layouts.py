"""Datasets as people download them, packed with the commands a user types: data.yaml, Roboflow's YOLO and
COCO exports, flat COCO folders; and a pack in which (almost) no image has a label stops with a message
that says where labels were looked for."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from conftest import CocoBuilder, YoloBuilder, jpeg_bytes, paint_image, roboflow_export

from fastfeed import Store, sample_path
from fastfeed.cli import main


def pack_cli(*args) -> int:
    return main(["pack", *map(str, args), "--quiet", "--workers", "1"])


# --- no labels: a layout mistake, not a dataset ---------------------------------------------------------------------

def test_yolo_folder_without_labels_stops_and_says_where_it_looked(tmp_path, capsys):
    images = tmp_path / "ds" / "images"
    images.mkdir(parents=True)
    for k in range(23):
        (images / f"{k:03d}.jpg").write_bytes(jpeg_bytes(paint_image(40, 50, seed=k)))
    assert pack_cli(tmp_path / "ds", "--format", "yolo", "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert "no labels: none of the 23 images in" in err and str(images) in err
    assert f"looked for {tmp_path / 'ds' / 'labels'}/<image name>.txt (e.g. {tmp_path / 'ds' / 'labels' / '000.txt'})" in err
    assert "does not exist" in err and "Layouts fastfeed reads" in err and "Roboflow" in err
    assert "--allow-background-only" in err and not (tmp_path / "x.ff").exists()
    assert pack_cli(tmp_path / "ds", "--format", "yolo", "-o", tmp_path / "x.ff", "--allow-background-only") == 0
    assert "23 images, 0 boxes" in capsys.readouterr().out


def test_a_coco_folder_read_as_yolo_is_named_coco(tmp_path, capsys):
    b = CocoBuilder(tmp_path / "coco")
    for k in range(3):
        b.add_image(f"{k}.jpg", boxes=[(1, [1, 1, 20, 20])])
    b.write()
    assert pack_cli(tmp_path / "coco", "--format", "yolo", "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert "none of the 3 images" in err and "instances_train2017.json suggests a COCO dataset: drop --format yolo" in err


def test_almost_no_labels_stops_too_and_label_files_that_match_nothing_are_counted(tmp_path, capsys):
    b = YoloBuilder(tmp_path / "y", split=None)
    for k in range(101):
        b.add(f"{k:03d}", ["0 0.5 0.5 0.2 0.2"] if k == 0 else None, h=32, w=32, seed=k)
    for k in range(5):                                   # labels under other names: they match no image
        (b.labels_dir / f"IMG_{k}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    assert pack_cli(b.root, "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert "no labels: only 1 of the 101 images in" in err and "has a label file (under 1%)" in err
    assert "the 5 label file(s) there match no image's name" in err
    b.add("100", ["0 0.5 0.5 0.2 0.2"], image=False)     # 2 of 101 labelled: packs
    assert pack_cli(b.root, "-o", tmp_path / "y.ff") == 0


def test_coco_file_without_annotations_stops(coco_builder, tmp_path, capsys):
    coco_builder.add_image("a.jpg")
    coco_builder.add_image("b.jpg")
    src = coco_builder.write()
    assert pack_cli(src, "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert "no labels: none of the 2 images listed in" in err and "instances_train2017.json has a box" in err
    assert pack_cli(src, "-o", tmp_path / "x.ff", "--allow-background-only") == 0


def test_cvat_older_coco_export_with_the_images_straight_in_images_packs(tmp_path, capsys):
    root = tmp_path / "cvat"                    # annotations/instances_default.json + images/<file>
    (root / "annotations").mkdir(parents=True)
    (root / "images").mkdir()
    for k in range(2):
        (root / "images" / f"{k}.jpg").write_bytes(jpeg_bytes(paint_image(40, 50, seed=k)))
    (root / "annotations" / "instances_default.json").write_text(json.dumps({
        "images": [{"id": k + 1, "file_name": f"{k}.jpg", "width": 50, "height": 40} for k in range(2)],
        "annotations": [{"id": k + 1, "image_id": k + 1, "category_id": 1, "bbox": [5, 5, 20, 10]} for k in range(2)],
        "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]}))
    assert pack_cli(root, "-o", tmp_path / "x.ff") == 0
    assert "COCO split default: 2 images, 2 classes" in capsys.readouterr().out
    assert len(Store(tmp_path / "x.ff")) == 2 and Store(tmp_path / "x.ff").class_names == ["cat", "dog"]


def test_one_image_of_one_class_is_said_in_the_singular(tmp_path, capsys):
    b = YoloBuilder(tmp_path / "y", split=None, names=["cat"])
    b.add("a", ["0 0.5 0.5 0.2 0.2"])
    assert pack_cli(b.root, "-o", tmp_path / "x.ff") == 0
    out = capsys.readouterr().out
    assert "packed YOLO: 1 image, 1 class (" in out and "1 classes" not in out
    assert ": 1 image, 1 box (0 crowd), " in out   # the packed line too


# --- data.yaml and Roboflow's exports -----------------------------------------------------------------------------

def test_roboflow_yolo_export_packs_from_its_folder_and_its_data_yaml(tmp_path, capsys):
    root = roboflow_export(tmp_path / "export", names=("cat", "dog", "bird"), splits=(("train", 4), ("valid", 2), ("test", 1)))
    assert pack_cli(root, "-o", tmp_path / "t.ff") == 0
    assert "split train: 4 images, 3 classes" in capsys.readouterr().out
    t = Store(tmp_path / "t.ff")
    assert t.class_names == ["cat", "dog", "bird"] and len(t) == 4 and sum(len(t[i].boxes) for i in range(4)) == 4
    assert pack_cli(root / "data.yaml", "-o", tmp_path / "v.ff", "--split", "val") == 0    # data.yaml's key
    assert pack_cli(root, "-o", tmp_path / "v2.ff", "--split", "valid") == 0              # the folder's name
    for out in ("v.ff", "v2.ff"):
        v = Store(tmp_path / out)
        assert len(v) == 2 and v.class_names == ["cat", "dog", "bird"] and v[0].file_name.startswith("valid_")
    assert pack_cli(root / "data.yaml", "-o", tmp_path / "d.ff") == 0                    # default: train
    assert len(Store(tmp_path / "d.ff")) == 4
    assert pack_cli(root, "-o", tmp_path / "n.ff", "--split", "nope") == 1
    assert "split 'nope' not found" in (err := capsys.readouterr().err) and "train, val, test" in err


def test_labels_beside_their_images_pack_as_ultralytics_reads_them(tmp_path):
    data = tmp_path / "cvat" / "obj_train_data"   # CVAT's YOLO 1.1 (and labelImg): x.jpg + x.txt in one folder
    data.mkdir(parents=True)
    for k in range(3):
        (data / f"{k}.jpg").write_bytes(jpeg_bytes(paint_image(64, 80, k)))
        (data / f"{k}.txt").write_text(f"{k % 2} 0.5 0.5 0.25 0.5\n")
    (data / "classes.txt").write_text("cat\ndog\n")   # labelImg's: a label file of no image, not an image
    (tmp_path / "cvat" / "data.yaml").write_text("names: [cat, dog]\ntrain: obj_train_data\n")
    assert pack_cli(data, "-o", tmp_path / "a.ff") == 0
    assert pack_cli(tmp_path / "cvat" / "data.yaml", "-o", tmp_path / "b.ff") == 0
    for out in ("a.ff", "b.ff"):
        store = Store(tmp_path / out)
        assert [store.record(i).classes.tolist() for i in range(3)] == [[0], [1], [0]]
        assert store.record(1).boxes.tolist() == [[0.375, 0.25, 0.625, 0.75]]
    assert [json.loads(line)["reason"] for line in (tmp_path / "a.ff" / "rejects.jsonl").read_text().splitlines()] == [
        "label_without_image"]


def test_split_folders_without_data_yaml_and_a_split_folder_itself(tmp_path):
    root = roboflow_export(tmp_path / "export", yaml=False)
    assert pack_cli(root, "-o", tmp_path / "t.ff") == 0
    assert len(Store(tmp_path / "t.ff")) == 4 and Store(tmp_path / "t.ff").class_names == ["0", "1"]
    assert pack_cli(root / "valid", "-o", tmp_path / "v.ff") == 0        # images/ + labels/: the flat YOLO layout
    assert len(Store(tmp_path / "v.ff")) == 2


def test_data_yaml_errors_name_the_entry(tmp_path, capsys):
    root = roboflow_export(tmp_path / "export")
    text = (root / "data.yaml").read_text()
    (root / "data.yaml").write_text(text.replace("../train/images", "../trian/images"))
    assert pack_cli(root / "data.yaml", "-o", tmp_path / "x.ff") == 1
    assert "'train: ../trian/images' does not exist" in capsys.readouterr().err
    (root / "data.yaml").write_text(text.replace("nc: 2", "nc: 3"))
    assert pack_cli(root / "data.yaml", "-o", tmp_path / "x.ff") == 1
    assert "nc is 3 but 'names' lists 2 classes" in capsys.readouterr().err
    for names, shown in (("[cat, null]", "None"), ("[cat, '']", "''"), ("{0: cat, 1: [x]}", "['x']")):
        (root / "data.yaml").write_text(text.replace("names: ['cat', 'dog']", f"names: {names}"))
        assert pack_cli(root / "data.yaml", "-o", tmp_path / "x.ff") == 1
        assert f"data.yaml: class 1's name is {shown}; give every class in 'names' a name" in capsys.readouterr().err
    assert pack_cli(root / "data.yaml", "--format", "coco", "-o", tmp_path / "x.ff") == 1
    assert "a YOLO dataset; drop --format coco" in capsys.readouterr().err


def test_data_yaml_with_path_and_the_ultralytics_layout(tmp_path):
    b = YoloBuilder(tmp_path / "ds", split="train2017")
    b.add("a", ["1 0.5 0.5 0.2 0.2"])
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "ds.yaml").write_text(f"path: {b.root}\ntrain: images/train2017\nnames: [x, y]\n")
    assert pack_cli(tmp_path / "cfg" / "ds.yaml", "-o", tmp_path / "x.ff") == 0
    assert Store(tmp_path / "x.ff").class_names == ["x", "y"]


def test_data_yaml_relative_path_is_taken_from_the_working_directory_first_then_beside_the_yaml(tmp_path, monkeypatch):
    YoloBuilder(tmp_path / "cwd" / "ds").add("from_cwd", ["0 0.5 0.5 0.2 0.2"])   # where Ultralytics looks
    YoloBuilder(tmp_path / "cfg" / "ds").add("beside_yaml", ["0 0.5 0.5 0.2 0.2"])
    (tmp_path / "cfg" / "data.yaml").write_text("path: ds\ntrain: images/train\nnames: [x]\n")
    for cwd, packed in (("cwd", "from_cwd.jpg"), ("cfg/ds", "beside_yaml.jpg")):   # cfg/ds/ds does not exist
        monkeypatch.chdir(tmp_path / cwd)
        assert pack_cli(tmp_path / "cfg" / "data.yaml", "-o", tmp_path / f"{packed}.ff") == 0
        store = Store(tmp_path / f"{packed}.ff")
        assert [store[i].file_name for i in range(len(store))] == [packed]


# --- flat COCO and the --ann/--images pair ------------------------------------------------------------------------

def _flat_coco(root, json_name="annotations.json", images_sub="images"):
    b = CocoBuilder(tmp := root.parent / f".build-{root.name}")
    for k in range(3):
        b.add_image(f"{k}.jpg", boxes=[(3, [2, 2, 30, 30])], seed=k)
    b.write()
    images = root / images_sub if images_sub else root
    images.mkdir(parents=True, exist_ok=True)
    for f in b.images_dir.iterdir():
        shutil.copy(f, images / f.name)
    shutil.copy(tmp / "annotations" / "instances_train2017.json", root / json_name)
    shutil.rmtree(tmp)
    return root


def test_flat_coco_folder_packs_with_and_without_format(tmp_path, capsys):
    root = _flat_coco(tmp_path / "flat")
    assert pack_cli(root, "-o", tmp_path / "a.ff") == 0
    assert pack_cli(root, "--format", "coco", "-o", tmp_path / "b.ff") == 0
    assert len(Store(tmp_path / "a.ff")) == 3 and Store(tmp_path / "b.ff").class_names == ["person", "car", "dog"]
    assert "COCO: 3 images" in capsys.readouterr().out


def test_roboflow_coco_export_split_folders(tmp_path):
    root = tmp_path / "rf"
    _flat_coco(root / "train", "_annotations.coco.json", images_sub=None)
    _flat_coco(root / "valid", "_annotations.coco.json", images_sub=None)
    assert pack_cli(root, "-o", tmp_path / "t.ff") == 0
    assert pack_cli(root, "-o", tmp_path / "v.ff", "--split", "valid") == 0
    assert len(Store(tmp_path / "t.ff")) == 3 == len(Store(tmp_path / "v.ff"))


def test_fiftyone_coco_export_labels_json_and_data_folder(tmp_path):
    root = _flat_coco(tmp_path / "fo", "labels.json", images_sub="data")
    _flat_coco(tmp_path / "splits" / "val", "labels.json", images_sub="data")
    assert pack_cli(root, "-o", tmp_path / "a.ff") == 0
    assert pack_cli(tmp_path / "splits", "-o", tmp_path / "b.ff") == 0
    assert len(Store(tmp_path / "a.ff")) == 3 == len(Store(tmp_path / "b.ff"))


def test_label_studio_coco_export_whose_file_names_start_at_the_json(tmp_path, capsys):
    root = _flat_coco(tmp_path / "ls", "result.json")   # Label Studio: result.json + images/, file_name images/x.jpg
    data = json.loads((root / "result.json").read_text())
    for im in data["images"]:
        im["file_name"] = f"images/{im['file_name']}"
    (root / "result.json").write_text(json.dumps(data))
    assert pack_cli(root, "-o", tmp_path / "a.ff") == 0
    assert pack_cli("--ann", root / "result.json", "--images", root / "images", "-o", tmp_path / "b.ff") == 0
    assert len(Store(tmp_path / "a.ff")) == 3 == len(Store(tmp_path / "b.ff"))
    assert "missing_image" not in capsys.readouterr().out


def test_ann_and_images_errors_say_which_is_which(tmp_path, capsys, monkeypatch):
    root = _flat_coco(tmp_path / "flat")
    ann, images = root / "annotations.json", root / "images"
    assert pack_cli("--ann", ann, "--images", ann, "-o", tmp_path / "x.ff") == 1
    assert f"--images {ann} is a file; --images takes the folder that holds the images" in capsys.readouterr().err
    assert pack_cli("--ann", images, "--images", images, "-o", tmp_path / "x.ff") == 1
    assert f"--ann {images} is a folder; --ann takes the COCO JSON file" in capsys.readouterr().err
    assert pack_cli("--ann", root / "nope.json", "--images", images, "-o", tmp_path / "x.ff") == 1
    assert "annotation file not found" in capsys.readouterr().err
    assert pack_cli("--ann", ann, "--images", root / "nope", "-o", tmp_path / "x.ff") == 1
    assert "images folder not found" in capsys.readouterr().err
    assert pack_cli(root, "--ann", ann, "--images", images, "-o", tmp_path / "x.ff") == 1
    assert "or --ann/--images, not both" in capsys.readouterr().err
    assert pack_cli(ann, "-o", tmp_path / "x.ff") == 1
    assert f"is a JSON file: for a COCO file, give it with its images folder: fastfeed pack --ann {ann} --images DIR" \
        in capsys.readouterr().err
    assert pack_cli("--ann", ann, "--images", images, "-o", tmp_path / "x.ff") == 0
    capsys.readouterr()
    monkeypatch.chdir(images)
    assert pack_cli("--ann", ann, "--images", ".", "-o", tmp_path / "y.ff") == 0
    assert f"packed COCO: 3 images, 3 classes ({root})" in capsys.readouterr().out   # was: "(.)", the folder above "."


def test_coco_json_in_an_unknown_place_suggests_ann_and_images(tmp_path, capsys):
    root = tmp_path / "odd"
    _flat_coco(root / "meta", "labels.json", images_sub=None)
    (root / "meta" / "extra.json").write_text("{}")            # two JSON files: not a flat folder
    assert pack_cli(root, "--format", "coco", "-o", tmp_path / "x.ff") == 1
    err = capsys.readouterr().err
    assert "no COCO annotations in" in err and f"try: fastfeed pack --ann {root / 'meta' / 'extra.json'}" in err


# --- the pack path stays light ------------------------------------------------------------------------------------

def test_pack_does_not_import_torch(tmp_path):
    code = ("import sys; from fastfeed.cli import main; "
            f"rc = main(['pack', {str(sample_path())!r}, '-o', {str(tmp_path / 's.ff')!r}, '--quiet', '--workers', '1']); "
            "assert rc == 0, rc; assert 'torch' not in sys.modules, 'the pack path imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert json.loads((tmp_path / "s.ff" / "manifest.json").read_text())["num_images"] == 16


def test_inspect_names_the_classes_without_boxes(tmp_path, capsys):
    root = roboflow_export(tmp_path / "export", names=("cat", "dog", "bird", "fish"), splits=(("train", 2),))
    assert pack_cli(root, "-o", tmp_path / "t.ff") == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "t.ff")]) == 0
    out = capsys.readouterr().out
    assert "classes with boxes (2 of 4)" in out and "classes without boxes (2 of 4): 2 bird, 3 fish" in out


def test_split_folders_still_pack_when_data_yaml_names_another_machines_path(tmp_path, caplog):
    root = roboflow_export(tmp_path / "export")
    (root / "data.yaml").write_text("path: /datasets/elsewhere\n" + (root / "data.yaml").read_text())
    assert pack_cli(root, "-o", tmp_path / "t.ff") == 0
    assert len(Store(tmp_path / "t.ff")) == 4 and "using the split folders found in" in caplog.text
    assert pack_cli(root / "data.yaml", "-o", tmp_path / "x.ff") == 1   # the file itself: its path is wrong, said so


def test_a_broken_val_entry_is_named_when_val_is_packed_and_not_when_train_is(tmp_path, caplog, capsys):
    root = roboflow_export(tmp_path / "export")
    (root / "data.yaml").write_text((root / "data.yaml").read_text().replace("val: ../valid/images", "val: ../val/x"))
    assert pack_cli(root, "-o", tmp_path / "t.ff") == 0
    assert "val" not in caplog.text and len(Store(tmp_path / "t.ff")) == 4   # the train split: val's entry unread
    assert pack_cli(root, "-o", tmp_path / "v.ff", "--split", "val") == 1
    err = capsys.readouterr().err
    assert "'val: ../val/x' does not exist" in err and "--split train | valid" in err
    assert pack_cli(root, "-o", tmp_path / "v.ff", "--split", "valid") == 0
