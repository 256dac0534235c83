"""`pack()`: read a COCO/YOLO dataset, check every image and box in parallel, write a store."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import os
import shutil
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

from tqdm import tqdm

from .. import __version__
from ..procs import usable_cores, worker_context
from ..store import format as fmt
from ..store.publish import publish, temp_dir_for
from . import segment
from .check import DEFAULT_MAX_PIXELS
from .layout import check_labelled, open_source
from .process import EXIF_MODES, STORE_MODES, PayloadConfig, raw_annotation_verdict
from .report import PackReport
from .source import PackError
from .writer import DiskSpace, pack_lock

log = logging.getLogger(__name__)


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
    max_pixels: int = DEFAULT_MAX_PIXELS   # larger images are refused from their header (image_too_large)
    exif: str = "apply"                # 'apply' the EXIF orientation (boxes in the upright frame) or 'ignore' it
    overwrite: bool = False
    progress: bool = True
    allow_background_only: bool = False   # pack a set in which (almost) no image has a label (layout.check_labelled)
    names: list[str] | None = None     # YOLO: the class names (data.yaml's) instead of those found beside the source

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
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be >= 1, got {self.max_pixels}")
        if self.exif not in EXIF_MODES:
            raise ValueError(f"exif must be one of {', '.join(EXIF_MODES)}, got {self.exif!r}")
        if self.on_error not in ("skip", "fail"):
            raise ValueError(f"on_error must be 'skip' or 'fail', got {self.on_error!r}")


@dataclass
class PackResult:
    out: Path
    manifest: fmt.Manifest
    report: PackReport
    seconds: float = 0.0
    source_desc: str = ""
    rejects: Path | None = None     # OUT/rejects.jsonl


def _check_out(cfg: PackConfig) -> bool:
    """Whether OUT is to be replaced; raises when it may not be (called under the pack lock)."""
    out = cfg.out
    if not out.exists():
        return False
    if out.is_dir() and os.listdir(out) == [fmt.REJECTS]:
        return True  # what a pack that rejected every image leaves: replaced without --force
    if not cfg.overwrite:
        raise PackError(f"{out} already exists; pass --force to replace it (it is replaced only once the new store is complete)")
    if out.is_dir() and not (out / fmt.MANIFEST).is_file() and any(out.iterdir()):
        raise PackError(f"refusing to replace {out}: it is a non-empty folder that is not a fastfeed store")
    if not out.is_dir():
        raise PackError(f"refusing to replace {out}: it is a file, not a fastfeed store")
    return True


def _run_segments(jobs: list[segment.SegmentJob], workers: int, progress: bool, total: int):
    """Run every job; yield results in segment order. Stops early on a --on-error fail result."""
    with tqdm(total=total, unit="img", desc="pack", disable=not progress) as bar:
        with worker_context() as ctx:
            counter, abort = ctx.Value("q", 0), ctx.Event()
            pool = ctx.Pool(workers, segment.init, (counter, abort)) if workers > 1 else None
        if pool is None:
            segment.init(counter, abort)
            for job in jobs:
                res = segment.run(job)
                bar.update(counter.value - bar.n)
                yield res
            return
        with pool:
            pending = pool.imap(segment.run, jobs)
            for _ in jobs:
                while True:
                    try:
                        res = pending.next(timeout=0.25)
                        break
                    except mp.TimeoutError:
                        bar.update(counter.value - bar.n)
                bar.update(counter.value - bar.n)
                if res.failed is not None:
                    abort.set()   # other workers stop at their next image
                yield res


def pack(cfg: PackConfig) -> PackResult:
    """Pack `cfg.src` into `cfg.out`. Raises PackError (with `.report` when packing started, and
    `.rejects`, the file listing every rejection, when it was written)."""
    t0 = time.perf_counter()
    if not cfg.out.parent.is_dir():
        raise PackError(f"cannot write {cfg.out}: its parent folder {cfg.out.parent} does not exist")
    with pack_lock(cfg.out):  # before any work: a second pack into OUT stops here
        replace = _check_out(cfg)
        source = open_source(cfg.src, cfg.format, cfg.split, cfg.ann, cfg.images, cfg.names)
        report = PackReport()
        report.extend(source.problems)
        if not source.items and not report.errors:
            raise PackError(f"no images found: {source.describe()}")
        if not cfg.allow_background_only:
            try:
                check_labelled(source)
            except PackError as e:
                raise PackError(str(e), report) from None
        if cfg.on_error == "fail" and report.errors:
            raise PackError(f"--on-error fail: {report.errors[0].describe()}")
        log.info("packing %s", source.describe())
        tmp = temp_dir_for(cfg.out)
        shutil.rmtree(tmp, ignore_errors=True)
        space = DiskSpace.at(cfg.out.parent)
        try:
            tmp.mkdir()
            manifest = _pack_into(tmp, cfg, source, report) if source.items else None
            report.write_rejects(tmp / fmt.REJECTS)
            if manifest is None:
                _keep_rejects(tmp, cfg.out, report, len(source.items))
            fmt.write_manifest(tmp / fmt.MANIFEST, manifest)  # last: a store without it is not a store
            publish(tmp, cfg.out, replace)
        except BaseException as e:
            full = space.full_error(e, tmp, cfg.out, replace, segment.estimated_bytes(source.items, cfg))
            shutil.rmtree(tmp, ignore_errors=True)
            if full is not None:
                raise PackError(full, report) from e
            raise
    return PackResult(cfg.out, manifest, report, time.perf_counter() - t0, source.describe(), cfg.out / fmt.REJECTS)


def _pack_into(tmp: Path, cfg: PackConfig, source, report: PackReport) -> fmt.Manifest | None:
    """Write the shards into `tmp`; returns the manifest, or None when every image was rejected."""
    workers = cfg.workers if cfg.workers is not None else usable_cores()
    payload = PayloadConfig(cfg.store, cfg.max_side, cfg.quality, cfg.check, cfg.max_pixels, cfg.exif)
    nc = len(source.class_names) or None
    jobs = [segment.SegmentJob(k, items, payload, nc, tmp, cfg.on_error == "fail")
            for k, items in enumerate(segment.plan(source.items, cfg, workers))]
    stats, shards = segment.SegmentStats(), []
    for res in _run_segments(jobs, workers, cfg.progress, len(source.items)):
        report.extend(res.problems)
        if res.failed is not None:
            raise PackError(f"--on-error fail: {res.failed.describe()}", report)
        stats.merge(res.stats)
        if res.shard is not None:
            shards.append(res.shard)
    if (verdict := raw_annotation_verdict(stats.exif_frames, source.annotation_files)) is not None:
        report.add(verdict)
    if not shards:
        return None
    start = 0
    for k, shard in enumerate(shards):  # number the shards that hold records 0, 1, 2, ...
        name = fmt.shard_file(k)
        if shard["file"] != name:
            os.rename(tmp / shard["file"], tmp / name)
        shard.update(file=name, start=start)
        start += shard["count"]
    return _manifest(cfg, source, shards, stats, report, workers)


def _keep_rejects(tmp: Path, out: Path, report: PackReport, n: int) -> NoReturn:
    """Every image was rejected: leave the list of reasons where the user looks, never in place of a store."""
    if (out / fmt.MANIFEST).is_file():  # --force over a store: the store stays as it was
        where = out.parent / f"{out.name}.{fmt.REJECTS}"
        os.replace(tmp / fmt.REJECTS, where)
        note = f"{out} is unchanged"
    else:
        publish(tmp, out, overwrite=True)  # OUT is new, or holds only an earlier failed pack's list
        where, note = out / fmt.REJECTS, f"{out} holds only that file: it is not a store"
    what = f"all {n} images were rejected" if n else "no image could be listed"
    raise PackError(f"nothing usable was packed: {what}; the reasons are listed in {where} ({note})", report, where)


def _manifest(cfg: PackConfig, source, shards: list[dict], stats, report: PackReport, workers: int) -> fmt.Manifest:
    names, cat_ids = source.class_names, source.category_ids
    if not names:  # YOLO without data.yaml: classes are whatever ids the labels use
        nc = max(stats.class_boxes, default=-1) + 1
        names, cat_ids = [str(i) for i in range(nc)], list(range(nc))
    source_hash = hashlib.sha256()
    for name, crc in stats.sources:
        source_hash.update(f"{name}\0{crc}\n".encode())
    for ann in source.annotation_files:
        source_hash.update(hashlib.sha256(ann.read_bytes()).digest())
    content = f"{fmt.FORMAT_VERSION}:{cfg.store}:{cfg.max_side}:{cfg.quality}:{names}".encode() + bytes(stats.record_crcs)
    return fmt.Manifest(
        num_images=sum(s["count"] for s in shards), num_boxes=stats.num_boxes, num_crowd=stats.num_crowd,
        classes=names, category_ids=cat_ids,
        payload={"store": cfg.store, "max_side": cfg.max_side, "quality": cfg.quality if cfg.store == "jpeg" else None},
        shards=[fmt.ShardInfo(**s) for s in shards],
        fingerprint=hashlib.sha256(content).hexdigest()[:32],
        source={"format": source.format, "root": str(source.root.resolve()), "split": source.split,
                "annotations": [str(a.resolve()) for a in source.annotation_files],
                "images_seen": len(source.items), "fingerprint": source_hash.hexdigest()[:32]},
        pack_options={k: v for k, v in asdict(cfg).items()
                      if k in ("shards", "shard_mb", "on_error", "format", "split", "check", "max_pixels", "exif")}
                     | {"workers": workers},
        stats={"class_boxes": [stats.class_boxes.get(c, 0) for c in range(len(names))],
               "sizes": dict(stats.sizes.most_common()), "record_bytes": stats.record_bytes,
               "oriented": stats.oriented},
        report=report.to_dict(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), fastfeed_version=__version__)
