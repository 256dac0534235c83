"""Which records each rank reads in which order: seeded per epoch, sharded across ranks."""

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
    mine = order[:total][rank::world_size]
    if drop_last:
        mine = mine[: len(mine) // batch_size * batch_size]
    return [mine[i:i + batch_size] for i in range(0, len(mine), batch_size)]


def batches_per_epoch(n: int, batch_size: int, world_size: int = 1, drop_last: bool = True) -> int:
    per_rank = n // world_size if drop_last else -(-n // world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)
