"""Albumentations (Ultralytics' `Albumentations` step): pixel-only transforms, each applied with its own probability
`p`, after copy-paste, mixup and cutmix and before HSV, as Ultralytics applies them. `AugmentHyp.albumentations`
holds them as their Albumentations dicts (`encode`: JSON text, so a hyp compares, pickles and checkpoints by value).
The plan draws which fire and a seed (`draw`); `apply` runs exactly those, seeded, on BGR pixels as Ultralytics hands
them (ToGray and CLAHE read the channels in that order). Spatial transforms (DualTransforms: they move boxes) are
refused.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class Albu:
    """The transforms (indices into `AugmentHyp.albumentations`) that fire on one sample, and their seed."""

    which: tuple[int, ...]
    seed: int


def _albumentations():
    return importlib.import_module("albumentations")   # fastfeed/__init__ turned its version check off


def encode(transforms) -> tuple[str, ...]:
    """The JSON text of each of `transforms` (Albumentations transforms, their dicts, or that text already) whose p
    is above 0; ValueError naming a spatial one or one Albumentations cannot serialise."""
    A, out = _albumentations(), []
    for given in transforms:
        try:
            t = json.loads(given) if isinstance(given, str) else given
            t = A.from_dict({"transform": t.get("transform", t)}) if isinstance(t, dict) else t
        except (ValueError, KeyError, TypeError):
            t = given
        if not isinstance(t, A.BasicTransform | A.BaseCompose):
            raise ValueError(f"albumentations: {t!r} is not an Albumentations transform")
        if spatial(t):
            raise ValueError(f"albumentations: {type(t).__name__} moves the image's geometry; fastfeed applies "
                             f"pixel-level transforms only (drop it, or use Ultralytics' own loader)")
        if t.p > 0:
            out.append(json.dumps(A.to_dict(t)["transform"], sort_keys=True, default=str))
    return tuple(out)


def spatial(t) -> bool:
    """Whether Albumentations transform `t` (or one inside it) moves the geometry (a DualTransform)."""
    return isinstance(t, _albumentations().DualTransform) or any(spatial(x) for x in getattr(t, "transforms", ()))


@lru_cache(maxsize=8)
def built(encoded: tuple[str, ...]) -> tuple:
    """The transforms of `encoded`, made once per process."""
    return tuple(_albumentations().from_dict({"transform": json.loads(s)}) for s in encoded)


def names(encoded: tuple[str, ...]) -> str:
    """The transforms' class names and p, for messages."""
    return ", ".join(f"{d['__class_fullname__']}(p={d['p']})" for d in map(json.loads, encoded))


def draw(rng: np.random.Generator, encoded: tuple[str, ...]) -> Albu | None:
    """Which of the transforms fire on one sample (each with its p), and their seed; None when none does."""
    which = tuple(i for i, t in enumerate(built(encoded)) if rng.random() < t.p)
    return Albu(which, int(rng.integers(2**31))) if which else None


def apply(res: np.ndarray, albu: Albu, encoded: tuple[str, ...]) -> None:
    """Run the transforms `albu` names, in order, on `res` (HWC RGB uint8, changed in place) as BGR pixels."""
    img, transforms = np.ascontiguousarray(res[..., ::-1]), built(encoded)
    for k, i in enumerate(albu.which):
        transforms[i].set_random_seed(albu.seed + k)
        img = transforms[i](image=img, force_apply=True)["image"]
    res[...] = img[..., ::-1]
