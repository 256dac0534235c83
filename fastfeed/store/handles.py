"""Process-local LMDB handles of shard files, shared by every Store of the process (local and remote), and what
names a shard when LMDB fails on it."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import lmdb

from . import changed
from . import format as fmt


@dataclass(slots=True)
class _Handle:
    pid: int
    env: lmdb.Environment
    txn: lmdb.Transaction
    fd: int                # the shard file, to see it change under the map (a truncated map faults: SIGBUS)
    users: int = 0
    file: str = ""         # its path, and its size when mapped: what the SIGBUS handler names (changed.py)
    bytes: int = 0


# py-lmdb refuses to open one file twice in a process, and a forked child inherits the parent's open
# environments; so handles live here, shared by every Store of this process. They are keyed by the
# file's identity (device, inode), not its path: a store re-packed in place (`fastfeed pack --force`)
# has new files under the old names, and a Store opened after that must read those, never a map of
# the old ones.
_HANDLES: dict[tuple[int, int], _Handle] = {}


def acquire(key: tuple[int, int], file: str) -> _Handle:
    h = _HANDLES.get(key)
    if h is not None and h.pid != os.getpid():
        # Inherited through fork: LMDB handles must not cross processes. Dropping them here only
        # unmaps this child's copy (read-only, lock=False: no reader slots or lock files to disturb).
        with contextlib.suppress(lmdb.Error):
            h.txn.abort()
            h.env.close()
        os.close(h.fd)
        h = None
    if h is None:
        changed.watch_for_bus_errors()
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        try:
            env = lmdb.open(file, subdir=False, readonly=True, lock=False, readahead=False,
                            max_readers=2048, meminit=False)
        except BaseException:
            os.close(fd)
            raise
        # One long read transaction per process: the store is immutable, and buffers stay valid.
        h = _HANDLES[key] = _Handle(os.getpid(), env, env.begin(buffers=True), fd, file=file,
                                    bytes=os.fstat(fd).st_size)
    h.users += 1
    return h


def release(key: tuple[int, int]) -> None:
    h = _HANDLES.get(key)
    if h is None or h.pid != os.getpid():
        return
    h.users -= 1
    if h.users <= 0:
        h.txn.abort()
        h.env.close()
        os.close(h.fd)
        del _HANDLES[key]


def mapped_changes() -> list[tuple[str, int, int]]:
    """(file, size now, size when mapped) of the shard files this process maps whose size changed (by their fd: a
    file copied over or replaced at its path still counts). Used by the SIGBUS handler: no allocation-heavy work."""
    found = []
    for h in list(_HANDLES.values()):
        if h.pid != os.getpid() or not h.file:
            continue
        try:
            size = os.fstat(h.fd).st_size
        except OSError:
            continue
        if size != h.bytes:
            found.append((h.file, size, h.bytes))
    return found


def lmdb_failed(e: Exception, shard: str, index: int | None = None) -> fmt.RecordCorrupt:
    """An LMDB error reading a shard, as the error that names it (what LMDB says alone names no file)."""
    what = f"record {index} in shard {shard}" if index is not None else f"shard {shard}"
    return fmt.RecordCorrupt(f"{what}: LMDB cannot read it ({type(e).__name__}: {e}); the shard's pages are damaged")
