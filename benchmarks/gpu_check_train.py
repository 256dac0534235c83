"""gpu_check section 6: the bundled trainer on the GPU (see gpu_check.py). Torch only, like the rest of
gpu_check: the trainer's own step (fastfeed.train.step) runs on synthetic batches, no store or loader.

  steps   YOLOv3 at 640, batch 16: ms/step, images/s, peak memory with and without AMP, channels-last and
          activation checkpointing (fastfeed.train.bench.bench_step)
  oom     out-of-memory replay for real: a cap (torch.cuda.set_per_process_memory_fraction) at 1.25x the peak
          of a half-size micro-batch; three optimizer steps started at the full micro-batch must replay at half
          (or a quarter) and finish
  auto    --batch auto (fastfeed.train.oom.auto_batch) under a cap of 20% of the device, then two real steps at
          the batch it chose, which must not run out of memory
  tests   the `gpu` tests of tests/test_train_*.py, when pytest and fastfeed's dependencies are installed
Within SECTION_S (120 s on an H200; --quick: smaller sizes); a part that would start later is skipped.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch
from gpu_common import FAILURES, row

REPO = Path(__file__).resolve().parents[1]
SECTION_S = 120.0


def train_step(device: torch.device, quick: bool) -> None:
    if device.type != "cuda":
        row("train", "yolov3 step", "skipped: no CUDA device")
        return
    sys.path.insert(0, str(REPO))
    from fastfeed.devices import use_expandable_segments

    row("train", "allocator", str(use_expandable_segments(device)))
    end = time.monotonic() + (SECTION_S / 2 if quick else SECTION_S)
    for part in (step_times, oom_replay, batch_auto, gpu_tests):
        if time.monotonic() > end - 5:
            row("train", part.__name__, "skipped: out of the section's time")
            continue
        try:
            part(device, quick, end)
        except Exception as e:   # one part failing does not hide the others
            traceback.print_exc()
            FAILURES.append(f"train {part.__name__}: {type(e).__name__}: {e}")
            row("train", part.__name__, f"FAILED {type(e).__name__}: {str(e)[:70]}")
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
            torch.cuda.empty_cache()


def synthetic(batch: int, imgsz: int, device=None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, 3, imgsz, imgsz), dtype=torch.uint8, generator=g)
    n = 6 * batch
    targets = torch.cat([torch.arange(batch).repeat_interleave(6)[:, None].float(),
                         torch.randint(0, 80, (n, 1), generator=g).float(),
                         0.2 + 0.6 * torch.rand(n, 2, generator=g), 0.05 + 0.3 * torch.rand(n, 2, generator=g)], 1)
    if device is None:
        return images.pin_memory(), targets
    return images.to(device).float().div_(255), targets.to(device)


# --- steps: what AMP, channels-last and activation checkpointing buy ------------------------------------------

def step_times(device: torch.device, quick: bool, end: float) -> None:
    from fastfeed.train.bench import bench_step

    imgsz, batch = (320, 8) if quick else (640, 16)
    images, targets = synthetic(batch, imgsz)
    base = None
    for amp, ckpt, cl in ((None, False, False), ("bf16", False, False), ("bf16", False, True), ("fp16", False, False),
                          ("fp16", False, True), ("bf16", True, False)):
        step = bench_step("yolov3", device, imgsz, batch, amp=amp, grad_ckpt=ckpt, channels_last=cl)
        for _ in range(3):
            step(images, targets)
        torch.cuda.reset_peak_memory_stats(device)
        steps = 5 if quick else 15
        t = time.perf_counter()
        for _ in range(steps):
            step(images, targets)
        ms = (time.perf_counter() - t) / steps * 1e3
        base = base or ms
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        label = f"yolov3 {imgsz} b{batch} amp={amp or 'off'} ckpt={'on' if ckpt else 'off'} cl={'on' if cl else 'off'}"
        row("train", label, f"{ms:7.1f} ms/step {batch / ms * 1e3:6.0f} img/s {base / ms:4.2f}x  peak {peak:5.2f} GiB")
        del step
        torch.cuda.empty_cache()


# --- the trainer's own optimizer step on synthetic batches ------------------------------------------------------

class _Report:
    """What fastfeed.train.step reports to, kept here instead (report.py needs tqdm; this file only torch)."""

    def __init__(self):
        self.ooms, self.steps = [], 0

    def add_time(self, **seconds):
        pass

    def add_step(self, losses, batches, images, util):
        self.steps += 1

    def warn(self, message, event):
        print(f"  {message}", flush=True)
        self.ooms.append(event)

    def record(self, event):
        pass


def trainer_run(device, batch: int, micro: int, imgsz: int, channels_last: bool = False):
    """A fastfeed.train.setup.Run around YOLOv3, as set_up builds it, for optimizer_step."""
    from fastfeed.devices import to_channels_last
    from fastfeed.train import distributed
    from fastfeed.train.config import TrainConfig
    from fastfeed.train.device import grad_scaler
    from fastfeed.train.loss import YoloLoss
    from fastfeed.train.model import build_model
    from fastfeed.train.oom import BufferSnapshot, MicroBatches
    from fastfeed.train.optim import build_optimizer
    from fastfeed.train.setup import Run
    from fastfeed.train.step import DeviceClock

    cfg = TrainConfig(data="synthetic", model="yolov3", imgsz=imgsz, batch=batch, accum=1, amp="bf16",
                      channels_last=channels_last, warmup_epochs=0)
    model = build_model("yolov3", 80).to(device)
    if channels_last:
        model = to_channels_last(model, device)
    run = Run(cfg, device, distributed.Dist(), REPO, None, None, model=model, raw_model=model,
              loss_fn=YoloLoss(model, imgsz), optimizer=build_optimizer(model, "sgd", 0.01, 0.937, 5e-4),
              scaler=grad_scaler(device, "bf16"), micro=MicroBatches(batch, micro), accum=1, total_steps=100,
              snapshot=BufferSnapshot(model), clock=DeviceClock(device), report=_Report(),
              loader=SimpleNamespace(on_device=False))
    model.train()
    return run


def steps(run, n: int, batch) -> float:
    from fastfeed.train.step import optimizer_step

    t = time.perf_counter()
    for _ in range(n):
        optimizer_step(run, iter([batch]), 1)
    torch.cuda.synchronize(run.device)
    return time.perf_counter() - t


def oom_replay(device: torch.device, quick: bool, end: float) -> None:
    imgsz, batch = (320, 16) if quick else (640, 32)
    data = synthetic(batch, imgsz, device)
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.reset_peak_memory_stats(device)
    run = trainer_run(device, batch, batch // 2, imgsz)
    steps(run, 1, data)
    half_peak = torch.cuda.max_memory_allocated(device)
    del run
    torch.cuda.empty_cache()
    cap = 1.25 * half_peak
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    torch.cuda.reset_peak_memory_stats(device)
    run = trainer_run(device, batch, batch, imgsz)
    took = steps(run, 3, data)
    sizes = [e["micro_batch"] for e in run.report.ooms]
    row("train", f"oom replay: micro-batch {batch} at {imgsz}, bf16",
        f"cap {cap / 2**30:.1f} GiB (1.25x the peak at {batch // 2}): replays -> {sizes or 'none'}, "
        f"{run.report.steps} steps in {took:.1f} s, peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")
    if not sizes or run.report.steps != 3:
        FAILURES.append(f"train oom_replay: expected a replay at a smaller micro-batch and 3 steps, got {sizes}, "
                        f"{run.report.steps} steps")


def batch_auto(device: torch.device, quick: bool, end: float) -> None:
    from fastfeed.train.oom import AUTO_MARGIN, auto_batch

    imgsz, share = (320, 0.05) if quick else (640, 0.2)
    torch.cuda.set_per_process_memory_fraction(share, device)
    cap = share * torch.cuda.get_device_properties(device).total_memory
    run = trainer_run(device, 1, 1, imgsz, channels_last=True)
    params = sum(p.numel() * p.element_size() for p in run.raw_model.parameters())
    t = time.perf_counter()
    b, pts = auto_batch(run.raw_model, run.loss_fn, device, imgsz, amp="bf16", channels_last=True, limit=512,
                        state_bytes=2 * params)
    took = time.perf_counter() - t
    del run
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    run = trainer_run(device, b, b, imgsz, channels_last=True)
    steps(run, 2, synthetic(b, imgsz, device))
    peak = torch.cuda.max_memory_reserved(device)
    row("train", f"--batch auto at {imgsz}, bf16, channels-last",
        f"cap {cap / 2**30:.1f} GiB: batch {b} in {took:.1f} s ({len(pts)} probes); 2 steps at {b}: "
        f"{len(run.report.ooms)} OOM, peak reserved {peak / cap:.0%} of the cap (aim {AUTO_MARGIN:.0%})")
    if run.report.ooms:
        FAILURES.append(f"train batch_auto: the batch it chose ({b}) ran out of memory")


def gpu_tests(device: torch.device, quick: bool, end: float) -> None:
    deps = ("pytest", "lmdb", "cv2", "simplejpeg", "pycocotools", "tqdm", "yaml")
    missing = [d for d in deps if importlib.util.find_spec(d) is None]
    if missing:
        row("train", "pytest -m gpu tests/test_train_*.py", f"skipped: {', '.join(missing)} not installed")
        return
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_train_loop.py",
           "tests/test_train_options.py"]
    try:
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=max(10.0, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        FAILURES.append("train gpu tests: out of the section's time")
        row("train", "pytest -m gpu tests/test_train_*.py", "TIMEOUT")
        return
    print(p.stdout[-3000:], p.stderr[-1500:], sep="\n")
    last = (p.stdout.strip().splitlines() or ["(no output)"])[-1]
    if p.returncode not in (0, 5):
        FAILURES.append(f"train gpu tests: {last}")
    row("train", "pytest -m gpu tests/test_train_*.py", last.strip("= "))
