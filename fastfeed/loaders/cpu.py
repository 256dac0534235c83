"""The `cpu` loader: worker processes decode from the store, apply YOLO augmentation, and write
whole batches into shared (pinned, when the batches are for a CUDA GPU) buffers: the worker-pool loader
(pool.py) with `pipeline.BatchBuilder` over the store as each worker's builder."""

from __future__ import annotations

from functools import partial

from .base import LoaderConfig
from .pipeline import BatchBuilder, StoreSource
from .pool import CpuOptions, PoolLoader
from .registry import register_loader


def _store_builder(store, cfg: LoaderConfig, rank: int, opts: CpuOptions) -> BatchBuilder:
    return BatchBuilder(StoreSource(store, cfg.imgsz, cfg.task), cfg, rank, opts.partner_buffer, store.manifest)


@register_loader("cpu", options=CpuOptions,
                 summary="worker processes decode JPEGs (DCT-scaled) and augment into shared batch buffers")
def create_cpu_loader(store, cfg: LoaderConfig, opts: CpuOptions, order=None) -> PoolLoader:
    cfg = cfg.for_store(store)   # what the workers build with (a pose store without flip_idx does not flip)
    opts = opts.resolved(len(store), cfg.batch_size)
    rank, _ = cfg.resolved_rank()
    return PoolLoader(store, cfg, opts, partial(_store_builder, store, cfg, rank, opts), order=order)


__all__ = ["CpuOptions", "PoolLoader", "create_cpu_loader"]
