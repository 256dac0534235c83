"""`ReadAhead`: the shard read-ahead, downloading in the background what a loader's order needs now and next."""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque

from ..objstore import CONNECTIONS
from .errors import CacheReadOnly
from .pins import PinFile

log = logging.getLogger(__name__)
PARALLEL = 4        # downloads in flight at least (each shard in parallel ranged parts when large)
MOST_PARALLEL = CONNECTIONS  # ... and at most: an S3 client's connection pool (more would queue there, read as delay)
STOP_WAIT_S = 5.0   # how long stop() lets the downloads in flight finish
RATE_SHARDS = 16    # the reads' rate: over this many shards newly offered, the quickest stretch kept


class ReadAhead:
    """Calling it is `want(now, upcoming)` (it is the store's `follower()`): pins both and downloads the missing ones
    (docs/design.md, "A store in object storage": the order, the claims, `parallel()`). A shard another process is
    downloading is skipped (it arrives all the same); a failure here is only logged: the read that needs the shard
    downloads it itself and raises the error."""

    def __init__(self, store):
        self.store = store
        self.pins = PinFile(store.cache)
        self._cv = threading.Condition()
        self._want: tuple | None = None
        self._thread: threading.Thread | None = None
        self._stopped = self._warned = False
        self._inflight: set[int] = set()
        self._first: frozenset | None = None           # the first batch's shards (None: not asked for yet)
        self.ahead, self.rate = 0, 0.0                 # shards offered ahead; the reads' quickest shards a second
        self._offered: dict[int, None] = {}            # shards offered lately (insertion-ordered, bounded)
        self._new: deque = deque(maxlen=RATE_SHARDS)   # when each newly offered shard was first offered
        weakref.finalize(self, self.pins.remove)

    def want(self, now: list[int], upcoming: list[int]) -> None:
        self.ahead = len(upcoming)
        self._count_new(upcoming)
        self.pins.write([self.store.shards[k].file for k in (*now, *upcoming)])
        if self._first is None:
            self._first = frozenset(now)
        self._claim(now)
        with self._cv:
            self._want, self._stopped = (list(now), list(upcoming)), False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fastfeed-read-ahead", daemon=True)
                self._thread.start()
            self._cv.notify()

    __call__ = want

    def _claim(self, now: list[int]) -> None:
        """Start the downloads a read is about to wait for here, their locks taken before this returns: a worker
        reading them next waits for these (this process's connections are open) instead of racing them with
        downloads of its own (a new S3 client in each worker: seconds under load, the first batch's wait)."""
        cache, shards = self.store.cache, self.store.shards
        for k in now:
            with self._cv:
                try:
                    lock = None if k in self._inflight or cache.present(shards[k]) else cache.claim(
                        shards[k], self.store.shard_url(k))
                except CacheReadOnly:   # the read that needs it says so
                    return
                if lock is None:
                    continue
                self._inflight.add(k)
            threading.Thread(target=self._fetch, args=(k, lock), name="fastfeed-read-ahead-now", daemon=True).start()

    def _count_new(self, upcoming: list[int]) -> None:
        """The reads' rate: shards first offered a second, the quickest stretch of RATE_SHARDS (a stall, which slows
        the reads, never lowers the downloads that would end it); the first offer is where the reads start."""
        t, start = self.store.link.clock(), not self._offered
        for k in upcoming:
            if k not in self._offered:
                self._offered[k] = None
                if not start:
                    self._new.append(t)
        while len(self._offered) > 4 * max(len(upcoming), RATE_SHARDS):   # an epoch later they are new again
            del self._offered[next(iter(self._offered))]
        if len(self._new) == self._new.maxlen and self._new[-1] > self._new[0]:
            moved = sum(1 for x in self._new if x > self._new[0])   # those offered after the stretch began
            self.rate = max(self.rate, moved / (self._new[-1] - self._new[0]))

    def parallel(self) -> int:
        """Downloads to keep in flight: what the link's bandwidth x delay, or the reads' rate, needs."""
        mean = sum(s.bytes for s in self.store.shards) / max(len(self.store.shards), 1)
        return self.store.link.concurrency(mean, PARALLEL, MOST_PARALLEL, demand=self.rate)

    def figures(self) -> dict:
        """`Link.figures`, the downloads kept in flight, the reads' rate and the shards read ahead."""
        return self.store.link.figures() | {"parallel": self.parallel(), "reads_shards_per_s": round(self.rate, 1),
                                            "ahead_shards": self.ahead}

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """No more downloads; those in flight get `wait_s` to finish (none retrying under a fork or an exit)."""
        with self._cv:
            self._stopped, self._want = True, None
            self._cv.notify_all()
            self._cv.wait_for(lambda: not self._inflight, timeout=wait_s)
        self.pins.remove()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._want is not None or self._stopped)
                if self._stopped:
                    return
                (_, upcoming), self._want = self._want, None
                self._cv.wait_for(lambda: not self._starting() or self._want is not None or self._stopped)
            for k in upcoming:   # then within parallel(), which counts the needed-now ones want() started first
                with self._cv:
                    if self._want is not None or self._stopped:
                        break   # the loader moved on: start over with what it needs now
                    if k in self._inflight or self.store.cache.present(self.store.shards[k]):
                        continue
                    self._cv.wait_for(lambda: len(self._inflight) < self.parallel() or self._stopped)
                    if self._stopped:
                        break
                    self._inflight.add(k)
                # a daemon thread a download: the process's exit never waits out a download's retries
                threading.Thread(target=self._fetch, args=(k,), name="fastfeed-read-ahead-shard", daemon=True).start()

    def _starting(self) -> bool:
        """Whether the first batch's shards are still downloading: they get the link alone (the run waits for them)."""
        return bool(self._first and self._first & self._inflight)

    def _fetch(self, k: int, held: int | None = None) -> None:
        try:
            if held is not None and k not in self._first:   # another batch's, claimed at the start: after the first's
                with self._cv:
                    self._cv.wait_for(lambda: not self._starting() or self._stopped)
            self.store.fetch(k, wait=False, held=held)
        except Exception as e:   # noqa: BLE001 - the read that needs it raises it
            if not self._warned and not self._stopped:
                log.warning("reading ahead shards of %s: %s", self.store.path, e)
                self._warned = True
        finally:
            with self._cv:
                self._inflight.discard(k)
                if not self._starting():   # the start is over (the same shards later are just needed-now ones)
                    self._first = frozenset()
                self._cv.notify_all()
