"""YOLO training augmentation as pure functions on numpy arrays.

Images are uint8 HWC RGB arrays of any size; boxes are float32 [N,4] x1,y1,x2,y2 in continuous
pixel coordinates of the image they come with (a whole W x H image is 0,0,W,H), carried with an
[N] class array that every box-dropping step filters alike. Every random function takes an explicit
`np.random.Generator`; nothing here does I/O or imports torch. The loader composes the steps, e.g.
mosaic (or random_affine) -> optional mixup -> HSV jitter, and letterbox for validation.

The random draws (`draw_affine`, `draw_mosaic_centre`, `draw_hsv`) and the geometry
(`letterbox_geometry`, `mosaic_layout`, `paste.paste_boxes`) are the one definition every loader
uses, whether it moves pixels with OpenCV (here), DALI or torch.
"""

from .affine import AffineDraw, affine_matrix, draw_affine, random_affine, random_affine_matrix
from .boxes import box_candidates, clip_boxes, clip_boxes_to, cxcywh_to_xyxy, transform_boxes, xyxy_to_cxcywh
from .hsv import draw_hsv, hsv_jitter_to_planes, hue_rotation
from .hyp import AugmentHyp
from .letterbox import LetterboxGeometry, letterbox, letterbox_boxes, letterbox_geometry
from .mixup import draw_mixup_weight, mixup
from .mosaic import draw_mosaic_centre, mosaic, mosaic_layout

__all__ = [
    "AffineDraw", "AugmentHyp", "LetterboxGeometry", "affine_matrix", "box_candidates", "clip_boxes", "clip_boxes_to",
    "cxcywh_to_xyxy", "draw_affine", "draw_hsv", "draw_mixup_weight", "draw_mosaic_centre", "hsv_jitter_to_planes", "hue_rotation",
    "letterbox", "letterbox_boxes", "letterbox_geometry", "mixup", "mosaic", "mosaic_layout", "random_affine",
    "random_affine_matrix", "transform_boxes", "xyxy_to_cxcywh",
]
