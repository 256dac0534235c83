"""One YOLO label file's lines, read for the pack's task (`Task`): the box of each object and its geometry, each
line's shape its task's (`fastfeed.tasks`: `read_line`):

    detect   `cls cx cy w h`; a polygon line `cls x1 y1 ... xn yn` becomes its bounds (`polygon_to_box`, as
             Ultralytics does); a pose line of data.yaml's kpt_shape keeps its box (`keypoints_dropped`)
    segment  `cls x1 y1 ... xn yn` (n >= 3), its box the polygon's bounds; a box line keeps its box and no
             polygon (`box_without_polygon`; Ultralytics rejects the whole file)
    pose     `cls cx cy w h` + K x (x, y[, v]) for data.yaml's `kpt_shape: [K, D]`
    obb      `cls x1 y1 x2 y2 x3 y3 x4 y4` (DOTA order), its box the corners' bounds; a box line becomes its four
             corners (`box_to_obb`)

Every coordinate is a fraction of the image, checked afterwards (`clean.py`). A file that cannot be read whole
raises `LabelsFailed`: its image is rejected, never packed as background (docs/inputs.md, "YOLO label files").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import tasks
from .report import Problem

UNNAMED_CLASSES = 10_000   # without data.yaml's names, a class id this large or more is taken for a typo


class LabelsFailed(Exception):
    """An image's label file cannot be read whole: `problem` names the first line that fails (and how many do)."""

    def __init__(self, problem: Problem):
        super().__init__(problem.describe())
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Task:
    """What a pack stores per object: `name` (detect | segment | pose | obb) and, for pose (or a detect pack of a
    pose set: its lines are known), `kpt_shape` (K, D)."""

    name: str = "detect"
    kpt_shape: tuple[int, int] | None = None


def parse_label(path: Path, name: str, nc: int | None, task: Task = Task()):
    """Parse one label file into (cxcywh normalised [N,4] float64, classes [N], problems, `file:line` of each box,
    the geometry of each box: a float64 array for `task`, or None for detect).

    With `nc` (class names known) a class >= nc is unknown; without, any class in 0..UNNAMED_CLASSES-1. Raises
    `LabelsFailed` when the file or one of its lines cannot be read.
    """
    problems, failed = [], []
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of line 1 (as Ultralytics reads)
    except (OSError, UnicodeDecodeError) as e:
        raise LabelsFailed(Problem("unreadable_label", name, (
            f"{path.name}: {type(e).__name__}: {e}; save it as UTF-8 text")[:300])) from None
    boxes, classes, seen, lines, geometry = [], [], set(), [], []
    for lineno, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        where = f"{path.name}:{lineno}"
        try:
            vals = [float(v) for v in parts]
        except ValueError:
            commas = ": values separated by commas; YOLO lines are 'class cx cy w h' separated by spaces" if (
                "," in line) else ""
            failed.append(("malformed_line", f"{where}: not numbers: {line.strip()[:60]!r}{commas}"))
            continue
        found = tasks.get(task.name).read_line(vals[1:], task.kpt_shape,
                                               lambda reason, where=where: problems.append(Problem(reason, name, where)))
        if isinstance(found, str) or not all(math.isfinite(v) for v in vals) or vals[0] < 0 or vals[0] != int(vals[0]):
            # the count first: `0.5 0.5 0.2 0.2` lacks a value, its class is not bad
            why = found if isinstance(found, str) else "bad class or non-finite value"
            failed.append(("malformed_line", f"{where}: {why}: {line.strip()[:60]!r}"))
            continue
        cls = int(vals[0])
        if nc is not None and cls >= nc:
            failed.append(("unknown_class", f"{where}: class {cls}, but data.yaml names {nc} class(es): ids 0..{nc - 1}"))
            continue
        if nc is None and cls >= UNNAMED_CLASSES:   # the classes are then the ids used, 0..max
            failed.append(("unknown_class", f"{where}: class {cls}, and no data.yaml names the classes: an id over "
                           f"{UNNAMED_CLASSES - 1} is taken for a typo; correct it, or give data.yaml `names`"))
            continue
        box, geom = found
        key = (cls, box if geom is None else tuple(vals[1:]))   # distinct polygons may share a class and a box
        if key in seen:
            problems.append(Problem("duplicate_box", name, where))
            continue
        seen.add(key)
        boxes.append(box)
        classes.append(cls)
        lines.append(where)
        geometry.append(geom)
    if failed:
        reason, detail = failed[0]
        more = f"; {len(failed) - 1} more line(s) of it fail too" if len(failed) > 1 else ""
        raise LabelsFailed(Problem(reason, name, f"{detail}{more}"))
    return np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(classes, np.int64), problems, lines, geometry
