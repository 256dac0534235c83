"""What an augmentation costs per sample on each side, one core, with and without it in the same process.

    python benchmarks/aug_cost.py [--task detect] [--images 256] [--samples 256] [--rounds 5] \
        --aug perspective=0.0005 [--aug copy_paste=0.5,copy_paste_mode=mixup ...]

`vs_ultralytics.py --paired` asks the same question through both dataloaders, in images/s; on a shared machine
its rounds move with the other load. Here each side renders training samples in one process on one thread
(`cv2.setNumThreads(1)`): Ultralytics its dataset's `__getitem__` (load, mosaic, random_perspective, HSV, flips,
formatting), fastfeed its worker's `BatchBuilder.build` (read, decode, plan, render, HSV, into the batch). Each
configuration (without the --aug augmentations, then with each one alone, then with all of them) is timed
--samples samples per round in this process's CPU time (not wall time: other load on a shared machine takes
turns on the cores, it does not add CPU time here), the configurations alternating, and the fastest round kept. --task's set from coco128 (`task_sets.py`, as tasks_vs_ultralytics.py makes it) replicated to --images files, imgsz
640, mosaic on, masks at 1/4 in one overlap mask for segment, no Albumentations on either side. An --aug of several
KEY=VALUE joined by commas is one configuration.
Printed: ms per sample on each side, fastfeed's lead (Ultralytics' ms over fastfeed's), and that lead over the
lead without the augmentation (>= 1: it costs fastfeed no more of its lead).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402
from task_sets import TASKS, make_task_set  # noqa: E402
from vs_ultralytics import aug_json, ensure_ultralytics_venv, run  # noqa: E402

TIMER = textwrap.dedent("""
    import json, sys, time
    import cv2
    cv2.setNumThreads(1)
    def best_ms(makers, samples, rounds, per_call=1):
        best = [float("inf")] * len(makers)
        for _ in range(rounds):
            for k, one in enumerate(makers):
                t0 = time.process_time()
                for i in range(samples // per_call):
                    one(i)
                best[k] = min(best[k], (time.process_time() - t0) / (samples // per_call * per_call) * 1e3)
        return best
""")

ULTRA = TIMER + textwrap.dedent("""
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.utils import DEFAULT_CFG
    import yaml
    data_yaml, task, configs, samples, rounds = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), *map(int, sys.argv[4:6])
    y = yaml.safe_load(open(data_yaml))
    data = {"names": y["names"], "nc": len(y["names"]), "channels": 3} | {k: y[k] for k in ("kpt_shape", "flip_idx") if k in y}
    over = {"task": task, "imgsz": 640, "batch": 16, "mask_ratio": 4, "overlap_mask": True, "augmentations": []}
    sets = [build_yolo_dataset(get_cfg(DEFAULT_CFG, overrides=over | c), y["path"] + "/" + y["train"], 16, data,
                               mode="train") for c in configs]
    makers = [lambda i, ds=ds: ds[i % len(ds)] for ds in sets]
    print("RESULT " + json.dumps(best_ms(makers, samples, rounds)))
""")

FASTFEED = TIMER + textwrap.dedent("""
    import numpy as np
    from fastfeed import Store
    from fastfeed.augment import AugmentHyp
    from fastfeed.loaders import LoaderConfig
    from fastfeed.loaders.pipeline import BatchBuilder, StoreSource
    path, task, configs, samples, rounds = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), *map(int, sys.argv[4:6])
    store = Store(path)
    out = np.empty((16, 3, 640, 640), np.uint8)
    masks = np.empty((16, 160, 160), np.int16)
    def maker(c):
        cfg = LoaderConfig(imgsz=640, batch_size=16, workers=1, mask_ratio=4, overlap_mask=True,
                           hyp=AugmentHyp(**c, albumentations=()))
        builder = BatchBuilder(StoreSource(store, 640, task), cfg, 0, 64, store.manifest)
        def one(i):   # a batch of 16 samples a call, as the loader's worker builds them
            builder.build([(16 * i + j) % len(store) for j in range(16)], 0, i, True, out,
                          masks if task == "segment" else None)
        return one
    print("RESULT " + json.dumps(best_ms([maker(c) for c in configs], samples, rounds, 16)))
""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="detect", choices=TASKS)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--samples", type=int, default=128, help="samples per configuration per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--aug", action="append", required=True, metavar="KEY=VALUE",
                    help="an augmentation to cost, e.g. perspective=0.0005 (repeatable)")
    args = ap.parse_args()
    each = [json.loads(aug_json(a.split(","))) for a in args.aug]
    configs = [{}] + each + ([{k: v for c in each for k, v in c.items()}] if len(each) > 1 else [])
    names = ["without"] + args.aug + (["all of them"] if len(each) > 1 else [])
    ultra_py = ensure_ultralytics_venv()
    with tempfile.TemporaryDirectory(prefix="ff-aug-cost-") as tmp:
        tmp = Path(tmp)
        data = make_task_set(args.task, tmp / "data", None, args.images)
        store = tmp / "data.ff"
        subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(data), "--task", args.task, "-o", str(store),
                        "--quiet"], check=True, capture_output=True)
        (tmp / "ultra.py").write_text(ULTRA)
        (tmp / "ff.py").write_text(FASTFEED)
        rest = [args.task, json.dumps(configs), str(args.samples), str(args.rounds)]
        ultra = run([str(ultra_py), str(tmp / "ultra.py"), str(data), *rest], tmp)
        ff = run([sys.executable, str(tmp / "ff.py"), str(store), *rest], tmp)
    print(f"{machine()}\n{args.task}, {args.images} images, imgsz 640, mosaic on, one thread, fastest of {args.rounds} rounds of "
          f"{args.samples} samples\n")
    print("| configuration | Ultralytics ms/sample | fastfeed ms/sample | fastfeed's lead | lead / lead without |")
    print("|---|---|---|---|---|")
    for name, u, f in zip(names, ultra, ff):
        print(f"| {name} | {u:.2f} | {f:.2f} | {u / f:.2f}x | {u / f / (ultra[0] / ff[0]):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
