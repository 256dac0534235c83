"""fastfeed batches in the form Ultralytics' trainer, loss and plots read, and the store's labels in the form its
dataset exposes them (`dataset.labels`). A `Batch` (docs/design.md, 'Contracts') already follows Ultralytics'
conventions, so collation is a few views of the same tensors; the images stay uint8 (preprocess_batch converts them
on the device), or, from the device loader, the float images it made there.

The segment, pose and OBB parts of a trainer batch and of `dataset.labels` come from a fastfeed Batch's extras
(`batch.masks`, `batch.keypoints`, `batch.rboxes`: rows in the order of its targets) and the store's records.

What each task's loss reads, as Ultralytics' own dataset hands it over:
  segment  `masks`: overlap_mask: [B, h, w], value j+1 where the image's j-th object (in batch order) is, else
           [M, h, w] 0/1; `sem_masks` [B, h, w] float: the class of the object shown at each pixel (a semantic
           head's target; 0 where none is)
  pose     `keypoints` [M, K, 3]: x, y normalised to the image, visibility (0: unlabelled or hidden)
  obb      `bboxes` [M, 5]: cx, cy, w, h normalised, angle in radians (the rotated box replaces the upright one)
`classes=` keeps some rows: every extra keeps the same rows, and overlap masks are renumbered so that value j+1
is again the j-th kept object of the image (a dropped object's pixels become background).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ... import tasks
from ...augment.boxes import xyxy_to_cxcywh


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


def _rank_in_image(image: torch.Tensor, batch_size: int) -> torch.Tensor:
    """For each row, how many rows of the same image come before it (the object's j within its image)."""
    if not len(image):
        return image
    onehot = torch.nn.functional.one_hot(image, batch_size)
    return (onehot.cumsum(0) - 1).gather(1, image[:, None]).squeeze(1)


def _lookup(masks: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """`table[b, masks[b]]` for every image b: overlap masks' values mapped through a per-image table."""
    b = masks.shape[0]
    return table.gather(1, masks.reshape(b, -1).long()).view(masks.shape)


def _table(image, rank, batch_size, width, values) -> torch.Tensor:
    """[B, width] zeros with `values` at (image, rank + 1) of each row."""
    table = torch.zeros(batch_size, width, dtype=values.dtype, device=values.device)
    table[image, rank + 1] = values
    return table


def mask_fields(masks: torch.Tensor, targets: torch.Tensor, keep, cls: torch.Tensor, overlap: bool,
                batch_size: int) -> dict:
    """`masks` and `sem_masks` for the rows `keep` (None: all) of `targets` (the loader's, before filtering); `cls`
    is the kept rows' classes as the loss sees them (after single_cls)."""
    dev = masks.device
    image, cls = targets[:, 0].long().to(dev), cls.reshape(-1).to(dev, torch.float32)
    keep = None if keep is None else keep.to(dev)
    if not overlap:
        if keep is not None:
            masks, image = masks[keep], image[keep]
        return {"masks": masks, "sem_masks": _semantic_separate(masks, image, cls, batch_size)}
    rank = _rank_in_image(image, batch_size)
    width = int(rank.max()) + 2 if len(rank) else 1   # an image's values: 0 (background) and 1..its objects
    if keep is not None:
        new = torch.zeros_like(rank)   # a kept row: its rank among its image's kept rows + 1; a dropped one: 0
        new[keep] = _rank_in_image(image[keep], batch_size) + 1
        masks = _lookup(masks, _table(image, rank, batch_size, width, new)).to(masks.dtype)
        image, rank = image[keep], new[keep] - 1
    return {"masks": masks, "sem_masks": _lookup(masks, _table(image, rank, batch_size, width, cls))}


def _semantic_separate(masks: torch.Tensor, image: torch.Tensor, cls: torch.Tensor, batch_size: int) -> torch.Tensor:
    """[B, h, w]: at each pixel the class of the smallest object covering it (as overlap masks show it), else 0."""
    sem = torch.zeros(batch_size, *masks.shape[-2:], dtype=torch.float32, device=masks.device)
    for i in range(batch_size):
        m = masks[image == i].bool()
        if not len(m):
            continue
        area = m.sum((1, 2))
        key = torch.where(m, area[:, None, None], int(area.max()) + 1)
        sem[i] = cls[image == i][key.min(0).indices] * m.any(0)
    return sem


def extra_fields(extras: dict, targets: torch.Tensor, keep, cls: torch.Tensor, overlap: bool, batch_size: int) -> dict:
    """The task's fields of a trainer batch from a Batch's `extras()` (rows `keep` of `targets`, None: all)."""
    out = {}
    for spec in tasks.GEOMETRY_TASKS:
        value = extras.get(spec.extra)
        if value is None:
            continue
        if spec.extra == "masks":   # drawn per image or per object: re-indexed to the kept rows
            out.update(mask_fields(value, targets, keep, cls, overlap, batch_size))
        else:
            out[spec.ultralytics_key] = (value if keep is None else value[keep.to(value.device)]).contiguous()
    return out


def label_extras(task: str, record) -> dict:
    """A record's task geometry as Ultralytics' dataset labels hold it (normalised): `segments` (segment: a
    polygon per object, obb: its four corners) and `keypoints` [N, K, 3] (`tasks.Task.ultralytics_labels`)."""
    spec = tasks.get(task)
    value = getattr(record, spec.field) if spec.field else None
    return {} if value is None else spec.ultralytics_labels(value)


def take_labels(extra: dict, keep) -> dict:
    """The rows `keep` (a boolean array; None: all) of `label_extras`."""
    if keep is None:
        return extra
    return {k: [s for s, y in zip(v, keep) if y] if k == "segments" else v[keep] for k, v in extra.items()}
