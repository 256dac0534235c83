"""The DALI pipeline: decode, resize, mosaic paste, (warp), HSV, flip, CHW; boxes padded to a dense batch.

    external_source (records + per-sample geometry, source.py)
      -> decoders.image (cpu, or mixed on a GPU)            raw stores: the pixels as they are
      -> resize with a region of interest, per tile         exactly the visible part, at its final scale
         (mosaic partners: permute_batch of the decoded partner pool)
      -> multi_paste of the tiles over a constant grey fill -> S x S (letterbox when augment=False)
      -> warp_affine (only when hyp.degrees or hyp.shear)   rotation/shear about the shifted centre
      -> hsv (only when a gain is set)  -> flip + bb_flip (only when fliplr/flipud is set)
      -> transpose to CHW
    boxes: bb_flip'ed with the same flags, then padded to the batch's largest count (classes with -1),
    so DALIGenericIterator can return dense tensors.

On a GPU every pixel op runs on the device; the per-sample arguments stay on the CPU, as DALI wants.
"""

from __future__ import annotations

from .device import DaliDevice
from .source import DaliSource

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
    layouts = ["HWC" if source.raw and n in ("data", "pool") else "" for n in names]
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

        geom = o["geom"]

        def tile(img, k: int):
            return fn.resize(img, roi_start=geom[k, 0:2], roi_end=geom[k, 2:4], size=geom[k, 4:6], antialias=True)

        own = pixels(o["data"], o.get("turn"))
        tiles = [tile(own, 0)]
        if "pool" in o:   # mosaic: each partner slot from the batch's own images or the pool
            pool = pixels(o["pool"], o.get("pturn"))
            for s in (1, 2, 3):
                tiles.append(tile(fn.permute_batch(own, indices=o[f"b{s}"]), 2 * s - 1))
                tiles.append(tile(fn.permute_batch(pool, indices=o[f"p{s}"]), 2 * s))
        fill = fn.constant(idata=hyp.fill, shape=[S, S, 3], dtype=types.UINT8, layout="HWC",
                           device="gpu" if device.gpu else "cpu")
        img = fn.multi_paste(fill, *tiles, shapes=o["paste"][0], out_anchors=o["paste"][1], output_size=[S, S])
        boxes = o["boxes"]
        if "warp" in o:
            img = fn.warp_affine(img, matrix=o["warp"], size=[S, S], fill_value=hyp.fill, inverse_map=False)
        classes = o["classes"]
        if "flip" in o:   # before HSV (they commute) so that a mixup partner arrives flipped
            flip = o["flip"]
            img = fn.flip(img, horizontal=flip[0], vertical=flip[1])
            boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip[0], vertical=flip[1])
        if "mix" in o:    # blend with the partner sample's image; its boxes join, classes -1 when not mixed
            mix = o["mix"]
            other = fn.cast(mix[1], dtype=types.INT32)
            mixed = fn.cast(mix[2], dtype=types.INT32)
            img = fn.cast(img * mix[0] + fn.permute_batch(img, indices=other) * (1.0 - mix[0]) + 0.5,
                          dtype=types.UINT8)
            boxes = fn.cat(boxes, fn.permute_batch(boxes, indices=other), axis=0)
            classes = fn.cat(classes, fn.permute_batch(classes, indices=other) * mixed + (mixed - 1), axis=0)
        if "hsv" in o:
            hsv = o["hsv"]
            img = fn.hsv(img, hue=hsv[0], saturation=hsv[1], value=hsv[2])
        img = fn.transpose(img, perm=[2, 0, 1], output_layout="CHW")
        boxes = fn.pad(boxes, axes=(0,), fill_value=0.0)
        classes = fn.pad(classes, axes=(0,), fill_value=-1)
        pipe.set_outputs(img, boxes, classes, o["times"])
    return pipe
