"""Loaders: named ways to turn a `Store` into `Batch`es (contract and registry in base.py; see
docs/design.md).

    loader = create_loader("cpu", store, LoaderConfig(imgsz=640, batch_size=16))
    loader = create_loader("shm", store, cfg, cache_partial=True)   # a loader's own options
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, targets in loader: ...
    loader.close()

Importing this package imports torch and numpy only; the built-in loaders (cpu, shm, dali) register
themselves the first time the registry is used, so the Loader ABC is importable on a bare GPU machine.
"""

from .base import (
    Batch,
    Loader,
    LoaderConfig,
    LoaderInfo,
    StageTimes,
    check_epoch,
    create_loader,
    list_loaders,
    loader_info,
    loader_options,
    register_loader,
)
from .workers import WorkerError

__all__ = ["Batch", "Loader", "LoaderConfig", "LoaderInfo", "StageTimes", "WorkerError", "check_epoch",
           "create_loader", "list_loaders", "loader_info", "loader_options", "register_loader"]
