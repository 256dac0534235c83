"""`DaliLoader`: the Loader contract over a DALI pipeline (`build_pipeline`) fed by `DaliSource`.

The DALI pipeline: decode, resize, mosaic paste, (warp), flip, (mixup), HSV, CHW; boxes padded to a dense batch.

    external_source (records + per-sample geometry from the samples' plans, source.py)
      -> decoders.image (cpu, or mixed on a GPU)            raw stores: the pixels as they are
      -> resize with a region of interest, per tile         exactly the visible part, at its final scale
         (mosaic partners: permute_batch of the decoded batch, or the partner read for that slot)
      -> multi_paste of the tiles over a constant grey fill -> S x S (letterbox when augment=False)
      -> warp_affine (only when hyp.degrees or hyp.shear)   rotation/shear about the shifted centre
      -> flip + bb_flip (only when fliplr/flipud is set)
      -> mixup (only when hyp.mixup is set): the second sample rendered the same way from its own tiles,
         blended with the plan's weight; its boxes join
      -> hsv (only when a gain is set)  -> transpose to CHW
    boxes: padded to the batch's largest count (classes with -1), so DALIGenericIterator can return dense
    tensors. That is the cpu workers' order: geometry (flips folded in), mixup, HSV.

On a GPU every pixel op runs on the device; the per-sample arguments stay on the CPU, as DALI wants.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import re
from collections.abc import Iterator
from time import perf_counter

import torch

from ...augment import make_targets
from ...codec import DecodeError
from ...store import FormatError
from ...store.reader import Store
from ..base import Batch, Loader, LoaderConfig, StageTimes
from ..renders import DALI
from ..workers import WorkerError
from . import DaliDevice
from .source import DaliSource

log = logging.getLogger(__name__)

OUTPUTS = ("images", "boxes", "classes", "times")   # the pipeline's outputs, in order


def build_pipeline(source: DaliSource, device: DaliDevice, *, batch_size: int, num_threads: int, py_workers: int,
                   start_method: str, prefetch: int):
    """A (not yet built) DALI Pipeline around `source`. py_workers=0: the source runs in this thread."""
    from nvidia.dali import fn, types
    from nvidia.dali.pipeline import Pipeline

    S, hyp, names = source.size, source.hyp, source.outputs
    pipe = Pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device.device_id,
                    prefetch_queue_depth=prefetch, py_num_workers=max(py_workers, 1), py_start_method=start_method,
                    seed=source.cfg.seed)
    images = {"data", "p1", "p2", "p3", "m0", "m1", "m2", "m3"}   # the outputs that carry pixels or encoded images
    layouts = ["HWC" if source.raw and n in images else "" for n in names]
    with pipe:
        parallel = {"parallel": True, "prefetch_queue_depth": max(2, prefetch)} if py_workers else {}
        nodes = fn.external_source(source=source, num_outputs=len(names), batch=True, batch_info=True,
                                   layout=layouts, **parallel)
        o = dict(zip(names, nodes))

        def pixels(node, turn=None):
            if source.raw:   # raw payloads are stored upright
                return node.gpu() if device.gpu else node
            # DALI decodes the stored frame; the record's orientation (fastfeed.exif.orientation_steps:
            # mirror, then turn anticlockwise) brings it to the upright frame the boxes are in.
            img = fn.decoders.image(node, device=device.decoder, output_type=types.RGB, adjust_orientation=False)
            if turn is not None:
                img = fn.flip(img, horizontal=fn.cast(turn[0], dtype=types.INT32))
                img = fn.rotate(img, angle=turn[1], keep_size=False, interp_type=types.INTERP_NN, fill_value=0)
            return img

        fill = fn.constant(idata=hyp.fill, shape=[S, S, 3], dtype=types.UINT8, layout="HWC",
                           device="gpu" if device.gpu else "cpu")

        def canvas(tiles, prefix: str):
            """The tiles pasted, warped, flipped: one geometric sample (prefix "" or the mixup's "m")."""
            paste = o[prefix + "paste"]
            img = fn.multi_paste(fill, *tiles, shapes=paste[0], out_anchors=paste[1], output_size=[S, S])
            boxes = o[prefix + "boxes"]
            if prefix + "warp" in o:
                img = fn.warp_affine(img, matrix=o[prefix + "warp"], size=[S, S], fill_value=hyp.fill, inverse_map=False)
            if prefix + "flip" in o:
                flip = o[prefix + "flip"]
                img = fn.flip(img, horizontal=flip[0], vertical=flip[1])
                boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip[0], vertical=flip[1])
            return img, boxes

        def tile(img, geom, k: int):
            return fn.resize(img, roi_start=geom[k, 0:2], roi_end=geom[k, 2:4], size=geom[k, 4:6], antialias=True)

        geom = o["geom"]
        own = pixels(o["data"], o.get("turn"))
        tiles = [tile(own, geom, 0)]
        if "p1" in o:   # mosaic: each partner slot from the batch's own images or the image read for it
            for s in (1, 2, 3):
                tiles.append(tile(fn.permute_batch(own, indices=o[f"b{s}"]), geom, 2 * s - 1))
                tiles.append(tile(pixels(o[f"p{s}"], o.get(f"t{s}")), geom, 2 * s))
        img, boxes = canvas(tiles, "")
        classes = o["classes"]
        if "mix" in o:    # the second sample's own tiles, then the blend (weight 1 where a sample is not mixed)
            mgeom, n = o["mgeom"], sum(1 for name in o if name[0] == "m" and name[1:].isdigit())
            mimg, mboxes = canvas([tile(pixels(o[f"m{t}"], o.get(f"mt{t}")), mgeom, t) for t in range(n)], "m")
            weight = o["mix"][0]
            img = fn.cast(img * weight + mimg * (1.0 - weight) + 0.5, dtype=types.UINT8)
            boxes = fn.cat(boxes, mboxes, axis=0)
            classes = fn.cat(classes, o["mclasses"], axis=0)
        if "hsv" in o:
            hsv = o["hsv"]
            img = fn.hsv(img, hue=hsv[0], saturation=hsv[1], value=hsv[2])
        img = fn.transpose(img, perm=[2, 0, 1], output_layout="CHW")
        boxes = fn.pad(boxes, axes=(0,), fill_value=0.0)
        classes = fn.pad(classes, axes=(0,), fill_value=-1)
        pipe.set_outputs(img, boxes, classes, o["times"])
    return pipe


class DaliLoader(Loader):
    """Batches from a DALI pipeline. Threads: cfg.workers DALI threads (the pixel work) and
    max(1, workers // 4) Python processes for the external source (reading and planning take
    ~0.2 ms a sample); workers=0 runs the source in this thread with one DALI thread.

    cfg.batches_ahead is DALI's queue depth (and the external source's); cfg.pin_memory does not apply
    (host outputs are DALI's own buffers; on a GPU the images are already on the device);
    cfg.timeout does not apply: DALI's observer notices a worker that dies while building a batch,
    and that raises WorkerError; but a worker killed (SIGKILL, OOM) while it holds one of DALI's
    shared-queue locks or sleeps on its task condition can leave DALI's main-thread wait blocked
    for good (a DALI limitation, seen in about one of three tries of killing an idle worker here).
    A new pipeline is built on first use, after an abandoned epoch, or when set_epoch() asks for an
    epoch other than the next one; otherwise DALI queues the next epoch's batches as this one ends.
    """

    renders = DALI

    def __init__(self, store: Store, cfg: LoaderConfig, device: DaliDevice, opts=None, order=None):
        super().__init__(store, cfg, order)
        self.opts = opts
        self.device = device
        self.mode = "eval" if not cfg.augment else ("mosaic" if cfg.hyp.mosaic > 0 else "single")
        self.raw = store.manifest.store_mode == "raw"   # one kind of payload per store
        self.oriented = not self.raw and store.manifest.stats.get("oriented", 0) > 0   # EXIF turns to apply
        self.py_workers = 0 if cfg.workers == 0 else max(1, cfg.workers // 4)
        self._pipe = self._it = self._source = None
        self._epoch0 = self._epochs_done = 0
        self._active = False
        # read: record reads + CRC checks in the external source; plan: drawing the geometry and moving the boxes
        # there; collate: DALI's padded boxes into targets here. Decode, resize, paste, HSV and flip run inside
        # DALI's graph, which reports no per-operator times: not measured.
        self._times = StageTimes({"read": 0.0, "plan": 0.0, "collate": 0.0}, 0)

    def memory_pids(self) -> list[int]:
        pool = getattr(self._pipe, "_py_pool", None)
        return list(pool.pids()) if pool is not None else []

    def _start(self, epoch: int, start: int) -> None:
        """(Re)build the pipeline so that DALI's epoch 0 is loader epoch `epoch` from batch `start` on."""
        from nvidia.dali import backend
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        self.close()
        c = self.cfg
        # Fork is quick, but DALI refuses to fork once CUDA is initialised here (a trainer that made
        # CUDA tensors first): then the workers are spawned, which re-imports the caller's main module.
        fork = "fork" in mp.get_all_start_methods() and not backend.IsDriverInitialized()
        self._source = DaliSource(self.store, c, self.order, self.opts.partner_buffer, self.mode, self.raw, epoch,
                                  start, self.oriented)
        self._pipe = build_pipeline(self._source, self.device, batch_size=c.batch_size, num_threads=max(1, c.workers),
                                    py_workers=self.py_workers, start_method="fork" if fork else "spawn",
                                    prefetch=c.batches_ahead)
        if self.py_workers:
            self._pipe.start_py_workers()   # before build(): build initialises CUDA on a GPU
        self._pipe.build()
        self._epoch0, self._epochs_done = epoch, 0
        self._it = DALIGenericIterator([self._pipe], list(OUTPUTS), auto_reset=True, prepare_first_batch=False)

    def iter_batches(self) -> Iterator[Batch]:
        n = len(self) - self.start
        k = -1
        try:
            # Continue the running pipeline when it is at the start of the asked epoch (DALI has then
            # already queued it); otherwise (first use, an abandoned epoch, another epoch, a start
            # mid-epoch: the source draws per batch, so skipping costs nothing) rebuild.
            if self._it is None or self._active or self.start or self.epoch != self._epoch0 + self._epochs_done:
                self._start(self.epoch, self.start)
            self._active = True
            for k in range(n):
                try:
                    out = next(self._it)
                except StopIteration:
                    raise WorkerError(f"dali loader: the pipeline ended after {k} of {n} batches") from None
                yield self._to_batch(out[0], self.order.batches(self.epoch)[self.start + k])
            k = n
            if next(self._it, None) is not None:   # the end of DALI's epoch: resets the pipeline for the next one
                raise WorkerError(f"dali loader: the pipeline gave more than {n} batches")
            self._active = False
            self._epochs_done += 1
        except GeneratorExit:
            raise   # abandoned mid-epoch: the next iteration rebuilds
        except WorkerError:
            self.close()
            raise
        except Exception as e:   # DALI's own errors: the pipeline is unusable afterwards
            err = self._explain(e, max(k, 0))
            self.close()
            raise err from e

    def _to_batch(self, d: dict, indices) -> Batch:
        t0 = perf_counter()
        boxes, classes = d["boxes"], d["classes"]
        j, n = (classes >= 0).nonzero(as_tuple=True)   # DALI pads each sample's boxes; padding has class -1
        targets = make_targets(j, classes[j, n], boxes[j, n].clamp_(0.0, 1.0), 1.0)
        read, plan = d["times"].sum(0).tolist()
        images = d["images"]
        self._times.add({"read": read, "plan": plan, "collate": perf_counter() - t0}, int(images.shape[0]))
        return Batch(images, targets, torch.from_numpy(indices))

    def _explain(self, e: Exception, k: int) -> WorkerError:
        """A DALI failure as a WorkerError naming the record when one can be found."""
        msg = str(e)
        where = f"batch {k} of epoch {self.epoch}"
        # The external source raised in this thread (workers=0), or in a worker (CRC, layout): the message names
        # the record.
        found = ([(type(e).__name__, msg)] if isinstance(e, FormatError)
                 else re.findall(r"^\s*(?:\w+\.)*(\w*(?:Error|Corrupt)): (.*record \d+.*)$", msg, re.M))
        if found:
            name, text = found[-1]
            return WorkerError(f"dali loader: the external source failed near {where}: {name}: {text}")
        if "Worker data receiving interrupted" in msg:   # DALI's word for a worker process that died
            pids = ", ".join(str(p) for p in self.memory_pids()) or "?"
            return WorkerError(f"dali loader: an external-source worker process (of pids {pids}) exited unexpectedly "
                               f"near {where} (killed by a signal: out of memory?); DALI said: {_first_lines(msg, 3)}")
        if bad := self._find_undecodable(k):
            return WorkerError(f"dali loader: DALI could not decode {bad} (near {where}); "
                               f"run `fastfeed verify --decode`. DALI said: {_first_lines(msg)}")
        return WorkerError(f"dali loader: the DALI pipeline failed near {where}: {msg}")

    def _find_undecodable(self, k: int) -> str | None:
        """Decode the records DALI may have had in flight (this batch and the queued ones) with
        fastfeed's own decoder; return a description of the first that fails."""
        src, depth = self._source, self.cfg.batches_ahead + 2
        if src is None:
            return None
        for epoch, ks in ((self.epoch, range(k, k + depth)), (self.epoch + 1, range(depth))):
            batches = src.order.batches(epoch)
            for kk in ks:
                if kk >= len(batches):
                    break
                for i in src.records_of(epoch, kk, batches[kk]):
                    try:
                        self.store.record(i).decode()
                    except (FormatError, DecodeError) as err:   # both name the record and its shard
                        return str(err)
        return None

    def use_order(self, order) -> None:
        super().use_order(order)
        self.close()   # the next iteration builds a pipeline whose source reads the new order

    def close(self) -> None:
        self._it = None
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            _shut_down(pipe)
        self._active = False


def _shut_down(pipe) -> None:
    """Stop a DALI pipeline's executor threads and its parallel external source's worker processes now.

    DALI has no public call for this (checked in 2.4.0: `Pipeline` has no close(); its context manager only makes
    it the current pipeline): a pipeline stops in `__del__` (which calls `_shutdown`) and its worker pool in a
    weakref finalizer, that is once the last reference is gone, which an exception's traceback or an iterator still
    holding it can delay past close() (threads and worker processes left running). So the private calls, here only;
    a DALI without them falls back to dropping the reference."""
    if (shutdown := getattr(pipe, "_shutdown", None)) is not None:
        shutdown()
    if (pool := getattr(pipe, "_py_pool", None)) is not None:
        pool.close()


def _first_lines(msg: str, n: int = 12) -> str:
    lines = [x for x in msg.splitlines() if x.strip()]
    lines = [x for i, x in enumerate(lines) if i == 0 or x != lines[i - 1]]   # DALI repeats its headline
    return "\n".join(lines[:n])
