"""The manifest of a finished pack: counts, classes, shards, the content fingerprint, the source, the report."""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from datetime import datetime, timezone

from .. import __version__, tasks
from ..store import format as fmt
from .report import PackReport


def build_manifest(cfg, source, shards: list[dict], stats, report: PackReport, workers: int) -> fmt.Manifest:
    names, cat_ids = source.class_names, source.category_ids
    if not names:  # YOLO without data.yaml: classes are whatever ids the labels use
        nc = max(stats.class_boxes, default=-1) + 1
        names, cat_ids = [str(i) for i in range(nc)], list(range(nc))
    source_hash = hashlib.sha256()
    for name, crc in stats.sources:
        source_hash.update(f"{name}\0{crc}\n".encode())
    for ann in source.annotation_files:
        source_hash.update(hashlib.sha256(ann.read_bytes()).digest())
    task = source.task
    keypoints = tasks.get(task.name).keypoints
    kpt_shape = list(task.kpt_shape) if keypoints else None
    flip_idx = source.flip_idx if keypoints else None
    content = (f"{fmt.FORMAT_VERSION}:{cfg.store}:{cfg.max_side}:{cfg.quality}:{names}:{task.name}:{kpt_shape}:"
               f"{flip_idx}").encode() + bytes(stats.record_crcs)
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
                      if k in ("shards", "shard_mb", "on_error", "format", "split", "check", "max_pixels", "exif",
                                   "coco_boxes", "task")}
                     | {"workers": workers},
        stats={"class_boxes": [stats.class_boxes.get(c, 0) for c in range(len(names))],
               "sizes": dict(stats.sizes.most_common()), "record_bytes": stats.record_bytes,
               "oriented": stats.oriented, "geometry": dict(stats.geometry)},
        report=report.to_dict(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), fastfeed_version=__version__,
        task=task.name, kpt_shape=kpt_shape, flip_idx=flip_idx)
