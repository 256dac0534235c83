"""`RecordSource`: what loaders, the shm cache, the trainers and `verify` need from a store, as a protocol.

`Store` implements it, over a folder or a URL alike (it reads through a shard provider: `local.LocalShards`,
`remote.shards.RemoteShards`); so can any other kind of store (a test's in-memory stand-in) without the loaders
changing. Nothing outside `fastfeed/store/` reads a store in any other way.

    len(src)                         records in the store
    src.record(i, check_crc=None)    Record i: parsed, CRC-checked (errors name it and its shard)
    src.shard_of(i)                  the index into src.shards of the shard holding record i
    src.shards                       [ShardInfo] (file, count, bytes, start) in record order
    src.manifest                     the Manifest (classes, payload settings, stats, the pack report)
    src.path                         where it is (a folder, or a URL), for messages and cache names
    src.fingerprint                  of the content: caches (shm, VRAM) are keyed by it
    src.class_names, src.category_ids
    src.check_crc                    whether record() checks CRCs by default
    src.reopen()                     a fresh source over the same place (what is there now), same settings
    src.close()                      release this process's handles (maps, files); reads reopen them
    src.shard_url(k), src.shard_entries(k), src.fetch(k, wait=True)
                                     where shard k is; the records LMDB holds in it; make it readable here
  The facts the loaders choose the order from (`loaders/shard_order.default_order`); the store never chooses one:
    src.remote                       whether reads download shards (then the order must suit the shard cache)
    src.cache_limit                  bytes of its shards the node's cache holds (None: all are local)
    src.read_ahead, src.read_ahead_given   most shards to keep downloaded ahead, and whether it was asked for
    src.follower()                   `want(now, upcoming)`, told by the order what it needs (None: nothing to fetch)

A source must pickle cheaply (it travels into every worker process, with its options) and be safe to use after fork.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .format import Manifest
from .record import Record


@runtime_checkable
class RecordSource(Protocol):
    path: object
    manifest: Manifest
    shards: list
    check_crc: bool

    def __len__(self) -> int: ...

    def record(self, index: int, check_crc: bool | None = None) -> Record: ...

    def shard_of(self, index: int) -> int: ...

    def reopen(self) -> RecordSource: ...

    def close(self) -> None: ...

    def shard_url(self, shard: int) -> str: ...

    def shard_entries(self, shard: int) -> int: ...

    def fetch(self, shard: int, wait: bool = True) -> bool: ...

    def follower(self): ...

    @property
    def remote(self) -> bool: ...

    @property
    def cache_limit(self) -> int | None: ...

    @property
    def read_ahead(self) -> int | None: ...

    @property
    def read_ahead_given(self) -> bool: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def class_names(self) -> list[str]: ...

    @property
    def category_ids(self) -> list[int]: ...


@runtime_checkable
class ShardProvider(Protocol):
    """What a `Store` reads through: a folder's shards (`local.LocalShards`) or a URL's, downloaded into the node's
    shard cache (`remote.shards.RemoteShards`). A `Store` passes the members named in `PASSED` on as its own."""

    path: object                 # where it is (a folder, or the URL as shown)
    manifest: Manifest
    remote: bool                 # whether reads download shards
    cache: object                # the node's `ShardCache` (None: every shard is local)
    cache_limit: int | None      # bytes of its shards the cache holds (None: every shard is local)
    read_ahead: int | None       # most shards downloaded ahead (None: nothing is downloaded)
    read_ahead_given: bool       # whether `read_ahead` was asked for (StoreOptions) rather than sized

    @property
    def location(self) -> object:
        """What `Store(...)` opens it again from."""

    def record(self, index: int, shard: int, check_crc: bool) -> Record:
        """Record `index`, in shard number `shard`."""

    def shard_url(self, shard: int) -> str:
        """Where shard `shard` is (a file path; a URL for a store in object storage)."""

    def fetch(self, shard: int, wait: bool = True) -> bool:
        """Make shard `shard` readable here: a local one is; one at a URL is downloaded (without `wait`: False when
        another process is downloading it or there is no room now)."""

    def shard_entries(self, shard: int) -> int:
        """Records LMDB holds in shard `shard` (verify compares it with the manifest)."""

    def missing(self) -> list:
        """The shards (`ShardInfo`) whose file is not there."""

    def check_source(self, shard: int) -> str | None:
        """How shard `shard` at its source differs from the manifest's checksum (None: it does not); a URL's is
        downloaded afresh, replacing the cached copy (`ShardDamaged` when the bucket's copy is damaged)."""

    def stored_bytes(self) -> int:
        """Bytes its shards take where they are stored."""

    def follower(self):
        """What one order tells the shards it needs now and next (`want(now, upcoming)`), or None when they are all
        here."""

    def close(self) -> None:
        """Release this process's handles (maps, lock files); reads reopen them."""


PASSED = ("remote", "cache", "cache_limit", "read_ahead", "read_ahead_given", "shard_url", "fetch", "shard_entries",
          "missing", "check_source", "stored_bytes", "follower")
