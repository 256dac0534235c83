"""Box arithmetic in torch: format conversion, (C)IoU, and greedy NMS (no torchvision needed)."""

from __future__ import annotations

import math

import torch

from ..augment.boxes import cxcywh_to_xyxy


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU of xyxy boxes: [N,4] x [M,4] -> [N,M]."""
    area_a = (a[:, 2] - a[:, 0]).clamp(0) * (a[:, 3] - a[:, 1]).clamp(0)
    area_b = (b[:, 2] - b[:, 0]).clamp(0) * (b[:, 3] - b[:, 1]).clamp(0)
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(0).prod(2)
    return inter / (area_a[:, None] + area_b[None] - inter + 1e-9)


def ciou(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Complete IoU of matched cx,cy,w,h boxes [N,4], [N,4] -> [N].

    IoU minus the squared centre distance over the enclosing box's squared diagonal, minus an
    aspect-ratio term (Zheng et al. 2020): it still has a gradient when boxes do not overlap.
    """
    (ax, ay, aw, ah), (bx, by, bw, bh) = a.unbind(-1), b.unbind(-1)
    ax1, ax2, ay1, ay2 = ax - aw / 2, ax + aw / 2, ay - ah / 2, ay + ah / 2
    bx1, bx2, by1, by2 = bx - bw / 2, bx + bw / 2, by - bh / 2, by + bh / 2
    inter = (torch.min(ax2, bx2) - torch.max(ax1, bx1)).clamp(0) * (torch.min(ay2, by2) - torch.max(ay1, by1)).clamp(0)
    union = aw * ah + bw * bh - inter + eps
    iou = inter / union
    cw = torch.max(ax2, bx2) - torch.min(ax1, bx1)
    ch = torch.max(ay2, by2) - torch.min(ay1, by1)
    c2 = cw ** 2 + ch ** 2 + eps
    rho2 = (bx - ax) ** 2 + (by - ay) ** 2
    v = (4 / math.pi ** 2) * (torch.atan(bw / (bh + eps)) - torch.atan(aw / (ah + eps))) ** 2
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_thres: float) -> torch.Tensor:
    """Greedy NMS: indices of the kept xyxy boxes, highest score first.

    Take the best remaining box, drop every remaining box overlapping it by more than `iou_thres`,
    repeat. The IoU matrix is computed once; the loop runs once per *kept* box, on the CPU (a few
    hundred small steps are faster there than as synchronising GPU kernels).
    """
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    order = scores.argsort(descending=True)
    over = (box_iou(boxes[order], boxes[order]) > iou_thres).cpu()
    remaining = torch.arange(len(order))
    keep = []
    while remaining.numel():
        i = remaining[0]
        keep.append(i)
        remaining = remaining[~over[i, remaining]]
    return order[torch.stack(keep).to(order.device)]


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, iou_thres: float) -> torch.Tensor:
    """NMS within each class at once: boxes are shifted by class x (a span larger than any image), so
    boxes of different classes never overlap and one greedy pass serves every class."""
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    span = boxes.max() - boxes.min() + 1
    return nms(boxes + (classes.to(boxes.dtype) * span)[:, None], scores, iou_thres)


def postprocess(pred: torch.Tensor, conf_thres: float = 0.001, iou_thres: float = 0.6, max_det: int = 300,
                max_nms: int = 30000) -> list[torch.Tensor]:
    """Decoded predictions [B, N, 5 + nc] -> per image [K, 6]: x1, y1, x2, y2, score, class.

    score = objectness x class probability; every class above `conf_thres` of a box is a candidate
    (multi-label, as COCO evaluation expects), at most `max_nms` of them enter NMS.
    """
    out = []
    for p in pred:
        p = p[p[:, 4] > conf_thres]
        scores = p[:, 5:] * p[:, 4:5]
        i, c = (scores > conf_thres).nonzero(as_tuple=True)
        s = scores[i, c]
        if s.numel() > max_nms:
            top = s.topk(max_nms).indices
            i, c, s = i[top], c[top], s[top]
        boxes = cxcywh_to_xyxy(p[i, :4])   # in the model's pixels (width = height = 1: no scaling)
        keep = batched_nms(boxes, s, c, iou_thres)[:max_det]
        out.append(torch.cat((boxes[keep], s[keep, None], c[keep, None].to(boxes.dtype)), 1))
    return out
