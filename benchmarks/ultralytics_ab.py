"""A/B inside Ultralytics' own trainer: its training dataloader against fastfeed's (`FastfeedTrainer`).

    python benchmarks/ultralytics_ab.py [--task detect|segment|pose|obb] [--data shapes|coco128] [--imgsz 160] [--epochs 30]
                                        [--batch 16] [--seeds 0 1] [--contender ultralytics --contender cpu ...] [--json F]
                                        [--weights PRETRAINED.pt] [--classes 0 ...] [--close-mosaic N] [--no-augment]
                                        [--set copy_paste=0.5 --set copy_paste_mode=mixup ...]

Everything but the train loader is the same: Ultralytics 8.4's DetectionTrainer, `yolov8n.yaml` from
scratch, data, epochs, batch, seed, device, and Ultralytics' own validation (the final mAP50 and
mAP50-95 are its numbers for best.pt). Contenders: `ultralytics` (its loader, cache=False), `cpu` and
`shm` (FastfeedTrainer with FASTFEED_LOADER=cpu|shm; cache=False, so the validation loader is set up
identically). Runs alternate seed by seed, each in a fresh process. Reported per run: training images/s
(images over the time inside the epochs' batch loops, validation excluded), the share of that time
spent waiting for the next batch (from `on_train_batch_end` to the next `on_train_batch_start`, and
from the epoch start to its first batch), and the final mAPs; the seeds show Ultralytics' own spread.

Data: a path (`--data DIR/data.yaml`) trains on that YOLO set as it is: e.g. `fetch_realseg.py`'s real
Roboflow segmentation export (one class, shoe soles; see that script for the source and licence). `shapes` (default) is a detection set a from-scratch model learns in minutes on a CPU: coco128
photos as backgrounds with 1-4 filled squares, discs and triangles of random colour and size (3
classes), 192 train and 64 held-out val images, JPEG. `coco128` is coco128 itself (train = val, as
Ultralytics' coco128.yaml): the realistic input, but a from-scratch model needs far more epochs than a
CPU allows to get off mAP 0, so use it on an accelerator (`--device 0 --imgsz 640`).

`--task segment` (issue 28): `yolov8n-seg.yaml` from scratch in Ultralytics' SegmentationTrainer, fed by its
loader or by FastfeedSegmentationTrainer; box and mask mAPs side by side. Its `shapes` is `task_sets.py`'s
shapes-seg (the same kind of set, non-overlapping shapes whose polygons are exactly the painted ones); its
`coco128` is coco128's own polygons (`task_sets.py --task segment`, train = val).

`--task pose`: `yolov8n-pose.yaml` in PoseTrainer (kpt_shape from data.yaml) or FastfeedPoseTrainer; box and
pose (keypoint OKS) mAPs. Its `shapes` is shapes-pose (triangles turned by up to +-30 degrees, their 3 corners
as keypoints, flip_idx [0, 2, 1]); its `coco128` is task_sets' DERIVED pose set (template keypoints on
coco128's persons: a plumbing check, not a benchmark of keypoints). `--task obb`: `yolov8n-obb.yaml` in
OBBTrainer or FastfeedOBBTrainer; mAPs of the rotated boxes (Ultralytics' metrics.box for OBB). Its `shapes`
is shapes-obb (rectangles and bars at any angle, labels their painted corners); its `coco128` is task_sets'
DERIVED OBB set (each outline's minimum-area rectangle).

A from-scratch model learns nothing from coco128 in the epochs a CPU allows, so a real-data A/B there is either
long runs on an accelerator or a fine-tune: `--weights` starts both contenders from one checkpoint of the task's
model (pretrained elsewhere), `--classes` narrows it to the classes a small set holds enough of. A CPU could not
make such a checkpoint here: yolov8n-seg, 60 epochs from scratch on coco128's persons at imgsz 160, reached box
mAP50 0.0005.

`--no-augment` trains both contenders on plain letterboxed images (mosaic, shift, zoom, flips and HSV off): the
samples are then the same on both sides up to resampling (fastfeed decodes JPEGs at a DCT scale; same geometry, boxes
and masks: tests/integrations/test_ultralytics_masks.py), only their order differs,
so a gap that stays is in the trainer's feed, and one that goes is in the augmentation's samples.

The runs use `.venv-ultralytics` (`make venv-ultralytics`), created on first use.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, default_source, machine, replicate_coco, write_painted_set  # noqa: E402
from task_sets import PAINTED, make_task_set  # noqa: E402

ULTRA_VENV = REPO / ".venv-ultralytics"
CONTENDERS = ("ultralytics", "cpu", "shm")
SHAPES = ("square", "disc", "triangle")
# task -> the model trained from scratch and fastfeed's trainer for it
TASK_RUNS = {"detect": ("yolov8n.yaml", "FastfeedTrainer"),
             "segment": ("yolov8n-seg.yaml", "FastfeedSegmentationTrainer"),
             "pose": ("yolov8n-pose.yaml", "FastfeedPoseTrainer"),
             "obb": ("yolov8n-obb.yaml", "FastfeedOBBTrainer")}
# task -> (Ultralytics' metrics attribute, our key prefix) of the mAPs reported beside the box ones
SECOND_MAPS = {"segment": ("seg", "mask"), "pose": ("pose", "pose")}
# --no-augment: every random augmentation of Ultralytics' defaults off (degrees, shear, mixup, ... are 0 already)
AUGMENT_OFF = {"mosaic": 0.0, "translate": 0.0, "scale": 0.0, "fliplr": 0.0, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0}


def ensure_ultralytics_venv() -> Path:
    if not (ULTRA_VENV / ".installed").exists():
        print(f"creating {ULTRA_VENV} (make venv-ultralytics) ...", flush=True)
        subprocess.run(["make", "venv-ultralytics"], cwd=REPO, check=True)
    return ULTRA_VENV / "bin" / "python"


# --- data ----------------------------------------------------------------------------------------

def _paint(img, rng) -> list[str]:
    """Paint 1-4 shapes on `img` (BGR, in place); their YOLO label lines."""
    import cv2
    import numpy as np

    h, w = img.shape[:2]
    lines = []
    for _ in range(int(rng.integers(1, 5))):
        cls = int(rng.integers(len(SHAPES)))
        side = int(rng.uniform(0.12, 0.4) * min(h, w))
        x1, y1 = int(rng.integers(0, w - side)), int(rng.integers(0, h - side))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if cls == 0:
            cv2.rectangle(img, (x1, y1), (x1 + side - 1, y1 + side - 1), colour, -1)
        elif cls == 1:
            cv2.circle(img, (x1 + side // 2, y1 + side // 2), side // 2, colour, -1)
        else:
            pts = np.array([[x1 + side // 2, y1], [x1, y1 + side - 1], [x1 + side - 1, y1 + side - 1]], np.int32)
            cv2.fillPoly(img, [pts], colour)
        lines.append(f"{cls} {(x1 + side / 2) / w:.6f} {(y1 + side / 2) / h:.6f} {side / w:.6f} {side / h:.6f}")
    return lines


def make_shapes(src: Path, dst: Path, n_train: int = 192, n_val: int = 64, seed: int = 0) -> Path:
    """Shapes on real photos (the source's train2017 images as backgrounds), YOLO layout + data.yaml."""
    backgrounds = sorted((src / "images" / "train2017").glob("*.jpg"))
    return write_painted_set(dst, backgrounds, _paint, list(SHAPES), n_train, n_val, seed)


def make_coco128(src: Path, dst: Path, n: int = 128) -> Path:
    """A YOLO layout of `n` images cycled from the COCO source, train = val, with its data.yaml."""
    replicate_coco(src, dst, n)
    cats = json.loads((src / "annotations" / "instances_train2017.json").read_text())["categories"]
    names = "".join(f"  {i}: {c['name']}\n" for i, c in enumerate(sorted(cats, key=lambda c: c["id"])))
    (dst / "data.yaml").write_text(f"path: {dst}\ntrain: images/train2017\nval: images/train2017\nnames:\n{names}")
    return dst / "data.yaml"


# --- one run, inside .venv-ultralytics -----------------------------------------------------------

def run_one(contender: str, data: str, seed: int, args) -> dict:
    os.environ["YOLO_OFFLINE"] = "1"
    from ultralytics import YOLO

    trainer = None
    model_yaml, trainer_name = TASK_RUNS[args.task]
    if contender != "ultralytics":
        import fastfeed.integrations.ultralytics as integration

        os.environ["FASTFEED_LOADER"] = contender
        trainer = getattr(integration, trainer_name)
    clock = {"mark": 0.0, "epoch_start": 0.0, "wait": 0.0, "train": 0.0, "images": 0, "batches": 0, "step": 0.0,
             "step_start": 0.0}

    def epoch_start(t):
        clock["mark"] = clock["epoch_start"] = time.perf_counter()

    def batch_start(t):
        clock["step_start"] = now = time.perf_counter()
        clock["wait"] += now - clock["mark"]
        clock["batches"] += 1

    def batch_end(t):
        clock["mark"] = now = time.perf_counter()
        clock["step"] += now - clock["step_start"]

    def epoch_end(t):
        clock["train"] += time.perf_counter() - clock["epoch_start"]
        clock["images"] += len(t.train_loader.sampler)

    model = YOLO(args.weights or model_yaml)
    for event, fn in (("on_train_epoch_start", epoch_start), ("on_train_batch_start", batch_start),
                      ("on_train_batch_end", batch_end), ("on_train_epoch_end", epoch_end)):
        model.add_callback(event, fn)
    t0 = time.perf_counter()
    metrics = model.train(data=data, trainer=trainer, epochs=args.epochs, imgsz=args.imgsz, batch=args.batch,
                          seed=seed, device=args.device, workers=args.workers, cache=False, plots=False, val=False,
                          project=args.project, name=f"{contender}-s{seed}", exist_ok=True, verbose=False,
                          **({"classes": args.classes} if args.classes else {}),
                          **({"close_mosaic": args.close_mosaic} if args.close_mosaic is not None else {}),
                          **(AUGMENT_OFF if args.no_augment else {}), **dict(map(_setting, args.set or [])))
    wall = time.perf_counter() - t0
    second = {}
    if args.task in SECOND_MAPS:
        attr, key = SECOND_MAPS[args.task]
        second = {f"{key}_map50": float(getattr(metrics, attr).map50), f"{key}_map": float(getattr(metrics, attr).map)}
    return second | {"contender": contender, "seed": seed, "map50": float(metrics.box.map50), "map": float(metrics.box.map),
            "images_s": clock["images"] / clock["train"], "wait_share": clock["wait"] / clock["train"],
            "wait_s": clock["wait"], "step_s": clock["step"], "train_s": clock["train"], "wall_s": wall, "batches": clock["batches"]}


def _setting(text: str) -> tuple[str, object]:
    """`--set KEY=VALUE` as Ultralytics' train() takes it: an int or a float when the value reads as one."""
    key, _, value = text.partition("=")
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


# --- driver --------------------------------------------------------------------------------------

def summarise(results: list[dict], contenders) -> list[str]:
    """Markdown rows per contender: medians (ranges) of box mAPs, and of mask or pose mAPs when the runs have them."""
    maps = [("map50", "mAP50"), ("map", "mAP50-95")]
    for key in (k for _, k in SECOND_MAPS.values() if results and f"{k}_map" in results[0]):
        maps = [("map50", "box mAP50"), ("map", "box mAP50-95"), (f"{key}_map50", f"{key} mAP50"),
                (f"{key}_map", f"{key} mAP50-95")]
    heads = ["loader", "images/s", "waiting for data", *(h for _, h in maps), "runs (seed: " + " / ".join(h for _, h in maps) + ")"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for c in contenders:
        rs = [r for r in results if r["contender"] == c]
        if not rs:
            continue
        med = {k: statistics.median(r[k] for r in rs) for k in ("images_s", "wait_share", *(k for k, _ in maps))}
        cells = [f"{med[k]:.3f} ({min(r[k] for r in rs):.3f}-{max(r[k] for r in rs):.3f})" for k, _ in maps]
        runs = ", ".join(f"{r['seed']}: " + " / ".join(f"{r[k]:.3f}" for k, _ in maps) for r in rs)
        lines.append(f"| {c} | {med['images_s']:.1f} | {100 * med['wait_share']:.1f}% | " + " | ".join(cells) + f" | {runs} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=tuple(TASK_RUNS), default="detect")
    ap.add_argument("--data", default="shapes",
                    help="shapes: painted shapes a scratch model learns on a CPU (segment, pose, obb: task_sets' "
                         "shapes-seg, shapes-pose, shapes-obb); coco128: real (segment: its polygons; pose, obb: "
                         "task_sets' sets DERIVED from them, see above); or the path of a YOLO data.yaml of the "
                         "task's labels (e.g. fetch_realseg.py's), used as it is")
    ap.add_argument("--imgsz", type=int, default=160)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="loader workers (Ultralytics sets 0 itself on a CPU)")
    ap.add_argument("--device", default="cpu", help="Ultralytics' device argument, e.g. 0 for the first GPU")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--contender", action="append", choices=CONTENDERS, help="default: all three")
    ap.add_argument("--weights", type=Path, help="start every run from this checkpoint of the task's model (a "
                    "fine-tune A/B: e.g. a model pretrained on the same data) instead of from scratch")
    ap.add_argument("--classes", type=int, nargs="+", help="train and validate on these classes only (Ultralytics' "
                    "classes=, honoured by fastfeed's trainers)")
    ap.add_argument("--close-mosaic", type=int, help="Ultralytics' close_mosaic (its default: the last 10 epochs)")
    ap.add_argument("--no-augment", action="store_true", help="mosaic, shift, zoom, flips and HSV off on both sides")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="a training argument for every contender "
                    "(repeatable), e.g. --set copy_paste=0.5: the recipe both loaders are asked to honour")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--run", nargs=3, metavar=("CONTENDER", "DATA_YAML", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--project", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.data not in ("shapes", "coco128") and not Path(args.data).is_file():
        ap.error(f"--data {args.data!r}: neither shapes, coco128 nor an existing data.yaml")
    if args.run:
        contender, data, seed = args.run
        print("RESULT " + json.dumps(run_one(contender, data, int(seed), args)), flush=True)
        return 0

    contenders = args.contender or list(CONTENDERS)
    py = ensure_ultralytics_venv()
    results = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ff-ulab-") as tmp:
        tmp = Path(tmp)
        src = default_source() if args.data in ("shapes", "coco128") else None   # a data.yaml needs no coco128
        if src is None:
            data = Path(args.data).resolve()
        elif args.task != "detect":
            painted = {"segment": "shapes-seg", "pose": "shapes-pose", "obb": "shapes-obb"}[args.task]
            data = (PAINTED[painted](tmp / painted, src) if args.data == "shapes"
                    else make_task_set(args.task, tmp / f"coco128-{args.task}", src))
        else:
            data = make_shapes(src, tmp / "shapes") if args.data == "shapes" else make_coco128(src, tmp / "coco128")
        env = os.environ | {"YOLO_CONFIG_DIR": str(tmp / "yolo-config"), "YOLO_OFFLINE": "1"}
        for seed in args.seeds:
            for c in contenders:
                cmd = [str(py), __file__, "--run", c, str(data), str(seed), "--task", args.task, "--imgsz", str(args.imgsz),
                       "--epochs", str(args.epochs), "--batch", str(args.batch), "--workers", str(args.workers),
                       "--device", args.device, "--project", str(tmp / "runs")]
                cmd += ["--weights", str(args.weights.resolve())] if args.weights else []
                cmd += ["--classes", *map(str, args.classes)] if args.classes else []
                cmd += ["--close-mosaic", str(args.close_mosaic)] if args.close_mosaic is not None else []
                cmd += ["--no-augment"] if args.no_augment else []
                cmd += [f"--set={x}" for x in args.set or []]
                out = subprocess.run(cmd, capture_output=True, text=True, env=env)
                lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
                if out.returncode != 0 or not lines:
                    raise RuntimeError(f"{c} seed {seed} failed ({out.returncode}):\n{out.stdout[-3000:]}\n"
                                       f"{out.stderr[-5000:]}")
                r = json.loads(lines[-1][7:])
                results.append(r)
                masks = "".join(f", {k} mAP50 {r[f'{k}_map50']:.3f}, {k} mAP50-95 {r[f'{k}_map']:.3f}"
                                for _, k in SECOND_MAPS.values() if f"{k}_map" in r)
                print(f"{c:12s} seed {seed}: {r['images_s']:6.1f} images/s, waiting {100 * r['wait_share']:4.1f}%, "
                      f"mAP50 {r['map50']:.3f}, mAP50-95 {r['map']:.3f}{masks} ({r['wall_s']:.0f} s)", flush=True)
        shutil.rmtree(tmp / "runs", ignore_errors=True)
    table = summarise(results, contenders)
    print("\n" + "\n".join(table))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "config": {k: v for k, v in vars(args).items()
                                                                          if k not in ("json", "run", "project")},
                                         "results": results, "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
