"""The machine a bench ran on: cores, RAM, CPU model, accelerator, and library versions."""

from __future__ import annotations

import contextlib
import platform
from importlib import metadata

import psutil

from ..devices import DeviceError, device_name, parse_device
from ..procs import usable_cores


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _dali_version() -> str | None:
    # Any nvidia-dali-cudaXXX wheel; read from metadata so DALI itself is not imported.
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("nvidia-dali"):
            return f"{dist.version} ({name})"
    return None


def machine_info(device: str = "cpu") -> dict:
    import cv2
    import numpy
    import torch

    info = {
        "cpu_model": _cpu_model(),
        "cores_usable": usable_cores(),
        "cores_logical": psutil.cpu_count(logical=True),
        "cores_physical": psutil.cpu_count(logical=False),
        "ram_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "opencv": cv2.__version__,
            "simplejpeg": _dist_version("simplejpeg"),
            "lmdb": _dist_version("lmdb"),
            "psutil": psutil.__version__,
            "dali": _dali_version(),
            "torch_npu": _dist_version("torch-npu", "torch_npu"),
        },
        "accelerator": None,
    }
    kind = parse_device(device)[0]
    if kind in ("cuda", "npu"):
        try:
            name = device_name(device)
        except (DeviceError, ImportError):   # not on this machine: the bench says so elsewhere
            name = None
        if name is not None:
            info["accelerator"] = {"kind": kind, "name": name} | ({"cuda": torch.version.cuda} if kind == "cuda" else {})
    return info
