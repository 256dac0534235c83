"""Resuming mid-epoch with mosaic on and loader workers: the loader starts at the checkpoint's batch
(`set_epoch(epoch, start)`, nothing before it rebuilt) and the run ends with the uninterrupted run's weights."""

from __future__ import annotations

import pytest
from train_helpers import TINY, packed_sample, rows, same_weights

from fastfeed.loaders.base import Loader
from fastfeed.train import TrainConfig, load_checkpoint, train


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


@pytest.mark.slow   # ~7 s: two runs
def test_resume_mid_epoch_with_mosaic_and_workers_matches_the_uninterrupted_run(store, tmp_path, monkeypatch):
    # close_mosaic=0: mosaic on in every epoch (TINY's 2 epochs would otherwise fall inside close_mosaic's 10).
    cfg = TINY | {"workers": 1, "close_mosaic": 0, "epochs": 2}
    starts, real = [], Loader.set_epoch

    def spy(self, epoch, start=0):
        starts.append((epoch, start))
        return real(self, epoch, start)

    monkeypatch.setattr(Loader, "set_epoch", spy)
    a = train(TrainConfig(data=store, out=tmp_path / "a", max_steps=4, **cfg))
    train(TrainConfig(data=store, out=tmp_path / "b", max_steps=2, **cfg))
    ck = load_checkpoint(tmp_path / "b" / "last.pt")
    assert (ck["epoch"], ck["batches_done"]) == (0, 2)              # mid-epoch: 8 batches per epoch
    starts.clear()
    b = train(TrainConfig(data=store, out=tmp_path / "b", max_steps=4, resume=True, **cfg))
    assert set(starts) == {(0, 2)}             # started at batch 2 (load_state_dict, then the epoch), not replayed from 0
    assert b.summary["images"] == 2 * 2                             # trained on the 2 remaining steps only
    same_weights(a.model, b.model)
    same_weights(a.ema, b.ema)
    assert rows(tmp_path / "b")[-1]["loss"] == pytest.approx(rows(tmp_path / "a")[-1]["loss"], rel=1e-6)
    assert load_checkpoint(tmp_path / "b" / "last.pt")["step"] == 4


@pytest.mark.slow   # two short runs (~18 s); the line itself: test_loader_position
def test_a_resume_with_another_close_mosaic_says_so_and_what_it_does(store, tmp_path, caplog):
    cfg = TINY | {"workers": 0, "epochs": 2}
    train(TrainConfig(data=store, out=tmp_path / "r", max_steps=2, close_mosaic=0, **cfg))
    with caplog.at_level("INFO", logger="fastfeed.train"):
        train(TrainConfig(data=store, out=tmp_path / "r", max_steps=3, resume=True, close_mosaic=1, **cfg))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("resumed at step"))
    assert "close mosaic 0 -> 1: mosaic off from epoch 2 (the run had it off never)" in line
    assert "the same records in the same batches" in line
