"""The `device` loader: JPEG decode and YOLO augmentation on the accelerator, the host only plans
(docs/design.md, 'The device loader plans on the host and draws on the device').

    loader = create_loader("device", store, LoaderConfig(imgsz=640, batch_size=64, device="cuda"))
    loader = create_loader("device", store, cfg, cache="device", dtype="bfloat16")   # the VRAM cache

Iterated as every loader is (`fastfeed.loaders`); its batches are on the device: images [B,3,S,S] in [0,1],
targets [M,6].

Plain PyTorch: the same code runs on CUDA, Ascend NPUs (host decode) and the CPU (tests). plan.py is the host's;
decode.py, render.py, vram_cache.py and feed.py the device's; loader.py the Loader.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...checks import field_need, is_num
from ...store.reader import Store
from ..base import LoaderConfig
from ..pool import CpuOptions
from ..registry import register_loader
from .decode import DECODERS

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}   # the dtype option
_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class DeviceOptions(CpuOptions):
    """The device loader's own options (and the cpu loader's partner_buffer: the same partners for a seed)."""

    cache: str | None = None        # "device": keep the decoded store in device memory (the VRAM cache)
    dtype: str = "float32"          # the images' dtype: float32 | float16 | bfloat16 (or the torch dtype)
    decoder: str = "auto"           # auto | torchvision | nvimgcodec | host (see decode.py)
    cache_reserve_gb: float = 8.0   # with cache="device": device memory left free for the model

    def __post_init__(self):
        super().__post_init__()
        if self.dtype in _NAMES:
            object.__setattr__(self, "dtype", _NAMES[self.dtype])

        need = field_need(self, "device option ")
        need(self.cache in (None, "device"), "cache", "must be None or 'device' (the decoded store in device memory)")
        need(self.dtype in DTYPES, "dtype", f"must be one of {', '.join(DTYPES)}")
        need(self.decoder in DECODERS, "decoder", f"must be one of {', '.join(DECODERS)}")
        gb = self.cache_reserve_gb   # a numpy number is one
        need(is_num(gb) and math.isfinite(gb) and gb >= 0, "cache_reserve_gb", "must be a number of GiB >= 0")


@register_loader("device", options=DeviceOptions,
                 summary="workers only plan; nvJPEG decode, mosaic/affine/HSV on the accelerator (GPU, NPU, or CPU)")
def create_device_loader(store: Store, cfg: LoaderConfig, opts: DeviceOptions, order=None):
    from .loader import DeviceLoader

    return DeviceLoader(store, cfg, opts.resolved(len(store), cfg.batch_size), order=order)


__all__ = ["DTYPES", "DeviceOptions", "create_device_loader"]
