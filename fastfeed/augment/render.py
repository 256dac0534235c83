"""A plan's pixels on the CPU, as the cpu and shm workers render every training sample: `render_labels` (the
tiles of a `plan.Geometry` drawn into a size x size output in one pass, labels moved by the same realised maps),
`mix_in` (copy-paste, mixup, cutmix, Albumentations), then `finish_pixels` (HSV, channel order, into the slot).
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from .albu import apply as apply_albu
from .copypaste import flip_in, paste_in
from .cutmix import cut_in
from .hsv import hsv_to_planes
from .hyp import AugmentHyp
from .labels import Labels
from .paste import paste_boxes, paste_tile, region_crop
from .plan import Geometry, SamplePlan, sample_layout
from .points import paste_labels


def render_labels(tiles: Sequence[tuple[np.ndarray, Labels]], geometry: Geometry, size: int, hyp: AugmentHyp,
                  out: np.ndarray, flip_idx=None) -> tuple[np.ndarray, Labels]:
    """Draw `tiles` ((img, Labels in img pixels); own image first; 4 for a mosaic geometry, 1 otherwise) as
    `geometry` places them into `out` (size x size x 3 uint8, overwritten entirely, not overlapping a tile).
    Every object follows its pixels through its tile's realised map (`points.paste_labels`); copy-paste mode
    "flip" when the geometry has it (`copypaste.flip_in`). Returns (out, Labels in output pixels)."""
    n = 4 if geometry.mosaic else 1
    shapes = [t[0].shape[:2] for t in tiles[:n]]
    layout, _, matrix = sample_layout(geometry, shapes, size, hyp)
    out.fill(hyp.fill)
    realised, crops = zip(*(paste_tile(out, img, place, region, matrix)
                            for (img, _), (place, region) in zip(tiles, layout)))
    regions = [region_crop(place, region, img.shape[:2]) for (img, _), (place, region) in zip(tiles, layout)]
    labels = [t[1] for t in tiles[:n]]
    if all(x.boxes_only for x in labels):   # boxes only: the box rule, without building shapes
        boxes, classes = paste_boxes([x.boxes for x in labels], [x.classes for x in labels], realised, crops,
                                     size, hyp, regions)
        return out, Labels(boxes, classes)
    shown = paste_labels(labels, realised, crops, size, hyp, regions, flip_lr=geometry.affine.flip_lr,
                         flip_idx=flip_idx)
    if not geometry.paste_flip:
        return out, shown
    frame = (2.0 * size, 2.0 * size) if geometry.mosaic else layout[0][1][2:]   # the canvas, or the scaled image
    return flip_in(out, shown, tiles[:n], layout, regions, matrix, frame, hyp)


def mix_in(res: np.ndarray, labels: Labels, plan: SamplePlan, second, hyp: AugmentHyp) -> tuple[np.ndarray, Labels]:
    """The plan's steps after the geometry on rendered sample (res, labels), in Ultralytics' order: copy-paste mode
    "mixup" (`copypaste.paste_in`; mode "flip" is the geometry's: `render_labels`), mixup (a blend, both samples'
    objects), cutmix (`cutmix.cut_in`), the Albumentations that fire (`albu.apply`: pixels only). `second(other,
    geometry)` renders a second sample, (img, Labels), into a scratch of its own (one at a time: each is used before
    the next is rendered; mixup's and cutmix's copied before their own paste source is)."""
    def pasted(res, labels, paste):
        return (res, labels) if paste is None else paste_in(res, labels, *second(paste.other, paste.geometry), hyp)

    def second_of(mixing):   # with its own copy-paste, as Ultralytics makes it
        res2, labels2 = second(mixing.other, mixing.geometry)
        return (res2, labels2) if mixing.paste is None else pasted(res2.copy(), labels2, mixing.paste)

    res, labels = pasted(res, labels, plan.paste)
    if plan.mix is not None:
        res2, labels2 = second_of(plan.mix)
        blend(res, res2, plan.mix.weight, res)
        labels = Labels.concat([labels, labels2])
    if plan.cut is not None:
        res2, labels2 = second_of(plan.cut)
        res, labels = cut_in(res, labels, res2, labels2, plan.cut.rects, plan.cut.pick, hyp)
    if plan.albu is not None:
        apply_albu(res, plan.albu, hyp.albumentations)
    return res, labels


def blend(a_img: np.ndarray, b_img: np.ndarray, weight: float, out: np.ndarray) -> np.ndarray:
    """weight * a + (1 - weight) * b, rounded, into `out` (may be `a_img`): the pixels of a mixup whose weight
    a plan drew (`plan.Mix.weight`)."""
    cv2.addWeighted(a_img, weight, b_img, 1.0 - weight, 0.0, dst=out)
    return out


def finish_pixels(res: np.ndarray, slot: np.ndarray, plan: SamplePlan, scratch: np.ndarray) -> None:
    """The last steps of a rendered sample `res` (HWC RGB uint8, may be modified) into its CHW output `slot`: the
    plan's HSV jitter, and its channels written in BGR order when the plan drew `bgr` (`scratch`: HxW uint8)."""
    planes = [slot[2], slot[1], slot[0]] if plan.bgr else [slot[0], slot[1], slot[2]]
    hsv_to_planes(res, planes, plan.hsv, scratch)
