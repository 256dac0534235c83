"""`Task`: what a task module describes (see the package docstring); its defaults are a task without geometry."""

from __future__ import annotations

import numpy as np


def polygon_area(pts: np.ndarray) -> float:
    """The area a closed polygon's points [P,2] enclose (shoelace), in the points' units squared."""
    x, y = pts[:, 0], pts[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def bounds(xs, ys) -> tuple:
    """(cx, cy, w, h) of the box bounding points' coordinates."""
    x1, x2, y1, y2 = min(xs), max(xs), min(ys), max(ys)
    return ((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1)


def polygon_line(vals: list, note, polygon: bool):
    """A YOLO line's numbers after the class as a box (4) or a polygon (an even count >= 6: its bounds, and the
    points when `polygon`; without, noted `polygon_to_box`, as Ultralytics reads one for detection)."""
    n = len(vals)
    if n != 4 and not (n >= 6 and n % 2 == 0):
        return f"{n + 1} values, expected 5 (cls cx cy w h) or an odd count >= 7 (cls + polygon)"
    if n == 4:
        return tuple(vals), None
    if not polygon:
        note("polygon_to_box")
    return bounds(vals[0::2], vals[1::2]), np.asarray(vals, np.float64).reshape(-1, 2) if polygon else None


def outside(points: np.ndarray) -> bool:
    """Any coordinate outside 0..1 (or not finite): what no packed, normalised point may be."""
    return bool(((points < 0) | (points > 1) | ~np.isfinite(points)).any())


class Task:
    """One task's description. `field` names its geometry in a `Record` and in `augment.Labels` (the same word in
    both: polygons, keypoints, corners), None for detect; `words` names it in messages; `extra` is the `Batch`
    field the loaders fill from it. Array-valued geometry (one array [N, ...] for N objects) is the default;
    segment overrides the list-valued parts."""

    name: str = "detect"
    field: str | None = None        # the Record / augment.Labels attribute holding the geometry
    words: str = "boxes"            # what it is, in messages ("the polygons of a segment store")
    extra: str | None = None        # the Batch field it becomes: masks | keypoints | rboxes
    degenerate_reason: str | None = None   # the pack's rejection reason for an object whose points enclose nothing
    box_alone: bool = False         # an object may have its box and no points (a segment object without polygon)
    pastes: bool = False            # copy_paste can paste its objects (by their polygons: segment)
    keypoints: bool = False         # shaped by a kpt_shape, renamed in a left-right flip by flip_idx (data.yaml's
                                    # or COCO's categories'); without flip_idx nothing flips
    data_yaml_keys: tuple = ()      # what it reads from Ultralytics' data.yaml (pose: kpt_shape, flip_idx)
    coco_field: str | None = None   # the COCO annotation field it is read from (None: boxes, or not in COCO)
    from_coco: bool = True          # COCO can hold it (oriented boxes: YOLO-OBB lines only)
    ultralytics_key: str | None = None   # the key of its extra in the batch Ultralytics' loss reads

    def __repr__(self) -> str:
        return f"<task {self.name}>"

    # --- a record's bytes (format version 4; the record layout itself is store/record.py's) ------------------

    def encode(self, n: int, value) -> tuple[int, int, bytes]:
        """(K, D, the geometry section's bytes) for `n` training objects; ValueError on a mismatch."""
        return 0, 0, b""

    def parse(self, buf, off: int, k: int, d: int, n: int, bad):
        """(the value, the offset after the section); `bad(why)` makes the error to raise."""
        return None, off

    def check_record(self, value, n: int, manifest) -> str | None:
        """What is wrong with a parsed record's geometry for `n` training boxes in a store of `manifest` (None: fine)."""
        return None

    # --- packing: a YOLO line, one object's points, the record's value, the manifest's counts --------------------

    def read_line(self, vals: list, kpt_shape, note):
        """(box cx, cy, w, h, geometry or None) of a YOLO line's numbers after the class, or a str saying why the
        line cannot be read; `note(reason)` counts what was read another way (a pose set's line: its box alone)."""
        if kpt_shape and len(vals) == 4 + kpt_shape[0] * kpt_shape[1]:
            note("keypoints_dropped")
            return tuple(vals[:4]), None
        return polygon_line(vals, note, polygon=False)

    def active(self, g: np.ndarray) -> np.ndarray:
        """Which of an object's points [P, D] the pack's rules apply to (all but keypoints marked missing)."""
        return np.ones(len(g), bool)

    def degenerate(self, g: np.ndarray, w: int, h: int, min_area_px: float) -> bool:
        """Whether an object's normalised points enclose (almost) no area on a w x h image (a rejection, named
        `degenerate_reason`: a task without one rejects none): fewer than 3 points, or under `min_area_px`."""
        return self.degenerate_reason is not None and (len(g) < 3 or polygon_area(g[:, :2]) * w * h < min_area_px)

    def settle(self, g: np.ndarray, active: np.ndarray, beyond: np.ndarray):
        """(an object's points with those `beyond` the tolerance settled, (reason, detail) or None): clipped into
        the image and counted, by default (`pack/clean.py` holds the rule; keypoints hide rather than clip)."""
        g = g.copy()
        g[active, :2] = np.clip(g[active, :2], 0.0, 1.0)
        return g, (("points_clipped", f"{int(beyond.sum())} point(s)") if beyond.any() else None)

    def record_value(self, geometry: list, kpt_shape=None):
        """The value a record holds for the kept objects' cleaned geometry."""
        return None

    def counts(self, geometry: list) -> dict:
        """What a record's geometry adds up to, for the manifest's `stats.geometry` (summed over the records)."""
        return {}

    def summary(self, counts: dict, manifest) -> dict:
        """`fastfeed inspect`'s task facts beyond the counts."""
        return {}

    def describe(self, summary: dict) -> str | None:
        """One line for `fastfeed inspect` from `store.verify.task_summary` (None: boxes only, nothing to say)."""
        return None

    # --- augment.Labels: the field in pixels, joined, selected, mapped ---------------------------------------

    def to_pixels(self, value, scale: np.ndarray):
        """A record's normalised value scaled by `scale` ([w, h]) to pixels of a decode (a new array)."""
        return np.asarray(value, np.float32) * scale

    def join(self, values: list):
        return np.concatenate(values)

    def take(self, value, idx: np.ndarray):
        return value[idx]

    def map_points(self, value, fn):
        """`value` with every x, y replaced by fn(points [..., 2])."""
        return fn(value)

    def ultralytics_labels(self, value) -> dict:
        """A record's value as Ultralytics' dataset labels hold it (normalised: `segments`, `keypoints`)."""
        return {}

    def empty_extra(self, kpt_shape, side: int) -> np.ndarray | None:
        """The `extra` of a batch without objects (None: the task has none)."""
        return None
