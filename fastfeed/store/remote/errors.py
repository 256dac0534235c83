"""What the node's shard cache raises (each names the shard or the cache and what to do)."""

from __future__ import annotations

from ..objstore import RemoteError


class CacheFull(RemoteError):
    """The shard cache cannot make room (its limit, or its disk)."""


class ShardDamaged(RemoteError):
    """The bucket's copy of a shard is damaged: downloaded twice, not what the manifest says (or read damaged from a
    fresh download)."""


class CacheReadOnly(CacheFull):
    """A read-only shard cache that lacks a shard this read needs."""
