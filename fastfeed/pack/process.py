"""The per-image work of a pack, run in worker processes: read, check, convert, encode one record; no one
file can stop the pack.

A record holds the source bytes when both `fastfeed.codec` and DALI decode them (`formats.STORABLE`), else the image is
transcoded to PNG or rejected `unsupported_format` (docs/inputs.md, "Image formats"); an image over --max-pixels is
refused from its header. A `codec.DecodeError` rejects the file as `corrupt_image`; any other exception as
`check_failed` with its type and message, logged with its traceback: unexpected, so named rather than hidden.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

import cv2
import numpy as np

from .. import codec, exif, formats, tasks
from ..augment.boxes import cxcywh_to_xyxy
from ..store.record import crc32, encode_record
from .clean import clean_boxes as _clean_boxes
from .clean import clean_geometry
from .coco_geometry import keypoint_values, segmentation_points
from .lines import LabelsFailed, Task, parse_label
from .report import Problem
from .source import Item

log = logging.getLogger(__name__)

# Pillow's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS): 1024 * 1024 * 1024 // 4 // 3.
DEFAULT_MAX_PIXELS = 89_478_485


@dataclass(slots=True)
class Checked:
    """What the record of a good image holds."""

    orig: tuple[int, int]                 # (h, w) of the source image in the frame its boxes are in
    size: tuple[int, int]                 # (h, w) of the stored image, in that frame
    codec: str                            # the record's codec: 'jpeg' | 'cv2' | 'raw' (or the --store mode)
    payload: bytes | None = None          # --store original: the source bytes, or PNG for a transcoded image
    pixels: np.ndarray | None = None      # --store jpeg/raw: RGB fitted to --max-side
    notes: list[Problem] = field(default_factory=list)
    orientation: int = 1                  # what Record.decode applies to the payload (exif.payload_orientation)
    tag: int = 1                          # the file's EXIF orientation tag


class _TooLarge(Exception):
    pass


def _limit(hw, max_pixels: int, when: str) -> None:
    h, w = hw
    if h * w > max_pixels:
        raise _TooLarge(f"{w}x{h} = {h * w / 1e6:.1f} MP ({when}) is over --max-pixels {max_pixels} "
                        f"({max_pixels / 1e6:.1f} MP); raise --max-pixels if the image is genuine")


_SAME_SIZE = {2: "mirrored", 3: "upside down", 4: "mirrored upside down"}


def _orientation_detail(tag: int, mode: str) -> str:
    """The note's detail; for the orientations that keep the image's size (2-4) under --exif apply, plainly
    which frame the boxes were taken in, and when --exif ignore is right (nothing in the file can tell)."""
    if mode != "apply" or tag not in _SAME_SIZE:
        return f"EXIF orientation {tag}"
    return (f"EXIF orientation {tag} ({_SAME_SIZE[tag]}, the same size in both frames): its boxes were taken in the "
            "upright frame, as labelling tools and Ultralytics show the image; if they were drawn on the raw, "
            "unturned pixels (some COCO exports), pack with --exif ignore")


def _check(data, name: str, cfg) -> Checked:
    fmt = formats.image_format(data)
    hw = formats.header_size(data, fmt)
    if hw is not None:
        _limit(hw, cfg.max_pixels, "from the header, not decoded")
    if fmt == "tiff" and formats.is_float_tiff(data):
        raise formats.UnsupportedFormat("32-bit float TIFF: OpenCV does not decode float samples to 8-bit "
                                        "colour; convert it to an 8- or 16-bit TIFF or PNG")
    if fmt in formats.STORABLE:
        container, colour, bits = codec.describe(data)
        notes = [] if container == "jpeg" else [Problem("converted_format", name, fmt)]
        notes += [Problem(f"converted_{colour}", name)] if colour in ("grayscale", "cmyk", "rgba") else []
        notes += [Problem("converted_16bit", name)] if bits == 16 else []
        tag = exif.exif_orientation(data)
        turn = exif.payload_orientation(data, tag, cfg.exif == "apply")
        if tag != 1:
            notes.append(Problem("oriented" if cfg.exif == "apply" else "orientation_ignored", name,
                                 _orientation_detail(tag, cfg.exif)))
        if cfg.store == "original":   # the source bytes, and the turn that Record.decode applies to them
            size, how = codec.check_decodable(data, full=cfg.check == "full")
            if hw is None:
                _limit(size, cfg.max_pixels, "decoded")
            size = exif.oriented_size(*size, turn)
            return Checked(size, size, how, payload=data, notes=notes, orientation=turn, tag=tag)
        img, orig, how = codec.decode_fit(data, cfg.max_side)   # jpeg/raw: the pixels are stored turned
        _limit(orig, cfg.max_pixels, "decoded")
        img = exif.apply_orientation(img, turn)
        return Checked(exif.oriented_size(*orig, turn), img.shape[:2], cfg.store, pixels=img, notes=notes, tag=tag)
    img, decoder = formats.decode_other(data, fmt)
    orig = img.shape[:2]
    _limit(orig, cfg.max_pixels, "decoded")
    if cfg.store == "original":
        note = Problem("transcoded", name, f"{fmt} decoded by {decoder}, stored as PNG")
        return Checked(orig, orig, "cv2", payload=formats.encode_png(img), notes=[note])
    img = codec.resize_to(img, codec.fit_size(*orig, cfg.max_side))
    note = Problem("transcoded", name, f"{fmt} decoded by {decoder}")
    return Checked(orig, img.shape[:2], cfg.store, pixels=img, notes=[note])


def check_image(data, name: str, cfg) -> tuple[Checked | None, Problem | None]:
    """(what the record holds, None) for a good image; (None, the rejection) for any other."""
    level = cv2.utils.logging.setLogLevel(0)   # 0, silent: no OpenCV `[ERROR] imdecode_` line for a file named here
    try:
        return _check(data, name, cfg), None
    except formats.UnsupportedFormat as e:
        reason, err = "unsupported_format", e
    except (_TooLarge, MemoryError) as e:
        reason, err = "image_too_large", e
    except codec.DecodeError as e:
        reason, err = "corrupt_image", e
    except Exception as e:  # anything else on one file is that file's rejection, named, never the pack's end
        log.warning("unexpected error while checking %s", name, exc_info=True)
        reason, err = "check_failed", e
    finally:
        cv2.utils.logging.setLogLevel(level)
    own = isinstance(err, (_TooLarge, formats.UnsupportedFormat))  # messages written for the user as they are
    return None, Problem(reason, name, (str(err) if own else f"{type(err).__name__}: {err}")[:300])


STORE_MODES = ("original", "jpeg", "raw")
EXIF_MODES = ("apply", "ignore")


@dataclass(slots=True)
class Result:
    name: str
    record: bytes | None = None          # None: image rejected (the reason is in problems)
    problems: list[Problem] = field(default_factory=list)
    classes: np.ndarray | None = None    # training classes, for the manifest's statistics
    n_crowd: int = 0
    orig_size: tuple[int, int] = (0, 0)
    size: tuple[int, int] = (0, 0)
    orientation: int = 1                 # the record's (1: its pixels decode upright as they are)
    source_crc: int = 0                  # CRC32 of the source file (+ its label file), for the source fingerprint
    exif_frame: str | None = None        # COCO image with an EXIF orientation: the frame its width/height show
    geometry: dict = field(default_factory=dict)   # counts for the manifest (the task's `counts`)


def _coco_geometry(item: Item, keep, size, unit, task: Task, problems: list[Problem]) -> list:
    """The kept annotations' geometry (None for a dropped object or a crowd region), divided by `unit` (w, h)."""
    kept = [g for g, k in zip(item.coco_geometry, keep) if k]
    pose = tasks.get(task.name).keypoints
    return [None if crowd else keypoint_values(value, unit, task.kpt_shape[0], item.name, ann_id, problems) if pose
            else segmentation_points(value, size, unit, item.name, ann_id, problems)
            for (ann_id, value), crowd in zip(kept, item.coco_crowd[keep])]


def _labels(item: Item, size, nc: int | None, problems: list[Problem], cfg, task: Task):
    """The item's boxes as normalised xyxy, with classes, crowd flags and (segment, pose, obb) the training
    objects' geometry, each checked by `clean.py`'s rule."""
    h, w = size
    where = geometry = None
    if item.coco_xywh is None:  # YOLO; no label file means a background image
        if item.label_path is None:
            cxcywh, classes, geometry = np.zeros((0, 4)), np.zeros(0, np.int64), []
        else:
            cxcywh, classes, found, where, geometry = parse_label(item.label_path, item.name, nc, task)
            problems.extend(found)
        xyxy = cxcywh_to_xyxy(cxcywh)   # normalised: width = height = 1
        crowd = np.zeros(len(classes), bool)
    else:
        b = item.coco_xywh
        sw, sh = (1, 1) if cfg.coco_boxes == "normalized" else (w, h)   # --coco-boxes normalized: already fractions
        xyxy = np.stack([b[:, 0] / sw, b[:, 1] / sh, (b[:, 0] + b[:, 2]) / sw, (b[:, 1] + b[:, 3]) / sh], 1)
        classes, crowd = item.coco_classes, item.coco_crowd
    xyxy, classes, crowd, keep = _clean_boxes(xyxy.reshape(-1, 4), classes, crowd, size, item.name, problems, where)
    if tasks.get(task.name).field is None:
        return xyxy, classes, crowd, None
    geometry = (_coco_geometry(item, keep, size, (sw, sh), task, problems) if item.coco_xywh is not None
                else [g for g, k in zip(geometry, keep) if k])
    where = [x for x, k in zip(where, keep) if k] if where else None
    dropped = np.array([g is None and not c for g, c in zip(geometry, crowd)], bool)   # dropped by name above
    train = np.flatnonzero(~crowd & ~dropped)
    kept, cleaned = clean_geometry(task.name, [geometry[i] for i in train], classes[train], size, item.name, problems,
                                   [where[i] for i in train] if where else None)
    final = np.zeros(len(classes), bool)
    final[train[kept]] = True
    final |= crowd
    return xyxy[final], classes[final], crowd[final], cleaned


def _mismatch(ann, orig, tag: int, mode: str) -> str:
    """The size_mismatch detail; when the annotation has the other frame of an EXIF-turned image, says so."""
    text = f"annotation says {ann[1]}x{ann[0]} (w x h), the image is {orig[1]}x{orig[0]}"
    if tag >= 5 and tuple(ann) == (orig[1], orig[0]):
        if mode == "apply":
            return (f"{text} shown upright (EXIF orientation {tag}, as labelling tools and Ultralytics show it); the "
                    "annotation matches the turned, stored frame: if its boxes were drawn on the raw pixels, "
                    "pack with --exif ignore")
        return (f"{text} in its stored frame (--exif ignore); the annotation matches the frame its EXIF orientation "
                f"{tag} turns it to: pack with --exif apply (the default)")
    return text


def _annotated_frame(ann, upright, tag: int) -> str | None:
    """Which frame a COCO width/height shows for an image of EXIF orientation `tag` taken upright: 'upright',
    'raw' (5-8: the turned, stored frame), 'either' (2-4: mirrored or upside down, the same size both ways)."""
    if tag < 5:
        return "either" if ann == upright else None
    return "upright" if ann == upright else "raw" if ann == upright[::-1] else None


def raw_annotation_verdict(frames, annotation_files) -> str | None:
    """Why a pack stops, when most of a COCO set's EXIF-turned images (5-8) have the width and height of their raw
    frame: the set was annotated on the raw pixels, so its mirrored/upside-down images (2-4), whose size cannot tell,
    would be packed with their boxes mirrored or upside down. `frames`: a Counter of `Result.exif_frame`."""
    raw, upright, either = frames["raw"], frames["upright"], frames["either"]
    if raw == 0 or raw <= upright:
        return None
    name = ", ".join(p.name for p in annotation_files) or "the annotations"
    return (f"{name} was annotated on the raw pixels: {raw} of the {raw + upright} images with EXIF orientation 5-8 "
            "have the width/height of their raw, unturned pixels (rejected as size_mismatch), so the boxes of its "
            f"{either} image(s) with orientation 2-4 (mirrored or upside down: the same size in both frames) would be "
            "packed mirrored or upside down. Nothing was written; pack with --exif ignore (every box in the frame the "
            "pixels are stored in, as drawn)")


def process_item(item: Item, cfg, task: Task, nc: int | None, data=None) -> Result:
    """Read (or take `data`: the image's bytes, read from a bucket; a Problem: why they could not be), check and
    encode one image, as `cfg` (the `PackConfig`: how pixels are stored) asks, with the labels of `task`."""
    res = Result(item.name, problems=list(item.problems))
    if isinstance(data, Problem):
        res.problems.append(data)
        return res
    try:
        data = item.path.read_bytes() if data is None else data
    except FileNotFoundError:
        res.problems.append(Problem("missing_image", item.name, f"{item.path} does not exist"))
        return res
    except OSError as e:
        res.problems.append(Problem("unreadable_image", item.name, str(e)))
        return res
    res.source_crc = crc32(data)
    if item.label_path is not None:  # a YOLO label file is part of the source too
        with contextlib.suppress(OSError):   # parse_label reports an unreadable label file
            res.source_crc = crc32(item.label_path.read_bytes(), res.source_crc)
    checked, rejected = check_image(data, item.name, cfg)
    if rejected is not None:
        res.problems.append(rejected)
        return res
    orig, size, how = checked.orig, checked.size, checked.codec
    if item.ann_size is not None and checked.tag != 1 and cfg.exif == "apply":
        res.exif_frame = _annotated_frame(tuple(item.ann_size), tuple(orig), checked.tag)
    if item.ann_size is not None and tuple(item.ann_size) != tuple(orig):
        res.problems.append(Problem("size_mismatch", item.name, _mismatch(item.ann_size, orig, checked.tag, cfg.exif)))
        return res
    res.problems.extend(checked.notes)
    try:
        xyxy, classes, crowd, geometry = _labels(item, orig, nc, res.problems, cfg, task)
    except LabelsFailed as e:   # not packed as a background image: its objects are in the file that failed
        res.problems.append(e.problem)
        return res
    res.problems.extend(Problem("crowd", item.name) for _ in range(int(crowd.sum())))
    if not (~crowd).any():
        res.problems.append(Problem("background", item.name))

    payload = (checked.payload if cfg.store == "original" else codec.encode_jpeg(checked.pixels, cfg.quality)
               if cfg.store == "jpeg" else np.ascontiguousarray(checked.pixels).tobytes())
    res.record = encode_record(
        codec=how, height=size[0], width=size[1], orig_height=orig[0], orig_width=orig[1],
        image_id=item.image_id, file_name=item.name, boxes=xyxy[~crowd], classes=classes[~crowd],
        crowd_boxes=xyxy[crowd], crowd_classes=classes[crowd], payload=payload, orientation=checked.orientation,
        task=task.name, geometry=None if geometry is None else tasks.get(task.name).record_value(geometry, task.kpt_shape))
    res.geometry = tasks.get(task.name).counts(geometry or [])
    res.classes, res.n_crowd, res.orig_size, res.size = classes[~crowd], int(crowd.sum()), orig, size
    res.orientation = checked.orientation
    return res
