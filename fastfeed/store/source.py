"""What a store is to its readers, as protocols, one declaration per member (docs/design.md, "Data flow"):
`RecordSource`, what everything outside `fastfeed/store/` reads a store through (pickles cheaply, safe after
fork); `ShardProvider`, what a `Store` reads through (`local.LocalShards`, `remote.shards.RemoteShards`); and
`ShardFacts`, which both share and a Store passes on as its own (`PASSED`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .format import Manifest
from .record import Record


@runtime_checkable
class ShardFacts(Protocol):
    path: object                 # where it is (a folder, or a URL), for messages and cache names
    manifest: Manifest           # classes, payload settings, stats, the pack report
    remote: bool                 # whether reads download shards (then the order must suit the shard cache)
    cache: object                # the node's `ShardCache` (None: every shard is local)
    cache_limit: int | None      # bytes of its shards the node's cache holds (None: every shard is local)
    read_ahead: int | None       # most shards kept downloaded ahead (None: nothing is downloaded)
    read_ahead_given: bool       # whether `read_ahead` was asked for (StoreOptions) rather than sized

    def shard_url(self, shard: int) -> str: ...          # where shard k is (a file path, or a URL)

    def fetch(self, shard: int, wait: bool = True) -> bool: ...   # make it readable here (a URL's: downloaded)

    def waiting(self, shard: int) -> bool: ...           # a read now would wait for a download under way

    def shard_entries(self, shard: int) -> int: ...      # the records LMDB holds in it (verify: the manifest's?)

    def missing(self) -> list: ...                       # the shards (ShardInfo) whose file is not there

    def check_source(self, shard: int) -> str | None: ...   # how its source differs from the manifest (None: not)

    def stored_bytes(self) -> int: ...                   # bytes its shards take where they are stored

    def follower(self): ...                              # `want(now, upcoming)` for one order (None: all here)

    def close(self) -> None: ...                         # release this process's handles; reads reopen them


PASSED = ("remote", "cache", "cache_limit", "read_ahead", "read_ahead_given", "shard_url", "fetch", "waiting", "shard_entries",
          "missing", "check_source", "stored_bytes", "follower")


@runtime_checkable
class ShardProvider(ShardFacts, Protocol):
    location: object             # what `Store(...)` opens it again from

    def record(self, index: int, shard: int, check_crc: bool) -> Record: ...   # record `index`, in shard `shard`


@runtime_checkable
class RecordSource(ShardFacts, Protocol):
    shards: list                 # [ShardInfo] (file, count, bytes, start) in record order
    check_crc: bool              # whether record() checks CRCs by default
    fingerprint: str             # of the content: caches (shm, VRAM) are keyed by it
    class_names: list[str]
    category_ids: list[int]

    def __len__(self) -> int: ...                        # records in the store

    def record(self, index: int, check_crc: bool | None = None) -> Record: ...   # parsed, CRC-checked

    def shard_of(self, index: int) -> int: ...           # the index into `shards` of the shard holding record i

    def reopen(self) -> RecordSource: ...                # a fresh source over the same place, same settings
