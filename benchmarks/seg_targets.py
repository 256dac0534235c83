"""What a segmentation model is trained on, fastfeed's loader against Ultralytics' own (issue 28): statistics of
the training targets both make from the same shapes-seg set with the same augmentation.

    .venv-ultralytics/bin/python benchmarks/seg_targets.py [--imgsz 128] [--samples 800] [--hsv] [--no-mosaic] [--json F]

Both sides read `task_sets.py`'s shapes-seg set (squares, discs and triangles painted on coco128 photos with
exactly their labels' polygons): Ultralytics through `build_yolo_dataset` in train mode (task=segment, its
default hyp, mask_ratio 4, overlap_mask), fastfeed through the `cpu` loader with the AugmentHyp, mask rule and
mask fields `FastfeedSegmentationTrainer` derives from the same arguments. HSV is off unless --hsv, so each
painted shape keeps one colour and a mask can be judged against the image it labels:

- objects per image, box area (share of the image), boxes touching the image's edge, objects without a mask pixel;
- fill: an object's mask pixels over its box (both at mask resolution);
- purity: the share of the image pixels under an object's mask within 40 levels (each channel) of the mask's
  median colour; a mask shifted or grown off its shape covers photo and purity falls;
- recall: of the pixels in the object's box within that tolerance of the colour, the share under the mask.

Printed as one table, per side: mean and quartiles. Runs in `.venv-ultralytics` (fastfeed is importable there).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_source  # noqa: E402
from task_sets import make_shapes_seg  # noqa: E402

TOL = 40
STATS = ("objects", "box_area", "edge", "empty", "fill", "purity", "recall", "sharpness", "grey")


def object_stats(img: np.ndarray, masks: np.ndarray, boxes: np.ndarray, ratio: int) -> list[dict]:
    """img HxWx3 uint8; masks h x w overlap (value j+1 = object j); boxes [n, 4] xyxy pixels."""
    h, w = img.shape[:2]
    rows = []
    for j, (x1, y1, x2, y2) in enumerate(np.clip(boxes, 0, [w, h, w, h])):   # Ultralytics' flip leaves -1e-5s
        m = masks == j + 1
        if not m.any():
            rows.append({"fill": 0.0, "purity": np.nan, "recall": np.nan, "empty": 1.0,
                         "box_area": (x2 - x1) * (y2 - y1) / (h * w), "edge": float(_edge(x1, y1, x2, y2, w, h))})
            continue
        full = np.repeat(np.repeat(m, ratio, 0), ratio, 1)[:h, :w]
        px = img[full].astype(int)
        colour = np.median(px, 0)
        purity = float((np.abs(px - colour).max(1) < TOL).mean())
        bx1, by1, bx2, by2 = (int(np.floor(x1)), int(np.floor(y1)), int(np.ceil(x2)), int(np.ceil(y2)))
        box_img = img[by1:by2, bx1:bx2].astype(int)
        near = np.abs(box_img - colour).max(2) < TOL
        recall = float((near & full[by1:by2, bx1:bx2]).sum() / max(near.sum(), 1))
        mb = m[int(y1 // ratio):int(np.ceil(y2 / ratio)), int(x1 // ratio):int(np.ceil(x2 / ratio))]
        box_cells = max((x2 - x1) * (y2 - y1) / ratio**2, 1e-6)
        rows.append({"fill": float(mb.sum() / box_cells), "purity": purity, "recall": recall, "empty": 0.0,
                     "box_area": (x2 - x1) * (y2 - y1) / (h * w), "edge": float(_edge(x1, y1, x2, y2, w, h))})
    return rows


def add_sample(acc: tuple[list, list, list], img: np.ndarray, masks: np.ndarray, xywh: np.ndarray, ratio: int) -> None:
    """One training sample's statistics into acc = (objects per image, per-object rows, per-image rows); img HxWx3
    RGB, masks the overlap mask, xywh [n, 4] normalised boxes in the masks' order."""
    h, w = img.shape[:2]
    b = xywh.reshape(-1, 4) * [w, h, w, h]
    xyxy = np.c_[b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2]
    acc[0].append(len(xyxy))
    acc[1].extend(object_stats(img, masks, xyxy, ratio))
    acc[2].append(image_stats(img))


def image_stats(img: np.ndarray) -> dict:
    """sharpness: mean |Laplacian| of the grey image off the fill; grey: the share of fill (114) pixels."""
    import cv2

    grey = (img == 114).all(2)
    lap = np.abs(cv2.Laplacian(cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2GRAY), cv2.CV_32F))
    return {"sharpness": float(lap[~grey].mean()) if (~grey).any() else np.nan, "grey": float(grey.mean())}


def _edge(x1, y1, x2, y2, w, h, tol=0.5) -> bool:
    return x1 <= tol or y1 <= tol or x2 >= w - tol or y2 >= h - tol


def overrides(imgsz: int, hsv: bool, mosaic: bool) -> dict:
    """Ultralytics' training arguments both sides take: its defaults, HSV off unless asked, mosaic as asked."""
    over = {"task": "segment", "imgsz": imgsz, "mask_ratio": 4, "overlap_mask": True}
    if not hsv:
        over |= {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0}
    return over | ({} if mosaic else {"mosaic": 0.0})


def ultralytics_side(data_yaml: Path, imgsz: int, samples: int, over: dict, seed: int) -> tuple[list, list, list]:
    import torch
    import yaml
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.utils import DEFAULT_CFG

    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    y = yaml.safe_load(data_yaml.read_text())
    data = {"names": y["names"], "nc": len(y["names"]), "channels": 3}
    cfg = get_cfg(DEFAULT_CFG, overrides=over)
    ds = build_yolo_dataset(cfg, str(Path(y["path"]) / y["train"]), 16, data, mode="train")
    acc = ([], [], [])
    for i in np.random.default_rng(seed).permutation(np.resize(np.arange(len(ds)), samples)):
        s = ds[int(i)]
        add_sample(acc, s["img"].permute(1, 2, 0).numpy(), s["masks"][0].numpy(), s["bboxes"].numpy(), 4)
    return acc


def fastfeed_side(store: Path, imgsz: int, samples: int, over: dict, seed: int) -> tuple[list, list, list]:
    from ultralytics.cfg import get_cfg
    from ultralytics.utils import DEFAULT_CFG

    from fastfeed import Store
    from fastfeed.integrations.ultralytics.args import augment_hyp, task_fields
    from fastfeed.loaders import LoaderConfig, create_loader

    args = get_cfg(DEFAULT_CFG, overrides=over)
    cfg = LoaderConfig(imgsz=imgsz, batch_size=16, workers=2, seed=seed, shuffle=True, hyp=augment_hyp(args),
                       **task_fields(args, "segment"))
    loader = create_loader("cpu", Store(store), cfg)
    acc, epoch = ([], [], []), 0
    try:
        while len(acc[0]) < samples:
            loader.set_epoch(epoch)
            epoch += 1
            for batch in loader:
                t = batch.targets.numpy()
                for k in range(len(batch.images)):
                    add_sample(acc, batch.images[k].permute(1, 2, 0).numpy(), batch.masks[k].numpy(),
                               t[t[:, 0] == k, 2:6], cfg.mask_ratio)
                if len(acc[0]) >= samples:
                    break
    finally:
        loader.close()
    return acc


def trainer_side(data_yaml: Path, imgsz: int, samples: int, over: dict, seed: int) -> tuple[list, list, list]:
    """The batches FastfeedSegmentationTrainer hands Ultralytics' loss (its collate: masks, batch_idx, bboxes)."""
    from fastfeed.integrations.ultralytics import FastfeedSegmentationTrainer

    args = over | {"model": "yolov8n-seg.yaml", "data": str(data_yaml), "batch": 16, "epochs": 20, "device": "cpu",
                   "workers": 2, "plots": False, "val": False, "seed": seed, "project": str(data_yaml.parent / "runs")}
    trainer = FastfeedSegmentationTrainer(overrides=args)
    trainer.model = trainer.get_model(cfg="yolov8n-seg.yaml", verbose=False)
    feed = trainer.get_dataloader(trainer.data["train"], batch_size=16, rank=-1, mode="train")
    acc, trainer.epoch = ([], [], []), 0
    try:
        while len(acc[0]) < samples:
            for b in feed:   # the epoch is the trainer's (its loop sets it; here, below)
                for k in range(len(b["img"])):
                    add_sample(acc, b["img"][k].permute(1, 2, 0).numpy(), b["masks"][k].numpy(),
                               b["bboxes"][b["batch_idx"] == k].numpy(), imgsz // b["masks"].shape[-1])
                if len(acc[0]) >= samples:
                    break
            trainer.epoch += 1
    finally:
        feed.close()
    return acc


def summary(counts: list, rows: list, images: list) -> dict:
    out = {"objects": (float(np.mean(counts)), *np.percentile(counts, [25, 50, 75]))}
    for k in STATS[1:]:
        v = np.array([r[k] for r in (images if k in ("sharpness", "grey") else rows)], float)
        v = v[~np.isnan(v)]
        out[k] = (float(v.mean()), *(float(q) for q in np.percentile(v, [25, 50, 75])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--imgsz", type=int, default=128)
    ap.add_argument("--samples", type=int, default=800, help="training samples per side")
    ap.add_argument("--hsv", action="store_true", help="keep HSV augmentation on (purity and recall then mean less)")
    ap.add_argument("--no-mosaic", action="store_true", help="mosaic off (as in the last close_mosaic epochs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ff-segt-") as tmp:
        tmp = Path(tmp)
        data = make_shapes_seg(tmp / "shapes-seg", default_source())
        store = tmp / "seg.ff"
        subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(data), "--task", "segment", "-o", str(store),
                        "--quiet"], check=True, capture_output=True)
        over = overrides(args.imgsz, args.hsv, not args.no_mosaic)
        res = {"Ultralytics": summary(*ultralytics_side(data, args.imgsz, args.samples, over, args.seed)),
               "fastfeed cpu": summary(*fastfeed_side(store, args.imgsz, args.samples, over, args.seed)),
               "FastfeedSegmentationTrainer": summary(*trainer_side(data, args.imgsz, args.samples, over, args.seed))}
    print(f"imgsz {args.imgsz}, {args.samples} training samples a side, HSV {'on' if args.hsv else 'off'}, "
          f"mosaic {'off' if args.no_mosaic else 'on'}; "
          "mean (quartiles)\n")
    print("| side | " + " | ".join(STATS) + " |\n|---|" + "---|" * len(STATS))
    for side, s in res.items():
        print(f"| {side} | " + " | ".join(f"{s[k][0]:.3f} ({s[k][1]:.2f}, {s[k][2]:.2f}, {s[k][3]:.2f})"
                                          for k in STATS) + " |")
    if args.json:
        args.json.write_text(json.dumps(res | {"config": {k: str(v) for k, v in vars(args).items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
