"""FastfeedTrainer as a new user meets it: it says what the feed did each epoch (a line and fastfeed.csv), the
shm cache's size and build time, trains from a Roboflow export's data.yaml with its class names, never trains on
a store without boxes, and its errors name the right thing (a train path that does not exist, FASTFEED_STORE, an
extra class without boxes); no lock file is left in the dataset folder."""

from __future__ import annotations

import csv
import logging
import shutil

import pytest
from ultra_data import sample_roboflow, sample_yolo, sample_yolo_master, write_data_yaml  # noqa: F401  (fixtures)

pytest.importorskip("ultralytics")

from ultralytics import YOLO  # noqa: E402

from fastfeed import Store  # noqa: E402
from fastfeed.integrations.ultralytics import FastfeedTrainer  # noqa: E402
from fastfeed.integrations.ultralytics.args import log  # noqa: E402
from fastfeed.integrations.ultralytics.store import check_classes, prepare_store  # noqa: E402
from fastfeed.pack import PackConfig, pack  # noqa: E402

FAST = dict(imgsz=64, batch=8, device="cpu", plots=False, workers=0, seed=0, epochs=1, val=False)


@pytest.fixture
def fastfeed_lines():
    """The messages of fastfeed's Ultralytics logger (what a user sees beside Ultralytics' own lines)."""
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    log.addHandler(handler)
    yield seen
    log.removeHandler(handler)


def _train(data, tmp_path, name, **kw):
    model = YOLO("yolov8n.yaml")
    model.train(data=str(data), trainer=FastfeedTrainer, project=str(tmp_path), name=name, **(FAST | kw))
    return model.trainer


def _feed_rows(trainer) -> list[dict]:
    with open(trainer.save_dir / "fastfeed.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("cache", [False, True])
def test_each_epoch_says_the_feeds_data_wait_and_images_per_s(sample_yolo, tmp_path, fastfeed_lines, cache,  # noqa: F811
                                                               monkeypatch):
    monkeypatch.delenv("FASTFEED_LOADER", raising=False)
    trainer = _train(sample_yolo / "data.yaml", tmp_path, "e", epochs=2, close_mosaic=1, cache=cache)
    loader = "shm" if cache else "cpu"
    lines = [m for m in fastfeed_lines if m.startswith("fastfeed: epoch ")]
    assert len(lines) == 2 and lines[0].startswith(f"fastfeed: epoch 1/2: the {loader} loader fed 16 images, ")
    assert "images/s; data wait " in lines[0] and "% of the epoch (" in lines[0]
    rows = _feed_rows(trainer)
    assert [int(r["epoch"]) for r in rows] == [1, 2] and all(int(r["images"]) == 16 for r in rows)
    assert all(0 <= float(r["data_wait_frac"]) <= 1 and float(r["images_per_s"]) > 0 for r in rows)
    assert (trainer.save_dir / "results.csv").is_file()      # beside Ultralytics' own file
    cache_lines = [m for m in fastfeed_lines if m.startswith("fastfeed: shm cache ")]
    if cache:
        assert len(cache_lines) == 1 and " MiB, 16 images at imgsz 64, built in " in cache_lines[0]
    else:
        assert not cache_lines


def test_a_run_that_fails_leaves_no_shm_cache_or_worker_behind(sample_yolo, tmp_path, monkeypatch):  # noqa: F811
    """A failure mid-training (here a callback that raises) in a process that goes on, as a notebook does: the loader's
    workers and its shm cache go at once (they stayed until the process ended)."""
    import os

    from cache_helpers import new_in_dev_shm
    from proc_checks import descendants

    monkeypatch.delenv("FASTFEED_LOADER", raising=False)
    before, model = set(os.listdir("/dev/shm")), YOLO("yolov8n.yaml")

    def boom(trainer):
        assert new_in_dev_shm(trainer.train_loader.store, before)   # the cache, while training
        raise RuntimeError("boom")

    model.add_callback("on_train_batch_end", boom)
    with pytest.raises(RuntimeError, match="boom"):
        model.train(data=str(sample_yolo / "data.yaml"), trainer=FastfeedTrainer, project=str(tmp_path), name="f",
                    **(FAST | dict(cache=True, workers=2)))
    assert not new_in_dev_shm(model.trainer.train_loader.store, before) and not descendants(os.getpid())


def test_a_roboflow_export_trains_with_its_names(sample_roboflow, tmp_path, fastfeed_lines):  # noqa: F811
    root = tmp_path / "export"
    shutil.copytree(sample_roboflow, root)
    trainer = _train(root / "data.yaml", tmp_path, "rf")
    store = trainer.train_loader.store
    assert store.path.parent == root / "train" and len(store) == 12 and store.class_names[0] == "person"
    assert _feed_rows(trainer)[0]["images"] == "12"
    assert not [p.name for p in root.rglob(".*.lock")]        # the pack's lock goes with it


def test_a_dataset_without_labels_is_refused_before_training(sample_yolo, tmp_path):  # noqa: F811
    shutil.rmtree(sample_yolo / "labels")
    with pytest.raises(ValueError, match=r"cannot pack the train split .*no labels: none of the 16 images") as e:
        _train(sample_yolo / "data.yaml", tmp_path, "nl")
    assert f"looked for {sample_yolo / 'labels' / 'train2017'}/<image name>.txt" in str(e.value)


def test_a_store_without_boxes_is_never_trained_on(sample_yolo, tmp_path, monkeypatch):  # noqa: F811
    for label in (sample_yolo / "labels" / "train2017").glob("*.txt"):
        label.write_text("")                                  # every label file empty: 16 background images
    # The trainer's own pack refuses it (`fastfeed pack` does without --allow-background-only) and says how to
    # pack it anyway.
    with pytest.raises(ValueError, match=r"none of the 16 images packed kept a box(.|\n)*FastfeedTrainer packs "
                                         r"without that option"):
        _train(sample_yolo / "data.yaml", tmp_path, "nb")


def test_a_typo_in_the_train_path_says_it_does_not_exist(sample_yolo, tmp_path):  # noqa: F811
    text = (sample_yolo / "data.yaml").read_text()
    (sample_yolo / "data.yaml").write_text(text.replace("train: images/train2017", "train: images/trian2017"))
    with pytest.raises(ValueError, match="trian2017 does not exist: check its 'train:' entry") as e:
        _train(sample_yolo / "data.yaml", tmp_path, "t")
    assert "FASTFEED_STORE" not in str(e.value)


def test_fastfeed_store_errors_name_the_variable(sample_yolo, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FASTFEED_STORE", str(tmp_path / "nope.ff"))
    with pytest.raises(ValueError, match=r"FASTFEED_STORE=.*nope\.ff: no such store \(the path does not exist\)"):
        prepare_store(str(sample_yolo / "images" / "train2017"), progress=False)
    (tmp_path / "notastore").mkdir()
    monkeypatch.setenv("FASTFEED_STORE", str(tmp_path / "notastore"))
    with pytest.raises(ValueError, match=r"FASTFEED_STORE=.*notastore: .*not a fastfeed store"):
        prepare_store(str(sample_yolo / "images" / "train2017"), progress=False)


def test_an_extra_class_without_boxes_is_a_warning_not_undefined_ids(sample_yolo, tmp_path, fastfeed_lines):  # noqa: F811
    names = Store(prepare_store(str(sample_yolo / "images" / "train2017"), progress=False).path).class_names
    out = tmp_path / "extra.ff"
    pack(PackConfig(src=sample_yolo, out=out, format="yolo", names=names + ["unicorn"], progress=False, workers=1))
    store = Store(out)
    check_classes(store, dict(enumerate(names)), len(names))    # trains: nothing uses class 80
    assert any("the extra ones (80 'unicorn') have no boxes in the store" in m for m in fastfeed_lines)
    with pytest.raises(ValueError, match=r"has 81 classes, data.yaml names 1: the store's labels use class ids data.yaml "
                                         r"does not define \(\d+ '[a-z ]+': \d+ boxes"):
        check_classes(store, {0: "person"}, 1)


def test_no_lock_file_is_left_beside_the_dataset(sample_yolo):  # noqa: F811
    prepare_store(str(sample_yolo / "images" / "train2017"), progress=False)
    assert sorted(p.name for p in sample_yolo.iterdir() if p.name.startswith(".")) == []
