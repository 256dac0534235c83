"""Which epoch order a loader follows unless it is given one (`default_order`), chosen from the store's facts: the
global shuffle, or for a store at a URL whose shards the node's shard cache cannot hold, the shard-aware
`windowed.WindowedOrder`; a URL store's order is followed (`windowed.FollowedOrder`) by its read-ahead
(docs/design.md, "A store in object storage reads through a node-local shard cache, and the order follows the cache").
"""

from __future__ import annotations

import math

from .sampler import EpochOrder, ShuffledOrder
from .windowed import FollowedOrder, WindowedOrder

MIN_READ_AHEAD = 2  # a tight cache shortens a read-ahead it was not asked for down to this, before it refuses
SPARE_SHARDS = 1    # cache room left for other readers (an evaluation store, a shm cache build)


def fits(store) -> bool:
    """Whether the node's shard cache can hold the whole store (with room for one more shard)."""
    largest = max((s.bytes for s in store.shards), default=0)
    return sum(s.bytes for s in store.shards) + SPARE_SHARDS * largest <= store.cache_limit


def window_shards(store, ahead: int, lookback_records: int = 0) -> int:
    """Shards the windowed order reads at once: the largest shards the cache's limit holds besides `ahead` read ahead
    (at the mean size: one that finds no room is left to the read), less those the batches in flight still read
    (`lookback_records` of the node's stream, and one being left) and a spare."""
    largest = max((s.bytes for s in store.shards), default=1)
    mean = sum(s.bytes for s in store.shards) / max(len(store.shards), 1)
    per_shard = max(len(store) / max(len(store.shards), 1), 1)
    leaving = 1 + math.ceil(lookback_records / per_shard)
    return int((store.cache_limit - ahead * mean) // max(largest, 1)) - leaving - SPARE_SHARDS


def shard_order(store, cfg, rank: int, world_size: int) -> EpochOrder:
    """The order of a store whose reads download shards (the module docstring's design.md section)."""
    lookback = max(cfg.workers, 1) * cfg.batches_ahead + 1
    note = {"cache_limit": store.cache_limit, "store_bytes": sum(s.bytes for s in store.shards)}
    whole = fits(store)
    if not cfg.shuffle or whole:
        base = ShuffledOrder.for_loader(len(store), cfg, rank, world_size)
        ahead = store.read_ahead if store.read_ahead_given or not whole else None   # asked for: kept
    else:
        local = cfg.local_world_size or 1
        ahead = store.read_ahead
        while ((window := window_shards(store, ahead, lookback * cfg.batch_size * local)) < 1
               and not store.read_ahead_given and ahead > MIN_READ_AHEAD):   # tight cache: shorter
            ahead -= 1
        if window < 1:
            largest = max(s.bytes for s in store.shards)
            need = store.cache_limit + (1 - window) * largest
            raise ValueError(f"the shard cache limit ({store.cache_limit} bytes) holds fewer shards of {store.path} "
                             f"than the windowed order needs: {ahead} read ahead (read_ahead), those the "
                             f"{lookback} batches in flight read, one read now and a spare: at least {need} bytes at "
                             f"{largest} a shard. Raise it (--shard-cache-limit, FASTFEED_SHARD_CACHE_LIMIT "
                             "or Store(url, shard_cache_limit=...)), lower read_ahead (--read-ahead-shards), or "
                             "re-pack with a smaller --shard-mb")
        base = WindowedOrder([(s.start, s.count) for s in store.shards], cfg.batch_size, window=window,
                             seed=cfg.seed, rank=rank, world_size=world_size, local_world=local,
                             drop_last=cfg.drop_last, shard_bytes=[s.bytes for s in store.shards])
    return FollowedOrder(base, [s.start for s in store.shards], read_ahead=ahead, lookback=lookback,
                         follow=store.follower(), note=note)


def default_order(store, cfg, rank: int, world_size: int) -> EpochOrder:
    """The order a loader uses unless it is given one: for a store whose reads download shards (`store.remote`),
    the one its shard cache can follow (`shard_order`: the global shuffle when the cache holds the store, else
    shard-aware windows); else the global shuffle."""
    if getattr(store, "remote", False):
        return shard_order(store, cfg, rank, world_size)
    return ShuffledOrder.for_loader(len(store), cfg, rank, world_size)
