"""Read an Ultralytics/YOLO dataset: an images folder and its labels folder (`images/<split>/` +
`labels/<split>/*.txt`, `<split>/images/` + `<split>/labels/`, ...), class names from data.yaml."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from .datayaml import read_names
from .report import Problem
from .source import IMAGE_SUFFIXES, Item, Source, list_folder


def read_yolo(images_dir: Path, labels_dir: Path, root: Path, split: str | None = None,
              names: list[str] | None = None) -> Source:
    """`names`: the class names (data.yaml's); None: read from a data.yaml in `root`, else the label ids."""
    listing = list_folder(images_dir)
    items, problems = [], list(listing.repeats)
    seen_labels = set()
    rel = [p.relative_to(images_dir) for p in listing.images]
    # Numeric stems (COCO-style file names) become the image ids; otherwise the position.
    stems = [p.stem for p in rel]
    numeric = all(s.isdigit() for s in stems) and len({int(s) for s in stems}) == len(stems)
    sharing = defaultdict(list)   # a.jpg and a.png (or a.JPG) would both take a.txt
    for r in rel:
        sharing[(labels_dir / r).with_suffix(".txt")].append(r)
    for k, (path, r) in enumerate(zip(listing.images, rel)):
        label = (labels_dir / r).with_suffix(".txt")
        seen_labels.add(label)
        if len(sharing[label]) > 1 and label.is_file():
            problems.append(Problem("ambiguous_label", str(r), (
                f"{' and '.join(map(str, sharing[label]))} share the label file {os.path.relpath(label, root)}: its "
                "boxes cannot be for all of them, so none is packed; rename the images so each has a label file of "
                "its own")))
            continue
        items.append(Item(path=path, name=str(r), image_id=int(r.stem) if numeric else k,
                          label_path=label if label.is_file() else None))
    if labels_dir.is_dir():
        labels = list_folder(labels_dir)
        problems += labels.repeats
        unlisted = {p.relative_to(images_dir).with_suffix(""): p.relative_to(images_dir) for p in listing.others}
        for label in labels.others:
            if label.suffix != ".txt" or label in seen_labels:
                continue
            r = label.relative_to(labels_dir)
            image = unlisted.get(r.with_suffix(""))
            if image is None:
                problems.append(Problem("label_without_image", str(r)))
            else:  # the image is there, under a name fastfeed does not list
                problems.append(Problem("unsupported_format", str(image), (
                    f"{image.suffix or 'no extension'} is not an image extension fastfeed lists "
                    f"({' '.join(sorted(IMAGE_SUFFIXES))}); its label {r} is unused: convert the image to PNG or JPEG")))
    names = list(names) if names is not None else (read_names(root) or [])
    return Source("yolo", root, split, items, names, list(range(len(names))), problems, [], labels_dir)


def parse_label(path: Path, name: str, nc: int | None):
    """Parse one label file into (cxcywh normalised [N,4] float64, classes [N], problems, `file:line` of each box).

    Lines are `cls cx cy w h`, or `cls x1 y1 x2 y2 ... ` polygons (turned into their box).
    With `nc` (class names known) a class >= nc is unknown; without, any class >= 0 is accepted.
    """
    problems = []
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of line 1 (as Ultralytics reads)
    except (OSError, UnicodeDecodeError) as e:
        return np.zeros((0, 4)), np.zeros(0, np.int64), [Problem("unreadable_label", name, (
            f"{path.name}: {type(e).__name__}: {e}; save it as UTF-8 text")[:300])], []
    boxes, classes, seen, lines = [], [], set(), []
    for lineno, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        where = f"{path.name}:{lineno}"
        try:
            vals = [float(v) for v in parts]
        except ValueError:
            problems.append(Problem("malformed_line", name, f"{where}: not numbers: {line.strip()[:60]!r}"))
            continue
        n = len(vals) - 1
        if n != 4 and not (n >= 6 and n % 2 == 0):
            problems.append(Problem("malformed_line", name, f"{where}: {len(vals)} values, expected 5 (cls cx cy w h) "
                                    "or an odd count >= 7 (cls + polygon)"))
            continue
        if not all(math.isfinite(v) for v in vals) or vals[0] < 0 or vals[0] != int(vals[0]):
            problems.append(Problem("malformed_line", name, f"{where}: bad class or non-finite value: {line.strip()[:60]!r}"))
            continue
        cls = int(vals[0])
        if nc is not None and cls >= nc:
            problems.append(Problem("unknown_category", name, f"{where}: class {cls} but data.yaml names {nc} classes"))
            continue
        if n == 4:
            box = tuple(vals[1:])
        else:
            xs, ys = vals[1::2], vals[2::2]
            x1, x2, y1, y2 = min(xs), max(xs), min(ys), max(ys)
            box = ((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1)
            problems.append(Problem("polygon_to_box", name, where))
        if (cls, box) in seen:
            problems.append(Problem("duplicate_box", name, where))
            continue
        seen.add((cls, box))
        boxes.append(box)
        classes.append(cls)
        lines.append(where)
    return np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(classes, np.int64), problems, lines
