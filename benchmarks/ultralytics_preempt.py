"""What preemption costs inside Ultralytics' trainer (FastfeedTrainer): a periodic mid-epoch save per save, and
the time from a SIGTERM to the process's exit.

    .venv-ultralytics/bin/python benchmarks/ultralytics_preempt.py [--models yolov8n yolov8s] [--imgsz 640]
                                                                   [--batch 4] [--rounds 5] [--skip save exit]

- save: one FastfeedTrainer run per model (`<model>.yaml` from scratch on the bundled sample, --imgsz,
  --batch, this machine's device); after its first optimizer step, in a callback, --rounds mid-epoch saves
  exactly as FASTFEED_SAVE_EVERY_MIN makes them (Ultralytics' save_model captured, the loader's position added,
  written atomically with fsync into the run's weights folder), then Ultralytics' own epoch-end save_model
  (now atomic too) for comparison. Figures: MB and seconds per save (median).
- exit: the same training in a child process, SIGTERM at a random moment after its second batch; seconds from
  the signal to the process gone (median over --rounds), and how long a batch took there.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, machine  # noqa: E402
from ultralytics_ab import make_coco128  # noqa: E402

sys.path.insert(0, str(REPO))


class _Done(Exception):
    pass


def save_cost(model_name: str, data: Path, project: Path, imgsz: int, batch: int, rounds: int) -> dict:
    from ultralytics import YOLO

    from fastfeed.integrations.ultralytics import FastfeedTrainer

    got = {}

    def after_first_step(trainer):
        mid, end = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            trainer._ff_save("timer")
            mid.append(time.perf_counter() - t)
        size = trainer.last.stat().st_size
        for _ in range(rounds):
            t = time.perf_counter()
            trainer.save_model()
            end.append(time.perf_counter() - t)
        got.update(mb=size / 2**20, mid_s=statistics.median(mid), epoch_end_s=statistics.median(end))
        raise _Done

    model = YOLO(f"{model_name}.yaml")
    model.add_callback("on_train_batch_end", after_first_step)
    try:
        model.train(data=str(data), trainer=FastfeedTrainer, epochs=1, imgsz=imgsz, batch=batch, nbs=batch,
                    workers=0, plots=False, val=False, project=str(project), name=f"save-{model_name}",
                    exist_ok=True, verbose=False)
    except _Done:
        pass
    return {"model": model_name, **got}


_CHILD = """
import sys, time
from ultralytics import YOLO
from fastfeed.integrations.ultralytics import FastfeedTrainer
model = YOLO(sys.argv[1] + ".yaml")
model.add_callback("on_train_batch_end", lambda t: print(f"BATCH {time.monotonic()}", flush=True))
model.train(data=sys.argv[2], trainer=FastfeedTrainer, epochs=3, imgsz=int(sys.argv[3]), batch=int(sys.argv[4]),
            nbs=int(sys.argv[4]), workers=0, plots=False, val=False, project=sys.argv[5], name="exit", exist_ok=True,
            verbose=False)
"""


def signal_to_exit(model_name: str, data: Path, project: Path, imgsz: int, batch: int, rounds: int) -> dict:
    took, step = [], []
    for _ in range(rounds):
        cmd = [sys.executable, "-c", _CHILD, model_name, str(data), str(imgsz), str(batch), str(project)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                             env=os.environ | {"PYTHONPATH": str(REPO)})
        marks = []
        while len(marks) < 2:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"the run ended ({p.wait()}) before two batches")
            if "BATCH " in line:   # Ultralytics' progress bar may precede it on the line
                marks.append(float(line.split("BATCH ")[1].split()[0]))
        step_s = marks[1] - marks[0]
        time.sleep(random.uniform(0, step_s))
        t = time.monotonic()
        os.killpg(p.pid, signal.SIGTERM)
        p.communicate(timeout=600)
        took.append(time.monotonic() - t)
        step.append(step_s)
        if p.returncode != 75:
            raise RuntimeError(f"exit {p.returncode}, not 75")
    return {"model": model_name, "step_s": statistics.median(step), "to_exit_s": statistics.median(took),
            "max_s": max(took)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["yolov8n", "yolov8s"])
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip", nargs="*", default=[], choices=["save", "exit"])
    args = ap.parse_args(argv)
    os.environ.setdefault("YOLO_OFFLINE", "1")
    print(machine(), flush=True)
    import fastfeed

    with tempfile.TemporaryDirectory(dir=REPO / "build" if (REPO / "build").is_dir() else None) as tmp:
        tmp = Path(tmp)
        os.environ["YOLO_CONFIG_DIR"] = str(tmp / "yolo-config")
        data = make_coco128(fastfeed.sample_path(), tmp / "data", 16)
        if "save" not in args.skip:
            print(f"\nsave per checkpoint at {args.imgsz}, batch {args.batch} (into {tmp}, fsync; median of {args.rounds}):")
            for m in args.models:
                r = save_cost(m, data, tmp / "runs", args.imgsz, args.batch, args.rounds)
                print(f"  {m:8} {r['mb']:6.1f} MB  mid-epoch (FASTFEED_SAVE_EVERY_MIN) {r['mid_s']:5.2f} s, "
                      f"epoch-end save_model {r['epoch_end_s']:5.2f} s", flush=True)
        if "exit" not in args.skip:
            print(f"\nSIGTERM to exit (FastfeedTrainer, cpu loader, imgsz {args.imgsz}, batch {args.batch}; median of "
                  f"{args.rounds}):")
            for m in args.models:
                r = signal_to_exit(m, data, tmp / "runs", args.imgsz, args.batch, args.rounds)
                print(f"  {m:8} batch {r['step_s']:5.2f} s; signal -> process gone {r['to_exit_s']:5.2f} s "
                      f"(worst {r['max_s']:.2f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
