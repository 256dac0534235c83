"""--multi-scale, --freeze-bn, --channels-last (and Ascend's NC1HWC0 against a fake torch_npu), --sync-bn."""

from __future__ import annotations

import socket
import sys

import pytest
import torch
from train_helpers import TINY, fixed_batch, packed_sample, rows

import fastfeed.train.setup as setup_mod
from fastfeed.devices import NPU_FORMAT_NC1HWC0, to_channels_last
from fastfeed.train import TrainConfig, TrainError, build_model, load_checkpoint, train
from fastfeed.train.device import size_range, step_size
from fastfeed.train.loss import YoloLoss


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


def record_inputs(monkeypatch):
    """Every forward's (training?, input shape, channels-last?) of the models train() builds (and their EMA):
    a hook on the stem, which predict() reaches too (it calls forward directly)."""
    seen, real = [], setup_mod.build_model

    def hook(module, args):
        x = args[0]
        seen.append((module.training, tuple(x.shape), x.is_contiguous(memory_format=torch.channels_last)))

    def build(name, nc):
        model = real(name, nc)
        model.stem.register_forward_pre_hook(hook)
        return model

    monkeypatch.setattr(setup_mod, "build_model", build)
    monkeypatch.setattr("fastfeed.train.guards.image_seconds", lambda run: 0.0)   # the cost's image: no batch
    return seen


# --- multi-scale ---------------------------------------------------------------------------------------------

def test_multi_scale_sizes_are_multiples_of_32_in_range_and_seeded():
    sizes = [step_size(0, s, 640, 32) for s in range(400)]
    assert size_range(640, 32) == (320, 960) and size_range(64, 32) == (32, 96) and size_range(32, 32) == (32, 32)
    assert all(s % 32 == 0 and 320 <= s <= 960 for s in sizes)
    assert set(sizes) == set(range(320, 961, 32))                    # every size in range is drawn
    assert sizes == [step_size(0, s, 640, 32) for s in range(400)]   # deterministic per seed ...
    assert sizes != [step_size(1, s, 640, 32) for s in range(400)]   # ... and the seed matters


def test_multi_scale_trains_at_each_steps_size_and_evaluates_at_imgsz(store, tmp_path, monkeypatch):
    seen = record_inputs(monkeypatch)
    cfg = TINY | {"epochs": 1, "batch": 4}
    r = train(TrainConfig(data=store, val=store, out=tmp_path, max_steps=4, multi_scale=True, seed=3, **cfg))
    trained = [shape for training, shape, _ in seen if training]
    assert trained == [(4, 3, s, s) for s in (step_size(3, k, 64, 32) for k in range(4))]
    assert len({s[-1] for s in trained}) > 1                       # it did change size
    evaluated = {shape[-1] for training, shape, _ in seen if not training}
    assert evaluated == {64} and r.summary["map50"] is not None    # evaluation stays at --imgsz


# --- freeze-bn ----------------------------------------------------------------------------------------------------

def test_freeze_bn_keeps_running_statistics_and_affine_weights(store, tmp_path):
    train(TrainConfig(data=store, out=tmp_path / "pre", max_steps=1, **TINY))
    start = load_checkpoint(tmp_path / "pre" / "last.pt")["ema"]   # what --weights loads
    r = train(TrainConfig(data=store, out=tmp_path / "ft", max_steps=3, freeze_bn=True,
                          weights=tmp_path / "pre" / "last.pt", **TINY))
    after = r.model.state_dict()
    bn = [k for k in after if any(k.endswith(s) for s in ("running_mean", "running_var"))]
    affine = [k.rsplit(".", 1)[0] for k in bn if k.endswith("running_mean")]
    assert len(bn) == 2 * 11                                       # every BatchNorm of yolov3-tiny
    for k in bn + [f"{m}.{w}" for m in affine for w in ("weight", "bias")]:
        assert torch.equal(after[k], start[k]), k
    assert not torch.equal(after["stem.0.weight"], start["stem.0.weight"])   # the convolutions did train
    unfrozen = train(TrainConfig(data=store, out=tmp_path / "plain", max_steps=1, weights=tmp_path / "pre" / "last.pt",
                                 **TINY)).model.state_dict()
    assert not torch.equal(unfrozen["stem.1.running_mean"], start["stem.1.running_mean"])   # not vacuous


# --- channels-last ------------------------------------------------------------------------------------------------

def test_channels_last_gives_the_same_loss_and_gradients(store):
    x, t = fixed_batch(store, 2)
    torch.manual_seed(0)
    model = build_model("yolov3-tiny", 80)
    twin = build_model("yolov3-tiny", 80)
    twin.load_state_dict(model.state_dict())
    twin = to_channels_last(twin, "cpu")
    assert twin.stem[0].weight.is_contiguous(memory_format=torch.channels_last)
    l0, i0 = YoloLoss(model, 64)(model(x), t)
    l1, i1 = YoloLoss(twin, 64)(twin(to_channels_last(x, "cpu")), t)
    l0.backward()
    l1.backward()
    assert torch.allclose(l0, l1, rtol=1e-5) and torch.allclose(i0, i1, rtol=1e-5, atol=1e-7)
    # Gradients: the same up to float32 summation order (NHWC kernels add in another order; BatchNorm's backward
    # amplifies it towards the input layers): within 1% in norm, every parameter.
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert (p.grad - q.grad).norm() <= 1e-2 * p.grad.norm() + 1e-8, name


def test_channels_last_through_the_trainer(store, tmp_path, monkeypatch):
    seen = record_inputs(monkeypatch)
    r = train(TrainConfig(data=store, out=tmp_path / "cl", max_steps=2, channels_last=True, **TINY))
    assert all(cl for training, _, cl in seen if training) and len(seen) == 2   # the prefetcher laid them out
    assert r.model.stem[0].weight.is_contiguous(memory_format=torch.channels_last)
    plain = train(TrainConfig(data=store, out=tmp_path / "plain", max_steps=2, **TINY))
    for a, b in zip(rows(tmp_path / "cl"), rows(tmp_path / "plain")):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    # two SGD steps, each gradient apart by float32 summation order only (within 1% in norm: the test above), so
    # within 2% in norm, every tensor (the stem's BatchNorm bias is those two updates alone: ~2e-3, apart by ~1%)
    for (k, va), vb in zip(r.model.state_dict().items(), plain.model.state_dict().values()):
        va, vb = va.double(), vb.double()
        assert (va - vb).norm() <= 2e-2 * vb.norm() + 1e-8, k


class _FakeTorchNpu(type(sys)):
    def __init__(self, cast=True):
        super().__init__("torch_npu")
        self.calls = []
        if cast:
            self.npu_format_cast = lambda x, fmt: self.calls.append((x, fmt)) or x * 1


def test_npu_channels_last_is_nc1hwc0_through_torch_npu(monkeypatch):
    fake = _FakeTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    x, model = torch.rand(1, 3, 32, 32), build_model("yolov3-tiny", 2)
    y = to_channels_last(x, "npu:0")
    assert len(fake.calls) == 1 and fake.calls[0][0] is x and fake.calls[0][1] == NPU_FORMAT_NC1HWC0 == 3
    assert torch.equal(y, x)
    assert to_channels_last(model, "npu") is model and len(fake.calls) == 1   # weights: the NPU runtime's formats
    monkeypatch.setitem(sys.modules, "torch_npu", _FakeTorchNpu(cast=False))   # a torch_npu without the cast
    assert to_channels_last(x, "npu") is x
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(ImportError, match="needs torch_npu"):
        to_channels_last(x, "npu")


# --- sync-bn -------------------------------------------------------------------------------------------------------

def test_sync_bn_on_gloo_says_what_to_do(store, tmp_path):
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with pytest.raises(TrainError, match=r"--sync-bn: .*nccl \(CUDA\) or hccl \(Ascend NPU\); this run's "
                                             r"processes use gloo on the cpu.*Drop --sync-bn, or train on --device"):
            train(TrainConfig(data=store, out=tmp_path, max_steps=1, sync_bn=True, **TINY))
    finally:
        dist.destroy_process_group()
    with pytest.raises(ValueError, match="--sync-bn and --freeze-bn exclude each other"):
        TrainConfig(data=store, sync_bn=True, freeze_bn=True)


@pytest.mark.parametrize("name", ["augment", "device_augment", "channels_last", "eval_only"])
def test_a_switch_that_is_not_a_bool_is_refused_naming_the_train_setting(name):
    with pytest.raises(ValueError, match=f"^TrainConfig.{name} must be True or False, got 'no'$"):
        TrainConfig(data=".", **{name: "no"})   # was: taken as True, or refused later as LoaderConfig.augment


# --- on a GPU -----------------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_cuda_channels_last_multi_scale_amp_and_the_step_split(store, tmp_path):
    import os

    r = train(TrainConfig(data=store, out=tmp_path, max_steps=3, device="cuda", amp="bf16", channels_last=True,
                          multi_scale=True, **(TINY | {"imgsz": 128, "batch": 4})))
    s = r.summary
    assert s["step"] == 3 and next(r.model.parameters()).is_cuda
    assert 0 < s["mem_frac"] < 1 and s["mem_total_mb"] > s["mem_peak_reserved_mb"] > 0
    assert s["h2d_ms"] >= 0 and s["bottleneck"]["bottleneck"] in ("data", "h2d", "compute", "comm")
    assert any(os.environ.get(v) for v in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"))
