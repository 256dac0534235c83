"""Write one LMDB shard, and move a finished store into place atomically."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lmdb

from ..store import format as fmt

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
