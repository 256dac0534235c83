"""The one shape of a config's bad-value error, `<name> <rule>, got <value>`, and the number tests it uses
(a bool is not a number here); the one rule for an image size (`imgsz`): a positive multiple of 32, the largest
stride of the YOLO models fastfeed feeds, so every feature map tiles the image exactly. Every place that takes an
imgsz (LoaderConfig, TrainConfig, BenchConfig, `fastfeed cache build`, tools/show_batch.py) checks it here and says
the rule and the two valid sizes around the one given; nothing is rounded silently (Ultralytics rounds imgsz up to
its stride with a warning before FastfeedTrainer sees it). Standard library only: the CLI checks without torch."""

from __future__ import annotations

import numbers


def need(ok: bool, name: str, rule: str, value) -> None:
    """ValueError `<name> <rule>, got <value!r>` unless `ok`."""
    if not ok:
        raise ValueError(f"{name} {rule}, got {value!r}")


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def field_need(obj, prefix: str):
    """`need` for `obj`'s fields, `check(ok, name, rule)`: the error names `<prefix><name>` and its value."""
    return lambda ok, name, rule: need(ok, prefix + name, rule, getattr(obj, name))


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
    if (msg := imgsz_error(value, name)) is not None:
        raise ValueError(msg)
    return int(value)
