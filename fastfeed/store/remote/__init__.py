"""Stores in object storage: `RemoteShards` (the shard provider of `Store("s3://...")`), the node-local shard cache it
reads through (`shard_cache.py`, its room within the limit in `room.py`, its errors in `errors.py`, its lock files
in `locks.py`, a damaged cached copy in `damaged.py`, its size rules in `sizes.py`, the pins of what orders need in
`pins.py`, `fastfeed cache ls/clear --shards` in `manage.py`), the shard read-ahead: the background download of
what the order needs next (`read_ahead.py`), and the link it measures (`link.py`)."""

from .errors import CacheFull, CacheReadOnly, ShardDamaged
from .shard_cache import ShardCache
from .shards import RemoteShards

__all__ = ["RemoteShards", "ShardCache", "CacheFull", "CacheReadOnly", "ShardDamaged"]
