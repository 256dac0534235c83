"""Per-worker batch building, the per-sample hot path: read -> decode -> augment -> write into the output slot; the
one build loop of the cpu and shm loaders, for every task (docs/design.md, 'One description per task, one build
loop'). What differs between loaders is only where decoded tiles come from (a `SampleSource`: the store with a JPEG
decode, or a shared decoded cache). Stage times are measured here and summed per batch.
"""

from __future__ import annotations

from time import perf_counter

import cv2
import numpy as np

from .. import augment
from ..augment.masks import mask_side, rasterise
from ..store.reader import Store
from ..tasks import get as task_spec
from .base import LoaderConfig
from .partners import PartnerBuffer


class StoreSource:
    """Decoded samples straight from a `Store`: each record's tile (`Record.decode_tile`: JPEGs decoded at the
    smallest DCT scale that covers it, then area-resized; raw payloads stored at that size are zero-copy views),
    and its labels for `task` (its own task, or boxes alone: 'detect')."""

    def __init__(self, store: Store, imgsz: int, task: str = "detect"):
        self.store, self.imgsz, self.task = store, imgsz, task

    def load(self, index: int, times: dict) -> tuple[np.ndarray, augment.Labels]:
        """(image HWC RGB, its `augment.Labels` in its pixels) of record `index`."""
        t0 = perf_counter()
        r = self.store.record(index)
        t1 = perf_counter()
        img = r.decode_tile(self.imgsz)
        times["read"] += t1 - t0
        times["decode"] += perf_counter() - t1
        return img, augment.Labels.of_record(r, img.shape[1], img.shape[0], self.task)

    def arrival(self, indices):
        return self.store.arrival(indices)


class BatchExtras:
    """A batch's task extras (`tasks.Task.extra`), built sample by sample in the targets' row order: keypoints and
    rotated boxes as `augment.batch_rows` gives them, masks rasterised at imgsz / mask_ratio
    (`augment.masks.rasterise`): with overlap_mask straight into the batch's shared int16 mask slot, else one
    uint8 mask per object sent with the result. The cpu/shm builder and the device loader's planner share it."""

    def __init__(self, task: str, cfg: LoaderConfig, kpt_shape=None):
        self.spec, self.size, self.kpt_shape = task_spec(task), cfg.imgsz, kpt_shape
        self.ratio, self.overlap, self.rule = cfg.mask_ratio, cfg.overlap_mask, cfg.mask_rule
        self.masks = self.spec.extra == "masks"   # drawn, not listed: the one extra rendered at its own resolution
        self.parts: list = []

    def add(self, labels: augment.Labels, mask_slot: np.ndarray | None = None) -> None:
        """One sample's share (labels in output pixels); its overlap mask goes into `mask_slot`."""
        if self.spec.extra is None:
            return
        if not self.masks:
            self.parts.append(augment.batch_rows(labels, self.size))
        elif self.overlap:
            rasterise(labels.polygons, self.size, self.ratio, True, out=mask_slot, rule=self.rule)
        else:
            self.parts.append(rasterise(labels.polygons, self.size, self.ratio, False, rule=self.rule))

    def finish(self) -> dict:
        """name -> numpy array: the Batch's extras not in a shared slot (none for detect or overlap masks); resets."""
        parts, self.parts = self.parts, []
        if self.spec.extra is None or (self.masks and self.overlap):
            return {}
        empty = self.spec.empty_extra(self.kpt_shape, mask_side(self.size, self.ratio))
        return {self.spec.extra: np.concatenate(parts) if parts else empty}


class BatchBuilder:
    """Builds batches inside one worker: the batch's plans (`PartnerBuffer.plan_batch`: randomness from (seed,
    rank, epoch, batch id), mosaic partners from this worker's buffer of recently loaded images) rendered with
    OpenCV. Batches are the same for the same seed, world size and worker count."""

    def __init__(self, source, cfg: LoaderConfig, rank: int, partner_buffer: int, manifest=None):
        self.source, self.cfg, self.rank = source, cfg, rank
        self.size = cfg.imgsz
        self.hyp = cfg.worker_hyp()
        self.scratch = np.empty((self.size, self.size, 3), np.uint8)
        self.plane_scratch = np.empty((self.size, self.size), np.uint8)
        self.mix_scratch = None    # a second sample (mixup, cutmix), allocated on first use
        self.partners = PartnerBuffer(partner_buffer, source.load, keep=cfg.augment, order=source.arrival)
        self.flip_idx = getattr(manifest, "flip_idx", None)
        self.extras = BatchExtras(source.task, cfg, tuple(getattr(manifest, "kpt_shape", None) or (0, 3)))

    def warm(self, indices, reset: bool) -> None:
        """Load `indices` into the partner buffer only (`PartnerBuffer.warm`: what resuming replays)."""
        self.partners.warm(indices, reset)

    def _render(self, own, geometry: augment.Geometry, out: np.ndarray):
        """(out, Labels) of `geometry` over `own` and its partners (`augment.render_labels`)."""
        tiles = [own] + [self.partners[k] for k in geometry.partners or ()]
        return augment.render_labels(tiles, geometry, self.size, self.hyp, out, flip_idx=self.flip_idx)

    def _second(self, other: int, geometry: augment.Geometry):
        """A second sample of a plan (mixup, cutmix), rendered (`_render`) into its own scratch, made on first use."""
        if self.mix_scratch is None:
            self.mix_scratch = np.empty_like(self.scratch)
        return self._render(self.partners[other], geometry, self.mix_scratch)

    def build(self, indices, epoch: int, batch_id: int, mosaic_on: bool, out: np.ndarray, masks: np.ndarray = None):
        """Fill out[:len(indices)] (uint8 [B,3,S,S]; and masks[:len(indices)] with overlap masks); return ((targets
        float32 [M,6], extras: name -> numpy array, the Batch's fields not in a shared slot), stage seconds)."""
        cfg, hyp, S = self.cfg, self.hyp, self.size
        times = {"read": 0.0, "decode": 0.0, "augment": 0.0, "collate": 0.0}
        loaded, plans = self.partners.plan_batch(indices, times, seed=cfg.seed, rank=self.rank, epoch=epoch,
                                                 batch=batch_id, hyp=hyp, size=S, augment=cfg.augment,
                                                 mosaic_on=mosaic_on, mixup_on=cfg.mixup_on(epoch))
        targets = []
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
            self.extras.add(labels, None if masks is None else masks[j])
            times["augment"] += t1 - t0
            times["collate"] += perf_counter() - t1
        t = np.concatenate(targets) if targets else np.zeros((0, 6), np.float32)
        return (t, self.extras.finish()), times

