"""`ReadAhead`: the shard read-ahead, downloading in the background what a loader's order needs now and next."""

from __future__ import annotations

import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

from .pins import PinFile

log = logging.getLogger(__name__)
PARALLEL = 4   # shards downloaded at once (each in parallel ranged parts when large), or the read-ahead when more
MOST_PARALLEL = 32


class ReadAhead:
    """Pins what one order needs now and next in the node's cache and downloads the missing shards in a background
    thread of this process (up to PARALLEL shards at once, or `ahead`): the ones needed now first, alone (a read
    is waiting for them: they get the whole link), then the next ones in the order they are first read.
    How many of the next ones: the order gives at most the store's `read_ahead` (what its window left of the
    cache); of those it keeps as many ahead (`ahead`) as the link needs (`link.Link.read_ahead`: bandwidth x delay, in
    shards, at least `floor`), or all of them when the depth was asked for or the order wants every shard.
    A shard another process is already downloading is skipped (it arrives all the same); a failure here is only
    logged: the read that needs the shard downloads it itself and raises the error."""

    def __init__(self, store, floor: int = 2):
        self.store = store
        self.floor = floor
        self.ahead = floor
        self.pins = PinFile(store.cache)
        self._cv = threading.Condition()
        self._want: tuple | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._warned = False
        self._inflight: set[int] = set()
        weakref.finalize(self, self.pins.remove)

    def want(self, now: list[int], upcoming: list[int]) -> None:
        shards = self.store.shards
        upcoming = list(upcoming)[:self.ahead_for(len(upcoming))]
        self.pins.write([shards[k].file for k in (*now, *upcoming)])
        with self._cv:
            self._want = (list(now), list(upcoming))
            self._stopped = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fastfeed-read-ahead", daemon=True)
                self._thread.start()
            self._cv.notify()

    def ahead_for(self, offered: int) -> int:
        """Of `offered` shards the order says come next, how many to download now."""
        store = self.store
        if store.read_ahead_given or offered > store.read_ahead:   # asked for, or every shard (the store fits)
            self.ahead = offered
        else:
            mean = sum(s.bytes for s in store.shards) / max(len(store.shards), 1)
            self.ahead = store.link.read_ahead(mean, self.floor, offered)
        return self.ahead

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._want = None
            self._cv.notify_all()
        self.pins.remove()

    def _run(self) -> None:
        with ThreadPoolExecutor(MOST_PARALLEL, thread_name_prefix="fastfeed-read-ahead-shard") as pool:
            while True:
                with self._cv:
                    while self._want is None and not self._stopped:
                        self._cv.wait()
                    if self._stopped:
                        return
                    now, upcoming = self._want
                    self._want = None
                first = set(now)
                for k in (*now, *upcoming):
                    with self._cv:
                        if first and k not in first:   # a read waits for these: give them the link first
                            while first & self._inflight and self._want is None and not self._stopped:
                                self._cv.wait(0.5)
                            first = set()
                        if self._want is not None or self._stopped:
                            break   # the loader moved on: start over with what it needs now
                        if k in self._inflight or self.store.cache.present(self.store.shards[k]):
                            continue
                        while len(self._inflight) >= min(max(PARALLEL, self.ahead), MOST_PARALLEL) and not self._stopped:
                            self._cv.wait(0.5)
                        self._inflight.add(k)
                    pool.submit(self._fetch, k)

    def _fetch(self, k: int) -> None:
        try:
            self.store.fetch(k, wait=False)
        except Exception as e:   # noqa: BLE001 - the read that needs it raises it
            if not self._warned and not self._stopped:
                log.warning("reading ahead shards of %s: %s", self.store.path, e)
                self._warned = True
        finally:
            with self._cv:
                self._inflight.discard(k)
                self._cv.notify_all()
