"""Write one LMDB shard, move a finished store into place atomically, and hold OUT's pack lock."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from glob import escape as glob_escape
from pathlib import Path

import lmdb

from ..store import format as fmt
from .source import PackError

log = logging.getLogger(__name__)

_MAP_SIZE = 1 << 40          # address space only: the file grows with what is written
_COMMIT_EVERY_BYTES = 64 << 20


class ShardWriter:
    """Appends records to one shard file (created on the first record), keys 0, 1, 2, ..."""

    def __init__(self, path: Path):
        self.path = path
        self.count = 0
        self._env = self._txn = None
        self._pending = 0

    def append(self, record: bytes) -> None:
        if self._env is None:
            self._env = lmdb.open(str(self.path), subdir=False, map_size=_MAP_SIZE, lock=False,
                                  sync=False, metasync=False, readahead=False, meminit=False)
            self._txn = self._env.begin(write=True)
        self._txn.put(fmt.record_key(self.count), record, append=True)
        self.count += 1
        self._pending += len(record)
        if self._pending >= _COMMIT_EVERY_BYTES:
            self._txn.commit()
            self._txn = self._env.begin(write=True)
            self._pending = 0

    def close(self) -> dict | None:
        """Commit and fsync; returns {file, count, bytes}, or None when nothing was written."""
        if self._env is None:
            return None
        self._txn.commit()
        self._env.sync(True)  # the store is published by a rename: its data must be on disk first
        self._env.close()
        self._env = self._txn = None
        return {"file": self.path.name, "count": self.count, "bytes": os.path.getsize(self.path)}

    def abort(self) -> None:
        if self._env is not None:
            self._txn.abort()
            self._env.close()
            self._env = self._txn = None


def temp_dir_for(out: Path) -> Path:
    """A sibling of OUT that can never be mistaken for a store (hidden, and no manifest until the end)."""
    return out.parent / f".{out.name}.incomplete-{os.getpid()}"


def publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Move the finished store into place; with `overwrite`, replace OUT only after the new one is whole."""
    if out.exists():
        if not overwrite:
            raise FileExistsError(out)
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)


@contextlib.contextmanager
def pack_lock(out: Path, wait: bool = False):
    """Hold OUT's pack lock (`fmt.pack_lock_path`) for the whole pack, or raise PackError at once
    when another pack holds it: two packs into one OUT learn it before either does any work. With
    `wait`, wait for the other holder instead (FastfeedTrainer's processes waiting for one pack)."""
    path = fmt.pack_lock_path(out)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise PackError(f"cannot write beside {out}: {e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise PackError(f"another fastfeed pack{f' (pid {pid})' if pid else ''} is writing {out}: "
                            "wait for it to finish, or pack into another -o") from None
        try:  # the file locked must still be the lock file: a pack finishing meanwhile unlinks its own
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    try:
        for stale in out.parent.glob(f".{glob_escape(out.name)}.incomplete-*"):  # left by a killed pack into OUT
            log.info("removing %s, left by an interrupted pack", stale)
            shutil.rmtree(stale, ignore_errors=True)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fcntl.flock(fd, fcntl.LOCK_UN)  # now, not when forked workers holding a copy of fd exit
        os.close(fd)
