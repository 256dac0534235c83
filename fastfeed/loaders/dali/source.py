"""The DALI external source: one call per batch, reading records from the store.

Runs in DALI's Python worker processes (parallel external source; forked, or spawned when CUDA is
already initialised) or in the main thread with workers=0. It imports no DALI: a call gets DALI's
BatchInfo (iteration, epoch_idx) and returns one list per output, so it is plain, picklable
Python over a store (which pickles cheaply and reopens its LMDB maps in each process).

Per batch it takes this rank's indices from the loader's `EpochOrder`, reads each record once (CRC checked:
`RecordCorrupt` names it), and draws the cpu loader's plans: its partner candidates are what the cpu loader's
worker k % W would hold (`partners.history`; docs/design.md, "Partners from a buffer"), so the pixels differ
only by interpolation (rotation fills differ, plan.py). A partner among the batch's own images comes from
the batch (`fn.permute_batch`); any other is read here as that sample's input of its partner slot (`p1`..`p3`;
a mixup sample's second geometry: `m0`..`m3`), and a slot that takes nothing holds a tiny placeholder.
"""

from __future__ import annotations

from time import perf_counter

import numpy as np

from ... import codec
from ...augment import batch_rng, draw_batch
from ...exif import orientation_steps
from ...store import FormatError
from ..base import LoaderConfig
from ..partners import history
from ..sampler import EpochOrder
from .plan import empty_plan, pad_tiles, plan_eval, plan_train, route_partners

_UPRIGHT = np.zeros(2, np.float32)   # the turn of orientation 1
PARTNER_OUTPUTS = ("b1", "p1", "b2", "p2", "b3", "p3")   # per partner slot: batch index / the image read here


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
    if mode == "mosaic":
        names += PARTNER_OUTPUTS + (("t1", "t2", "t3") if oriented else ())
    if mode != "eval" and hyp.mixup:   # the second sample of a mixup: its tiles, geometry and boxes
        tiles = 4 if mode == "mosaic" else 1
        names += ["mix", "mgeom", "mpaste", "mboxes", "mclasses"] + [f"m{t}" for t in range(tiles)]
        names += [f"mt{t}" for t in range(tiles)] if oriented else []
        names += [n for n, on in (("mflip", "flip" in names), ("mwarp", "warp" in names)) if on]
    return tuple(names)


class DaliSource:
    """callable(batch_info) -> tuple of per-sample lists, named by `self.outputs`."""

    def __init__(self, store, cfg: LoaderConfig, order: EpochOrder, partner_buffer: int, mode: str, raw: bool,
                 epoch0: int = 0, start: int = 0, oriented: bool = False):
        self.store, self.cfg, self.order, self.rank = store, cfg, order, order.rank
        self.partner_buffer = partner_buffer
        self.mode, self.raw, self.epoch0, self.start = mode, raw, epoch0, start
        self.size, self.hyp = cfg.imgsz, cfg.worker_hyp()
        self.outputs = outputs_for(mode, self.hyp, oriented)
        self._placeholder = None
        self._read_s = 0.0

    def __call__(self, info):
        epoch = self.epoch0 + int(info.epoch_idx)
        batches = self.order.batches(epoch)
        k = int(info.iteration) + (self.start if epoch == self.epoch0 else 0)   # DALI's first epoch may start late
        if k >= len(batches):
            raise StopIteration
        self.order.reached(epoch, k)   # a shard cache following the order pins and reads ahead
        return self.build(epoch, k, batches[k])

    def plans(self, epoch: int, k: int, n: int):
        """(candidate records, plans) of batch k of `epoch`: the cpu loader's, for worker k % W's buffer."""
        c, w = self.cfg, max(self.cfg.workers, 1)
        cands = history(self.order.batches, epoch, k + 1, k % w, w, self.partner_buffer)
        mosaic_on = self.mode == "mosaic" and c.mosaic_on(epoch)
        plans = draw_batch(batch_rng(c.seed, self.rank, epoch, k), n, self.hyp, self.size, mosaic_on=mosaic_on,
                           mixup_on=c.mixup_on(epoch), candidates=len(cands))
        return cands, plans

    def build(self, epoch: int, k: int, indices) -> tuple[list, ...]:
        t0 = perf_counter()
        self._read_s = 0.0
        records = [self.read(int(i)) for i in indices]
        b, S, hyp = len(records), self.size, self.hyp
        out = {name: [] for name in self.outputs}
        cands, plans = self.plans(epoch, k, b) if self.mode != "eval" else (None, None)
        for j, record in enumerate(records):
            tile = self._input(out, "data", "turn", record)
            if plans is None:
                self._emit(out, "", plan_eval(*tile, S))
                continue
            plan = plans[j]
            partners = [int(cands[p]) for p in plan.geometry.partners or ()]   # only in mosaic mode
            # a partner among the batch's own images comes from the batch; any other is read here
            at = [int(p) - len(cands) + b for p in plan.geometry.partners or ()]
            from_batch = [0 <= q < b and int(indices[q]) == r for q, r in zip(at, partners)]
            tiles = [tile]
            if self.mode == "mosaic":
                for s in range(3):
                    real = s < len(partners)
                    read = self._input(out, f"p{s + 1}", f"t{s + 1}",
                                       self.read(partners[s]) if real and not from_batch[s] else None)
                    if real:
                        tiles.append(records[at[s]][1] if from_batch[s] else read)
                    out[f"b{s + 1}"].append(np.array(at[s] if real and from_batch[s] else 0, np.int32))
            dp = plan_train(plan.geometry, tiles, S, hyp, plan.hsv)
            if self.mode == "mosaic":
                dp = route_partners(dp, [not m for m in from_batch])
            self._emit(out, "", dp)
            if "mix" in out:
                self._mix(out, plan, cands)
        t_plan = perf_counter() - t0 - self._read_s
        out["times"] = [np.array([self._read_s / b, t_plan / b], np.float32)] * b
        return tuple(out[name] for name in self.outputs)

    def _emit(self, out: dict, prefix: str, dp) -> None:
        for name in ("geom", "paste", "boxes", "classes", "flip", "hsv", "warp"):
            if prefix + name in out:
                out[prefix + name].append(getattr(dp, name))

    def _input(self, out: dict, name: str, turn_name: str, read: tuple | None):
        """A `read` record as this sample's input `name` and its turn as `turn_name` (when the graph turns);
        None: a placeholder. Returns its tile (None for a placeholder)."""
        data, tile, turn = read or (self.placeholder(), None, _UPRIGHT)
        out[name].append(data)
        if turn_name in out:
            out[turn_name].append(turn)
        return tile

    def _mix(self, out: dict, plan, cands) -> None:
        """The second sample of a mixup (or placeholders): its tiles read here, its geometry and boxes, the weight."""
        n = sum(1 for name in out if name[0] == "m" and name[1:].isdigit())
        mix = plan.mix
        records = [] if mix is None else [int(cands[mix.other])] + [int(cands[p]) for p in mix.geometry.partners or ()]
        tiles = [self._input(out, f"m{t}", f"mt{t}", self.read(records[t]) if t < len(records) else None)
                 for t in range(n)][:len(records)]
        dp = empty_plan(n, self.size) if mix is None else pad_tiles(plan_train(mix.geometry, tiles, self.size, self.hyp), n)
        self._emit(out, "m", dp)
        out["mix"].append(np.array([mix.weight if mix else 1.0, float(mix is not None)], np.float32))

    def records_of(self, epoch: int, k: int, indices) -> list[int]:
        """Every record batch k reads: its own, then every partner and mixup record its plans pick."""
        recs = [int(i) for i in indices]
        if self.mode == "eval":
            return recs
        cands, plans = self.plans(epoch, k, len(recs))
        return recs + [int(r) for j, p in enumerate(plans) for r in p.records(recs[j], cands)[1:]]

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
