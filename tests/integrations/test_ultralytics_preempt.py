"""FastfeedTrainer stopped mid-epoch (a SIGTERM, or a crash after FASTFEED_SAVE_EVERY_MIN saves), then
Ultralytics' own `resume=True`: the batches after the resume are exactly those an uninterrupted run trains
next (their im_files), none of the interrupted epoch is trained twice; also under Ultralytics' DDP launcher
(2 CPU ranks, the signal to one of them)."""

from __future__ import annotations

import json

import pytest
import torch
from ultra_data import sample_yolo, sample_yolo_master  # noqa: F401  (fixtures)

pytest.importorskip("ultralytics")
pytest.importorskip("cloudpickle")

from ddp_trainer import CpuDdpTrainer, RecordingTrainer  # noqa: E402
from ultralytics import YOLO  # noqa: E402
from ultralytics.nn.tasks import load_checkpoint  # noqa: E402

from fastfeed.integrations.ultralytics import FastfeedTrainer, Preempted  # noqa: E402
from fastfeed.integrations.ultralytics.exact import STATE_KEY  # noqa: E402
from fastfeed.integrations.ultralytics.resume import KEY, STOP_FILE  # noqa: E402

# 16 images / batch 2 = 8 batches per epoch; nbs=2: an optimizer step after every batch.
RUN = dict(imgsz=64, batch=2, nbs=2, epochs=2, close_mosaic=0, device="cpu", plots=False, workers=0, seed=0,
           val=False, warmup_epochs=0)


def _train(data, tmp_path, name, cls=RecordingTrainer, **over):
    model = YOLO("yolov8n.yaml")
    model.train(data=str(data / "data.yaml"), trainer=cls, project=str(tmp_path), name=name, **(RUN | over))
    return model.trainer


def _files(seen, epoch=None) -> list[tuple]:
    return [tuple(files) for e, files, _ in seen if epoch is None or e == epoch]


@pytest.fixture
def uninterrupted(sample_yolo, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.delenv("FF_SIGNAL", raising=False)
    return _files(_train(sample_yolo, tmp_path, "u")._seen)


def test_sigterm_mid_epoch_then_resume_trains_the_next_batches_once(sample_yolo, tmp_path, monkeypatch,  # noqa: F811
                                                                  uninterrupted):
    monkeypatch.setenv("FF_SIGNAL", "0:0:3")   # SIGTERM while batch 3 of epoch 0 trains
    model = YOLO("yolov8n.yaml")
    with pytest.raises(Preempted) as stop:
        model.train(data=str(sample_yolo / "data.yaml"), trainer=RecordingTrainer, project=str(tmp_path), name="a",
                    **RUN)
    assert stop.value.code == 75 and "SIGTERM: stopped after 4 batches of epoch 1" in str(stop.value)
    before = _files(model.trainer._seen)
    assert before == uninterrupted[:4]                       # the step in flight finished, then it stopped
    last = tmp_path / "a" / "weights" / "last.pt"
    _, ckpt = load_checkpoint(last)                          # Ultralytics' own reader takes it
    assert ckpt["epoch"] == 0 and ckpt[KEY]["epoch"] == 0 and ckpt[KEY]["batches"] == 4   # epoch: resumable
    assert ckpt[KEY]["stopped_by"] == "SIGTERM" and ckpt["optimizer"] is not None and ckpt["ema"] is not None
    assert json.loads((tmp_path / "a" / STOP_FILE).read_text())["batches"] == 4
    assert not list(last.parent.glob(".*.tmp*"))

    resumed = YOLO(str(last))
    resumed.train(resume=True, trainer=RecordingTrainer)
    after = _files(resumed.trainer._seen)
    assert after == uninterrupted[4:]                        # from the next batch, in the same order
    assert not set(before) & set(_files(resumed.trainer._seen, epoch=0))   # nothing of epoch 0 trained twice
    assert resumed.trainer.start_epoch == 0 and not (tmp_path / "a" / STOP_FILE).exists()
    _, done = load_checkpoint(last)
    assert done["epoch"] == -1 and KEY not in done          # the finished run's, as Ultralytics strips it


class _Crash(Exception):
    pass


def test_periodic_saves_bound_what_a_crash_loses(sample_yolo, tmp_path, monkeypatch, uninterrupted):  # noqa: F811
    monkeypatch.setenv("FASTFEED_SAVE_EVERY_MIN", "1e-6")   # a save after every optimizer step
    model = YOLO("yolov8n.yaml")

    def crash(trainer):
        if len(trainer._seen) == 11:                          # epoch 1, batch 2: after its forward and backward
            raise _Crash

    model.add_callback("on_train_batch_end", crash)
    with pytest.raises(_Crash):
        model.train(data=str(sample_yolo / "data.yaml"), trainer=RecordingTrainer, project=str(tmp_path), name="c",
                    **RUN)
    last = tmp_path / "c" / "weights" / "last.pt"
    _, ckpt = load_checkpoint(last)
    assert (ckpt["epoch"], ckpt[KEY]["epoch"], ckpt[KEY]["batches"], ckpt[KEY]["why"]) == (0, 1, 3, "timer")
    monkeypatch.delenv("FASTFEED_SAVE_EVERY_MIN")
    resumed = YOLO(str(last))
    resumed.train(resume=True, trainer=RecordingTrainer)
    assert _files(resumed.trainer._seen) == uninterrupted[11:]


def _lose_source(data, tmp_path, monkeypatch, **over):
    """A run whose store's reads fail for good after 3 batches (as an s3:// store's do once its retries give up):
    (the trainer, the DataSourceFailed it raised); the reads work again afterwards."""
    from fastfeed.store.objstore import RemoteError
    from fastfeed.store.reader import Store
    from fastfeed.train.guards import DataSourceFailed

    real, out = Store.record, {"now": False}

    def record(self, *a, **k):
        if out["now"]:
            raise RemoteError("downloading s3://b/x.ff/shard-00001.mdb failed 6 times; the last failure: ConnectionError")
        return real(self, *a, **k)

    monkeypatch.setattr(Store, "record", record)
    model = YOLO("yolov8n.yaml")
    model.add_callback("on_train_batch_end", lambda t: out.update(now=len(t._seen) >= 3))
    with pytest.raises(DataSourceFailed) as lost:
        model.train(data=str(data / "data.yaml"), trainer=RecordingTrainer, project=str(tmp_path), name="s",
                    **(RUN | over))
    monkeypatch.setattr(Store, "record", real)
    return model.trainer, lost.value


def test_a_data_source_lost_mid_epoch_saves_last_pt_then_raises_the_named_error(sample_yolo, tmp_path,  # noqa: F811
                                                                                monkeypatch, uninterrupted):
    """last.pt at the last optimizer step, DataSourceFailed naming the failure and the resume, and resume=True
    continues."""
    trainer, lost = _lose_source(sample_yolo, tmp_path, monkeypatch)
    before = _files(trainer._seen)
    n = len(before)
    last = tmp_path / "s" / "weights" / "last.pt"
    assert f"failed 6 times; the last failure: ConnectionError; training stopped after {n} batches of epoch 1: " \
           f"{last} holds them: continue with YOLO('{last}').train(resume=True" in str(lost)
    _, ckpt = load_checkpoint(last)
    assert (ckpt[KEY]["epoch"], ckpt[KEY]["batches"], ckpt[KEY]["why"]) == (0, n, "data source failed")
    assert 3 <= n < 8 and before == uninterrupted[:n] and not list(last.parent.glob(".*.tmp*"))
    resumed = YOLO(str(last))
    resumed.train(resume=True, trainer=RecordingTrainer)
    assert _files(resumed.trainer._seen) == uninterrupted[n:]


def test_a_source_lost_between_two_optimizer_steps_keeps_no_gradients_of_the_batches_trained_again(
        sample_yolo, tmp_path, monkeypatch):  # noqa: F811
    """nbs 4, batch 2: a step every 2 batches. last.pt holds the last step's position; the batches after it are
    trained again on resume, so their gradients must not be in it as well (they would count twice)."""
    trainer, _ = _lose_source(sample_yolo, tmp_path, monkeypatch, nbs=4)
    n = len(trainer._seen)
    _, ckpt = load_checkpoint(tmp_path / "s" / "weights" / "last.pt")
    assert ckpt[KEY]["batches"] == n - n % 2, n   # the last optimizer step's
    kept = [g for g in ckpt[STATE_KEY]["grads"] or () if g is not None]
    assert not kept, f"{n} batches trained, the last step after {n - n % 2}: their gradients kept"


def test_resuming_with_another_batch_size_re_deals_the_rest_of_the_epoch(sample_yolo, tmp_path, monkeypatch,  # noqa: F811
                                                                         caplog):
    monkeypatch.setenv("FF_SIGNAL", "0:0:2")
    model = YOLO("yolov8n.yaml")
    with pytest.raises(Preempted):
        model.train(data=str(sample_yolo / "data.yaml"), trainer=RecordingTrainer, project=str(tmp_path), name="b",
                    **RUN)
    before = [f for files in _files(model.trainer._seen) for f in files]
    assert len(before) == 6
    monkeypatch.delenv("FF_SIGNAL", raising=False)
    resumed = YOLO(str(tmp_path / "b" / "weights" / "last.pt"))
    with caplog.at_level("INFO", logger="ultralytics"):
        resumed.train(resume=True, trainer=RecordingTrainer, batch=4)   # Ultralytics lets batch change on resume
    assert "resuming epoch 1 after 3 batches per rank: batch size 2 -> 4: the 10 records of the epoch not yet " \
           "trained are dealt to 1 rank(s), 3 batches each" in caplog.text
    rest = [f for files in _files(resumed.trainer._seen, epoch=0) for f in files]
    assert len(rest) == len(set(rest)) == 10 and not set(rest) & set(before)   # the 10 not trained, once each


def test_a_bad_save_interval_is_named(sample_yolo, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FASTFEED_SAVE_EVERY_MIN", "soon")
    with pytest.raises(ValueError, match="FASTFEED_SAVE_EVERY_MIN='soon': expected a number of minutes > 0"):
        _train(sample_yolo, tmp_path, "x", cls=FastfeedTrainer)


def test_ddp_a_sigterm_to_one_rank_then_resume_continues_both_halves(sample_yolo, tmp_path, monkeypatch):  # noqa: F811
    """2 ranks x batch 1 (batch=2 over 2 ranks): 8 batches per rank and epoch; rank 1 gets the SIGTERM. With
    Ultralytics' multi_scale each rank draws its sizes from its own Python generator (seeded seed + 1 + rank), so
    the resumed ranks draw the uninterrupted run's sizes only with each rank's generators restored."""
    out = tmp_path / "ranks"
    out.mkdir()
    monkeypatch.setenv("FF_DDP_OUT", str(out))
    monkeypatch.delenv("FASTFEED_LOADER", raising=False)
    ddp = dict(RUN, epochs=1, imgsz=96, multi_scale=0.3)   # sizes 64, 96 or 128

    def ranks():
        return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]

    _train(sample_yolo, tmp_path, "u", cls=CpuDdpTrainer, **ddp)
    whole = [_files(r["seen"]) for r in ranks()]
    whole_sizes = [r["img_sizes"] for r in ranks()]
    assert whole_sizes[0] != whole_sizes[1]   # the ranks' generators differ
    monkeypatch.setenv("FF_SIGNAL", "1:0:2")    # rank 1 only, while it trains its batch 2
    with pytest.raises(Preempted) as stop:      # the launching process: the ranks stopped for a signal
        _train(sample_yolo, tmp_path, "d", cls=CpuDdpTrainer, **ddp)
    assert stop.value.code == 75
    before = [_files(r["seen"]) for r in ranks()]
    sizes = [r["img_sizes"] for r in ranks()]
    n = len(before[0])
    assert len(before[1]) == n and 3 <= n <= 4   # both ranks after the same optimizer step: the one in flight, or
    #                                              the next if the signal came after its all-reduce
    last = tmp_path / "d" / "weights" / "last.pt"
    assert torch.load(last, weights_only=False)[KEY]["batches"] == n
    rngs = torch.load(last, weights_only=False)[STATE_KEY]["rng"]
    assert len(rngs) == 2 and rngs[0]["python"] != rngs[1]["python"]   # each rank's, not rank 0's alone
    monkeypatch.delenv("FF_SIGNAL", raising=False)
    YOLO(str(last)).train(resume=True, trainer=CpuDdpTrainer)
    after = [_files(r["seen"]) for r in ranks()]
    for r in (0, 1):
        assert before[r] + after[r] == whole[r] and not set(before[r]) & set(after[r])
        assert sizes[r] + ranks()[r]["img_sizes"] == whole_sizes[r], f"rank {r}: other multi_scale sizes"
