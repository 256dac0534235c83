"""Attaching to a slab: the first comer builds it under the lock, the others wait and attach.

    lease = acquire(store, imgsz=640)          # builds /dev/shm/fastfeed-<fingerprint>-640-v1.cache once
    view = lease.handle().view()               # in any process: zero-copy numpy views
    img, boxes, classes = view.record(i)
    lease.release()                            # the last user out removes the slab (unless keep)

Every decision is taken under the slab's lock (users.py), so a slab is never read half-built,
removed while someone attaches, or built twice. A slab that is not usable (half-written, wrong
size or version, a builder that died) is removed and rebuilt; so are temporary files of dead builders.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from contextlib import AbstractContextManager
from pathlib import Path

from ..store.reader import Store
from . import budget, build, layout, users
from .layout import probe, temp_files, users_path
from .manage import check_folder, reclaim
from .users import CacheError

log = logging.getLogger(__name__)
RELEASE_WAIT = 60.0   # seconds; only a build holds the lock for long, and none runs on an attached slab


class CacheHandle:
    """A picklable, fork-safe reference to a slab: each process maps it (read-only) on first use."""

    def __init__(self, path, header: layout.Header):
        self.path, self.header = str(path), header
        self._pid = None
        self._view: layout.View | None = None

    def __getstate__(self):
        return {"path": self.path, "header": self.header}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._pid, self._view = None, None

    def view(self) -> layout.View:
        if self._pid != os.getpid():
            self._attach()
        return self._view

    def _attach(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CacheError(f"the shm cache {self.path} was removed while in use (`fastfeed cache clear --force`?); "
                             "restart the run") from None
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else b""
        finally:
            os.close(fd)
        try:
            view = layout.View(mm)
        except layout.CacheFormatError as e:
            raise CacheError(f"the shm cache {self.path} cannot be read: {e}") from None
        h, want = view.header, self.header
        if (h.fingerprint, h.imgsz, h.n_cached, h.total_bytes) != (want.fingerprint, want.imgsz, want.n_cached,
                                                                   want.total_bytes):
            raise CacheError(f"the shm cache {self.path} was replaced by a different one while in use; restart the run")
        self._view, self._pid = view, os.getpid()

    def detach(self) -> None:
        """Drop this process's map (it is unmapped once no array refers to it)."""
        self._view, self._pid = None, None


class CacheLease(AbstractContextManager):
    """This process's attachment to a slab; `release()` (idempotent) detaches it."""

    def __init__(self, path: Path, header: layout.Header, built: bool, keep: bool):
        self.path, self.header, self.built, self.keep = path, header, built, keep
        self.pid = os.getpid()
        self._released = False
        self._handle = CacheHandle(path, header)

    @property
    def size(self) -> int:
        return self.header.total_bytes

    @property
    def n_cached(self) -> int:
        return self.header.n_cached

    @property
    def n_records(self) -> int:
        return self.header.n_records

    def handle(self) -> CacheHandle:
        return self._handle

    def __repr__(self) -> str:
        return (f"CacheLease({str(self.path)!r}, {self.n_cached}/{self.n_records} images, {self.size} bytes, "
                f"built={self.built})")

    def release(self) -> None:
        if self._released or os.getpid() != self.pid:
            return   # a forked child never detaches its parent's lease
        self._released = True
        self._handle.detach()
        try:
            with users.locked(users_path(self.path), RELEASE_WAIT) as fd:
                u = users.read(fd)
                u.remove(self.pid)
                if u.entries or u.keep:
                    users.write(fd, u)
                    return
                self.path.unlink(missing_ok=True)
                users_path(self.path).unlink(missing_ok=True)   # still locked: waiters see it gone and retry
                log.debug("removed shm cache %s (last user)", self.path)
        except (CacheError, OSError) as e:
            log.warning("could not detach from the shm cache %s (%s); `fastfeed cache clear` removes it once unused",
                        self.path, e)

    def __exit__(self, *exc):
        self.release()


def acquire(store: Store, imgsz: int, cache_dir="/dev/shm", *, partial: bool = False, wait: float = 600.0,
            keep: bool = False, workers: int | None = None, progress: bool | None = None) -> CacheLease:
    """Attach to the cache of `store` at `imgsz` in `cache_dir`, building it first if needed."""
    cache_dir = Path(cache_dir)
    check_folder(cache_dir, write=True)   # a slab's users file is written even to attach
    slab = layout.slab_path(cache_dir, store.fingerprint, imgsz)
    for info in reclaim(cache_dir, spare=slab):   # a restarted run reuses its own
        log.warning("the shm cache %s: %s", info.path, info.note)
    try:
        return _acquire(store, imgsz, slab, partial, wait, keep, workers, progress)
    except PermissionError as e:
        if not str(e.filename or "").startswith(str(slab)):
            raise
        raise CacheError(f"cannot use the shm cache {slab} ({e.strerror}: {e.filename}): another user's? "
                         "Set ShmOptions.cache_dir to a directory of your own") from None


def _acquire(store: Store, imgsz: int, slab: Path, partial: bool, wait: float, keep: bool, workers,
             progress) -> CacheLease:
    def waiting(holder):
        log.info("waiting for pid %s to finish the shm cache %s", holder, slab)

    def busy(holder: int | None) -> str:
        builders = [pid for _, pid in temp_files(slab) if users.alive(pid)]
        who = (f"pid {builders[0]} is still building it" if builders else
               f"pid {holder} still holds its lock" if holder else "another process still holds its lock")
        return (f"gave up after waiting {wait:g} s (ShmOptions.cache_wait) for the shm cache {slab}: {who}. "
                "Raise cache_wait for a large dataset, or check that process")

    with users.locked(users_path(slab), wait, busy, waiting) as fd:
        u = users.read(fd)
        alone = not u.entries and not u.keep
        header = built = None
        try:
            users.write(fd, u)   # its page first: a slab that fills the disk must leave room for our line
            header, built = _usable_or_built(store, imgsz, slab, u, partial, workers, progress)
            u.add(os.getpid())
            u.keep = u.keep or keep
            users.write(fd, u)
        except BaseException as e:
            if built and alone:
                slab.unlink(missing_ok=True)   # built by us, used by nobody: not left filling the disk
            if alone and not slab.exists():
                users_path(slab).unlink(missing_ok=True)   # leave nothing behind (still locked)
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise budget.disk_full(slab.parent, header.total_bytes if header else None, e) from None
            raise
    return CacheLease(slab, header, built, keep)


def _usable_or_built(store: Store, imgsz: int, slab: Path, u: users.Users, partial: bool, workers,
                     progress) -> tuple[layout.Header, bool]:
    """Under the lock: the slab's header if it can be used as it is, else build it."""
    for tmp, pid in temp_files(slab):   # we hold the lock: no live builder is writing these
        if pid == os.getpid() or not users.alive(pid):
            log.warning("removing %s, left half-written by pid %d", tmp, pid)
            tmp.unlink(missing_ok=True)
    header, why = probe(slab, store.fingerprint, imgsz)
    if header is None and why:
        log.warning("rebuilding the shm cache %s: %s", slab, why)
        slab.unlink(missing_ok=True)
    if header is not None and header.partial and not partial:
        if u.entries:
            raise CacheError(f"the shm cache {slab} holds only {header.n_cached} of {header.n_records} images "
                             f"(built with cache_partial=True) and is in use by pid(s) "
                             f"{', '.join(map(str, u.pids))}: pass cache_partial=True to share it, or build a "
                             "full one once they have finished")
        log.info("rebuilding the partial shm cache %s in full", slab)
        slab.unlink()
        header = None
    if header is not None:
        return header, False
    return build.build(store, imgsz, slab, partial=partial, workers=workers, progress=progress), True
