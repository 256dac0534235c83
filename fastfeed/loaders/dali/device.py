"""Where the DALI pipeline runs, and the import check that names the extra to install.

`LoaderConfig` has no device field, so the device comes from (first that is set):

1. the `device=` argument of `create_dali_loader(store, cfg, device=...)`;
2. the environment variable FASTFEED_DALI_DEVICE (what `fastfeed bench --loader dali` and
   `create_loader("dali", ...)` see);
3. "auto": the GPU (`mixed` decode, every op on the device) when torch sees CUDA, else the CPU.

Values: "auto", "cpu", "cuda" (torch's current device) or "cuda:N". Asking for CUDA where there is
none is an error, never a silent fall-back to the (much slower) CPU path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

ENV = "FASTFEED_DALI_DEVICE"
_VALID = "'auto', 'cpu', 'cuda' or 'cuda:N'"


@dataclass(frozen=True)
class DaliDevice:
    """device_id None: a CPU-only pipeline (decode on "cpu"); else the GPU that DALI uses."""

    device_id: int | None

    @property
    def gpu(self) -> bool:
        return self.device_id is not None

    @property
    def decoder(self) -> str:
        return "mixed" if self.gpu else "cpu"

    def __str__(self) -> str:
        return f"cuda:{self.device_id}" if self.gpu else "cpu"


def require_dali():
    """Import nvidia.dali, or raise ImportError naming the extra that provides it."""
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as e:
        raise ImportError("the 'dali' loader needs NVIDIA DALI: pip install fastfeed[dali] "
                          f"(or an nvidia-dali-cudaXXX wheel matching your CUDA) ({e})") from e


def resolve_device(device: str | None = None) -> DaliDevice:
    """The device for `device` (None: $FASTFEED_DALI_DEVICE, else "auto"); see the module docstring."""
    source = "device argument"
    if device is None:
        device, source = os.environ.get(ENV) or "auto", ENV
    name = str(device).strip().lower()
    m = re.fullmatch(r"(auto|cpu|cuda)(?::(\d+))?", name)
    if m is None or (m.group(2) is not None and m.group(1) != "cuda"):
        raise ValueError(f"dali loader: {source} {device!r} is not a device; valid: {_VALID}")
    kind, index = m.group(1), m.group(2)
    if kind == "cpu" or (kind == "auto" and not torch.cuda.is_available()):
        return DaliDevice(None)
    if not torch.cuda.is_available():
        raise RuntimeError(f"dali loader: {source} asks for {device!r} but torch {torch.__version__} sees no CUDA "
                           f"GPU; use 'cpu' (set {ENV}=cpu) or install a CUDA build of torch")
    count = torch.cuda.device_count()
    idx = int(index) if index is not None else torch.cuda.current_device()
    if idx >= count:
        raise ValueError(f"dali loader: {source} asks for cuda:{idx} but there are {count} GPU(s) (cuda:0..{count - 1})")
    return DaliDevice(idx)
