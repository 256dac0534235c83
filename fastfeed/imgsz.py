"""The one rule for an image size (`imgsz`): a positive multiple of 32, the largest stride of the YOLO
models fastfeed feeds, so every feature map tiles the image exactly. Every place that takes an imgsz
(LoaderConfig, TrainConfig, BenchConfig, `fastfeed cache build`, tools/show_batch.py) checks it here and
says the same thing: the rule and the two valid sizes around the one given. Nothing is rounded
silently. (Ultralytics rounds imgsz up to its stride with a warning before FastfeedTrainer sees it.)

Standard library only: the CLI checks it without importing torch.
"""

from __future__ import annotations

from .checks import is_int, is_num

STRIDE = 32


def imgsz_error(value, name: str = "--imgsz") -> str | None:
    """None when `value` is a valid image side; else the message that says why and what to use."""
    if is_int(value) and value >= STRIDE and value % STRIDE == 0:
        return None
    msg = f"{name} must be a positive multiple of {STRIDE} (the largest stride of the YOLO models), got {value!r}"
    if is_num(value) and value > 0:
        lo, hi = int(value) // STRIDE * STRIDE, (int(value) // STRIDE + 1) * STRIDE
        msg += f": use {lo} or {hi}" if lo >= STRIDE else f": use {hi}"
    return msg


def check_imgsz(value, name: str = "--imgsz") -> int:
    """`value` when it is a valid image side; ValueError with `imgsz_error`'s message otherwise."""
    msg = imgsz_error(value, name)
    if msg is not None:
        raise ValueError(msg)
    return int(value)
