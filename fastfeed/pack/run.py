"""`pack()`: read a COCO/YOLO dataset, check every image and box in parallel, write a store."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

from tqdm import tqdm

from .. import __version__
from ..procs import worker_context
from ..store import format as fmt
from .layout import open_source
from .process import STORE_MODES, PayloadConfig, process_item
from .report import PackReport
from .source import PackError
from .writer import ShardWriter, publish, temp_dir_for

log = logging.getLogger(__name__)
DEFAULT_SHARD_MB = 1024


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class PackConfig:
    """Everything `fastfeed pack` accepts; validated on creation."""

    src: Path | None
    out: Path
    format: str | None = None          # 'coco' | 'yolo' | None (detect)
    split: str | None = None
    ann: Path | None = None
    images: Path | None = None
    store: str = "original"
    max_side: int | None = None
    quality: int = 90
    shards: int | None = None
    shard_mb: float | None = None
    workers: int | None = None
    on_error: str = "skip"
    check: str = "entropy"             # how original-mode JPEGs are proven decodable (see codec)
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self):
        self.out = Path(self.out)
        if self.format not in (None, "coco", "yolo"):
            raise ValueError(f"format must be 'coco' or 'yolo' (or None to detect), got {self.format!r}")
        if self.store not in STORE_MODES:
            raise ValueError(f"store must be one of {', '.join(STORE_MODES)}, got {self.store!r}")
        if self.max_side is not None and (self.store == "original" or self.max_side < 8):
            raise ValueError("max_side applies to store 'jpeg' or 'raw' and must be >= 8 "
                             f"(got store={self.store!r}, max_side={self.max_side})")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be 1..100, got {self.quality}")
        if self.shards is not None and self.shard_mb is not None:
            raise ValueError("give shards or shard_mb, not both")
        if self.shards is not None and self.shards < 1:
            raise ValueError(f"shards must be >= 1, got {self.shards}")
        if self.shard_mb is not None and not self.shard_mb > 0:
            raise ValueError(f"shard_mb must be > 0, got {self.shard_mb}")
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 or 1: pack in this process), got {self.workers}")
        if self.check not in ("entropy", "full"):
            raise ValueError(f"check must be 'entropy' or 'full', got {self.check!r}")
        if self.on_error not in ("skip", "fail"):
            raise ValueError(f"on_error must be 'skip' or 'fail', got {self.on_error!r}")


@dataclass
class PackResult:
    out: Path
    manifest: dict
    report: PackReport
    seconds: float = 0.0
    source_desc: str = ""
    extra: dict = field(default_factory=dict)


class _Stats:
    """Running totals for the manifest, and both fingerprints."""

    def __init__(self):
        self.class_boxes: Counter[int] = Counter()
        self.sizes: Counter[str] = Counter()
        self.num_boxes = self.num_crowd = self.payload_bytes = 0
        self.store_hash, self.source_hash = hashlib.sha256(), hashlib.sha256()

    def add(self, res, record: bytes) -> None:
        self.class_boxes.update(res.classes.tolist())
        self.sizes[f"{res.orig_size[1]}x{res.orig_size[0]}"] += 1
        self.num_boxes += len(res.classes)
        self.num_crowd += res.n_crowd
        self.payload_bytes += len(record)
        self.store_hash.update(record[4:8])  # the record's CRC32 covers all its content

    def to_dict(self, nc: int) -> dict:
        return {"class_boxes": [self.class_boxes.get(c, 0) for c in range(nc)],
                "sizes": dict(self.sizes.most_common()), "record_bytes": self.payload_bytes}


def _complete(res) -> bytes:
    """The whole record: append the payload a worker left in its source file, and prove it unchanged."""
    if res.payload_file is None:
        return res.record
    record = res.record + res.payload_file.read_bytes()
    if not fmt.check_crc(record):
        raise PackError(f"{res.name} changed while it was being packed; pack again once the source is stable")
    return record


def _check_out(cfg: PackConfig) -> None:
    out = cfg.out
    if not out.exists():
        if not out.parent.is_dir():
            raise PackError(f"cannot write {out}: its parent folder {out.parent} does not exist")
        return
    if not cfg.overwrite:
        raise PackError(f"{out} already exists; pass --force to replace it (it is replaced only once the new store is complete)")
    if out.is_dir() and not (out / fmt.MANIFEST).is_file() and any(out.iterdir()):
        raise PackError(f"refusing to replace {out}: it is a non-empty folder that is not a fastfeed store")
    if not out.is_dir():
        raise PackError(f"refusing to replace {out}: it is a file, not a fastfeed store")


_FORKED: tuple = ()  # (work, items), inherited by forked workers instead of pickled per task


def _run_forked(index: int):
    work, items = _FORKED
    return work(items[index])


def _results(source, cfg: PackConfig, workers: int):
    global _FORKED
    nc = len(source.class_names) or None
    work = partial(process_item, cfg=PayloadConfig(cfg.store, cfg.max_side, cfg.quality, cfg.check), nc=nc)
    if workers <= 1:
        yield from map(work, source.items)
        return
    chunk = max(1, min(16, len(source.items) // (workers * 8)))
    with worker_context() as ctx:
        forked = ctx.get_start_method() == "fork"
        _FORKED = (work, source.items) if forked else ()
        pool = ctx.Pool(workers)
    with pool:
        try:
            if forked:
                yield from pool.imap(_run_forked, range(len(source.items)), chunksize=chunk)
            else:
                yield from pool.imap(work, source.items, chunksize=chunk)
        finally:
            _FORKED = ()


def pack(cfg: PackConfig) -> PackResult:
    """Pack `cfg.src` into `cfg.out`. Raises PackError (with `.report` when packing started)."""
    t0 = time.perf_counter()
    source = open_source(cfg.src, cfg.format, cfg.split, cfg.ann, cfg.images)
    _check_out(cfg)
    if not source.items:
        raise PackError(f"no images found: {source.describe()}")
    log.info("packing %s", source.describe())
    report = PackReport()
    report.extend(source.problems)
    if cfg.on_error == "fail" and report.errors:
        raise PackError(f"--on-error fail: {report.errors[0].describe()}")
    workers = cfg.workers if cfg.workers is not None else default_workers()
    per_shard = math.ceil(len(source.items) / cfg.shards) if cfg.shards else None
    shard_bytes = None if per_shard else int((cfg.shard_mb or DEFAULT_SHARD_MB) * 2**20)

    tmp = temp_dir_for(cfg.out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        writer, stats = ShardWriter(tmp, per_shard, shard_bytes), _Stats()
        with tqdm(total=len(source.items), unit="img", desc="pack", disable=not cfg.progress) as bar:
            for res in _results(source, cfg, workers):
                report.extend(res.problems)
                if cfg.on_error == "fail" and any(p.is_error for p in res.problems):
                    first = next(p for p in res.problems if p.is_error)
                    raise PackError(f"--on-error fail: {first.describe()}", report)
                if res.record is not None:
                    record = _complete(res)
                    writer.append(record)
                    stats.add(res, record)
                stats.source_hash.update(f"{res.name}\0{res.source_crc}\n".encode())
                bar.update()
        shards = writer.close()
        if writer.count == 0:
            raise PackError(f"nothing usable was packed: all {len(source.items)} images were rejected", report)
        for ann in source.annotation_files:
            stats.source_hash.update(hashlib.sha256(ann.read_bytes()).digest())
        names, cat_ids = source.class_names, source.category_ids
        if not names:  # YOLO without data.yaml: classes are whatever ids the labels use
            nc = max(stats.class_boxes, default=-1) + 1
            names, cat_ids = [str(i) for i in range(nc)], list(range(nc))
        manifest = {
            "format": fmt.FORMAT_NAME, "format_version": fmt.FORMAT_VERSION, "fastfeed_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "num_images": writer.count, "num_boxes": stats.num_boxes, "num_crowd": stats.num_crowd,
            "classes": names, "category_ids": cat_ids,
            "payload": {"store": cfg.store, "max_side": cfg.max_side,
                        "quality": cfg.quality if cfg.store == "jpeg" else None},
            "shards": shards,
            "fingerprint": hashlib.sha256(f"{fmt.FORMAT_VERSION}:{cfg.store}:{cfg.max_side}:{cfg.quality}:{names}".encode()
                                          + stats.store_hash.digest()).hexdigest()[:32],
            "source": {"format": source.format, "root": str(source.root.resolve()), "split": source.split,
                       "annotations": [str(a.resolve()) for a in source.annotation_files],
                       "images_seen": len(source.items), "fingerprint": stats.source_hash.hexdigest()[:32]},
            "pack_options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()
                             if k in ("shards", "shard_mb", "on_error", "format", "split", "check")} | {"workers": workers},
            "stats": stats.to_dict(len(names)),
            "report": report.to_dict(),
        }
        report.write_rejects(tmp / fmt.REJECTS)
        fmt.write_manifest(tmp / fmt.MANIFEST, manifest)  # last: a store without it is not a store
        publish(tmp, cfg.out, cfg.overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PackResult(cfg.out, manifest, report, time.perf_counter() - t0, source.describe())
