"""The checks that stop a pack whose boxes could not train, each saying what was found and what to do
(docs/design.md, "A pack without labels stops"; each case in docs/inputs.md, "Folders").

`check_labelled` (before any image is read: under 1% with a label), `check_coco_units` (when the annotations are
read: every COCO bbox in 0..1, `--coco-boxes normalized`), `check_kept` (after the workers, before publishing:
under 1% kept a box; `--allow-background-only` lifts it and `check_labelled`), `check_dropped` (one reason over
`--max-dropped` of a split's images or boxes), `unlabelled_share` (the warning: over 10% of a YOLO split without a
label file) and `resolve_task` (the task a pack stores, `--task`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .. import formats, tasks
from .layout import jsons_in, layouts
from .lines import Task
from .report import ERRORS, IMAGE_REJECTS, PackReport, Problem
from .source import PackError, Source

COCO_BOX_UNITS = ("pixels", "normalized")
_FITS = 1.001        # a normalised bbox may overshoot 1 by float noise
_MIN_SIDE = 32       # px: a set whose every box fits in 1x1 px on images this large or larger is not in pixels
_REASONS_SHOWN = 3
LABELLED_MIN = 0.01   # a pack in which fewer images than this share have labels (or kept boxes) stops
MAX_DROPPED = 0.10    # --max-dropped: the share of a split's images, or of its boxes, one reason may drop
UNLABELLED_WARN = 0.10   # a YOLO split with more images than this share without a label file is warned of


def check_labelled(source: Source) -> None:
    """Stop a pack in which no image, or almost none (< 1%), has a label: that is a layout mistake (labels in
    another folder, a COCO set read as YOLO), not a dataset, and would train with a box loss of 0. The error
    names where the labels were looked for and the layouts fastfeed reads; `--allow-background-only` packs
    a set that really is all background."""
    n = len(source.items)
    if not n:
        return
    if source.format == "yolo":
        labelled = sum(it.label_path is not None for it in source.items)
    else:
        labelled = sum(len(it.coco_xywh) > 0 or len(it.coco_classes) > 0 for it in source.items)
    if labelled >= LABELLED_MIN * n:
        return
    share = "none" if not labelled else f"only {labelled}"
    under = f" (under {LABELLED_MIN:.0%})" if labelled else ""
    if source.format == "yolo":
        msg = _yolo_unlabelled(source, share, under)
    else:
        ann = source.annotation_files[0] if source.annotation_files else "the annotation file"
        msg = (f"{share} of the {n} images listed in {ann} has a box{under}: the file holds no usable annotation "
               "for the others (the problems above list annotations that were dropped)")
    raise PackError(f"no labels: {msg}.\nLayouts fastfeed reads:\n{layouts()}\n"
                    "If this set really is all background (no boxes at all), pass --allow-background-only.")


def _yolo_unlabelled(source: Source, share: str, under: str) -> str:
    first, labels = source.items[0], source.labels_dir
    images_dir = first.path.parents[len(Path(first.name).parts) - 1]   # item names are relative to it
    msg = f"{share} of the {len(source.items)} images in {images_dir} has a label file{under}"
    if labels is None:
        return msg
    example = (labels / first.name).with_suffix(".txt")
    msg += f"; fastfeed looked for {labels}/<image name>.txt (e.g. {example})"
    if not labels.is_dir():
        msg += f", and {labels} does not exist"
    elif unmatched := sum(p.reason == "label_without_image" for p in source.problems):
        msg += f"; the {unmatched} label file(s) there match no image's name"
    root = Path(source.root)
    if coco := sorted((root / "annotations").glob("instances_*.json")) or jsons_in(root):   # no folder: no file
        msg += f"; {coco[0]} suggests a COCO dataset: drop --format yolo (or pass --format coco)"
    return msg


def _image_sides(boxed: list, limit: int = 5) -> list[int]:
    """The smaller side of the images with boxes (`boxed`): the JSON's, else (none given) a few files' headers."""
    sides = [min(it.ann_size) for it in boxed if it.ann_size is not None]
    for it in boxed[:limit] if not sides else ():
        try:
            data = it.path.read_bytes()
            hw = formats.header_size(data, formats.image_format(data))
        except Exception:   # a missing or broken file is rejected by name when it is packed
            continue
        if hw is not None:
            sides.append(min(hw))
    return sides


def check_coco_units(source: Source, units: str) -> None:
    """Stop a COCO set whose bboxes are not in the unit `units` (`--coco-boxes`) says."""
    if source.format != "coco":
        if units != "pixels":
            raise PackError(f"--coco-boxes {units} is for a COCO JSON; {source.root} is read as {source.format.upper()} "
                            "(YOLO labels are always fractions of the image): drop --coco-boxes")
        return
    boxed = [it for it in source.items if it.coco_xywh is not None and len(it.coco_xywh)]
    if not boxed:
        return
    b = np.concatenate([it.coco_xywh for it in boxed])
    fits = (b >= 0).all(1) & (b[:, 0] + b[:, 2] <= _FITS) & (b[:, 1] + b[:, 3] <= _FITS)
    ann = ", ".join(str(a) for a in source.annotation_files) or "the annotations"
    if units == "normalized":
        if fits.mean() < 0.5:
            raise PackError(f"--coco-boxes normalized, but {int((~fits).sum())} of the {len(b)} bboxes in {ann} reach "
                            "beyond 1: they are in pixels; drop --coco-boxes")
        return
    sides = _image_sides(boxed)
    if not fits.all() or not sides or min(sides) < _MIN_SIDE:
        return
    first = boxed[0]
    raise PackError(
        f"the bboxes in {ann} look normalised to 0..1, not in pixels: all {len(b)} fit inside 1x1 pixel on images "
        f"{min(sides)} px or more across (e.g. {first.name}: bbox {[round(float(v), 4) for v in first.coco_xywh[0]]}); "
        "COCO bboxes are [x, y, width, height] in pixels. Pack with --coco-boxes normalized to read them as fractions "
        "of each image's width and height (or re-export the set in pixels)")


def _shown(path, root) -> str:
    try:
        return os.path.relpath(path, root)
    except ValueError:
        return str(path)


def _yolo_found(source: Source) -> list[str]:
    """What the label files hold, read again for the message only: empty files, pixels."""
    files = [it.label_path for it in source.items if it.label_path is not None]
    empty, pixels, numeric = 0, [], 0
    for path in files:
        try:
            lines = [ln.strip() for ln in path.read_text(encoding="utf-8-sig").splitlines()]
        except (OSError, UnicodeDecodeError):
            continue   # unreadable_label, among the reasons
        if not any(lines):
            empty += 1
        for k, line in enumerate(lines, 1):
            where = f"{_shown(path, source.root)}:{k}: {line[:60]!r}"
            try:
                vals = [float(v) for v in line.split()]
            except ValueError:
                continue
            if len(vals) == 5:
                numeric += 1
                if max(abs(v) for v in vals[1:]) > 1.5:
                    pixels.append(where)
    found = []
    if len(source.items) > len(files):
        found.append(f"{len(source.items) - len(files)} image(s) have no label file")
    if empty:
        found.append(f"{empty} of the {len(files)} label files are empty")
    if pixels and 2 * len(pixels) >= numeric:
        found.append(f"the labels look like pixels, YOLO wants 0..1: {len(pixels)} of {numeric} lines have coordinates "
                     f"over 1 (e.g. {pixels[0]}); divide cx and w by the image's width, cy and h by its height")
    return found


def _coco_found(source: Source) -> list[str]:
    n = sum(len(it.coco_xywh) for it in source.items if it.coco_xywh is not None)
    ann = ", ".join(str(a) for a in source.annotation_files) or "the annotations"
    return [f"{ann} lists {n} usable annotation(s) for its {len(source.items)} images"]


def check_kept(source: Source, packed: int, boxed: int, report: PackReport) -> None:
    """Stop a pack in which under 1% of the `packed` images kept a box (`boxed`): it would train with a box loss
    of 0. Says what the labels held and the most frequent reasons boxes were dropped, with an example each."""
    if not packed or boxed >= LABELLED_MIN * packed:
        return
    share = "none" if not boxed else f"only {boxed}"
    under = f" (under {LABELLED_MIN:.0%})" if boxed else ""
    found = _yolo_found(source) if source.format == "yolo" else _coco_found(source)
    seen = [(n, r) for r, n in report.counts.items() if n and (r in ERRORS or r == "crowd")]
    top = sorted(seen, key=lambda x: (-x[0], x[1]))[:_REASONS_SHOWN]
    reasons = "; ".join(f"{r} x{n} (e.g. {report.examples[r][0]})" for n, r in top)
    found += [f"top reasons boxes or images were dropped: {reasons}"] if reasons else []
    raise PackError(f"no boxes: {share} of the {packed} images packed kept a box{under}, so a model would train with a "
                    f"box loss of 0; {'; '.join(found)}. Nothing was written; fix the labels, or pass "
                    "--allow-background-only if this set really is all background", report)


_FIXES = {"unknown_class": "give data.yaml's `names` every class the labels use (or correct the ids)",
          "box_far_outside": "write the labels as fractions of the image (0..1), not pixels"}


def check_dropped(packed: int, boxes: int, report: PackReport, limit: float) -> None:
    """Stop a pack that dropped over `limit` of its images (`packed` plus those rejected), or of its boxes
    (`boxes` kept plus those dropped), for one reason; the error names the reason, its share and an example."""
    lost = {r: n for r, n in report.counts.items() if n and r in ERRORS and r != "label_without_image"}
    images = packed + report.images_rejected
    boxes += sum(n for r, n in lost.items() if r not in IMAGE_REJECTS)
    for reason, n in sorted(lost.items(), key=lambda x: (-x[1], x[0])):
        unit, total = ("images", images) if reason in IMAGE_REJECTS else ("boxes", boxes)
        if n > limit * total:
            raise PackError(
                f"too much dropped: {reason} took {n} of the split's {total} {unit} ({n / total:.0%}, over "
                f"--max-dropped {limit:g}): {ERRORS[reason]}; e.g. {report.examples[reason][0]}. Nothing was "
                f"written; {_FIXES.get(reason, 'fix them (the first of each reason is shown above)')}, or pass "
                f"--max-dropped {min(1.0, round(n / total + 0.005, 2)):g} to pack without them", report)


def unlabelled_share(source: Source) -> str | None:
    """The warning when over `UNLABELLED_WARN` of a YOLO split's images have no label file: share and example."""
    missing, n = [it for it in source.items if it.label_path is None], len(source.items)
    if source.format != "yolo" or len(missing) <= UNLABELLED_WARN * n:
        return None
    first, labels = missing[0], source.labels_dir
    where = f", e.g. {first.path}" + (f" has no {(labels / first.name).with_suffix('.txt')}" if labels else "")
    return (f"{len(missing)} of the {n} images ({len(missing) / n:.0%}) have no label file{where}: they are packed "
            "as background (no object of any class); if they show objects, label them (an empty .txt file says an "
            "image is background on purpose)")


def resolve_task(task: str | None, source: Source, report: PackReport) -> Task:
    """`task` (None: pose when the source has a kpt_shape, i.e. data.yaml's, else detect) checked against the
    source; a pose set without flip_idx is noted once (`no_flip_idx`)."""
    spec = tasks.get(task) if task else next(t for t in tasks.REGISTRY if t.keypoints == bool(source.kpt_shape))
    name = spec.name
    where = ", ".join(str(a) for a in source.annotation_files) or f"{source.root}'s data.yaml"
    if spec.keypoints and not source.kpt_shape:
        raise PackError(f"--task {name}, but {where} gives no keypoint shape: add `kpt_shape: [K, 3]` (and "
                        "`flip_idx`) to data.yaml, or give COCO's person_keypoints JSON")
    if not spec.from_coco and source.format == "coco":
        can = " or ".join(t.name for t in tasks.REGISTRY if t.from_coco and not t.keypoints)
        raise PackError(f"--task {name} reads YOLO labels (its {spec.words} are not a COCO field); {where} is COCO: "
                        f"pack it with --task {can}")
    if spec.keypoints and source.flip_idx is None:
        report.add(Problem("no_flip_idx", where, f"kpt_shape {source.kpt_shape}"))
    return Task(name, tuple(source.kpt_shape) if source.kpt_shape else None)
