"""What the prefetcher tests share: a loader that reuses its buffer, a fake accelerator module, the stream checks."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest
import torch

from fastfeed.batch import Batch
from fastfeed.prefetch.streams import StreamOps


def _explode(k):
    raise RuntimeError(f"loader failed at batch {k}")


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


both_drivers = pytest.mark.parametrize("thread", [True, False], ids=["thread", "inline"]) if pytest else (lambda f: f)


class ReusingLoader:
    """Yields batch k in ONE image buffer and ONE target buffer, overwritten in place as soon as the next
    batch is requested (the cpu loader's contract, at its harshest). Batch k's pixels are all k (mod 256);
    its targets are k boxes (zero for k = 0) with img_idx 0 and cx = k / 100."""

    def __init__(self, n=6, size=8, batch=2, delay=0.0, fail_at=None, log=None, device="cpu", pin=False):
        self.n, self.delay, self.fail_at, self.log = n, delay, fail_at, log
        self.images = torch.empty((batch, 3, size, size), dtype=torch.uint8, device=device)
        if pin:
            self.images = self.images.pin_memory()
        self.targets = torch.empty((16, 6), dtype=torch.float32, device=device)
        self.epochs, self.closed, self.yielded, self.threads = [], 0, 0, []

    def __len__(self):
        return self.n

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        try:
            for k in range(self.n):
                self.threads.append(threading.current_thread().name)
                if self.log is not None:
                    self.log.append(("request", k))
                if self.delay:
                    time.sleep(self.delay)
                if k == self.fail_at:
                    _explode(k)
                self.images.fill_(k % 256)            # overwrites batch k-1 in place
                self.targets.zero_()
                self.targets[:k, 2] = k / 100
                self.yielded += 1
                yield Batch(self.images, self.targets[:k])
        finally:
            self.closed += 1


def expect_batch(b: Batch, k: int, dtype=torch.float32):
    assert b.images.dtype == dtype and b.images.shape == (2, 3, 8, 8)
    assert torch.equal(b.images, torch.full_like(b.images, (k % 256) / 255))
    assert b.targets.shape == (k, 6)
    assert torch.all(b.targets[:, 2] == k / 100)


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "fastfeed-device-prefetch" and t.is_alive()]


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


def check_protocol(log, got):
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
