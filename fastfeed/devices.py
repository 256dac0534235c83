"""Devices: the one place that parses a device name, imports `torch_npu`, and hands out the
accelerator's torch module (`torch.cuda`, `torch.npu`). Torch only, so a bare GPU machine imports it.
(The usable core count is `fastfeed.procs.usable_cores`: packing needs it without torch.)

    resolve_device("auto")        # cuda:<current> when torch sees a GPU, else npu, else cpu
    resolve_device("cuda", 3)     # cuda:3 (torchrun: the local rank picks the accelerator)
    accelerator_module(device)    # torch.cuda / torch.npu, or None for the CPU
"""

from __future__ import annotations

import os
import re

import torch

DEVICES = ("cpu", "cuda", "npu")
_NAMES = {"cuda": "CUDA", "npu": "Ascend NPU"}
_VALID = "'auto', 'cpu', 'cuda[:N]' or 'npu[:N]'"


class DeviceError(RuntimeError):
    """The asked-for device is not on this machine (the message says what to install or use instead)."""


def parse_device(name) -> tuple[str, int | None]:
    """'auto' | 'cpu' | 'cuda[:N]' | 'npu[:N]' (or a torch.device) -> (kind, index or None); checks the
    spelling only, not that the device is there. Raises ValueError listing the valid names."""
    if isinstance(name, torch.device):
        return name.type, name.index
    m = re.fullmatch(r"(auto|cpu|cuda|npu)(?::(\d+))?", str(name).strip().lower())
    if m is None or (m.group(2) is not None and m.group(1) in ("auto", "cpu")):
        raise ValueError(f"device {name!r} is not a device; valid: {_VALID}")
    return m.group(1), None if m.group(2) is None else int(m.group(2))


def _import_torch_npu() -> None:
    try:
        import torch_npu  # noqa: F401  (registers torch.npu and the "npu" device type)
    except ImportError as e:
        raise ImportError(f"device 'npu' needs torch_npu: pip install fastfeed[npu] (with Ascend CANN) ({e})") from e


def accelerator_module(device):
    """torch.cuda / torch.npu for an accelerator (importing torch_npu for npu), None for the CPU.
    Raises DeviceError when torch sees no such device."""
    kind = parse_device(device)[0]
    if kind in ("cpu", "auto"):
        return None
    if kind == "npu":
        _import_torch_npu()
    mod = getattr(torch, kind, None)
    if mod is None or not mod.is_available():
        hint = ("install a CUDA build of torch (make TORCH_SPEC='torch>=2.6')" if kind == "cuda"
                else "install torch_npu with Ascend CANN")
        raise DeviceError(f"device {str(device)!r}: torch {torch.__version__} sees no {_NAMES[kind]} device; {hint}, "
                          "or use 'cpu'")
    return mod


def _npu_present() -> bool:
    mod = getattr(torch, "npu", None)   # only there once torch_npu was imported by someone
    return mod is not None and mod.is_available()


def resolve_device(name="auto", local_rank: int | None = None) -> torch.device:
    """A checked torch.device. 'auto': a CUDA GPU, else an Ascend NPU already set up, else the CPU.
    Without an index an accelerator is `local_rank`'s (torchrun: one per process), else the current one."""
    kind, index = parse_device(name)
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "npu" if _npu_present() else "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    mod = accelerator_module(kind)
    if index is None:
        index = local_rank if local_rank is not None else mod.current_device()
    count = mod.device_count()
    if index >= count:
        raise DeviceError(f"device {kind}:{index} asked for, but there are {count} {_NAMES[kind]} device(s) "
                          f"({kind}:0..{kind}:{count - 1})")
    return torch.device(kind, index)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work. Kernels run asynchronously: without this a timer around a
    step measures only how long the host took to *queue* it."""
    mod = accelerator_module(device)
    if mod is not None:
        mod.synchronize(device)


def memory_mb(device: torch.device) -> dict:
    """Allocated / reserved / peak-allocated MiB on an accelerator; {} on the CPU."""
    mod = accelerator_module(device)
    if mod is None:
        return {}
    return {"mem_alloc_mb": mod.memory_allocated(device) / 2**20, "mem_reserved_mb": mod.memory_reserved(device) / 2**20,
            "mem_peak_mb": mod.max_memory_allocated(device) / 2**20}


def free_memory(device) -> tuple[int, int]:
    """(free, total) bytes of memory on `device`: the accelerator's (`mem_get_info`), or for the CPU the host
    RAM available to new allocations (what a cache held "on the device" takes there)."""
    mod = accelerator_module(device)
    if mod is not None:
        free, total = mod.mem_get_info(device)
        return int(free), int(total)
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:   # a bare GPU machine without psutil: free pages only (page cache not counted)
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
