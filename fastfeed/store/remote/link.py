"""`Link`: what this process's downloads say about the link to the bucket, and the shard read-ahead it needs.

A download of a shard of S bytes takes d + S/b: the delay before its first byte (d) and its transfer at the
throughput one download gets (b). To keep the link busy, downloads must overlap: while one transfers, the next ones
are waiting out their delay; that takes 1 + d*b/S shards in flight (the bandwidth-delay product in shards, plus the
one transferring). With large shards that is one or two; with small shards far from the bucket it is many: 19
shards of 0.46 MB at 50 ms and 100 MB/s want 12. The read-ahead never exceeds what the cache leaves it (the cap the
window was sized with), and never falls below the floor (2) before anything is measured.

d is measured on small requests (the manifest's read; its first request may also set up the connection, which
only makes the read-ahead longer), and kept under 98% of the quickest download (a download is its delay and then its
transfer); b from each download as S / (seconds - d). Both keep the last WINDOW samples (medians: one slow request does not swing the read-ahead).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

WINDOW = 16           # samples kept of each kind
_DELAY_SHARE = 0.98   # the most of a download's time taken to be its delay


class Link:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._delays: deque = deque(maxlen=WINDOW)     # seconds of small requests
        self._downloads: deque = deque(maxlen=WINDOW)  # (bytes, seconds)
        self._lock = threading.Lock()

    def __getstate__(self):   # measurements stay in the process that made them
        return {}

    def __setstate__(self, state):
        self.__init__()

    def request(self, seconds: float) -> None:
        """A small request (its transfer negligible) took `seconds`: a sample of the delay."""
        with self._lock:
            self._delays.append(max(float(seconds), 0.0))

    def download(self, nbytes: int, seconds: float) -> None:
        """A download of `nbytes` took `seconds`, first byte to last included."""
        with self._lock:
            self._downloads.append((int(nbytes), max(float(seconds), 1e-9)))

    def timed(self, nbytes: int | None = None):
        """A context manager timing one request (`nbytes` None) or one download of `nbytes`, on `clock`."""
        link = self

        class _Timer:
            def __enter__(self):
                self.t0 = link.clock()

            def __exit__(self, exc_type, *rest):
                if exc_type is None:
                    took = link.clock() - self.t0
                    link.request(took) if nbytes is None else link.download(nbytes, took)
        return _Timer()

    def delay(self) -> float | None:
        """Seconds before a download's first byte (None: nothing measured)."""
        with self._lock:
            delays, downloads = list(self._delays), list(self._downloads)
        if not delays and not downloads:
            return None
        quickest = min((s for _, s in downloads), default=math.inf) * _DELAY_SHARE
        return min(statistics.median(delays) if delays else quickest, quickest)

    def throughput(self) -> float | None:
        """Bytes a second one download transfers once its first byte arrives (None: no download measured)."""
        with self._lock:
            downloads = list(self._downloads)
        if not downloads:
            return None
        d = self.delay() or 0.0
        return statistics.median(n / max(s - d, 1e-6) for n, s in downloads)

    def read_ahead(self, shard_bytes: float, floor: int, cap: int) -> int:
        """Shards to keep downloading ahead: 1 + delay x throughput / shard size, within [floor, cap]."""
        d, b = self.delay(), self.throughput()
        if d is None or b is None or shard_bytes <= 0:
            return max(0, min(floor, cap))
        need = 1 + math.ceil(d * b / shard_bytes)
        return max(0, min(max(need, floor), cap))
