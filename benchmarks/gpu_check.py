"""GPU checks for a bare GPU machine (PyTorch and little else): the prefetcher, DALI, the trainer, the device loader.

    bash benchmarks/gpu_check.sh                 # from the repository root; prints a table last

1. tests: the `gpu` tests of tests/test_prefetch.py, through pytest when it and the test suite's
   imports are there, else called one by one here (they need only torch);
2. h2d: host-to-device bandwidth of one [16,3,640,640] batch, uint8 vs float32, pinned vs pageable,
   and the cpu loader's kind of memory (shared, page-locked in place with cudaHostRegister);
3. overlap: step time at a fixed synthetic compute load (a matmul loop), fed by a synthetic loader of
   pinned uint8 batches with a small CPU cost, without and with the DevicePrefetcher;
4. augment: what DeviceAugment costs per batch on the device;
5. dali: DALI `mixed` decode and the dali loader on the GPU (benchmarks/gpu_check_dali.py), when DALI is installed.
6. train: the bundled YOLOv3's training step at 640 (ms, images/s, peak memory) with and without AMP,
   channels-last and activation checkpointing; the trainer's out-of-memory replay under a memory cap,
   --batch auto, and the trainer's `gpu` tests (gpu_check_train.py; <= 120 s; runs before the dali section);
7. device: the `device` loader (decode and augment on the GPU) at 640, batch 64, from JPEG and from
   the VRAM cache, against the cpu loader with every core: images/s and host CPU per image.
8. ultra: yolov8n at 640 in Ultralytics' own trainer for a fixed number of batches, fed by Ultralytics'
   loader and by FastfeedTrainer's cpu, shm and device loaders: images/s and the share of time waiting for
   data (gpu_check_ultralytics.py; each in its own process; skipped without Ultralytics; not yet run on a GPU).

Sections live in gpu_check_prefetch.py (1-4), gpu_check_dali.py (5, its own process: DALI may be
missing), gpu_check_train.py (6), gpu_check_device.py (7) and gpu_check_ultralytics.py (8); gpu_common.py holds the table. A new section is a function that
adds rows, called through `section(...)` in main().

Exit status: 0 when everything that ran passed, 1 on a failed test or a section that raised,
2 when there is no CUDA device (unless --allow-cpu, a smoke run of the script itself on a CPU).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_check_device import device_section  # noqa: E402
from gpu_check_prefetch import augment_cost, bandwidth, overlap, run_tests  # noqa: E402
from gpu_check_train import train_step  # noqa: E402
from gpu_check_ultralytics import SECTION_S, ultralytics_section  # noqa: E402
from gpu_common import FAILURES, ROWS, row, section  # noqa: E402

# --- 5. DALI `mixed` decode --------------------------------------------------------------------------------
# benchmarks/gpu_check_dali.py does the work (it imports DALI, which a bare GPU machine may not have: it then
# says so and exits 0). Run as a child so a DALI crash or hang cannot take this script's table with it.

def dali_mixed(device: torch.device, quick: bool, seconds: float) -> None:
    if device.type != "cuda":
        row("dali", "mixed decode", "skipped: no CUDA device")
        return

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
    section("device", device_section, device, args.quick, deadline=deadline)
    section("ultra", ultralytics_section, device, args.quick, min(SECTION_S, max(30.0, deadline - time.monotonic() - 40)),
            deadline=deadline)
    section("dali", dali_mixed, device, args.quick, max(30.0, deadline - time.monotonic() - 5), deadline=deadline)
    threads = [t.name for t in threading.enumerate() if t.name == "fastfeed-device-prefetch"]
    if threads:
        FAILURES.append(f"{len(threads)} device prefetch thread(s) still running")

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
