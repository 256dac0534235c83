"""Building a slab: read every record's size and labels, check the budget, then decode the loaders' tiles
(`Record.decode_tile`: long side imgsz, never enlarged; docs/design.md, "DCT-scaled JPEG decode") on every core
straight into a temporary file, renamed into place once it is complete."""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import mmap
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..procs import usable_cores, worker_context
from ..progress import bar as progress_bar
from ..store import FormatError
from ..store.reader import Store
from . import budget, layout

log = logging.getLogger(__name__)


def scan(store: Store, imgsz: int):
    """(target shapes uint32 [N, 2], box counts [N], boxes float32 [B, 4], classes int64 [B])."""
    n = len(store)
    shapes = np.empty((n, 2), np.uint32)
    counts = np.empty(n, np.int64)
    boxes, classes = [], []
    for i in range(n):
        r = store.record(i, check_crc=False)   # sizes and labels only; every payload's CRC is checked when filled
        shapes[i] = r.tile_size(imgsz)
        counts[i] = len(r.boxes)
        boxes.append(r.boxes)
        classes.append(r.classes)
    return shapes, counts, _cat(boxes, (0, 4), np.float32), _cat(classes, (0,), np.int64)


def _cat(parts: list, empty_shape: tuple, dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(empty_shape, dtype)


def decode_resized(store: Store, index: int, size: tuple[int, int]) -> np.ndarray:
    """Record `index` as a loader's tile (`Record.decode_tile`) of `size`, its `Record.tile_size` (the long side of
    a tile is the side it was sized for)."""
    return store.record(index).decode_tile(max(size))


def shapes_at(shapes: np.ndarray, new: int) -> np.ndarray:
    """Approximate target shapes at another imgsz (for the budget message)."""
    long = np.maximum(shapes[:, 0], shapes[:, 1]).astype(np.float64)
    r = np.minimum(1.0, new / np.maximum(long, 1))
    return np.maximum(1, np.round(shapes * r[:, None])).astype(np.uint32)


_W: dict = {}   # in a fill worker (process): its store and its map of the slab being built


def _init(store: Store, tmp: str) -> None:
    # Started through procs.worker_context: a helper dies with the builder and does not keep its lock.
    fd = os.open(tmp, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    _W["store"], _W["mem"] = store, np.frombuffer(mm, np.uint8)


def _fill(job) -> int:
    indices, offsets, shapes = job
    store, mem = _W["store"], _W["mem"]
    for i, o, (h, w) in zip(indices, offsets, shapes):
        img = decode_resized(store, int(i), (int(h), int(w)))
        o, n = int(o), int(h) * int(w) * 3
        mem[o:o + n] = img.reshape(-1)
    return len(indices)


def build(store: Store, imgsz: int, slab: Path, *, partial: bool = False, workers: int | None = None,
          progress: bool | None = None) -> layout.Header:
    """Build `slab` (the caller holds its lock); returns its header.

    Raises CacheBudgetError when it does not fit (unless `partial`: then the first records that fit
    are cached). A temporary file `<slab>.tmp-<pid>` is removed on any failure.
    """
    # A Store of our own, closed afterwards: reading every record maps the whole store into this
    # process, and those maps would stay with the rank that happened to build.
    own = store.reopen()
    if own.fingerprint != store.fingerprint:
        raise FormatError(f"the store at {store.path} changed on disk since it was opened (fingerprint "
                              f"{own.fingerprint}, was {store.fingerprint}); open it again")
    try:
        return _build(own, imgsz, slab, partial, workers, progress)
    finally:
        own.close()


def _build(store: Store, imgsz: int, slab: Path, partial: bool, workers: int | None,
           progress: bool | None) -> layout.Header:
    t0 = time.perf_counter()
    shapes, counts, boxes, classes = scan(store, imgsz)
    n = len(store)
    need = layout.slab_bytes(shapes, counts)
    b = budget.measure(slab.parent)
    k = n
    if not b.fits(int(need[n])):
        smaller = {s: int(layout.slab_bytes(shapes_at(shapes, s), counts)[n])
                   for s in (imgsz // 2 // 32 * 32, imgsz * 3 // 4 // 32 * 32) if 32 <= s < imgsz}
        err = budget.too_big(int(need[n]), b, slab.parent, imgsz, smaller)
        if not partial:
            raise err
        k = max(int(np.searchsorted(need, b.limit, side="right")) - 1, 0)
        log.warning("caching %d of %d images (cache_partial): %s", k, n, err)
    lay = layout.plan(shapes[:k], counts[:k], n_records=n, imgsz=imgsz, fingerprint=store.fingerprint,
                      builder_pid=os.getpid(), created=time.time())
    h = lay.header
    tmp = layout.temp_path(slab, os.getpid())
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as e:   # a tmpfs out of inodes says ENOSPC too
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise budget.disk_full(slab.parent, h.total_bytes, e) from None
        raise
    try:
        try:  # reserve every page now: a full tmpfs fails here, not with SIGBUS half-way through
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, h.total_bytes)
            else:  # pragma: no cover - macOS
                os.ftruncate(fd, h.total_bytes)
        except OSError as e:
            now = budget.measure(slab.parent)
            raise budget.CacheBudgetError(f"reserving the cache in {slab.parent} failed ({e.strerror}): "
                                          + str(budget.too_big(h.total_bytes, now, slab.parent, imgsz, {}))) from None
        mm = mmap.mmap(fd, h.total_bytes)
        try:
            mm[:layout.HEADER_BYTES] = h.pack()
            nb = h.n_boxes
            for off, arr in ((h.shapes_off, shapes[:k]), (h.offsets_off, lay.offsets), (h.box_idx_off, lay.box_idx),
                             (h.boxes_off, boxes[:nb]), (h.classes_off, classes[:nb])):
                data = np.ascontiguousarray(arr).tobytes()
                mm[off:off + len(data)] = data
            _fill_all(store, tmp, mm, lay, shapes[:k], workers or usable_cores(), progress)
            mm[layout.STATE_OFFSET:layout.STATE_OFFSET + 4] = layout.STATE_COMPLETE.to_bytes(4, "little")
        finally:
            with contextlib.suppress(BufferError):   # a view still held by a traceback: unmapped when collected
                mm.close()
        os.rename(tmp, slab)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise budget.disk_full(slab.parent, h.total_bytes, e) from None
        raise
    finally:
        os.close(fd)
    log.info("built shm cache %s: %d of %d images, %s, %.1f s", slab, k, n, budget.gib(h.total_bytes),
             time.perf_counter() - t0)
    return replace(h, state=layout.STATE_COMPLETE)


def _fill_all(store: Store, tmp: Path, mm: mmap.mmap, lay: layout.Layout, shapes: np.ndarray, workers: int,
              progress: bool | None) -> None:
    k = len(shapes)
    if k == 0:
        return
    workers = max(1, min(workers, math.ceil(k / 16)))
    chunk = max(4, min(128, k // (workers * 8) or 1))
    jobs = [(np.arange(a, min(a + chunk, k)), lay.offsets[a:a + chunk], shapes[a:a + chunk]) for a in range(0, k, chunk)]
    with progress_bar(progress=progress is not False, total=k, unit="img", desc=f"shm cache {lay.header.imgsz}") as bar:
        if workers == 1:   # in this process, through the builder's own map
            _W["store"], _W["mem"] = store, np.frombuffer(mm, np.uint8)
            try:
                for job in jobs:
                    bar.update(_fill(job))
            finally:
                _W.clear()
            return
        with worker_context() as ctx:
            pool = ctx.Pool(workers, _init, (store, str(tmp)))
        with pool:
            for done in pool.imap_unordered(_fill, jobs):
                bar.update(done)
