"""The bundled YOLOv3 / YOLOv3-tiny trainer (`fastfeed train`).

    from fastfeed.train import TrainConfig, train
    result = train(TrainConfig(data="coco.ff", val="val.ff", model="yolov3", imgsz=640, batch=16, epochs=300))
    result.summary            # what `fastfeed train` prints; metrics.jsonl in the run directory has the rest

model.py (the networks), loss.py (assignment + CIoU/BCE), boxes.py (IoU, NMS), optim.py (param groups,
LR schedule, EMA), config.py (TrainConfig, --hyp files), loop.py (the training loop, top to bottom),
setup.py (a run's set-up), resume.py (resume, --weights, checkpoint contents), step.py (one optimizer
step), oom.py (micro-batches, OOM replay, --batch auto), multiscale.py, norms.py (--sync-bn, --freeze-bn,
--channels-last), timing.py and metrics.py (the step's split), verdict.py (the bottleneck verdict),
report.py (log lines, metrics.jsonl, summary), guards.py (--out reuse, pace, a lost data source),
evaluate.py (COCO mAP), checkpoint.py, distributed.py
(torchrun), device.py (AMP, batches on the device), bench.py (`bench_step` for `fastfeed bench --model`).

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
