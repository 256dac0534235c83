"""The `shm` loader: the cpu loader's Batch contract and augmentation over the shared cache, ranks that
share one slab, the partial-cache fallback, and cleanup when loaders close."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from cache_helpers import new_in_dev_shm, own_painted_store, processes, scratch_shm_dir  # noqa: F401  (fixture)
from loader_checks import (
    NO_COLOUR,
    assert_batch_contract,
    assert_boxes_frame_paint,
    collect_batches,
    make_painted_store,
)

from fastfeed.augment import AugmentHyp
from fastfeed.cache import CacheBudgetError, layout
from fastfeed.cache import build as cache_build
from fastfeed.loaders import LoaderConfig, create_loader, list_loaders, loader_options


@pytest.fixture
def shm_dir():
    yield from scratch_shm_dir("fftest-shm")


@pytest.fixture(scope="module")
def painted_store(tmp_path_factory):
    return make_painted_store(tmp_path_factory.mktemp("painted"))



def test_registered_and_its_options_are_checked(painted_store):
    assert "shm" in list_loaders()
    cfg = LoaderConfig(imgsz=96, batch_size=4)
    for field, value in (("cache_wait", 0), ("cache_partial", "yes"), ("cache_keep", 1), ("cache_dir", ""),
                         ("partner_buffer", 2)):
        with pytest.raises(ValueError, match=f"option {field} "):
            create_loader("shm", painted_store, cfg, **{field: value})
    assert loader_options("shm", cache_dir=Path("/tmp")).cache_dir == "/tmp"
    with pytest.raises(ValueError, match="loader 'cpu' has no option 'cache_dir' \\(it is an option of: shm\\); "
                                         "cpu's options: partner_buffer"):
        create_loader("cpu", painted_store, cfg, cache_dir="/tmp")
    with pytest.raises(ValueError, match="loader 'shm' has no option 'cache_mb' \\(no loader has it\\)"):
        create_loader("shm", painted_store, cfg, cache_mb=True)
    with pytest.raises(TypeError):   # the options are no LoaderConfig fields any more
        LoaderConfig(cache_dir="/tmp")


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_contract(painted_store, shm_dir, workers):
    cfg = LoaderConfig(imgsz=96, batch_size=5, workers=workers, drop_last=False)
    with create_loader("shm", painted_store, cfg, cache_dir=str(shm_dir)) as loader:
        batches = collect_batches(loader)
        assert loader.shared_bytes() == loader.lease.size == loader.lease.path.stat().st_size
        ms = loader.stage_times().per_sample_ms()
    assert len(batches) == len(loader) == 5
    assert_batch_contract(batches, 96, nc=3, total=24)
    assert ms["decode"] == 0.0 and ms["read"] > 0 and ms["augment"] > 0     # samples are read, never decoded


@pytest.mark.parametrize("hyp", [NO_COLOUR, AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, degrees=0, mosaic=0.0),
                                 AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, fliplr=1.0, flipud=0.5)])
def test_boxes_frame_the_painted_objects_after_augmentation(painted_store, shm_dir, hyp):
    """imgsz 128 < the images' 160: the cache holds resized images, and boxes still frame their objects."""
    cfg = LoaderConfig(imgsz=128, batch_size=8, workers=2, hyp=hyp, seed=3)
    with create_loader("shm", painted_store, cfg, cache_dir=str(shm_dir)) as loader:
        batches = collect_batches(loader) + collect_batches(loader, 1)
    assert_boxes_frame_paint(batches, 128)


def _batches(name, store, options=None, **kw):
    with create_loader(name, store, LoaderConfig(**kw), **(options or {})) as loader:
        return collect_batches(loader) + collect_batches(loader, 1)


def test_same_batches_as_the_cpu_loader_when_no_resize_is_needed(painted_store, shm_dir):
    """At imgsz 160 the cache holds the store's own pixels: the same machinery must give the same batches."""
    kw = dict(imgsz=160, batch_size=4, workers=2, hyp=NO_COLOUR, seed=5)
    shm = _batches("shm", painted_store, {"cache_dir": str(shm_dir)}, **kw)
    cpu = _batches("cpu", painted_store, **kw)
    assert len(shm) == len(cpu) == 12
    for (a, ta), (b, tb) in zip(shm, cpu):
        assert torch.equal(a, b) and torch.equal(ta, tb)


def test_a_partial_cache_falls_back_to_the_store(painted_store, shm_dir, monkeypatch):
    shapes, counts, _, _ = cache_build.scan(painted_store, 160)
    need = layout.slab_bytes(shapes, counts)
    monkeypatch.setattr("fastfeed.cache.budget.free_bytes", lambda d: int(need[9]) + 10)
    kw = dict(imgsz=160, batch_size=4, workers=2, hyp=NO_COLOUR, seed=5)
    with pytest.raises(CacheBudgetError, match="cache_partial=True"):
        create_loader("shm", painted_store, LoaderConfig(**kw), cache_dir=str(shm_dir))
    with create_loader("shm", painted_store, LoaderConfig(**kw), cache_dir=str(shm_dir), cache_partial=True) as loader:
        assert (loader.lease.n_cached, loader.lease.n_records) == (9, 24)
        shm = collect_batches(loader) + collect_batches(loader, 1)
    cpu = _batches("cpu", painted_store, **kw)
    for (a, ta), (b, tb) in zip(shm, cpu):       # 9 images from the cache, 15 from the store: same batches
        assert torch.equal(a, b) and torch.equal(ta, tb)


def _rank(store, cache_dir, rank, barrier, results):
    barrier.wait()
    cfg = LoaderConfig(imgsz=160, batch_size=4, workers=2, augment=False, rank=rank, world_size=2, drop_last=False)
    with create_loader("shm", store, cfg, cache_dir=cache_dir) as loader:
        boxes = {tuple(np.round(t[1:].numpy(), 4)) for _, targets in collect_batches(loader) for t in targets}
        results.put((rank, loader.lease.built, os.stat(loader.lease.path).st_ino, boxes))
        barrier.wait()    # both attached at once before either closes


def test_two_ranks_share_one_slab_and_read_disjoint_samples(painted_store, shm_dir):
    """Ranks as torchrun starts them: fresh interpreters (spawn), one loader each, 2 workers each."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    with processes(_rank, [(painted_store, str(shm_dir), r, barrier, results) for r in (0, 1)], ctx) as procs:
        got = sorted(results.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    (_, built0, ino0, r0), (_, built1, ino1, r1) = got
    assert [built0, built1].count(True) == 1 and ino0 == ino1       # one build, one slab
    assert not r0 & r1 and len(r0 | r1) == 24
    assert not list(shm_dir.iterdir())                                # removed with the last rank


def test_after_a_killed_worker_the_next_iteration_reads_the_same_cache(painted_store, shm_dir):
    import signal

    from fastfeed.loaders import WorkerError

    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=1)
    with create_loader("shm", painted_store, cfg, cache_dir=str(shm_dir)) as loader:
        it = iter(loader)
        next(it)
        slab = loader.lease.path
        os.kill(loader.memory_pids()[0], signal.SIGKILL)
        with pytest.raises(WorkerError, match="exited unexpectedly"):
            for _ in range(40):
                next(it)
        assert slab.exists()                          # the failed pool went; the lease stayed
        assert len(list(loader)) == len(loader)       # a new pool over the same slab
    assert not slab.exists()


def test_closing_or_dropping_the_loader_removes_the_slab_from_dev_shm(own_painted_store):
    before = set(os.listdir("/dev/shm"))
    loader = create_loader("shm", own_painted_store, LoaderConfig(imgsz=96, batch_size=4, workers=2))   # /dev/shm itself
    next(iter(loader))
    path = loader.lease.path
    assert path.parent == Path("/dev/shm") and path.exists()
    loader.close()
    loader.close()
    assert not path.exists()
    with pytest.raises(RuntimeError, match="this shm loader is closed .*: create a new loader to iterate again"):
        iter(loader)   # not 'the cache was removed while in use (cache clear --force?)'
    loader = create_loader("shm", own_painted_store, LoaderConfig(imgsz=96, batch_size=4, workers=0))
    list(loader)
    del loader                     # never closed: the finalizer detaches
    gc.collect()
    assert not path.exists()
    assert not new_in_dev_shm(own_painted_store, before)
