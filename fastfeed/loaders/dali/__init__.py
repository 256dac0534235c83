"""The `dali` loader: an NVIDIA DALI pipeline over the packed store (pip install -e '.[dali]').

    loader = create_loader("dali", store, LoaderConfig(imgsz=640, batch_size=16, workers=4))
    loader = create_loader("dali", store, LoaderConfig(device="cuda:1"))   # choosing the GPU

Same `Batch` contract as the cpu loader: uint8 [B,3,S,S] images (on the GPU when DALI runs there:
no host copy at all) and float32 [M,6] targets (on the host). Importing this package does not import
DALI; creating a loader does, and raises ImportError naming the extra when it is missing.
"""

from __future__ import annotations

from ...store.reader import Store
from ..base import LoaderConfig
from ..pool import CpuOptions
from ..registry import register_loader
from ..renders import DALI
from .device import DaliDevice, dali_device, dali_missing, require_dali


def create_dali_loader(store: Store, cfg: LoaderConfig, opts: CpuOptions | None = None, order=None):
    """The `dali` loader for `store`, on `cfg.device` (see device.py); boxes only: a detect store, or
    any store with task='detect' (else UnsupportedTask); what it does not render is refused (`renders.DALI`)."""
    DALI.refuse(store, cfg)   # said before asking for DALI
    require_dali()
    dev = dali_device(cfg.device)
    from .loader import DaliLoader

    return DaliLoader(store, cfg, dev, (opts or CpuOptions()).resolved(len(store), cfg.batch_size), order)


register_loader("dali", create_dali_loader, options=CpuOptions, check=dali_missing,
                summary="an NVIDIA DALI pipeline: nvJPEG decode and augmentation on the GPU (CPU operators elsewhere)")

__all__ = ["DaliDevice", "create_dali_loader", "dali_device"]
