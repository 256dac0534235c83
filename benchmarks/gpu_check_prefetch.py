"""gpu_check sections 1-4: the device prefetcher's tests, H2D bandwidth, copy/compute overlap, and the
device augmentation's cost (see gpu_check.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
from gpu_common import FAILURES, row, sync

from fastfeed.batch import Batch
from fastfeed.device_augment import DeviceAugment
from fastfeed.prefetch import DevicePrefetcher

REPO = Path(__file__).resolve().parents[1]


# --- 1. tests -----------------------------------------------------------------------------------------

def run_tests(device: torch.device, runner: str, timeout: float) -> None:
    deps = subprocess.run([sys.executable, "-c", "import pytest, numpy, cv2, simplejpeg"], cwd=REPO,
                          capture_output=True).returncode == 0
    if runner == "pytest" or (runner == "auto" and deps):
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_prefetch.py"]
        try:
            p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            FAILURES.append(f"tests: pytest ran over {timeout:.0f} s")
            row("tests", "pytest -m gpu", f"TIMEOUT after {timeout:.0f} s")
            return
        print(p.stdout[-4000:], p.stderr[-2000:], sep="\n")
        last = (p.stdout.strip().splitlines() or ["(no output)"])[-1]
        if p.returncode not in (0, 5):
            FAILURES.append(f"tests: {last}")
        row("tests", "pytest -m gpu", last.strip("= "))
        return
    if device.type != "cuda":
        row("tests", "gpu tests (built-in runner)", "skipped: no CUDA device")
        return
    sys.path.insert(0, str(REPO / "tests"))
    spec = importlib.util.spec_from_file_location("test_prefetch", REPO / "tests" / "test_prefetch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tests = [(n, f) for n, f in vars(mod).items() if n.startswith("test_gpu_") and callable(f)]
    passed = 0
    for name, fn in tests:
        t0 = time.perf_counter()
        try:
            fn()
            passed += 1
            print(f"  PASS {name} ({time.perf_counter() - t0:.1f} s)")
        except Exception:
            print(f"  FAIL {name}\n{traceback.format_exc()}")
            FAILURES.append(f"tests: {name}")
    row("tests", "gpu tests (built-in runner)", f"{passed} passed, {len(tests) - passed} failed")


# --- 2. host-to-device bandwidth -------------------------------------------------------------------------

def bandwidth(device: torch.device, shape, reps: int) -> None:
    if device.type != "cuda":
        row("h2d", "(all)", "skipped: no CUDA device")
        return
    for dtype in (torch.uint8, torch.float32):
        for kind in ("pinned", "pageable", "registered"):
            if kind == "registered" and dtype != torch.uint8:
                continue
            host = torch.zeros(shape, dtype=dtype)
            if kind == "pinned":
                host = host.pin_memory()
            elif kind == "registered":   # what the cpu loader does to its shared slots
                host = host.share_memory_()
                err = int(torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.numel(), 0))
                if err:
                    row("h2d", "uint8 registered (cpu loader)", f"cudaHostRegister error {err}")
                    continue
            dev = torch.empty(shape, dtype=dtype, device=device)
            for _ in range(3):
                dev.copy_(host, non_blocking=True)
            sync(device)
            t0 = time.perf_counter()
            for _ in range(reps):
                dev.copy_(host, non_blocking=True)
            sync(device)
            dt = (time.perf_counter() - t0) / reps
            nbytes = host.numel() * host.element_size()
            extra = f", is_pinned()={host.is_pinned()}" if kind == "registered" else ""
            row("h2d", f"{str(dtype)[6:]} {kind}", f"{nbytes / dt / 1e9:6.1f} GB/s  {dt * 1e3:6.2f} ms/batch{extra}")
            if kind == "registered":
                torch.cuda.cudart().cudaHostUnregister(host.data_ptr())


# --- 3. copy overlap at a fixed compute load -------------------------------------------------------------

class SyntheticLoader:
    """uint8 batches in two reused pinned slots (a loader's contract: valid until the next request);
    batch k is filled with k % 251 on request, which is its small CPU cost (a memset of the batch)."""

    def __init__(self, n: int, shape, pin: bool):
        self.n = n
        self.slots = [torch.zeros(shape, dtype=torch.uint8) for _ in range(2)]
        if pin:
            self.slots = [s.pin_memory() for s in self.slots]
        self.targets = torch.tensor([[0, 1, 0.5, 0.5, 0.2, 0.2]] * 8, dtype=torch.float32)

    def __len__(self):
        return self.n

    def __iter__(self):
        for k in range(self.n):
            slot = self.slots[k % 2]
            slot.fill_(k % 251)
            yield Batch(slot, self.targets)


class Compute:
    """A step of ~`ms` on the device: it reads the batch, then a matmul loop, calibrated once."""

    def __init__(self, device: torch.device, ms: float):
        self.device = device
        n = 4096 if device.type == "cuda" else 256
        self.a = torch.randn(n, n, device=device) / n ** 0.5
        self._time(4)                                     # warm-up (kernel selection, clocks)
        per = self._time(8) / 8
        self.iters = max(1, round(ms / 1e3 / per))

    def _time(self, iters: int) -> float:
        sync(self.device)
        t0 = time.perf_counter()
        x = self.a
        for _ in range(iters):
            x = torch.mm(x, self.a)
        sync(self.device)
        return time.perf_counter() - t0

    def __call__(self, images: torch.Tensor | None, k: int, bad: torch.Tensor) -> None:
        if images is not None:                            # batch k is all (k % 251) / 255: check, no host sync
            bad += (images[:, 0, ::64, ::64] != (k % 251) / 255).sum()
        x = self.a
        for _ in range(self.iters):
            x = torch.mm(x, self.a)


def overlap(device: torch.device, shape, step_ms: float, steps: int) -> None:
    pin = device.type == "cuda"
    compute = Compute(device, step_ms)
    bad = torch.zeros((), dtype=torch.int64, device=device)
    warmup = 3

    def ms_per_step(images_per_step, every: int) -> float:
        """Consume `images_per_step` (an iterator of device batches), syncing every `every` steps."""
        t0, n = None, 0
        for k, images in enumerate(images_per_step):
            if k == warmup:
                sync(device)
                t0 = time.perf_counter()
            compute(images, k, bad)
            if k % every == every - 1:        # every=1: like a loss.item() each step
                sync(device)
            n = k + 1
        sync(device)
        return (time.perf_counter() - t0) / (n - warmup) * 1e3

    def no_data():
        return (None for _ in range(steps + warmup))

    def plain():                              # the usual loop: a synchronous copy, then convert
        for b in SyntheticLoader(steps + warmup, shape, pin):
            yield b.images.to(device).float().div_(255)

    def prefetched(thread: bool):
        for b in DevicePrefetcher(SyntheticLoader(steps + warmup, shape, pin), device, thread=thread):
            yield b.images

    for every, mode in ((1, "sync/step"), (10, "sync/10 steps")):
        c = ms_per_step(no_data(), every)
        row("overlap", f"compute only, {mode}", f"{c:7.2f} ms/step")
        n = ms_per_step(plain(), every)
        row("overlap", f"plain .to(device), {mode}", f"{n:7.2f} ms/step  ({n - c:+.2f})")
        for thread in (False, True):
            p = ms_per_step(prefetched(thread), every)
            hidden = f"{(n - p) / (n - c):.0%}" if n - c > 0.05 else "n/a"
            row("overlap", f"prefetch {'thread' if thread else 'inline'}, {mode}",
                f"{p:7.2f} ms/step  ({p - c:+.2f}; hides {hidden} of the plain overhead)")
    wrong = int(bad.item())
    if wrong:
        FAILURES.append(f"overlap: {wrong} probed pixels differ from the batch the loader made")
    row("overlap", "content check (probed pixels)", "OK" if not wrong else f"{wrong} WRONG")


# --- 4. device augmentation cost ------------------------------------------------------------------------

def augment_cost(device: torch.device, shape, reps: int) -> None:
    aug = DeviceAugment()
    x = torch.rand(shape, device=device)
    t = torch.tensor([[i % shape[0], 0, 0.3, 0.5, 0.1, 0.1] for i in range(64)], device=device)
    for _ in range(3):
        aug(x, t)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        aug(x, t)
    sync(device)
    ms = (time.perf_counter() - t0) / reps * 1e3
    row("augment", f"DeviceAugment {'x'.join(map(str, shape))}", f"{ms:7.3f} ms/batch  ({ms / shape[0]:.4f} ms/sample)")
