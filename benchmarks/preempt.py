"""What preemption costs `fastfeed train`: a checkpoint write, the time from a SIGTERM to the process's exit,
and, under DDP, agreeing on the stop at every step.

    .venv/bin/python benchmarks/preempt.py [--models yolov3-tiny yolov3] [--imgsz 640] [--batch 4] [--rounds 3]
                                           [--skip save exit ddp]

- save: last.pt exactly as the trainer writes it (model, EMA, optimizer, scaler, RNG, counters: one real
  step trains, then `save_checkpoint` of that state is timed --rounds times into the run's folder, i.e.
  this machine's disk, fsync included). Figures: MB and seconds per save (median).
- exit: `fastfeed train` (bundled sample, cpu loader with one worker, mosaic) in a child process, SIGTERM
  to its process group at a random moment after its second logged step; from the signal to the exit, and
  the trainer's own split of it (the rest of the step in flight, the write). Median over --rounds.
- ddp: two gloo processes on this CPU: the all-reduce each micro-batch already does (box, obj, cls, OOM:
  4 floats) against the same with the stop flag (5 floats, what the trainer does), and a separate
  one-float all-reduce per step (what a trainer without a host-side loss all-reduce would pay, and what
  FastfeedTrainer pays). Median microseconds per call over 2,000 calls, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, machine  # noqa: E402

sys.path.insert(0, str(REPO))
import fastfeed  # noqa: E402
from fastfeed.pack import PackConfig, pack  # noqa: E402
from fastfeed.train import TrainConfig, load_checkpoint, train  # noqa: E402
from fastfeed.train.checkpoint import save_checkpoint  # noqa: E402


def save_cost(store: Path, tmp: Path, model: str, rounds: int) -> dict:
    out = tmp / f"save-{model}"
    train(TrainConfig(data=store, out=out, model=model, imgsz=64, batch=2, accum=1, workers=0, max_steps=1, epochs=1,
                      close_mosaic=0))
    state = {k: v for k, v in load_checkpoint(out / "last.pt").items() if k not in ("format", "version")}
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        save_checkpoint(out / "last.pt", state)
        times.append(time.perf_counter() - t)
    return {"model": model, "mb": (out / "last.pt").stat().st_size / 2**20, "seconds": statistics.median(times)}


def signal_to_exit(store: Path, tmp: Path, model: str, imgsz: int, batch: int, rounds: int) -> dict:
    took, inside, step = [], [], []
    for r in range(rounds):
        out = tmp / f"exit-{model}-{r}"
        cmd = [sys.executable, "-m", "fastfeed", "train", "--data", str(store), "--model", model, "--imgsz", str(imgsz),
               "--batch", str(batch), "--accum", "1", "--workers", "1", "--close-mosaic", "0", "--log-every", "1",
               "--out", str(out), "--quiet", "--json"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        metrics = out / "metrics.jsonl"
        while not metrics.is_file() or metrics.read_text().count('"loss"') < 2:
            if p.poll() is not None:
                raise RuntimeError(p.stderr.read()[-2000:])
            time.sleep(0.01)
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if '"loss"' in x]
        step_s = statistics.median((r["compute_ms"] + r["data_ms"]) / 1e3 for r in rows)
        time.sleep(random.uniform(0, step_s))   # somewhere inside a step
        t = time.monotonic()
        os.killpg(p.pid, signal.SIGTERM)
        o, e = p.communicate(timeout=600)
        took.append(time.monotonic() - t)
        if p.returncode != 75:
            raise RuntimeError(f"exit {p.returncode}: {e[-2000:]}")
        inside.append(json.loads(o[o.index("{"):])["stop_seconds"])
        step.append(step_s)
    return {"model": model, "imgsz": imgsz, "batch": batch, "step_s": statistics.median(step),
            "to_checkpoint_s": statistics.median(inside), "to_exit_s": statistics.median(took),
            "max_to_exit_s": max(took)}


def _ddp_rank(rank: int, port: int, calls: int, q) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ways = {"loss (4 floats)": torch.zeros(4), "loss + stop flag (5)": torch.zeros(5), "own all-reduce (1)": torch.zeros(1)}
    times = {k: [] for k in ways}
    for i in range(calls):
        for name, t in (ways.items() if i % 2 else reversed(ways.items())):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            float(t[0])
            times[name].append(time.perf_counter() - t0)
    if rank == 0:
        q.put({k: 1e6 * statistics.median(v) for k, v in times.items()})
    dist.destroy_process_group()


def agreement_cost(calls: int) -> dict:
    ctx = torch.multiprocessing.get_context("spawn")
    q = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_ddp_rank, args=(r, port, calls, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    res = q.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["yolov3-tiny", "yolov3"])
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", nargs="*", default=[], choices=["save", "exit", "ddp"])
    args = ap.parse_args(argv)
    print(machine(), flush=True)
    with tempfile.TemporaryDirectory(dir=REPO / "build" if (REPO / "build").is_dir() else None) as tmp:
        tmp = Path(tmp)
        store = tmp / "sample.ff"
        pack(PackConfig(src=fastfeed.sample_path(), out=store, progress=False))
        if "save" not in args.skip:
            print(f"\ncheckpoint write (last.pt as the trainer writes it, into {tmp}; median of {args.rounds}):")
            for m in args.models:
                r = save_cost(store, tmp, m, args.rounds)
                print(f"  {m:12} {r['mb']:7.1f} MB  {r['seconds']:6.2f} s per save ({r['mb'] / r['seconds']:.0f} MB/s)",
                      flush=True)
        if "exit" not in args.skip:
            print(f"\nSIGTERM to exit (fastfeed train at {args.imgsz}, batch {args.batch}, cpu loader, 1 worker; "
                  f"median of {args.rounds}):")
            for m in args.models:
                r = signal_to_exit(store, tmp, m, args.imgsz, args.batch, args.rounds)
                print(f"  {m:12} step {r['step_s']:6.2f} s; signal -> checkpoint written {r['to_checkpoint_s']:6.2f} s, "
                      f"-> process gone {r['to_exit_s']:6.2f} s (worst {r['max_to_exit_s']:.2f} s)", flush=True)
    if "ddp" not in args.skip:
        res = agreement_cost(2000)
        base = res["loss (4 floats)"]
        print("\nDDP stop agreement per step (2 gloo ranks on this CPU, median of 2,000 all-reduces):")
        for name, us in res.items():
            print(f"  {name:22} {us:7.1f} us  ({us / base:.2f}x the loss all-reduce)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
