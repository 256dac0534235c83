"""Read a COCO detection dataset: `instances_<split>.json` plus its images folder."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from .. import tasks
from ..checks import is_int
from .report import Problem
from .source import Item, PackError, Source, list_folder

try:  # 2x faster on the hundreds of MB of a full COCO annotation file
    from orjson import JSONDecodeError as _JSONError
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    from json import JSONDecodeError as _JSONError
    from json import loads as _loads


def _load_json(ann_file: Path) -> dict:
    try:
        data = _loads(ann_file.read_bytes())
    except FileNotFoundError:
        raise PackError(f"annotation file {ann_file} not found") from None
    except (_JSONError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PackError(f"{ann_file} is not valid JSON: {e}. Fix or re-export the annotation file.") from None
    if not isinstance(data, dict):
        raise PackError(f"{ann_file}: expected a JSON object with 'images', 'annotations', 'categories'")
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise PackError(f"{ann_file}: missing or non-list '{key}'; a COCO detection file needs "
                            "'images', 'annotations' and 'categories' lists")
    return data


def _categories(cats: list, ann_file: Path) -> tuple[list[str], list[int], dict[int, int]]:
    """Class names and source ids, ordered by id; map source id -> contiguous class."""
    seen = {}
    for c in cats:
        if not isinstance(c, dict) or not is_int(c.get("id")):
            raise PackError(f"{ann_file}: category entry without an integer 'id': {str(c)[:120]}")
        if c["id"] in seen:
            raise PackError(f"{ann_file}: category id {c['id']} appears twice")
        seen[c["id"]] = str(c.get("name", c["id"]))
    if not seen:
        raise PackError(f"{ann_file}: 'categories' is empty; nothing to train on")
    ids = sorted(seen)
    return [seen[i] for i in ids], ids, {cid: k for k, cid in enumerate(ids)}


_NUMBER = (int, float)


def _valid_bbox(b) -> bool:
    """Four finite numbers (bool is not a number here); called once per annotation, so kept lean."""
    return (type(b) is list and len(b) == 4 and type(b[0]) in _NUMBER and type(b[1]) in _NUMBER
            and type(b[2]) in _NUMBER and type(b[3]) in _NUMBER and math.isfinite(b[0] + b[1] + b[2] + b[3]))


def _bbox_from_text(b) -> list[float] | None:
    """A bbox whose values are numeric strings (some exporters write "12.5"), as numbers, the way Ultralytics'
    `convert_coco` reads them (numpy converts); None when it is not 4 finite numbers that way either."""
    if type(b) is not list or len(b) != 4 or not any(type(v) is str for v in b):
        return None
    try:
        vals = [float(v) if type(v) is str else v for v in b]
    except ValueError:
        return None
    return vals if _valid_bbox(vals) else None


def _unique_images(entries: list[dict]) -> tuple[dict[int, dict], dict[int, int], tuple]:
    """Image entries by id, leaving out every entry that shares its id or its file with another (its
    annotations could not be attributed); returns (images, {id of a left-out entry: 0}) for counting
    the annotations dropped with them, and (the entries by id, by file) for naming them."""
    by_id, by_file = defaultdict(list), defaultdict(list)
    for im in entries:
        by_id[im["id"]].append(im)
        by_file[os.path.normpath(im["file_name"])].append(im)
    images = {im["id"]: im for im in entries
              if len(by_id[im["id"]]) == len(by_file[os.path.normpath(im["file_name"])]) == 1}
    return images, {im["id"]: 0 for im in entries if im["id"] not in images}, (by_id, by_file)


def _duplicate_problems(entries: list[dict], dropped: dict[int, int], by_id: dict, by_file: dict) -> list[Problem]:
    problems = []
    for im in entries:
        if (i := im["id"]) not in dropped:
            continue
        if len(by_id[i]) > 1:
            names = ", ".join(o["file_name"] for o in by_id[i][:5])
            problems.append(Problem("duplicate_image_id", im["file_name"], (
                f"image id {i} is given to {len(by_id[i])} images ({names}); its {dropped[i]} annotation(s) "
                "cannot be attributed: give every image entry its own id")))
        else:
            same = by_file[os.path.normpath(im["file_name"])]
            problems.append(Problem("duplicate_file_name", im["file_name"], (
                f"listed by {len(same)} image entries (ids {', '.join(str(o['id']) for o in same[:5])}); entry {i} "
                f"holds {dropped[i]} of its annotations, only part of its boxes: merge the entries into one")))
    return problems


def read_coco(ann_file: Path, images_dir: Path, split: str | None = None, root: Path | None = None,
              task: str = "detect") -> Source:
    """`task`: segment or pose keep each annotation's `segmentation` or `keypoints` (checked in the workers)."""
    data = _load_json(ann_file)
    names, cat_ids, cat_map = _categories(data["categories"], ann_file)
    spec = tasks.get(task)
    kpt_shape, flip_idx = coco_pose(data["categories"], ann_file) if spec.keypoints else (None, None)
    extra = spec.coco_field
    problems: list[Problem] = []
    entries, lost = [], []   # lost: entries with a file name but an id that is not an integer ("12"), named once
    for im in data["images"]:
        if not isinstance(im, dict) or not isinstance(f := im.get("file_name"), str) or not f or "\0" in f:
            problems.append(Problem("malformed_annotation", ann_file.name,
                                    f"image entry without a file name: {str(im)[:100]}"))
            continue
        (entries if is_int(im.get("id")) else lost).append(im)
    # Label Studio's result.json names `images/x.jpg`, beside it; a Windows export `sub\\c.jpg`, for sub/c.jpg
    first = [im["file_name"].replace("\\", "/") for im in entries[:20]]
    base = ann_file.parent if not any((images_dir / f).exists() for f in first) and any(
        (ann_file.parent / f).exists() for f in first) else images_dir
    for im in entries:
        if "\\" in (f := im["file_name"]) and not (base / f).exists() and (base / f.replace("\\", "/")).exists():
            im["file_name"] = f.replace("\\", "/")
    images, dropped, groups = _unique_images(entries)
    lost_ids = {str(im.get("id")): 0 for im in lost if im.get("id") is not None}   # -> its annotations

    per_image = defaultdict(list)
    for a in data["annotations"]:
        if isinstance(a, dict) and (i := str(a.get("image_id"))) in lost_ids and not (
                is_int(a["image_id"]) and a["image_id"] in images):
            lost_ids[i] += 1   # named once, in its image entry's rejection
            continue
        if not isinstance(a, dict) or not isinstance(a.get("image_id"), int):  # a list here used to crash the pack
            problems.append(Problem("malformed_annotation", ann_file.name,
                                    f"annotation without an integer image_id: {str(a)[:100]}"))
            continue
        if a["image_id"] in dropped:
            dropped[a["image_id"]] += 1
            continue
        im = images.get(a["image_id"])
        if im is None:
            problems.append(Problem("orphan_annotation", ann_file.name,
                                    f"annotation {a.get('id')} refers to image id {a['image_id']}"))
            continue
        per_image[a["image_id"]].append(a)

    problems += _duplicate_problems(entries, dropped, *groups) + [Problem("malformed_annotation", im["file_name"], (
        f"image id {im.get('id')!r} is not an integer: COCO image ids (and annotations' image_id) must be integers; "
        f"its {lost_ids.get(str(im.get('id')), 0)} annotation(s) dropped with it")) for im in lost]
    items = []
    for image_id in sorted(images):
        im = images[image_id]
        item = Item(path=base / im["file_name"], name=im["file_name"], image_id=image_id)
        w, h = im.get("width"), im.get("height")
        if isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0:
            item.ann_size = (h, w)
        boxes, classes, crowd, geometry = [], [], [], []
        for a in per_image.get(image_id, ()):
            bbox = a.get("bbox")
            if not _valid_bbox(bbox):
                if (bbox := _bbox_from_text(bbox)) is None:
                    item.problems.append(Problem("malformed_annotation", im["file_name"],
                                                 f"annotation {a.get('id')}: bbox {str(a.get('bbox'))[:60]} is not 4 numbers"))
                    continue
                item.problems.append(Problem("bbox_as_text", im["file_name"],
                                             f"annotation {a.get('id')}: bbox {str(a.get('bbox'))[:60]}"))
            if not isinstance(cat := a.get("category_id"), (int, float)) or cat not in cat_map:   # a list: unhashable
                item.problems.append(Problem("unknown_category", im["file_name"],
                                             f"annotation {a.get('id')}: category_id {a.get('category_id')}"))
                continue
            boxes.append(bbox)
            classes.append(cat_map[a["category_id"]])
            crowd.append(bool(a.get("iscrowd", 0)))
            geometry.append((a.get("id"), a.get(extra)) if extra else None)
        item.coco_geometry = geometry if extra else None
        item.coco_xywh = np.asarray(boxes, np.float64).reshape(-1, 4)
        item.coco_classes = np.asarray(classes, np.int64)
        item.coco_crowd = np.asarray(crowd, bool)
        items.append(item)

    listed = {os.path.normpath(im["file_name"]) for im in entries + lost}
    if base.is_dir():
        listing = list_folder(base)
        problems += listing.repeats
        names_there = (str(p.relative_to(base)) for p in listing.images)
        problems += [Problem("unlisted_image", name) for name in names_there if name not in listed]
    return Source("coco", root or images_dir.resolve().parent, split, items, names, cat_ids, problems, [ann_file],
                  kpt_shape=kpt_shape, flip_idx=flip_idx)


def coco_pose(cats: list, ann_file: Path) -> tuple[list[int], list[int] | None]:
    """([K, 3], flip_idx) of a COCO keypoints file: K from the categories' `keypoints` names (every category that lists
    them the same K), the flip from their names (`left_x` <-> `right_x`; None when a name has no counterpart)."""
    lists = [c["keypoints"] for c in cats if isinstance(c.get("keypoints"), list) and c["keypoints"]]
    if not lists:
        raise PackError(f"{ann_file}: no category lists 'keypoints' (their names): not a COCO keypoints file; pack "
                        "it with --task detect or segment, or give the person_keypoints JSON")
    if any(len(k) != len(lists[0]) for k in lists):
        raise PackError(f"{ann_file}: categories list {sorted({len(k) for k in lists})} keypoints: a store holds one "
                        "kpt_shape; pack the categories separately")
    kpt_names = [str(n) for n in lists[0]]
    index = {n: i for i, n in enumerate(kpt_names)}
    flip = [index.get(n.replace("left", "right", 1) if "left" in n else n.replace("right", "left", 1))
            for n in kpt_names]   # a name with neither side in it is its own counterpart
    return [len(kpt_names), 3], (None if None in flip else flip)
