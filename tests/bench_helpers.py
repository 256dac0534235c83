"""What the bench tests share: a packed sample store, test-only loaders, a quick bench run."""

from __future__ import annotations

import uuid

import pytest

import fastfeed
from fastfeed.bench import BenchConfig, run_bench
from fastfeed.loaders import register_loader, unregister_loader

FAST = ["--imgsz", "128", "--batch", "2", "--quiet"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from fastfeed.pack import PackConfig, pack

    out = tmp_path_factory.mktemp("bench") / "s.ff"
    pack(PackConfig(src=fastfeed.sample_path(), out=out, workers=1, progress=False))
    return out


@pytest.fixture
def fake_loaders():
    """Register test-only loaders under unique names; take them out of the registry afterwards."""
    names = []

    def add(factory):
        name = f"test-bench-{uuid.uuid4().hex[:8]}"
        register_loader(name, lambda store, cfg, opts: factory(store, cfg))
        names.append(name)
        return name

    yield add
    for name in names:
        unregister_loader(name)


def bench(store, **kw):
    kw = {"imgsz": 128, "batch_size": 2, "workers": 1, "seconds": 1.0, "progress": False} | kw
    return run_bench(BenchConfig(data=store, **kw))


class Clock:
    """A clock that only the test moves: the loaders below advance it by the time each batch 'takes'."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock(monkeypatch):
    """The bench's timing (its perf_counter, its monitor's, the simulated step's sleep) on a `Clock`: the figures
    then follow what a test's loaders are built to do, not how busy the machine is."""
    from types import SimpleNamespace

    import fastfeed.bench.measure as measure
    import fastfeed.bench.monitor as monitor
    import fastfeed.bench.run as run

    c = Clock()
    monkeypatch.setattr(measure, "perf_counter", c)
    monkeypatch.setattr(monitor, "perf_counter", c)
    monkeypatch.setattr(run, "time", SimpleNamespace(sleep=c.sleep))
    return c


def paced(clock: Clock, pace):
    """A loader factory for `fake_loaders`: batches of zeros, batch k (counted from the loader's creation) taking
    `pace(k)` seconds of `clock`."""
    import torch

    from fastfeed.batch import Batch
    from fastfeed.loaders import Loader

    class Paced(Loader):
        def __init__(self, store, cfg):
            super().__init__(store, cfg)
            self.k = 0

        def iter_batches(self):
            s, b = self.cfg.imgsz, self.cfg.batch_size
            for _ in range(self.start, len(self)):
                clock.t += pace(self.k)
                self.k += 1
                yield Batch(torch.zeros(b, 3, s, s, dtype=torch.uint8), torch.zeros(0, 6), torch.zeros(b, dtype=torch.int64))

        def close(self):
            pass

    return Paced
