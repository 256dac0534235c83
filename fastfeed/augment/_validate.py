"""Argument checks shared by the augment functions.

Bad user input raises `ValueError` naming the argument and what is valid, so a loader bug surfaces
at the call that caused it rather than as an OpenCV assertion three frames down.
"""

from __future__ import annotations

import numbers

import numpy as np


def check_image(img, name: str = "img") -> np.ndarray:
    """An RGB uint8 HWC array of at least 1x1 pixel (views with positive strides are fine)."""
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        desc = f"{img.dtype} {img.shape}" if isinstance(img, np.ndarray) else type(img).__name__
        raise ValueError(f"{name} must be a uint8 array of shape [H,W,3] (RGB), got {desc}")
    if img.shape[0] < 1 or img.shape[1] < 1:
        raise ValueError(f"{name} must be at least 1x1 pixel, got shape {img.shape}")
    if any(s < 0 for s in img.strides):
        raise ValueError(f"{name} has a negative stride {img.strides}; pass np.ascontiguousarray({name})")
    return img


def check_size(size, name: str = "size", lo: int = 1) -> int:
    """A positive integer output side."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {size!r}")
    return int(size)


def check_out(out, shape: tuple[int, int, int], name: str = "out") -> np.ndarray:
    """A caller's uint8 buffer of exactly `shape` whose rows OpenCV can write in place.

    Rows may be strided (a view into a larger buffer) but the pixels of a row must be packed,
    otherwise OpenCV would silently write into a temporary copy.
    """
    if out is None:
        return np.empty(shape, np.uint8)
    if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != shape:
        desc = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ValueError(f"{name} must be a uint8 array of shape {shape}, got {desc}")
    if out.strides[2] != 1 or out.strides[1] != 3 or out.strides[0] < 3 * shape[1]:
        raise ValueError(f"{name} rows must be packed RGB pixels (strides [>={3 * shape[1]},3,1]), "
                         f"got strides {out.strides}")
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    return out


def check_fill(fill) -> int:
    if isinstance(fill, bool) or not isinstance(fill, numbers.Integral) or not 0 <= fill <= 255:
        raise ValueError(f"fill must be an integer in [0, 255], got {fill!r}")
    return int(fill)
