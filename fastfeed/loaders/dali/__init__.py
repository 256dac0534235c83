"""The `dali` loader: an NVIDIA DALI pipeline over the packed store (pip install -e '.[dali]').

    loader = create_loader("dali", store, LoaderConfig(imgsz=640, batch_size=16, workers=4))
    loader = create_loader("dali", store, LoaderConfig(device="cuda:1"))   # choosing the GPU

Same `Batch` contract as the cpu loader: uint8 [B,3,S,S] images (on the GPU when DALI runs there:
no host copy at all) and float32 [M,6] targets (on the host). Importing this package does not import
DALI; creating a loader does, and raises ImportError naming the extra when it is missing.

The device is `LoaderConfig.device`: "auto" (the default) runs every op on the GPU (`mixed` decode)
when torch sees CUDA, else on the CPU; "cpu" or "cuda[:N]" choose. Asking for CUDA where there is
none is an error (fastfeed.devices), never a silent fall-back to the much slower CPU path; DALI
does not run on Ascend NPUs.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from ...devices import has_cuda, parse_device, resolve_device
from ...store.reader import Store
from ..base import LoaderConfig
from ..pool import CpuOptions
from ..registry import register_loader
from ..renders import DALI


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


_INSTALL = "pip install -e '.[dali]' in the fastfeed checkout (or an nvidia-dali-cudaXXX wheel matching your CUDA)"


def dali_missing() -> str | None:
    """Why the dali loader cannot run here (DALI not installed), or None; cheap: nothing is imported."""
    try:
        found = importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:
        found = False
    return None if found else f"NVIDIA DALI is not installed: {_INSTALL}"


def require_dali():
    """Import nvidia.dali, or raise ImportError naming the extra that provides it."""
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as e:
        raise ImportError(f"the 'dali' loader needs NVIDIA DALI: {_INSTALL} ({e})") from e


def dali_device(device: str) -> DaliDevice:
    """The DALI device for a `LoaderConfig.device` value."""
    kind, _ = parse_device(device)
    if kind == "auto":
        device = "cuda" if has_cuda() else "cpu"
    elif kind == "npu":
        raise ValueError(f"the dali loader runs on NVIDIA GPUs or the CPU, not on {device!r}; "
                         "use device='cpu' or another loader")
    d = resolve_device(device)
    return DaliDevice(None if d.type == "cpu" else d.index)


def create_dali_loader(store: Store, cfg: LoaderConfig, opts: CpuOptions | None = None, order=None):
    """The `dali` loader for `store`, on `cfg.device` (see above); boxes only: a detect store, or
    any store with task='detect' (else UnsupportedTask); what it does not render is refused (`renders.DALI`)."""
    DALI.refuse(store, cfg)   # said before asking for DALI
    require_dali()
    dev = dali_device(cfg.device)
    from .loader import DaliLoader

    return DaliLoader(store, cfg, dev, (opts or CpuOptions()).resolved(len(store), cfg.batch_size), order)


register_loader("dali", create_dali_loader, options=CpuOptions, check=dali_missing,
                summary="an NVIDIA DALI pipeline: nvJPEG decode and augmentation on the GPU (CPU operators elsewhere)")

__all__ = ["DaliDevice", "create_dali_loader", "dali_device"]
