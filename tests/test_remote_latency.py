"""A store 3x larger than the node's shard cache, read through a link with latency that resets connections: every
epoch delivers its order's batches, each record once, and the link's figures say what the read-ahead did."""

from __future__ import annotations

import numpy as np
import pytest
from s3_helpers import FaultProxy

from fastfeed import Store
from fastfeed.loaders import LoaderConfig, create_loader
from fastfeed.pack import PackConfig, pack


@pytest.fixture(autouse=True)
def _env(remote_env):
    """Stores read the environment: put back after each test."""


@pytest.fixture(scope="module")
def small_shards(s3, tmp_path_factory):
    """A 96-image store in 32 shards of 3 (many small shards: the read-ahead keeps many downloads in flight)."""
    from conftest import CocoBuilder

    root = tmp_path_factory.mktemp("latency")
    b = CocoBuilder(root / "coco")
    for k in range(96):
        b.add_image(f"{k:03d}.jpg", h=64, w=80, seed=k, boxes=[(1 + k % 3, [4, 4, 30, 24])])
    b.write()
    url = f"s3://{s3.bucket()}/latency.ff"
    pack(PackConfig(src=root / "coco", out=url, shards=32, workers=1, progress=False))
    return url


def test_a_store_3x_the_cache_through_resets_and_latency_delivers_every_record_once_per_epoch(small_shards, s3, tmp_path):
    # small shards (~3 KB): each cut is drawn within a response's first 1 KB, so a drawn reset happens
    with FaultProxy(s3.port, latency=0.01, jitter=0.0025, drop=0.05, seed=4, cut_within=1024) as proxy:
        s3.use(proxy.url)
        try:
            probe = Store(small_shards, cache_dir=tmp_path / "probe")
            limit = sum(s.bytes for s in probe.shards) // 3
            probe.close()
            store = Store(small_shards, cache_dir=tmp_path / "c", cache_limit=limit)   # the read-ahead sized, not asked
            cfg = LoaderConfig(imgsz=64, batch_size=2, workers=1, batches_ahead=1, seed=7)
            with create_loader("cpu", store, cfg) as loader:
                d = loader.order.describe()
                assert d["order"] == "windowed" and d["window_shards"] >= 2
                for epoch in range(2):
                    loader.set_epoch(epoch)
                    got = np.concatenate([b.indices.numpy().copy() for b in loader])
                    assert np.array_equal(got, np.concatenate(loader.order.batches(epoch)))   # the order's batches
                    assert len(got) == len(store) and len(np.unique(got)) == len(store)       # each record once
                link = loader.order.describe()["link"]
            assert proxy.dropped > 0, "the proxy reset nothing: the test proved nothing"
            assert link["downloads"] > 0 and link["downloaded_bytes"] > 0 and link["delay_ms"] > 0
            assert link["most_in_flight"] >= 1 and link["in_flight"] >= 0 and link["parallel"] >= 4
            assert max(f["bytes"] for f in store.cache.fetched()) <= limit
            store.close()
        finally:
            s3.use(s3.endpoint)
