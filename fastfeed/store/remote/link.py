"""`Link`: what this process's downloads say about the link to the bucket (delay, bandwidth, downloads in flight), and
from it how many downloads to keep in flight and how large a ranged part of a shard is worth (docs/design.md, "A
store in object storage"). The delay comes from small requests (the manifest's read) and is kept under 98% of the
quickest download; the bandwidth is every download's bytes over the time any was in flight; one download's
throughput is S / (seconds - delay). Delays and downloads keep the last WINDOW samples (medians); bytes, count and
busy time add up over the process's life (the figures shown are the run's)."""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable

from .. import objstore
from .sizes import gib

WINDOW = 16           # samples kept of each kind
_DELAY_SHARE = 0.98   # the most of a download's time taken to be its delay
DEMAND_MARGIN = 2.0   # downloads in flight for the reads' rate: twice what the mean download time needs (jitter)
PART_MIN = 8 << 20    # a ranged part carries at least this much (or the default part, when smaller)
WARM = 8              # connections to an S3 bucket a store opens while it reads its manifest (`warming`)
WARM_WAIT_S = 1.0     # ... and waits for at most this long after the manifest's read


class Link:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._delays: deque = deque(maxlen=WINDOW)     # seconds of small requests
        self._downloads: deque = deque(maxlen=WINDOW)  # (bytes, seconds)
        self._lock = threading.Lock()
        self.in_flight = self.most_in_flight = self.bytes = self.count = 0
        self._busy = self._busy_since = 0.0            # seconds with a download in flight (ended spells); since

    def __reduce__(self):   # measurements stay in the process that made them: a copy starts afresh
        return Link, ()

    @contextlib.contextmanager
    def timed(self, nbytes: int | None = None):
        """Time one small request (`nbytes` None: a sample of the delay) or one download of `nbytes` (counted in
        flight meanwhile; a failed one adds nothing), on `clock`."""
        with self._lock:
            if nbytes is not None:
                self._busy_since = self.clock() if self.in_flight == 0 else self._busy_since
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
        t0, ok = self.clock(), False
        try:
            yield
            ok = True
        finally:
            took = self.clock() - t0
            with self._lock:
                if nbytes is None:
                    if ok:
                        self._delays.append(max(took, 0.0))
                else:
                    self.in_flight -= 1
                    self._busy += self.clock() - self._busy_since if self.in_flight == 0 else 0.0
                    if ok:
                        self._downloads.append((int(nbytes), max(took, 1e-9)))
                        self.bytes, self.count = self.bytes + int(nbytes), self.count + 1

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
        d = self.delay() or 0.0
        return statistics.median(n / max(s - d, 1e-6) for n, s in downloads) if downloads else None

    def bandwidth(self) -> float | None:
        """Bytes a second the link gave this process's downloads together, over the time any was in flight."""
        with self._lock:
            busy = self._busy + (self.clock() - self._busy_since if self.in_flight else 0.0)
            return self.bytes / busy if self.bytes and busy > 0 else None

    def concurrency(self, shard_bytes: float, floor: int, cap: int, demand: float = 0.0) -> int:
        """Downloads to keep in flight, within [floor, cap]: 1 + delay x bandwidth / shard size (what fills the
        link), or, when more, what delivers `demand` shards a second (the rate the reads move to new shards) with
        DEMAND_MARGIN to spare: demand x a download's time (delay + size / one download's throughput)."""
        d, one = self.delay(), self.throughput()
        b = max(self.bandwidth() or 0.0, one or 0.0)
        if d is None or not b or shard_bytes <= 0:
            return max(0, min(floor, cap))
        need = 1 + math.ceil(d * b / shard_bytes)
        if demand > 0 and one:
            need = max(need, math.ceil(DEMAND_MARGIN * demand * (d + shard_bytes / one)))
        return max(0, min(max(need, floor), cap))

    def part_bytes(self, default: int) -> int:
        """Bytes of one ranged part of a large shard: what one request transfers in twice its delay (the delay at
        most a third of its time), at least PART_MIN (or `default`, when smaller); `default` before anything is
        measured. Far from the bucket a part carries more, near it less."""
        d, b = self.delay(), self.throughput()
        return default if d is None or b is None else max(min(PART_MIN, default), int(2 * d * b))

    def figures(self) -> dict:
        """What the link did so far: delay ms, bandwidth MB/s in all and per download, downloads in flight."""
        def r(v, scale):
            return None if v is None else round(v * scale, 1)
        return {"delay_ms": r(self.delay(), 1e3), "bandwidth_mb_s": r(self.bandwidth(), 1e-6),
                "per_download_mb_s": r(self.throughput(), 1e-6), "in_flight": self.in_flight,
                "most_in_flight": self.most_in_flight, "downloads": self.count, "downloaded_bytes": self.bytes}


def link_words(f: dict) -> str:
    """`Link.figures` (with the read-ahead's `parallel`) in words: what `fastfeed bench` and the trainer's feed line
    say about a URL store's link."""
    if not f.get("downloads"):
        return "nothing downloaded yet"

    num = lambda v, unit: "-" if v is None else f"{v:g} {unit}"  # noqa: E731
    kept = f" (kept up to {f['parallel']})" if "parallel" in f else ""
    return (f"{num(f.get('bandwidth_mb_s'), 'MB/s')} ({num(f.get('per_download_mb_s'), 'MB/s')} a download), "
            f"{num(f.get('delay_ms'), 'ms')} to a request's first byte, {f.get('in_flight', 0)} downloads in flight"
            f"{kept}, at most {f.get('most_in_flight', 0)} at once; {f['downloads']} downloads, {gib(f['downloaded_bytes'])}")


@contextlib.contextmanager
def warming(fs, url: str, path: str):
    """While the body runs (a store's first request), open WARM - 1 more connections to the bucket (a HEAD of `path`
    each, as quick as the body's own request) and wait for them at most WARM_WAIT_S more: the requests that follow
    (a first batch's downloads, started together) find them open in the client's pool instead of each paying a new
    connection's handshake (TCP and TLS: one to three round trips). The pool keeps idle ones 12 s (aiobotocore's
    keep-alive). S3 only, its client made first so that all share it; a HEAD that fails is left to the requests
    that follow."""
    ready = objstore.extra_of(url) == "s3" and WARM > 1 and hasattr(fs, "connect")
    if ready:
        try:
            fs.connect()   # s3fs's client, made once, before the threads share it
        except Exception:   # noqa: BLE001 - the body's request meets it and says what to do
            ready = False
    if not ready:
        yield
        return

    def head():
        with contextlib.suppress(Exception):
            fs.info(path)

    threads = [threading.Thread(target=head, name="fastfeed-warm", daemon=True) for _ in range(WARM - 1)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        end = time.monotonic() + WARM_WAIT_S
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
