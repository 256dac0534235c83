"""Reading a record of a store at a URL; a damaged cached copy of its shard is blamed first, downloaded again and the
read tried once more, and only a fresh copy that fails too is the bucket's damage (docs/format.md, "The shard cache")."""

from __future__ import annotations

import contextlib
import logging
import os

from .. import format as fmt
from .. import handles
from ..changed import under_reader
from ..record import Record, parse_record
from .errors import ShardDamaged

log = logging.getLogger(__name__)
_ADVICE = "; run `fastfeed verify` and re-pack"


def read(store, index: int, shard: int, check_crc: bool) -> Record:
    """Record `index` (in shard number `shard`) of `store` (a `RemoteShards`), its shard downloaded first if needed,
    copied out of the map."""
    seen: list = []
    try:
        return _read(store, index, shard, check_crc, seen)
    except fmt.RecordCorrupt as e:
        log.warning("%s (the node's cached copy %s); downloading the shard again", _plain(e),
                    store.cache.file(store.shards[shard]))
    _refresh(store, shard, seen[-1] if seen else None)
    try:
        return _read(store, index, shard, check_crc, [])
    except fmt.RecordCorrupt as e:
        raise ShardDamaged(f"the bucket's copy of shard {store.shard_url(shard)} is damaged: {_plain(e)}, in the "
                           "node's cached copy and again in a fresh download whose sha256 matches the manifest (it was "
                           "damaged when packed). Re-pack the store (fastfeed pack --force)") from None


def _plain(e: Exception) -> str:
    text = str(e)
    return text[:-len(_ADVICE)] if text.endswith(_ADVICE) else text


def _read(store, index: int, shard: int, check_crc: bool, seen: list) -> Record:
    info = store.shards[shard]
    where = store.shard_url(shard)
    h = store.handle(shard, seen)
    if (size := os.fstat(h.fd).st_size) != info.bytes:   # reading a shrunk map would kill us (SIGBUS)
        raise fmt.StoreChanged(f"record {index}: " + under_reader(
            [f"the cached copy {store.cache.file(info)} of shard {where} is now {size} bytes, {info.bytes} when "
             "downloaded"]))
    try:
        buf = h.txn.get(fmt.record_key(index - info.start))
    except handles.lmdb.Error as e:
        raise handles.lmdb_failed(e, where, index) from None
    if buf is None:
        raise fmt.RecordCorrupt(f"record {index} missing from shard {where}{_ADVICE}")
    return parse_record(bytes(buf), index, where, check_crc)


def _refresh(store, shard: int, bad: tuple | None) -> None:
    """Replace the damaged cached copy `bad` (its identity; None: whatever is cached) of shard `shard` with a fresh
    download. A fresh download that does not match the manifest raises ShardDamaged (the bucket's copy); the damaged
    copy is then removed, so no process reads it again."""
    info = store.shards[shard]
    if shard in store.maps:
        store.close_shard(shard)
    stale = store.cache.identity(info) if bad is None else bad
    try:
        store.fetch(shard, wait=True, stale=stale)
    except ShardDamaged:
        if stale is not None and store.cache.identity(info) == stale:
            with contextlib.suppress(OSError):
                store.cache.file(info).unlink()
        raise
