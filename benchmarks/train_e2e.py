"""End to end: the bundled YOLOv3 training step fed by Ultralytics' training dataloader, and by each
fastfeed loader through the DevicePrefetcher. Same images, same step, same cores, one run.

    python benchmarks/train_e2e.py --step-ms 40                  # CPU: a sleep stands in for the accelerator
    python benchmarks/train_e2e.py --device cuda --model yolov3 --imgsz 640 --batch 16 --amp bf16   # GPU, real step

Contenders, each in a fresh process, alternating for --rounds rounds:
  ultralytics       its own build_yolo_dataset + build_dataloader (mosaic, as its trainer builds them), run in
                    .venv-ultralytics (created by benchmarks/vs_ultralytics.py); each batch goes to the device as
                    Ultralytics' trainer does it: `batch["img"].to(device, non_blocking=True).float() / 255` on
                    the default stream. The adapter builds fastfeed's [M,6] targets from `batch_idx`, `cls` and
                    `bboxes` (normalised cx, cy, w, h); `img` is already RGB (its Format flips BGR->RGB, bgr=0.0).
  ultralytics-uint8 (with --step-ms only) the same loader, its uint8 batches handed to the sleep as they come:
                    no copy, no conversion. On a CPU machine the preprocess above is real host work on the
                    cores the workers need; on a GPU it runs on the device. This row is the loader alone.
  fastfeed LOADER   create_loader(LOADER, store, LoaderConfig(...)) + DevicePrefetcher(loader, device).
The step is the same on both sides: `fastfeed.train.bench.bench_step` (forward, loss, backward, SGD step,
synchronised; only torch is imported, so it also runs in the Ultralytics venv) or, with --step-ms, a sleep
of that length (on a CPU machine a real YOLOv3 step takes seconds and would hide any loader).

Reported per contender: images/s over the timed steps (median over rounds), the fraction of wall time the
host spent blocked waiting for the next batch, and the speedup over Ultralytics. Then, unless
--no-memory: peak memory and step time of the real step with and without --amp and --grad-ckpt, each
configuration in a fresh process (CPU: peak RSS growth over the built model; CUDA: max_memory_allocated
growth), both including gradients and optimizer state, which do not change with --amp or --grad-ckpt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, default_source, machine, replicate_coco  # noqa: E402

ULTRA_VENV = REPO / ".venv-ultralytics"

# Runs in either venv. argv[1]: a JSON dict of settings; prints one "RESULT {...}" line.
RUNNER = textwrap.dedent("""
    import json, sys, time
    a = json.loads(sys.argv[1])
    sys.path.insert(0, a["repo"])
    import torch
    device = torch.device(a["device"])
    if a["step_ms"] is not None:
        def step(images, targets):
            time.sleep(a["step_ms"] / 1e3)
    else:
        from fastfeed.train.bench import bench_step
        step = bench_step(a["model"], device, a["imgsz"], a["batch"], amp=a["amp"], grad_ckpt=a["grad_ckpt"])

    if a["kind"].startswith("ultralytics"):
        from ultralytics.cfg import get_cfg
        from ultralytics.data.build import build_dataloader, build_yolo_dataset
        from ultralytics.utils import DEFAULT_CFG
        cfg = get_cfg(DEFAULT_CFG, overrides={"imgsz": a["imgsz"], "batch": a["batch"], "workers": a["workers"],
                                              "cache": False})
        data = {"names": {i: str(i) for i in range(80)}, "nc": 80, "channels": 3}
        ds = build_yolo_dataset(cfg, a["images"], a["batch"], data, mode="train")
        dl = build_dataloader(ds, batch=a["batch"], workers=a["workers"], shuffle=True, rank=-1,
                              pin_memory=device.type == "cuda", device=a["device"])

        def batches():
            while True:
                for b in dl:
                    # The adapter: Ultralytics' batch dict -> fastfeed's [M,6] img_idx, cls, cx, cy, w, h.
                    t = torch.cat((b["batch_idx"].view(-1, 1).float(), b["cls"].view(-1, 1).float(),
                                   b["bboxes"].float()), 1)
                    if a["kind"] == "ultralytics-uint8":   # the loader alone: no copy, no conversion
                        yield b["img"], t
                    else:   # Ultralytics' trainer preprocess: copy and convert on the default stream
                        yield b["img"].to(device, non_blocking=True).float() / 255, t.to(device, non_blocking=True)
    else:
        from fastfeed import Store
        from fastfeed.loaders import LoaderConfig, create_loader
        from fastfeed.prefetch import DevicePrefetcher
        loader = create_loader(a["kind"], Store(a["store"]), LoaderConfig(imgsz=a["imgsz"], batch_size=a["batch"],
                                                                          workers=a["workers"]))
        feed = DevicePrefetcher(loader, device)

        def batches():
            epoch = 0
            while True:
                feed.set_epoch(epoch)
                epoch += 1
                yield from feed

    it = batches()
    for _ in range(max(a["warmup"], 1)):
        x, t = next(it)
        step(x, t)
    assert t.shape[1] == 6 and (x.dtype == torch.uint8 or float(x.max()) <= 1.0), (x.dtype, t.shape)
    wait, n = 0.0, 0
    t0 = time.perf_counter()
    for _ in range(a["steps"]):
        s = time.perf_counter()
        x, t = next(it)
        wait += time.perf_counter() - s
        step(x, t)
        n += len(x)
    wall = time.perf_counter() - t0
    print("RESULT " + json.dumps({"images_s": n / wall, "wait_frac": wait / wall, "step_ms": 1e3 * wall / a["steps"],
                                  "shape": list(x.shape), "targets": int(t.shape[0])}), flush=True)
    it.close()
    if not a["kind"].startswith("ultralytics"):
        feed.close()
        loader.close()
""")

# Runs in this venv: the real step's peak memory and time for one (amp, grad_ckpt) configuration.
MEMORY = textwrap.dedent("""
    import json, resource, statistics, sys, time
    a = json.loads(sys.argv[1])
    import psutil, torch
    from fastfeed.train.bench import bench_step
    device = torch.device(a["device"])
    step = bench_step(a["model"], device, a["imgsz"], a["batch"], amp=a["amp"], grad_ckpt=a["grad_ckpt"])
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (a["batch"], 3, a["imgsz"], a["imgsz"]), dtype=torch.uint8, generator=g)
    n = 8 * a["batch"]
    xy, wh = torch.rand(n, 2, generator=g) * 0.6 + 0.2, torch.rand(n, 2, generator=g) * 0.3 + 0.02
    targets = torch.cat((torch.arange(n).remainder(a["batch"]).view(-1, 1).float(),
                         torch.randint(0, 80, (n, 1), generator=g).float(), xy, wh), 1)
    images, targets = images.to(device), targets.to(device)
    # Peak growth from here, the first step included: activations, gradients and optimizer state. (On
    # the CPU freed memory stays in the process, so a later step's peak would not show over the first's.)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = psutil.Process().memory_info().rss
    step(images, targets)
    times = []
    for _ in range(a["steps"]):
        t0 = time.perf_counter()
        step(images, targets)
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base   # Linux: KiB
    print("RESULT " + json.dumps({"step_ms": 1e3 * statistics.median(times), "peak_mb": peak / 2**20}))
""")


def run(cmd: list[str], cwd: Path, timeout: float = 900) -> dict:
    """Run a contender in its own session: on a timeout its loader workers are killed with it."""
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise RuntimeError(f"timed out after {timeout:.0f} s") from None
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({p.returncode}):\n{stdout[-1500:]}\n{stderr[-2500:]}")
    return json.loads(lines[-1][7:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=512, help="coco128 (or the sample) replicated to this many files")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", default="yolov3", choices=("yolov3", "yolov3-tiny"))
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--amp", choices=("bf16", "fp16"), help="mixed precision for the real step")
    ap.add_argument("--grad-ckpt", action="store_true", help="activation checkpointing in the real step")
    ap.add_argument("--step-ms", type=float, help="a sleep of MS stands in for the step (what to use on a CPU)")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per contender and round")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--loader", action="append", help="fastfeed loaders (default: every registered one)")
    ap.add_argument("--no-ultralytics", action="store_true", help="skip the Ultralytics contender")
    ap.add_argument("--no-memory", action="store_true", help="skip the AMP / grad-ckpt memory table")
    ap.add_argument("--mem-model", default="yolov3", choices=("yolov3", "yolov3-tiny"))
    ap.add_argument("--mem-imgsz", type=int, help="size for the memory table (default: --imgsz)")
    ap.add_argument("--mem-batch", type=int, help="batch for the memory table (default: --batch)")
    ap.add_argument("--mem-steps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.step_ms is None and args.device == "cpu":
        print("note: a real YOLOv3 step on the CPU takes seconds; every loader keeps up with it. Use --step-ms to "
              "stand in for an accelerator.", flush=True)
    from fastfeed.loaders import list_loaders

    loaders = args.loader or list_loaders()
    res = {"machine": machine(), "config": vars(args) | {"json": None, "loader": loaders}, "rounds": [], "errors": {}}
    with tempfile.TemporaryDirectory(prefix="ffe2e-") as tmp:
        tmp = Path(tmp)
        data = replicate_coco(default_source(), tmp / "data", args.images)
        store = tmp / "data.ff"
        subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(data), "--format", "coco", "-o", str(store), "--quiet"],
                       check=True, capture_output=True)
        (tmp / "runner.py").write_text(RUNNER)
        common = {"repo": str(REPO), "device": args.device, "model": args.model, "imgsz": args.imgsz,
                  "batch": args.batch, "workers": args.workers, "amp": args.amp, "grad_ckpt": args.grad_ckpt,
                  "step_ms": args.step_ms, "steps": args.steps, "warmup": args.warmup,
                  "images": str(data / "images" / "train2017"), "store": str(store)}
        ultra = ["ultralytics"] + (["ultralytics-uint8"] if args.step_ms is not None else [])
        contenders = ([] if args.no_ultralytics else ultra) + loaders
        for r in range(args.rounds):
            rnd = {}
            for name in contenders:
                if name in res["errors"]:
                    continue
                py = ULTRA_VENV / "bin" / "python" if name.startswith("ultralytics") else Path(sys.executable)
                if not py.exists():
                    res["errors"][name] = f"{py} missing: run benchmarks/vs_ultralytics.py once to create it"
                    continue
                try:
                    rnd[name] = run([str(py), str(tmp / "runner.py"), json.dumps(common | {"kind": name})], tmp)
                except RuntimeError as e:
                    res["errors"][name] = str(e).strip().splitlines()[-1][:300]
            res["rounds"].append(rnd)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v['images_s']:.0f} img/s (wait {v['wait_frac']:.0%})"
                                                 for k, v in rnd.items()), flush=True)

        if not args.no_memory:
            (tmp / "memory.py").write_text(MEMORY)
            mem = {"model": args.mem_model, "imgsz": args.mem_imgsz or args.imgsz, "device": args.device,
                   "batch": args.mem_batch or args.batch, "steps": args.mem_steps}
            amp = args.amp or "bf16"
            res["memory"] = []
            for use_amp in (None, amp):
                for ckpt in (False, True):
                    row = run([sys.executable, str(tmp / "memory.py"), json.dumps(mem | {"amp": use_amp,
                                                                                          "grad_ckpt": ckpt})], tmp)
                    res["memory"].append({"amp": use_amp, "grad_ckpt": ckpt, **row})

    ran = [k for k in (["ultralytics", "ultralytics-uint8"] + loaders) if res["rounds"] and k in res["rounds"][0]]
    med = {k: {f: statistics.median(rnd[k][f] for rnd in res["rounds"] if k in rnd)
               for f in ("images_s", "wait_frac", "step_ms")} for k in ran}
    res["median"] = med
    step = f"a {args.step_ms:g} ms sleep" if args.step_ms is not None else (
        f"{args.model} real step{' amp ' + args.amp if args.amp else ''}{' grad-ckpt' if args.grad_ckpt else ''}")
    print(f"\n{args.images} images, imgsz {args.imgsz}, batch {args.batch}, {args.workers} workers, mosaic on, "
          f"{args.device}, step = {step}; {args.steps} timed steps, median of {args.rounds} round(s)")
    if args.step_ms:
        print(f"  {'step alone (ceiling)':24} {1e3 * args.batch / args.step_ms:7.0f} images/s")
    base = med.get("ultralytics", {}).get("images_s")
    alone = med.get("ultralytics-uint8", {}).get("images_s")
    labels = {"ultralytics": "ultralytics + its preprocess", "ultralytics-uint8": "ultralytics loader alone"}
    for k, v in med.items():
        ratio = ""
        if base and not k.startswith("ultralytics"):
            ratio = f"  {v['images_s'] / base:.2f}x" + (f" ({v['images_s'] / alone:.2f}x the loader alone)" if alone else "")
        print(f"  {labels.get(k, f'fastfeed {k} + prefetcher'):30} {v['images_s']:7.1f} images/s  "
              f"{v['wait_frac']:6.1%} waiting for data  {v['step_ms']:7.1f} ms/step{ratio}")
    for k, e in res["errors"].items():
        print(f"  {k:30} not run: {e}")
    if res.get("memory"):
        m = res["memory"]
        print(f"\n{args.mem_model} real step at {args.mem_imgsz or args.imgsz}, batch {args.mem_batch or args.batch}, "
              f"{args.device} (median of {args.mem_steps} steps after one untimed; peak: growth over the built model,"
              f" i.e. activations + gradients + optimizer state)")
        for row in m:
            print(f"  amp {str(row['amp'] or 'off'):5} grad-ckpt {'on ' if row['grad_ckpt'] else 'off'}  "
                  f"{row['step_ms']:8.0f} ms/step  peak {row['peak_mb']:7.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
