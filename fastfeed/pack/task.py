"""Which task a pack stores (`--task`), from the option and the source, and what stops it: a pose pack with no
keypoint shape, oriented boxes asked of a COCO file."""

from __future__ import annotations

from .lines import Task
from .report import PackReport, Problem
from .source import PackError, Source


def resolve_task(task: str | None, source: Source, report: PackReport) -> Task:
    """`task` (None: pose when the source has a kpt_shape, i.e. data.yaml's, else detect) checked against the
    source; a pose set without flip_idx is noted once (`no_flip_idx`)."""
    name = task or ("pose" if source.kpt_shape else "detect")
    where = ", ".join(str(a) for a in source.annotation_files) or f"{source.root}'s data.yaml"
    if name == "pose" and not source.kpt_shape:
        raise PackError(f"--task pose, but {where} gives no keypoint shape: add `kpt_shape: [K, 3]` (and "
                        "`flip_idx`) to data.yaml, or give COCO's person_keypoints JSON")
    if name == "obb" and source.format == "coco":
        raise PackError(f"--task obb reads YOLO-OBB labels (cls x1 y1 ... x4 y4); {where} is COCO, which has no "
                        "oriented boxes: pack it with --task detect or segment")
    if name == "pose" and source.flip_idx is None:
        report.add(Problem("no_flip_idx", where, f"kpt_shape {source.kpt_shape}"))
    return Task(name, tuple(source.kpt_shape) if source.kpt_shape else None)
