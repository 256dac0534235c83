"""data.yaml's train split -> a store: packed on first use, reused while unchanged, re-packed when a label
or image changes; FASTFEED_STORE; and the argument mapping (loader choice, augmentation, warnings)."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from ultra_data import sample_yolo, sample_yolo_master  # noqa: F401  (fixtures)

pytest.importorskip("ultralytics")

from ultralytics.cfg import get_cfg  # noqa: E402
from ultralytics.utils import DEFAULT_CFG  # noqa: E402

from fastfeed import Store  # noqa: E402
from fastfeed.integrations.ultralytics.args import augment_hyp, loader_name, unsupported  # noqa: E402
from fastfeed.integrations.ultralytics.store import check_classes, prepare_store, store_stem, train_source  # noqa: E402
from fastfeed.loaders import register_loader, unregister_loader  # noqa: E402


def _labels_of(store: Store, name: str):
    for i in range(len(store)):
        s = store.get(i, decode=False)
        if s.file_name == name:
            return s.classes.tolist()
    raise KeyError(name)


def test_packed_beside_the_dataset_then_reused_then_repacked_when_a_label_changes(sample_yolo):  # noqa: F811
    train = sample_yolo / "images" / "train2017"
    assert train_source(str(train)) == (train, sample_yolo, "train2017")
    store = prepare_store(str(train), progress=False)
    assert store.path.parent == sample_yolo and re.fullmatch(r"train2017-[0-9a-f]{10}\.ff", store.path.name)
    first = os.stat(store.path).st_ino
    assert len(store) == 16

    again = prepare_store(str(train), progress=False)             # unchanged: the same store, not re-packed
    assert again.path == store.path and os.stat(again.path).st_ino == first

    label = sorted((sample_yolo / "labels" / "train2017").glob("*.txt"))[0]
    name = label.with_suffix(".jpg").name
    assert set(_labels_of(again, name)) != {5}
    lines = label.read_text().splitlines()
    label.write_text("\n".join(["5" + line[line.index(" "):] for line in lines]) + "\n")   # every box -> class 5
    changed = prepare_store(str(train), progress=False)
    assert changed.path != store.path and not store.path.exists()  # a new version; the old one is removed
    assert set(_labels_of(changed, name)) == {5}

    (sample_yolo / "images" / "train2017" / name).unlink()       # an image removed: re-packed again
    assert len(prepare_store(str(train), progress=False)) == 15


def test_labels_that_keep_no_box_stop_the_trainers_pack_by_name(sample_yolo):  # noqa: F811
    """FastfeedTrainer's automatic pack applies the pack's rule: label files written with commas cannot be read, so
    their images are rejected (the one with an empty label file is background) and the pack stops with the pack's
    message (the reason, an example line) instead of training on 0 boxes."""
    labels = sorted((sample_yolo / "labels" / "train2017").glob("*.txt"))
    for label in labels:
        label.write_text("\n".join(",".join(line.split()) for line in label.read_text().splitlines()) + "\n")
    train = sample_yolo / "images" / "train2017"
    with pytest.raises(ValueError, match="fastfeed cannot pack the train split .*: no boxes: none of the 1 images "
                                         "packed kept a box") as e:
        prepare_store(str(train), progress=False)
    assert "malformed_line x15" in str(e.value) and "values separated by commas" in str(e.value)
    assert "--allow-background-only" in str(e.value)
    assert "set FASTFEED_STORE=train.ff" in str(e.value)     # the way out a trainer's user has
    assert not list(sample_yolo.glob("train2017-*.ff"))          # nothing published beside the dataset


def test_class_ids_beyond_the_names_stop_the_trainers_pack_naming_the_share_and_the_way_out(sample_yolo):  # noqa: F811
    """A label file with a class id beyond the names rejects its image (as Ultralytics does); over 10% of the split
    so rejected stops FastfeedTrainer's pack, with `fastfeed pack --max-dropped` and FASTFEED_STORE as the way out."""
    labels = sorted((sample_yolo / "labels" / "train2017").glob("*.txt"))
    for label in labels[:3]:
        label.write_text("999 0.5 0.5 0.2 0.2\n" + label.read_text())
    train = sample_yolo / "images" / "train2017"
    with pytest.raises(ValueError, match=r"too much dropped: unknown_class took 3 of the split's 16 images \(19%"
                       ) as e:
        prepare_store(str(train), progress=False)
    assert f"`fastfeed pack {sample_yolo} -o train.ff --max-dropped SHARE`) and set FASTFEED_STORE=train.ff" in str(e.value)
    assert not list(sample_yolo.glob("train2017-*.ff"))


def test_read_only_dataset_goes_to_the_cache_folder(sample_yolo, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FASTFEED_STORE_DIR", str(tmp_path / "stores"))
    stem = store_stem(sample_yolo, "train2017")
    assert stem.parent == tmp_path / "stores" and re.fullmatch(r"coco16-[0-9a-f]{8}-train2017", stem.name)
    store = prepare_store(str(sample_yolo / "images" / "train2017"), progress=False)
    assert store.path.parent == tmp_path / "stores" and len(store) == 16


def test_fastfeed_store_env_uses_that_store_and_checks_its_classes(sample_yolo, monkeypatch):  # noqa: F811
    store = prepare_store(str(sample_yolo / "images" / "train2017"), progress=False)
    monkeypatch.setenv("FASTFEED_STORE", str(store.path))
    assert prepare_store("/nonexistent/images/train", progress=False).path == store.path
    names = {i: n for i, n in enumerate(store.class_names)}
    check_classes(store, names, len(names))
    with pytest.raises(ValueError, match="data.yaml names 3"):
        check_classes(store, {0: "a", 1: "b", 2: "c"}, 3)
    with pytest.raises(ValueError, match="names class 0 'person' but data.yaml names it 'car'"):
        check_classes(store, {**names, 0: "car"}, len(names))


def test_data_naming_a_store_says_to_give_the_yaml_and_fastfeed_store(sample_yolo):  # noqa: F811
    """Was Ultralytics' "Dataset '.../train.ff' error ... No YAML file found in '.../train.ff'"."""
    from ultralytics import YOLO

    from fastfeed.integrations.ultralytics import FastfeedTrainer

    store = prepare_store(str(sample_yolo / "images" / "train2017"), progress=False)
    with pytest.raises(ValueError) as e:
        YOLO("yolov8n.yaml").train(data=str(store.path), trainer=FastfeedTrainer, epochs=1, imgsz=64, device="cpu")
    assert str(e.value) == (f"data={store.path} is a fastfeed store, not a dataset: give data= the dataset's data.yaml "
                            f"(class names, the val split) and FASTFEED_STORE={store.path} to train from this store")


@pytest.mark.parametrize("train, why", [("{root}/images/train2017/../../data.yaml", "is a file"),
                                        ("{root}/labels", "not under an 'images' folder"),
                                        (["{root}/images/train2017", "{root}/images/train2017"], "lists 2")])
def test_layouts_we_cannot_pack_say_what_to_do(sample_yolo, train, why):  # noqa: F811
    train = [t.format(root=sample_yolo) for t in train] if isinstance(train, list) else train.format(root=sample_yolo)
    with pytest.raises(ValueError, match=why) as e:
        train_source(train)
    assert "FASTFEED_STORE" in str(e.value)


@pytest.mark.parametrize("cache, name", [(False, "cpu"), ("disk", "cpu"), (None, "cpu"), (True, "shm"), ("ram", "shm")])
def test_cache_argument_picks_the_loader(cache, name, monkeypatch):
    monkeypatch.delenv("FASTFEED_LOADER", raising=False)
    assert loader_name(cache) == name


def test_fastfeed_loader_env_overrides_and_is_checked(monkeypatch):
    monkeypatch.setenv("FASTFEED_LOADER", "dali")
    assert loader_name(True) == "dali"
    monkeypatch.setenv("FASTFEED_LOADER", "device")
    assert loader_name(False) == "device"              # finished on the trainer's device (test_ultralytics_device.py)
    monkeypatch.setenv("FASTFEED_LOADER", "gpu")
    with pytest.raises(ValueError, match="'gpu': not a fastfeed loader; valid: cpu, shm, dali, device"):
        loader_name(False)
    register_loader("ff-test-plugin", lambda store, cfg, opts: None, summary="a test's")
    try:
        monkeypatch.setenv("FASTFEED_LOADER", "ff-test-plugin")
        with pytest.raises(ValueError, match="'ff-test-plugin': not one FastfeedTrainer feeds from"):
            loader_name(False)
    finally:
        unregister_loader("ff-test-plugin")
    monkeypatch.delenv("FASTFEED_LOADER")
    with pytest.raises(ValueError, match="cache='nvme'"):
        loader_name("nvme")


def test_augmentation_arguments_map_by_name():
    args = get_cfg(DEFAULT_CFG, {"mosaic": 0.5, "degrees": 10.0, "translate": 0.2, "scale": 0.9, "shear": 2.0,
                                 "flipud": 0.1, "fliplr": 0.3, "hsv_h": 0.02, "hsv_s": 0.5, "hsv_v": 0.3, "mixup": 0.1})
    hyp = augment_hyp(args)
    assert (hyp.mosaic, hyp.degrees, hyp.translate, hyp.scale, hyp.shear) == (0.5, 10.0, 0.2, 0.9, 2.0)
    assert (hyp.flipud, hyp.fliplr, hyp.hsv_h, hyp.hsv_s, hyp.hsv_v, hyp.mixup) == (0.1, 0.3, 0.02, 0.5, 0.3, 0.1)
    assert augment_hyp(SimpleNamespace(**{**vars(args), "scale": (0.6, 1.4)})).scale == pytest.approx(0.4)
    with pytest.raises(ValueError, match="AugmentHyp.scale"):
        augment_hyp(SimpleNamespace(**{**vars(args), "scale": 1.5}))


def test_arguments_we_cannot_honour_are_named(monkeypatch):
    args = get_cfg(DEFAULT_CFG, {"perspective": 0.001, "copy_paste": 0.2, "cutmix": 0.1, "bgr": 0.1, "rect": True,
                                 "fraction": 0.5, "mixup": 0.2})
    found = " | ".join(unsupported(args))
    assert "rect=True" in found
    for name in ("bgr=", "fraction=", "mixup=", "perspective=", "cutmix=", "copy_paste="):   # the cpu and shm loaders do
        assert name not in found
    said = " | ".join(unsupported(args, loader="device"))   # what the device loader's renderer does not draw
    assert "cutmix=0.1: the device loader does not render it (the cpu and shm loaders do); training without it" in said
    assert "mixup=0.2: the device loader does not render it" in said and "bgr=" not in said   # the device does bgr
    hyp = augment_hyp(args, "device")
    assert (hyp.cutmix, hyp.mixup, hyp.bgr) == (0.0, 0.0, 0.1) and (augment_hyp(args).cutmix, augment_hyp(args).mixup) == (0.1, 0.2)
    assert augment_hyp(args, "dali").mixup == 0.2
    plain = get_cfg(DEFAULT_CFG, {})
    assert not [m for m in unsupported(plain) if "albumentations" not in m]


def test_warnings_go_to_ultralytics_log():
    """Through Ultralytics' logger: shown where its own warnings are, silenced where its are (ranks > 0)."""
    from fastfeed.integrations.ultralytics.args import log, warn_unsupported

    assert log.parent is logging.getLogger("ultralytics") and log.isEnabledFor(logging.WARNING)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append((record.levelno, record.getMessage()))
    log.addHandler(handler)
    try:
        warn_unsupported(get_cfg(DEFAULT_CFG, {"copy_paste": 0.1}), loader="device")
    finally:
        log.removeHandler(handler)
    assert any(level == logging.WARNING and "fastfeed: copy_paste=0.1: the device loader does not render it" in m
               for level, m in seen)


def test_store_is_where_pack_put_it(sample_yolo):  # noqa: F811
    store = prepare_store(str(sample_yolo / "images" / "train2017"), progress=False)
    assert Path(store.manifest.source["root"]) == sample_yolo.resolve() and store.manifest.source["split"] == "train2017"


def test_store_options_given_on_the_trainer_read_the_bucket_store_and_the_environment_stays_the_default(
        sample_yolo, bucket, remote_env, tmp_path, monkeypatch):  # noqa: F811
    """`FastfeedTrainer.with_store_options(...)` reaches the Store a trainer reads (FASTFEED_STORE=s3://...): its shards
    go to the cache folder given, not to $FASTFEED_SHARD_CACHE, which a plain FastfeedTrainer still uses."""
    from ultra_data import first_batches, train_loader_of

    from fastfeed.integrations.ultralytics import FastfeedTrainer
    from fastfeed.pack import PackConfig, pack
    from fastfeed.store.options import StoreOptions

    url = f"s3://{bucket}/train.ff"
    pack(PackConfig(src=sample_yolo / "images" / "train2017", out=url, format="yolo", shards=2, progress=False))
    env_cache, given_cache = tmp_path / "env-cache", tmp_path / "given-cache"
    monkeypatch.setenv("FASTFEED_STORE", url)
    monkeypatch.setenv("FASTFEED_SHARD_CACHE", str(env_cache))

    def shards_in(folder):
        return sorted(p.name for p in folder.rglob("*.mdb"))

    trainer_cls = FastfeedTrainer.with_store_options(shard_cache=given_cache, read_ahead=1)
    assert issubclass(trainer_cls, FastfeedTrainer) and FastfeedTrainer.store_options is None
    assert trainer_cls.store_options == StoreOptions(shard_cache=given_cache, read_ahead=1)
    trainer, loader = train_loader_of(trainer_cls, sample_yolo, tmp_path / "given")
    assert trainer.train_store(None).options.shard_cache == given_cache
    first_batches(loader, 1)
    loader.close()
    assert shards_in(given_cache) and not shards_in(env_cache)

    trainer, loader = train_loader_of(FastfeedTrainer, sample_yolo, tmp_path / "env")   # the environment's default
    first_batches(loader, 1)
    loader.close()
    assert shards_in(env_cache)

    with pytest.raises(TypeError, match="unknown store option.*cache_limt.*give read_ahead, retries, shard_cache,"):
        FastfeedTrainer.with_store_options(cache_limt="1G")
