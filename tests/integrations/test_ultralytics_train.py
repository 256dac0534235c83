"""`YOLO(...).train(trainer=FastfeedTrainer)` end to end on the bundled sample: one epoch with the cpu and
the shm loader trains and is validated by Ultralytics' own validator; cache=True picks shm; close_mosaic
switches mosaic off; an interrupted run resumes at the next epoch."""

from __future__ import annotations

import csv
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from ultra_data import painted_yolo, sample_yolo, sample_yolo_master  # noqa: F401  (fixtures)

pytest.importorskip("ultralytics")

from ultralytics import YOLO  # noqa: E402

from fastfeed.integrations.ultralytics import FastfeedTrainer, FastfeedTrainLoader  # noqa: E402
from fastfeed.integrations.ultralytics.store import prepare_store  # noqa: E402
from fastfeed.loaders import LoaderConfig  # noqa: E402
from fastfeed.train.checkpoint import CheckpointError  # noqa: E402

FAST = dict(imgsz=64, batch=8, device="cpu", plots=False, workers=0, seed=0)


def _rows(save_dir) -> list[dict]:
    with open(save_dir / "results.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("cache, loader", [(False, "cpu"), (True, "shm")])
def test_one_epoch_trains_and_validates(sample_yolo, tmp_path, monkeypatch, cache, loader):  # noqa: F811
    monkeypatch.delenv("FASTFEED_LOADER", raising=False)
    model = YOLO("yolov8n.yaml")
    metrics = model.train(data=str(sample_yolo / "data.yaml"), trainer=FastfeedTrainer, epochs=1, cache=cache,
                          project=str(tmp_path), name=loader, **FAST)
    trainer = model.trainer
    assert isinstance(trainer.train_loader, FastfeedTrainLoader) and trainer.train_loader.name == loader
    assert not isinstance(trainer.test_loader, FastfeedTrainLoader)          # validation: Ultralytics' own loader
    assert trainer.train_loader.loader.stage_times().samples == 16           # the epoch came from fastfeed
    assert 0.0 <= metrics.box.map50 <= 1.0 and 0.0 <= metrics.box.map <= 1.0
    rows = _rows(trainer.save_dir)
    assert len(rows) == 1 and float(rows[0]["train/box_loss"]) > 0 and "metrics/mAP50(B)" in rows[0]
    assert (trainer.save_dir / "weights" / "best.pt").is_file()


def test_close_mosaic_turns_the_loader_off_mosaic(sample_yolo, tmp_path):  # noqa: F811
    model = YOLO("yolov8n.yaml")
    model.train(data=str(sample_yolo / "data.yaml"), trainer=FastfeedTrainer, epochs=2, close_mosaic=1,
                project=str(tmp_path), name="cm", val=False, **FAST)
    feed = model.trainer.train_loader
    assert feed.epoch == 1 and feed.dataset.mosaic is False
    assert feed.cfg.mosaic_on(0) and not feed.cfg.mosaic_on(1)               # the loader's own schedule


def test_a_negative_close_mosaic_keeps_mosaic_on_as_ultralytics_does(sample_yolo, tmp_path):  # noqa: F811
    """Was `ValueError: LoaderConfig.close_mosaic must be >= 0, got -1`, a setting the user never gave."""
    model = YOLO("yolov8n.yaml")
    model.train(data=str(sample_yolo / "data.yaml"), trainer=FastfeedTrainer, epochs=1, close_mosaic=-1,
                project=str(tmp_path), name="cm", val=False, **FAST)
    feed = model.trainer.train_loader
    assert feed.cfg.close_mosaic == 0 and feed.dataset.mosaic is True and feed.cfg.mosaic_on(0)


def _boxes_per_image(feed, epoch: int) -> int:
    feed.epoch = epoch
    return max(int(np.bincount(b["batch_idx"].int().numpy()).max()) for b in feed if len(b["batch_idx"]))


def test_close_mosaic_earlier_than_planned_switches_loaders(painted_yolo):  # noqa: F811
    """Ultralytics' `time` mode re-plans epochs, so its close_mosaic can come before the loader's schedule."""
    store = prepare_store(str(painted_yolo / "images" / "train"), progress=False)
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=0, epochs=100, close_mosaic=10, seed=0)
    feed = FastfeedTrainLoader("cpu", store, cfg)
    try:
        assert _boxes_per_image(feed, 3) > 2          # mosaic: tiles of several 2-box images
        feed.dataset.close_mosaic(hyp=None)
        assert feed.dataset.mosaic is False and not feed.cfg.mosaic_on(3)
        assert _boxes_per_image(feed, 3) <= 2         # one painted image per sample: at most its 2 boxes
    finally:
        feed.close()


class _Stop(Exception):
    pass


def _stop_after_first_epoch(trainer):
    if trainer.epoch == 0:
        raise _Stop   # after last.pt is saved: a resumable checkpoint at epoch 1 of 2


def _one_bit_flipped(src: Path, dst: Path) -> tuple[Path, str]:
    """A copy of the checkpoint `src` with the lowest bit of a number in its largest record flipped; (dst, record)."""
    with zipfile.ZipFile(src) as z:
        rec = max(z.infolist(), key=lambda i: i.file_size)   # a tensor's bytes, stored uncompressed
    data = bytearray(src.read_bytes())
    h = rec.header_offset   # the local header: 30 bytes, then the name and the extra field (their lengths at 26, 28)
    start = h + 30 + int.from_bytes(data[h + 26:h + 28], "little") + int.from_bytes(data[h + 28:h + 30], "little")
    data[start + rec.file_size // 2 // 4 * 4] ^= 1
    dst.parent.mkdir(parents=True)
    dst.write_bytes(data)
    return dst, rec.filename


def test_an_interrupted_run_resumes_at_the_next_epoch(sample_yolo, tmp_path):  # noqa: F811
    model = YOLO("yolov8n.yaml")
    model.add_callback("on_fit_epoch_end", _stop_after_first_epoch)
    with pytest.raises(_Stop):
        model.train(data=str(sample_yolo / "data.yaml"), trainer=FastfeedTrainer, epochs=2, close_mosaic=0,
                    project=str(tmp_path), name="r", **FAST)
    last = tmp_path / "r" / "weights" / "last.pt"
    assert torch.load(last, weights_only=False)["epoch"] == 0
    damaged, record = _one_bit_flipped(last, tmp_path / "damaged" / "last.pt")
    with pytest.raises(CheckpointError, match=rf"^{damaged} is damaged: {record}'s bytes do not match their CRC-32"):
        YOLO(str(damaged)).train(resume=True, trainer=FastfeedTrainer)   # torch.load had read it as other weights

    resumed = YOLO(str(last))
    resumed.train(resume=True, trainer=FastfeedTrainer)
    trainer = resumed.trainer
    assert trainer.start_epoch == 1 and trainer.train_loader.epoch == 1   # the loader served epoch 2's order
    assert [int(r["epoch"]) for r in _rows(trainer.save_dir)] == [1, 2]


def test_plots_and_autobatch_read_the_store(sample_yolo, tmp_path):  # noqa: F811
    """plot_training_labels reads dataset.labels, plot_training_samples a batch, AutoBatch the store's box counts."""
    model = YOLO("yolov8n.yaml")
    model.train(data=str(sample_yolo / "data.yaml"), trainer=FastfeedTrainer, epochs=1, project=str(tmp_path),
                name="p", val=False, **(FAST | {"batch": -1, "plots": True}))
    trainer = model.trainer
    assert trainer.batch_size == 16 == trainer.train_loader.batch_size   # AutoBatch's CPU default
    assert (trainer.save_dir / "labels.jpg").is_file() and (trainer.save_dir / "train_batch0.jpg").is_file()


def test_one_epoch_from_a_store_in_object_storage(sample_yolo, s3, tmp_path, monkeypatch):  # noqa: F811
    """FASTFEED_STORE=s3://...: the trainer reads a store in a bucket (moto's S3 API on 127.0.0.1) through the
    node's shard cache."""
    from fastfeed.pack import PackConfig, pack

    url = f"s3://{s3.bucket()}/train.ff"
    pack(PackConfig(src=sample_yolo / "data.yaml", out=url, workers=1, shards=4, progress=False))
    monkeypatch.setenv("FASTFEED_STORE", url)
    monkeypatch.setenv("FASTFEED_SHARD_CACHE", str(tmp_path / "shards"))
    model = YOLO("yolov8n.yaml")
    model.train(data=str(sample_yolo / "data.yaml"), trainer=FastfeedTrainer, epochs=1, cache=False,
                project=str(tmp_path), name="s3", **FAST)
    loader = model.trainer.train_loader.loader
    assert loader.store.remote and loader.store.path == url
    assert loader.stage_times().samples == 16                                # the epoch came from the bucket
    assert len(loader.store.cache.fetched()) == 4                            # each shard downloaded once
    assert (model.trainer.save_dir / "weights" / "best.pt").is_file()
