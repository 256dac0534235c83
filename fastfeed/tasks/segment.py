"""segment: one polygon per training object (float32 [P,2] x, y normalised; P may be 0: the object has only its
box). Record section: uint32 [N] points per object, then float32 [sum, 2]. Batch extra: `masks` (rasterised by
the loaders from the moved polygons: `augment.masks`)."""

from __future__ import annotations

import numpy as np

from .base import Task, outside, polygon_line


class Segment(Task):
    name, field, words, extra = "segment", "polygons", "polygons", "masks"
    degenerate_reason, box_alone, ultralytics_key, coco_field = "polygon_degenerate", True, "masks", "segmentation"
    pastes = True

    def encode(self, n, value):
        polygons = [] if value is None else value
        if len(polygons) != n:
            raise ValueError(f"{len(polygons)} polygons for {n} objects")
        parts = [np.asarray(p, "<f4").reshape(-1, 2) for p in polygons]
        counts = np.array([len(p) for p in parts], "<u4")
        return 0, 0, counts.tobytes() + b"".join(p.tobytes() for p in parts)

    def parse(self, buf, off, k, d, n, bad):
        if len(buf) < off + 4 * n:
            raise bad("shorter than its polygon counts")
        counts = np.frombuffer(buf, "<u4", n, off).astype(np.int64)
        off += 4 * n
        total = int(counts.sum())
        if len(buf) < off + 8 * total:
            raise bad("shorter than its polygons")
        points = np.frombuffer(buf, "<f4", total * 2, off).reshape(total, 2).astype(np.float32)
        return [points[e - c:e] for c, e in zip(counts, np.cumsum(counts))], off + 8 * total

    def check_record(self, value, n, manifest):
        if len(value) != n or any(outside(p) for p in value):
            return f"{len(value)} polygons for {n} boxes, or points outside 0..1"
        return None

    def read_line(self, vals, kpt_shape, note):
        found = polygon_line(vals, note, polygon=True)
        if isinstance(found, tuple) and found[1] is None:   # a box line: its box, no polygon (Ultralytics rejects it)
            note("box_without_polygon")
            return found[0], np.zeros((0, 2))
        return found

    def record_value(self, geometry, kpt_shape=None):
        return geometry

    def counts(self, geometry):
        return {"polygons": sum(len(p) > 0 for p in geometry), "polygon_points": sum(len(p) for p in geometry)}

    def summary(self, counts, manifest):
        return {"mean_points": round(counts["polygon_points"] / counts["polygons"], 1)} if counts.get("polygons") else {}

    def describe(self, t):
        mean = f", {t['mean_points']} points each on average" if t.get("mean_points") else ""
        return f"task segment: {t.get('polygons', 0)} objects with a polygon{mean}"

    def to_pixels(self, value, scale):
        return [np.asarray(p, np.float32).reshape(-1, 2) * scale for p in value]

    def join(self, values):
        return [q for v in values for q in v]

    def take(self, value, idx):
        return [value[i] for i in idx]

    def map_points(self, value, fn):
        return [fn(p) for p in value]

    def ultralytics_labels(self, value):
        return {"segments": [np.asarray(p, np.float32).reshape(-1, 2) for p in value]}

    def empty_extra(self, kpt_shape, side):
        return np.zeros((0, side, side), np.uint8)


SEGMENT = Segment()
