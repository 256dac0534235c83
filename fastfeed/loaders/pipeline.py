"""Per-worker batch building: read -> decode -> augment -> write into the output slot.

This is the per-sample hot path, shared by every CPU-side loader; what differs between loaders is
only where decoded pixels come from (a `SampleSource`: the store with a JPEG decode, or a shared
decoded cache). Stage times are measured here and summed per batch.
"""

from __future__ import annotations

from collections import deque
from time import perf_counter

import cv2
import numpy as np

from .. import augment
from ..store.reader import Store
from .base import LoaderConfig


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


class BatchBuilder:
    """Builds batches inside one worker. Randomness comes from (seed, rank, epoch, batch id), and
    mosaic partners from this worker's buffer of recently loaded images, so batches are the same for
    the same seed, world size and worker count."""

    def __init__(self, source, cfg: LoaderConfig, rank: int, partner_buffer: int):
        self.source, self.cfg, self.rank = source, cfg, rank
        self.size = cfg.imgsz
        self.hyp = cfg.worker_hyp()
        self.scratch = np.empty((self.size, self.size, 3), np.uint8)
        self.plane_scratch = np.empty((self.size, self.size), np.uint8)
        self.mix_scratch = None    # the second sample of a mixup, allocated on first use
        self.partners: deque = deque(maxlen=partner_buffer)

    def _load(self, index: int, times: dict):
        img, nboxes, classes = self.source.load(int(index), times)
        h, w = img.shape[:2]
        sample = (img, nboxes * np.array([w, h, w, h], np.float32), classes)
        if self.cfg.augment:
            self.partners.append(sample)
        return sample

    def warm(self, indices, reset: bool) -> None:
        """Load `indices` into the partner buffer only (no augmentation, no output): what resuming
        mid-run replays so the buffer holds what an uninterrupted run's would. `reset` empties it first."""
        if reset:
            self.partners.clear()
        times = dict.fromkeys(("read", "decode"), 0.0)
        for index in indices:
            self._load(index, times)

    def _geometric(self, img, boxes, classes, rng: np.random.Generator, mosaic_on: bool, out: np.ndarray):
        """Mosaic (with probability hyp.mosaic, partners from the buffer) or a single-image random affine."""
        if mosaic_on and rng.random() < self.hyp.mosaic:
            picks = rng.integers(len(self.partners), size=3)
            tiles = [(img, boxes, classes)] + [self.partners[k] for k in picks]
            return augment.mosaic(tiles, self.size, rng, self.hyp, out=out)
        return augment.random_affine(img, boxes, classes, self.size, rng, self.hyp, out=out)

    def build(self, indices, epoch: int, batch_id: int, mosaic_on: bool, out: np.ndarray):
        """Fill out[:len(indices)] (uint8 [B,3,S,S]); return (targets float32 [M,6], stage seconds)."""
        cfg, hyp, S = self.cfg, self.hyp, self.size
        times = {"read": 0.0, "decode": 0.0, "augment": 0.0, "collate": 0.0}
        rng = np.random.default_rng([cfg.seed, self.rank, epoch, batch_id])
        mixup_on = cfg.mixup_on(epoch)
        targets = []
        loaded = []
        for index in indices:  # load the whole batch first: mosaic partners can then be any of it
            loaded.append(self._load(index, times))
        for j, (img, boxes, classes) in enumerate(loaded):
            t0 = perf_counter()
            o = out[j]
            planes = [o[0], o[1], o[2]]  # the slot is CHW: results are written plane by plane
            if not cfg.augment:
                res, ratio, pad = augment.letterbox(img, S, fill=hyp.fill, out=self.scratch)
                boxes = augment.letterbox_boxes(boxes, ratio, pad)
                cv2.split(res, planes)
            else:
                res, boxes, classes = self._geometric(img, boxes, classes, rng, mosaic_on, self.scratch)
                if mixup_on and rng.random() < hyp.mixup:   # blend with a second sample made the same way
                    if self.mix_scratch is None:
                        self.mix_scratch = np.empty_like(self.scratch)
                    other = self.partners[rng.integers(len(self.partners))]
                    res2, boxes2, classes2 = self._geometric(*other, rng, mosaic_on, self.mix_scratch)
                    res, boxes, classes = augment.mixup(res, boxes, classes, res2, boxes2, classes2, rng, out=res)
                augment.hsv_jitter_to_planes(res, planes, rng, hyp.hsv_h, hyp.hsv_s, hyp.hsv_v, self.plane_scratch)
            t1 = perf_counter()
            if len(boxes):
                cxcywh = augment.xyxy_to_cxcywh(boxes, S, S)
                t = np.empty((len(boxes), 6), np.float32)
                t[:, 0], t[:, 1], t[:, 2:] = j, classes, cxcywh
                targets.append(t)
            times["augment"] += t1 - t0
            times["collate"] += perf_counter() - t1
        return (np.concatenate(targets) if targets else np.zeros((0, 6), np.float32)), times
