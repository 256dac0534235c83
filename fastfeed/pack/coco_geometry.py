"""A COCO annotation's `segmentation` or `keypoints`, as the normalised points a record stores.

* polygons `[[x1, y1, x2, y2, ...], ...]` in pixels: one ring per object. An object drawn in several parts (a
  person behind a pole) is joined into one ring by going out to each part and back along the same line (no
  area: the filled ring covers the parts), counted as `polygon_parts_joined`.
* RLE `{"counts": [...], "size": [h, w]}` of a non-crowd object: the mask decoded and its outlines traced
  (OpenCV's findContours), counted as `rle_to_polygon`; compressed counts (a string) need pycocotools, else
  the object is dropped by name (`rle_not_decoded`). A crowd region stays a crowd box, as in a detect pack.
* keypoints `[x1, y1, v1, ...]` in pixels, visibility 0 (not labelled), 1 (hidden), 2 (visible) as given.
"""

from __future__ import annotations

import warnings

import numpy as np

from .report import Problem


def _numbers(v) -> bool:
    return isinstance(v, list) and all(type(x) in (int, float) and np.isfinite(x) for x in v)


def join_parts(parts: list[np.ndarray]) -> np.ndarray:
    """One ring through every part: the first part, then out from its first point to each other part's nearest
    point, around that part and back the same way (the there-and-back lines enclose nothing)."""
    if len(parts) == 1:
        return parts[0]
    anchor = parts[0][0]
    ring = [parts[0], anchor[None]]
    for p in parts[1:]:
        j = int(np.argmin(((p - anchor) ** 2).sum(1)))
        ring += [np.roll(p, -j, 0), p[j][None], anchor[None]]
    return np.concatenate(ring)


def _decode_rle(rle: dict) -> np.ndarray | None:
    """The mask of an RLE (column-major runs, starting with background); None when compressed counts cannot be
    decoded here (no pycocotools)."""
    counts = rle["counts"]
    if isinstance(counts, str):
        try:
            from pycocotools import mask as coco_mask
        except ImportError:
            return None
        try:
            with warnings.catch_warnings():   # its numpy-2 `__array__` DeprecationWarning, not the user's concern
                warnings.simplefilter("ignore", DeprecationWarning)
                return coco_mask.decode({"counts": counts.encode(), "size": list(rle["size"])}).astype(np.uint8)
        except Exception as e:   # pycocotools' own errors on damaged counts
            raise ValueError(f"compressed counts pycocotools cannot decode ({type(e).__name__}: {e})") from None
    h, w = rle["size"]
    values = np.arange(len(counts)) % 2
    flat = np.repeat(values.astype(np.uint8), counts)
    if len(flat) != h * w:
        raise ValueError(f"RLE runs cover {len(flat)} pixels, its size {w}x{h} has {h * w}")
    return flat.reshape(w, h).T


def _outlines(mask: np.ndarray) -> list[np.ndarray]:
    import cv2

    contours, _ = cv2.findContours(np.ascontiguousarray(mask), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    return [c.reshape(-1, 2).astype(np.float64) for c in contours if len(c) >= 3]


def segmentation_points(seg, size, unit, name: str, ann_id, problems: list[Problem]) -> np.ndarray | None:
    """The object's ring, normalised [P,2] (P 0: the annotation has no polygon, `box_without_polygon`); None when
    the object is dropped (named in `problems`). `unit`: (w, h) a polygon's values are divided by (the image's
    size; (1, 1) for a set written in fractions, `--coco-boxes normalized`)."""
    h, w = size
    where = f"annotation {ann_id}"
    if seg is None or seg == []:
        problems.append(Problem("box_without_polygon", name, where))
        return np.zeros((0, 2))
    if isinstance(seg, dict):
        if not (isinstance(seg.get("size"), list) and len(seg["size"]) == 2 and "counts" in seg):
            problems.append(Problem("malformed_annotation", name, f"{where}: RLE without counts and size"))
            return None
        if list(seg["size"]) != [h, w]:
            problems.append(Problem("malformed_annotation", name, f"{where}: RLE of size {seg['size'][1]}x"
                                                                  f"{seg['size'][0]} on a {w}x{h} image"))
            return None
        try:
            mask = _decode_rle(seg)
        except (ValueError, TypeError) as e:
            problems.append(Problem("malformed_annotation", name, f"{where}: RLE: {e}"[:300]))
            return None
        if mask is None:
            problems.append(Problem("rle_not_decoded", name, f"{where}: compressed RLE counts; pip install pycocotools "
                                                             "to turn them into polygons"))
            return None
        parts, unit = _outlines(mask), (w, h)
        problems.append(Problem("rle_to_polygon", name, where))
    elif isinstance(seg, list) and all(_numbers(p) for p in seg):
        parts = [np.asarray(p, np.float64).reshape(-1, 2) for p in seg if len(p) % 2 == 0 and len(p) >= 6]
    else:
        problems.append(Problem("malformed_annotation", name, f"{where}: segmentation {str(seg)[:60]} is neither "
                                                              "polygons (lists of numbers) nor RLE"))
        return None
    if not parts:
        problems.append(Problem("polygon_degenerate", name, f"{where}: no polygon of 3 points or more"))
        return None
    if len(parts) > 1:
        problems.append(Problem("polygon_parts_joined", name, f"{where}: {len(parts)} parts"))
    return join_parts(parts) / unit


def keypoint_values(kp, unit, k: int, name: str, ann_id, problems: list[Problem]) -> np.ndarray | None:
    """The object's keypoints [K,3] (x, y divided by `unit` (w, h), visibility as given); None when dropped (named)."""
    if kp is None:
        problems.append(Problem("box_without_keypoints", name, f"annotation {ann_id}"))
        return np.zeros((k, 3))
    if isinstance(kp, list) and len(kp) == 3 * k and not _numbers(kp):
        problems.append(Problem("malformed_annotation", name, f"annotation {ann_id}: keypoints that are not all numbers"))
        return None
    if not _numbers(kp) or len(kp) != 3 * k:
        n = len(kp) if isinstance(kp, list) else type(kp).__name__
        problems.append(Problem("keypoint_count", name, f"annotation {ann_id}: keypoints of {n} values, expected "
                                                        f"{3 * k} (x, y, v for each of the categories' {k} keypoints)"))
        return None
    return np.asarray(kp, np.float64).reshape(k, 3) / (*unit, 1)
