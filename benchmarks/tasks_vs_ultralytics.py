"""Each task's loader against Ultralytics' own for that task (issue 28): segment, pose, obb, and detect as the
reference ratio, same images, same cores, one run.

    python benchmarks/tasks_vs_ultralytics.py [--images 1024] [--seconds 15] [--rounds 2] [--task segment ...]
                                              [--loader cpu --loader shm] [--ultra-cache none|ram]
                                              [--mask-rule centre|ultralytics] [--aug copy_paste=0.5 ...] [--json F]

Data: `task_sets.py`'s sets from coco128's real photos, replicated to --images real JPEG files: segment =
coco128's own polygons, obb = their minimum-area rectangles (derived), pose = the persons with 17 keypoints
derived from their outlines, detect = the boxes. Ultralytics reads the YOLO labels; fastfeed reads the
same labels packed with `fastfeed pack DATA.yaml --task TASK`.
Set-up, identical on both sides: imgsz 640, batch 16, 2 workers, training augmentation with mosaic,
masks at 1/4 (mask_ratio 4) in one overlap mask per image (overlap_mask), no image cache (or Ultralytics'
cache="ram" for the shm comparison), no Albumentations on either side, and `--aug KEY=VALUE` (repeatable; e.g.
copy_paste=0.5 copy_paste_mode=mixup) on both: a new augmentation's ratio is read against the ratio without it. Ultralytics runs `build_yolo_dataset` + `build_dataloader` as its
trainer does for the task (task=segment|pose|obb sets use_segments|use_keypoints|use_obb) in its own venv
(`.venv-ultralytics`); fastfeed runs in this one. Per round, per task, the contenders run one after the
other, each in a fresh process, each --seconds after --warmup batches; the medians over --rounds are compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_source, machine  # noqa: E402
from task_sets import TASKS, make_task_set  # noqa: E402
from vs_ultralytics import aug_json, ensure_ultralytics_venv, run  # noqa: E402

# What each task's batch must carry on each side, or the run measured something else.
ULTRA_KEYS = {"detect": [], "segment": ["masks"], "pose": ["keypoints"], "obb": []}
FF_EXTRAS = {"detect": [], "segment": ["masks"], "pose": ["keypoints"], "obb": ["rboxes"]}

ULTRA_RUNNER = textwrap.dedent("""
    import json, sys, time, yaml
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_dataloader, build_yolo_dataset
    from ultralytics.utils import DEFAULT_CFG
    data_yaml, task, imgsz, batch, workers, seconds, warmup, aug, cache = sys.argv[1:10]
    imgsz, batch, workers, seconds, warmup = int(imgsz), int(batch), int(workers), float(seconds), int(warmup)
    cache = False if cache == "none" else cache
    y = yaml.safe_load(open(data_yaml))
    data = {"names": y["names"], "nc": len(y["names"]), "channels": 3}
    data |= {k: y[k] for k in ("kpt_shape", "flip_idx") if k in y}
    cfg = get_cfg(DEFAULT_CFG, overrides={"task": task, "imgsz": imgsz, "batch": batch, "workers": workers,
                                          "cache": cache, "mask_ratio": 4, "overlap_mask": True,
                                          "augmentations": [], **json.loads(aug)})
    ds = build_yolo_dataset(cfg, y["path"] + "/" + y["train"], batch, data, mode="train")
    dl = build_dataloader(ds, batch=batch, workers=workers, shuffle=True, rank=-1, pin_memory=False, device="cpu")
    t0 = time.perf_counter(); n = 0; marks = []; first = None
    while not marks or marks[-1][0] - t0 < seconds:
        for b in dl:
            now = time.perf_counter()
            first = now - t0 if first is None else first
            n += len(b["img"]); marks.append((now, n))
            if now - t0 >= seconds:
                break
    (ta, na), (tb, nb) = marks[min(warmup, len(marks) - 2)], marks[-1]
    shapes = {k: list(v.shape) for k, v in b.items() if hasattr(v, "shape")}
    print("RESULT " + json.dumps({"images_s": (nb - na) / (tb - ta), "first_batch_s": first, "shapes": shapes}))
""")

FF_RUNNER = textwrap.dedent("""
    import json, sys, time
    from fastfeed import Store
    from fastfeed.augment import AugmentHyp
    from fastfeed.loaders import LoaderConfig, create_loader
    path, name, imgsz, batch, workers, seconds, warmup, aug, rule = sys.argv[1:10]
    imgsz, batch, workers, seconds, warmup = int(imgsz), int(batch), int(workers), float(seconds), int(warmup)
    cfg = LoaderConfig(imgsz=imgsz, batch_size=batch, workers=workers, mask_ratio=4, overlap_mask=True,
                       mask_rule=rule, hyp=AugmentHyp(**json.loads(aug)))
    loader = create_loader(name, Store(path), cfg)
    t0 = time.perf_counter(); n = 0; marks = []; epoch = 0; first = None
    while not marks or marks[-1][0] - t0 < seconds:
        loader.set_epoch(epoch); epoch += 1
        for b in loader:
            now = time.perf_counter()
            first = now - t0 if first is None else first
            n += len(b.images); marks.append((now, n))
            if now - t0 >= seconds:
                break
    (ta, na), (tb, nb) = marks[min(warmup, len(marks) - 2)], marks[-1]
    shapes = {"images": list(b.images.shape), "targets": list(b.targets.shape)}
    shapes |= {k: list(v.shape) for k, v in b.extras().items()}
    print("RESULT " + json.dumps({"images_s": (nb - na) / (tb - ta), "first_batch_s": first, "shapes": shapes,
                                  "stages_ms": loader.stage_times().per_sample_ms()}))
    loader.close()
""")


def check_carries(task: str, side: str, r: dict) -> None:
    """Refuse a figure measured on batches without the task's geometry."""
    want = (ULTRA_KEYS if side == "ultralytics" else FF_EXTRAS)[task]
    if missing := [k for k in want if k not in r["shapes"]]:
        raise RuntimeError(f"{task}: {side}'s batches carry no {', '.join(missing)} (got {sorted(r['shapes'])}); "
                           "the figure would not be this task's")
    if task == "obb" and side == "ultralytics" and r["shapes"]["bboxes"][-1] != 5:
        raise RuntimeError(f"obb: Ultralytics' bboxes are {r['shapes']['bboxes']}, not rotated [M, 5]")


def table(res: dict, tasks: list[str], loaders: list[str], args) -> list[str]:
    med = res["median_images_s"]
    heads = ["task", "Ultralytics images/s"] + [f"fastfeed {n} images/s" for n in loaders] + \
            [f"{n} / Ultralytics" for n in loaders] + ["rounds (Ultralytics; " + ", ".join(loaders) + ")"]
    out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for t in tasks:
        base = med[t]["ultralytics"]
        per = "; ".join(", ".join(f"{rnd[t][k]['images_s']:.0f}" for rnd in res["rounds"])
                        for k in ["ultralytics", *loaders])
        out.append(f"| {t} | {base:.0f} | " + " | ".join(f"{med[t][n]:.0f}" for n in loaders) + " | " +
                   " | ".join(f"**{med[t][n] / base:.2f}x**" for n in loaders) + f" | {per} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=15.0, help="timed run per contender per task per round")
    ap.add_argument("--warmup", type=int, default=3, help="batches not counted")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--task", action="append", choices=TASKS, help="tasks to run (default: all four)")
    ap.add_argument("--loader", action="append", choices=("cpu", "shm"), help="fastfeed loaders (default: cpu)")
    ap.add_argument("--ultra-cache", default="none", choices=("none", "ram"),
                    help="Ultralytics' image cache for its side (the shm comparison uses ram)")
    ap.add_argument("--mask-rule", default="centre", choices=("centre", "ultralytics"),
                    help="fastfeed's masks: centre (exact, the loaders' default) or ultralytics (as Ultralytics draws "
                         "them; what FastfeedSegmentationTrainer uses)")
    ap.add_argument("--aug", action="append", metavar="KEY=VALUE", help="an augmentation on for both sides, e.g. "
                    "copy_paste=0.5 (repeatable; Ultralytics' argument and fastfeed's AugmentHyp field)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tasks = [t for t in TASKS if t in (args.task or TASKS)]
    loaders = args.loader or ["cpu"]
    ultra_py = ensure_ultralytics_venv()
    res = {"machine": machine(), "config": vars(args) | {"json": None, "task": tasks, "loader": loaders},
           "rounds": []}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ff-tasks-vs-ul-") as tmp:
        tmp = Path(tmp)
        sets = {}
        for t in tasks:
            data = make_task_set(t, tmp / t, default_source(), args.images)
            store = tmp / f"{t}.ff"
            subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(data), "--task", t, "-o", str(store),
                            "--quiet"], check=True, capture_output=True)
            sets[t] = (data, store)
        (tmp / "ultra.py").write_text(ULTRA_RUNNER)
        (tmp / "ff.py").write_text(FF_RUNNER)
        common = [str(args.imgsz), str(args.batch), str(args.workers), str(args.seconds), str(args.warmup),
                  aug_json(args.aug)]
        for r in range(args.rounds):
            rnd = {}
            for t in tasks:
                data, store = sets[t]
                rnd[t] = {"ultralytics": run([str(ultra_py), str(tmp / "ultra.py"), str(data), t, *common,
                                              args.ultra_cache], tmp)}
                check_carries(t, "ultralytics", rnd[t]["ultralytics"])
                for name in loaders:
                    rnd[t][name] = run([sys.executable, str(tmp / "ff.py"), str(store), name, *common,
                                        args.mask_rule], tmp)
                    check_carries(t, name, rnd[t][name])
                print(f"round {r + 1} {t:8s}: " + ", ".join(f"{k} {v['images_s']:.0f} img/s"
                                                          for k, v in rnd[t].items()), flush=True)
            res["rounds"].append(rnd)
    res["median_images_s"] = {t: {k: statistics.median(rnd[t][k]["images_s"] for rnd in res["rounds"])
                                  for k in ["ultralytics", *loaders]} for t in tasks}
    cache = "" if args.ultra_cache == "none" else f', Ultralytics cache="{args.ultra_cache}"'
    print(f"\n{args.images} images per task, imgsz {args.imgsz}, batch {args.batch}, {args.workers} workers, mosaic on, "
          f"mask_ratio 4, overlap_mask, fastfeed mask rule {args.mask_rule}{cache}"
          f"{''.join(f', {a}' for a in args.aug or [])}; median of {args.rounds} rounds of {args.seconds:g} s "
          f"({time.perf_counter() - t0:.0f} s in all)\n")
    res["table"] = table(res, tasks, loaders, args)
    print("\n".join(res["table"]))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
