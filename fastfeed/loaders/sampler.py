"""Which records each rank reads in which order: seeded per epoch, sharded across ranks.

`epoch_batches` is the global shuffle; `EpochOrder` is what a loader is given (`shard_order.default_order` picks one from the
store's facts; the shard-aware windows of a store in object storage are `windowed.py`, chosen in `shard_order.py`)."""

from __future__ import annotations

import numpy as np


def epoch_batches(n: int, batch_size: int, *, epoch: int, seed: int, rank: int = 0, world_size: int = 1,
                  shuffle: bool = True, drop_last: bool = True) -> list[np.ndarray]:
    """Index batches of `rank` for `epoch`.

    Every rank draws the same permutation (seeded by seed and epoch) and takes every
    `world_size`-th element from `rank` on, so ranks are disjoint and together cover the epoch.
    Ranks must run the same number of steps (or collective ops hang): with `drop_last` each rank
    keeps n // world_size samples; without, the permutation is padded by wrapping around (as
    torch's DistributedSampler does), so at most world_size - 1 samples repeat.
    """
    if n <= 0:
        return []
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    per_rank = n // world_size if drop_last else -(-n // world_size)
    total = per_rank * world_size
    if total > n:
        order = np.concatenate([order, order[: total - n]])
    return deal(order[:total], rank, world_size, per_rank, batch_size, drop_last)


def deal(seq: np.ndarray, rank: int, ranks: int, per_rank: int, batch_size: int, drop_last: bool) -> list[np.ndarray]:
    """Rank `rank`'s batches of `seq`, dealt to `ranks` in turn: its first `per_rank` records, in batches (with
    `drop_last`, the last one left out when it is not full)."""
    mine = seq[rank::ranks][:per_rank]
    if drop_last:
        mine = mine[: len(mine) // batch_size * batch_size]
    return [mine[i:i + batch_size] for i in range(0, len(mine), batch_size)]


def batches_per_epoch(n: int, batch_size: int, world_size: int = 1, drop_last: bool = True) -> int:
    per_rank = n // world_size if drop_last else -(-n // world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


class EpochOrder:
    """Which records each batch of this rank's epoch holds: the one place a loader gets its batch order from.

    A loader is given one (`create_loader(name, store, cfg, order=...)`; by default `default_order`, which lets
    a store choose, e.g. a shard-aware order for a store whose shards do not all fit a node's cache, and
    otherwise takes `ShuffledOrder`). The contract: `batches(epoch)` is a list of int64 index arrays, the same
    for the same arguments in every process (orders are pickled into worker processes); every epoch has
    `len(order)` batches, the same on every rank (collectives hang otherwise); ranks are disjoint.
    `describe()` says what the order is, for the loader's and the bench's reports.
    """

    rank: int = 0
    world_size: int = 1

    def batches(self, epoch: int) -> list[np.ndarray]:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def samples(self) -> int:
        """Records this rank draws per epoch."""
        return sum(len(b) for b in self.batches(0))

    def describe(self) -> dict:
        return {"order": type(self).__name__}

    def identity(self) -> dict:
        """What makes every rank's batches (no rank): equal identities give equal batches; a saved one rebuilds the
        order (`position.build_order`: the built-in kinds) to find what a mid-epoch checkpoint had trained."""
        return {"kind": type(self).__name__, "world_size": self.world_size}

    def reached(self, epoch: int, batch: int) -> None:
        """The loader is about to hand batch `batch` of `epoch` out to be read (called in order, by every
        built-in loader where it submits batches). An order that drives a shard cache (`windowed.FollowedOrder`)
        pins and prefetches from it; others ignore it."""


class ShuffledOrder(EpochOrder):
    """The global shuffle (`epoch_batches`): every epoch a permutation of the whole store seeded by (seed, epoch),
    dealt to the ranks in turn. The last two epochs' batches are kept (resuming and the next epoch's queue
    ask for them again)."""

    def __init__(self, n: int, batch_size: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, drop_last: bool = True):
        self.n, self.batch_size, self.seed = int(n), int(batch_size), int(seed)
        self.rank, self.world_size, self.shuffle, self.drop_last = int(rank), int(world_size), bool(shuffle), bool(drop_last)
        self._cache: dict[int, list[np.ndarray]] = {}

    @classmethod
    def for_loader(cls, n: int, cfg, rank: int, world_size: int) -> ShuffledOrder:
        """The order a LoaderConfig asks for (its batch_size, seed, shuffle, drop_last) for one rank."""
        return cls(n, cfg.batch_size, seed=cfg.seed, rank=rank, world_size=world_size, shuffle=cfg.shuffle,
                   drop_last=cfg.drop_last)

    def batches(self, epoch: int) -> list[np.ndarray]:
        epoch = int(epoch)
        if epoch not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = epoch_batches(self.n, self.batch_size, epoch=epoch, seed=self.seed, rank=self.rank,
                                               world_size=self.world_size, shuffle=self.shuffle, drop_last=self.drop_last)
        return self._cache[epoch]

    def __len__(self) -> int:
        return batches_per_epoch(self.n, self.batch_size, self.world_size, self.drop_last)

    def samples(self) -> int:   # without drop_last: every rank's share, padded (`epoch_batches`)
        return len(self) * self.batch_size if self.drop_last else -(-self.n // self.world_size)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_cache"} | {"_cache": {}}

    def describe(self) -> dict:
        return {"order": "shuffle" if self.shuffle else "sequential", "scope": "global"}

    def identity(self) -> dict:
        return {"kind": "shuffle", "n": self.n, "batch_size": self.batch_size, "seed": self.seed,
                "world_size": self.world_size, "shuffle": self.shuffle, "drop_last": self.drop_last}
