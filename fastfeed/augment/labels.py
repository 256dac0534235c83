"""The labels of one image for every task: boxes and classes, plus the task's per-object geometry.

`Labels` is what the augmentation moves for a sample (`render_labels`, `letterbox_labels`) and what a
loader collects per output image: boxes float32 [N,4] x1,y1,x2,y2 and classes int64 [N] as everywhere in
`augment`, and, one entry per object, in pixels of the same image:

    polygons   segment: list of float32 [P_i,2] x, y (P_i may be 0: the object has only its box)
    keypoints  pose: float32 [N,K,D] x, y (+ visibility when D == 3)
    corners    obb: float32 [N,4,2] the oriented box's corners, in the label's order

A field is None when the task has no such geometry (a detect store fills only boxes and classes). Pure
numpy; nothing here moves anything: that is `points.paste_labels` (one rule for every loader).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_FIELDS = ("polygons", "keypoints", "corners")


@dataclass
class Labels:
    boxes: np.ndarray                    # float32 [N,4] x1,y1,x2,y2 pixels
    classes: np.ndarray                  # int64 [N]
    polygons: list | None = None         # segment: float32 [P_i,2] pixels per object
    keypoints: np.ndarray | None = None  # pose: float32 [N,K,D] pixels (+ visibility)
    corners: np.ndarray | None = None    # obb: float32 [N,4,2] pixels

    def __len__(self) -> int:
        return len(self.boxes)

    @property
    def task(self) -> str:
        """'segment', 'pose', 'obb' or 'detect': which geometry these labels carry."""
        if self.polygons is not None:
            return "segment"
        if self.keypoints is not None:
            return "pose"
        return "obb" if self.corners is not None else "detect"

    @classmethod
    def of_record(cls, record, w: float, h: float) -> Labels:
        """A store record's training labels (normalised) scaled to a w x h decode of its image."""
        scale = np.array([w, h], np.float32)
        boxes = record.boxes.reshape(-1, 4) * np.tile(scale, 2)
        polygons = keypoints = corners = None
        task = getattr(record, "task", "detect")
        if task == "segment":
            polygons = [np.asarray(p, np.float32).reshape(-1, 2) * scale for p in record.polygons]
        elif task == "pose":
            keypoints = np.array(record.keypoints, np.float32)   # a copy: only x, y are scaled
            keypoints[..., :2] *= scale
        elif task == "obb":
            corners = np.asarray(record.obb, np.float32).reshape(-1, 4, 2) * scale
        return cls(boxes.astype(np.float32, copy=False), np.asarray(record.classes, np.int64), polygons,
                   keypoints, corners)

    @classmethod
    def concat(cls, parts: Sequence[Labels]) -> Labels:
        """One Labels holding the objects of `parts` in order (all of the same task)."""
        if not parts:
            raise ValueError("Labels.concat needs at least one Labels")
        task = parts[0].task
        if any(p.task != task for p in parts):
            raise ValueError(f"Labels.concat: cannot join labels of tasks {sorted({p.task for p in parts})}")
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        out = cls(np.concatenate([p.boxes for p in parts]).astype(np.float32, copy=False),
                  np.concatenate([p.classes for p in parts]).astype(np.int64, copy=False))
        if first.polygons is not None:
            out.polygons = [q for p in parts for q in p.polygons]
        if first.keypoints is not None:
            shapes = {p.keypoints.shape[1:] for p in parts}
            if len(shapes) > 1:
                raise ValueError(f"Labels.concat: keypoints of different shapes {sorted(shapes)}")
            out.keypoints = np.concatenate([p.keypoints for p in parts])
        if first.corners is not None:
            out.corners = np.concatenate([p.corners for p in parts])
        return out

    def take(self, keep) -> Labels:
        """The objects selected by a bool mask [N] or an index array, every field alike."""
        idx = np.asarray(keep)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise ValueError(f"keep mask of shape {idx.shape} for {len(self)} objects")
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        polygons = None if self.polygons is None else [self.polygons[i] for i in idx]
        return Labels(self.boxes[idx], self.classes[idx], polygons,
                      None if self.keypoints is None else self.keypoints[idx],
                      None if self.corners is None else self.corners[idx])

    @classmethod
    def empty_like(cls, labels: Labels) -> Labels:
        """No objects, the same task fields (keypoints keep their K, D)."""
        return labels.take(np.zeros(0, np.int64))

    def map_points(self, fn) -> Labels:
        """These labels with every point (polygons, keypoint x/y, corners) replaced by fn(points [..., 2])
        (float32 in, float32 out) and the boxes as they are: for maps that move points and boxes apart."""
        kp = None
        if self.keypoints is not None:
            kp = self.keypoints.copy()
            kp[..., :2] = fn(kp[..., :2])
        return Labels(self.boxes, self.classes,
                      None if self.polygons is None else [fn(p) for p in self.polygons], kp,
                      None if self.corners is None else fn(self.corners))
