"""Dataset variants that real exports and hand-made sets have, packed with the command a user types: data.yaml's
`names`/`nc` and `train:` forms as Ultralytics reads them, label files written by other tools, image names of
other cases and duplicate stems in sub-folders; each record's boxes checked against its label file."""

from __future__ import annotations

import numpy as np
from conftest import YoloBuilder, jpeg_bytes, paint_image
from store_helpers import by_name, run_pack

from fastfeed import Store
from fastfeed.cli import main


def pack_cli(*args) -> int:
    return main(["pack", *map(str, args), "--quiet", "--workers", "1"])


def _xyxy(cx, cy, w, h):
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def test_data_yaml_names_and_nc_as_ultralytics_reads_them(tmp_path, capsys):
    b = YoloBuilder(tmp_path / "ds").add("a", ["2 0.5 0.5 0.2 0.2"])
    for k, (text, names) in enumerate((
            ("nc: 4", ["class_0", "class_1", "class_2", "class_3"]),   # `nc` alone: not the 3 ids the labels use
            ("names: {'0': x, '1': y, '2': z}", ["x", "y", "z"]))):     # quoted keys, as a JSON-to-YAML tool writes
        (b.root / "data.yaml").write_text(f"train: images/train\n{text}\n")
        assert pack_cli(b.root / "data.yaml", "-o", tmp_path / f"{k}.ff") == 0
        assert Store(tmp_path / f"{k}.ff").class_names == names
    (b.root / "data.yaml").write_text("train: images/train\nnames: {0: x, b: y}\n")
    assert pack_cli(b.root / "data.yaml", "-o", tmp_path / "x.ff") == 1
    assert "'names' keys must be 0..N-1, got [0, 'b']" in capsys.readouterr().err


def _two_folders(root, place="images/{}"):
    """Images in root/images/{a,b,c}/ (`place` "{}/images": root/{a,b,c}/images/, Roboflow's), labels where
    Ultralytics looks for them; image i of folder k has one box of class k."""
    for k, sub in enumerate("abc"):
        images, labels = root / place.format(sub), root / place.format(sub).replace("images", "labels")
        images.mkdir(parents=True)
        labels.mkdir(parents=True)
        for i in range(2):
            (images / f"x{i}.jpg").write_bytes(jpeg_bytes(paint_image(60, 80, seed=k)))
            (labels / f"x{i}.txt").write_text(f"{k} 0.{k + 3} 0.5 0.2 0.{i + 2}\n")
    return root


def _boxes_of(store):
    return {n: (s.classes.tolist(), np.round(s.boxes, 6).tolist()) for n, s in by_name(store).items()}


def _check(store, *names, sub="{}"):
    """`store` holds the images `names` (k/xi.jpg), each with its box, and nothing else."""
    got = _boxes_of(store)
    assert sorted(got) == sorted(sub.format(n[0]) + n[1:] for n in names)
    for n in names:
        k, i = "abc".index(n[0]), int(n[-5])
        cls, boxes = got[sub.format(n[0]) + n[1:]]
        assert cls == [k] and np.allclose(boxes, [_xyxy(0.3 + k / 10, 0.5, 0.2, 0.2 + i / 10)]), n


def test_data_yaml_train_as_a_list_of_folders_packs_every_folder_into_one_store(tmp_path):
    root = _two_folders(tmp_path / "ds")
    (root / "data.yaml").write_text("train: [images/a, images/b]\nval: images/c\nnames: [p, q, r]\n")
    res = run_pack(root / "data.yaml", tmp_path / "u.ff")
    _check(Store(tmp_path / "u.ff"), "a/x0.jpg", "a/x1.jpg", "b/x0.jpg", "b/x1.jpg")
    assert res.report.counts.get("label_without_image", 0) == 0   # c's labels are val's, no orphans
    root = _two_folders(tmp_path / "rf", place="{}/images")   # Roboflow's: a/labels/ beside a/images/
    (root / "data.yaml").write_text("train: [../a/images, ../b/images]\nval: ../c/images\nnames: [p, q, r]\n")
    for k, src in enumerate((root / "data.yaml", root)):   # the yaml, or the folder holding it
        run_pack(src, tmp_path / f"{k}.ff")
        _check(Store(tmp_path / f"{k}.ff"), "a/x0.jpg", "a/x1.jpg", "b/x0.jpg", "b/x1.jpg", sub="{}/images")


def test_data_yaml_train_as_a_file_listing_images(tmp_path, capsys, monkeypatch):
    root = _two_folders(tmp_path / "ds")
    (root / "lists").mkdir()
    (root / "lists" / "train.txt").write_text("./../images/a/x1.jpg\r\n\r\n")   # ./ : from the list's folder
    (root / "abs.txt").write_text(f"{root}/images/b/x0.jpg\n{root}/images/c/x1.jpg\nnotes.md\n")
    (root / "data.yaml").write_text("train: [lists/train.txt, abs.txt]\nnames: [p, q, r]\n")
    assert pack_cli(root / "data.yaml", "-o", tmp_path / "t.ff") == 0
    _check(Store(tmp_path / "t.ff"), "a/x1.jpg", "b/x0.jpg", "c/x1.jpg")
    (root / "rel.txt").write_text("images/a/x0.jpg\n")   # no ./ : from the working directory, as Ultralytics reads it
    (root / "data.yaml").write_text("train: rel.txt\nnames: [p, q, r]\n")
    monkeypatch.chdir(tmp_path)
    assert pack_cli(root / "data.yaml", "-o", tmp_path / "r.ff") == 1
    err = capsys.readouterr().err
    assert f"lists 1 image(s), none found (e.g. {tmp_path}/images/a/x0.jpg)" in err
    assert "another relative path from the working directory" in err and len(err.strip().splitlines()) == 1
    monkeypatch.chdir(root)
    assert pack_cli(root / "data.yaml", "-o", tmp_path / "r.ff") == 0 and len(Store(tmp_path / "r.ff")) == 1


def test_a_listed_image_that_is_missing_counts_as_missing_not_as_an_image_without_a_label_file(tmp_path, caplog):
    root = _two_folders(tmp_path / "ds")
    for gone in ("images/a/x1.jpg", "labels/a/x1.txt", "labels/b/x1.txt"):   # a/x1 missing; b/x1.jpg without labels
        (root / gone).unlink()
    (root / "train.txt").write_text("./images/a/x0.jpg\n./images/a/x1.jpg\n./images/b/x0.jpg\n./images/b/x1.jpg\n")
    (root / "data.yaml").write_text("train: train.txt\nnames: [p, q, r]\n")
    res = run_pack(root / "data.yaml", tmp_path / "m.ff")
    assert res.report.counts["missing_image"] == 1 and res.report.examples["missing_image"] == [
        f"a/x1.jpg: missing_image ({root}/images/a/x1.jpg does not exist)"]
    [warning] = [r.message for r in caplog.records if "no label file" in r.message]
    assert f"1 of the 3 images (33%) have no label file, e.g. {root}/images/b/x1.jpg: they" in warning
    assert sorted(_boxes_of(Store(tmp_path / "m.ff"))) == ["a/x0.jpg", "b/x0.jpg", "b/x1.jpg"]


def test_label_files_of_other_tools_upper_case_extensions_and_repeated_stems_pack_their_boxes(tmp_path):
    b = YoloBuilder(tmp_path / "ds", names=["p", "q"])
    texts = {"blank": "1 0.5 0.5 0.2 0.4\n\n\n  \n", "crlf": "1 0.5 0.5 0.2 0.4\r\n", "tabs": "1\t0.5\t0.5\t0.2\t0.4\n",
             "sci": "1 5e-1 5.0E-01 2e-1 4.000000e-01"}
    for stem, text in texts.items():
        b.add(stem, ext=".JPG" if stem == "tabs" else ".jpg")
        (b.labels_dir / f"{stem}.txt").write_bytes(text.encode())
    for sub in ("a", "b"):   # a/x.jpg and b/x.jpg: one stem, two label files
        (b.images_dir / sub).mkdir()
        (b.labels_dir / sub).mkdir()
        (b.images_dir / sub / "x.PNG").write_bytes((b.images_dir / "blank.jpg").read_bytes())
        (b.labels_dir / sub / "x.txt").write_text(f"{'ab'.index(sub)} 0.5 0.5 0.2 0.4\n")
    assert pack_cli(b.root, "-o", tmp_path / "s.ff") == 0
    got = _boxes_of(Store(tmp_path / "s.ff"))
    assert sorted(got) == ["a/x.PNG", "b/x.PNG", "blank.jpg", "crlf.jpg", "sci.jpg", "tabs.JPG"]
    for name, (cls, boxes) in got.items():
        assert cls == [0 if name == "a/x.PNG" else 1] and np.allclose(boxes, [_xyxy(0.5, 0.5, 0.2, 0.4)]), name
