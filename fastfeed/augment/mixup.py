"""MixUp: blend two augmented samples and keep both sets of boxes (off by default in YOLO)."""

from __future__ import annotations

import cv2
import numpy as np


def draw_mixup_weight(rng: np.random.Generator) -> float:
    """The weight of the first image in a mixup: Beta(32, 32), close to 0.5 (as YOLO does). Every path
    that blends (the plan, the DALI plan) draws it here."""
    return float(rng.beta(32.0, 32.0))


def blend(a_img: np.ndarray, b_img: np.ndarray, weight: float, out: np.ndarray) -> np.ndarray:
    """weight * a + (1 - weight) * b, rounded, into `out` (may be `a_img`): the pixels of a mixup whose weight
    a plan drew (`plan.Mix.weight`)."""
    cv2.addWeighted(a_img, weight, b_img, 1.0 - weight, 0.0, dst=out)
    return out
