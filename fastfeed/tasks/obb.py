"""obb: an oriented box per training object, its four corners (float32 [N,4,2] x, y normalised, in the label's
order). Batch extra: `rboxes` [M,5] cx, cy, w, h normalised, angle in radians (`augment.corners_to_rboxes`)."""

from __future__ import annotations

import numpy as np

from .base import Task, bounds, outside


class Obb(Task):
    name, field, words, extra = "obb", "corners", "oriented boxes", "rboxes"
    degenerate_reason, ultralytics_key = "obb_degenerate", "bboxes"   # Ultralytics' OBB loss reads rboxes as bboxes
    from_coco = False

    def encode(self, n, value):
        corners = np.asarray(value if value is not None else np.zeros((0, 4, 2)), "<f4").reshape(-1, 4, 2)
        if len(corners) != n:
            raise ValueError(f"{len(corners)} oriented boxes for {n} objects")
        return 0, 0, corners.tobytes()

    def parse(self, buf, off, k, d, n, bad):
        if len(buf) < off + 32 * n:
            raise bad("shorter than its oriented boxes")
        return np.frombuffer(buf, "<f4", n * 8, off).reshape(n, 4, 2).astype(np.float32), off + 32 * n

    def check_record(self, value, n, manifest):
        if len(value) != n or outside(value):
            return f"{len(value)} oriented boxes for {n} boxes, or corners outside 0..1"
        return None

    def read_line(self, vals, kpt_shape, note):
        if len(vals) == 4:   # a box line: its four corners
            note("box_to_obb")
            cx, cy, w, h = vals
            return tuple(vals), np.array([[cx - w / 2, cy - h / 2], [cx + w / 2, cy - h / 2], [cx + w / 2, cy + h / 2],
                                          [cx - w / 2, cy + h / 2]])
        if len(vals) != 8:
            return f"{len(vals) + 1} values, expected 9 (cls x1 y1 x2 y2 x3 y3 x4 y4) or 5 (cls cx cy w h)"
        return bounds(vals[0::2], vals[1::2]), np.asarray(vals, np.float64).reshape(4, 2)

    def record_value(self, geometry, kpt_shape=None):
        return np.asarray(geometry, np.float32).reshape(-1, 4, 2)

    def counts(self, geometry):
        return {"oriented": len(geometry)}

    def describe(self, t):
        return f"task obb: {t.get('oriented', 0)} oriented boxes"

    def to_pixels(self, value, scale):
        return np.asarray(value, np.float32).reshape(-1, 4, 2) * scale

    def ultralytics_labels(self, value):
        return {"segments": list(np.asarray(value, np.float32).reshape(-1, 4, 2))}

    def empty_extra(self, kpt_shape, side):
        return np.zeros((0, 5), np.float32)


OBB = Obb()
