"""The shared decoded-image cache: contents, one build for many processes, stale slabs, the budget,
reference counting and cleanup, and `fastfeed cache ls|clear|build`."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from cache_helpers import dead_pid, jpeg_store, painted_store, processes, shm_dir  # noqa: F401

from fastfeed import Store, codec
from fastfeed.cache import CacheBudgetError, CacheError, acquire, layout, list_caches, users
from fastfeed.cache import build as cache_build
from fastfeed.cache.layout import users_path
from fastfeed.cli import main
from fastfeed.loaders.pipeline import StoreSource
from fastfeed.loaders.shm import ShmSource

CTX = mp.get_context("fork")   # queues and events; processes start through `processes`












def fresh(store: Store, i: int, imgsz: int) -> np.ndarray:
    """What the cache must hold for record i: the store's decode at the DCT scale >= target, area-resized."""
    h, w = store[i].size
    target = codec.fit_size(h, w, imgsz)
    return codec.resize_to(store.get(i, min_size=target).image, target)


def slow_decodes(monkeypatch, seconds: float) -> None:
    real = cache_build.decode_resized

    def slow(*a, **kw):
        time.sleep(seconds)
        return real(*a, **kw)

    monkeypatch.setattr(cache_build, "decode_resized", slow)


# --- contents ------------------------------------------------------------------------------------

@pytest.mark.parametrize("which, imgsz", [("jpeg_store", 320), ("painted_store", 96), ("painted_store", 640)])
def test_contents_equal_a_fresh_decode(which, imgsz, request, shm_dir):
    store = request.getfixturevalue(which)
    with acquire(store, imgsz, shm_dir, workers=2, progress=False) as lease:   # painted: 24 images, 2 processes
        assert lease.built and lease.n_cached == lease.n_records == len(store)
        assert lease.path.stat().st_size == lease.size
        view = lease.handle().view()
        for i in range(len(store)):
            img, boxes, classes = view.record(i)
            expect = fresh(store, i, imgsz)
            assert max(img.shape[:2]) == min(imgsz, max(store[i].size))
            assert np.array_equal(img, expect), f"record {i}: pixels differ from decode + resize"
            assert np.array_equal(boxes, store[i].boxes) and boxes.dtype == np.float32
            assert np.array_equal(classes, store[i].classes) and classes.dtype == np.int64
            assert not img.flags.writeable and not img.flags.owndata   # a read-only view, not a copy


def test_a_handle_pickles_without_its_map_and_attaches_by_name(painted_store, shm_dir):
    with acquire(painted_store, 96, shm_dir) as lease:
        handle = lease.handle()
        img = handle.view().record(4)[0]
        assert set(handle.__getstate__()) == {"path", "header"}
        again = pickle.loads(pickle.dumps(handle))
        assert np.array_equal(again.view().record(4)[0], img)
        assert again.view().mem.base is not handle.view().mem.base      # its own map of the same file


def test_slab_layout_and_sizes_agree(painted_store, tmp_path):
    shapes, counts, _, _ = cache_build.scan(painted_store, 96)
    need = layout.slab_bytes(shapes, counts)
    for k in (0, 1, 13, 24):
        lay = layout.plan(shapes[:k], counts[:k], n_records=24, imgsz=96, fingerprint="f" * 32, builder_pid=1, created=0.0)
        assert lay.header.total_bytes == need[k]
        assert lay.header.partial == (k < 24)
        assert all(int(o) % 64 == 0 for o in lay.offsets) and lay.header.pixels_off % 4096 == 0
    h = layout.read_header(lay.header.pack())
    assert h == lay.header
    bad = bytearray(lay.header.pack())
    bad[8:12] = (7).to_bytes(4, "little")
    with pytest.raises(layout.CacheFormatError, match="cache format version 7, this fastfeed reads version 1"):
        layout.read_header(bytes(bad))


# --- one build, many processes -------------------------------------------------------------------

def _attach(store, cache_dir, barrier, results, done):
    barrier.wait()
    lease = acquire(store, 96, cache_dir, progress=False)
    img = lease.handle().view().record(5)[0]
    results.put((os.getpid(), lease.built, os.stat(lease.path).st_ino, int(img.sum())))
    done.wait(60)
    lease.release()


def test_two_processes_attach_to_one_slab_built_once(painted_store, shm_dir, monkeypatch):
    slow_decodes(monkeypatch, 0.02)   # a build that takes a while, so the second process really waits
    barrier, results, done = CTX.Barrier(2), CTX.Queue(), CTX.Event()
    with processes(_attach, [(painted_store, shm_dir, barrier, results, done)] * 2) as procs:
        got = [results.get(timeout=60) for _ in procs]
        slab = layout.slab_path(shm_dir, painted_store.fingerprint, 96)
        assert sorted(built for _, built, _, _ in got) == [False, True]     # exactly one build
        assert len({ino for _, _, ino, _ in got}) == 1 and len({s for *_, s in got}) == 1
        assert sorted(users.read_path(users_path(slab)).pids) == sorted(pid for pid, *_ in got)
        assert not list(shm_dir.glob("*.tmp-*"))
        done.set()
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    assert not list(shm_dir.iterdir())                  # the last one out removed it


def _build_and_hang(store, cache_dir):
    acquire(store, 96, cache_dir, progress=False)
    time.sleep(60)


def test_a_waiter_names_the_builder_and_a_killed_build_leaves_nothing_blocking(painted_store, shm_dir, monkeypatch):
    slow_decodes(monkeypatch, 0.5)
    with processes(_build_and_hang, [(painted_store, shm_dir)]) as (builder,):
        deadline = time.monotonic() + 30
        while not list(shm_dir.glob("*.tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        monkeypatch.undo()
        (info,) = list_caches(shm_dir)
        assert info.state == "building" and f"being built by pid {builder.pid}" in info.note
        with pytest.raises(CacheError, match=f"waiting 0.3 s .*cache_wait.*pid {builder.pid} is still building it"):
            acquire(painted_store, 96, shm_dir, wait=0.3)
        os.kill(builder.pid, signal.SIGKILL)        # a crash half-way: the temp file stays, the lock goes
        builder.join()
    assert list(shm_dir.glob(f"*.tmp-{builder.pid}"))
    with acquire(painted_store, 96, shm_dir, wait=30) as lease:
        assert lease.built
        assert not list(shm_dir.glob("*.tmp-*"))        # the dead builder's half-written file is gone
        assert np.array_equal(lease.handle().view().record(3)[0], fresh(painted_store, 3, 96))


def _attach_and_die(store, cache_dir, results):
    lease = acquire(store, 96, cache_dir, progress=False)
    results.put(lease.built)
    results.close()
    results.join_thread()          # flushed: the parent gets it before we die
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_crashed_user_is_pruned_and_its_slab_reused(painted_store, shm_dir):
    results = CTX.Queue()
    with processes(_attach_and_die, [(painted_store, shm_dir, results)]):
        assert results.get(timeout=30) is True
    slab = layout.slab_path(shm_dir, painted_store.fingerprint, 96)
    assert users.read_path(users_path(slab)).pids == []      # its pid is dead: no users
    with acquire(painted_store, 96, shm_dir) as lease:          # (`fastfeed cache ls` would have reclaimed it)
        assert not lease.built                                # nothing to rebuild: it was complete
        assert users.read_path(users_path(lease.path)).pids == [os.getpid()]


# --- stale slabs ------------------------------------------------------------------------------

def _spoil(slab: Path, how: str) -> None:
    data = bytearray(slab.read_bytes())
    if how == "garbage":
        data = bytearray(np.random.default_rng(0).integers(0, 256, 20000, dtype=np.uint8).tobytes())
    elif how == "empty":
        data = bytearray()
    elif how == "half-written":                           # state still BUILDING, by a builder now dead
        data[layout.STATE_OFFSET:layout.STATE_OFFSET + 4] = layout.STATE_BUILDING.to_bytes(4, "little")
        data[16:24] = dead_pid().to_bytes(8, "little")
    elif how == "truncated":
        data = data[:-4096]
    elif how == "other version":
        data[8:12] = (layout.CACHE_VERSION + 1).to_bytes(4, "little")
    slab.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["garbage", "empty", "half-written", "truncated", "other version"])
def test_a_stale_slab_is_rebuilt_never_read(painted_store, shm_dir, how, caplog):
    slab = layout.slab_path(shm_dir, painted_store.fingerprint, 96)
    cache_build.build(painted_store, 96, slab, progress=False)
    _spoil(slab, how)
    with acquire(painted_store, 96, shm_dir) as lease:
        assert lease.built and lease.path == slab
        assert "rebuilding the shm cache" in caplog.text
        view = lease.handle().view()
        for i in (0, 7, 23):
            assert np.array_equal(view.record(i)[0], fresh(painted_store, i, 96))


# --- budget --------------------------------------------------------------------------------------

def _needed(store, imgsz) -> np.ndarray:
    shapes, counts, _, _ = cache_build.scan(store, imgsz)
    return layout.slab_bytes(shapes, counts)


@pytest.mark.parametrize("free, ram", [(1000, 10**12), (10**12, 5000)])
def test_a_cache_that_does_not_fit_fails_with_both_numbers_and_the_options(painted_store, shm_dir, monkeypatch, free, ram):
    monkeypatch.setattr("fastfeed.cache.budget.free_bytes", lambda d: free)
    monkeypatch.setattr("fastfeed.cache.budget.available_ram", lambda: ram)
    needed = int(_needed(painted_store, 320)[-1])
    with pytest.raises(CacheBudgetError) as e:
        acquire(painted_store, 320, shm_dir)
    msg = str(e.value)
    assert f"needs {needed / 2**20:.1f} MiB ({needed} bytes) at imgsz 320" in msg
    assert f"{shm_dir} has " in msg and f"({free} bytes) free" in msg and f"({ram} bytes) of RAM available" in msg
    for option in ("a smaller imgsz", "cache_partial=True", "`fastfeed cache build --partial`", "the `cpu` loader",
                   f"mount -o remount,size=1G {shm_dir}`"):
        assert option in msg
    assert not list(shm_dir.iterdir())        # nothing left behind: no slab, temp file or lock


def test_a_cache_folder_that_is_missing_or_a_file_says_which(painted_store, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    for where, what in (("afile", "is a file, not a folder"), ("none", "does not exist")):
        with pytest.raises(CacheError) as e:
            acquire(painted_store, 320, tmp_path / where)
        assert f"the shm cache's folder {tmp_path / where} {what}" in str(e.value) and "--shm-dir" in str(e.value)
        for action in ("ls", "clear"):   # `ls` said 'cache directory afile does not exist' of a file
            assert main(["cache", action, "--shm", "--shm-dir", str(tmp_path / where)]) == 1
            assert f"the shm cache's folder {tmp_path / where} {what}" in capsys.readouterr().err


def test_a_partial_cache_holds_a_prefix_and_the_rest_comes_from_the_store(painted_store, shm_dir, monkeypatch, caplog):
    need = _needed(painted_store, 160)
    monkeypatch.setattr("fastfeed.cache.budget.free_bytes", lambda d: int(need[10]) + 100)
    with acquire(painted_store, 160, shm_dir, partial=True) as lease:
        assert lease.n_cached == 10 and lease.n_records == 24 and lease.size == need[10]
        assert "caching 10 of 24 images (cache_partial)" in caplog.text
        src, plain = ShmSource(lease.handle(), painted_store, 160), StoreSource(painted_store, 160)
        for i in range(24):
            t_shm, t_store = dict.fromkeys(("read", "decode"), 0.0), dict.fromkeys(("read", "decode"), 0.0)
            got, expect = src.load(i, t_shm), plain.load(i, t_store)
            assert np.array_equal(got[0], expect[0])                # the same tile, cached or decoded
            assert np.array_equal(got[1].boxes, expect[1].boxes) and np.array_equal(got[1].classes, expect[1].classes)
            assert (t_shm["decode"] == 0.0) == (i < 10)             # cached: read only; the rest: decoded
        # a full cache is asked for while the partial one is in use: refused, with what to do
        monkeypatch.setattr("fastfeed.cache.budget.free_bytes", lambda d: 10**12)
        with pytest.raises(CacheError, match=r"holds only 10 of 24 images .* in use by pid\(s\) .*cache_partial=True"):
            acquire(painted_store, 160, shm_dir)
        with acquire(painted_store, 160, shm_dir, partial=True) as other:   # shared as it is
            assert not other.built and other.n_cached == 10
    with acquire(painted_store, 160, shm_dir) as full:        # unused now: rebuilt in full
        assert full.built and full.n_cached == 24
