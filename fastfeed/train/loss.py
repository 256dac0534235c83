"""The YOLO loss on fastfeed's [M,6] targets (img_idx, cls, cx, cy, w, h normalised), unchanged.

Assignment (YOLOv5-style, as Ultralytics' YOLOv3 trains): a target goes to *every* anchor of every
scale whose width and height ratios to it are both within `anchor_t` (4x), in the cell holding its
centre and in the two nearest neighbouring cells (the centre's offset can reach -0.5..1.5 of a cell
with the 2σ - 0.5 decoding). Three times more positives than Darknet's single best anchor, which is
what lets YOLOv3 train in ~300 epochs from scratch.

Per scale: box loss 1 - CIoU over the positives; objectness BCE over all cells with the (detached,
clamped) CIoU of each positive as its target; class BCE over the positives (skipped when nc == 1).
Objectness is weighted per scale by stride (8: 4.0, 16: 1.0, 32: 0.4) because a fine scale has far
more cells, nearly all negative. The terms are then scaled by gains (box 0.05, obj 1.0, cls 0.5)
adjusted like Ultralytics': x 3/nl (number of scales), obj x (imgsz/640)² (cells grow with the
image), cls x nc/80 (more classes, more BCE terms). The total is multiplied by the batch size: the
gradient is then a sum over images, so gradient accumulation and DDP just add (see step.py).
"""

from __future__ import annotations

import torch
from torch import nn

from .boxes import ciou

BALANCE = {8: 4.0, 16: 1.0, 32: 0.4}
# The centre cell and its four neighbours (x-1, y-1, x+1, y+1), in cells; two of the four are kept.
_OFFSETS = torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], dtype=torch.float32) * 0.5


class YoloLoss:
    def __init__(self, model: nn.Module, imgsz: int, box: float = 0.05, obj: float = 1.0, cls: float = 0.5,
                 anchor_t: float = 4.0):
        det = model.detect
        self.nc, self.nl, self.na = det.nc, det.nl, det.na
        self.strides = det.strides
        self.balance = [BALANCE[s] for s in det.strides]
        self.box_gain = box * 3 / self.nl
        self.obj_gain = obj * (imgsz / 640) ** 2 * 3 / self.nl
        self.cls_gain = cls * self.nc / 80 * 3 / self.nl
        self.anchor_t = anchor_t
        self.detect = det
        self.bce = nn.BCEWithLogitsLoss()

    def __call__(self, preds: list[torch.Tensor], targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """preds: raw maps [B,3,H,W,5+nc] per scale; targets [M,6] on the same device.
        Returns (loss x batch size for backward, detached [box, obj, cls] for logging)."""
        dev = preds[0].device
        lbox, lobj, lcls = (torch.zeros((), device=dev) for _ in range(3))
        for i, (p, (b, a, gj, gi, tbox, tcls, anchor)) in enumerate(zip(preds, self.assign(preds, targets))):
            p = p.float()   # under autocast the head may be bf16/fp16; the loss is summed in fp32
            tobj = torch.zeros(p.shape[:4], device=dev)
            if len(b):
                pxy, pwh, _, pcls = p[b, a, gj, gi].split((2, 2, 1, self.nc), 1)
                pbox = torch.cat((pxy.sigmoid() * 2 - 0.5, (pwh.sigmoid() * 2) ** 2 * anchor), 1)
                iou = ciou(pbox, tbox)
                lbox = lbox + (1.0 - iou).mean()
                tobj[b, a, gj, gi] = iou.detach().clamp(0)     # objectness learns how good the box is
                if self.nc > 1:
                    t = torch.zeros_like(pcls)
                    t[torch.arange(len(b), device=dev), tcls] = 1.0
                    lcls = lcls + self.bce(pcls, t)
            lobj = lobj + self.bce(p[..., 4], tobj) * self.balance[i]
        lbox, lobj, lcls = lbox * self.box_gain, lobj * self.obj_gain, lcls * self.cls_gain
        bs = preds[0].shape[0]
        return (lbox + lobj + lcls) * bs, torch.stack((lbox, lobj, lcls)).detach()

    def assign(self, preds: list[torch.Tensor], targets: torch.Tensor):
        """Per scale: (image, anchor, grid y, grid x) of each positive, its target box (cell-relative
        cx, cy; w, h in cells), class, and anchor (in cells)."""
        dev = targets.device
        nt = targets.shape[0]
        # One copy of every target per anchor: [na, nt, 7] with the anchor index appended.
        ai = torch.arange(self.na, device=dev, dtype=targets.dtype).view(-1, 1).expand(-1, nt)
        t_all = torch.cat((targets.expand(self.na, -1, -1), ai[..., None]), 2)
        off = _OFFSETS.to(dev)
        out = []
        for i, p in enumerate(preds):
            h, w = p.shape[2:4]
            anchors = self.detect.anchors[i] / self.strides[i]          # [na, 2] in cells
            gain = torch.tensor([1, 1, w, h, w, h, 1], device=dev, dtype=targets.dtype)
            t = t_all * gain                                            # boxes in cells
            if nt:
                r = t[..., 4:6] / anchors[:, None]                      # w, h ratios to each anchor
                t = t[torch.max(r, 1 / r).max(2)[0] < self.anchor_t]    # [n, 7] matched (target, anchor)
                gxy = t[:, 2:4]
                gxi = gain[[2, 3]] - gxy
                # Neighbours: the left/up cell when the centre is in the left/upper half of its cell,
                # the right/down cell otherwise (never outside the grid).
                lft, up = ((gxy % 1 < 0.5) & (gxy > 1)).T
                rgt, dn = ((gxi % 1 < 0.5) & (gxi > 1)).T
                sel = torch.stack((torch.ones_like(lft), lft, up, rgt, dn))
                t = t.repeat((5, 1, 1))[sel]
                offsets = (torch.zeros_like(gxy)[None] + off[:, None])[sel]
            else:
                t, offsets = t_all[0], torch.zeros((0, 2), device=dev)
            b, c = t[:, 0].long(), t[:, 1].long()
            gxy, gwh, a = t[:, 2:4], t[:, 4:6], t[:, 6].long()
            gij = (gxy - offsets).long()
            gij[:, 0].clamp_(0, w - 1)
            gij[:, 1].clamp_(0, h - 1)
            out.append((b, a, gij[:, 1], gij[:, 0], torch.cat((gxy - gij, gwh), 1), c, anchors[a]))
        return out
