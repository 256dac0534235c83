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
