"""A store in object storage read by many nodes, through a network that misbehaves: two simulated nodes with caches
smaller than the store, dropped connections (a store 3x the cache behind latency and resets: every record once per
epoch, and the link's figures), retries that give up naming the URL, mid-epoch resume with the
windowed order, and `fastfeed train` from s3:// (one process; torchrun --nnodes 2 with a cache per node: slow)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from s3_helpers import FaultProxy

from fastfeed import Store
from fastfeed.loaders import LoaderConfig, create_loader
from fastfeed.pack import PackConfig, pack
from fastfeed.store.objstore import RemoteError
from fastfeed.store.remote.locks import flocked
from fastfeed.store.remote.room import cache_bytes


@pytest.fixture(autouse=True)
def _env(remote_env):
    """`fastfeed` flags set the environment the Stores read (one command per process): put back after each test."""


def pack_96(s3, root, shards: int) -> tuple[str, Store]:
    """(url, local twin) of a 96-image store in `shards` shards."""
    from conftest import CocoBuilder

    b = CocoBuilder(root / "coco")
    for k in range(96):
        b.add_image(f"{k:03d}.jpg", h=64, w=80, seed=k, boxes=[(1 + 2 * (k % 2), [4, 4, 30, 24])])
    b.write()
    url = f"s3://{s3.bucket()}/nodes.ff"
    for out in (url, root / "local.ff"):
        pack(PackConfig(src=root / "coco", out=out, shards=shards, workers=1, progress=False))
    return url, Store(root / "local.ff")


@pytest.fixture(scope="module")
def remote(s3, tmp_path_factory):
    """(url, local twin) of a 96-image store in 12 shards of 8."""
    return pack_96(s3, tmp_path_factory.mktemp("nodes"), 12)


@pytest.fixture(scope="module")
def small_shards(s3, tmp_path_factory):
    """The same in 32 shards of 3 (many small shards: the read-ahead keeps many downloads in flight)."""
    return pack_96(s3, tmp_path_factory.mktemp("small"), 32)[0]


def store_bytes(store) -> int:
    return sum(s.bytes for s in store.shards)


class Watch:
    """The most a cache folder held, sampled every 10 ms while inside, each sample under the cache's space lock (as
    the cache's own scans: a listing beside a rename could see the shard twice)."""

    def __init__(self, root):
        self.root, self.most, self._stop = root, 0, threading.Event()

    def __enter__(self):
        def run():
            while not self._stop.is_set():
                if self.root.exists():
                    with flocked(self.root / ".space.lock", fcntl.LOCK_EX):
                        self.most = max(self.most, cache_bytes(self.root))
                time.sleep(0.01)
        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def test_two_nodes_with_small_caches(remote, tmp_path, monkeypatch):
    url, local = remote
    limit = int(store_bytes(local) * 0.6)
    epochs, seen, nodes = 2, {}, []
    for rank in (0, 1):
        cache = tmp_path / f"node{rank}"
        store = Store(url, shard_cache=cache, shard_cache_limit=limit, read_ahead=1)
        cfg = LoaderConfig(imgsz=64, batch_size=4, workers=1, batches_ahead=1, rank=rank, world_size=2, seed=5,
                           local_world_size=1)   # two nodes of one rank each
        with Watch(cache) as watch, create_loader("cpu", store, cfg) as loader:
            d = loader.order.describe()
            assert d["order"] == "windowed" and d["nodes"] == 2 and d["window_shards"] >= 1
            for e in range(epochs):
                loader.set_epoch(e)
                seen[rank, e] = [b.indices.numpy().copy() for b in loader]
        assert watch.most <= limit                         # within its limit all along
        # 8 records a shard; the read-ahead reaches into the next epoch (windowed.py), whether or not it comes:
        # what it downloads of epoch `epochs` before the loader closes depends on timing, up to read_ahead shards
        read = [set(np.concatenate(loader.order.batches(e)) // 8) for e in range(epochs + 1)]
        fetched = [f["shard"] for f in store.cache.fetched()]
        names = {s.file: k for k, s in enumerate(store.shards)}
        for name in set(fetched):                           # at most once per epoch that reads it
            assert fetched.count(name) <= sum(names[name] in r for r in read), (name, fetched)
        beyond = [n for n in set(fetched) if fetched.count(n) > sum(names[n] in r for r in read[:epochs])]
        assert len(beyond) <= store.read_ahead, (beyond, fetched)   # only what the last epoch read ahead
        nodes.append(sum(store.shards[names[n]].bytes for n in fetched) / epochs)
        store.close()
    for e in range(epochs):
        a, b = np.concatenate(seen[0, e]), np.concatenate(seen[1, e])
        assert len(seen[0, e]) == len(seen[1, e]) and not set(a.tolist()) & set(b.tolist())   # equal steps, disjoint
    assert all(n <= 0.5 * store_bytes(local) + 2 * max(s.bytes for s in local.shards) for n in nodes)   # traffic split


def test_mid_epoch_resume_with_the_windowed_order(remote, tmp_path):
    url, local = remote
    limit = int(store_bytes(local) * 0.6)
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=1, batches_ahead=1, seed=2)
    with create_loader("cpu", Store(url, shard_cache=tmp_path / "a", shard_cache_limit=limit, read_ahead=1), cfg) as loader:
        assert loader.order.describe()["order"] == "windowed"
        loader.set_epoch(1)
        full = [(b.indices.numpy().copy(), b.images.clone(), b.targets.clone()) for b in loader]
    k = len(full) // 2
    with create_loader("cpu", Store(url, shard_cache=tmp_path / "b", shard_cache_limit=limit, read_ahead=1), cfg) as again:
        again.set_epoch(1, k)
        rest = [(b.indices.numpy().copy(), b.images.clone(), b.targets.clone()) for b in again]
    assert len(rest) == len(full) - k
    for (i, x, t), (j, y, u) in zip(full[k:], rest):
        assert np.array_equal(i, j) and bool((x == y).all()) and bool((t == u).all())


def test_dropped_connections_are_survived_and_every_record_delivered(remote, s3, tmp_path):
    url, local = remote
    with FaultProxy(s3.port, drop=0.15, latency=0.002, seed=1) as proxy:
        s3.use(proxy.url)
        try:
            store = Store(url, shard_cache=tmp_path / "c", shard_cache_limit=int(store_bytes(local) * 0.6), read_ahead=1)
            with create_loader("cpu", store, LoaderConfig(imgsz=64, batch_size=4, workers=2, batches_ahead=1, seed=3)) as loader:
                got = np.concatenate([b.indices.numpy().copy() for b in loader])
            assert np.array_equal(got, np.concatenate(loader.order.batches(0)))
            assert len(got) == len(local) // 4 * 4
            assert proxy.dropped > 0, "the proxy dropped nothing: the test proved nothing"
            for i in got[:8]:
                assert bytes(store.record(int(i)).payload) == bytes(local.record(int(i)).payload)
            store.close()
        finally:
            s3.use(s3.endpoint)


def test_a_store_3x_the_cache_through_resets_and_latency_delivers_every_record_once_per_epoch(small_shards, s3, tmp_path):
    # small shards (~3 KB): each cut is drawn within a response's first 1 KB, so a drawn reset happens
    with FaultProxy(s3.port, latency=0.01, jitter=0.0025, drop=0.05, seed=4, cut_within=1024) as proxy:
        s3.use(proxy.url)
        try:
            probe = Store(small_shards, shard_cache=tmp_path / "probe")
            limit = sum(s.bytes for s in probe.shards) // 3
            probe.close()
            store = Store(small_shards, shard_cache=tmp_path / "c", shard_cache_limit=limit)   # the read-ahead sized, not asked
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


def test_retries_end_with_an_error_naming_the_url(remote, s3, tmp_path, monkeypatch):
    from fastfeed.store import objstore

    url, _ = remote
    store = Store(url, shard_cache=tmp_path / "c")
    monkeypatch.setattr(objstore, "BACKOFF_S", (0.01, 0.05))
    import socket

    with socket.socket() as s:                               # a port nothing listens on: every connection refused
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    s3.use(f"http://127.0.0.1:{dead}")
    try:
        # one botocore attempt per try (its own retries, with their own backoff, took ~2.5 s): fastfeed's tries are tested
        store.provider.storage_options = {"config_kwargs": {"retries": {"total_max_attempts": 1}, "connect_timeout": 2}}
        store.provider._fs = None
        with pytest.raises(RemoteError, match=rf"downloading {url}/shard-\S+ failed 6 times; the last failure"):
            store.record(0)
    finally:
        s3.use(s3.endpoint)


TRAIN = ["--model", "yolov3-tiny", "--imgsz", "64", "--batch", "4", "--epochs", "1", "--workers", "1", "--accum", "1",
         "--quiet", "--json"]


def _run(cmd, env, timeout=300):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    return p


def _wait(procs, timeout=300):
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        raise
    return outs


@pytest.mark.slow
def test_fastfeed_train_from_a_url(remote, tmp_path):
    url, local = remote
    limit = str(int(store_bytes(local) * 0.6))
    (out, err), = _wait([_run([sys.executable, "-m", "fastfeed", "train", "--data", url, *TRAIN, "--out",
                               str(tmp_path / "run")], {"FASTFEED_SHARD_CACHE": str(tmp_path / "c"),
                                                        "FASTFEED_SHARD_CACHE_LIMIT": limit,
                                                        "FASTFEED_READ_AHEAD_SHARDS": "1"})])
    s = json.loads(out[out.index("{"):])
    assert s["step"] == len(local) // 4, err[-2000:]
    assert (tmp_path / "run" / "last.pt").is_file()


@pytest.mark.slow
def test_torchrun_two_nodes_each_with_its_own_cache(remote, tmp_path):
    import socket

    url, local = remote
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    limit = str(int(store_bytes(local) * 0.6))
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "fastfeed",
               "train", "--data", url, *TRAIN, "--out", str(tmp_path / f"run{node}")]
        procs.append(_run(cmd, {"FASTFEED_SHARD_CACHE": str(tmp_path / f"cache{node}"),
                                "FASTFEED_SHARD_CACHE_LIMIT": limit, "FASTFEED_READ_AHEAD_SHARDS": "1"}))
    outs = _wait(procs, timeout=600)
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    out = outs[0][0]
    s = json.loads(out[out.index("{"):])
    assert s["world_size"] == 2 and s["step"] == len(local) // 8      # 96 images / (2 ranks x 4)
    fetched = [[json.loads(x)["shard"] for x in next((tmp_path / f"cache{n}").glob("store-*/fetched.jsonl"))
                .read_text().splitlines()] for n in (0, 1)]
    assert all(len(f) == len(set(f)) for f in fetched)                           # once per node
    from fastfeed.loaders.windowed import WindowedOrder

    names = [sh.file for sh in Store(url, shard_cache=tmp_path / "names").shards]
    parts = [{names[k] for k in set((WindowedOrder([(sh.start, sh.count) for sh in local.shards], 4, window=1, seed=0,
                                                   rank=n, world_size=2).node_part(0)[0] // 8).tolist())} for n in (0, 1)]
    assert all(p <= set(f) for p, f in zip(parts, fetched)), (parts, fetched)   # each node fetched its part...
    assert len(parts[0] & parts[1]) <= 1 and len(parts[0] | parts[1]) == len(names)   # ... and the parts split the store
