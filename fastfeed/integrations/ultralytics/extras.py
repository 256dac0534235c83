"""The segment, pose and OBB parts of a trainer batch and of `dataset.labels`, from a fastfeed Batch's extras
(`batch.masks`, `batch.keypoints`, `batch.rboxes`: rows in the order of its targets) and the store's records.

What each task's loss reads, as Ultralytics' own dataset hands it over:
  segment  `masks`: overlap_mask: [B, h, w], value j+1 where the image's j-th object (in batch order) is, else
           [M, h, w] 0/1; `sem_masks` [B, h, w] float: the class of the object shown at each pixel (a semantic
           head's target; 0 where none is)
  pose     `keypoints` [M, K, D]: x, y normalised to the image (+ visibility)
  obb      `bboxes` [M, 5]: cx, cy, w, h normalised, angle in radians (the rotated box replaces the upright one)
`classes=` keeps some rows: every extra keeps the same rows, and overlap masks are renumbered so that value j+1
is again the j-th kept object of the image (a dropped object's pixels become background).
"""

from __future__ import annotations

import torch

from ... import tasks


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
    polygon per object, obb: its four corners) and `keypoints` [N, K, D] (`tasks.Task.ultralytics_labels`)."""
    spec = tasks.get(task)
    value = getattr(record, spec.field) if spec.field else None
    return {} if value is None else spec.ultralytics_labels(value)


def take_labels(extra: dict, keep) -> dict:
    """The rows `keep` (a boolean array; None: all) of `label_extras`."""
    if keep is None:
        return extra
    out = dict(extra)
    if "segments" in out:
        out["segments"] = [s for s, k in zip(out["segments"], keep) if k]
    if "keypoints" in out:
        out["keypoints"] = out["keypoints"][keep]
    return out
