"""The shard read-ahead sized by the link (store/remote/link.py): bandwidth x delay in shards, within the cache."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fastfeed.store.remote.link import Link
from fastfeed.store.remote.read_ahead import ReadAhead


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@dataclass
class Info:
    file: str
    bytes: int


class SlowProvider:
    """A store at a URL whose every download takes `delay` seconds before its first byte, then `size / bandwidth`,
    on a fake clock (no sleeping); its cache holds `limit` bytes, `read_ahead` the most its window left."""

    def __init__(self, shards: int, size: int, delay: float, bandwidth: float, read_ahead: int):
        self.shards = [Info(f"shard-{k:03d}.mdb", size) for k in range(shards)]
        self.clock = Clock()
        self.link = Link(self.clock)
        self.delay, self.bandwidth = delay, bandwidth
        self.read_ahead, self.read_ahead_given = read_ahead, False
        with self.link.timed():          # the manifest: a small request
            self.clock.t += delay

    def download(self, k: int) -> None:
        with self.link.timed(self.shards[k].bytes):
            self.clock.t += self.delay + self.shards[k].bytes / self.bandwidth


def _ahead(p: ReadAhead, offered: int) -> int:
    return p.ahead_for(offered)


def test_the_read_ahead_grows_to_cover_the_delay_and_stays_within_the_cache():
    # 19 shards of 0.46 MB, 50 ms to the first byte, 100 MB/s: 1 + 0.05 x 100e6 / 0.46e6 = 12 shards in flight
    # keep the link busy. The cache (60% of the store: 11 shards) left the order a read-ahead of at most 5.
    size, delay, bw = 460_000, 0.05, 100e6
    src = SlowProvider(19, size, delay, bw, read_ahead=5)
    p = ReadAhead.__new__(ReadAhead)   # the sizing alone: no pin files, no thread
    p.store, p.floor, p.ahead = src, 2, 2
    assert _ahead(p, 5) == 2                                         # nothing downloaded yet: the floor
    src.download(0)
    assert src.link.delay() == pytest.approx(delay) and src.link.throughput() == pytest.approx(bw)
    assert _ahead(p, 5) == 5                                         # grown to the cache's cap, not 12
    assert src.link.read_ahead(size, 2, 64) == 12                         # which is what the link alone would want
    # Near the bucket (1 ms) the same shards need no more than the floor: the cache is left to the window.
    near = SlowProvider(19, size, 0.001, bw, read_ahead=5)
    for k in range(4):
        near.download(k)
    assert near.link.read_ahead(size, 2, 5) == 2
    # The read-ahead asked for (--read-ahead-shards, $FASTFEED_READ_AHEAD_SHARDS) is used as it is.
    src.read_ahead_given = True
    assert _ahead(p, 5) == 5 and _ahead(p, 3) == 3


def test_a_slow_manifest_read_only_lengthens_the_read_ahead_and_the_cap_holds():
    link = Link(Clock())
    link.request(2.0)                         # the first request also set up the connection: far slower
    link.download(1_000_000, 0.02)            # 1 MB in 20 ms
    assert link.delay() == pytest.approx(0.0196)   # kept under the quickest download
    assert link.read_ahead(1_000_000, 2, 8) == 8
    assert Link().read_ahead(1_000_000, 2, 8) == 2 and Link().read_ahead(1_000_000, 2, 1) == 1   # nothing measured; a cap of 1
