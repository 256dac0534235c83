"""A path given where a store belongs that is no store: each command (train, bench, inspect, verify) names what it
is and what to do, from the one place stores are opened (`Store`, via `store/local.not_a_store`; which dataset a folder
is, the CLI asks `pack/layout`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import roboflow_export

from fastfeed.cli import main

COMMANDS = {
    "train": lambda p: ["train", "--data", p, "--imgsz", "64", "--epochs", "1", "--batch", "2", "--out",
                        str(Path(p).parent / "run")],   # not ./runs/: the test leaves nothing in the checkout
    "bench": lambda p: ["bench", "--data", p, "--imgsz", "64", "--batch", "2", "--seconds", "1", "--quiet"],
    "inspect": lambda p: ["inspect", p],
    "verify": lambda p: ["verify", p],
}


def _error(capsys, command: str, path) -> str:
    assert main(COMMANDS[command](str(path))) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err   # one line, no traceback
    return err[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_data_yaml_points_to_fastfeed_pack(command, tmp_path, capsys):
    yaml = roboflow_export(tmp_path / "export") / "data.yaml"
    err = _error(capsys, command, yaml)
    assert err == (f"fastfeed: error: {yaml} is a dataset file (Ultralytics' data.yaml), not a fastfeed store: pack it "
                   f"with `fastfeed pack {yaml} -o train.ff` (`--split val -o val.ff` for its val split), then pass the "
                   ".ff folder")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_dataset_folder_points_to_fastfeed_pack(command, tmp_path, capsys, coco_builder):
    yolo = roboflow_export(tmp_path / "export")
    assert f"{yolo} is a YOLO dataset, not a fastfeed store: pack it with `fastfeed pack {yolo} -o export.ff`" in (
        _error(capsys, command, yolo))
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 5, 5])])
    coco = coco_builder.write()
    assert f"{coco} is a COCO dataset, not a fastfeed store: pack it with `fastfeed pack {coco} -o {coco.name}.ff`" in (
        _error(capsys, command, coco))


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_path_does_not_exist(command, tmp_path, capsys):
    missing = tmp_path / "missing.ff"
    err = _error(capsys, command, missing)
    assert f"{missing} does not exist" in err and "`fastfeed pack SRC -o OUT`" in err   # train checks --data itself
    assert "not a directory" not in err
    assert not (tmp_path / "run").exists()   # train names a bad --data before it makes its run folder


def test_a_file_and_an_empty_folder(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert "notes.txt is a file, not a fastfeed store (a folder with manifest.json" in _error(
        capsys, "verify", tmp_path / "notes.txt")
    (tmp_path / "empty").mkdir()
    assert "empty/manifest.json not found: not a fastfeed store" in _error(capsys, "inspect", tmp_path / "empty")


@pytest.mark.parametrize("command", ["inspect", "bench"])
def test_a_folder_with_two_layouts_names_format(command, tmp_path, capsys, coco_builder):
    coco_builder.add_image("a.jpg", boxes=[(1, [1, 1, 5, 5])])
    coco = coco_builder.write()
    (coco / "labels").mkdir()
    (coco / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    err = _error(capsys, command, coco)
    assert f"{coco} is a dataset folder with both a COCO JSON and YOLO labels, not a fastfeed store: pack it with " \
           f"`fastfeed pack {coco} -o {coco.name}.ff --format coco` (or `--format yolo`)" in err
