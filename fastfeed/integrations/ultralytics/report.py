"""What FastfeedTrainer says about the feed, the reason to use it: per epoch the images fed, images/s and the share of
the epoch it waited for data (a line after Ultralytics' progress bar, a row of `fastfeed.csv` beside results.csv),
and the shm cache's size and build time. "Waited": from the trainer asking for a batch to having it (loader,
collation, the previous batch's device copy) against the epoch's training time; near 0 is healthy (the model limits).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from ...cache.budget import gib
from ...store.remote.link import link_words

FEED_CSV = "fastfeed.csv"
COLUMNS = ("epoch", "loader", "images", "seconds", "images_per_s", "data_wait_s", "data_wait_frac")


@dataclass
class FeedClock:
    """One epoch of the feed: images handed out, seconds waited for them, and the epoch's span so far."""

    start: float
    last: float
    images: int = 0
    waited: float = 0.0

    @classmethod
    def started(cls) -> FeedClock:
        now = perf_counter()
        return cls(now, now)

    def batch(self, waited: float, images: int) -> None:
        self.waited += waited
        self.images += images
        self.last = perf_counter()

    def resumed(self) -> float:
        """The trainer asks for the next batch (or is done with the last): now."""
        self.last = perf_counter()
        return self.last

    def row(self, epoch: int, loader: str) -> dict:
        seconds = max(self.last - self.start, 1e-9)
        return {"epoch": epoch, "loader": loader, "images": self.images, "seconds": round(seconds, 3),
                "images_per_s": round(self.images / seconds, 2), "data_wait_s": round(self.waited, 3),
                "data_wait_frac": round(min(self.waited / seconds, 1.0), 4)}


def epoch_line(row: dict, epochs: int, link: dict | None = None) -> str:
    """The epoch's feed line; `link`: a URL store's link figures (`ReadAhead.figures`), said after it."""
    verdict = ("the feed keeps up" if row["data_wait_frac"] < 0.05 else
               "the training step waited for the loader: more workers, or cache=True (the shm loader)"
               if row["data_wait_frac"] >= 0.2 else "")
    return (f"fastfeed: epoch {row['epoch']}/{epochs}: the {row['loader']} loader fed {row['images']} images, "
            f"{row['images_per_s']:.1f} images/s; data wait {row['data_wait_frac']:.1%} of the epoch "
            f"({row['data_wait_s']:.2f} of {row['seconds']:.2f} s)" + (f": {verdict}" if verdict else "")
            + (f"; the store's link: {link_words(link)}" if link else ""))


def append_row(path: Path, row: dict) -> None:
    new = not path.exists()
    with open(path, "a", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        w.writerow(row)


def shm_cache_line(loader, seconds: float) -> str | None:
    """The shm cache a loader reads (None for a loader without one): its size, and the time it took to build
    it here, or that it was already built (by an earlier run, another rank or a `fastfeed cache build`)."""
    lease = getattr(loader, "lease", None)
    if lease is None:
        return None
    h = lease.header
    how = f"built in {seconds:.1f} s" if lease.built else "already built, mapped"
    part = f" (a partial shm cache: {h.n_cached} of {h.n_records} images)" if h.n_cached < h.n_records else ""
    return (f"fastfeed: shm cache {lease.path}: {gib(lease.size)}, {h.n_records} images at imgsz "
            f"{h.imgsz}, {how}{part}")
