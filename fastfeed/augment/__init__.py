"""YOLO training augmentation as pure functions on numpy arrays.

Images are uint8 HWC RGB arrays of any size; boxes are float32 [N,4] x1,y1,x2,y2 in continuous
pixel coordinates of the image they come with (a whole W x H image is 0,0,W,H), carried with an
[N] class array that every box-dropping step filters alike. Every random function takes an explicit
`np.random.Generator`; nothing here does I/O or imports torch. The loader composes the steps, e.g.
mosaic (or random_affine) -> optional mixup -> hsv_jitter, and letterbox for validation.
"""

from .affine import random_affine, random_affine_matrix
from .boxes import box_candidates, clip_boxes, clip_boxes_to, cxcywh_to_xyxy, transform_boxes, xyxy_to_cxcywh
from .hsv import hsv_jitter
from .hsv_planes import hsv_jitter_to_planes, hue_rotation
from .hyp import AugmentHyp
from .letterbox import letterbox, letterbox_boxes
from .mixup import mixup
from .mosaic import mosaic, mosaic_layout

__all__ = [
    "AugmentHyp",
    "box_candidates",
    "clip_boxes",
    "clip_boxes_to",
    "cxcywh_to_xyxy",
    "hsv_jitter",
    "hsv_jitter_to_planes",
    "hue_rotation",
    "letterbox",
    "letterbox_boxes",
    "mixup",
    "mosaic",
    "mosaic_layout",
    "random_affine",
    "random_affine_matrix",
    "transform_boxes",
    "xyxy_to_cxcywh",
]
