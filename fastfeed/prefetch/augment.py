"""Which device augmentation a DevicePrefetcher applies: what a fastfeed `Loader` declares it leaves to
the device, or what the caller forces."""

from __future__ import annotations

import logging

from ..batch import BatchFeed
from ..device_augment import DeviceAugment

log = logging.getLogger(__name__)


def resolve_augment(loader, device_augment, seed: int) -> DeviceAugment | None:
    """The DeviceAugment to apply: what a fastfeed `Loader` declares it leaves to the device (its
    `device_hyp`), or what the caller forces; any other iterable of batches declares nothing."""
    ours = isinstance(loader, BatchFeed)
    left = loader.device_hyp if ours else None
    if device_augment is None:
        device_augment = left is not None
    if device_augment is False:
        if left is not None:
            log.warning("the loader leaves HSV jitter and flip to the device (LoaderConfig.device_augment) but "
                        "device_augment=False: no HSV jitter or flip at all")
        return None
    if device_augment is True:
        if not ours:
            raise ValueError("device_augment=True takes its gains from a fastfeed Loader's LoaderConfig.hyp, and "
                             "this loader is not one; pass a DeviceAugment(...) instead")
        device_augment = DeviceAugment.from_hyp(loader.cfg.hyp, seed=seed)
    if not isinstance(device_augment, DeviceAugment):
        raise ValueError(f"device_augment must be None, True, False or a DeviceAugment, got {device_augment!r}")
    if ours and loader.cfg.augment and left is None:
        log.warning("device augmentation on top of the workers' own HSV jitter and flip: set "
                    "LoaderConfig(device_augment=True) so the workers skip them")
    return device_augment if device_augment.active else None
