"""fastfeed.devices: the one place device names are parsed, torch_npu imported, and modules handed out."""

from __future__ import annotations

import sys

import pytest
import torch

from fastfeed.devices import (
    DeviceError,
    accelerator_module,
    memory_mb,
    parse_device,
    resolve_device,
    synchronize,
)


def test_names_are_parsed_and_bad_ones_say_what_is_valid():
    assert parse_device("cpu") == ("cpu", None) and parse_device("cuda:1") == ("cuda", 1)
    assert parse_device(" NPU:0 ") == ("npu", 0) and parse_device(torch.device("cpu")) == ("cpu", None)
    for bad in ("tpu", "cpu:0", "cuda:x", "auto:1", ""):
        with pytest.raises(ValueError, match="is not a device; valid: 'auto', 'cpu', 'cuda\\[:N\\]' or 'npu\\[:N\\]'"):
            parse_device(bad)


def test_cpu_and_auto_without_an_accelerator():
    assert resolve_device("cpu") == torch.device("cpu") and accelerator_module("cpu") is None
    assert memory_mb(torch.device("cpu")) == {}
    synchronize(torch.device("cpu"))   # nothing to wait for
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(DeviceError, match="device 'cuda': torch .* sees no CUDA device; install a CUDA build"):
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
    with pytest.raises(ImportError, match="device 'npu' needs torch_npu: pip install fastfeed\\[npu\\]"):
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
