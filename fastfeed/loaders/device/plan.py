"""The device loader's host half, run in each planning worker: read records (their encoded bytes, no decode), draw
every plan exactly as the cpu loader's `BatchBuilder.build` does (the whole batch loaded first into a
`PartnerBuffer`, then `augment.draw_batch`), lay out each sample's tiles (`augment.sample_layout`, in the frame of
`Record.tile_size`) and move its boxes. The pixels are left to the device (feed.py, render.py).

What travels to the device per batch (`Plan`, through the pool's result queue), and the new
records' payloads, written into the batch's shared slot (`Item`): JPEG bytes for a device decoder,
pixels otherwise (raw stores; other codecs and decoder='host' are decoded here with `Record.decode`),
nothing at all when the VRAM cache holds the pixels. `HostLoader` runs the planners: the worker-pool loader
(docs/design.md, 'One worker pool, hooks instead of overrides') with byte slots for the payloads; a `HostBatch`'s
slot is valid until the next host batch is asked for, as are a segment store's overlap masks beside it (rasterised
by the planner into the pool's mask slot).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter
from typing import NamedTuple

import numpy as np
import torch

from ...augment import SamplePlan, letterbox_geometry, letterbox_labels, make_targets, paste_labels, sample_layout
from ...augment.labels import Labels
from ...augment.paste import place_matrix, region_crop
from ...store.reader import Store
from ...store.record import Record
from ..base import LoaderConfig
from ..partners import PartnerBuffer
from ..pipeline import BatchExtras
from ..pool import CpuOptions, PoolLoader

SHIP_ENCODED, SHIP_DECODED, SHIP_NONE = "encoded", "decoded", "none"
_ALIGN = 64


class Tile(NamedTuple):
    """A loaded record as the sampler sees it: its index, the (h, w) of its tile (`Record.tile_size`, the cpu
    loader's), the record read (for its payload) and its `augment.Labels` in that frame for the batches' task."""

    record: int
    hw: tuple[int, int]
    rec: Record
    labels: Labels


@dataclass
class Item:
    """One record's pixels on their way to the device."""

    record: int
    kind: str                 # "jpeg": encoded, stored frame | "pixels": upright HWC uint8 at `shape`
    shape: tuple[int, int]    # the upright (h, w) the device needs (jpeg: decode, turn, fit to it)
    orientation: int          # EXIF orientation still to apply (jpeg only)
    where: str                # "record i (file) in shard s", for errors
    offset: int = -1          # into the batch's slot; -1: in `data` (it did not fit the slot)
    nbytes: int = 0
    data: bytes | None = None


@dataclass
class Plan:
    """One batch, for the device: B samples of up to 4 tiles (slot 0: the sample's own image)."""

    token: int                # which worker planned it (its partner buffer)
    tiles: np.ndarray         # int64 [B,4] record index per tile, -1: unused
    shapes: np.ndarray        # int64 [B,4,2] (h, w) of each tile's pixels
    minv: np.ndarray          # float64 [B,3,3] output pixel -> mid frame (canvas / letterbox frame)
    centre: np.ndarray        # float64 [B,2] the mosaic centre in the mid frame (inf: one tile)
    region: np.ndarray        # float64 [B,4,4] x1,y1,x2,y2: where each tile shows, in the mid frame
    place: np.ndarray         # float64 [B,4,3] r, ox, oy: tile pixel u -> mid frame r*u + o
    hsv: np.ndarray           # float64 [B,3] hue turn, saturation and value factors
    bgr: np.ndarray           # float64 [B] 1: the channels in BGR order
    targets: np.ndarray       # float32 [M,6]
    live: np.ndarray          # int64: the records in the partner buffer after this batch
    items: list = field(default_factory=list)
    extras: dict = field(default_factory=dict)   # a task store's Batch extras (numpy), rows in targets' order


def ship_record(r: Record, size: int, mode: str) -> tuple[str, np.ndarray, tuple[int, int], int]:
    """(kind, flat uint8 payload: bytes or pixels, upright (h, w) on the device, orientation to apply) of record
    `r` for an output of side `size`: how every record reaches the device, from a worker or the main process."""
    if r.codec == "raw" and r.size == r.tile_size(size):
        return "pixels", np.frombuffer(r.payload, np.uint8), r.size, 1   # stored upright, at the sampler's size
    if r.codec == "jpeg" and mode == SHIP_ENCODED:
        return "jpeg", np.frombuffer(r.payload, np.uint8), r.tile_size(size), r.orientation
    img = r.decode_tile(size)                         # the cpu loader's tile: upright, long side size
    return "pixels", img.reshape(-1), img.shape[:2], 1


def read_item(store, i: int, size: int, mode: str) -> Item:
    """Record `i` read in this process as an `Item` carrying its payload (`data`): not through a slot."""
    r = store.record(i)
    kind, data, shape, orientation = ship_record(r, size, mode)
    return Item(i, kind, tuple(shape), orientation, r.where, nbytes=data.size, data=data.tobytes())


class TaskGeometry:
    """Targets and extras of one planned batch of a task store (one per planning worker): every task's labels moved
    here on the host by the rules every loader uses (docs/design.md, 'The device loader plans on the host and draws
    on the device'). Keypoints and rotated boxes are [M,K,D] and [M,5] floats per batch; `overlap_mask` masks one
    int16 [S/r, S/r] per image, rasterised here into the pool's shared mask slot and copied up with the payloads
    (3.3 MB a batch at 640, r 4, B 64). Per-object masks (tens of MB a COCO-like batch) are refused by name
    (`renders.DEVICE`)."""

    def __init__(self, manifest, cfg):
        self.flip_idx = manifest.flip_idx
        self.size, self.augment = cfg.imgsz, cfg.augment
        self.extras = BatchExtras(cfg.task or manifest.task, cfg, tuple(manifest.kpt_shape or (0, 3)))

    def targets(self, matrices: np.ndarray, p, shown: list, plans, hyp, masks=None) -> tuple[np.ndarray, dict]:
        """(targets float32 [M,6], extras) of plan `p`: `matrices` [B,3,3] mid frame -> output, `shown` each
        sample's Tiles in slot order, `plans` the batch's SamplePlans (None: letterbox). A segment store's
        overlap masks go into `masks` (int16 [>=B, S/r, S/r], the pool's shared mask slot), not the extras."""
        S, rows = self.size, []
        for j, tiles in enumerate(shown):
            if plans is None:   # letterbox: the mid frame is the image, matrices[j] scales and pads it
                m = matrices[j]
                labels = letterbox_labels(tiles[0].labels, (m[0, 0], m[1, 1]), (m[0, 2], m[1, 2]))
            else:
                n = len(tiles)
                tile_to_mid = np.stack([place_matrix(place) for place in p.place[j, :n]])
                # the device samples each tile's exact map over its whole region: that is the realised map and crop
                crops = region_crop(p.place[j, :n], p.region[j, :n], p.shapes[j, :n])
                labels = paste_labels([tl.labels for tl in tiles], matrices[j] @ tile_to_mid, crops, S, hyp,
                                      crops, flip_lr=plans[j].geometry.affine.flip_lr, flip_idx=self.flip_idx)
            if len(labels):
                rows.append(make_targets(j, labels.classes, labels.boxes, S))
            self.extras.add(labels, None if masks is None else masks[j])
        targets = np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, 6), np.float32)
        return targets, self.extras.finish()


class Planner:
    """Builds `Plan`s inside one worker (the builder of the worker pool: `pool.PoolLoader`)."""

    def __init__(self, store, cfg: LoaderConfig, rank: int, partner_buffer: int, ship: str):
        self.store, self.cfg, self.rank, self.ship = store, cfg, rank, ship
        self.size, self.task = cfg.imgsz, cfg.task
        self.hyp = cfg.hyp              # everything is done on the device: nothing is left to a prefetcher
        self.partners = PartnerBuffer(partner_buffer, self._load, keep=cfg.augment)
        self.token = os.getpid()
        self.labels = TaskGeometry(store.manifest, cfg)

    def _load(self, index: int, times: dict) -> Tile:
        t0 = perf_counter()
        # With the VRAM cache only the labels are read here: every payload's CRC was checked when it was built.
        r = self.store.record(int(index), check_crc=False if self.ship == SHIP_NONE else None)
        hw = r.tile_size(self.size)
        labels = Labels.of_record(r, hw[1], hw[0], self.task)
        times["read"] += perf_counter() - t0
        return Tile(int(index), hw, r, labels)

    def warm(self, indices, reset: bool) -> None:
        """Load `indices` into the partner buffer only (`PartnerBuffer.warm`: what resuming replays)."""
        self.partners.warm(indices, reset)

    def _ship(self, records: list[Record], out: np.ndarray, times: dict) -> list[Item]:
        if self.ship == SHIP_NONE:
            return []
        items, o = [], 0
        for r in records:
            t0 = perf_counter()
            kind, data, shape, orientation = ship_record(r, self.size, self.ship)
            t1 = perf_counter()
            item = Item(r.index, kind, tuple(shape), orientation, r.where, nbytes=data.size)
            if o + data.size <= len(out):
                out[o:o + data.size] = data
                item.offset = o
                o += -(-data.size // _ALIGN) * _ALIGN
            else:   # rare (a batch of unusually large payloads): through the result queue instead
                item.data = data.tobytes()
            items.append(item)
            times["decode"] += t1 - t0
            times["read"] += perf_counter() - t1
        return items

    def build(self, indices, epoch: int, batch_id: int, mosaic_on: bool, out: np.ndarray, masks=None):
        """Plan batch `batch_id` of `epoch` (its payloads into `out`, a slot of the pool; a segment store's overlap
        masks into `masks`, the pool's mask slot): (Plan, stage seconds)."""
        times = {"read": 0.0, "decode": 0.0, "plan": 0.0}
        loaded, plans = self.partners.plan_batch(indices, times, seed=self.cfg.seed, rank=self.rank, epoch=epoch,
                                                 batch=batch_id, hyp=self.hyp, size=self.size,
                                                 augment=self.cfg.augment, mosaic_on=mosaic_on,
                                                 mixup_on=self.cfg.mixup_on(epoch))
        items = self._ship([t.rec for t in loaded], out, times)
        t0 = perf_counter()
        b = len(loaded)
        tiles, shapes, places, regions = [], [], [], []           # per sample, 4 tiles (unused: defaults)
        matrices, centres, hsv, shown_tiles = np.empty((b, 3, 3)), [], [], []
        for j, tile in enumerate(loaded):
            plan = plans[j] if plans is not None else None
            shown, layout, matrices[j], centre = self._geometry(tile, plan)
            centres.append(centre)
            pad = 4 - len(shown)
            tiles.append([t.record for t in shown] + [-1] * pad)
            shapes.append([t.hw for t in shown] + [(1, 1)] * pad)
            places.append([pl for pl, _ in layout] + [(1.0, 0.0, 0.0)] * pad)
            regions.append([rg for _, rg in layout] + [(0.0, 0.0, 0.0, 0.0)] * pad)
            shown_tiles.append(shown)
            hsv.append((0.0, 1.0, 1.0) if plan is None or plan.hsv is None else plan.hsv)
        p = Plan(self.token, np.array(tiles, np.int64), np.array(shapes, np.int64), np.linalg.inv(matrices),
                 np.array(centres, np.float64), np.array(regions, np.float64), np.array(places, np.float64),
                 np.array(hsv, np.float64), np.array([bool(q and q.bgr) for q in plans or [None] * b], np.float64),
                 np.zeros((0, 6), np.float32),
                 np.array([t.record for t in self.partners.items], np.int64), items)
        p.targets, p.extras = self.labels.targets(matrices, p, shown_tiles, plans, self.hyp, masks)
        times["plan"] += perf_counter() - t0
        return p, times

    def _geometry(self, tile: Tile, plan: SamplePlan | None):
        """(tiles shown, [(place, region)], mid frame -> output 3x3, mosaic centre) of one sample: its plan's
        geometry laid out by `augment.sample_layout` (None: letterbox, the mid frame is the image itself)."""
        S = self.size
        h, w = tile.hw
        if plan is None:
            g = letterbox_geometry(h, w, S)
            m = np.array([[g.nw / w, 0.0, g.left], [0.0, g.nh / h, g.top], [0.0, 0.0, 1.0]])
            return [tile], [((1.0, 0.0, 0.0), (0.0, 0.0, float(w), float(h)))], m, (math.inf, math.inf)
        geometry = plan.geometry
        tiles = [tile] + [self.partners[k] for k in geometry.partners or ()]
        layout, _, m = sample_layout(geometry, [t.hw for t in tiles], S, self.hyp)
        return tiles, layout, m, geometry.centre if geometry.mosaic else (math.inf, math.inf)


@dataclass
class HostBatch:
    slot: torch.Tensor       # uint8 [slot_bytes]: the payloads the plan's items point into
    plan: Plan
    indices: torch.Tensor    # int64 [B]: the batch's records
    masks: torch.Tensor | None = None   # a segment store's overlap masks: int16 [B, S/r, S/r], a view of the pool's slot


def slot_bytes(store: Store, cfg: LoaderConfig, ship: str) -> int:
    """Bytes of one batch's slot: what a batch's payloads take, with room to spare. A batch that needs more
    sends the rest through the result queue (correct, a little slower)."""
    b, s = cfg.batch_size, cfg.imgsz
    if ship == SHIP_NONE:
        return 64
    raw = store.manifest.store_mode == "raw"
    if ship == SHIP_DECODED and not raw:   # pixels at the decoded size: about imgsz^2 x 3 at most, as the cpu loader's
        return b * 3 * s * s
    total = store.manifest.stats.get("record_bytes") or sum(sh.bytes for sh in store.shards)
    per = int(total / max(len(store), 1) * (1.25 if raw else 2.0))   # raw pixels, or JPEG bytes
    return b * max(per, 64 << 10)


class HostLoader(PoolLoader):
    """Plans (not images) from the worker pool; `ship` says what the workers send (plan.SHIP_*)."""

    def __init__(self, store: Store, cfg: LoaderConfig, opts: CpuOptions, ship: str, order=None):
        rank, _ = cfg.resolved_rank()
        super().__init__(store, cfg, opts, partial(Planner, store, cfg, rank, opts.partner_buffer, ship), order=order,
                         slot_shape=(slot_bytes(store, cfg, ship),), pin=cfg.pin() and ship != SHIP_NONE,
                         make_batch=lambda slot, count, plan, indices: HostBatch(slot, plan, indices))
        self.ship = ship
        self.slot_bytes = self.slot_shape[0]

    @property
    def device_hyp(self):
        return None   # the device loader does all the augmentation itself
