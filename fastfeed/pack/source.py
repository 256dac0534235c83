"""What a dataset layout reader hands to the pack workers: one `Item` per image, plus the classes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .report import Problem

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".jpe"}


class PackError(Exception):
    """A problem that stops the pack: unreadable annotations, unknown layout, --on-error fail, ...

    `report` holds what was counted before the stop, when packing had started.
    """

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report


@dataclass(slots=True)
class Item:
    """One image to pack.

    COCO items carry their boxes (`xywh` pixels, as in the JSON); YOLO items carry the path of the
    label file, parsed in the worker so that reading many small files runs in parallel.
    """

    path: Path                      # absolute path of the image file
    name: str                       # file name relative to the images folder (what users recognise)
    image_id: int
    ann_size: tuple[int, int] | None = None   # (h, w) the annotation claims, checked against the file
    coco_xywh: np.ndarray | None = None       # float64 [N,4]
    coco_classes: np.ndarray | None = None    # int64 [N], already contiguous
    coco_crowd: np.ndarray | None = None      # bool [N]
    label_path: Path | None = None
    problems: list[Problem] = field(default_factory=list)   # found while reading the annotations


@dataclass(slots=True)
class Source:
    """A dataset read from disk, ready to pack."""

    format: str                     # 'coco' | 'yolo'
    root: Path
    split: str | None
    items: list[Item]
    class_names: list[str]
    category_ids: list[int]         # source id of each contiguous class
                                    # (YOLO without class names: both empty, filled from the labels)
    problems: list[Problem]         # layout-level (orphan labels, orphan annotations, ...)
    annotation_files: list[Path]    # hashed into the source fingerprint

    def describe(self) -> str:
        split = f" split {self.split}" if self.split else ""
        classes = f"{len(self.class_names)} classes" if self.class_names else "classes taken from the labels"
        return f"{self.format.upper()}{split}: {len(self.items)} images, {classes} ({self.root})"


def list_images(folder: Path) -> list[Path]:
    """Image files under `folder`, recursively, in a stable order (plain strings sort far faster
    than Path objects on a folder of 100k images)."""
    found = []
    for root, _, files in os.walk(folder):
        found += [os.path.join(root, f) for f in files if os.path.splitext(f)[1].lower() in IMAGE_SUFFIXES]
    return [Path(p) for p in sorted(found)]
