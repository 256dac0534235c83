"""Augmentation hyper-parameters with the usual YOLO defaults, checked once at construction.

Validating here (not in every call) keeps the per-sample path free of checks while still failing
fast, with the field name, when a config file carries a typo such as `scale: 5`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..checks import is_int, is_num
from .albu import encode

# field -> (low, high, low inclusive, high inclusive); the valid ranges quoted in errors.
_RANGES = {
    **dict.fromkeys(("mosaic", "mixup", "cutmix", "copy_paste", "translate", "fliplr", "flipud", "hsv_s", "hsv_v",
                     "bgr", "min_box_area_ratio", "min_segment_area_ratio"), (0.0, 1.0, True, True)),
    "degrees": (0.0, 180.0, True, True),
    "scale": (0.0, 1.0, True, False),   # 1 - scale must stay > 0
    "shear": (0.0, 90.0, True, False),  # tan(90 deg) is infinite
    "perspective": (0.0, 0.001, True, True),   # Ultralytics' typical range; beyond it a corner can cross the horizon
    "hsv_h": (0.0, 0.5, True, True),    # +-0.5 of the hue circle already reaches every hue
    "fill": (0, 255, True, True),
    "min_box_side": (0.0, math.inf, True, False),
    "max_box_aspect": (1.0, math.inf, True, False),
}


def check_field(name: str, value, owner: str = "AugmentHyp"):
    """`value` if it is valid for AugmentHyp field `name`, else ValueError quoting the valid range
    (what every holder of these gains validates with, e.g. the device augmentation)."""
    lo, hi, lo_in, hi_in = _RANGES[name]
    rng = f"{'[' if lo_in else '('}{lo}, {hi}{']' if hi_in else ')'}"
    want_int = name == "fill"
    if not (is_int(value) if want_int else is_num(value)):
        raise ValueError(f"{owner}.{name}={value!r} must be {'an integer' if want_int else 'a number'} in {rng}")
    inside = (lo <= value if lo_in else lo < value) and (value <= hi if hi_in else value < hi)
    if not inside or (isinstance(value, float) and math.isnan(value)):
        raise ValueError(f"{owner}.{name}={value!r} is out of range; valid: {rng}")
    return value


@dataclass(frozen=True)
class AugmentHyp:
    """Training augmentation settings (Ultralytics/YOLOv3 names and defaults).

    mosaic/mixup/cutmix/fliplr/flipud are probabilities; degrees/shear are +- ranges in degrees; perspective is the +-
    range of the projective terms (Ultralytics': P[2, 0], P[2, 1], per pixel of the centred frame);
    copy_paste is the share of a segment sample's eligible objects pasted (and, in copy_paste_mode "mixup", the
    probability of a paste: `copypaste.py`); translate is a +- fraction of the output side; scale draws the zoom from [1-scale, 1+scale];
    hsv_* are +- gains (hue as a fraction of the colour circle); bgr is the probability that a sample's
    channels come in BGR order instead of RGB (Ultralytics' `bgr`); albumentations are pixel-only Albumentations
    transforms, each applied with its own p (`albu.py`: given as transforms or their dicts, held as JSON text);
    min_box_side (px), min_box_area_ratio, max_box_aspect are the box filter's thresholds (`boxes.box_candidates`),
    min_segment_area_ratio its area threshold for an object with a polygon (0.01, as Ultralytics filters them).
    """

    mosaic: float = 1.0
    mixup: float = 0.0
    cutmix: float = 0.0
    copy_paste: float = 0.0
    copy_paste_mode: str = "flip"
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    perspective: float = 0.0
    fliplr: float = 0.5
    flipud: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    bgr: float = 0.0
    albumentations: tuple = ()
    fill: int = 114
    min_box_side: float = 2.0
    min_box_area_ratio: float = 0.1
    min_segment_area_ratio: float = 0.01
    max_box_aspect: float = 100.0

    def __post_init__(self):
        for f in fields(self):   # in field order: the first bad field is the one named
            if f.name in _RANGES:
                check_field(f.name, getattr(self, f.name))
            elif f.name == "copy_paste_mode" and self.copy_paste_mode not in ("flip", "mixup"):
                raise ValueError(f"AugmentHyp.copy_paste_mode={self.copy_paste_mode!r}: valid: 'flip', 'mixup'")
            elif f.name == "albumentations":   # encode imports albumentations: only when transforms are given
                object.__setattr__(self, f.name, encode(self.albumentations) if self.albumentations else ())

    @property
    def axis_aligned(self) -> bool:
        """No rotation, shear or perspective: tiles can be placed with cv2.resize instead of a warp (3-5x faster)."""
        return self.degrees == 0 and self.shear == 0 and self.perspective == 0


DEFAULT_HYP = AugmentHyp()  # shared default: the dataclass is frozen, so sharing is safe
