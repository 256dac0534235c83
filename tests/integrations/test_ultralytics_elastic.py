"""Elastic resume in FastfeedTrainer: a run stopped mid-epoch on 2 ranks (Ultralytics' own DDP launcher, CPU)
resumes in one process; every image of the interrupted epoch is trained once, none twice."""

from __future__ import annotations

import json

import pytest
from ultra_data import sample_yolo, sample_yolo_master  # noqa: F401  (fixtures)

pytest.importorskip("ultralytics")
pytest.importorskip("cloudpickle")

from ddp_trainer import CpuDdpTrainer, RecordingTrainer  # noqa: E402
from ultralytics import YOLO  # noqa: E402

from fastfeed.integrations.ultralytics import Preempted  # noqa: E402

# 16 images, batch 2 over 2 ranks: 8 batches of 1 per rank; nbs=2: an optimizer step after every batch.
RUN = dict(imgsz=64, batch=2, nbs=2, epochs=1, close_mosaic=0, device="cpu", plots=False, workers=0, seed=0,
           val=False, warmup_epochs=0)


@pytest.mark.slow
def test_two_ranks_stopped_mid_epoch_resume_on_one_trains_each_image_once(sample_yolo, tmp_path, monkeypatch,  # noqa: F811
                                                                          caplog):
    out = tmp_path / "ranks"
    out.mkdir()
    monkeypatch.setenv("FF_DDP_OUT", str(out))
    monkeypatch.delenv("FASTFEED_LOADER", raising=False)
    monkeypatch.setenv("FF_SIGNAL", "1:0:2")    # rank 1, while it trains its batch 2
    with pytest.raises(Preempted):
        YOLO("yolov8n.yaml").train(data=str(sample_yolo / "data.yaml"), trainer=CpuDdpTrainer, project=str(tmp_path),
                                   name="d", **RUN)
    before = [f for r in (0, 1) for _, files, _ in json.loads((out / f"rank{r}.json").read_text())["seen"]
              for f in files]
    n = len(before) // 2
    assert 3 <= n <= 4 and len(before) == len(set(before)) == 2 * n
    monkeypatch.delenv("FF_SIGNAL")
    resumed = YOLO(str(tmp_path / "d" / "weights" / "last.pt"))
    with caplog.at_level("INFO", logger="ultralytics"):
        resumed.train(resume=True, trainer=RecordingTrainer)      # device cpu: one process
    rest = [f for e, files, _ in resumed.trainer._seen if e == 0 for f in files]
    assert f"resuming epoch 1 after {n} batches per rank: world size 2 -> 1, batch size 1 -> 2" in caplog.text
    assert f"the {16 - 2 * n} records of the epoch not yet trained are dealt to 1 rank(s)" in caplog.text
    assert len(rest) == len(set(rest)) == 16 - 2 * n and not set(rest) & set(before)
    assert len(set(before) | set(rest)) == 16      # the whole epoch, each image once
