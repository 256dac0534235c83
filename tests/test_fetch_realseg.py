"""benchmarks/fetch_realseg.py: the real segmentation set's split by time, and its refusal of a clone without the
source commit; benchmarks/ultralytics_ab.py's refusal of a --data that is no set."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import fetch_realseg  # noqa: E402


def _export(root: Path, n_train: int) -> Path:
    """A Roboflow-like export: train photos named by the time taken (given out of order), 2 valid, 1 test."""
    for folder, names in (("train", [f"img_-_20260112_{100000 + 7 * i:06d}.jpg" for i in reversed(range(n_train))]),
                          ("valid", ["v0.jpg", "v1.jpg"]), ("test", ["t0.jpg"])):
        (root / folder / "images").mkdir(parents=True)
        (root / folder / "labels").mkdir(parents=True)
        for name in names:
            (root / folder / "images" / name).write_bytes(name.encode())
            (root / folder / "labels" / (Path(name).stem + ".txt")).write_text(f"0 0.1 0.1 0.5 0.1 0.5 0.5 # {name}\n")
    return root


def test_split_takes_train_from_the_first_three_quarters_and_val_from_the_rest(tmp_path):
    export = _export(tmp_path / "export", 40)
    data = fetch_realseg.split_by_time(export, tmp_path / "set", n_train=10, n_val=5)
    photos = sorted(p.name for p in (export / "train" / "images").iterdir())
    train = sorted(p.name for p in (tmp_path / "set" / "train" / "images").iterdir())
    val = sorted(p.name for p in (tmp_path / "set" / "val" / "images").iterdir())
    assert train == photos[:30:3]  # evenly spread over the first 75% of the day
    assert val == sorted(photos[30::2] + ["v0.jpg", "v1.jpg", "t0.jpg"])  # over the rest, with valid and test
    for split, names in (("train", train), ("val", val)):  # each photo with its own labels, both unchanged
        for name in names:
            label = tmp_path / "set" / split / "labels" / (Path(name).stem + ".txt")
            assert label.read_text().endswith(f"# {name}\n")
            assert (tmp_path / "set" / split / "images" / name).read_bytes() == name.encode()
    cfg = yaml.safe_load(data.read_text())
    assert cfg["path"] == str(tmp_path / "set") and cfg["names"] == {0: "shoes"}
    assert (cfg["train"], cfg["val"]) == ("train/images", "val/images")


def test_split_takes_every_photo_when_fewer_than_asked(tmp_path):
    export = _export(tmp_path / "export", 8)
    fetch_realseg.split_by_time(export, tmp_path / "set", n_train=100, n_val=100)
    assert len(list((tmp_path / "set" / "train" / "images").iterdir())) == 6
    assert len(list((tmp_path / "set" / "val" / "images").iterdir())) == 2 + 3


def test_a_clone_without_the_source_commit_is_refused_by_name(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path / "other")], check=True)
    out = subprocess.run([sys.executable, str(BENCH / "fetch_realseg.py"), str(tmp_path / "other"), "--dst",
                          str(tmp_path / "set")], capture_output=True, text=True)
    assert out.returncode != 0 and fetch_realseg.COMMIT in out.stderr and "clone that repository" in out.stderr
    assert not (tmp_path / "set").exists()


@pytest.mark.parametrize("data", ["no-such-set", "missing/data.yaml"])
def test_ultralytics_ab_refuses_a_data_that_is_neither_a_set_nor_a_file(tmp_path, data):
    out = subprocess.run([sys.executable, str(BENCH / "ultralytics_ab.py"), "--task", "segment", "--data", data],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "neither shapes, coco128 nor an existing data.yaml" in out.stderr
