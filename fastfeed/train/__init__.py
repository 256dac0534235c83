"""The bundled YOLOv3 / YOLOv3-tiny trainer (`fastfeed train`).

    from fastfeed.train import TrainConfig, train
    result = train(TrainConfig(data="coco.ff", val="val.ff", model="yolov3", imgsz=640, batch=16, epochs=300))
    result.summary            # what `fastfeed train` prints; metrics.jsonl in the run directory has the rest

Names resolve lazily: `fastfeed.train.model`, `.loss` and `.bench` need nothing but torch (a benchmark
runs them in another venv), and importing the package does not pull in the loaders or pycocotools.
"""

from importlib import import_module

_EXPORTS = {
    "bench_step": "bench", "CheckpointError": "checkpoint", "load_checkpoint": "checkpoint", "TrainConfig": "config",
    "TrainError": "device", "coco_ground_truth": "evaluate", "coco_map": "evaluate", "evaluate": "evaluate",
    "TrainingDiverged": "step", "TrainResult": "loop", "train": "loop", "MODELS": "model", "build_model": "model",
    "count_flops": "model", "count_parameters": "model",
}


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'fastfeed.train' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
