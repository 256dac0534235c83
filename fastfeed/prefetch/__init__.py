"""`DevicePrefetcher`: batches already on the device, as floats, ahead of the step that needs them.

    with create_loader("cpu", store, cfg) as loader, DevicePrefetcher(loader, "cuda") as batches:
        for epoch in range(epochs):
            batches.set_epoch(epoch)                  # passes through to the loader
            for images, targets in batches:           # float [B,3,S,S] in [0,1] and [M,6], on the GPU
                ...

How (the side stream, the ready events, the buffer-reuse hazard): docs/design.md, 'The prefetcher copies on a side
stream'. `prefetcher.py` handles one batch (produce / release / hand-out), picks the device augmentation and
pools host buffers, `drivers.py` runs them (inline, or the fastfeed-device-prefetch thread), `streams.py` is the
accelerator API.
"""

from ..device_augment import DeviceAugment
from .prefetcher import DTYPES, DevicePrefetcher

__all__ = ["DTYPES", "DeviceAugment", "DevicePrefetcher"]
