"""Devices: the one place that parses a device name, imports `torch_npu`, and hands out the
accelerator's torch module (`torch.cuda`, `torch.npu`). Torch only, so a bare GPU machine imports it.
(The usable core count is `fastfeed.procs.usable_cores`: packing needs it without torch.)

    resolve_device("auto")        # cuda:<current> when torch sees a GPU, else npu, else cpu
    resolve_device("cuda", 3)     # cuda:3 (torchrun: the local rank picks the accelerator)
    accelerator_module(device)    # torch.cuda / torch.npu, or None for the CPU
"""

from __future__ import annotations

import os
import random
import re

import torch

DEVICES = ("cpu", "cuda", "npu")
_NAMES = {"cuda": "CUDA", "npu": "Ascend NPU"}
_VALID = "'auto', 'cpu', 'cuda[:N]' or 'npu[:N]'"


class DeviceError(RuntimeError):
    """The asked-for device is not on this machine (the message says what to install or use instead)."""


def parse_device(name) -> tuple[str, int | None]:
    """'auto' | 'cpu' | 'cuda[:N]' | 'npu[:N]' (or a torch.device) -> (kind, index or None); checks the
    spelling only, not that the device is there. 'cpu:N' is the CPU (torch's spelling; index None). Raises
    ValueError listing the valid names."""
    m = re.fullmatch(r"(auto|cpu|cuda|npu)(?::(\d+))?", str(name).strip().lower())
    if m is None or (m.group(2) is not None and m.group(1) == "auto"):
        raise ValueError(f"device {name!r} is not a device; valid: {_VALID}")
    return m.group(1), None if m.group(2) is None or m.group(1) == "cpu" else int(m.group(2))


def _import_torch_npu() -> None:
    try:
        import torch_npu  # noqa: F401  (registers torch.npu and the "npu" device type)
    except ImportError as e:
        raise ImportError(f"device 'npu' needs torch_npu: pip install -e '.[npu]' in the fastfeed checkout (with Ascend CANN) ({e})") from e


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
        raise DeviceError(f"device {str(device)!r}: torch {torch.__version__} sees no {_NAMES[kind]} device; "
                          f"{_no_device_hint(kind, mod)}, or use 'cpu'")
    return mod


def _no_device_hint(kind: str, mod) -> str:
    """What to do when torch sees no device of `kind`: a build of torch without it needs another build; a build
    with it (torch.version.cuda / .hip set, torch.npu registered) sees none, which is the machine's doing."""
    var = "CUDA_VISIBLE_DEVICES" if kind == "cuda" else "ASCEND_RT_VISIBLE_DEVICES"
    shown = "unset" if os.environ.get(var) is None else repr(os.environ[var])
    if kind == "cuda" and (getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None)):
        return (f"this torch is a GPU build, so no GPU is visible to it: check {var} ({shown}), "
                "the NVIDIA driver and that `nvidia-smi` lists a GPU")
    if kind == "cuda":
        return "this torch is a CPU-only build: install a CUDA build of torch (README, Install)"
    if mod is not None:
        return (f"torch_npu is installed, so no NPU is visible to it: check {var} ({shown}), "
                "the Ascend driver and CANN, and that `npu-smi info` lists an NPU")
    return "install torch_npu with Ascend CANN"


def resolve_device(name="auto", local_rank: int | None = None) -> torch.device:
    """A checked torch.device. 'auto': a CUDA GPU, else an Ascend NPU already set up, else the CPU.
    Without an index an accelerator is `local_rank`'s (torchrun: one per process), else the current one."""
    kind, index = parse_device(name)
    if kind == "auto":
        npu = getattr(torch, "npu", None)   # only there once torch_npu was imported by someone
        kind = "cuda" if torch.cuda.is_available() else "npu" if npu is not None and npu.is_available() else "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    mod = accelerator_module(name)   # (its message names the device as given)
    if index is None:
        index = local_rank if local_rank is not None else mod.current_device()
    count = mod.device_count()
    if index >= count:
        raise DeviceError(f"device {kind}:{index} asked for, but there are {count} {_NAMES[kind]} device(s) "
                          f"({kind}:0..{kind}:{count - 1})")
    return torch.device(kind, index)


def has_cuda() -> bool:
    """torch sees an NVIDIA GPU (without initialising anything beyond what torch.cuda.is_available does)."""
    return torch.cuda.is_available()


def device_count(device) -> int:
    """How many devices of `device`'s kind this process sees (1 for the CPU)."""
    mod = accelerator_module(device)
    return 1 if mod is None else int(mod.device_count())


def set_device(device: torch.device) -> None:
    """Make `device` the current accelerator of this process (a DDP rank's own); nothing on the CPU."""
    if (mod := accelerator_module(device)) is not None:
        mod.set_device(device)


def device_name(device) -> str | None:
    """The accelerator's marketing name (None for the CPU)."""
    mod = accelerator_module(device)
    if mod is None:
        return None
    get = getattr(mod, "get_device_name", None)
    return str(get(torch.device(device).index or 0)) if get is not None else parse_device(device)[0]


def rng_state(device: torch.device) -> dict:
    """The process's random generators: Python's, numpy's (its key as a tensor, so a checkpoint loads with
    weights_only), torch's CPU one and the accelerator's when `device` is one (checkpoints)."""
    import numpy as np

    kind, key, *rest = np.random.get_state()
    state = {"python": random.getstate(), "numpy": (kind, torch.from_numpy(key.astype(np.int64)), *rest),
             "torch": torch.get_rng_state()}
    if (mod := accelerator_module(device)) is not None:
        state[device.type] = mod.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    import numpy as np

    if "python" in state:   # (a state saved before Python's and numpy's were kept has torch's alone)
        random.setstate(state["python"])
        kind, key, *rest = state["numpy"]
        np.random.set_state((kind, np.asarray(key, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if device.type in state:
        accelerator_module(device).set_rng_state(state[device.type], device)


def copy_fence(device):
    """An event recorded on `device`'s current stream (after queueing copies out of a host buffer): `.synchronize()`
    waits until they are done, so the buffer can be reused. None on the CPU (copies there are synchronous)."""
    mod = accelerator_module(device)
    if mod is None:
        return None
    event = mod.Event()
    event.record()
    return event


def pin_in_place(t: torch.Tensor) -> bool:
    """Page-lock an existing (shared) host tensor in place so copies to a CUDA GPU can be asynchronous. False
    when there is no CUDA GPU or the driver refuses (the copies are then synchronous)."""
    if not torch.cuda.is_available():
        return False
    return int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)) == 0


def unpin(t: torch.Tensor) -> None:
    """Undo `pin_in_place`."""
    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work. Kernels run asynchronously: without this a timer around a
    step measures only how long the host took to *queue* it."""
    if (mod := accelerator_module(device)) is not None:
        mod.synchronize(device)


def free_memory(device) -> tuple[int, int]:
    """(free, total) bytes of memory on `device`: the accelerator's (`mem_get_info`), or for the CPU the host
    RAM available to new allocations (what a cache held "on the device" takes there)."""
    if (mod := accelerator_module(device)) is not None:
        free, total = mod.mem_get_info(device)
        return int(free), int(total)
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:   # a bare GPU machine without psutil: free pages only (page cache not counted)
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


# --- memory, utilisation, layouts: what the trainer asks of an accelerator ------------------------------------

NPU_FORMAT_NC1HWC0 = 3   # torch_npu's ACL format id of NC1HWC0, the channel-blocked layout Ascend convolutions use


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation failure on the device: torch.OutOfMemoryError (CUDA, and what tests inject), or the
    RuntimeError torch_npu raises ("NPU out of memory")."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def empty_cache(device: torch.device) -> None:
    """Hand the allocator's cached, unused blocks back to the device (after an out-of-memory error)."""
    if (mod := accelerator_module(device)) is not None:
        mod.empty_cache()


def memory_report(device: torch.device) -> dict:
    """MiB allocated, reserved, peak allocated, peak reserved and the device's total (with `mem_frac`: peak
    reserved / total, the figure to hold under ~90%); {} on the CPU. Reserved far above allocated is
    fragmentation: what makes a run run out of memory "with memory free"."""
    mod = accelerator_module(device)
    if mod is None:
        return {}
    mib = 2**20
    total = mod.get_device_properties(device).total_memory
    out = {"mem_alloc_mb": mod.memory_allocated(device) / mib, "mem_reserved_mb": mod.memory_reserved(device) / mib,
           "mem_peak_mb": mod.max_memory_allocated(device) / mib,
           "mem_peak_reserved_mb": mod.max_memory_reserved(device) / mib, "mem_total_mb": total / mib}
    out["mem_frac"] = out["mem_peak_reserved_mb"] / max(out["mem_total_mb"], 1e-9)
    return out


def reset_peak_memory(device: torch.device) -> None:
    if (mod := accelerator_module(device)) is not None:
        mod.reset_peak_memory_stats(device)


_NO_UTILIZATION: set[str] = set()   # device kinds whose utilisation could not be read: not asked again


def utilization(device: torch.device) -> float | None:
    """Percent of the last sample period the accelerator ran a kernel (NVML on CUDA, through torch;
    torch_npu's on an NPU), or None where it cannot be read (the CPU, no pynvml: tried once)."""
    kind = parse_device(device)[0]
    fn = None if kind in _NO_UTILIZATION else getattr(accelerator_module(device), "utilization", None)   # CPU: None
    if fn is None:
        return None
    try:
        return float(fn(device))
    except Exception:   # no pynvml / NVML, or a driver that does not report it
        _NO_UTILIZATION.add(kind)
        return None


def use_expandable_segments(device: torch.device) -> str | None:
    """On CUDA, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` unless the user set the allocator's
    settings: segments grow in place instead of new fixed-size blocks piling up reserved memory that no
    larger tensor fits. Returns the setting in force (None off CUDA)."""
    if parse_device(device)[0] != "cuda":
        return None
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):   # the caching allocator's settings, either name
        if os.environ.get(var):
            return f"{var}={os.environ[var]} (yours)"
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if torch.cuda.is_initialized():   # the allocator read its settings already: change them in place
        try:
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")
        except (AttributeError, RuntimeError):
            return "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (for child processes; CUDA already started)"
    return "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def to_channels_last(x, device):
    """`x` (a 4-D tensor or a module) in the device's channels-last layout. CUDA and the CPU:
    torch.channels_last (NHWC strides: what Tensor Cores want under AMP). An Ascend NPU: a tensor is cast to
    the private NC1HWC0 format with torch_npu.npu_format_cast where torch_npu has it (unchanged otherwise);
    a module stays as it is (the NPU runtime casts convolution weights to its own formats). Idempotent."""
    kind = parse_device(device)[0]
    if kind == "npu":
        _import_torch_npu()
        import torch_npu

        cast = getattr(torch_npu, "npu_format_cast", None)
        if isinstance(x, torch.nn.Module) or cast is None:
            return x
        return cast(x, NPU_FORMAT_NC1HWC0)
    if isinstance(x, torch.nn.Module):
        return x.to(memory_format=torch.channels_last)
    return x.contiguous(memory_format=torch.channels_last)
