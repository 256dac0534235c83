"""GPU check of the device prefetcher, for a bare GPU machine (PyTorch and nothing else).

    bash benchmarks/gpu_check.sh                 # from the repository root; prints a table last

1. tests: the `gpu` tests of tests/test_prefetch.py, through pytest when it and the test suite's
   imports are there, else called one by one here (they need only torch);
2. h2d: host-to-device bandwidth of one [16,3,640,640] batch, uint8 vs float32, pinned vs pageable,
   and the cpu loader's kind of memory (shared, page-locked in place with cudaHostRegister);
3. overlap: step time at a fixed synthetic compute load (a matmul loop), fed by a synthetic loader of
   pinned uint8 batches with a small CPU cost, without and with the DevicePrefetcher;
4. augment: what DeviceAugment costs per batch on the device;
5. dali: DALI `mixed` decode and the dali loader on the GPU (benchmarks/gpu_check_dali.py), when DALI is installed.
6. train: the bundled YOLOv3's training step at 640 (ms, images/s, peak memory) with and without AMP and
   activation checkpointing (runs before the dali section).

Exit status: 0 when everything that ran passed, 1 on a failed test or a section that raised,
2 when there is no CUDA device (unless --allow-cpu, a smoke run of the script itself on a CPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fastfeed.batch import Batch  # noqa: E402
from fastfeed.device_augment import DeviceAugment  # noqa: E402
from fastfeed.prefetch import DevicePrefetcher  # noqa: E402

ROWS: list[tuple[str, str, str]] = []      # (section, item, value): the table printed last
FAILURES: list[str] = []


def row(section: str, item: str, value: str) -> None:
    ROWS.append((section, item, value))
    print(f"  {section:<8} {item:<34} {value}", flush=True)


def section(name: str, fn, *args, deadline: float):
    """Run one section; a missing optional piece is the section's own business (it adds a row)."""
    if time.monotonic() > deadline:
        row(name, "(skipped)", "out of time")
        return None
    print(f"--- {name}", flush=True)
    try:
        return fn(*args)
    except Exception as e:  # a real failure: reported, the other sections still run
        traceback.print_exc()
        FAILURES.append(f"{name}: {type(e).__name__}: {e}")
        row(name, "(failed)", f"{type(e).__name__}: {str(e)[:60]}")
        return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


# --- 5. DALI `mixed` decode --------------------------------------------------------------------------------
# benchmarks/gpu_check_dali.py does the work (it imports DALI, which a bare GPU machine may not have: it then
# says so and exits 0). Run as a child so a DALI crash or hang cannot take this script's table with it.

def dali_mixed(device: torch.device, quick: bool, seconds: float) -> None:
    if device.type != "cuda":
        row("dali", "mixed decode", "skipped: no CUDA device")
        return
    import subprocess

    cmd = [sys.executable, str(Path(__file__).with_name("gpu_check_dali.py"))] + (["--quick"] if quick else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        FAILURES.append(f"dali: no answer within {seconds:.0f} s")
        row("dali", "gpu_check_dali.py", f"timed out after {seconds:.0f} s")
        return
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    for line in lines[-6:]:
        row("dali", "", line[:110])
    if out.returncode != 0:
        FAILURES.append(f"dali: gpu_check_dali.py exited {out.returncode}: {out.stderr.strip()[-300:]}")


# --- 6. the bundled model's step: YOLOv3 at 640, AMP and activation checkpointing ------------------------
# fastfeed.train.bench needs only torch. What an accelerator consumes per second bounds what a loader must
# deliver; peak memory shows what --amp and --grad-ckpt buy.

def train_step(device: torch.device, quick: bool) -> None:
    if device.type != "cuda":
        row("train", "yolov3 step", "skipped: no CUDA device")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fastfeed.train.bench import bench_step

    imgsz, batch = (320, 8) if quick else (640, 16)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, 3, imgsz, imgsz), dtype=torch.uint8, generator=g).pin_memory()
    n = 6 * batch
    targets = torch.cat([torch.arange(batch).repeat_interleave(6)[:, None].float(),
                         torch.randint(0, 80, (n, 1), generator=g).float(),
                         0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.05 + 0.3 * torch.rand(n, 2, generator=g)], 1)
    for amp, ckpt in ((None, False), ("bf16", False), ("bf16", True), ("fp16", False)):
        step = bench_step("yolov3", device, imgsz, batch, amp=amp, grad_ckpt=ckpt)
        for _ in range(3):
            step(images, targets)
        torch.cuda.reset_peak_memory_stats(device)
        t = time.perf_counter()
        steps = 5 if quick else 15
        for _ in range(steps):
            step(images, targets)
        ms = (time.perf_counter() - t) / steps * 1e3
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        label = f"yolov3 {imgsz} b{batch} amp={amp or 'off'} ckpt={'on' if ckpt else 'off'}"
        row("train", label, f"{ms:7.1f} ms/step  {batch / ms * 1e3:6.0f} images/s  peak {peak:5.2f} GiB")
        del step
        torch.cuda.empty_cache()


# --- main -----------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allow-cpu", action="store_true", help="run what can run without CUDA (a smoke test of this script)")
    ap.add_argument("--quick", action="store_true", help="small batches and few steps")
    ap.add_argument("--runner", choices=("auto", "pytest", "builtin"), default="auto")
    ap.add_argument("--step-ms", type=float, default=25.0, help="the synthetic compute per step")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds for everything; later sections skip")
    ap.add_argument("--json", help="also write the table here")
    args = ap.parse_args(argv)
    start = time.monotonic()
    deadline = start + args.budget

    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        name = torch.cuda.get_device_name(device)
    elif args.allow_cpu:
        device, name = torch.device("cpu"), "CPU (smoke run: figures mean nothing)"
    else:
        print(f"gpu_check: torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")
        return 2
    shape = (4, 3, 160, 160) if args.quick or device.type == "cpu" else (16, 3, 640, 640)
    steps = 12 if args.quick or device.type == "cpu" else 40
    print(f"gpu_check on {name}; torch {torch.__version__}, CUDA {torch.version.cuda}; batch {shape}", flush=True)

    section("tests", run_tests, device, args.runner, max(60.0, args.budget * 0.5), deadline=deadline)
    section("h2d", bandwidth, device, (16, 3, 640, 640) if not args.quick else shape, 20, deadline=deadline)
    section("overlap", overlap, device, shape, args.step_ms, steps, deadline=deadline)
    section("augment", augment_cost, device, shape, 20 if device.type == "cuda" else 3, deadline=deadline)
    section("train", train_step, device, args.quick, deadline=deadline)
    section("dali", dali_mixed, device, args.quick, max(30.0, deadline - time.monotonic() - 5), deadline=deadline)
    threads = [t.name for t in threading.enumerate() if t.name == "fastfeed-prefetch"]
    if threads:
        FAILURES.append(f"{len(threads)} prefetch thread(s) still running")

    status = "OK" if not FAILURES else "FAILED: " + "; ".join(FAILURES)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "rows": ROWS, "failures": FAILURES}, indent=1))
    # --- the table, last ---
    print(f"\n== fastfeed gpu_check: {name}, torch {torch.__version__}, {time.monotonic() - start:.0f} s ==")
    for sec, item, value in ROWS:
        print(f"{sec:<8} {item:<40} {value}")
    print(f"{'result':<8} {'':<40} {status}")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
