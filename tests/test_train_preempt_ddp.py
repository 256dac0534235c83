"""Preemption under DDP (2 gloo processes on the CPU): a SIGTERM to one rank only stops both after the same
step, rank 0 writes last.pt, and --resume ends with the weights of the uninterrupted 2-process run."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
import torch
from train_helpers import TINY, free_port, gloo_rank, join_ranks, packed_sample, wait_for_rows

from fastfeed.train import TrainConfig, load_checkpoint, train

# 16 images / (2 ranks x batch 2) = 4 steps per epoch, 2 epochs, mosaic in both.
RUN = TINY | dict(epochs=2, close_mosaic=0, warmup_epochs=0)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


def _rank(rank, world, port, store, out, extra):
    with gloo_rank(rank, world, port):
        s = train(TrainConfig(data=store, out=out, **RUN, **extra)).summary
        (out / f"rank{rank}.json").write_text(json.dumps({k: s.get(k) for k in ("stopped_by", "step", "epoch")}))


def _ddp(store, out, signal_rank_1_after: int | None = None, **extra) -> list[dict]:
    """Two ranks; with `signal_rank_1_after` k, SIGTERM to rank 1 alone once rank 0 has logged step k."""
    out.mkdir(exist_ok=True)
    ctx = torch.multiprocessing.start_processes(_rank, args=(2, free_port(), store, out, extra), nprocs=2,
                                                join=False, start_method="spawn")
    try:
        if signal_rank_1_after is not None:
            wait_for_rows(out, signal_rank_1_after, timeout=300)
            os.kill(ctx.pids()[1], signal.SIGTERM)
    finally:
        join_ranks(ctx)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_a_sigterm_to_one_rank_stops_both_at_the_same_step_and_resume_matches(store, tmp_path):
    seed = int(os.environ.get("FF_TEST_SEED", time.time_ns() % 10_000))
    k = random.Random(seed).choice([1, 2, 3, 5, 6, 7])   # mid-epoch (4 steps per epoch)
    ranks = _ddp(store, tmp_path / "b", signal_rank_1_after=k)
    assert [r["stopped_by"] for r in ranks] == ["a signal to another rank", "SIGTERM"], f"seed {seed}"
    assert ranks[0]["step"] == ranks[1]["step"], f"seed {seed}: the ranks stopped after different steps"
    ck = load_checkpoint(tmp_path / "b" / "last.pt")
    # Rank 1 learns of its signal with the loss all-reduce of the step in flight or, if it came after that,
    # of the next one: the step logged, plus at most two.
    assert k <= ck["step"] <= k + 2 and ck["step"] == ranks[0]["step"], f"seed {seed}: signalled after {k}"
    assert (ck["epoch"], ck["batches_done"]) == divmod(ck["step"], 4) and ck["stopped_by"] == "a signal to another rank"
    assert sorted(p.name for p in (tmp_path / "b").iterdir() if p.suffix == ".pt") == ["last.pt"]   # one writer
    resumed = _ddp(store, tmp_path / "b", resume=True)
    assert [r["stopped_by"] for r in resumed] == [None, None] and resumed[0]["step"] == 8
    _ddp(store, tmp_path / "ref")
    a, b = load_checkpoint(tmp_path / "ref" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    for part in ("model", "ema"):
        for name, v in a[part].items():
            assert torch.allclose(v.float(), b[part][name].float(), rtol=1e-5, atol=1e-6), (part, name)
