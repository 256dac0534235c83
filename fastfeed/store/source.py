"""`RecordSource`: what loaders, the shm cache and the trainers need from a store, as a protocol.

`Store` (a local folder) implements it; so can any other kind of store (one in object storage, a test's
in-memory stand-in) without the loaders changing. Nothing outside `fastfeed/store/` reads a store in any
other way.

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
    src.epoch_order(cfg, rank, world_size)   optional: the EpochOrder this source wants (None: the default)

A source must pickle cheaply (it travels into every worker process) and be safe to use after fork.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .format import Manifest, Record


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

    @property
    def fingerprint(self) -> str: ...

    @property
    def class_names(self) -> list[str]: ...

    @property
    def category_ids(self) -> list[int]: ...
