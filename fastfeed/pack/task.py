"""Which task a pack stores (`--task`), from the option and the source, and what stops it: a pose pack with no
keypoint shape, oriented boxes asked of a COCO file."""

from __future__ import annotations

from .. import tasks
from .lines import Task
from .report import PackReport, Problem
from .source import PackError, Source


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
