"""The DALI pipeline: decode, resize, mosaic paste, (warp), flip, (mixup), HSV, CHW; boxes padded to a dense batch.

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

from . import DaliDevice
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
