"""`StoreOptions`: how a store at a URL is read on this node, passed to `Store(path, options=...)`.

Every field left None takes its default when the store is opened, from the environment:

    cache_dir         $FASTFEED_SHARD_CACHE, else ~/.cache/fastfeed/shards (a local disk)
    cache_limit       $FASTFEED_SHARD_CACHE_LIMIT (50G, 500M, 40%), else 80% of what the disk can give
    read_ahead        $FASTFEED_READ_AHEAD_SHARDS (or its old name $FASTFEED_PREFETCH_SHARDS): the most shards
                      downloaded ahead of the ones being read (the shard read-ahead), else sized by the link
                      within the cache
    storage_options   $FASTFEED_STORAGE_OPTIONS (JSON) under the ones given: fsspec options (credentials, endpoint)

The options travel with the Store when it is pickled into worker processes; nothing is written into the
environment. Storage options are never written to a manifest, a checkpoint or a log line (`__repr__` hides them).
`prefetch_depth`, the old name of `read_ahead`, still works (a DeprecationWarning).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from ..renamed import renamed, translate

READ_AHEAD_ENV = "FASTFEED_READ_AHEAD_SHARDS"
OLD_READ_AHEAD_ENV = "FASTFEED_PREFETCH_SHARDS"   # its old name, still read


@renamed(prefetch_depth="read_ahead")
@dataclass(frozen=True)
class StoreOptions:
    cache_dir: Path | str | None = None
    cache_limit: int | str | None = None
    read_ahead: int | None = None
    storage_options: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, options: StoreOptions | None = None, **given) -> StoreOptions:
        """`options` with the keyword arguments given (not None) over it; an unknown keyword is a TypeError."""
        given = translate(cls, given, stacklevel=5)
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(given) - known):
            raise TypeError(f"unknown store option(s) {', '.join(unknown)}: give {', '.join(sorted(known))}")
        base = options if options is not None else cls()
        return replace(base, **{k: v for k, v in given.items() if v is not None})

    def __post_init__(self):
        if self.read_ahead is not None:
            depth = int(self.read_ahead)
            if depth < 0:
                raise ValueError(f"read_ahead must be >= 0, got {depth}")
            object.__setattr__(self, "read_ahead", depth)
        object.__setattr__(self, "storage_options", dict(self.storage_options or {}))

    def resolved_read_ahead(self) -> int | None:
        """The read-ahead given, else `$FASTFEED_READ_AHEAD_SHARDS` (else its old name), else None (the store sizes
        it)."""
        if self.read_ahead is not None:
            return self.read_ahead
        name = READ_AHEAD_ENV if os.environ.get(READ_AHEAD_ENV, "").strip() else OLD_READ_AHEAD_ENV
        env = os.environ.get(name, "").strip()
        if not env:
            return None
        try:
            depth = int(env)
        except ValueError:
            raise ValueError(f"{name}={env!r}: give a whole number of shards to download ahead "
                             "(or unset it for the default)") from None
        if depth < 0:
            raise ValueError(f"{name}={env!r}: give a whole number of shards >= 0")
        return depth
