"""A record's per-object geometry (format version 4): what a segment, pose or OBB store holds besides boxes.

The section sits between a record's classes and its payload, for the training objects only (crowd regions
have none), all little-endian float32 normalised to 0..1 of the upright image, like the boxes:

    segment  uint32 [N] points per object (0: the object has no polygon), then float32 [sum, 2] x, y
    pose     float32 [N, K, D]: K keypoints of D values (x, y, or x, y, visibility); K, D in the header
    obb      float32 [N, 4, 2]: the four corners, in the label's order
    detect   nothing

Private to `fastfeed/store/`, like the rest of the record layout (`record.py`).
"""

from __future__ import annotations

import numpy as np

from .format import TASKS

TASK_ID = {name: i for i, name in enumerate(TASKS)}


def encode_geometry(task: str, n: int, polygons=None, keypoints=None, obb=None) -> tuple[int, int, int, bytes]:
    """(task id, K, D, the section's bytes) for `n` training objects; raises ValueError on a mismatch."""
    if task not in TASK_ID:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if task == "segment":
        polygons = [] if polygons is None else polygons
        if len(polygons) != n:
            raise ValueError(f"{len(polygons)} polygons for {n} objects")
        parts = [np.asarray(p, "<f4").reshape(-1, 2) for p in polygons]
        counts = np.array([len(p) for p in parts], "<u4")
        points = np.concatenate(parts) if parts else np.zeros((0, 2), "<f4")
        return TASK_ID[task], 0, 0, counts.tobytes() + points.astype("<f4", copy=False).tobytes()
    if task == "pose":
        kp = np.asarray(keypoints, "<f4")
        if kp.ndim != 3 or len(kp) != n or kp.shape[2] not in (2, 3) or not 0 < kp.shape[1] <= 0xFFFF:
            raise ValueError(f"keypoints of shape {kp.shape} for {n} objects; expected [{n}, K, 2 or 3]")
        return TASK_ID[task], kp.shape[1], kp.shape[2], kp.tobytes()
    if task == "obb":
        corners = np.asarray(obb if obb is not None else np.zeros((0, 4, 2)), "<f4").reshape(-1, 4, 2)
        if len(corners) != n:
            raise ValueError(f"{len(corners)} oriented boxes for {n} objects")
        return TASK_ID[task], 0, 0, corners.tobytes()
    return TASK_ID[task], 0, 0, b""


def parse_geometry(buf, off: int, task_id: int, k: int, d: int, n: int, bad):
    """(polygons, keypoints, obb, the offset after the section); `bad(why)` makes the error to raise."""
    if task_id >= len(TASKS):
        raise bad(f"unknown task id {task_id}")
    task = TASKS[task_id]
    if task == "segment":
        if len(buf) < off + 4 * n:
            raise bad("shorter than its polygon counts")
        counts = np.frombuffer(buf, "<u4", n, off).astype(np.int64)
        off += 4 * n
        total = int(counts.sum())
        if len(buf) < off + 8 * total:
            raise bad("shorter than its polygons")
        points = np.frombuffer(buf, "<f4", total * 2, off).reshape(total, 2).astype(np.float32)
        ends = np.cumsum(counts)
        return [points[e - c:e] for c, e in zip(counts, ends)], None, None, off + 8 * total
    if task == "pose":
        size = n * k * d
        if d not in (2, 3) or k == 0 or len(buf) < off + 4 * size:
            raise bad(f"keypoints [{n}, {k}, {d}] do not fit the record")
        kp = np.frombuffer(buf, "<f4", size, off).reshape(n, k, d).astype(np.float32)
        return None, kp, None, off + 4 * size
    if task == "obb":
        if len(buf) < off + 32 * n:
            raise bad("shorter than its oriented boxes")
        return None, None, np.frombuffer(buf, "<f4", n * 8, off).reshape(n, 4, 2).astype(np.float32), off + 32 * n
    return None, None, None, off
