"""What a dataset layout reader hands to the pack workers: one `Item` per image, plus the classes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .report import Problem, utf8_name

# File names listed as images: every extension Ultralytics accepts (its IMG_FORMATS), plus .jpe and
# .pfm. What a file holds is told from its bytes, never its name (see fastfeed/formats.py).
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".jpe", ".mpo", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2", ".pfm",
                  ".avif", ".heic", ".heif", ".dng"}


class PackError(Exception):
    """A problem that stops the pack: unreadable annotations, unknown layout, --on-error fail, ...

    `report` holds what was counted before the stop, when packing had started; `rejects` the file
    that lists every rejection, when one was written (every image rejected).
    """

    def __init__(self, message: str, report=None, rejects=None):
        super().__init__(message)
        self.report = report
        self.rejects = rejects  # the rejects.jsonl written for this failed pack, if any


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
    coco_geometry: list | None = None         # per annotation, for a segment/pose pack: (its id, its
                                              # `segmentation` or `keypoints` as in the JSON, None where absent)
    label_path: Path | None = None
    problems: list[Problem] = field(default_factory=list)   # found while reading the annotations

    def __post_init__(self):
        self.name = utf8_name(self.name)


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
    labels_dir: Path | None = None  # YOLO: where each image's label file was looked for
    kpt_shape: list | None = None   # a pose set's [K, D]: data.yaml's, or K x 3 from COCO's category keypoints
    flip_idx: list | None = None    # the keypoint each one becomes in a left-right flip (None: not given)
    task: object = None             # the pack's `lines.Task`, once chosen (`task.resolve_task`)

    def describe(self) -> str:
        split = f" split {self.split}" if self.split else ""
        n, k = len(self.items), len(self.class_names)
        classes = f"{k} class{'es' * (k != 1)}" if k else "classes taken from the labels"
        return f"{self.format.upper()}{split}: {n} image{'s' * (n != 1)}, {classes} ({self.root})"


@dataclass(slots=True)
class Listing:
    """The files under a folder, in a stable order (see `list_folder`)."""

    images: list[Path]      # files with an image extension
    others: list[Path]      # every other file
    repeats: list[Problem]  # `repeated_folder` notes: folders reached again through a link, not listed twice


def list_folder(folder: Path) -> Listing:
    """Files under `folder`, recursively, following folder links (a linked folder is as good as a real
    one) but entering each real folder once, so a link loop ends. Names starting with '.' (macOS's
    `._x.jpg`, `.ipynb_checkpoints/`) are left out, as Ultralytics' glob leaves them out. Plain strings
    sort far faster than Path objects on a folder of 100k images."""
    images, others, repeats, seen = [], [], [], set()
    for root, dirs, files in os.walk(folder, followlinks=True):
        st = os.stat(root)
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            repeats.append(Problem("repeated_folder", os.path.relpath(root, folder),
                                   "a link leads to a folder already listed (a loop, or a second link to it)"))
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in files:
            if not f.startswith("."):
                (images if os.path.splitext(f)[1].lower() in IMAGE_SUFFIXES else others).append(os.path.join(root, f))
    return Listing([Path(p) for p in sorted(images)], [Path(p) for p in sorted(others)], repeats)
