"""YOLO training augmentation as pure functions on numpy arrays: no I/O, no torch, every random function takes an
explicit `np.random.Generator`.

Images are uint8 HWC RGB of any size; boxes are float32 [N,4] x1,y1,x2,y2 in continuous pixels of their image (a
whole W x H image is 0,0,W,H), carried with an [N] class array that every box-dropping step filters alike. What this
package defines once for every loader (the plan, the geometry, the box filter, every task's labels, the box
conversions): docs/design.md, 'Who owns what' (augment/) and 'One sample plan'.
"""

from .boxes import (
    box_candidates,
    clip_boxes,
    clip_boxes_to,
    cxcywh_to_xyxy,
    make_targets,
    transform_boxes,
    xyxy_to_cxcywh,
)
from .hsv import draw_hsv, hsv_to_planes, hue_rotation
from .hyp import AugmentHyp
from .labels import Labels
from .letterbox import LetterboxGeometry, letterbox, letterbox_boxes, letterbox_geometry, letterbox_labels
from .plan import (
    AffineDraw,
    Cut,
    Geometry,
    Mix,
    Paste,
    SamplePlan,
    affine_matrix,
    batch_rng,
    draw_affine,
    draw_batch,
    draw_geometry,
    draw_mixup_weight,
    draw_mosaic_centre,
    draw_sample,
    mosaic_layout,
    sample_layout,
    single_layout,
)
from .points import batch_rows, clip_polygons, corners_to_rboxes, paste_labels
from .render import blend, finish_pixels, mix_in, render_labels

__all__ = ["AffineDraw", "AugmentHyp", "Cut", "Geometry", "Labels", "LetterboxGeometry", "Mix", "Paste", "SamplePlan",
           "affine_matrix", "batch_rng", "batch_rows", "blend", "box_candidates", "clip_boxes", "clip_boxes_to",
           "clip_polygons", "corners_to_rboxes", "cxcywh_to_xyxy", "draw_affine", "draw_batch", "draw_geometry",
           "draw_hsv", "draw_mixup_weight", "finish_pixels", "mix_in", "draw_mosaic_centre", "draw_sample",
           "hsv_to_planes", "hue_rotation", "letterbox", "letterbox_boxes", "letterbox_geometry", "letterbox_labels",
           "make_targets", "mosaic_layout", "paste_labels", "render_labels", "sample_layout", "single_layout",
           "transform_boxes", "xyxy_to_cxcywh"]
