"""fastfeed batches in the form Ultralytics' trainer, loss and plots read, and the store's labels in the form its
dataset exposes them (`dataset.labels`). A `Batch` (docs/design.md, 'Contracts') already follows Ultralytics'
conventions, so collation is a few views of the same tensors; the images stay uint8 (preprocess_batch converts them
on the device), or, from the device loader, the float images it made there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ... import tasks
from ...augment.boxes import xyxy_to_cxcywh
from .extras import extra_fields, label_extras, take_labels


@dataclass
class RecordInfo:
    """Per-record metadata read once from the record headers (no image is read or decoded)."""

    files: list[str]           # im_file: the source image path
    shapes: np.ndarray         # int [N,2] (h, w) of the source image
    boxes: list[np.ndarray]    # float32 [n,4] cx, cy, w, h normalised
    classes: list[np.ndarray]  # int64 [n]
    extras: list[dict] | None = None   # segment, pose, obb: each record's `label_extras` (segments, keypoints)


def read_records(store, image_dir: Path | None) -> RecordInfo:
    task = getattr(store.manifest, "task", "detect")
    files, shapes, boxes, classes, extras = [], np.zeros((len(store), 2), np.int64), [], [], []
    for i in range(len(store)):
        r = store.record(i, check_crc=False)   # labels and sizes only: no payload is read or decoded
        files.append(str(image_dir / r.file_name) if image_dir is not None else r.file_name)
        shapes[i] = r.orig_size
        boxes.append(xyxy_to_cxcywh(r.boxes))   # the training boxes (iscrowd regions are kept apart), normalised
        classes.append(r.classes)
        extras.append(label_extras(task, r))
    return RecordInfo(files, shapes, boxes, classes, extras if tasks.get(task).field else None)


class ClassFilter:
    """Ultralytics' `classes` (keep only these ids) and `single_cls` (every id becomes 0), in its order."""

    def __init__(self, classes=None, single_cls: bool = False):
        self.keep = None if classes is None else np.asarray(classes, np.int64).reshape(-1)
        self.single_cls = bool(single_cls)

    def mask(self, cls):
        """Which of `cls` (numpy, or a torch tensor on any device) to keep; None: all."""
        if self.keep is None:
            return None
        if isinstance(cls, torch.Tensor):
            return torch.isin(cls.long(), torch.as_tensor(self.keep, device=cls.device))
        return np.isin(cls, self.keep)

    def __bool__(self) -> bool:
        return self.keep is not None or self.single_cls


def labels(info: RecordInfo, filt: ClassFilter) -> list[dict]:
    """`dataset.labels` as Ultralytics' YOLODataset has them (what its plots and max_det check read)."""
    out = []
    extras = info.extras or [{}] * len(info.files)
    for f, shape, b, c, extra in zip(info.files, info.shapes, info.boxes, info.classes, extras):
        keep = filt.mask(c)
        if keep is not None:
            b, c = b[keep], c[keep]
        cls = np.zeros((len(c), 1), np.float32) if filt.single_cls else c.astype(np.float32).reshape(-1, 1)
        out.append({"im_file": f, "shape": (int(shape[0]), int(shape[1])), "cls": cls, "bboxes": b,
                    "segments": [], "keypoints": None, "normalized": True, "bbox_format": "xywh",
                    **take_labels(extra, keep)})
    return out


def collate(images: torch.Tensor, targets: torch.Tensor, indices, info: RecordInfo, filt: ClassFilter,
            extras: dict | None = None, overlap: bool = True) -> dict:
    """One trainer batch, on the device the loader's batch is on. `img` is the loader's images themselves (no
    copy): a host loader's uint8 buffer is valid until the next batch. `extras`: the Batch's (`Batch.extras()`),
    `overlap`: whether its masks are overlap masks (LoaderConfig.overlap_mask)."""
    given, keep = targets, None
    if filt:
        keep = filt.mask(targets[:, 1])
        if keep is not None:
            targets = targets[keep]
        if filt.single_cls:
            targets = targets.clone()
            targets[:, 1] = 0
    size = int(images.shape[-1])
    shapes = [tuple(int(v) for v in info.shapes[i]) for i in indices]
    task = extra_fields(extras, given, keep, targets[:, 1], overlap, len(images)) if extras else {}
    return {
        "batch_idx": targets[:, 0].contiguous(),
        "bboxes": targets[:, 2:6].contiguous(),
        "cls": targets[:, 1:2].contiguous(),
        "im_file": tuple(info.files[i] for i in indices),
        "img": images,
        "ori_shape": tuple(shapes),
        "ratio_pad": tuple((size / max(s), size / max(s)) for s in shapes),
        "resized_shape": tuple((size, size) for _ in shapes),
        **task,   # obb: `bboxes` the rotated boxes
    }
