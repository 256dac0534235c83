"""A pack part, a pack worker's unit of work: a contiguous run of images written to a shard of its own (`plan` cuts the
dataset into those parts); only small summaries cross process boundaries (docs/design.md, "Shard-relative keys")."""

from __future__ import annotations

import math
import operator
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..store import format as fmt
from ..store.record import record_crc
from .lines import Task
from .process import process_item
from .report import Problem
from .source import Item
from .writer import ShardWriter

DEFAULT_SHARD_MB = 1024
# A store written to a URL is read a shard at a time over the network: 128 MB downloads in ~1 s at 1 Gb/s (the
# first batch waits for about one), amortises per-request latency over 8 ranged parts of 16 MB, and leaves a
# cache of tens of GB hundreds of shards to mix samples from (see docs/format.md).
URL_SHARD_MB = 128
_REMOTE_BATCH = 32   # images a pack worker reads from a bucket at once
_MIN_PART = 64  # images; smaller runs are not worth a shard of their own


@dataclass
class PartStats:
    class_boxes: Counter = field(default_factory=Counter)
    sizes: Counter = field(default_factory=Counter)
    num_boxes: int = 0
    boxed_images: int = 0                                        # records that kept at least one training box
    num_crowd: int = 0
    record_bytes: int = 0
    oriented: int = 0                                            # records whose decode is turned (orientation != 1)
    exif_frames: Counter = field(default_factory=Counter)        # COCO frames of EXIF images (process.Result.exif_frame)
    record_crcs: bytearray = field(default_factory=bytearray)   # 4 bytes per record, in order
    sources: list = field(default_factory=list)                  # (name, source CRC) per image
    geometry: Counter = field(default_factory=Counter)           # the task's `counts`, summed

    def merge(self, other: PartStats) -> None:
        """Add `other`'s figures to these, field by field: Counters counted together, the rest added (numbers) or
        appended (the CRCs and sources, in part order)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, Counter):
                mine.update(theirs)   # keeps zero counts, which `+=` would drop
            else:
                setattr(self, f.name, operator.iadd(mine, theirs))   # the list and the bytearray grow in place


@dataclass
class PartResult:
    part: int
    shard: dict | None = None            # {file, count, bytes}; None when every image was rejected
    problems: list[Problem] = field(default_factory=list)
    stats: PartStats = field(default_factory=PartStats)
    failed: Problem | None = None        # --on-error fail: the first error, the part stopped there


@dataclass(frozen=True)
class PartJob:
    part: int
    items: list[Item]
    cfg: object                 # the PackConfig: how pixels are stored
    task: Task
    nc: int | None
    out_dir: Path
    fail_fast: bool
    remote: object = None       # pack.remote.RemoteFiles: the images are read from a bucket, in batches


def _estimated_bytes(item, cfg) -> int:
    if cfg.store == "raw":
        h, w = item.ann_size or (cfg.max_side or 640, cfg.max_side or 640)
        r = min(1.0, (cfg.max_side or max(h, w)) / max(h, w))
        return int(h * r) * int(w * r) * 3
    try:
        size = item.path.stat().st_size
    except OSError:
        return 0
    if cfg.store == "jpeg" and cfg.max_side and item.ann_size:
        size = int(size * min(1.0, (cfg.max_side / max(item.ann_size)) ** 2))
    return size


def estimated_bytes(items: list, cfg) -> int:
    """About what the records of `items` take on disk (see `plan`)."""
    return sum(_estimated_bytes(it, cfg) for it in items)


def plan(items: list, cfg, workers: int, url: bool = False) -> list[list]:
    """Contiguous runs of items, one shard each: `--shards N`; `--shard-mb MB`: about MB of records each, however
    few that makes; by default about DEFAULT_SHARD_MB (URL_SHARD_MB for a store written to a URL), split
    further so every worker has work (at least 4 runs per worker, of >= 64 images)."""
    n = len(items)
    if cfg.shards:
        count = min(cfg.shards, n)
    elif cfg.shard_mb:
        count = min(max(math.ceil(estimated_bytes(items, cfg) / (cfg.shard_mb * 2**20)), 1), n)
    else:
        limit = (URL_SHARD_MB if url else DEFAULT_SHARD_MB) * 2**20
        total = estimated_bytes(items, cfg)
        count = max(math.ceil(total / limit), min(4 * max(workers, 1), math.ceil(n / _MIN_PART)), 1)
    bounds = [round(k * n / count) for k in range(count + 1)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


# Set in each worker process (or in-process) by `init`: a shared progress counter and abort flag.
_PROGRESS = None
_ABORT = None


def init(progress, abort) -> None:
    global _PROGRESS, _ABORT
    _PROGRESS, _ABORT = progress, abort


def run(job: PartJob) -> PartResult:
    res = PartResult(job.part)
    writer = ShardWriter(job.out_dir / fmt.shard_file(job.part))
    st = res.stats
    try:
        fetched: dict = {}
        for k, item in enumerate(job.items):
            if _ABORT is not None and _ABORT.is_set():
                break
            if job.remote is not None and k % _REMOTE_BATCH == 0:   # the next images' bytes, many requests at once
                fetched = job.remote.read(job.items[k:k + _REMOTE_BATCH])
            r = process_item(item, job.cfg, job.task, job.nc, fetched.pop(item.name, None))
            res.problems += r.problems
            st.sources.append((r.name, r.source_crc))
            if r.exif_frame is not None and (r.exif_frame != "either" or r.record is not None):
                st.exif_frames[r.exif_frame] += 1
            if job.fail_fast and any(p.is_error for p in r.problems):
                res.failed = next(p for p in r.problems if p.is_error)
                break
            if r.record is not None:
                writer.append(r.record)
                st.class_boxes.update(r.classes.tolist())
                st.sizes[f"{r.orig_size[1]}x{r.orig_size[0]}"] += 1
                st.num_boxes += len(r.classes)
                st.boxed_images += len(r.classes) > 0
                st.num_crowd += r.n_crowd
                st.record_bytes += len(r.record)
                st.oriented += r.orientation != 1
                st.record_crcs += record_crc(r.record)
                st.geometry.update(r.geometry)
            if _PROGRESS is not None:
                with _PROGRESS.get_lock():
                    _PROGRESS.value += 1
        res.shard = writer.close()
    except BaseException:
        writer.abort()
        raise
    return res
