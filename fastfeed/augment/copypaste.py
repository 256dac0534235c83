"""Copy-paste (Ultralytics' `copy_paste`, segment stores): objects of a second picture pasted by their polygons,
those that would cover under 30% of every object already there, least covering first, `copy_paste` of them.
What each mode draws: docs/design.md, 'One sample plan'. Mode "flip" (`flip_in`): the second picture is the mid
frame (the 2S canvas, or the scaled image) mirrored about its centre, as Ultralytics does on its canvas before the
affine; the objects are chosen among the frame's (all of them, shown or not), and the pixels inside the pasted
polygons come from the sample drawn a second time through the affine of the mirrored frame. Mode "mixup"
(`paste_in`): a second sample's objects pasted into the finished sample, before mixup and cutmix.
"""

from __future__ import annotations

import cv2
import numpy as np

from .boxes import box_ioa
from .labels import Labels
from .masks import rasterise
from .paste import paste_tile, place_matrix
from .points import paste_labels


def pick(labels: Labels, labels2: Labels, share: float) -> np.ndarray:
    """Which of labels2's objects are pasted: those whose box covers under 30% of each of labels' boxes (as a share
    of that box), least covering first, round(share * n) of them."""
    ioa = box_ioa(labels2.boxes, labels.boxes)
    worst = ioa.max(1) if len(labels) else np.zeros(len(labels2))
    free = np.flatnonzero(worst < 0.30)
    free = free[np.argsort(worst[free], kind="stable")]
    return free[:round(share * len(free))]


def flip_in(out: np.ndarray, labels: Labels, tiles, layout, regions, matrix: np.ndarray, frame: tuple[float, float],
            hyp) -> tuple[np.ndarray, Labels]:
    """Mode "flip" on a rendered sample (out, labels: what `render.render_labels` drew of `tiles` by `layout`, their
    `regions` (`paste.region_crop`), and the mid frame -> output `matrix`): the objects of the mid frame (`frame`: its
    width and height) mirrored about its centre, chosen (`pick`) against the frame's own objects, pasted with the
    mirrored frame's pixels. `out` is changed in place; tiles without polygons paste nothing."""
    n = len(layout)
    if any(t[1].polygons is None for t in tiles[:n]):
        return out, labels
    w, h = frame
    side = int(np.ceil(max(w, h)))
    mid = paste_labels([t[1] for t in tiles[:n]], [place_matrix(place) for place, _ in layout], regions, side, hyp)
    if not len(mid):
        return out, labels
    mirror = np.array([[-1.0, 0.0, w], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    whole = [(0.0, 0.0, float(w), float(h))]
    mirrored = paste_labels([mid], [mirror], whole, side, hyp)
    chosen = pick(mid, mirrored, hyp.copy_paste)
    if not len(chosen):
        return out, labels
    size = out.shape[0]
    shown = paste_labels([mirrored.take(chosen)], [matrix], whole, size, hyp)
    if not len(shown):
        return out, labels
    second = np.full_like(out, hyp.fill)
    for (img, _), (place, region) in zip(tiles, layout):
        paste_tile(second, img, place, region, matrix @ mirror)
    return paste_pixels(out, second, labels, shown)


def paste_in(res: np.ndarray, labels: Labels, res2: np.ndarray, labels2: Labels, hyp) -> tuple[np.ndarray, Labels]:
    """Mode "mixup" on rendered sample (res, labels): objects of second sample (res2, labels2), both in output
    pixels. Objects without a polygon are never pasted; `res` is changed in place."""
    if labels.polygons is None or not len(labels):
        return res, labels
    chosen = pick(labels, labels2, hyp.copy_paste)
    if not len(chosen):
        return res, labels
    return paste_pixels(res, res2, labels, labels2.take(chosen))


def paste_pixels(out: np.ndarray, src: np.ndarray, labels: Labels, objects: Labels) -> tuple[np.ndarray, Labels]:
    """The pixels of `src` inside `objects`' polygons (output pixels, the masks' centre rule) copied into `out`
    (`cv2.copyTo` under the mask: a boolean-indexed copy took 2.3 ms a sample); returns (out, `labels` and
    `objects` joined)."""
    inside = rasterise(objects.polygons, out.shape[0], 1, True) > 0
    cv2.copyTo(src, inside.view(np.uint8), out)
    return out, Labels.concat([labels, objects])
