"""The bottleneck verdict: the step split into data / copy / compute / communication, judged against the
health figures, with what to try; end to end it names `data` when the loader is slow and `compute` when the
step is."""

from __future__ import annotations

import json
import time

import pytest
from train_helpers import TINY, packed_sample, rows

import fastfeed.train.setup as setup_mod
from fastfeed.cli import main
from fastfeed.train import TrainConfig, train
from fastfeed.train.model import YOLO
from fastfeed.train.verdict import verdict

CTX = dict(loader="cpu", workers=2, cores=8, device="cuda", amp=None, channels_last=False, device_augment=False,
           batch_auto=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


def row(data=0.0, h2d=0.0, compute=0.0, comm=0.0, **kw):
    return {"data_ms": data, "h2d_ms": h2d, "compute_ms": compute, "comm_ms": comm, **kw}


def test_the_verdict_names_the_largest_part_unless_compute_keeps_the_device_busy():
    v = verdict(row(data=60, compute=40), 16, CTX)
    assert v["bottleneck"] == "data" and v["shares"]["data"] == pytest.approx(0.6)
    assert v["advice"][:2] == ["--loader shm (every image decoded once, shared by all workers)",
                               "more --workers (now 2 of 8 cores)"] and "--device-augment" in v["advice"][2]
    assert "bottleneck: data (waiting for data 60% of the step, 3.8 ms per image)" in v["text"]
    v = verdict(row(data=1, compute=90, util_pct=97.0), 16, CTX)
    assert v["bottleneck"] == "compute" and all(h["ok"] for h in v["health"])
    assert v["advice"] == ["--amp (bf16)", "--channels-last (what Tensor Cores want under AMP)",
                           "a larger batch (--batch auto: the most that fits)"] and "busy 97% by NVML" in v["text"]
    tuned = CTX | {"amp": "bf16", "channels_last": True, "batch_auto": True, "loader": "shm", "workers": 8,
                   "device_augment": True}
    assert "--amp" not in " ".join(verdict(row(compute=9), 16, tuned)["advice"])   # nothing it already does
    v = verdict(row(compute=70, comm=25, data=5, mem_frac=0.95), 16, CTX)
    assert v["bottleneck"] == "comm"
    assert {h["figure"]: h["ok"] for h in v["health"]} == {"busy": False, "data_ms_per_image": True, "comm": False,
                                                          "memory": False}
    assert "memory at 95% of the device: --grad-ckpt" in v["advice"][-1]
    assert verdict(row(compute=50, h2d=40), 16, CTX)["bottleneck"] == "h2d"
    v = verdict(row(data=10, compute=80), 1, CTX | {"device": "cpu"})   # 89% busy, but 10 ms per image
    assert v["bottleneck"] == "compute" and not v["health"][1]["ok"] and "--amp" not in v["advice"]


class _StepClock:
    """The clock the trainer's step times its parts with (fastfeed.train.step's `time`), plus the seconds a test
    adds: a slow loader or a slow forward without sleeping, so the shares follow what the test built, never how
    busy the machine is (a real sleep of 2 s a batch against a step the load made slower was a race)."""

    def __init__(self):
        self.added = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.added

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.fixture
def step_clock(monkeypatch):
    import fastfeed.train.step as step

    clock = _StepClock()
    monkeypatch.setattr(step, "time", clock)
    return clock


class _SlowFeed:
    """The trainer's device feed with `delay` seconds (of `clock`) before each batch: a loader that cannot keep
    up."""

    def __init__(self, feed, delay, clock):
        self.feed, self.delay, self.clock, self.on_device = feed, delay, clock, False

    def set_epoch(self, epoch, start=0):
        self.feed.set_epoch(epoch, start)

    def __iter__(self):
        for batch in self.feed:
            self.clock.added += self.delay
            yield batch

    def state_dict(self, *args, **kw):   # its position is the feed's: it hands out the same batches
        return self.feed.state_dict(*args, **kw)

    def close(self):
        self.feed.close()


def test_the_verdict_names_data_for_a_slow_loader(store, tmp_path, monkeypatch, capsys, step_clock):
    real = setup_mod.device_batches
    # 20 s a batch on the step's clock: far above any real step of this tiny model, however loaded the machine
    monkeypatch.setattr(setup_mod, "device_batches", lambda *a, **kw: _SlowFeed(real(*a, **kw), 20.0, step_clock))
    args = ["train", "--data", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--batch", "2", "--workers", "0",
            "--accum", "1", "--max-steps", "4", "--out", str(tmp_path), "--quiet", "--json"]
    assert main(args) == 0
    s = json.loads(capsys.readouterr().out)
    v = s["bottleneck"]
    assert v["bottleneck"] == "data" and v["shares"]["data"] > 0.5 and v["ms"]["data"] >= 2000
    assert "--loader shm" in v["advice"][0]
    assert rows(tmp_path)[-1]["data_ms"] >= 2000 and rows(tmp_path, "summary")[0]["bottleneck"]["bottleneck"] == "data"


def test_the_verdict_names_compute_for_a_slow_step(store, tmp_path, monkeypatch, step_clock):
    real = YOLO.forward

    def slow(self, x):
        if self.training:
            step_clock.added += 5.0   # 5 s a forward on the step's clock: loading a batch takes milliseconds
        return real(self, x)

    monkeypatch.setattr(YOLO, "forward", slow)
    s = train(TrainConfig(data=store, out=tmp_path, max_steps=4, **TINY)).summary
    assert s["bottleneck"]["bottleneck"] == "compute" and s["compute_ms"] >= 250
    assert s["bottleneck"]["shares"]["compute"] >= 0.85
