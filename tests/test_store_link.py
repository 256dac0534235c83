"""The link to the bucket (store/remote/link.py), measured as it runs: delay, bandwidth, downloads in flight; the
downloads kept in flight (bandwidth x delay in shards) and the ranged parts of a large shard sized from them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest

from fastfeed.store.remote.link import PART_MIN, Link, link_words
from fastfeed.store.remote.read_ahead import MOST_PARALLEL, PARALLEL, RATE_SHARDS, ReadAhead


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
    on a fake clock (no sleeping)."""

    def __init__(self, shards: int, size: int, delay: float, bandwidth: float):
        self.shards = [Info(f"shard-{k:03d}.mdb", size) for k in range(shards)]
        self.clock = Clock()
        self.link = Link(self.clock)
        self.delay, self.bandwidth = delay, bandwidth
        with self.link.timed():          # the manifest: a small request
            self.clock.t += delay

    def download(self, k: int) -> None:
        with self.link.timed(self.shards[k].bytes):
            self.clock.t += self.delay + self.shards[k].bytes / self.bandwidth


def took(link: Link, seconds: float, nbytes: int | None = None) -> None:
    """A request (or a download of `nbytes`) that took `seconds` on the link's fake clock."""
    with link.timed(nbytes):
        link.clock.t += seconds


def read_ahead_of(src) -> ReadAhead:
    p = ReadAhead.__new__(ReadAhead)   # the sizing alone: no pin files, no thread
    p.store, p.ahead, p.rate, p._offered, p._new = src, 0, 0.0, {}, deque(maxlen=RATE_SHARDS)
    return p


def test_downloads_in_flight_cover_bandwidth_times_delay():
    # 0.46 MB shards, 50 ms to the first byte, 100 MB/s: 1 + 0.05 x 100e6 / 0.46e6 = 12 downloads in flight keep the
    # link busy; before anything is downloaded, PARALLEL.
    size, delay, bw = 460_000, 0.05, 100e6
    src = SlowProvider(19, size, delay, bw)
    p = read_ahead_of(src)
    assert p.parallel() == PARALLEL
    src.download(0)
    assert src.link.delay() == pytest.approx(delay) and src.link.throughput() == pytest.approx(bw)
    assert src.link.concurrency(size, PARALLEL, 64) == 12
    assert p.parallel() == min(12, MOST_PARALLEL)                   # within an S3 client's connection pool
    # Near the bucket (1 ms) the same shards need no more than the floor; far from it, never more than the most.
    near = SlowProvider(19, size, 0.001, bw)
    for k in range(4):
        near.download(k)
    assert read_ahead_of(near).parallel() == PARALLEL
    far = SlowProvider(19, size, 0.5, bw)
    far.download(0)
    assert read_ahead_of(far).parallel() == MOST_PARALLEL


def test_the_reads_rate_asks_for_more_downloads_than_one_at_a_time_gets_and_a_stall_never_lowers_it():
    # The proxy gives one download 10 MB/s (0.46 MB shards: 46 ms of transfer) after 50 ms; alone that is
    # 1 + 0.05 x 10e6 / 0.46e6 = 3 in flight, the floor. A loader moving on to 40 new shards a second needs
    # 2 x 40 x (0.05 + 0.046) = 8 in flight.
    src = SlowProvider(400, 460_000, 0.05, 10e6)
    src.download(0)
    p = read_ahead_of(src)
    assert p.parallel() == PARALLEL
    for k in range(0, 40, 2):                    # every batch offers the next 8 shards, 2 of them new
        p._count_new(list(range(k, k + 8)))
        src.clock.t += 2 / 40
    assert p.rate == pytest.approx(40, rel=0.01) and p.parallel() == 8
    for k in range(40, 80, 2):                   # a stall: the reads slow to a tenth
        p._count_new(list(range(k, k + 8)))
        src.clock.t += 20 / 40
    assert p.rate == pytest.approx(40, rel=0.01) and p.parallel() == 8
    assert p.figures()["reads_shards_per_s"] == pytest.approx(40, rel=0.01)


def test_bandwidth_counts_the_downloads_together_and_the_figures_say_what_ran():
    clock = Clock()
    link = Link(clock)
    took(link, 0.05)
    timers = [link.timed(1_000_000) for _ in range(4)]   # four 1 MB downloads at once, all done in 0.1 s
    for t in timers:
        t.__enter__()
    assert link.in_flight == 4 and link.figures()["in_flight"] == 4
    clock.t += 0.1
    for t in timers:
        t.__exit__(None, None, None)
    clock.t += 5.0                                        # idle time is not the link's
    assert link.bandwidth() == pytest.approx(40e6)         # 4 MB over the 0.1 s anything was in flight
    assert link.throughput() == pytest.approx(20e6)        # one download: 1 MB in 0.1 s less the 50 ms delay
    failed = link.timed(1_000_000)
    failed.__enter__()
    with pytest.raises(ConnectionError):
        with link.timed(5):
            raise ConnectionError("reset")
    assert link.in_flight == 1
    failed.__exit__(ConnectionError, ConnectionError("reset"), None)   # failures leave the flight, add nothing
    assert link.figures() == {"delay_ms": 50.0, "bandwidth_mb_s": 40.0, "per_download_mb_s": 20.0, "in_flight": 0,
                              "most_in_flight": 4, "downloads": 4, "downloaded_bytes": 4_000_000}
    f = link.figures()
    words = link_words(f | {"parallel": 6})
    assert "50 ms to a request's first byte" in words and "kept up to 6" in words and "at most 4 at once" in words
    assert link_words(Link().figures()) == "nothing downloaded yet"


def test_a_slow_manifest_read_only_raises_the_count_and_the_cap_holds():
    link = Link(Clock())
    took(link, 2.0)                           # the first request also set up the connection: far slower
    took(link, 0.02, 1_000_000)               # 1 MB in 20 ms
    assert link.delay() == pytest.approx(0.0196)   # kept under the quickest download
    assert link.concurrency(1_000_000, 2, 8) == 8
    assert Link().concurrency(1_000_000, 2, 8) == 2 and Link().concurrency(1_000_000, 2, 1) == 1   # nothing measured


def test_a_ranged_part_carries_twice_the_delay_of_transfer():
    assert Link().part_bytes(16 << 20) == 16 << 20                 # nothing measured: the default
    far = SlowProvider(2, 128 << 20, 0.1, 100e6)
    far.download(0)
    assert far.link.part_bytes(16 << 20) == pytest.approx(2 * 0.1 * 100e6, rel=1e-3)   # 20 MB parts
    near = SlowProvider(2, 128 << 20, 0.001, 100e6)
    near.download(0)
    assert near.link.part_bytes(16 << 20) == PART_MIN                # a 0.2 MB part is not worth a request
    assert near.link.part_bytes(1 << 20) == 1 << 20                  # unless the default part is smaller still
