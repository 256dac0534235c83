"""2-process DDP on CPU through Ultralytics' own launcher (see ddp_trainer.py for what had to change to
run it on CPU, and why): each rank builds its own fastfeed loader from the cloudpickled trainer,
reads its own half of every epoch, and with cache=True both ranks map one shared cache."""

from __future__ import annotations

import json

import pytest
from ultra_data import sample_yolo, sample_yolo_master  # noqa: F401  (fixtures)

pytest.importorskip("ultralytics")
pytest.importorskip("cloudpickle")

from ddp_trainer import CpuDdpTrainer  # noqa: E402
from ultralytics import YOLO  # noqa: E402


@pytest.mark.parametrize("cache, loader", [(False, "cpu"), (True, "shm")])
def test_two_ranks_on_cpu_read_disjoint_halves(sample_yolo, tmp_path, monkeypatch, cache, loader):  # noqa: F811
    out = tmp_path / "ranks"
    out.mkdir()
    monkeypatch.setenv("FF_DDP_OUT", str(out))
    monkeypatch.delenv("FASTFEED_LOADER", raising=False)
    YOLO("yolov8n.yaml").train(data=str(sample_yolo / "data.yaml"), trainer=CpuDdpTrainer, epochs=2, close_mosaic=1,
                               imgsz=64, batch=8, device="cpu", cache=cache, plots=False, project=str(tmp_path),
                               name="ddp", seed=3, workers=0)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["loader_rank"] for r in ranks] == [0, 1] and {r["loader_world"] for r in ranks} == {2}
    assert {r["loader"] for r in ranks} == {loader} and {r["ddp_model"] for r in ranks} == {"_CpuDDP"}
    assert not any(r["ddp_left"] or r["group_left"] for r in ranks)   # let go before the exit (StoppableMixin)
    assert {r["batch_size"] for r in ranks} == {4} and {r["batches"] for r in ranks} == {2}   # batch 8 over 2 ranks
    for epoch in (0, 1):
        halves = [[f for e, files, _ in r["seen"] if e == epoch for f in files] for r in ranks]
        assert len(halves[0]) == len(halves[1]) == 8
        assert not set(halves[0]) & set(halves[1]) and len(set(halves[0]) | set(halves[1])) == 16
    if loader == "shm":
        assert ranks[0]["cache"] == ranks[1]["cache"] is not None      # one decoded copy for the node ...
        assert sorted(r["built"] for r in ranks) == [False, True]       # ... built by one rank, mapped by the other
    assert "metrics/mAP50-95(B)" in ranks[0]["metrics"]                 # Ultralytics' validation ran, over both ranks
    assert (tmp_path / "ddp" / "weights" / "best.pt").is_file() and (tmp_path / "ddp" / "results.csv").is_file()
