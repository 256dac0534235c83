"""Loaders: named ways to turn a `Store` into `Batch`es (see DESIGN.md's contract).

    loader = create_loader("cpu", store, LoaderConfig(imgsz=640, batch_size=16))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, targets in loader: ...
    loader.close()
"""

from . import cpu, dali, shm  # noqa: F401  (importing registers them; dali imports nvidia.dali only when used)
from .base import Batch, Loader, LoaderConfig, StageTimes, create_loader, list_loaders, register_loader
from .workers import WorkerError

__all__ = ["Batch", "Loader", "LoaderConfig", "StageTimes", "WorkerError", "create_loader", "list_loaders",
           "register_loader"]
