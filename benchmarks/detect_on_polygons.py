"""What Ultralytics' detection training does with polygon labels: the boxes it trains on, against box labels.

    python benchmarks/detect_on_polygons.py [--samples 256] [--aug degrees=10 ...]

Ultralytics reads a YOLO line of more than 5 values as a polygon even for a detection model: the box it packs is
the polygon's bounds, and after mosaic and `random_perspective` the box is taken again from the moved polygon's
points inside the image (`segment2box`), not from the moved, clipped box. fastfeed's detection batches carry the
box alone (a detect pack keeps the bounds, note `polygon_to_box`; a segment store read as detection moves its boxes).
Here coco128's own polygons (`task_sets.py --task segment`) and the same objects' boxes (`--task detect`) go
through Ultralytics' training dataset (task detect, imgsz 640, no Albumentations), the same seed for both, so both
draw the same mosaics and maps: printed are the boxes per sample and their mean area (normalised) on each side,
without the --aug settings and with each.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402
from task_sets import make_task_set  # noqa: E402
from vs_ultralytics import aug_json, ensure_ultralytics_venv, run  # noqa: E402

ULTRA = textwrap.dedent("""
    import json, random, sys
    import numpy as np, torch, yaml
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.utils import DEFAULT_CFG
    roots, configs, samples = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    out = []
    for c in configs:
        row = {}
        for side, root in roots.items():
            y = yaml.safe_load(open(root + "/data.yaml"))
            data = {"names": y["names"], "nc": len(y["names"]), "channels": 3}
            over = {"task": "detect", "imgsz": 640, "batch": 16, "augmentations": []} | c
            ds = build_yolo_dataset(get_cfg(DEFAULT_CFG, overrides=over), root + "/images/train2017", 16, data,
                                    mode="train")
            random.seed(0); np.random.seed(0); torch.manual_seed(0)
            boxes = [ds[i % len(ds)]["bboxes"].numpy() for i in range(samples)]
            areas = np.concatenate([b[:, 2] * b[:, 3] for b in boxes])
            row[side] = {"boxes_per_sample": len(areas) / samples, "mean_area": float(areas.mean())}
        out.append(row)
    print("RESULT " + json.dumps(out))
""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--aug", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting to compare under too, e.g. degrees=10 (repeatable)")
    args = ap.parse_args()
    configs = [{}] + [json.loads(aug_json(a.split(","))) for a in args.aug]
    ultra_py = ensure_ultralytics_venv()
    with tempfile.TemporaryDirectory(prefix="ff-det-poly-") as tmp:
        tmp = Path(tmp)
        roots = {side: str(make_task_set(task, tmp / side).parent) for side, task in
                 (("polygons", "segment"), ("boxes", "detect"))}
        (tmp / "ultra.py").write_text(ULTRA)
        rows = run([str(ultra_py), str(tmp / "ultra.py"), json.dumps(roots), json.dumps(configs), str(args.samples)],
                   tmp)
    print(f"{machine()}\ncoco128, Ultralytics' detection dataset, {args.samples} samples, seed 0\n")
    print("| setting | boxes a sample: polygon labels / box labels | mean box area: polygon / box labels | ratio |")
    print("|---|---|---|---|")
    for name, r in zip(["defaults"] + args.aug, rows):
        p, b = r["polygons"], r["boxes"]
        print(f"| {name} | {p['boxes_per_sample']:.2f} / {b['boxes_per_sample']:.2f} | {p['mean_area']:.4f} / "
              f"{b['mean_area']:.4f} | {p['mean_area'] / b['mean_area']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
