"""Out-of-memory recovery (an injected torch.OutOfMemoryError: half the micro-batch, twice the micro-batches
per step, the weights of a run that started there; a stop with the numbers after two halvings), micro-batch
slicing, and --batch auto's search."""

from __future__ import annotations

import pytest
import torch
from train_helpers import TINY, free_port, gloo_rank, join_ranks, packed_sample, rows, same_weights

from fastfeed.train import TrainConfig, TrainError, train
from fastfeed.train.loss import YoloLoss
from fastfeed.train.model import YOLO
from fastfeed.train.oom import MicroBatches, fit_batch, slice_batch


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise torch.OutOfMemoryError("CUDA out of memory (injected in backward)")


def inject_oom(monkeypatch, where: str, when, large: int):
    """torch.OutOfMemoryError in the forward (at its start) or the backward of the micro-batches of `large`
    images for which when(k) is true, k counting them from 0; returns the list of those k that raised."""
    raised, count = [], {"n": 0}

    def due(n_images) -> bool:
        if n_images < large:
            return False
        k, count["n"] = count["n"], count["n"] + 1
        if when(k):
            raised.append(k)
            return True
        return False

    if where == "forward":
        real = YOLO.forward

        def forward(self, x):
            if self.training and due(x.shape[0]):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
            return real(self, x)

        monkeypatch.setattr(YOLO, "forward", forward)
    else:
        real = YoloLoss.__call__

        def call(self, preds, targets):
            loss, items = real(self, preds, targets)
            return (_RaiseInBackward.apply(loss) if due(preds[0].shape[0]) else loss), items

        monkeypatch.setattr(YoloLoss, "__call__", call)
    return raised


OOM_CFG = TINY | {"batch": 4, "accum": 2, "epochs": 1}


@pytest.fixture(scope="module")
def unhalved(store, tmp_path_factory):
    """(folder, small, plain): the runs a halved one must match (micro-batches of 2 from the start) and must not
    (of 4 throughout); the same for every case, so run once."""
    out = tmp_path_factory.mktemp("unhalved")
    small = train(TrainConfig(data=store, out=out / "small", max_steps=3, micro_batch=2, **OOM_CFG))
    return out, small, train(TrainConfig(data=store, out=out / "plain", max_steps=3, **OOM_CFG))


@pytest.mark.parametrize("where, k", [("forward", 0), ("backward", 1)])
def test_an_oom_halves_the_micro_batch_and_ends_with_the_smaller_runs_weights(store, tmp_path, monkeypatch, where, k,
                                                                              unhalved):
    """Two loader batches of 4 per optimizer step. forward: the very first micro-batch of 4 raises. backward:
    the second one does, in its backward, after the first had run forward and backward at 4 (its gradients and
    BatchNorm statistics must be undone before the step is replayed at 2)."""
    ref, small, plain = unhalved
    raised = inject_oom(monkeypatch, where, lambda n: n == k, large=4)
    big = train(TrainConfig(data=store, out=tmp_path / "big", max_steps=3, **OOM_CFG))
    assert raised == [k]
    (event,) = rows(tmp_path / "big", "oom")
    assert (event["step"], event["micro_batch"], event["micro_batches_per_step"]) == (0, 2, 4)   # 2 before
    for s in (big.summary, small.summary):
        assert (s["batch"], s["micro_batch"], s["micro_batches_per_step"], s["images_per_step"]) == (4, 2, 4, 8)
    same_weights(big.model, small.model, rtol=1e-6, atol=1e-7)      # BatchNorm statistics included
    same_weights(big.ema, small.ema, rtol=1e-6, atol=1e-7)
    for a, b in zip(rows(tmp_path / "big"), rows(ref / "small")):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6) and a["lr"] == b["lr"]
    assert plain.summary["micro_batch"] == 4 and plain.summary["loss"] != big.summary["loss"]   # 4 at a time differs


def test_after_two_halvings_it_stops_with_the_numbers(store, tmp_path, monkeypatch):
    inject_oom(monkeypatch, "forward", lambda k: True, large=2)
    with pytest.raises(TrainError, match=r"out of memory at epoch 0, step 0, batch 1 of 1 with micro-batches of 2 "
                                         r"image\(s\), after halving 2 time\(s\) \(8 -> 4 -> 2\)\. Free memory first: "
                                         r"--amp, --grad-ckpt"):
        train(TrainConfig(data=store, out=tmp_path, max_steps=2, **(TINY | {"batch": 8})))
    assert [(r["micro_batch"], r["micro_batches_per_step"]) for r in rows(tmp_path, "oom")] == [(4, 2), (2, 4)]


def test_micro_batches_slice_images_and_renumber_targets():
    images = torch.arange(5).view(5, 1, 1, 1).float()
    targets = torch.tensor([[0, 1, .5, .5, .1, .1], [2, 3, .5, .5, .1, .1], [3, 4, .5, .5, .1, .1],
                            [4, 5, .5, .5, .1, .1]])
    mb = MicroBatches(batch=5, size=2)
    assert mb.chunks(5) == [(0, 2), (2, 4), (4, 5)] and mb.per_batch == 3
    x, t = slice_batch(images, targets, 2, 4)
    assert x.flatten().tolist() == [2, 3] and t[:, :2].tolist() == [[0, 3], [1, 4]]
    assert targets[1, 0] == 2                                     # the batch's own targets are untouched
    assert MicroBatches(5, 5).halve("here", 2, "").endswith("micro-batches of 3 (4 per optimizer step instead of 2, "
                                                             "the same 10 images per step and rank)")


def test_batch_auto_fits_the_largest_batch_within_the_budget():
    calls = []

    def probe(b):   # 1 GiB fixed + 100 MiB per image; the device has 4 GiB
        calls.append(b)
        need = 2**30 + b * 100 * 2**20
        if need > 4 * 2**30:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return need

    budget = 0.85 * 4 * 2**30
    best, pts = fit_batch(probe, budget, limit=1024)
    assert best == int((budget - 2**30) / (100 * 2**20)) == 24     # the most within 85% of 4 GiB
    assert calls[:5] == [1, 2, 4, 8, 16] and len(calls) == 6       # doubling, then the fit's answer, checked
    assert fit_batch(probe, budget, limit=10)[0] == 10              # no more than the store allows
    with pytest.raises(TrainError, match="--batch auto: one image does not fit within 500 MiB"):
        fit_batch(probe, 500 * 2**20, limit=64)


def test_batch_auto_on_the_cpu_says_to_give_a_number(store, tmp_path):
    with pytest.raises(TrainError, match="--batch auto measures the accelerator's memory; on the CPU give --batch N"):
        train(TrainConfig(data=store, out=tmp_path, max_steps=1, **(TINY | {"batch": "auto"})))


# --- DDP: the ranks agree, and replay together ------------------------------------------------------------------

def _ddp_oom_worker(rank, world, port, store, out, where, k):
    from _pytest.monkeypatch import MonkeyPatch

    mp = MonkeyPatch()
    with gloo_rank(rank, world, port):
        try:
            if rank == 1:   # one rank alone runs out of memory
                inject_oom(mp, where, lambda n: n == k, large=2)
            res = train(TrainConfig(data=store, out=out / "run", max_steps=2, warmup_epochs=0,
                                    **(TINY | {"accum": 2, "epochs": 1})))
            torch.save({"state": res.model.state_dict(), "summary": res.summary}, out / f"rank{rank}.pt")
        finally:
            mp.undo()


@pytest.mark.slow
@pytest.mark.parametrize("where, k", [("forward", 1), ("backward", 0)])
def test_ddp_ranks_agree_on_an_oom_and_replay_together(store, tmp_path, where, k):
    """rank 1 runs out of memory, rank 0 does not. forward, k=1: in the micro-batch whose backward all-reduces
    (the ranks agree before it); backward, k=0: in a no_sync micro-batch (they agree at its loss sync)."""
    import torch.multiprocessing as tmp

    ctx = tmp.start_processes(_ddp_oom_worker, args=(2, free_port(), store, tmp_path, where, k), nprocs=2,
                              join=False, start_method="spawn")
    join_ranks(ctx, timeout=120)   # ranks that disagreed on the OOM would wait in a collective: killed, failed
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for key, v in r0["state"].items():
        if "running" not in key and "num_batches" not in key:
            assert torch.equal(v, r1["state"][key]), key
    assert r0["summary"]["micro_batch"] == r1["summary"]["micro_batch"] == 1
    assert r0["summary"]["step"] == 2 and len(rows(tmp_path / "run", "oom")) == 1
