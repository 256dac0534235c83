"""Per-worker batch building: read -> decode -> augment -> write into the output slot.

This is the per-sample hot path, shared by every CPU-side loader; what differs between loaders is
only where decoded pixels come from (a `SampleSource`: the store with a JPEG decode, or a shared
decoded cache). Stage times are measured here and summed per batch.
"""

from __future__ import annotations

from time import perf_counter

import cv2
import numpy as np

from .. import augment
from ..store.reader import Store
from .base import LoaderConfig
from .partners import PartnerBuffer


class StoreSource:
    """Decoded samples straight from a `Store`: JPEGs decoded at the smallest DCT scale that still
    gives a long side >= imgsz (what the output needs); raw payloads are zero-copy views."""

    def __init__(self, store: Store, imgsz: int):
        self.store, self.imgsz = store, imgsz

    def load(self, index: int, times: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(image HWC RGB, boxes normalised xyxy float32, classes int64) of record `index`."""
        t0 = perf_counter()
        r = self.store.record(index)
        t1 = perf_counter()
        img = r.decode_to_cover(self.imgsz)
        t2 = perf_counter()
        times["read"] += t1 - t0
        times["decode"] += t2 - t1
        return img, r.boxes, r.classes

    def load_record(self, index: int, times: dict):
        """(image HWC RGB, the `Record` it came from): what a segment, pose or OBB sample is built from."""
        t0 = perf_counter()
        r = self.store.record(index)
        t1 = perf_counter()
        img = r.decode_to_cover(self.imgsz)
        times["read"] += t1 - t0
        times["decode"] += perf_counter() - t1
        return img, r


class BatchBuilder:
    """Builds batches inside one worker: the batch's plans (`PartnerBuffer.plan_batch`: randomness from (seed,
    rank, epoch, batch id), mosaic partners from this worker's buffer of recently loaded images) rendered with
    OpenCV. Batches are the same for the same seed, world size and worker count."""

    def __init__(self, source, cfg: LoaderConfig, rank: int, partner_buffer: int):
        self.source, self.cfg, self.rank = source, cfg, rank
        self.size = cfg.imgsz
        self.hyp = cfg.worker_hyp()
        self.scratch = np.empty((self.size, self.size, 3), np.uint8)
        self.plane_scratch = np.empty((self.size, self.size), np.uint8)
        self.mix_scratch = None    # a second sample (mixup, cutmix), allocated on first use
        self.partners = PartnerBuffer(partner_buffer, self._load, keep=cfg.augment)

    def _load(self, index: int, times: dict):
        img, nboxes, classes = self.source.load(index, times)
        h, w = img.shape[:2]
        return img, nboxes * np.array([w, h, w, h], np.float32), classes

    def warm(self, indices, reset: bool) -> None:
        """Load `indices` into the partner buffer only (`PartnerBuffer.warm`: what resuming replays)."""
        self.partners.warm(indices, reset)

    def _render(self, own, geometry: augment.Geometry, out: np.ndarray):
        """(out, Labels) of `geometry` over `own` and its partners (`augment.render_labels`)."""
        tiles = [(t[0], augment.Labels(t[1], t[2])) for t in [own] + [self.partners[k] for k in geometry.partners or ()]]
        return augment.render_labels(tiles, geometry, self.size, self.hyp, out)

    def _second(self, other: int, geometry: augment.Geometry):
        """A second sample of a plan (mixup, cutmix), rendered (`_render`) into its own scratch, made on first use."""
        if self.mix_scratch is None:
            self.mix_scratch = np.empty_like(self.scratch)
        return self._render(self.partners[other], geometry, self.mix_scratch)

    def build(self, indices, epoch: int, batch_id: int, mosaic_on: bool, out: np.ndarray):
        """Fill out[:len(indices)] (uint8 [B,3,S,S]); return (targets float32 [M,6], stage seconds)."""
        cfg, hyp, S = self.cfg, self.hyp, self.size
        times = {"read": 0.0, "decode": 0.0, "augment": 0.0, "collate": 0.0}
        loaded, plans = self.partners.plan_batch(indices, times, seed=cfg.seed, rank=self.rank, epoch=epoch,
                                                 batch=batch_id, hyp=hyp, size=S, augment=cfg.augment,
                                                 mosaic_on=mosaic_on, mixup_on=cfg.mixup_on(epoch))
        targets = []
        for j, (img, boxes, classes) in enumerate(loaded):
            t0 = perf_counter()
            o = out[j]
            if plans is None:
                res, ratio, pad = augment.letterbox(img, S, fill=hyp.fill, out=self.scratch)
                boxes = augment.letterbox_boxes(boxes, ratio, pad)
                cv2.split(res, [o[0], o[1], o[2]])   # the slot is CHW: written plane by plane
            else:
                plan = plans[j]
                res, labels = self._render((img, boxes, classes), plan.geometry, self.scratch)
                res, labels = augment.mix_in(res, labels, plan, self._second, hyp)
                boxes, classes = labels.boxes, labels.classes
                augment.finish_pixels(res, o, plan, self.plane_scratch)
            t1 = perf_counter()
            if len(boxes):
                targets.append(augment.make_targets(j, classes, boxes, S))
            times["augment"] += t1 - t0
            times["collate"] += perf_counter() - t1
        return (np.concatenate(targets) if targets else np.zeros((0, 6), np.float32)), times
