"""fastfeed.devices: the one place device names are parsed, torch_npu imported, and modules handed out."""

from __future__ import annotations

import sys

import pytest
import torch
from bench_helpers import FAST, store  # noqa: F401  (the packed sample: a fixture)

from fastfeed.devices import (
    DeviceError,
    accelerator_module,
    memory_report,
    parse_device,
    resolve_device,
    synchronize,
)


def test_names_are_parsed_and_bad_ones_say_what_is_valid():
    assert parse_device("cpu") == ("cpu", None) and parse_device("cuda:1") == ("cuda", 1)
    assert parse_device(" NPU:0 ") == ("npu", 0) and parse_device(torch.device("cpu")) == ("cpu", None)
    # torch's 'cpu:0' is the CPU, spelled either way; a torch.device of another kind is refused as its name is
    assert parse_device("cpu:0") == parse_device(torch.device("cpu", 0)) == ("cpu", None)
    assert resolve_device("CPU:1") == torch.device("cpu")
    for bad in ("tpu", "cuda:x", "auto:1", "", torch.device("mps"), torch.device("meta")):
        with pytest.raises(ValueError, match="is not a device; valid: 'auto', 'cpu', 'cuda\\[:N\\]' or 'npu\\[:N\\]'"):
            parse_device(bad)


def test_cpu_and_auto_without_an_accelerator():
    assert resolve_device("cpu") == torch.device("cpu") and accelerator_module("cpu") is None
    assert memory_report(torch.device("cpu")) == {}
    synchronize(torch.device("cpu"))   # nothing to wait for
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(DeviceError, match="device 'cuda': torch .* sees no CUDA device; "):
            resolve_device("cuda")


class _FakeNpu:
    def __init__(self, n):
        self.n = n

    def is_available(self):
        return self.n > 0

    def device_count(self):
        return self.n

    def current_device(self):
        return 0


def test_npu_imports_torch_npu_only_when_asked_and_checks_the_index(monkeypatch):
    had = "torch_npu" in sys.modules
    resolve_device("cpu")
    assert ("torch_npu" in sys.modules) == had
    monkeypatch.setitem(sys.modules, "torch_npu", None)          # `import torch_npu` now raises
    with pytest.raises(ImportError, match="device 'npu' needs torch_npu: pip install -e '\\.\\[npu\\]' in the fastfeed checkout"):
        resolve_device("npu")
    monkeypatch.setitem(sys.modules, "torch_npu", type(sys)("torch_npu"))
    monkeypatch.setattr(torch, "npu", _FakeNpu(2), raising=False)
    real = torch.device

    class _Device:   # CPU torch has no "npu" device type without torch_npu: stand in for torch.device
        def __new__(cls, *a):
            return ("npu", *a[1:]) if a[0] == "npu" else real(*a)

    monkeypatch.setattr(torch, "device", _Device)
    assert accelerator_module("npu:1") is torch.npu
    assert resolve_device("npu", local_rank=1) == ("npu", 1)      # torchrun: the local rank's NPU
    with pytest.raises(DeviceError, match="device npu:3 asked for, but there are 2 Ascend NPU device"):
        resolve_device("npu:3")
    monkeypatch.setattr(torch, "npu", _FakeNpu(0), raising=False)
    with pytest.raises(DeviceError, match="sees no Ascend NPU device"):
        resolve_device("npu")


# --- no device seen: a build of torch without it needs another build; a build with it sees none (the machine) -----

def _no_gpu(monkeypatch, cuda_build: str | None):
    monkeypatch.setattr(torch.version, "cuda", cuda_build)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("command", ["bench", "train"])
def test_device_cuda_with_a_cuda_build_and_no_gpu_says_none_is_visible(command, store, tmp_path, monkeypatch,
                                                                        capsys):
    from fastfeed.cli import main

    _no_gpu(monkeypatch, "13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    extra = FAST if command == "bench" else ["--imgsz", "64", "--epochs", "1", "--batch", "2", "--out",
                                             str(tmp_path / "run")]
    assert main([command, "--data", str(store), "--device", "cuda", *extra]) == 1
    err = capsys.readouterr().err
    assert "sees no CUDA device; this torch is a GPU build, so no GPU is visible to it: check CUDA_VISIBLE_DEVICES ('')" in err
    assert "`nvidia-smi`" in err and "install a CUDA build" not in err


def test_device_cuda_with_a_cpu_build_says_install_a_cuda_build(monkeypatch):
    _no_gpu(monkeypatch, None)
    with pytest.raises(DeviceError, match="sees no CUDA device; this torch is a CPU-only build: install a CUDA build of "
                                          "torch \\(README, Install\\), or use 'cpu'"):
        resolve_device("cuda")
    _no_gpu(monkeypatch, "12.8")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(DeviceError, match="no GPU is visible to it: check CUDA_VISIBLE_DEVICES \\(unset\\)"):
        resolve_device("cuda:0")


def test_device_npu_with_torch_npu_and_no_npu_says_none_is_visible(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", type(sys)("torch_npu"))
    monkeypatch.setattr(torch, "npu", _FakeNpu(0), raising=False)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "3")
    with pytest.raises(DeviceError, match="sees no Ascend NPU device; torch_npu is installed, so no NPU is visible to it: "
                                          "check ASCEND_RT_VISIBLE_DEVICES \\('3'\\).*`npu-smi info`"):
        resolve_device("npu")
    monkeypatch.delattr(torch, "npu", raising=False)    # a torch_npu that registered nothing: install it properly
    with pytest.raises(DeviceError, match="install torch_npu with Ascend CANN"):
        resolve_device("npu")
