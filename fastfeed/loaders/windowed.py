"""Orders for a store whose shards come from object storage through a node's shard cache (docs/design.md, "A store
in object storage reads through a node-local shard cache").

`WindowedOrder`: the shard-aware order, for a store the cache cannot hold whole (deterministic for seed, epoch, world
size, local ranks and window; its first window ramps, `RAMP`). `FollowedOrder`: any order with a position for a cache
to follow (`reached`), which tells `follow(now, next)` (the store's read-ahead) the shards needed now and next.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .sampler import EpochOrder, batches_per_epoch, deal

RAMP = 2   # the window opens at one shard and widens by one every RAMP shards: an epoch's first batch reads few


def node_layout(rank: int, world_size: int, local_world: int) -> tuple[int, int, int, int]:
    """(node, nodes, local rank, local ranks) for global `rank` with `local_world` ranks per node (torchrun
    numbers a node's ranks contiguously). A local count that does not divide the world: one rank per node."""
    if local_world < 1 or world_size % local_world:
        local_world = 1
    return rank // local_world, world_size // local_world, rank % local_world, local_world


class WindowedOrder(EpochOrder):
    """The shard-aware order (module docstring). `shards`: (start, count) of each shard in store order."""

    def __init__(self, shards, batch_size: int, *, window: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 local_world: int = 1, drop_last: bool = True, shard_bytes=None, ramp: int = RAMP):
        self.shards = [(int(a), int(c)) for a, c in shards]
        self.n = sum(c for _, c in self.shards)
        self.batch_size, self.seed, self.window = int(batch_size), int(seed), max(1, int(window))
        self.rank, self.world_size, self.drop_last = int(rank), int(world_size), bool(drop_last)
        self.ramp = max(0, int(ramp))   # 0: none, the order of checkpoints written before it (`position.build_order`)
        self.node, self.nodes, self.local, self.local_world = node_layout(self.rank, self.world_size, int(local_world))
        sizes = [int(b) for b in shard_bytes] if shard_bytes is not None else []
        self.window_bytes = int(np.mean(sizes) * min(self.window, len(sizes))) if sizes else None
        self._cache: dict[int, list[np.ndarray]] = {}

    def per_rank(self) -> int:
        return self.n // self.world_size if self.drop_last else -(-self.n // self.world_size)

    def node_part(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(records, their shard's position in the part) of this node's part of `epoch`, in shard order."""
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.shards))
        seq = np.concatenate([np.arange(self.shards[s][0], self.shards[s][0] + self.shards[s][1], dtype=np.int64)
                              for s in perm]) if self.shards else np.zeros(0, np.int64)
        owner = np.concatenate([np.full(self.shards[s][1], s, np.int64) for s in perm]) if self.shards else seq
        part = self.per_rank() * self.local_world
        total = part * self.nodes
        if total > len(seq):   # drop_last=False: wrap around, as the global shuffle pads
            reps = -(-total // max(len(seq), 1))
            seq, owner = np.tile(seq, reps)[:total], np.tile(owner, reps)[:total]
        a = self.node * part
        seq, owner = seq[a:a + part], owner[a:a + part]
        unit = np.concatenate([[0], np.cumsum(owner[1:] != owner[:-1])]) if len(owner) else owner
        return seq, unit

    def stream(self, epoch: int) -> np.ndarray:
        """This node's records of `epoch` in reading order (before they are dealt to the local ranks)."""
        seq, unit = self.node_part(epoch)
        width = np.minimum(1 + unit / self.ramp, self.window) if self.ramp else self.window   # shard u's records:
        keys = unit + np.random.default_rng([self.seed, epoch, self.node, 7]).random(len(seq)) * width   # in [u, u + width)
        return seq[np.argsort(keys, kind="stable")]

    def batches(self, epoch: int) -> list[np.ndarray]:
        epoch = int(epoch)
        if epoch not in self._cache:
            if len(self._cache) >= 3:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = deal(self.stream(epoch), self.local, self.local_world, self.per_rank(),
                                      self.batch_size, self.drop_last)
        return self._cache[epoch]

    def __len__(self) -> int:
        return batches_per_epoch(self.n, self.batch_size, self.world_size, self.drop_last)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_cache"} | {"_cache": {}}

    def describe(self) -> dict:
        return {"order": "windowed", "scope": "node", "window_shards": self.window, "window_bytes": self.window_bytes,
                "shards": len(self.shards), "nodes": self.nodes, "local_ranks": self.local_world}

    def identity(self) -> dict:
        return {"kind": "windowed", "shards": [list(s) for s in self.shards], "batch_size": self.batch_size,
                "seed": self.seed, "window": self.window, "world_size": self.world_size,
                "local_world": self.local_world, "drop_last": self.drop_last} | ({"ramp": self.ramp} if self.ramp else {})


class FollowedOrder(EpochOrder):
    """`base`'s batches, with the shards needed now and next reported to `follow` as the loader moves on
    (module docstring). `starts`: the first record of each shard. `read_ahead`: shards downloaded ahead (None: all)."""

    def __init__(self, base: EpochOrder, starts, *, read_ahead: int | None, lookback: int = 1,
                 follow: Callable[[list, list], None] | None = None, note: dict | None = None):
        self.base = base
        self.rank, self.world_size = base.rank, base.world_size
        self.starts = np.asarray(starts, np.int64)
        self.read_ahead, self.lookback = read_ahead, max(0, int(lookback))
        self._follow = follow
        self.note = dict(note or {})
        self._spans: dict[int, tuple] = {}   # epoch -> (first, last, batches, first position)
        self._last = None

    def batches(self, epoch: int) -> list[np.ndarray]:
        return self.base.batches(epoch)

    def __len__(self) -> int:
        return len(self.base)

    def samples(self) -> int:
        return self.base.samples()

    def identity(self) -> dict:
        return self.base.identity()

    def with_base(self, base: EpochOrder) -> FollowedOrder:
        """The same following (cache, read-ahead, lookback) of another base order (a resumed epoch's remainder)."""
        return FollowedOrder(base, self.starts, read_ahead=self.read_ahead, lookback=self.lookback, follow=self._follow,
                             note=self.note)

    def describe(self) -> dict:
        """The base order's, the read-ahead, and what the link does now (`link`: the follower's `figures()`)."""
        link = {"link": self._follow.figures()} if hasattr(self._follow, "figures") else {}
        ahead = "all" if self.read_ahead is None else self.read_ahead
        return self.base.describe() | {"read_ahead_shards": ahead} | self.note | link

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_follow", "_spans", "_last")} | {
            "_follow": None, "_spans": {}, "_last": None}

    def spans(self, epoch: int) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
        """(first batch, last batch) of this rank's epoch that read each shard (-1 / -1: none), the epoch's batch
        count, and where in its records each shard is first read (the order downloads start in: a worker reading
        the first batch finds its first shards already downloading)."""
        if epoch not in self._spans:
            if len(self._spans) >= 4:
                self._spans.pop(min(self._spans))
            batches = self.batches(epoch)
            s = len(self.starts)
            first, last = np.full(s, np.iinfo(np.int64).max), np.full(s, -1, np.int64)
            pos = first.copy()
            if batches:
                idx = np.concatenate(batches)
                which = np.repeat(np.arange(len(batches)), [len(b) for b in batches])
                shard = np.searchsorted(self.starts, idx, side="right") - 1
                np.minimum.at(first, shard, which)
                np.maximum.at(last, shard, which)
                np.minimum.at(pos, shard, np.arange(len(idx)))
            first[last < 0] = -1
            self._spans[epoch] = (first, last, len(batches), pos)
        return self._spans[epoch]

    def needed(self, epoch: int, batch: int) -> tuple[list[int], list[int]]:
        """(shards read by the batches in flight: `lookback` back to `batch`; the next `read_ahead` shards first
        read after it, into the next epoch); each in the order they are first read."""
        first, last, _, pos = self.spans(epoch)
        lo = batch - self.lookback
        now = set(np.flatnonzero((first >= 0) & (first <= batch) & (last >= max(lo, 0))).tolist())
        if lo < 0 and epoch > 0:   # the previous epoch's last batches may still be in flight
            _, plast, pn, _ = self.spans(epoch - 1)
            now |= set(np.flatnonzero(plast >= pn + lo).tolist())
        ahead = [int(j) for j in np.flatnonzero(first > batch)[np.argsort(pos[first > batch], kind="stable")]]
        want = len(self.starts) if self.read_ahead is None else self.read_ahead
        if len(ahead) < want:   # the next epoch's first shards
            _, nlast, _, npos = self.spans(epoch + 1)
            used = np.flatnonzero(nlast >= 0)
            seen = now | set(ahead)
            ahead += [int(j) for j in used[np.argsort(npos[used], kind="stable")] if j not in seen]
        return sorted(now, key=lambda j: (pos[j], j)), [j for j in ahead if j not in now][:want]

    def reached(self, epoch: int, batch: int) -> None:
        if self._follow is None:
            return
        wanted = self.needed(int(epoch), int(batch))
        if wanted != self._last:
            self._last = wanted
            self._follow(*wanted)
