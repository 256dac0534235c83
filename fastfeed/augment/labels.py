"""The labels of one image for every task: boxes and classes, plus the task's per-object geometry.

`Labels` is what the augmentation moves for a sample (`render_labels`, `letterbox_labels`) and what a
loader collects per output image, every field in pixels of that image, one entry per object. A geometry field is
None when the task has no such geometry: at most one is set, its task's (`fastfeed.tasks`). Nothing here moves
anything: that is `points.paste_labels`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import tasks


@dataclass
class Labels:
    boxes: np.ndarray                    # float32 [N,4] x1,y1,x2,y2, as everywhere in `augment`
    classes: np.ndarray                  # int64 [N]
    polygons: list | None = None         # segment: float32 [P_i,2] x, y (P_i may be 0: the object has only its box)
    keypoints: np.ndarray | None = None  # pose: float32 [N,K,D] x, y (+ visibility when D == 3)
    corners: np.ndarray | None = None    # obb: float32 [N,4,2] the oriented box's corners, in the label's order

    def __len__(self) -> int:
        return len(self.boxes)

    @property
    def spec(self) -> tasks.Task:
        """The task whose geometry these labels carry (`fastfeed.tasks`; detect: boxes only)."""
        return next((t for t in tasks.GEOMETRY_TASKS if getattr(self, t.field) is not None), tasks.get("detect"))

    @property
    def task(self) -> str:
        return self.spec.name

    @property
    def boxes_only(self) -> bool:
        return self.polygons is None and self.keypoints is None and self.corners is None

    @classmethod
    def of_record(cls, record, w: float, h: float, task: str | None = None) -> Labels:
        """A store record's training labels (normalised) scaled to a w x h decode of its image: its task's, or
        `task`'s ('detect': its boxes alone, whatever the record holds)."""
        scale = np.array([w, h], np.float32)
        boxes = record.boxes.reshape(-1, 4) * np.tile(scale, 2)
        spec = tasks.get(task or getattr(record, "task", "detect"))
        extra = {spec.field: spec.to_pixels(record.geometry, scale)} if spec.field else {}
        return cls(boxes.astype(np.float32, copy=False), np.asarray(record.classes, np.int64), **extra)

    def _with(self, boxes, classes, fn) -> Labels:
        """Labels of `boxes`, `classes` and fn(this task, this task's field) (detect: nothing more)."""
        spec = self.spec
        return Labels(boxes, classes, **({spec.field: fn(spec, getattr(self, spec.field))} if spec.field else {}))

    @classmethod
    def concat(cls, parts: Sequence[Labels]) -> Labels:
        """One Labels holding the objects of `parts` in order (all of the same task)."""
        if not parts:
            raise ValueError("Labels.concat needs at least one Labels")
        spec = parts[0].spec
        if any(p.spec is not spec for p in parts):
            raise ValueError(f"Labels.concat: cannot join labels of tasks {sorted({p.task for p in parts})}")
        if len(parts) == 1:
            return parts[0]
        return parts[0]._with(np.concatenate([p.boxes for p in parts]).astype(np.float32, copy=False),
                              np.concatenate([p.classes for p in parts]).astype(np.int64, copy=False),
                              lambda spec, _: spec.join([getattr(p, spec.field) for p in parts]))

    def take(self, keep) -> Labels:
        """The objects selected by a bool mask [N] or an index array, every field alike."""
        idx = np.asarray(keep)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise ValueError(f"keep mask of shape {idx.shape} for {len(self)} objects")
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        return self._with(self.boxes[idx], self.classes[idx], lambda spec, value: spec.take(value, idx))

    @classmethod
    def empty_like(cls, labels: Labels) -> Labels:
        """No objects, the same task fields (keypoints keep their K, D)."""
        return labels.take(np.zeros(0, np.int64))

    def map_points(self, fn) -> Labels:
        """These labels with every point (polygons, keypoint x/y, corners) replaced by fn(points [..., 2])
        (float32 in, float32 out) and the boxes as they are: for maps that move points and boxes apart."""
        return self._with(self.boxes, self.classes, lambda spec, value: spec.map_points(value, fn))
