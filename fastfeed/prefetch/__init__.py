"""`DevicePrefetcher`: batches already on the device, as floats, ahead of the step that needs them.

    with create_loader("cpu", store, cfg) as loader, DevicePrefetcher(loader, "cuda") as batches:
        for epoch in range(epochs):
            batches.set_epoch(epoch)                  # passes through to the loader
            for images, targets in batches:           # float [B,3,S,S] in [0,1] and [M,6], on the GPU
                ...

The side stream, the ready events, record_stream and the buffer-reuse hazard: docs/design.md, 'The prefetcher
copies on a side stream'. Layout: `prefetcher.py` (one batch's produce / release / hand-out), `drivers.py` (inline,
or the fastfeed-device-prefetch thread), `streams.py` (the accelerator API), `augment.py` (which device augmentation
applies; the augmentation itself is `fastfeed/device_augment.py`). `dtype=torch.uint8` skips the conversion.
"""

from ..device_augment import DeviceAugment
from .prefetcher import DTYPES, DevicePrefetcher

__all__ = ["DTYPES", "DeviceAugment", "DevicePrefetcher"]
