"""COCO mAP@0.5 and mAP@0.5:0.95 of a model on a store, with pycocotools.

The ground truth is built from the store itself: every image (with or without boxes) by its source
image id, boxes in original pixels (`orig_size`), crowd regions as `iscrowd=1` (matching one is
neither a hit nor a miss), classes mapped back to the source's category ids. The model sees the
loader's letterboxed evaluation batches (`LoaderConfig(augment=False)`); its boxes are mapped back
from the letterboxed frame to original pixels before they are scored, as a user's would be.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass

import numpy as np
import torch

from ..augment import letterbox_geometry
from ..progress import bar as progress_bar
from .boxes import postprocess
from .device import autocast, device_batches

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageFrame:
    """Where an image sits in its letterboxed evaluation frame, and its original size."""

    image_id: int
    orig_h: int
    orig_w: int
    left: int
    top: int
    nw: int
    nh: int

    def to_original(self, xyxy: np.ndarray) -> np.ndarray:
        """Letterboxed-frame pixels -> original-image pixels, clipped to the image."""
        out = np.empty_like(xyxy, dtype=np.float64)
        out[:, [0, 2]] = ((xyxy[:, [0, 2]] - self.left) / self.nw * self.orig_w).clip(0, self.orig_w)
        out[:, [1, 3]] = ((xyxy[:, [1, 3]] - self.top) / self.nh * self.orig_h).clip(0, self.orig_h)
        return out


def letterbox_frame(record, imgsz: int) -> tuple[int, int, int, int]:
    """(left, top, nw, nh) of a record's letterboxed image, exactly as the loader builds it: decoded at
    the size `Record.tile_size` gives, then `augment.letterbox_geometry`."""
    h, w = record.tile_size(imgsz)
    g = letterbox_geometry(h, w, imgsz)
    return g.left, g.top, g.nw, g.nh


def coco_ground_truth(store, imgsz: int):
    """(pycocotools COCO of the store's boxes in original pixels, [ImageFrame] in store order)."""
    from pycocotools.coco import COCO

    cat_ids = store.category_ids
    images, anns, frames = [], [], []
    for i in range(len(store)):
        r = store.record(i)
        oh, ow = r.orig_size
        images.append({"id": int(r.image_id), "height": oh, "width": ow})
        frames.append(ImageFrame(int(r.image_id), oh, ow, *letterbox_frame(r, imgsz)))
        boxes = np.concatenate([r.boxes, r.crowd_boxes])
        classes = np.concatenate([r.classes, r.crowd_classes])
        px = boxes.astype(np.float64) * [ow, oh, ow, oh]
        for k, (b, c) in enumerate(zip(px, classes)):
            w, h = b[2] - b[0], b[3] - b[1]
            # Box area stands in for the segment area COCO uses for its small/medium/large split.
            anns.append({"id": len(anns) + 1, "image_id": int(r.image_id), "category_id": int(cat_ids[c]),
                         "bbox": [b[0], b[1], w, h], "area": w * h, "iscrowd": int(k >= len(r.boxes))})
    gt = COCO()
    gt.dataset = {"images": images, "annotations": anns,
                  "categories": [{"id": int(c), "name": n} for c, n in zip(cat_ids, store.class_names)]}
    with contextlib.redirect_stdout(io.StringIO()):   # pycocotools prints; only the CLI may
        gt.createIndex()
    return gt, frames


def to_coco_detections(dets: torch.Tensor, frame: ImageFrame, category_ids: list[int]) -> list[dict]:
    """[K, 6] x1, y1, x2, y2, score, class in the letterboxed frame -> COCO result dicts."""
    d = dets.detach().float().cpu().numpy()
    if not len(d):
        return []
    xyxy = frame.to_original(d[:, :4])
    return [{"image_id": frame.image_id, "category_id": int(category_ids[int(c)]),
             "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])], "score": float(s)}
            for b, s, c in zip(xyxy, d[:, 4], d[:, 5])]


def coco_map(gt, detections: list[dict]) -> dict:
    """pycocotools' bbox evaluation -> {'map50', 'map', 'stats'} (stats: the 12 COCO figures)."""
    from pycocotools.cocoeval import COCOeval

    if not detections:
        return {"map50": 0.0, "map": 0.0, "stats": [0.0] * 12}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        dt = gt.loadRes(detections)
        e = COCOeval(gt, dt, "bbox")
        e.evaluate()
        e.accumulate()
        e.summarize()
    log.debug("pycocotools:\n%s", buf.getvalue())
    stats = [max(float(s), 0.0) for s in e.stats]   # -1: no ground truth in that bucket
    return {"map50": stats[1], "map": stats[0], "stats": stats}


@torch.no_grad()
def evaluate(model, store, *, imgsz: int, batch_size: int, device: torch.device, workers: int | None = None,
             loader: str = "cpu", amp: str | None = None, conf_thres: float = 0.001, iou_thres: float = 0.6,
             progress: bool = False, channels_last: bool = False, stop=None) -> dict | None:
    """mAP of `model` (a YOLO, not DDP-wrapped) on every image of `store`, in store order (`channels_last`:
    batches in that layout, for a model trained in it). `stop`: a callable asked before each batch; when it
    says True the evaluation is abandoned and None returned (a stop signal during it)."""
    from ..loaders import LoaderConfig, create_loader

    gt, frames = coco_ground_truth(store, imgsz)
    kw = {} if workers is None else {"workers": workers}
    # rank 0 of 1 whatever torch.distributed says: evaluation sees the whole store, in order; boxes alone, from a
    # store of any task (the model detects).
    cfg = LoaderConfig(imgsz=imgsz, batch_size=batch_size, augment=False, shuffle=False, drop_last=False,
                       rank=0, world_size=1, device=str(device), task="detect", **kw)
    was_training = model.training
    model.eval()
    detections, seen = [], 0
    ld = create_loader(loader, store, cfg)
    feed = device_batches(ld, device, torch.float32, channels_last=channels_last)
    try:
        feed.set_epoch(0)
        for images, _ in progress_bar(progress=progress, iterable=feed, total=len(ld), desc="eval", unit="batch",
                                      leave=False):
            if stop is not None and stop():
                return None
            with autocast(device, amp):
                pred = model.predict(images)
            for dets in postprocess(pred.float(), conf_thres, iou_thres):
                detections += to_coco_detections(dets, frames[seen], store.category_ids)
                seen += 1
    finally:
        feed.close()
        ld.close()
        model.train(was_training)
    assert seen == len(store), f"evaluated {seen} of {len(store)} images"
    res = coco_map(gt, detections)
    res["images"], res["detections"] = seen, len(detections)
    return res
