"""The `dali` loader: an NVIDIA DALI pipeline over the packed store (pip install fastfeed[dali]).

    loader = create_loader("dali", store, LoaderConfig(imgsz=640, batch_size=16, workers=4))
    loader = create_dali_loader(store, cfg, device="cuda:1")      # choosing the device explicitly

Same `Batch` contract as the cpu loader: uint8 [B,3,S,S] images (on the GPU when DALI runs there:
no host copy at all) and float32 [M,6] targets (on the host). Importing this package does not import
DALI; creating a loader does, and raises ImportError naming the extra when it is missing.

Device: the `device=` argument, else $FASTFEED_DALI_DEVICE, else the GPU when torch sees one
(`mixed` decode) and the CPU otherwise (device.py). Layout: device.py (device, import check),
source.py (external source: reads, CRC, sampling, mosaic partner pool), plan.py (per-sample
geometry and boxes), graph.py (the DALI ops), loader.py (the Loader).
"""

from __future__ import annotations

from ...store.reader import Store
from ..base import LoaderConfig, register_loader
from .device import ENV, DaliDevice, require_dali, resolve_device


def create_dali_loader(store: Store, cfg: LoaderConfig, device: str | None = None):
    """The `dali` loader for `store`; `device`: "auto" | "cpu" | "cuda" | "cuda:N" (None: $FASTFEED_DALI_DEVICE)."""
    require_dali()
    dev = resolve_device(device)
    from .loader import DaliLoader

    return DaliLoader(store, cfg, dev)


register_loader("dali", create_dali_loader)

__all__ = ["ENV", "DaliDevice", "create_dali_loader", "resolve_device"]
