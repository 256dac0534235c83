"""Loaders: named ways to turn a store (a `Store`, or anything with the `fastfeed.store.RecordSource`
protocol) into `Batch`es (see docs/design.md).

    loader = create_loader("cpu", store, LoaderConfig(imgsz=640, batch_size=16))
    loader = create_loader("shm", store, cfg, cache_partial=True)   # a loader's own options
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, targets in loader: ...        # each Batch also has .indices: its records
    loader.close()

Which module holds what: docs/design.md, 'Who owns what' (loaders/).

Importing this package imports torch, numpy and OpenCV (through the augmentation the planners share) only;
the built-in loaders (cpu, shm, dali, device; LMDB, simplejpeg, DALI) register themselves the first time the
registry is used, so the Loader ABC is importable on a bare GPU machine.
"""

from .base import Batch, Loader, LoaderConfig, StageTimes, check_epoch
from .registry import (
    LoaderInfo,
    create_loader,
    list_loaders,
    loader_info,
    loader_options,
    register_loader,
    unregister_loader,
)
from .renders import UnsupportedAugmentation, UnsupportedTask
from .sampler import EpochOrder, ShuffledOrder
from .workers import WorkerError

__all__ = ["Batch", "EpochOrder", "Loader", "LoaderConfig", "LoaderInfo", "ShuffledOrder", "StageTimes",
           "UnsupportedAugmentation", "UnsupportedTask", "WorkerError", "check_epoch", "create_loader", "list_loaders",
           "loader_info", "loader_options", "register_loader", "unregister_loader"]
