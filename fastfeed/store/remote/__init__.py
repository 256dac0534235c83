"""Stores in object storage: `RemoteStore` (what `Store("s3://...")` opens), the node-local shard cache it reads
through (`cache.py`, its lock files in `locks.py`, a damaged cached copy in `damaged.py`, its size rules in
`sizes.py`, the pins of what orders need in `pins.py`, `fastfeed cache ls/clear --shards` in `manage.py`), and the
background download of what the order needs next (`prefetch.py`)."""

from .cache import CacheFull, CacheReadOnly, ShardCache, ShardDamaged
from .store import RemoteStore

__all__ = ["RemoteStore", "ShardCache", "CacheFull", "CacheReadOnly", "ShardDamaged"]
