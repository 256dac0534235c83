"""Tell COCO from YOLO layouts and pick the split, with errors that say what was expected."""

from __future__ import annotations

from pathlib import Path

from .coco import read_coco
from .source import IMAGE_SUFFIXES, PackError, Source
from .yolo import read_yolo

COCO_HINT = "COCO: SRC/annotations/instances_<split>.json + SRC/images/<split>/ (or --ann FILE --images DIR)"
YOLO_HINT = "YOLO: SRC/images/<split>/ + SRC/labels/<split>/*.txt, or SRC/images/ + SRC/labels/"


def _pick(splits: list[str], wanted: str | None, what: str) -> str:
    if wanted is not None:
        if wanted not in splits:
            raise PackError(f"split {wanted!r} not found in {what}; available: {', '.join(splits) or 'none'}")
        return wanted
    if len(splits) == 1:
        return splits[0]
    for default in ("train2017", "train"):
        if default in splits:
            return default
    raise PackError(f"{what} has several splits ({', '.join(splits)}); choose one with --split")


def detect_format(src: Path) -> str:
    ann = src / "annotations"
    if ann.is_dir() and any(ann.glob("instances_*.json")):
        return "coco"
    if (src / "labels").is_dir():
        return "yolo"
    raise PackError(f"cannot tell the layout of {src}: expected\n  {COCO_HINT}\n  {YOLO_HINT}\n"
                    "or pass --format coco|yolo")


def _coco(src: Path, split: str | None) -> Source:
    files = sorted((src / "annotations").glob("instances_*.json"))
    splits = [f.stem[len("instances_"):] for f in files]
    if not splits:
        raise PackError(f"no annotations/instances_<split>.json in {src}; expected {COCO_HINT}")
    split = _pick(splits, split, f"{src / 'annotations'}")
    images = src / "images" / split
    if not images.is_dir():
        images = src / split if (src / split).is_dir() else images
    if not images.is_dir():
        raise PackError(f"images folder for split {split!r} not found: expected {src / 'images' / split}")
    return read_coco(src / "annotations" / f"instances_{split}.json", images, split, src)


def _has_images(folder: Path) -> bool:
    return any(p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") for p in folder.iterdir() if p.is_file())


def _yolo(src: Path, split: str | None) -> Source:
    images, labels = src / "images", src / "labels"
    if not images.is_dir():
        raise PackError(f"no images/ folder in {src}; expected {YOLO_HINT}")
    subdirs = sorted(p.name for p in images.iterdir() if p.is_dir())
    if split is None and _has_images(images):
        return read_yolo(images, labels, src)
    if not subdirs:
        raise PackError(f"{images} holds no images and no split folders; expected {YOLO_HINT}")
    split = _pick(subdirs, split, str(images))
    return read_yolo(images / split, labels / split, src, split)


def open_source(src: Path | None, format: str | None = None, split: str | None = None,
                ann: Path | None = None, images: Path | None = None) -> Source:
    """Read the dataset at `src` (or the explicit `ann` + `images` pair) into a `Source`."""
    if ann is not None or images is not None:
        if ann is None or images is None:
            raise PackError("--ann and --images go together: give the COCO JSON file and its images folder")
        if format not in (None, "coco"):
            raise PackError("--ann/--images describe a COCO dataset; drop --format yolo")
        if not Path(images).is_dir():
            raise PackError(f"images folder {images} not found")
        return read_coco(Path(ann), Path(images), split)
    if src is None:
        raise PackError("no dataset given: pass SRC (a COCO or YOLO folder) or --ann FILE --images DIR")
    src = Path(src)
    if not src.is_dir():
        raise PackError(f"{src} is not a directory; expected a dataset folder ({COCO_HINT}; {YOLO_HINT})")
    format = format or detect_format(src)
    if format == "coco":
        return _coco(src, split)
    if format == "yolo":
        return _yolo(src, split)
    raise PackError(f"unknown --format {format!r}; valid: coco, yolo")
