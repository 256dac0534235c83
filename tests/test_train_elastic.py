"""Elastic resume in `fastfeed train`: a run stopped mid-epoch on 2 gloo ranks resumes on 1 and on 3, and one
stopped with 2 workers resumes with 1; every record of the interrupted epoch is trained once, none twice (the
indices of the batches the optimizer steps took)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from train_helpers import TINY, free_port, gloo_rank, join_ranks, packed_sample

from fastfeed.train import TrainConfig, load_checkpoint, train

# 16 images, batch 2: 2 ranks x 4 batches per epoch; stopped after 1 step (4 records), 12 left for the new ranks.
RUN = TINY | dict(epochs=1, close_mosaic=0, warmup_epochs=0)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


def tap(path):
    """Record the `indices` of every batch an optimizer step takes, in `path` (json); returns the undo."""
    import fastfeed.train.step as step

    real, seen = step.next_batch, []

    class Tap:
        def __init__(self, it):
            self.it = it

        def __next__(self):
            b = next(self.it)
            seen.append(b.indices.tolist())
            path.write_text(json.dumps(seen))
            return b

    step.next_batch = lambda run, batches, keep: real(run, Tap(batches), keep)
    return lambda: setattr(step, "next_batch", real)


def _rank(rank, world, port, store, out, extra, tag):
    tap(out / f"seen-{tag}-{rank}.json")
    with gloo_rank(rank, world, port):
        train(TrainConfig(data=store, out=out, **RUN, **extra))


def _ddp(world, store, out, tag, **extra) -> None:
    out.mkdir(exist_ok=True)
    ctx = torch.multiprocessing.start_processes(_rank, args=(world, free_port(), store, out, extra, tag), nprocs=world,
                                                join=False, start_method="spawn")
    join_ranks(ctx)


def seen(out, tag) -> list[list[int]]:
    return [b for p in sorted(out.glob(f"seen-{tag}-*.json")) for b in json.loads(p.read_text())]


def each_once(batches, n=16) -> None:
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(n)), f"not each record once: {sorted(flat.tolist())}"


@pytest.fixture(scope="module")
def stopped(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("elastic") / "run"
    _ddp(2, store, out, "first", max_steps=1)
    ck = load_checkpoint(out / "last.pt")
    assert (ck["epoch"], ck["batches_done"], ck["loader"]["world_size"]) == (0, 1, 2)
    assert len(seen(out, "first")) == 2
    return out


@pytest.mark.slow
def test_two_ranks_stopped_mid_epoch_resume_on_one_each_record_once(store, stopped, tmp_path, caplog):
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    undo = tap(out / "seen-one-0.json")
    try:
        with caplog.at_level("INFO", logger="fastfeed"):
            train(TrainConfig(data=store, out=out, resume=True, **RUN))
    finally:
        undo()
    assert "world size 2 -> 1: the 12 records of the epoch not yet trained are dealt to 1 rank(s), 6 batches each" \
        in caplog.text
    each_once(seen(out, "first") + seen(out, "one"))


@pytest.mark.slow
def test_two_ranks_stopped_mid_epoch_resume_on_three_each_record_once(store, stopped, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    _ddp(3, store, out, "three", resume=True)
    each_once(seen(out, "first") + seen(out, "three"))
    assert len(seen(out, "three")) == 6 and load_checkpoint(out / "last.pt")["epoch"] == 1


@pytest.mark.slow
def test_two_workers_stopped_mid_epoch_resume_with_one_exactly(store, tmp_path, caplog):
    ref, out = tmp_path / "ref", tmp_path / "run"
    for where, extra in ((ref, {}), (out, {"max_steps": 3})):
        undo = tap(where.with_suffix(".json"))
        try:
            train(TrainConfig(data=store, out=where, **(RUN | {"workers": 2}), **extra))
        finally:
            undo()
    undo = tap(tmp_path / "resumed.json")
    try:
        with caplog.at_level("INFO", logger="fastfeed"):
            train(TrainConfig(data=store, out=out, resume=True, **(RUN | {"workers": 1})))
    finally:
        undo()
    assert "resuming epoch 1 after 3 batches per rank: workers 2 -> 1; the same records in the same batches" \
        in caplog.text
    first, rest = (json.loads((tmp_path / f).read_text()) for f in ("run.json", "resumed.json"))
    assert first + rest == json.loads((tmp_path / "ref.json").read_text())   # the uninterrupted run's batches
    each_once(first + rest)
