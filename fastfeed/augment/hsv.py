"""HSV jitter without the HSV round trip, written straight into CHW planes: the package's one CPU
implementation (the device's is fastfeed/device_augment.py; the three jitters' RGB forms, why and the timings:
docs/design.md, 'HSV jitter in RGB'). Composed: one 3x3 `cv2.transform` (only when the hue moves), a split into
the output planes, one max and one `cv2.addWeighted` per plane. The draws (`draw_hsv`) are the reference's
(tests/hsv_reference.py), so a seed picks the same jitter; pixels differ by a few levels where channels clip
(tests/test_augment_hsv_planes.py).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

_AXIS = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]]) / math.sqrt(3.0)


def hue_rotation(turn: float) -> np.ndarray:
    """3x3 RGB matrix turning hues by `turn` of the colour circle (red toward green for turn > 0)."""
    a = 2.0 * math.pi * turn
    return (math.cos(a) * np.eye(3) + (1.0 - math.cos(a)) / 3.0 * np.ones((3, 3)) + math.sin(a) * _AXIS)


def draw_hsv(rng: np.random.Generator, hgain: float, sgain: float, vgain: float) -> tuple[float, float, float] | None:
    """(hue turn, saturation factor, value factor), or None without drawing when every gain is 0.
    Every path that jitters (the workers, the DALI plan) draws through here."""
    if hgain == 0 and sgain == 0 and vgain == 0:
        return None
    dh, ds, dv = rng.uniform(-1.0, 1.0, 3) * (hgain, sgain, vgain)
    return float(dh), 1.0 + float(ds), 1.0 + float(dv)


def hsv_to_planes(img: np.ndarray, planes: list[np.ndarray], draw: tuple[float, float, float] | None,
                  scratch: np.ndarray) -> None:
    """Apply a drawn jitter (`draw_hsv`'s (hue turn, saturation, value), e.g. a plan's; None: none) to HWC RGB
    uint8 `img`, written as three HxW planes; `img` may be modified, `scratch` is an HxW uint8 buffer."""
    if draw is None:
        cv2.split(img, planes)
        return
    dh, fs, fv = draw
    if abs(dh) * 360.0 >= 0.5:  # below half a degree a rotation changes no 8-bit level
        cv2.transform(img, hue_rotation(dh), dst=img)
    cv2.split(img, planes)
    if fs == 1.0 and fv == 1.0:
        return
    cv2.max(planes[0], planes[1], dst=scratch)
    cv2.max(scratch, planes[2], dst=scratch)
    a, b = fv * fs, fv * (1.0 - fs)
    for p in planes:
        cv2.addWeighted(p, a, scratch, b, 0.0, dst=p)
