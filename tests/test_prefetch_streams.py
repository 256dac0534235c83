"""The DevicePrefetcher's stream protocol against a recording fake of torch.cuda / torch.npu."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from prefetch_helpers import (  # noqa: F401
    FakeDeviceModule,
    RecordingOps,
    ReusingLoader,
    both_drivers,
    check_protocol,
    expect_batch,
    prefetch_threads,
)

from fastfeed.device_augment import DeviceAugment
from fastfeed.devices import DeviceError, accelerator_module
from fastfeed.prefetch import DevicePrefetcher

# --- the stream protocol, against a recording fake of torch.cuda / torch.npu ---------------------------











@both_drivers
def test_stream_protocol_on_a_fake_accelerator(thread):
    log = []
    mod = FakeDeviceModule(log)
    loader = ReusingLoader(n=5, log=log)
    pf = DevicePrefetcher(loader, "cuda", depth=2, thread=thread, ops=RecordingOps(mod, torch.device("cuda")))
    for epoch in range(2):                    # one side stream for the prefetcher's life, across epochs
        del log[:]
        pf.set_epoch(epoch)
        got = []
        for b in pf:
            got.append((b, len(log)))
            log.append(("use", len(got) - 1))
        assert [k for k, _ in enumerate(got)] == list(range(5))
        for k, (b, _) in enumerate(got):
            expect_batch(b, k)
        check_protocol(log, got)
    assert len(mod.streams) == 1
    assert not prefetch_threads()


def test_npu_is_imported_only_for_device_npu(monkeypatch):
    loader = ReusingLoader()
    had = "torch_npu" in sys.modules
    list(DevicePrefetcher(loader, "cpu"))
    list(DevicePrefetcher(loader, "cuda", ops=RecordingOps(FakeDeviceModule([]), torch.device("cuda"))))
    assert ("torch_npu" in sys.modules) == had
    monkeypatch.setitem(sys.modules, "torch_npu", None)           # `import torch_npu` now raises
    with pytest.raises(ImportError, match="needs torch_npu: pip install -e '\\.\\[npu\\]' in the fastfeed checkout"):
        DevicePrefetcher(loader, "npu")
    # with torch_npu present, npu goes through the very same code as cuda: its module from torch
    fake = FakeDeviceModule([])
    fake.is_available = lambda: True
    monkeypatch.setitem(sys.modules, "torch_npu", type(sys)("torch_npu"))
    monkeypatch.setattr(torch, "npu", fake, raising=False)
    assert accelerator_module("npu") is fake


def test_the_device_is_checked_as_resolve_device_checks_it(monkeypatch):
    """An index past the count is a DeviceError here, not an error inside torch_npu at the first copy; a name in
    capitals is parsed as everywhere else."""
    fake = FakeDeviceModule([])
    fake.is_available, fake.device_count, fake.current_device = (lambda: True), (lambda: 1), (lambda: 0)
    monkeypatch.setitem(sys.modules, "torch_npu", type(sys)("torch_npu"))
    monkeypatch.setattr(torch, "npu", fake, raising=False)
    real = torch.device
    npu = lambda kind, index: SimpleNamespace(type=kind, index=index)   # noqa: E731  (CPU torch has no npu type)
    monkeypatch.setattr(torch, "device", lambda *a: npu(*a) if a[0] == "npu" else real(*a))
    with pytest.raises(DeviceError, match="device npu:7 asked for, but there are 1 Ascend NPU device"):
        DevicePrefetcher(ReusingLoader(), "npu:7")
    assert DevicePrefetcher(ReusingLoader(), " NPU:0").device == npu("npu", 0)
    assert DevicePrefetcher(ReusingLoader(), "cpu:0").device == real("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="device 'cuda:1': torch .* sees no CUDA device"):
            DevicePrefetcher(ReusingLoader(), "cuda:1")


def test_cpu_loader_with_device_augment(tmp_path, sample_dir):
    """The real loader: workers skip HSV and flip, the prefetcher applies them, deterministic for a seed."""
    from store_helpers import run_pack

    from fastfeed import Store
    from fastfeed.loaders import LoaderConfig, create_loader

    run_pack(sample_dir, tmp_path / "s.ff")
    cfg = LoaderConfig(imgsz=128, batch_size=4, workers=1, device_augment=True)
    runs = []
    for _ in range(2):
        with create_loader("cpu", Store(tmp_path / "s.ff"), cfg) as loader, DevicePrefetcher(loader, "cpu") as pf:
            assert isinstance(pf.augment, DeviceAugment) and pf.augment.hsv_s == cfg.hyp.hsv_s
            runs.append([(b.images.clone(), b.targets.clone()) for b in pf])
    with create_loader("cpu", Store(tmp_path / "s.ff"), cfg) as loader, \
            DevicePrefetcher(loader, "cpu", device_augment=False) as pf:
        plain = [(b.images.clone(), b.targets.clone()) for b in pf]
    assert len(runs[0]) == 4
    for (a, ta), (b, tb), (p, tp) in zip(*runs, plain):
        assert a.dtype == torch.float32 and 0 <= a.min() and a.max() <= 1
        assert torch.equal(a, b) and torch.equal(ta, tb)
        assert not torch.equal(a, p)                                     # jittered on the "device"
        assert torch.equal(ta[:, [0, 1, 3, 4, 5]], tp[:, [0, 1, 3, 4, 5]])
        flipped = ~torch.isclose(ta[:, 2], tp[:, 2])
        assert torch.allclose(ta[flipped, 2], 1 - tp[flipped, 2])        # cx -> 1 - cx where flipped
