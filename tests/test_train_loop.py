"""The training loop end to end at tiny sizes: resume, accumulation, activation checkpointing, DDP, a NaN
stop, checkpoints and the bench hook (the CLI: test_train_cli.py)."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from train_helpers import TINY, fixed_batch, free_port, gloo_rank, grads, packed_sample, rows

from fastfeed.cli import main
from fastfeed.train import (
    CheckpointError,
    TrainConfig,
    TrainingDiverged,
    bench_step,
    build_model,
    load_checkpoint,
    train,
)
from fastfeed.train.device import autocast, grad_scaler
from fastfeed.train.loss import YoloLoss
from fastfeed.train.step import micro_step


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


# --- resume -----------------------------------------------------------------------------------------

def test_resume_continues_exactly_like_an_uninterrupted_run(store, tmp_path):
    a = train(TrainConfig(data=store, out=tmp_path / "a", max_steps=3, **TINY))
    b1 = train(TrainConfig(data=store, out=tmp_path / "b", max_steps=2, **TINY))
    assert b1.summary["step"] == 2
    ck = load_checkpoint(tmp_path / "b" / "last.pt")
    assert (ck["epoch"], ck["step"], ck["batches_done"]) == (0, 2, 2)   # mid-epoch: 8 batches per epoch
    b2 = train(TrainConfig(data=store, out=tmp_path / "b", max_steps=3, resume=True, **TINY))
    la, lb = rows(tmp_path / "a")[-1], rows(tmp_path / "b")[-1]
    assert la["step"] == lb["step"] == 3
    assert lb["loss"] == pytest.approx(la["loss"], rel=1e-6, abs=1e-7)
    assert lb["lr"] == la["lr"]
    for (k, va), vb in zip(a.model.state_dict().items(), b2.model.state_dict().values()):
        assert torch.allclose(va, vb, rtol=1e-5, atol=1e-6), k
    for va, vb in zip(a.ema.state_dict().values(), b2.ema.state_dict().values()):
        assert torch.allclose(va, vb, rtol=1e-5, atol=1e-6)
    assert [r["event"] for r in json.loads("[" + ",".join((tmp_path / "b" / "metrics.jsonl").read_text().split("\n")[:-1])
                                           + "]") if "event" in r] == ["start", "pace", "pace", "checkpoint", "summary", "resume", "pace", "pace",
                                                                 "checkpoint", "summary"]


def test_checkpoints_load_weights_only_and_are_written_atomically(store, tmp_path):
    train(TrainConfig(data=store, out=tmp_path, max_steps=1, **TINY))
    ck = torch.load(tmp_path / "last.pt", weights_only=True)   # no pickled code inside
    assert ck["model_name"] == "yolov3-tiny" and ck["nc"] == 80 and ck["step"] == 1
    assert {"model", "ema", "optimizer", "scaler", "rng", "config"} <= set(ck)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "metrics.jsonl"]   # no temp files left
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a loadable fastfeed checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"a": 1}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a fastfeed checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="is a yolov3-tiny with 80 classes, not a yolov3"):
        train(TrainConfig(data=store, out=tmp_path, max_steps=2, resume=True, **(TINY | {"model": "yolov3"})))
    data = bytearray((tmp_path / "last.pt").read_bytes())   # one bit of a weight flipped on the disk
    data[len(data) // 2] ^= 0x10
    (tmp_path / "damaged.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"damaged.pt is damaged: .*/data/\d+'s bytes do not match their CRC-32"):
        load_checkpoint(tmp_path / "damaged.pt")   # torch.load alone reads it, a silently different weight


# --- gradients: accumulation and activation checkpointing --------------------------------------------

def test_accumulating_two_micro_batches_matches_one_double_batch(store):
    """BatchNorm is put in eval mode: in train mode it normalises each micro-batch by its own statistics,
    which no accumulation can reproduce. The loss normalises box and class terms by the number of
    positives, so the second half is the first one mirrored: the same number of positives, other pixels."""
    torch.manual_seed(0)
    x, t = fixed_batch(store, 2)
    x2 = x.flip(-1)
    t2 = t.clone()
    t2[:, 0] += 2
    t2[:, 2] = 1 - t2[:, 2]
    big_x, big_t = torch.cat((x, x2)), torch.cat((t, t2))
    half_t2 = t2.clone()
    half_t2[:, 0] -= 2
    model = build_model("yolov3-tiny", 80)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eval()
    loss_fn = YoloLoss(model, 64)
    kw = dict(device=torch.device("cpu"), amp=None, scaler=grad_scaler(torch.device("cpu"), None), loss_scale=1.0)
    micro_step(model, loss_fn, big_x, big_t, **kw)
    g_big = grads(model)
    model.zero_grad()
    micro_step(model, loss_fn, x, t, **kw)
    micro_step(model, loss_fn, x2, half_t2, **kw)    # accumulates into .grad
    g_acc = grads(model)
    assert g_big.keys() == g_acc.keys()
    for k in g_big:
        assert torch.allclose(g_big[k], g_acc[k], rtol=1e-4, atol=1e-6), k


@pytest.mark.parametrize("name", ["yolov3-tiny", "yolov3"])
def test_activation_checkpointing_gives_the_same_gradients_and_bn_statistics(store, name):
    torch.manual_seed(0)
    x, t = fixed_batch(store, 2)
    model = build_model(name, 80)
    loss_fn = YoloLoss(model, 64)
    results = []
    for ckpt in (False, True):
        m = build_model(name, 80)
        m.load_state_dict(model.state_dict())
        m.grad_ckpt = ckpt
        loss, _ = loss_fn(m(x), t)
        loss.backward()
        results.append((loss.item(), grads(m), {k: v.clone() for k, v in m.state_dict().items() if "running" in k}))
    (l0, g0, bn0), (l1, g1, bn1) = results
    assert l0 == l1
    for k in g0:
        assert torch.allclose(g0[k], g1[k], rtol=1e-5, atol=1e-7), k
    for k in bn0:   # recomputation in backward must not update running statistics a second time
        assert torch.equal(bn0[k], bn1[k]), k


def test_grad_ckpt_and_bf16_amp_run_through_the_loop(store, tmp_path):
    r = train(TrainConfig(data=store, out=tmp_path, max_steps=2, grad_ckpt=True, amp="bf16", **TINY))
    assert r.summary["step"] == 2 and all(torch.isfinite(p).all() for p in r.model.parameters())
    with autocast(torch.device("cpu"), "bf16"):
        assert r.model.stem(torch.rand(1, 3, 32, 32)).dtype == torch.bfloat16
    assert r.model.stem[1].weight.dtype == torch.float32   # norms (and all weights) stay fp32


# --- DDP ----------------------------------------------------------------------------------------------

def _ddp_worker(rank, world, port, store, out):
    with gloo_rank(rank, world, port):
        res = train(TrainConfig(data=store, out=out / "run", max_steps=1, warmup_epochs=0, **TINY))
        torch.save({"state": res.model.state_dict(), "summary": res.summary if rank == 0 else None},
                   out / f"rank{rank}.pt")


@pytest.mark.slow
def test_ddp_two_processes_keep_identical_weights(store, tmp_path):
    torch.multiprocessing.spawn(_ddp_worker, args=(2, free_port(), store, tmp_path), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{k}.pt", weights_only=True) for k in (0, 1))
    torch.manual_seed(0)
    init = build_model("yolov3-tiny", 80)
    params = {n for n, _ in init.named_parameters()}
    init = init.state_dict()
    changed = 0
    for k in params:   # every weight: DDP averaged the gradients, so the same step was taken
        assert torch.equal(r0["state"][k], r1["state"][k]), k
        changed += not torch.equal(r0["state"][k], init[k])
    assert changed == len(params)                         # a step happened
    # BatchNorm running statistics are each rank's own until DDP broadcasts rank 0's at the next forward
    # (rank 0's are the ones checkpointed): they differ, which shows the ranks saw different images.
    assert not torch.equal(r0["state"]["stem.1.running_mean"], r1["state"]["stem.1.running_mean"])
    s = r0["summary"]
    assert s["world_size"] == 2 and s["images_per_step"] == 4 and s["step"] == 1
    assert s["comm_ms"] > 0 and s["bottleneck"]["ms"]["comm"] == s["comm_ms"]   # the comm hook timed the all-reduce
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 1


# --- NaN stop -------------------------------------------------------------------------------------------

def test_a_nan_loss_stops_cleanly_and_keeps_the_last_good_checkpoint(store, tmp_path, monkeypatch):
    cfg = dict(TINY, batch=8, epochs=3)          # 2 steps per epoch: last.pt is written after step 2
    real, calls = YoloLoss.__call__, {"n": 0}

    def poisoned(self, preds, targets):
        calls["n"] += 1
        loss, items = real(self, preds, targets)
        if calls["n"] == 3:
            return loss * float("nan"), items * float("nan")
        return loss, items

    monkeypatch.setattr(YoloLoss, "__call__", poisoned)
    monkeypatch.setattr("fastfeed.train.guards.image_seconds", lambda run: 0.0)   # the cost's image calls it too
    with pytest.raises(TrainingDiverged, match=r"non-finite at epoch 1, step 2 .* last good checkpoint is .*last\.pt"):
        train(TrainConfig(data=store, out=tmp_path, **cfg))
    ck = torch.load(tmp_path / "last.pt", weights_only=True)
    assert (ck["epoch"], ck["step"]) == (1, 2)
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())
    assert rows(tmp_path, "diverged")[0]["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "metrics.jsonl"]
    # The CLI says the same and exits 1; the checkpoint is untouched; resuming from it trains on.
    digest = hashlib.sha256((tmp_path / "last.pt").read_bytes()).hexdigest()
    calls["n"] = 2
    args = ["train", "--data", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--batch", "8", "--epochs", "3",
            "--workers", "0", "--accum", "1", "--out", str(tmp_path), "--resume", "--quiet"]
    assert main(args) == 1
    assert hashlib.sha256((tmp_path / "last.pt").read_bytes()).hexdigest() == digest
    monkeypatch.setattr(YoloLoss, "__call__", real)
    assert main(args + ["--max-steps", "3"]) == 0
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 3


# --- the bench hook -------------------------------------------------------------------------------------

def test_bench_step_trains_and_fastfeed_bench_model_runs(store, capsys):
    step = bench_step("yolov3-tiny", torch.device("cpu"), 64, 2)
    images = torch.randint(0, 255, (2, 3, 64, 64), dtype=torch.uint8)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.3], [1, 200, 0.5, 0.5, 0.3, 0.3]])   # class 200 >= nc: dropped
    step(images, targets)
    step(images, targets)
    assert main(["bench", "--data", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--batch", "2",
                 "--batches", "2", "--warmup", "1", "--workers", "0", "--quiet"]) == 0


# --- accelerators ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_cuda_amp_and_grad_ckpt(store, tmp_path, amp):
    r = train(TrainConfig(data=store, out=tmp_path, max_steps=3, device="cuda", amp=amp, grad_ckpt=True,
                          **(TINY | {"imgsz": 128, "batch": 4})))
    s = r.summary
    assert s["step"] == 3 and s["mem_peak_mb"] > 0 and next(r.model.parameters()).is_cuda
    assert all(torch.isfinite(p).all() for p in r.model.parameters())
