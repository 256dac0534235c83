"""YOLO training augmentation as pure functions on numpy arrays.

Images are uint8 HWC RGB arrays of any size; boxes are float32 [N,4] x1,y1,x2,y2 in continuous
pixel coordinates of the image they come with (a whole W x H image is 0,0,W,H), carried with an
[N] class array that every box-dropping step filters alike. Every random function takes an explicit
`np.random.Generator`; nothing here does I/O or imports torch. The loader composes the steps, e.g.
a training sample's plan (`plan.draw_sample`: mosaic or not, partners, centre, affine, copy-paste, mixup, cutmix,
HSV, channel order) -> its pixels and labels (`render_labels`, `mix_in`, `finish_pixels`), and letterbox for
validation.

Labels of every task (`Labels`: boxes and classes, plus polygons, keypoints or oriented corners) follow
their pixels through the same realised maps (`points.paste_labels`, `letterbox_labels`): one rule for
every loader.

The plan (plan.py: the one sequence of random draws), the geometry (`sample_layout`, `mosaic_layout`,
`letterbox_geometry`, `paste.region_crop`, `paste.pixel_span`), the box rules (`paste.paste_boxes`) and the
box conversions and targets layout (boxes.py, for numpy arrays and torch tensors alike) are the one
definition every loader uses, whether it moves pixels with OpenCV (here), DALI or torch.
"""

from .affine import AffineDraw, affine_matrix, draw_affine
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
from .mixup import blend, draw_mixup_weight
from .mosaic import draw_mosaic_centre, mosaic_layout
from .plan import (
    Cut,
    Geometry,
    Mix,
    Paste,
    SamplePlan,
    batch_rng,
    draw_batch,
    draw_geometry,
    draw_sample,
    sample_layout,
    single_layout,
)
from .points import batch_rows, clip_polygons, corners_to_rboxes, paste_labels
from .render import finish_pixels, mix_in, render_labels

__all__ = [
    "AffineDraw", "AugmentHyp", "Cut", "Geometry", "Labels", "LetterboxGeometry", "Mix", "Paste", "SamplePlan", "affine_matrix",
    "batch_rng", "batch_rows", "blend", "box_candidates", "clip_boxes", "clip_boxes_to", "clip_polygons", "corners_to_rboxes",
    "cxcywh_to_xyxy", "draw_affine", "draw_batch", "draw_geometry", "draw_hsv", "draw_mixup_weight", "finish_pixels", "mix_in",
    "draw_mosaic_centre", "draw_sample", "hsv_to_planes", "hue_rotation", "letterbox",
    "letterbox_boxes", "letterbox_geometry", "letterbox_labels", "make_targets", "mosaic_layout",
    "paste_labels", "render_labels", "sample_layout",
    "single_layout", "transform_boxes", "xyxy_to_cxcywh",
]
