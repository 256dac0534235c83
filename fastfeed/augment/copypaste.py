"""Copy-paste (Ultralytics' `copy_paste`, segment stores): objects of a second picture pasted by their polygons,
those that would cover under 30% of every object already there, least covering first, `copy_paste` of them.

`copy_paste_mode` "flip": the second picture is the sample itself mirrored (no draw: every sample; Ultralytics
mirrors its mosaic canvas before the affine, here the rendered sample is mirrored through the affine's image of
that mirror, `mirror`: the same map for a default, axis-aligned affine). "mixup": with probability `copy_paste`
a second sample made as the own one is (`plan.Paste`), its objects pasted. Both in output pixels, on the own
sample before mixup and cutmix (their second samples get none).
"""

from __future__ import annotations

import cv2
import numpy as np

from .affine import AffineDraw, affine_matrix
from .boxes import box_ioa
from .labels import Labels
from .masks import rasterise
from .points import paste_labels

MODES = ("flip", "mixup")


def mirror(d: AffineDraw, size: int) -> np.ndarray:
    """The output map that a left-right mirror of the affine's source frame about its centre becomes: M F M^-1."""
    m = affine_matrix(d, (0.0, 0.0), size, False)   # the centre at 0: the mirror is x -> -x there
    return m @ np.diag([-1.0, 1.0, 1.0]) @ np.linalg.inv(m)


def pick(labels: Labels, labels2: Labels, share: float) -> np.ndarray:
    """Which of labels2's objects are pasted: those whose box covers under 30% of each of labels' boxes (as a share
    of that box), least covering first, round(share * n) of them."""
    ioa = box_ioa(labels2.boxes, labels.boxes)
    worst = ioa.max(1) if len(labels) else np.zeros(len(labels2))
    free = np.flatnonzero(worst < 0.30)
    free = free[np.argsort(worst[free], kind="stable")]
    return free[:round(share * len(free))]


def paste_in(res: np.ndarray, labels: Labels, res2: np.ndarray | None, labels2: Labels | None, d: AffineDraw,
             hyp) -> tuple[np.ndarray, Labels]:
    """Copy-paste on rendered sample (res, labels): from (res2, labels2) (mode "mixup"), or from the sample
    mirrored (`mirror`, when res2 is None). Objects without a polygon are never pasted; `res` is changed in place."""
    if labels.polygons is None or not len(labels):
        return res, labels
    size = res.shape[0]
    if res2 is None:
        m = mirror(d, size)
        px = np.array([[1.0, 0.0, -0.5], [0.0, 1.0, -0.5], [0.0, 0.0, 1.0]]) @ m   # OpenCV's pixel centres
        px[:, 2] += px[:, :2].sum(1) * 0.5
        warp = cv2.warpPerspective if (m[2, :2] != 0).any() else cv2.warpAffine
        res2 = warp(res, px if warp is cv2.warpPerspective else px[:2], (size, size), flags=cv2.INTER_LINEAR,
                    borderValue=(hyp.fill,) * 3)
        labels2 = paste_labels([labels], [m], [(0.0, 0.0, float(size), float(size))], size, hyp)
    chosen = pick(labels, labels2, hyp.copy_paste)
    if not len(chosen):
        return res, labels
    pasted = labels2.take(chosen)
    mask = rasterise(pasted.polygons, size, 1, True) > 0
    res[mask] = res2[mask]
    return res, Labels.concat([labels, pasted])
