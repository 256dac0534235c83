"""The box rules of `fastfeed.augment` (transform, clip, `box_candidates`, `paste_boxes`) on torch tensors,
for the device loader (the conversions and the targets layout serve tensors as they are: `augment.boxes`).

They run in the planning workers, on CPU tensors, not on the accelerator: how many boxes survive the
filter decides the shape of a batch's targets, and learning that on the device would stall the host
on every batch (a sync) until the device had caught up. The arithmetic mirrors the numpy functions
operation for operation (float64 corner transforms, float32 clipping and filtering), so both keep
exactly the same boxes; tests/test_device_loader_parts.py checks that against the numpy versions.
"""

from __future__ import annotations

import torch

_CORNER_X = [0, 2, 0, 2]   # (x, y) columns of the 4 corners of an x1,y1,x2,y2 box, as augment.boxes
_CORNER_Y = [1, 1, 3, 3]


def transform_boxes(boxes: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """The axis-aligned box enclosing each box mapped by its affine matrix: `augment.transform_boxes`.
    boxes float32 [N,4]; matrix [N,3,3] or [N,2,3] (one per box) or a single [3,3] / [2,3]."""
    b = boxes.to(torch.float32).reshape(-1, 4)
    m = matrix.to(torch.float64)
    if m.dim() == 2:
        m = m.unsqueeze(0)
    if len(b) == 0:
        return torch.zeros((0, 4), dtype=torch.float32)
    cx, cy = b[:, _CORNER_X].double(), b[:, _CORNER_Y].double()
    x = cx * m[:, 0, 0, None] + cy * m[:, 0, 1, None] + m[:, 0, 2, None]
    y = cx * m[:, 1, 0, None] + cy * m[:, 1, 1, None] + m[:, 1, 2, None]
    return torch.stack([x.amin(1), y.amin(1), x.amax(1), y.amax(1)], dim=1).to(torch.float32)


def clip_boxes_to(boxes: torch.Tensor, rect: torch.Tensor) -> torch.Tensor:
    """Clip boxes to x1,y1,x2,y2 rectangles ([4], or [N,4]: one per box): `augment.clip_boxes_to`."""
    b = boxes.to(torch.float32).reshape(-1, 4)
    r = rect.to(torch.float32)
    return torch.minimum(torch.maximum(b, r[..., [0, 1, 0, 1]]), r[..., [2, 3, 2, 3]])


def box_candidates(before: torch.Tensor, after: torch.Tensor, *, min_side: float = 2.0,
                   min_area_ratio: float = 0.1, max_aspect: float = 100.0) -> torch.Tensor:
    """Keep mask of boxes that survive a transform: `augment.box_candidates`, the same rule and arithmetic
    (a side <= min_side, less than min_area_ratio of the area left, or thinner than 1:max_aspect: dropped)."""
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    eps = 1e-9
    aspect = torch.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return ((w2 > min_side) & (h2 > min_side) & (w2 * h2 > min_area_ratio * (w1 * h1) + eps)
            & (aspect < max_aspect))


def paste_boxes(boxes: torch.Tensor, matrices: torch.Tensor, crops: torch.Tensor, size: int, hyp
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """`augment.paste.paste_boxes` with one tile->output matrix [N,3,3] and one crop [N,4] (tile pixels:
    what the mosaic canvas holds of the tile, which is also what is drawn) per box: clip to the crop,
    map, clip to the output; judged against the crop-clipped box mapped without the output clip (the
    whole box under rotation or shear). Returns (boxes float32 [N,4] in output pixels, keep mask [N])."""
    n = len(boxes)
    if n == 0:
        return torch.zeros((0, 4), dtype=torch.float32), torch.zeros(0, dtype=torch.bool)
    shown = clip_boxes_to(boxes, crops)
    turned = (matrices[:, 0, 1] != 0) | (matrices[:, 1, 0] != 0)
    judged = torch.where(turned[:, None], boxes, shown)
    both = transform_boxes(torch.cat([judged, shown]), torch.cat([matrices, matrices]))
    before = both[:n]
    after = clip_boxes_to(both[n:], torch.tensor([0.0, 0.0, size, size]))
    keep = box_candidates(before, after, min_side=hyp.min_box_side, min_area_ratio=hyp.min_box_area_ratio,
                          max_aspect=hyp.max_box_aspect)
    return after, keep
