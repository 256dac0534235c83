"""The `device` loader's side-stream protocol against fake CUDA / NPU modules, and how the trainer and the
bench use it."""

from __future__ import annotations

import pytest
import torch
from device_helpers import LoggedHost, collect, painted, run, same, u8  # noqa: F401  (fixtures)

from fastfeed.loaders import LoaderConfig, create_loader

# --- the side stream, against a fake CUDA module ---------------------------------------------------



def test_stream_protocol_on_a_fake_accelerator(painted):
    """All device work on one side stream; a batch's `copied` event synchronised before the workers' next
    batch is asked for (its slot is then reused); the consumer waits on the batch's `ready` event; record_stream
    on what is handed out (the prefetcher's check, tests/test_prefetch.py)."""
    from prefetch_helpers import FakeDeviceModule, RecordingOps, check_protocol

    from fastfeed.loaders.device import DeviceOptions
    from fastfeed.loaders.device.loader import DeviceLoader

    log = []
    mod = FakeDeviceModule(log)
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=2, seed=1)
    loader = DeviceLoader(painted, cfg, DeviceOptions(decoder="host"), ops=RecordingOps(mod, torch.device("cuda")),
                          device=torch.device("cuda"))
    want = run(painted, cfg, epochs=(0, 1))
    loader.feed.loader = LoggedHost(loader.host, log)
    got_all = []
    for epoch in range(2):
        del log[:]
        loader.set_epoch(epoch)
        got = []
        for b in loader:
            got.append((b, len(log)))
            got_all.append((u8(b.images), b.targets.clone()))
            log.append(("use", len(got) - 1))
        assert len(got) == len(loader) == 6
        check_protocol(log, got)
        assert any(e[0] == "copy" for e in log)
    assert len(mod.streams) == 1 and same(got_all, want)
    loader.close()


_NPU_SCRIPT = """
import sys, types, torch
sys.path.insert(0, sys.argv[2])
from prefetch_helpers import FakeDeviceModule, RecordingOps, check_protocol
from device_helpers import LoggedHost, run, same, u8
from fastfeed import Store
from fastfeed.loaders import LoaderConfig
from fastfeed.loaders.device import DeviceOptions
from fastfeed.loaders.device.loader import DeviceLoader
torch.set_num_threads(1)
torch.utils.rename_privateuse1_backend("npu")        # what torch_npu does: torch.device("npu", 0) is valid
log = []
fake = FakeDeviceModule(log)
fake.is_available, fake.current_device, fake.device_count = (lambda: True), (lambda: 0), (lambda: 1)
sys.modules["torch_npu"] = types.ModuleType("torch_npu")
torch.npu = fake
store = Store(sys.argv[1])
cfg = LoaderConfig(imgsz=64, batch_size=4, workers=2, seed=1, device="npu")
device = cfg.resolved_device()
assert device == torch.device("npu", 0), device
loader = DeviceLoader(store, cfg, DeviceOptions(), ops=RecordingOps(fake, device), device=device)
assert loader.decoder.name == "host", loader.decoder.name     # no nvJPEG on an NPU
loader.feed.loader = LoggedHost(loader.host, log)
loader.set_epoch(0)
got, batches = [], []
for b in loader:
    got.append((b, len(log)))
    batches.append((u8(b.images), b.targets.clone()))
    log.append(("use", len(got) - 1))
check_protocol(log, got)
assert len(fake.streams) == 1
assert same(batches, run(store, LoaderConfig(imgsz=64, batch_size=4, workers=2, seed=1, device="cpu")))
loader.close()
print("npu ok")
"""


def test_stream_protocol_on_a_fake_npu(painted, tmp_path):
    """device="npu" through fastfeed.devices (torch_npu and torch.npu faked, in a child process: naming the
    backend "npu" cannot be undone): the host decoder, the same side-stream protocol, the CPU path's batches."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "npu.py"
    script.write_text(_NPU_SCRIPT)
    tests = str(Path(__file__).resolve().parent)
    p = subprocess.run([sys.executable, str(script), str(painted.path), tests], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "npu ok" in p.stdout, p.stdout[-2000:] + p.stderr[-4000:]


# --- how the trainer and the bench use it ------------------------------------------------------------

def test_the_trainer_uses_it_as_it_is(painted):
    """fastfeed.train.device.device_batches returns an on_device loader itself (no prefetcher); what the trainer
    must pass: LoaderConfig(device=<its device>) and the loader option dtype=<its AMP dtype>."""
    from fastfeed.prefetch import DevicePrefetcher
    from fastfeed.train.device import device_batches

    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=0, device="cpu")
    with create_loader("device", painted, cfg, dtype="bfloat16") as loader:
        feed = device_batches(loader, torch.device("cpu"), torch.bfloat16)
        assert feed is loader
        feed.set_epoch(0, 2)
        batches = list(feed)
        assert len(batches) == len(loader) - 2 and batches[0].images.dtype == torch.bfloat16
        with pytest.raises(ValueError, match="already yields batches on cpu: iterate it directly"):
            DevicePrefetcher(loader, "cpu")


def test_fastfeed_bench_runs_it_without_a_copy_stage(painted):
    from fastfeed.bench import BenchConfig, format_table, run_bench

    res = run_bench(BenchConfig(data=painted.path, loaders=("cpu", "device"), imgsz=64, batch_size=4, workers=1,
                                batches=4, progress=False))
    cpu, dev = res.results
    assert dev.ok and not dev.copy_applicable and dev.images_per_s.overall > 0
    assert {"read", "plan", "decode", "augment"} <= {k for k, v in dev.stage_ms_per_sample.items() if v > 0}
    assert "batches come out on the device" in " ".join(dev.notes)
    assert "device" in format_table(res)
