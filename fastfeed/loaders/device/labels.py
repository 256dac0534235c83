"""Every task's labels in the device loader (detection's: boxes alone), moved on the host in the planning workers by
the rules every loader uses (`augment.paste_labels`, `augment.letterbox_labels`), and its `Batch` extras with them
(`pipeline.BatchExtras`); why on the host: docs/design.md, 'The device loader plans on the host and draws on the
device'. What it carries, and what it cannot keep cheap:

* keypoints (pose) and rotated boxes (obb): [M,K,D] and [M,5] floats per batch, made here beside the targets.
* masks (segment) with `overlap_mask` (the default, Ultralytics' too): one int16 [S/r, S/r] per image,
  rasterised here (`augment.masks.rasterise`, as the cpu workers do) into the pool's shared mask slot and
  copied up with the payloads: B * (S/r)^2 * 2 bytes a batch (3.3 MB at 640, r 4, B 64).
* masks without `overlap_mask`: one [S/r, S/r] mask per object, M of them a batch (tens of MB at 640 for a
  COCO-like batch) through the workers' result queue and up to the device: not cheap; refused by name
  (its declaration, `renders.DEVICE`), use the cpu or shm loader (or overlap_mask=True).
"""

from __future__ import annotations

import numpy as np

from ...augment import letterbox_labels, make_targets, paste_labels
from ...augment.paste import region_crop
from ..pipeline import BatchExtras


class TaskGeometry:
    """Targets and extras of one planned batch of a task store (one per planning worker)."""

    def __init__(self, manifest, cfg):
        self.flip_idx = manifest.flip_idx
        self.size, self.augment = cfg.imgsz, cfg.augment
        self.extras = BatchExtras(cfg.task or manifest.task, cfg, tuple(manifest.kpt_shape or (0, 3)))

    def targets(self, matrices: np.ndarray, p, per_tile: list, plans, hyp, masks=None) -> tuple[np.ndarray, dict]:
        """(targets float32 [M,6], extras) of plan `p`: `matrices` [B,3,3] mid frame -> output, `per_tile`
        [(sample, tile slot, Tile)], `plans` the batch's SamplePlans (None: letterbox). A segment store's
        overlap masks go into `masks` (int16 [>=B, S/r, S/r], the pool's shared mask slot), not the extras."""
        S, b = self.size, len(p.tiles)
        shown: list[list] = [[] for _ in range(b)]
        for j, t, tl in per_tile:
            shown[j].append((t, tl))
        rows = []
        for j, tiles in enumerate(shown):
            if plans is None:   # letterbox: the mid frame is the image, matrices[j] scales and pads it
                m = matrices[j]
                labels = letterbox_labels(tiles[0][1].labels, (m[0, 0], m[1, 1]), (m[0, 2], m[1, 2]))
            else:
                ts = np.array([t for t, _ in tiles])
                r, ox, oy = p.place[j, ts].T
                tile_to_mid = np.zeros((len(ts), 3, 3))
                tile_to_mid[:, 0, 0] = tile_to_mid[:, 1, 1] = r
                tile_to_mid[:, 0, 2], tile_to_mid[:, 1, 2], tile_to_mid[:, 2, 2] = ox, oy, 1.0
                # the device samples each tile's exact map over its whole region: that is the realised map and crop
                crops = region_crop(p.place[j, ts], p.region[j, ts], p.shapes[j, ts])
                labels = paste_labels([tl.labels for _, tl in tiles], matrices[j] @ tile_to_mid, crops, S, hyp,
                                      crops, flip_lr=plans[j].geometry.affine.flip_lr, flip_idx=self.flip_idx)
            if len(labels):
                rows.append(make_targets(j, labels.classes, labels.boxes, S))
            self.extras.add(labels, None if masks is None else masks[j])
        targets = np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, 6), np.float32)
        return targets, self.extras.finish()
