"""FASTFEED_LOADER=device inside Ultralytics' trainer, with the CPU as the device: batches decoded and
augmented on the trainer's device, handed to its loss in the dtype it trains in with nothing converted in
preprocess_batch; boxes frame the painted objects; one epoch trains and validates; the arguments the other
loaders honour are honoured (multi_scale, single_cls, cache) or named (mixup)."""

from __future__ import annotations

import time

import pytest
import torch
from ultra_data import (  # noqa: F401
    NO_COLOUR,
    as_targets,
    first_batches,
    painted_yolo,
    sample_yolo,
    sample_yolo_master,
    train_loader_of,
)

pytest.importorskip("ultralytics")

from ddp_trainer import RecordingTrainer  # noqa: E402
from loader_checks import assert_boxes_frame_paint  # noqa: E402
from ultralytics import YOLO  # noqa: E402

from fastfeed.integrations.ultralytics import FastfeedTrainer, FastfeedTrainLoader  # noqa: E402
from fastfeed.integrations.ultralytics.device import training_dtype  # noqa: E402

SIZE = 128


@pytest.fixture
def device_loader(monkeypatch):
    monkeypatch.setenv("FASTFEED_LOADER", "device")


class _Seen(FastfeedTrainer):
    """Keeps, per training batch, what preprocess_batch got and gave."""

    seen: list = []

    def preprocess_batch(self, batch):
        img = batch["img"]
        out = super().preprocess_batch(batch)
        self.seen.append({"in": img, "out": out["img"], "device": out["img"].device, "cls": out["cls"].clone(),
                          "vram_cache": getattr(self.train_loader.loader, "cache", None) is not None})
        return out


def test_boxes_frame_the_painted_objects_in_the_trainers_batches(painted_yolo, tmp_path, device_loader):  # noqa: F811
    trainer, feed = train_loader_of(FastfeedTrainer, painted_yolo, tmp_path, imgsz=SIZE, **NO_COLOUR)
    try:
        assert isinstance(feed, FastfeedTrainLoader) and feed.name == "device" and feed.on_device
        batches = first_batches(feed, 6)
        for b in batches:   # on the trainer's device, images in [0,1] in the dtype it trains in (float32 here)
            assert b["img"].device == trainer.device and b["img"].dtype == torch.float32
            assert b["img"].shape[1:] == (3, SIZE, SIZE) and 0 <= float(b["img"].min()) <= float(b["img"].max()) <= 1
            assert b["cls"].device == b["bboxes"].device == trainer.device
        as_uint8 = [((img * 255).round().to(torch.uint8), t) for img, t in map(as_targets, batches)]
        assert_boxes_frame_paint(as_uint8, SIZE, min_boxes=20)
    finally:
        feed.close()


def test_one_epoch_trains_and_validates_with_nothing_converted(sample_yolo, tmp_path, device_loader):  # noqa: F811
    _Seen.seen = []
    model = YOLO("yolov8n.yaml")
    metrics = model.train(data=str(sample_yolo / "data.yaml"), trainer=_Seen, epochs=1, imgsz=64, batch=8,
                          device="cpu", plots=True, workers=0, seed=0, project=str(tmp_path), name="d")
    trainer = model.trainer
    assert trainer.train_loader.name == "device" and not isinstance(trainer.test_loader, FastfeedTrainLoader)
    assert len(_Seen.seen) == 2
    for s in _Seen.seen:   # preprocess_batch handed the loader's tensor on as it was: no copy, no conversion
        assert s["out"] is s["in"] and s["out"].dtype == torch.float32 and s["device"] == trainer.device
    assert 0.0 <= metrics.box.map50 <= 1.0 and (trainer.save_dir / "weights" / "best.pt").is_file()
    assert (trainer.save_dir / "train_batch0.jpg").is_file()     # Ultralytics' plots read the float batch
    assert trainer.train_loader.loader.stage_times().samples == 16


def test_a_bf16_trainer_gets_bf16_batches_and_its_plots_read_them(painted_yolo, tmp_path, device_loader):  # noqa: F811
    """amp='bf16' (Ultralytics autocasts to bfloat16; it does that on CUDA only, so only the loader runs here)."""
    trainer, feed = train_loader_of(FastfeedTrainer, painted_yolo, tmp_path, imgsz=SIZE, amp="bf16", plots=True)
    trainer.train_loader = feed   # as _setup_train sets it
    try:
        batch = next(iter(feed))
        assert batch["img"].dtype == torch.bfloat16 and feed.options["dtype"] == "bfloat16"
        assert trainer.preprocess_batch(batch)["img"].dtype == torch.bfloat16   # no conversion on the way
        trainer.plot_training_samples(batch, 0)                                 # numpy has no bfloat16: converted
        plot = trainer.save_dir / "train_batch0.jpg"
        for _ in range(100):                                                    # Ultralytics plots in a thread
            if plot.is_file():
                break
            time.sleep(0.1)
        assert plot.is_file()
    finally:
        feed.close()


def test_the_dtype_follows_the_trainers_precision():
    from types import SimpleNamespace as NS

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert training_dtype(NS(args=NS(amp=True), amp=False, device=gpu)) == torch.float32    # check_amp said no
    assert training_dtype(NS(args=NS(amp=True), amp=True, device=gpu)) == torch.float16
    assert training_dtype(NS(args=NS(amp="bf16"), amp=True, device=gpu)) == torch.bfloat16
    assert training_dtype(NS(args=NS(amp=True), device=cpu)) == torch.float32   # before _setup_train: as it will be
    assert training_dtype(NS(args=NS(amp=True), device=gpu)) == torch.float16
    assert training_dtype(NS(args=NS(amp=False), device=gpu)) == torch.float32


def test_multi_scale_single_cls_cache_and_mixup(sample_yolo, tmp_path, device_loader, caplog):  # noqa: F811
    _Seen.seen = []
    model = YOLO("yolov8n.yaml")
    with caplog.at_level("INFO", logger="ultralytics"):
        model.train(data=str(sample_yolo / "data.yaml"), trainer=_Seen, epochs=2, imgsz=64, batch=4, device="cpu",
                    plots=False, val=False, workers=0, seed=0, project=str(tmp_path), name="ms", multi_scale=0.5,
                    single_cls=True, cache=True, mixup=0.3, close_mosaic=1)
    sizes = {tuple(s["out"].shape[-2:]) for s in _Seen.seen}
    assert len(sizes) > 1 and all(h == w and h % 32 == 0 and 32 <= h <= 96 for h, w in sizes)   # 64 x [0.5, 1.5]
    assert all(s["in"].shape[-1] == 64 for s in _Seen.seen)       # the loader's size; the resize is the trainer's
    assert all((s["cls"] == 0).all() for s in _Seen.seen)         # single_cls, on the device's targets
    feed = model.trainer.train_loader
    assert feed.options["cache"] == "device" and all(s["vram_cache"] for s in _Seen.seen)   # cache=True: VRAM cache
    assert "mixup=0.3: the device loader does not render it (the cpu and shm loaders do)" in caplog.text
    assert "keeps the decoded store in cpu memory" in caplog.text


def test_a_resumed_device_run_draws_the_same_sizes(sample_yolo, tmp_path, device_loader, monkeypatch):  # noqa: F811
    """multi_scale's sizes depend on the batch's place in the run, so a mid-epoch resume draws the same ones."""
    run = dict(data=str(sample_yolo / "data.yaml"), epochs=1, imgsz=64, batch=2, nbs=2, device="cpu", plots=False,
               val=False, workers=0, seed=0, multi_scale=0.5, warmup_epochs=0)
    whole = YOLO("yolov8n.yaml")
    whole.train(trainer=RecordingTrainer, project=str(tmp_path), name="w", **run)
    monkeypatch.setenv("FF_SIGNAL", "0:0:2")
    stopped = YOLO("yolov8n.yaml")
    with pytest.raises(SystemExit):
        stopped.train(trainer=RecordingTrainer, project=str(tmp_path), name="s", **run)
    monkeypatch.delenv("FF_SIGNAL", raising=False)
    resumed = YOLO(str(tmp_path / "s" / "weights" / "last.pt"))
    resumed.train(resume=True, trainer=RecordingTrainer)
    files = [f for _, f, _ in stopped.trainer._seen + resumed.trainer._seen]
    assert files == [f for _, f, _ in whole.trainer._seen]
    assert stopped.trainer.img_sizes + resumed.trainer.img_sizes == whole.trainer.img_sizes
