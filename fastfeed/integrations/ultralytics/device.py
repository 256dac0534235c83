"""The `device` loader inside Ultralytics' trainer (FASTFEED_LOADER=device): decode, mosaic, affine, flips and HSV on
the trainer's device. Its batches are images in [0,1] there, in the dtype the model's first layer computes in
(`training_dtype`: float32 without AMP, float16 under Ultralytics' fp16 autocast, which would cast there anyway,
bfloat16 with amp='bf16'), so `finish_batch` replaces preprocess_batch for them: no copy, no conversion, only
Ultralytics' `multi_scale` (a resize on the device, at a size drawn by fastfeed's rule within imgsz x [1 -
multi_scale, 1 + multi_scale]: the same on every rank, and after a resume). It honours what the other loaders do;
`cache=True`/'ram' becomes its VRAM cache; `mixup` it does not do: a warning names it.
"""

from __future__ import annotations

import torch

from ...train.device import resize, step_size
from .args import RAM_CACHE, log

NAME = "device"


def training_dtype(trainer) -> torch.dtype:
    """The dtype Ultralytics' model computes its first layer in: what it decided in _setup_train (`trainer.amp`),
    or, for a loader built before that, what it will decide (AMP only on an accelerator, as check_amp says)."""
    amp_arg = trainer.args.amp
    amp = getattr(trainer, "amp", None)
    if amp is None:
        amp = amp_arg not in (False, "fp32") and (amp_arg == "bf16" or trainer.device.type not in ("cpu", "mps"))
    return (torch.bfloat16 if amp_arg == "bf16" else torch.float16) if amp else torch.float32


def loader_setup(trainer) -> dict:
    """The device loader's options from Ultralytics' arguments, each difference said by name."""
    dtype = training_dtype(trainer)
    options = {"dtype": str(dtype).removeprefix("torch.")}
    if str(trainer.args.cache).strip().lower() in RAM_CACHE:
        options["cache"] = "device"
        log.info(f"fastfeed: cache={trainer.args.cache}: the device loader keeps the decoded store in "
                 f"{trainer.device.type} memory (its VRAM cache)")
    return options


def finish_batch(trainer, batch: dict, feed) -> dict:
    """preprocess_batch for the device loader's batches: already on the device, in the training dtype."""
    img = batch["img"]
    if img.device != trainer.device and not (img.device.type == trainer.device.type == "cpu"):
        raise RuntimeError(f"fastfeed device loader: batches on {img.device}, the trainer trains on {trainer.device}")
    ms = float(getattr(trainer.args, "multi_scale", 0.0) or 0.0)
    if ms > 0:
        step = feed.epoch * len(feed) + feed.position - 1   # this batch's place in the run: resumes draw the same
        size = step_size(int(trainer.args.seed), step, int(trainer.args.imgsz), int(trainer.stride),
                         low=max(0.0, 1.0 - ms), high=1.0 + ms)
        batch["img"] = resize(img, size)
    return batch


def for_plots(batch: dict) -> dict:
    """Ultralytics' plots read images through numpy, which has no bfloat16."""
    return dict(batch, img=batch["img"].float()) if batch["img"].dtype == torch.bfloat16 else batch
