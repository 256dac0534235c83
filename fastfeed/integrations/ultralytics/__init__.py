"""Use fastfeed's loaders inside Ultralytics' trainer (`pip install -e '.[ultralytics]'`):

    from ultralytics import YOLO
    from fastfeed.integrations.ultralytics import FastfeedTrainer

    YOLO("yolov8n.yaml").train(data="data.yaml", trainer=FastfeedTrainer, epochs=100, imgsz=640, batch=16)
    YOLO("yolov8n-seg.yaml").train(data="data.yaml", trainer=FastfeedSegmentationTrainer)   # and Pose, OBB
"""

try:
    import ultralytics  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fastfeed.integrations.ultralytics needs Ultralytics: pip install -e '.[ultralytics]' in the fastfeed checkout "
                      "(see the README's 'Use with Ultralytics' for the torch/torchvision/OpenCV builds)") from e

from .feed import FastfeedTrainLoader
from .resume import Preempted
from .trainer import (
    FastfeedMixin,
    FastfeedOBBTrainer,
    FastfeedPoseTrainer,
    FastfeedSegmentationTrainer,
    FastfeedTrainer,
)

__all__ = ["FastfeedMixin", "FastfeedOBBTrainer", "FastfeedPoseTrainer", "FastfeedSegmentationTrainer",
           "FastfeedTrainLoader", "FastfeedTrainer", "Preempted"]
