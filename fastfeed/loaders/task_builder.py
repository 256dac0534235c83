"""The cpu and shm workers' batch builder for a segment, pose or OBB store: `pipeline.BatchBuilder`'s plans and
pixels, with each object's geometry carried through them (`augment.Labels`, `augment.render_labels`) into the
batch's extras.

A detect store never comes here (`make_builder` chooses once per worker), so its per-sample path is the
one it always was. Per sample: the targets rows as for boxes; then, rows in the targets' order,
    segment  the polygons rasterised at imgsz / mask_ratio (`augment.masks.rasterise`): overlap_mask straight into
             the batch's shared int16 mask slot (`WorkerPool.masks`), else uint8 [M, h, w] sent with the result
    pose     keypoints [M, K, D], x, y normalised by imgsz (visibility as it is)
    obb      rboxes [M, 5]: `augment.corners_to_rboxes`, cx, cy, w, h normalised by imgsz, the angle as it is
"""

from __future__ import annotations

from time import perf_counter

import cv2
import numpy as np

from .. import augment
from ..augment.masks import mask_side, rasterise
from .base import LoaderConfig
from .pipeline import BatchBuilder
from .tasks import batch_task


class TaskBatchBuilder(BatchBuilder):
    """A `BatchBuilder` whose samples are (image, `augment.Labels`); `build` also returns the batch's extras."""

    def __init__(self, source, cfg: LoaderConfig, rank: int, partner_buffer: int, manifest):
        super().__init__(source, cfg, rank, partner_buffer)
        self.task = manifest.task
        self.flip_idx = manifest.flip_idx
        self.kpt_shape = tuple(manifest.kpt_shape or (0, 3))
        self.ratio, self.overlap, self.rule = cfg.mask_ratio, cfg.overlap_mask, cfg.mask_rule

    def _load(self, index: int, times: dict):
        img, record = self.source.load_record(index, times)
        h, w = img.shape[:2]
        return img, augment.Labels.of_record(record, w, h)

    def _render(self, own, geometry: augment.Geometry, out: np.ndarray):
        tiles = [own] + [self.partners[k] for k in geometry.partners or ()]
        return augment.render_labels(tiles, geometry, self.size, self.hyp, out, flip_idx=self.flip_idx)

    def build(self, indices, epoch: int, batch_id: int, mosaic_on: bool, out: np.ndarray, masks: np.ndarray = None):
        """Fill out[:len(indices)] (and masks[:len(indices)] with overlap masks); return ((targets, extras),
        stage seconds), extras: name -> numpy array, the Batch's fields not in a shared slot."""
        cfg, hyp, S = self.cfg, self.hyp, self.size
        times = {"read": 0.0, "decode": 0.0, "augment": 0.0, "collate": 0.0}
        loaded, plans = self.partners.plan_batch(indices, times, seed=cfg.seed, rank=self.rank, epoch=epoch,
                                                 batch=batch_id, hyp=hyp, size=S, augment=cfg.augment,
                                                 mosaic_on=mosaic_on, mixup_on=cfg.mixup_on(epoch))
        targets, parts = [], []
        for j, (img, labels) in enumerate(loaded):
            t0 = perf_counter()
            o = out[j]
            if plans is None:
                res, ratio, pad = augment.letterbox(img, S, fill=hyp.fill, out=self.scratch)
                labels = augment.letterbox_labels(labels, ratio, pad)
                cv2.split(res, [o[0], o[1], o[2]])   # the slot is CHW: written plane by plane
            else:
                plan = plans[j]
                res, labels = self._render((img, labels), plan.geometry, self.scratch)
                res, labels = augment.mix_in(res, labels, plan, self._second, hyp)
                augment.finish_pixels(res, o, plan, self.plane_scratch)
            t1 = perf_counter()
            if len(labels):
                targets.append(augment.make_targets(j, labels.classes, labels.boxes, S))
            parts.append(self._geometry(labels, None if masks is None else masks[j]))
            times["augment"] += t1 - t0
            times["collate"] += perf_counter() - t1
        t = np.concatenate(targets) if targets else np.zeros((0, 6), np.float32)
        return (t, self._extras(parts)), times

    def _geometry(self, labels, mask_slot):
        """One sample's share of the extras, rows in its targets' order (its overlap mask: into `mask_slot`)."""
        S = self.size
        if self.task == "segment":
            if self.overlap:
                rasterise(labels.polygons, S, self.ratio, True, out=mask_slot, rule=self.rule)
                return None
            return rasterise(labels.polygons, S, self.ratio, False, rule=self.rule)
        return augment.batch_rows(labels, S)

    def _extras(self, parts: list) -> dict:
        if self.task == "segment":
            if self.overlap:
                return {}
            side = mask_side(self.size, self.ratio)
            return {"masks": np.concatenate(parts) if parts else np.zeros((0, side, side), np.uint8)}
        if self.task == "pose":
            return {"keypoints": np.concatenate(parts) if parts else np.zeros((0, *self.kpt_shape), np.float32)}
        return {"rboxes": np.concatenate(parts) if parts else np.zeros((0, 5), np.float32)}



def make_builder(source, store, cfg: LoaderConfig, rank: int, partner_buffer: int) -> BatchBuilder:
    """The builder a cpu or shm worker runs for `store`: `pipeline.BatchBuilder` (boxes only, the path it always
    had) for detection batches (a detect store, or any with task='detect'), a `TaskBatchBuilder` for a segment,
    pose or OBB store's own."""
    if batch_task(store, cfg) == "detect":
        return BatchBuilder(source, cfg, rank, partner_buffer)
    return TaskBatchBuilder(source, cfg, rank, partner_buffer, store.manifest)
