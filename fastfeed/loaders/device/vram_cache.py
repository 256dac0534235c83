"""The VRAM cache (`cache="device"`): the whole store decoded to tiles (`Record.tile_size`) in one flat pixel buffer
on the accelerator, so per step only the plans (a few KB) cross PCIe and nothing is decoded. Sized before anything
is allocated, from the records' headers, against the device's free memory (`fastfeed.devices.free_memory`) less the
loader's working memory and `cache_reserve_gb` kept for the model: what does not fit raises `VramCacheError` saying
what it needs, what is free, and about what imgsz would fit. Built once per loader (per rank: each GPU holds its own
copy) with a progress bar: JPEGs decoded by the loader's decoder in batches, or by the host decoder on every core.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from ...devices import free_memory
from ...procs import usable_cores, worker_context
from ...progress import bar as progress_bar
from .decode import load_items
from .plan import SHIP_DECODED, SHIP_ENCODED, read_item, ship_record
from .render import chunk_pixels

log = logging.getLogger(__name__)
GIB = 1 << 30
_BATCH = 64


class VramCacheError(ValueError):
    """The decoded store does not fit in the device's free memory (the message says what would)."""


@dataclass
class DeviceCache:
    pixels: torch.Tensor   # uint8 [P,3]: every record's upright pixels, one after the other
    starts: np.ndarray     # int64 [N]: record i's first row in `pixels`
    shapes: np.ndarray     # int64 [N,2]: record i's (h, w)

    @property
    def nbytes(self) -> int:
        return self.pixels.numel()

    def bases(self, tiles: np.ndarray) -> np.ndarray:
        """First pixel row of each tile ([B,4] record indices, -1: unused -> 0)."""
        return np.where(tiles >= 0, self.starts[np.maximum(tiles, 0)], 0)


def working_bytes(batch_size: int, imgsz: int, device: torch.device) -> int:
    """Device memory the loader needs besides the cache: the render's transients (~100 bytes per output pixel
    of a chunk) and four float32 batches (two in flight, one in use, one HSV temporary)."""
    return min(chunk_pixels(device), batch_size * imgsz * imgsz) * 100 + 4 * batch_size * 3 * imgsz * imgsz * 4


def _estimate(shapes: np.ndarray, imgsz: int) -> int:
    """About the bytes at another imgsz: images larger than it shrink with the area (DCT sizes round up a little)."""
    long = shapes.max(axis=1).astype(np.float64)
    r = np.minimum(1.0, imgsz / np.maximum(long, 1))
    return int((shapes[:, 0] * shapes[:, 1] * 3 * r * r).sum())


def check_fits(shapes: np.ndarray, imgsz: int, batch_size: int, device: torch.device, reserve_gb: float) -> int:
    """The cache's bytes; VramCacheError when it, the working memory and the reserve exceed the free memory."""
    need = int((shapes[:, 0] * shapes[:, 1]).sum()) * 3
    work, reserve = working_bytes(batch_size, imgsz, device), int(reserve_gb * GIB)
    free, total = free_memory(device)
    if need + work + reserve <= free:
        return need
    fits = [s for s in range(imgsz - 32, 31, -32)
            if _estimate(shapes, s) + working_bytes(batch_size, s, device) + reserve <= free]
    hint = (f"At imgsz {fits[0]} it would need about {_estimate(shapes, fits[0]) / GIB:.1f} GiB" if fits
            else "No imgsz fits with this reserve")
    raise VramCacheError(
        f"cache='device' needs {need / GIB:.1f} GiB for {len(shapes):,} images at imgsz {imgsz}, plus "
        f"{work / GIB:.1f} GiB of working memory and {reserve / GIB:.1f} GiB kept for the model (cache_reserve_gb); "
        f"{device} has {free / GIB:.1f} GiB free of {total / GIB:.1f} GiB. {hint}. Use a "
        "smaller imgsz, cache=None (decode every step), a device with more memory, or a smaller cache_reserve_gb")


_POOL: dict = {}


def _init_pool(store, size: int) -> None:
    _POOL["store"], _POOL["size"] = store, size   # inherited through fork: the store is not pickled per job


def _decode_chunk(indices: list[int]) -> list:
    """In a pool process: records decoded on the host, as (index, flat pixels)."""
    return [(i, ship_record(_POOL["store"].record(i), _POOL["size"], SHIP_DECODED)[1]) for i in indices]


def build_vram_cache(store, imgsz: int, batch_size: int, device: torch.device, decoder, upload, *, reserve_gb: float,
                workers: int | None = None) -> DeviceCache:
    """Decode every record of `store` into a new DeviceCache on `device` (upload: host tensor -> device copy)."""
    t0 = time.perf_counter()
    n = len(store)
    shapes = np.array([store.record(i, check_crc=False).tile_size(imgsz) for i in range(n)], np.int64).reshape(-1, 2)
    need = check_fits(shapes, imgsz, batch_size, device, reserve_gb)
    rows = shapes[:, 0] * shapes[:, 1]
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
    pixels = torch.empty((int(rows.sum()), 3), dtype=torch.uint8, device=device)
    log.info("VRAM cache: %d images, %.2f GiB on %s", n, need / GIB, device)

    def put(i: int, img: torch.Tensor) -> None:
        pixels[starts[i]:starts[i] + rows[i]] = img.reshape(-1, 3)

    bar = progress_bar(total=n, desc=f"VRAM cache ({device})", unit="img")
    try:
        if decoder.on_host:    # libjpeg-turbo holds the GIL: decode on every core in processes
            jobs = [list(range(s, min(s + 16, n))) for s in range(0, n, 16)]
            with worker_context() as ctx, ctx.Pool(workers or usable_cores(), _init_pool, (store, imgsz)) as pool:
                for chunk in pool.imap(_decode_chunk, jobs):
                    for i, img in chunk:
                        put(i, upload(torch.from_numpy(img)))   # unpickled: a writable copy of the worker's
                    bar.update(len(chunk))
        else:
            for s in range(0, n, _BATCH):
                items = [read_item(store, i, imgsz, SHIP_ENCODED) for i in range(s, min(s + _BATCH, n))]
                for i, img in load_items(items, None, decoder, upload).items():
                    put(i, img)
                bar.update(len(items))
    finally:
        bar.close()
    log.info("VRAM cache built in %.1f s", time.perf_counter() - t0)
    return DeviceCache(pixels, starts, shapes)
