"""Stores in object storage: `RemoteShards` (the shard provider of `Store("s3://...")`), the node-local shard cache it
reads through (`shard_cache.py` and its parts), the shard read-ahead (`read_ahead.py`) and the link it measures (`link.py`)."""

from .errors import CacheFull, CacheReadOnly, ShardDamaged
from .shard_cache import ShardCache
from .shards import RemoteShards

__all__ = ["RemoteShards", "ShardCache", "CacheFull", "CacheReadOnly", "ShardDamaged"]
