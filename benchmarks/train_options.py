"""What each `fastfeed train` option costs or saves on this machine's CPU: step time and peak memory of
the real trainer (`fastfeed.train.train`) with the bundled YOLOv3.

    .venv/bin/python benchmarks/train_options.py [--model yolov3] [--imgsz 256] [--batch 4] [--steps 6] [--rounds 2]

Options measured against the plain run: --channels-last, --amp bf16, both, --multi-scale, --micro-batch
batch/2 (where an OOM replay leaves a run), --freeze-bn, --device-augment. Each run trains on the bundled
sample (mosaic on, the loader in the training process: workers 0, so the step is all this process does)
for --steps optimizer steps of one loader batch.

Each option trains in a fresh process of its own (the first run in a process pays one-off costs, ~25%
here, and a process that ran --channels-last on this CPU ran later options slower), one process per option
per round, the order rotated each round. The machine is shared, and other work only ever adds time: an
option's step time is its fastest step after the first (compute ms, metrics.jsonl; --multi-scale's scaled to
its mean size, see child()), the fastest over the rounds, and its ratio is to the plain run's figure. The
memory is the process's peak RSS (ru_maxrss: model, gradients, optimizer state, activations, the loader),
median over rounds, against the plain run's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, machine  # noqa: E402

OPTIONS = {"plain": {}, "--channels-last": {"channels_last": True}, "--amp bf16": {"amp": "bf16"},
           "--amp bf16 --channels-last": {"amp": "bf16", "channels_last": True}, "--multi-scale": {"multi_scale": True},
           "--micro-batch B/2": {"micro_batch": "half"}, "--freeze-bn": {"freeze_bn": True},
           "--device-augment": {"device_augment": True}}


def child(a: dict) -> None:
    """Train each option of a["names"] (in this process) and print one RESULT line."""
    sys.path.insert(0, str(REPO))
    import torch

    from fastfeed.train import TrainConfig, train
    from fastfeed.train.device import size_range, step_size

    torch.set_num_threads(int(a["threads"]))
    out = {}
    for name in a["names"]:
        kw = dict(OPTIONS[name])
        if kw.get("micro_batch") == "half":
            kw["micro_batch"] = max(1, a["batch"] // 2)
        run_dir = Path(a["tmp"]) / name.replace(" ", "_").replace("/", "_")
        res = train(TrainConfig(data=a["store"], model=a["model"], imgsz=a["imgsz"], batch=a["batch"], accum=1,
                                epochs=100, close_mosaic=0, workers=0, max_steps=a["steps"], log_every=1,
                                out=run_dir, **kw))
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "event" not in r][1:]   # the first step warms up
        # The fastest step: other work on a shared machine only ever adds time. --multi-scale's steps are at
        # their own sizes: each is scaled to --imgsz by pixels, then by E[size^2] / imgsz^2 over its range.
        scale = [1.0] * len(steps)
        if kw.get("multi_scale"):
            lo, hi = size_range(a["imgsz"], 32)
            mean_sq = statistics.fmean(s * s for s in range(lo, hi + 1, 32))
            scale = [mean_sq / step_size(0, r["step"] - 1, a["imgsz"], 32) ** 2 for r in steps]
        out[name] = {"compute_ms": min(r["compute_ms"] * f for r, f in zip(steps, scale)),
                     "data_ms": statistics.fmean(r["data_ms"] for r in steps),
                     "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                     "bottleneck": res.summary["bottleneck"]["bottleneck"]}
    print("RESULT " + json.dumps(out), flush=True)


def spawn(a: dict) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", json.dumps(a)], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": str(a["threads"])})
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode or line is None:
        raise SystemExit(f"child failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[7:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="yolov3")
    ap.add_argument("--imgsz", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    sys.path.insert(0, str(REPO))
    import fastfeed
    from fastfeed.pack import PackConfig, pack

    names = list(OPTIONS)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "sample.ff"
        pack(PackConfig(src=fastfeed.sample_path(), out=store, progress=False))
        base = dict(store=str(store), model=args.model, imgsz=args.imgsz, batch=args.batch, steps=args.steps,
                    threads=args.threads, tmp=tmp)
        print(f"{machine()}\n{args.model} imgsz {args.imgsz} batch {args.batch}, {args.steps} steps, "
              f"{args.threads} threads", flush=True)
        ms, peak, verdicts = ({n: [] for n in names} for _ in range(3))
        for r in range(args.rounds):
            k = r % len(names)
            for n in names[k:] + names[:k]:
                res = spawn(base | {"names": [n], "tmp": str(Path(tmp) / f"r{r}")})[n]
                ms[n].append(res["compute_ms"])
                peak[n].append(res["peak_rss_mb"])
                verdicts[n].append(res["bottleneck"])
                print(f"  round {r}: {n:28} {res['compute_ms']:7.0f} ms/step  peak RSS {res['peak_rss_mb']:5.0f} MiB  "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    print("\n| option | ms per step | vs plain | peak RSS | vs plain | verdict |")
    print("|---|---|---|---|---|---|")
    for n in names:
        p, p0 = statistics.median(peak[n]), statistics.median(peak["plain"])
        print(f"| {n} | {min(ms[n]):.0f} | {min(ms[n]) / min(ms['plain']):.2f}x | {p:.0f} MiB | "
              f"{p - p0:+.0f} MiB | {', '.join(sorted(set(verdicts[n])))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
