"""MixUp: blend two augmented samples and keep both sets of boxes (off by default in YOLO)."""

from __future__ import annotations

import cv2
import numpy as np

from ._validate import check_boxes, check_image, check_out, check_rng


def draw_mixup_weight(rng: np.random.Generator) -> float:
    """The weight of the first image in a mixup: Beta(32, 32), close to 0.5 (as YOLO does). Every path
    that blends (this module, the DALI plan) draws it here."""
    return float(rng.beta(32.0, 32.0))


def mixup(a_img: np.ndarray, a_boxes: np.ndarray, a_cls: np.ndarray,
          b_img: np.ndarray, b_boxes: np.ndarray, b_cls: np.ndarray,
          rng: np.random.Generator, out: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blend `a` and `b` with a weight drawn from Beta(32, 32) (close to 0.5, as YOLO does).

    Both images must have the same shape (mix two finished mosaics or affines). `out` may be
    `a_img` itself to blend in place. Returns (img, boxes a+b float32 [Na+Nb,4], classes a+b).
    """
    check_image(a_img, "a_img")
    check_image(b_img, "b_img")
    if a_img.shape != b_img.shape:
        raise ValueError(f"a_img and b_img must have the same shape, got {a_img.shape} and {b_img.shape}")
    check_rng(rng)
    ab, ac = check_boxes(a_boxes, a_cls, "a_boxes")
    bb, bc = check_boxes(b_boxes, b_cls, "b_boxes")
    out = check_out(out, a_img.shape)
    blend(a_img, b_img, draw_mixup_weight(rng), out)
    return out, np.concatenate([ab, bb]), np.concatenate([ac, bc])


def blend(a_img: np.ndarray, b_img: np.ndarray, weight: float, out: np.ndarray) -> np.ndarray:
    """weight * a + (1 - weight) * b, rounded, into `out` (may be `a_img`): the pixels of a mixup whose weight
    a plan drew (`plan.Mix.weight`)."""
    cv2.addWeighted(a_img, weight, b_img, 1.0 - weight, 0.0, dst=out)
    return out
