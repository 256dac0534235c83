"""The DevicePrefetcher's stream protocol against a recording fake of torch.cuda / torch.npu."""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

import pytest
import torch
from test_prefetch import ReusingLoader, _expect, _prefetch_threads, both_drivers

from fastfeed.device_augment import DeviceAugment
from fastfeed.devices import accelerator_module
from fastfeed.prefetch import DevicePrefetcher
from fastfeed.prefetch.streams import StreamOps

# --- the stream protocol, against a recording fake of torch.cuda / torch.npu ---------------------------

class FakeEvent:
    def __init__(self, log, ident):
        self.log, self.id = log, ident

    def record(self, stream):
        self.log.append(("event", self.id, stream.name))

    def synchronize(self):
        self.log.append(("sync", self.id))


class FakeStream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_event(self, event):
        self.log.append(("wait", self.name, event.id))


class FakeDeviceModule:
    """Stands in for torch.cuda / torch.npu: Stream, Event, current_stream, stream(); per-thread current stream."""

    def __init__(self, log):
        self.log, self.streams, self.events = log, [], 0
        self.default = FakeStream(log, "consumer")
        self._local = threading.local()

    def Stream(self, device=None):  # noqa: N802
        self.streams.append(FakeStream(self.log, f"side{len(self.streams)}"))
        return self.streams[-1]

    def Event(self):  # noqa: N802
        self.events += 1
        return FakeEvent(self.log, self.events)

    def current_stream(self, device=None):
        return getattr(self._local, "stream", self.default)

    @contextmanager
    def stream(self, s):
        prev = self.current_stream()
        self._local.stream = s
        try:
            yield
        finally:
            self._local.stream = prev


class RecordingOps(StreamOps):
    """The real seam class on the fake module; copies and record_stream are logged instead of run."""

    def to_device(self, t):
        self.mod.log.append(("copy", self.mod.current_stream().name, t.shape[0] and float(t.flatten()[0])))
        return t.clone()

    def record(self, t, stream):
        self.mod.log.append(("record_stream", id(t), stream.name))


def _check_protocol(log, got):
    """Every batch copied on the side stream; the host copy finished before the loader was asked again;
    the consumer's stream waited on the batch's ready event before use; record_stream on each tensor."""
    ready, copied, k = {}, {}, -1
    for e in log:
        if e[0] == "copy" and e[1] != "side0":
            raise AssertionError(f"copy outside the side stream: {e}")
        if e[0] == "request" and e[1] > 0:
            assert ("sync", copied[e[1] - 1]) in log[:log.index(e)], f"batch {e[1]} requested before batch " \
                                                                       f"{e[1] - 1}'s copy finished"
        if e[0] == "request":
            k = e[1]
        if e[0] == "event":
            assert e[2] == "side0"
            (ready if k in copied else copied)[k] = e[1]
    for k, (b, used_at) in enumerate(got):
        before = log[:used_at]
        assert ("wait", "consumer", ready[k]) in before, f"batch {k} handed out before its ready event"
        for t in b:
            assert ("record_stream", id(t), "consumer") in before, f"batch {k}: no record_stream"


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
            _expect(b, k)
        _check_protocol(log, got)
    assert len(mod.streams) == 1
    assert not _prefetch_threads()


def test_npu_is_imported_only_for_device_npu(monkeypatch):
    loader = ReusingLoader()
    had = "torch_npu" in sys.modules
    list(DevicePrefetcher(loader, "cpu"))
    list(DevicePrefetcher(loader, "cuda", ops=RecordingOps(FakeDeviceModule([]), torch.device("cuda"))))
    assert ("torch_npu" in sys.modules) == had
    monkeypatch.setitem(sys.modules, "torch_npu", None)           # `import torch_npu` now raises
    with pytest.raises(ImportError, match="needs torch_npu: pip install fastfeed\\[npu\\]"):
        DevicePrefetcher(loader, "npu")
    # with torch_npu present, npu goes through the very same code as cuda: its module from torch
    fake = FakeDeviceModule([])
    fake.is_available = lambda: True
    monkeypatch.setitem(sys.modules, "torch_npu", type(sys)("torch_npu"))
    monkeypatch.setattr(torch, "npu", fake, raising=False)
    assert accelerator_module("npu") is fake


def test_cpu_loader_with_device_augment(tmp_path, sample_dir):
    """The real loader: workers skip HSV and flip, the prefetcher applies them, deterministic for a seed."""
    from test_pack import run_pack

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
