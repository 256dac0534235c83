"""Exact resume under DDP (2 gloo processes on the CPU): each rank's random generators come back as they were, and a
data source that fails on one rank stops both ranks at the same step with one last.pt, from which --resume ends
with the weights of the uninterrupted run. Every rank draws from Python's, numpy's and torch's generators after
each batch, a rank-dependent number of times, so the ranks' generators differ and a rank given another rank's
state draws other numbers."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from train_helpers import TINY, free_port, gloo_rank, join_ranks, packed_sample

from fastfeed.store.objstore import RemoteError
from fastfeed.train import TrainConfig, load_checkpoint, train
from fastfeed.train.guards import DataSourceFailed

# 16 images / (2 ranks x batch 2) = 4 steps per epoch, 2 epochs, mosaic in both.
RUN = TINY | dict(epochs=2, close_mosaic=0, warmup_epochs=0)


def _draws() -> list:
    return [torch.rand(2).tolist(), np.random.rand(2).tolist(), [random.random(), random.random()]]


def test_the_generators_state_goes_through_a_weights_only_checkpoint_and_an_older_one_still_restores(tmp_path):
    from fastfeed.devices import rng_state, set_rng_state
    from fastfeed.train.checkpoint import save_checkpoint

    cpu = torch.device("cpu")
    save_checkpoint(tmp_path / "last.pt", {"rng": [rng_state(cpu)]})
    expected = _draws()
    _draws()
    set_rng_state(load_checkpoint(tmp_path / "last.pt")["rng"][0], cpu)   # torch.load(weights_only=True) took it
    assert _draws() == expected                                            # Python's, numpy's and torch's
    old = {"torch": torch.get_rng_state()}   # a checkpoint from before Python's and numpy's were kept
    expected = torch.rand(2)
    set_rng_state(old, cpu)
    assert torch.equal(torch.rand(2), expected)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


def tap(rank: int, path, fail_at: int | None):
    """Each batch a step takes: its indices and rank+1 draws of each generator, kept in `path`; with `fail_at` k,
    the k-th batch (counted over the run) raises the data source's error instead, as a lost bucket does."""
    import fastfeed.train.step as step

    real, seen = step.next_batch, []

    class Tap:
        def __init__(self, it):
            self.it = it

        def __next__(self):
            if fail_at is not None and len(seen) + 1 == fail_at:
                raise RemoteError("s3://bucket/train: unreachable (test)")
            b = next(self.it)
            draws = [[torch.rand(1).item(), float(np.random.rand()), random.random()] for _ in range(rank + 1)]
            seen.append([b.indices.tolist(), draws])
            path.write_text(json.dumps(seen))
            return b

    step.next_batch = lambda run, batches, keep: real(run, Tap(batches), keep)


def _rank(rank, world, port, store, out, extra, tag, fail_rank, fail_at):
    random.seed(rank)   # (set_up seeds torch's alone; these two then start where they started in the reference)
    np.random.seed(rank)
    tap(rank, out / f"seen-{tag}-{rank}.json", fail_at if rank == fail_rank else None)
    with gloo_rank(rank, world, port):
        try:
            s = train(TrainConfig(data=store, out=out, **RUN, **extra)).summary
            result = {"step": s["step"], "error": None}
        except DataSourceFailed as e:
            result = {"step": None, "error": str(e)}
        (out / f"result-{tag}-{rank}.json").write_text(json.dumps(result))


def _ddp(store, out, tag, fail_rank=None, fail_at=None, **extra) -> list[dict]:
    out.mkdir(exist_ok=True)
    ctx = torch.multiprocessing.start_processes(_rank, args=(2, free_port(), store, out, extra, tag, fail_rank, fail_at),
                                                nprocs=2, join=False, start_method="spawn")
    join_ranks(ctx)   # every rank finishes (none is left in a collective), else both are killed and this fails
    return [json.loads((out / f"result-{tag}-{r}.json").read_text()) for r in (0, 1)]


def seen(out, tag, rank) -> list:
    return json.loads((out / f"seen-{tag}-{rank}.json").read_text())


@pytest.fixture(scope="module")
def reference(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    assert [r["step"] for r in _ddp(store, out, "ref")] == [8, 8]
    return out


def same_run(reference, out, parts: list[tuple[str, int]]) -> None:
    """`out`'s last.pt holds the reference's weights bit for bit, and each rank's batches and draws over the runs
    `parts` ((tag, batches kept of it)) are the reference's."""
    a, b = load_checkpoint(reference / "last.pt"), load_checkpoint(out / "last.pt")
    for part in ("model", "ema"):
        for name, v in a[part].items():
            assert torch.equal(v, b[part][name]), (part, name)
    for rank in (0, 1):
        got = [x for tag, keep in parts for x in seen(out, tag, rank)[:keep]]
        assert got == seen(reference, "ref", rank), f"rank {rank}: other batches or other draws than the reference's"


@pytest.mark.slow
def test_two_ranks_stopped_mid_epoch_resume_with_each_ranks_generators_and_the_same_weights(store, reference,
                                                                                             tmp_path):
    out = tmp_path / "run"
    # a --save-every-min that is due at every step: rank 0's timer, agreed in the loss all-reduce, has every rank
    # give its generators at each step boundary (a rank left out would hang the gather)
    first = _ddp(store, out, "first", max_steps=5, save_every_min=1e-6)
    assert [r["step"] for r in first] == [5, 5]   # epoch 2, batch 1 of 4
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["why"], r["step"]) for r in rows if r.get("event") == "checkpoint"] == \
        [("timer", 1), ("timer", 2), ("timer", 3), ("epoch", 4), ("stop", 5)]
    ck = load_checkpoint(out / "last.pt")
    assert (ck["epoch"], ck["batches_done"]) == (1, 1) and len(ck["rng"]) == 2
    assert not torch.equal(ck["rng"][0]["torch"], ck["rng"][1]["torch"])   # the ranks' own, not rank 0's twice
    assert [r["step"] for r in _ddp(store, out, "resumed", resume=True)] == [8, 8]
    same_run(reference, out, [("first", 5), ("resumed", 3)])


@pytest.mark.slow
def test_a_source_failing_on_one_rank_stops_both_at_one_step_with_one_last_pt_and_resume_is_exact(store, reference,
                                                                                                  tmp_path):
    out = tmp_path / "run"
    ranks = _ddp(store, out, "lost", fail_rank=1, fail_at=7)   # rank 1's 7th batch: epoch 2, the 3rd step
    assert [r["step"] for r in ranks] == [None, None], ranks
    for r in ranks:   # the same error on both: which rank's source failed, where every rank stopped, how to resume
        assert r["error"].startswith("rank 1: s3://bucket/train: unreachable (test) (the other ranks stopped at the "
                                     "same step); training stopped at epoch 2, step 6 (2 of 4 batches): "), r["error"]
        assert f"{out / 'last.pt'} holds the last finished step: continue with the same command and --resume" \
            in r["error"]
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".pt") == ["last.pt"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    saved = [r for r in rows if r.get("event") == "checkpoint"]
    assert [(r["why"], r["step"]) for r in saved] == [("epoch", 4), ("data source failed", 6)]   # written once
    ck = load_checkpoint(out / "last.pt")
    assert (ck["epoch"], ck["batches_done"], ck["step"]) == (1, 2, 6)
    assert len(seen(out, "lost", 1)) == 6 and len(seen(out, "lost", 0)) == 7   # rank 0 took the undone step's batch
    assert [r["step"] for r in _ddp(store, out, "resumed", resume=True)] == [8, 8]
    same_run(reference, out, [("lost", 6), ("resumed", 2)])
