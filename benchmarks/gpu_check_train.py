"""gpu_check section 6: the bundled model's training step on the GPU (see gpu_check.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from gpu_common import row

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
