"""pose: K keypoints per training object (float32 [N,K,D]: x, y normalised, + visibility when D == 3; K, D are the
store's kpt_shape, in the record's header). Batch extra: `keypoints` [M,K,3] (D == 2 given a visibility, as Ultralytics'
dataset does). A keypoint is labelled when its visibility is > 0 (with D == 2: when both coordinates are >= 0)."""

from __future__ import annotations

import numpy as np

from .base import Task, outside


def labelled(kp: np.ndarray) -> np.ndarray:
    """Which keypoints (any leading shape, last axis D) are labelled: the one rule pack, verify and counts use."""
    return kp[..., 2] > 0 if kp.shape[-1] == 3 else (kp[..., 0] >= 0) & (kp[..., 1] >= 0)


class Pose(Task):
    name, field, words, extra = "pose", "keypoints", "keypoints", "keypoints"
    keypoints, data_yaml_keys, ultralytics_key, coco_field = True, ("kpt_shape", "flip_idx"), "keypoints", "keypoints"

    def encode(self, n, value):
        kp = np.asarray(value, "<f4")
        if kp.ndim != 3 or len(kp) != n or kp.shape[2] not in (2, 3) or not 0 < kp.shape[1] <= 0xFFFF:
            raise ValueError(f"keypoints of shape {kp.shape} for {n} objects; expected [{n}, K, 2 or 3]")
        return kp.shape[1], kp.shape[2], kp.tobytes()

    def parse(self, buf, off, k, d, n, bad):
        size = n * k * d
        if d not in (2, 3) or k == 0 or len(buf) < off + 4 * size:
            raise bad(f"keypoints [{n}, {k}, {d}] do not fit the record")
        return np.frombuffer(buf, "<f4", size, off).reshape(n, k, d).astype(np.float32), off + 4 * size

    def check_record(self, value, n, manifest):
        if list(value.shape[1:]) != list(manifest.kpt_shape) or len(value) != n:
            return f"keypoints {list(value.shape)} for {n} boxes of kpt_shape {manifest.kpt_shape}"
        if outside(value[labelled(value)][:, :2]):
            return "labelled keypoints outside 0..1"
        return None

    def read_line(self, vals, kpt_shape, note):
        n, kpt = len(vals), kpt_shape[0] * kpt_shape[1]
        if n != 4 + kpt:
            return (f"{n + 1} values, expected {5 + kpt} (cls cx cy w h + {kpt_shape[0]} keypoints of "
                    f"{kpt_shape[1]} values, data.yaml's kpt_shape {list(kpt_shape)})")
        return tuple(vals[:4]), np.asarray(vals[4:], np.float64).reshape(kpt_shape)

    def active(self, g):
        return labelled(g)

    def settle(self, g, active, beyond):
        if g.shape[1] != 3:   # no visibility to hide them with: clipped
            return super().settle(g, active, beyond)
        g = g.copy()          # hidden, not clipped: a clipped keypoint would mark a wrong place
        g[beyond, 2] = 0.0
        inside = active & ~beyond
        g[inside, :2] = np.clip(g[inside, :2], 0.0, 1.0)
        return g, (("keypoint_hidden", f"keypoint(s) {np.flatnonzero(beyond).tolist()}") if beyond.any() else None)

    def record_value(self, geometry, kpt_shape=None):
        return np.asarray(geometry, np.float32).reshape(-1, *kpt_shape)

    def counts(self, geometry):
        n = len(geometry)
        return {"posed": n, "keypoints_labelled": int(labelled(np.asarray(geometry)).sum()) if n else 0}

    def summary(self, counts, manifest):
        return {"kpt_shape": manifest.kpt_shape, "flip_idx": manifest.flip_idx}

    def describe(self, t):
        flip = f"flip_idx {t['flip_idx']}" if t["flip_idx"] is not None else "no flip_idx"
        return (f"task pose: kpt_shape {t['kpt_shape']}, {flip}; {t.get('posed', 0)} objects, "
                f"{t.get('keypoints_labelled', 0)} keypoints labelled")

    def to_pixels(self, value, scale):
        kp = np.array(value, np.float32)   # a copy (x, y scaled); two-value keypoints: visibility 1 if labelled
        kp = np.concatenate([kp, labelled(kp)[..., None].astype(np.float32)], -1) if kp.shape[-1] == 2 else kp
        kp[..., :2] *= scale
        return kp

    def join(self, values):
        shapes = {v.shape[1:] for v in values}
        if len(shapes) > 1:
            raise ValueError(f"Labels.concat: keypoints of different shapes {sorted(shapes)}")
        return np.concatenate(values)

    def map_points(self, value, fn):
        kp = value.copy()
        kp[..., :2] = fn(kp[..., :2])
        return kp

    def ultralytics_labels(self, value):
        return {"keypoints": self.to_pixels(value, 1.0)}

    def empty_extra(self, kpt_shape, side):
        return np.zeros((0, kpt_shape[0], 3), np.float32)


POSE = Pose()
