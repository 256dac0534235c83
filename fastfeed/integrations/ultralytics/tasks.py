"""Ultralytics' segment, pose and OBB trainers fed by fastfeed: `FastfeedMixin` (trainer.py) before each of them
(docs/design.md, 'Ultralytics through a subclass, never a copy').

    YOLO("yolov8n-seg.yaml").train(data="data.yaml", trainer=FastfeedSegmentationTrainer, imgsz=640)
    YOLO("yolov8n-pose.yaml").train(data="data.yaml", trainer=FastfeedPoseTrainer, imgsz=640)
    YOLO("yolov8n-obb.yaml").train(data="data.yaml", trainer=FastfeedOBBTrainer, imgsz=1024)

Each packs and accepts only its task's stores; the pose trainer takes the keypoint shape and flip order of the
store, which must be data.yaml's.
"""

from __future__ import annotations

from ultralytics.models.yolo.obb import OBBTrainer
from ultralytics.models.yolo.pose import PoseTrainer
from ultralytics.models.yolo.segment import SegmentationTrainer

from .trainer import FastfeedMixin


class FastfeedSegmentationTrainer(FastfeedMixin, SegmentationTrainer):
    """Ultralytics' SegmentationTrainer fed by fastfeed from a segment store."""

    fastfeed_task = "segment"


class FastfeedPoseTrainer(FastfeedMixin, PoseTrainer):
    """Ultralytics' PoseTrainer fed by fastfeed from a pose store (kpt_shape and flip_idx: data.yaml's)."""

    fastfeed_task = "pose"


class FastfeedOBBTrainer(FastfeedMixin, OBBTrainer):
    """Ultralytics' OBBTrainer fed by fastfeed from an OBB store (rotated boxes)."""

    fastfeed_task = "obb"
