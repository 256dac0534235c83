"""The DALI external source: one call per batch, reading records from the `Store`.

Runs in DALI's Python worker processes (parallel external source; forked, or spawned when CUDA is
already initialised) or in the main thread with workers=0. It imports no DALI: a call gets DALI's
BatchInfo (iteration, epoch_idx) and returns one list per output, so it is plain, picklable
Python over a `Store` (which pickles cheaply and reopens its LMDB maps in each process).

Per batch it takes this rank's indices from `epoch_batches` (the order every loader uses), reads
each record once, checks its CRC (a damaged record raises `RecordCorrupt` naming it and its shard),
draws the batch's randomness from (seed, rank, epoch, batch) and plans the geometry (plan.py).

Mosaic partners: a mosaic batch of B also reads a *partner pool* of B records drawn uniformly from
the whole store (any rank's share, seeded per batch). Each mosaic sample takes its 3 partners from
the 2B - 1 candidates "the batch's other images + the pool" (distinct when B >= 2), so partners
are not only the batch's own images, yet a candidate is used about 1.5 times per batch (Ultralytics'
64-image buffer: about the same). DALI decodes each candidate once and `fn.permute_batch` hands
every partner slot its image. Cost: pool entries that some sample picks are decoded, about 0.8 of
the pool at B=16, so ~1.8 decodes per output sample (the cpu loader: 1, reusing decoded images
from its buffer; 3 fresh partners per sample would cost 4). Unpicked pool entries, and the whole
pool in epochs without mosaic, are a tiny placeholder image that costs nothing to decode.
"""

from __future__ import annotations

from time import perf_counter

import numpy as np

from ... import codec
from ...augment import draw_mixup_weight
from ...exif import orientation_steps
from ...store import FormatError
from ...store.reader import Store
from ..base import LoaderConfig
from ..sampler import epoch_batches
from .plan import plan_eval, plan_train, route_partners

_UPRIGHT = np.zeros(2, np.float32)   # the turn of orientation 1
POOL_OUTPUTS = ("pool", "b1", "p1", "b2", "p2", "b3", "p3")   # partner pool; per slot: batch / pool index


def outputs_for(mode: str, hyp, oriented: bool = False) -> tuple[str, ...]:
    """Names of the source's outputs, in order, for a graph `mode` ("eval" | "single" | "mosaic").
    `oriented`: the store holds records with an EXIF orientation to apply after decoding ("turn")."""
    names = ["data", "geom", "paste", "boxes", "classes", "times"] + (["turn"] if oriented else [])
    if mode != "eval":   # ops whose gains are all zero are left out of the graph
        if hyp.fliplr or hyp.flipud:
            names.append("flip")
        if hyp.hsv_h or hyp.hsv_s or hyp.hsv_v:
            names.append("hsv")
        if not hyp.axis_aligned:
            names.append("warp")
        if hyp.mixup:      # per sample: [weight of its own image, partner index in the batch, 1 if mixed]
            names.append("mix")
    if mode == "mosaic":
        names += POOL_OUTPUTS + (("pturn",) if oriented else ())
    return tuple(names)


class DaliSource:
    """callable(batch_info) -> tuple of per-sample lists, named by `self.outputs`."""

    def __init__(self, store: Store, cfg: LoaderConfig, rank: int, world_size: int, mode: str, raw: bool,
                 epoch0: int = 0, start: int = 0, oriented: bool = False):
        self.store, self.cfg, self.rank, self.world_size = store, cfg, rank, world_size
        self.mode, self.raw, self.epoch0, self.start = mode, raw, epoch0, start
        self.size, self.hyp = cfg.imgsz, cfg.worker_hyp()
        self.outputs = outputs_for(mode, self.hyp, oriented)
        self._epoch = None
        self._batches: list = []
        self._placeholder = None
        self._read_s = 0.0

    def batches(self, epoch: int) -> list[np.ndarray]:
        if epoch != self._epoch:
            c = self.cfg
            self._batches = epoch_batches(len(self.store), c.batch_size, epoch=epoch, seed=c.seed, rank=self.rank,
                                          world_size=self.world_size, shuffle=c.shuffle, drop_last=c.drop_last)
            self._epoch = epoch
        return self._batches

    def __call__(self, info):
        epoch = self.epoch0 + int(info.epoch_idx)
        batches = self.batches(epoch)
        k = int(info.iteration) + (self.start if epoch == self.epoch0 else 0)   # DALI's first epoch may start late
        if k >= len(batches):
            raise StopIteration
        return self.build(epoch, k, batches[k])

    # --- one batch ---------------------------------------------------------------------------------
    def build(self, epoch: int, k: int, indices) -> tuple[list, ...]:
        t0 = perf_counter()
        self._read_s = 0.0
        records = [self.read(int(i)) for i in indices]
        b, S, hyp = len(records), self.size, self.hyp
        rng = np.random.default_rng([self.cfg.seed, self.rank, epoch, k])
        out = {name: [] for name in self.outputs}
        mosaic = self.mode == "mosaic" and self.cfg.mosaic_on(epoch)
        pool = rng.integers(len(self.store), size=b) if mosaic else None
        pooled: dict[int, tuple] = {}     # pool position -> record, read once however often picked

        def candidate(c: int):            # 0..b-1: the batch's own images, b..2b-1: the pool
            if c < b:
                return records[c]
            if c - b not in pooled:
                pooled[c - b] = self.read(int(pool[c - b]))
            return pooled[c - b]

        picks = []
        mixup = "mix" in out and self.cfg.mixup_on(epoch)
        for j, (data, tile, turn) in enumerate(records):
            out["data"].append(data)
            if "turn" in out:
                out["turn"].append(turn)
            pick = []
            if self.mode == "eval":
                plan = plan_eval(*tile, S)
            else:
                if mosaic and rng.random() < hyp.mosaic:
                    others = np.delete(np.arange(2 * b), j)   # any candidate but the sample itself
                    pick = [int(c) for c in rng.choice(others, 3, replace=len(others) < 3)]
                plan = plan_train(rng, [tile] + [candidate(c)[1] for c in pick], S, hyp)
                if self.mode == "mosaic":
                    plan = route_partners(plan, [c >= b for c in pick])
            picks.append(pick)
            for name in ("geom", "paste", "boxes", "classes", "flip", "hsv", "warp"):
                if name in out:
                    out[name].append(getattr(plan, name))
            if "mix" in out:   # mixup: blend with another augmented sample of this batch (Beta(32, 32))
                mixed = mixup and b > 1 and rng.random() < hyp.mixup
                other = int(rng.choice(np.delete(np.arange(b), j))) if mixed else j
                out["mix"].append(np.array([draw_mixup_weight(rng) if mixed else 1.0, other, int(mixed)], np.float32))
        if self.mode == "mosaic":
            out["pool"] = [pooled[p][0] if p in pooled else self.placeholder() for p in range(b)]
            if "pturn" in out:
                out["pturn"] = [pooled[p][2] if p in pooled else _UPRIGHT for p in range(b)]
            for s in range(3):   # which image each branch shows (ignored where the branch shows nothing)
                out[f"b{s + 1}"] = [np.array(p[s] if p and p[s] < b else 0, np.int32) for p in picks]
                out[f"p{s + 1}"] = [np.array(p[s] - b if p and p[s] >= b else 0, np.int32) for p in picks]
        t_plan = perf_counter() - t0 - self._read_s
        out["times"] = [np.array([self._read_s / b, t_plan / b], np.float32)] * b
        return tuple(out[name] for name in self.outputs)

    def records_of(self, epoch: int, k: int, indices) -> list[int]:
        """Every record batch k reads: its own, then its whole partner pool (used or not)."""
        recs = [int(i) for i in indices]
        if self.mode == "mosaic" and self.cfg.mosaic_on(epoch):
            rng = np.random.default_rng([self.cfg.seed, self.rank, epoch, k])
            recs += [int(i) for i in rng.integers(len(self.store), size=len(recs))]
        return recs

    def read(self, index: int):
        """(payload array for DALI, (hw, boxes in pixels, classes), turn) of record `index`, CRC-checked.
        turn: float32 [mirror 0|1, anticlockwise degrees], the record's orientation as codec's steps."""
        t0 = perf_counter()
        r = self.store.record(index)
        if (r.codec == "raw") != self.raw:
            raise FormatError(f"{r.where} holds a {r.codec!r} payload in a store the dali loader reads as "
                              f"{'raw pixels' if self.raw else 'encoded images'}; re-pack the store")
        data = np.frombuffer(r.payload, np.uint8)
        if self.raw:
            data = data.reshape(r.height, r.width, 3)
        self._read_s += perf_counter() - t0
        mirror, degrees = orientation_steps(r.orientation)
        return data, (r.size, r.pixel_boxes(), r.classes), np.array([mirror, degrees], np.float32)

    def placeholder(self) -> np.ndarray:
        """What an unused pool entry holds: a 1x1 pixel, or an 8x8 JPEG for the decoder."""
        if self._placeholder is None:
            grey = np.full((8, 8, 3), self.hyp.fill, np.uint8)
            self._placeholder = grey[:1, :1].copy() if self.raw else np.frombuffer(codec.encode_jpeg(grey, 75), np.uint8)
        return self._placeholder
