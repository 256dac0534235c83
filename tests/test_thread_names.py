"""The threads a run starts, as a thread dump shows them: a cpu loader over a store in object storage, its
batches through the DevicePrefetcher. Each thread fastfeed starts says what it does, under its own name."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

from store_helpers import run_pack

import fastfeed
from fastfeed import Store
from fastfeed.loaders import LoaderConfig, create_loader
from fastfeed.prefetch import DevicePrefetcher

PKG = str(Path(fastfeed.__file__).parent)
_MACHINERY = (str(Path(threading.__file__)), str(Path(threading.__file__).parent / "concurrent"))


def _starter() -> str | None:
    """The module of the first frame that is not the threading machinery (ThreadPoolExecutor's included)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_MACHINERY):
        f = f.f_back
    return f.f_code.co_filename if f is not None else None


def test_every_thread_of_a_loader_prefetcher_and_url_store_run_has_a_distinct_descriptive_name(s3, tmp_path,
                                                                                              monkeypatch):
    from conftest import CocoBuilder

    b = CocoBuilder(tmp_path / "coco")
    for k in range(16):
        b.add_image(f"{k:03d}.jpg", h=48, w=64, seed=k, boxes=[(1, [5, 5, 30, 20])])
    url = f"s3://{s3.bucket()}/threads.ff"
    run_pack(b.write(), url, shards=4)

    started: list[tuple[str, str]] = []
    real_start = threading.Thread.start

    def start(thread):
        where = _starter()
        if where is not None and where.startswith(PKG):
            started.append((thread.name, str(Path(where).relative_to(PKG))))
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    store = Store(url, shard_cache=tmp_path / "shards", shard_cache_limit="1G", read_ahead=4)
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=1, seed=1)
    with create_loader("cpu", store, cfg) as loader, DevicePrefetcher(loader, "cpu", thread=True) as batches:
        assert sum(1 for _ in batches) == len(loader) > 0
    store.close()

    kinds: dict[str, set[str]] = {}
    for name, where in started:
        kinds.setdefault(re.sub(r"_\d+$", "", name), set()).add(where)   # a pool's threads: <prefix>_<n>
    assert {"fastfeed-device-prefetch", "fastfeed-read-ahead"} <= kinds.keys(), started
    for name, where in kinds.items():
        assert re.fullmatch(r"fastfeed-[a-z0-9-]+", name), f"thread {name!r} started in {where} says nothing"
        assert len(where) == 1, f"one thread name for different work: {name!r} started in {sorted(where)}"
