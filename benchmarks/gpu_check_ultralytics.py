"""gpu_check section `ultralytics`: yolov8n at 640 in Ultralytics' own trainer for a fixed number of batches,
fed by Ultralytics' loader and by FastfeedTrainer's cpu, shm and device loaders: images/s and the share of
the time spent waiting for data, each (see gpu_check.py).

Each contender trains in a process of its own (a crash or a hang costs its row only, and every loader starts
cold the same way): `yolov8n.yaml` from scratch on cuda:0, imgsz 640, batch 32 (--quick: 8), every core as
loader workers, bf16 autocast (amp='bf16': no AMP check, which downloads weights), mosaic on, mixup off (the
device loader has none), on the bundled 16 JPEGs cycled into 512 images (YOLO layout,
train = val). The first WARMUP batches are not timed; of the next BATCHES (--quick: fewer), callbacks at
on_train_batch_start / on_train_batch_end give images/s (images over the time from the first timed batch's
start to the last one's end) and the data wait (each gap from a batch's end to the next one's start: the
loader's time the step could not hide), as benchmarks/ultralytics_ab.py counts it; then the run stops (no
validation). fastfeed's store is packed once, before the first FastfeedTrainer run, and not timed.

Needs Ultralytics (`pip install 'fastfeed[ultralytics]'`) and fastfeed's loader dependencies: without them
the section says which is missing and skips. `--allow-cpu` runs it tiny on the CPU (a smoke test of this
file: the figures mean nothing). It has not run on a GPU yet.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTENDERS = ("ultralytics", "cpu", "shm", "device")
WARMUP, BATCHES, IMAGES = 10, 60, 512
SECTION_S = 150.0   # four runs of ~20 s each expected on an H200; a contender that would start later is skipped


class _Enough(Exception):
    """Raised from a callback once the timed batches are done: ends the run before validation."""


def run_one(contender: str, data: str, device: str, imgsz: int, batch: int, warmup: int, batches: int,
            workers: int, project: str) -> dict:
    """One contender's timed batches (in this process)."""
    os.environ["YOLO_OFFLINE"] = "1"
    from ultralytics import YOLO

    trainer = None
    if contender != "ultralytics":
        from fastfeed.integrations.ultralytics import FastfeedTrainer

        os.environ["FASTFEED_LOADER"] = contender
        trainer = FastfeedTrainer
    t = {"n": 0, "mark": None, "start": None, "end": None, "wait": 0.0, "images": 0}

    def batch_start(tr):
        now = time.perf_counter()
        t["n"] += 1
        if t["n"] == warmup + 1:
            t["start"] = now
        elif t["n"] > warmup + 1:
            t["wait"] += now - t["mark"]

    def batch_end(tr):
        if device != "cpu":
            import torch

            torch.cuda.synchronize()   # the step's work is done, not only queued
        t["mark"] = time.perf_counter()
        if t["n"] > warmup:
            t["images"] += int(tr.batch_size)
        if t["n"] == warmup + batches:
            t["end"] = t["mark"]
            raise _Enough

    model = YOLO("yolov8n.yaml")
    model.add_callback("on_train_batch_start", batch_start)
    model.add_callback("on_train_batch_end", batch_end)
    epochs = -(-(warmup + batches) * batch // IMAGES) + 1
    try:
        # amp='bf16' on the GPU: what an H200 trains in, and Ultralytics' fp16 AMP check would download weights
        model.train(data=data, trainer=trainer, epochs=epochs, imgsz=imgsz, batch=batch, device=device,
                    workers=workers, cache=False, plots=False, val=False, project=project, name=contender,
                    exist_ok=True, verbose=False, close_mosaic=0, mixup=0.0, amp="bf16" if device != "cpu" else False)
    except _Enough:
        pass
    if t["end"] is None:
        raise RuntimeError(f"{contender}: the run ended after {t['n']} batches, before {warmup + batches}")
    took = t["end"] - t["start"]
    return {"contender": contender, "images_s": t["images"] / took, "wait_share": t["wait"] / took,
            "batches": batches, "batch": batch, "seconds": took}


def missing(modules) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def ultralytics_section(device, quick: bool, seconds: float = SECTION_S) -> None:
    """The gpu_check section: one row per contender (on a CPU, from --allow-cpu: a tiny smoke run)."""
    from gpu_common import FAILURES, row

    gone = missing(["ultralytics", "torchvision", "cv2", "yaml", "psutil"])
    if gone:
        row("ultra", "yolov8n 640", f"skipped: {', '.join(gone)} not installed (pip install 'fastfeed[ultralytics]')")
        return
    no_store = missing(["lmdb", "simplejpeg", "tqdm"])   # what packing and fastfeed's loaders need besides
    cpu = device.type != "cuda"
    imgsz, batch = (64, 4) if cpu else (640, 8 if quick else 32)
    warmup, batches = (2, 4) if cpu else (5, 20) if quick else (WARMUP, BATCHES)
    end = time.monotonic() + seconds
    with tempfile.TemporaryDirectory(prefix="ff-gpu-ultra-") as tmp:
        tmp = Path(tmp)
        data = _data(tmp)
        env = os.environ | {"YOLO_CONFIG_DIR": str(tmp / "yolo-config"), "YOLO_OFFLINE": "1",
                            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        for c in CONTENDERS:
            left = end - time.monotonic()
            if left < 20:
                row("ultra", c, "skipped: out of time")
                continue
            if c != "ultralytics" and no_store:
                row("ultra", c, f"skipped: {', '.join(no_store)} not installed (fastfeed's store and loaders)")
                continue
            cmd = [sys.executable, __file__, "--run", c, str(data), "--device", "cpu" if cpu else "0",
                   "--imgsz", str(imgsz), "--batch", str(batch), "--warmup", str(warmup), "--batches", str(batches),
                   "--workers", str(os.cpu_count() or 1), "--project", str(tmp / "runs")]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=left)
            except subprocess.TimeoutExpired:
                FAILURES.append(f"ultralytics {c}: no answer within {left:.0f} s")
                row("ultra", c, f"timed out after {left:.0f} s")
                continue
            lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                FAILURES.append(f"ultralytics {c}: exit {out.returncode}: {out.stderr.strip()[-300:]}")
                row("ultra", c, f"failed (exit {out.returncode})")
                continue
            r = json.loads(lines[-1][7:])
            row("ultra", f"{c} (yolov8n {imgsz}, {batches} x {batch})",
                f"{r['images_s']:8.1f} images/s, waiting for data {100 * r['wait_share']:4.1f}%")


def _data(tmp: Path) -> Path:
    """The bundled sample cycled into IMAGES images, YOLO layout, and its data.yaml."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ultralytics_ab import make_coco128

    import fastfeed

    return make_coco128(fastfeed.sample_path(), tmp / "data", IMAGES)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", nargs=2, metavar=("CONTENDER", "DATA_YAML"))
    ap.add_argument("--device", default="0")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--batches", type=int, default=BATCHES)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--project", default=None)
    ap.add_argument("--allow-cpu", action="store_true", help="the section, tiny, on the CPU (a smoke test)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.run:
        c, data = args.run
        r = run_one(c, data, args.device, args.imgsz, args.batch, args.warmup, args.batches, args.workers,
                    args.project or tempfile.mkdtemp(prefix="ff-gpu-ultra-runs-"))
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_common import FAILURES, ROWS

    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
    elif args.allow_cpu:
        device = torch.device("cpu")
    else:
        print("gpu_check_ultralytics: no CUDA device (--allow-cpu: a smoke run on the CPU)")
        return 2
    ultralytics_section(device, args.quick)
    for sec, item, value in ROWS:
        print(f"{sec:<8} {item:<40} {value}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
