"""What the shm cache tests share: scratch cache folders, the painted stores, processes that use a cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from loader_checks import make_painted_store
from store_helpers import run_pack

from fastfeed import Store
from fastfeed.procs import worker_context


@contextmanager
def processes(target, arg_lists, ctx=None):
    """Start one process per args tuple; kill any left at the end. Forked by default as the loaders fork
    (OpenCV's thread pool parked: a child that calls OpenCV after this process used its pool hangs)."""
    if ctx is None:
        with worker_context() as ctx:
            procs = [ctx.Process(target=target, args=args) for args in arg_lists]
            for p in procs:
                p.start()
    else:
        procs = [ctx.Process(target=target, args=args) for args in arg_lists]
        for p in procs:
            p.start()
    try:
        yield procs
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()


def scratch_shm_dir(prefix: str):
    """A fresh directory in /dev/shm for one test, removed after it; the test must leave it empty."""
    d = Path("/dev/shm") / f"{prefix}-{uuid.uuid4().hex[:12]}"
    d.mkdir()
    yield d
    left = sorted(os.listdir(d))
    shutil.rmtree(d)
    assert not left, f"the test left {left} behind"


@pytest.fixture
def shm_dir():
    yield from scratch_shm_dir("fftest-cache")


@pytest.fixture(scope="module")
def painted_store(tmp_path_factory):
    return make_painted_store(tmp_path_factory.mktemp("painted"))


@pytest.fixture(scope="module")
def own_painted_store(tmp_path_factory):
    """The painted store with a fingerprint of this test run's own: a test that uses the default cache_dir
    (/dev/shm itself) cannot meet the same slab of another run on the machine (two `make test` at once)."""
    return make_painted_store(tmp_path_factory.mktemp("painted"), tag=f"-{uuid.uuid4().hex[:8]}")


def new_in_dev_shm(store, before: set) -> set:
    """What is in /dev/shm now and was not in `before` of `store`'s own slabs (their users files and build
    temporaries included): another test run's slabs, made meanwhile, are not this test's leftovers."""
    from fastfeed.cache.layout import PREFIX

    return {e for e in set(os.listdir("/dev/shm")) - before if e.startswith(f"{PREFIX}{store.fingerprint}-")}


@pytest.fixture(scope="module")
def jpeg_store(tmp_path_factory, sample_dir):
    """The bundled sample as packed: real JPEGs (mostly 640x480), decoded with DCT scaling at imgsz 320."""
    out = tmp_path_factory.mktemp("jpeg") / "s.ff"
    run_pack(sample_dir, out)
    return Store(out)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid
