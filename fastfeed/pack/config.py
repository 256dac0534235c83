"""`PackConfig`: everything `fastfeed pack` (and `fastfeed.pack.pack`) accepts, validated when it is made."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..checks import field_need
from ..store import urls
from ..tasks import TASKS
from .process import DEFAULT_MAX_PIXELS, EXIF_MODES, STORE_MODES
from .usable import COCO_BOX_UNITS, MAX_DROPPED


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
    coco_boxes: str = "pixels"         # COCO bbox units: 'pixels', or 'normalized' (fractions; usable.check_coco_units)
    overwrite: bool = False
    progress: bool = True
    max_dropped: float = MAX_DROPPED   # the share of the images, or of the boxes, one reason may drop (check_dropped)
    allow_background_only: bool = False   # pack a set in which (almost) no image has a box (check_labelled, check_kept)
    names: list[str] | None = None     # YOLO: the class names (data.yaml's) instead of those found beside the source
    task: str | None = None            # detect | segment | pose | obb; None: pose when data.yaml has kpt_shape, else detect
    storage_options: dict | None = None   # fsspec options for a URL SRC or OUT (credentials: never written anywhere)

    def __post_init__(self):
        self.out = urls.location(self.out)   # a folder (Path) or a URL (str)
        self.src = urls.location(self.src)
        for name in ("ann", "images"):
            if urls.is_url(getattr(self, name)):
                raise ValueError(f"--{name} must be local; for a dataset in a bucket give its folder as SRC")
        need = field_need(self, "")
        need(self.format in (None, "coco", "yolo"), "format", "must be 'coco' or 'yolo' (or None to detect)")
        need(self.store in STORE_MODES, "store", f"must be one of {', '.join(STORE_MODES)}")
        if self.max_side is not None and (self.store == "original" or self.max_side < 8):
            raise ValueError("max_side applies to store 'jpeg' or 'raw' and must be >= 8 "
                             f"(got store={self.store!r}, max_side={self.max_side})")
        need(1 <= self.quality <= 100, "quality", "must be 1..100")
        if self.shards is not None and self.shard_mb is not None:
            raise ValueError("give shards or shard_mb, not both")
        need(self.shards is None or self.shards >= 1, "shards", "must be >= 1")
        need(self.shard_mb is None or self.shard_mb > 0, "shard_mb", "must be > 0")
        need(self.workers is None or self.workers >= 0, "workers", "must be >= 0 (0 or 1: pack in this process)")
        need(self.check in ("entropy", "full"), "check", "must be 'entropy' or 'full'")
        need(self.max_pixels >= 1, "max_pixels", "must be >= 1")
        need(self.exif in EXIF_MODES, "exif", f"must be one of {', '.join(EXIF_MODES)}")
        need(self.coco_boxes in COCO_BOX_UNITS, "coco_boxes", f"must be one of {', '.join(COCO_BOX_UNITS)}")
        need(self.task in (None, *TASKS), "task", f"must be one of {', '.join(TASKS)}")
        need(0 <= self.max_dropped <= 1, "max_dropped", "is a share of the images or boxes, 0..1 (0.10: 10%)")
        need(self.on_error in ("skip", "fail"), "on_error", "must be 'skip' or 'fail'")
