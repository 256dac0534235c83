"""Write records into LMDB shards inside a temporary directory, renamed into place only on success."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lmdb

from ..store import format as fmt

_MAP_SIZE = 1 << 40          # address space only: the file grows with what is written
_COMMIT_EVERY_BYTES = 64 << 20


class ShardWriter:
    """Appends records in index order, rolling to a new shard by count or by size."""

    def __init__(self, tmp_dir: Path, per_shard: int | None = None, shard_bytes: int | None = None):
        assert (per_shard is None) != (shard_bytes is None)
        self.dir = tmp_dir
        self.per_shard, self.shard_bytes = per_shard, shard_bytes
        self.shards: list[dict] = []
        self.count = 0
        self._env = self._txn = None
        self._pending = 0

    def _roll(self) -> None:
        self._close_shard()
        name = fmt.shard_file(len(self.shards))
        self._env = lmdb.open(str(self.dir / name), subdir=False, map_size=_MAP_SIZE, lock=False,
                              sync=False, metasync=False, readahead=False, meminit=False)
        self._txn = self._env.begin(write=True)
        self.shards.append({"file": name, "start": self.count, "count": 0, "bytes": 0})

    def _close_shard(self) -> None:
        if self._env is None:
            return
        self._txn.commit()
        self._env.sync(True)
        self._env.close()
        shard = self.shards[-1]
        shard["bytes"] = os.path.getsize(self.dir / shard["file"])
        self._env = self._txn = None

    def append(self, record: bytes) -> int:
        """Write one record; returns its global index."""
        shard = self.shards[-1] if self.shards else None
        full = shard is None or (shard["count"] >= self.per_shard if self.per_shard
                                 else shard["count"] and shard["bytes"] + len(record) > self.shard_bytes)
        if full:
            self._roll()
            shard = self.shards[-1]
        index = self.count
        self._txn.put(fmt.record_key(index), record, append=True)
        shard["count"] += 1
        shard["bytes"] += len(record)  # an estimate until the shard closes and its file is measured
        self.count += 1
        self._pending += len(record)
        if self._pending >= _COMMIT_EVERY_BYTES:
            self._txn.commit()
            self._txn = self._env.begin(write=True)
            self._pending = 0
        return index

    def close(self) -> list[dict]:
        self._close_shard()
        return self.shards


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
