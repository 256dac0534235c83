"""What a segmentation model is trained on, fastfeed's loader against Ultralytics' own (issue 28): statistics of
the training targets both make from the same shapes-seg set with the same augmentation.

    .venv-ultralytics/bin/python benchmarks/seg_targets.py [--imgsz 128] [--samples 800] [--hsv] [--no-mosaic] [--no-flip] [--json F]

Both sides read `task_sets.py`'s shapes-seg set (squares, discs and triangles painted on coco128 photos with
exactly their labels' polygons): Ultralytics through `build_yolo_dataset` in train mode (task=segment, its
default hyp, mask_ratio 4, overlap_mask), fastfeed through the `cpu` loader with the AugmentHyp, mask rule and
mask fields `FastfeedSegmentationTrainer` derives from the same arguments. HSV is off unless --hsv, so each
painted shape keeps one colour and a mask can be judged against the image it labels:

- objects per image, box area (share of the image), boxes touching the image's edge, objects without a mask pixel;
- fill: an object's mask pixels over its box (both at mask resolution);
- purity: the share of the image pixels under an object's mask within 40 levels (each channel) of the mask's
  median colour; a mask shifted or grown off its shape covers photo and purity falls;
- recall: of the pixels in the object's box within that tolerance of the colour, the share under the mask;
- alignment (`ALIGN`, objects off the image's edge): the signed offsets in pixels of each mask's and box's centre
  from its painted region's, the mask's area and the box's sides over the painted region's (`--no-flip` keeps
  the sign of x offsets);
- sharpness (mean |Laplacian| of the photo, 3 px off the fill) and the share of fill.

A fourth side is Ultralytics' val dataset of the same set (letterboxed, unaugmented, square here; its validator
uses rect batches of the same scale): what the validator scores the model's masks against.
Printed as two tables, per side: mean and quartiles. Runs in `.venv-ultralytics` (fastfeed is importable there).
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
# Alignment against the painted shape (objects off the image's edge only): signed offsets in image pixels of the
# mask's and the box's centre from the painted region's, the mask's area and the box's width and height over the
# painted region's. A bias here (a target shifted or grown against its pixels) is what purity and recall blur.
ALIGN = ("mask_dx", "mask_dy", "mask_size", "box_dx", "box_dy", "box_w", "box_h")


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
                     "box_area": (x2 - x1) * (y2 - y1) / (h * w), "edge": float(_edge(x1, y1, x2, y2, w, h)),
                     **alignment(img, full, colour, (x1, y1, x2, y2))})
    return rows


def alignment(img: np.ndarray, full: np.ndarray, colour: np.ndarray, box) -> dict:
    """The ALIGN figures of one object: its painted region is the largest connected set of pixels within TOL of
    the mask's colour in the box grown by 3 px; NaN for objects on the image's edge or too small to judge."""
    import cv2

    h, w = img.shape[:2]
    x1, y1, x2, y2 = box
    if _edge(x1, y1, x2, y2, w, h, tol=2.0) or min(x2 - x1, y2 - y1) < 6:
        return dict.fromkeys(ALIGN, np.nan)
    gx1, gy1 = max(int(np.floor(x1)) - 3, 0), max(int(np.floor(y1)) - 3, 0)
    gx2, gy2 = min(int(np.ceil(x2)) + 3, w), min(int(np.ceil(y2)) + 3, h)
    near = (np.abs(img[gy1:gy2, gx1:gx2].astype(int) - colour).max(2) < TOL).astype(np.uint8)
    n, lab, st, _ = cv2.connectedComponentsWithStats(near, connectivity=4)
    if n < 2:
        return dict.fromkeys(ALIGN, np.nan)
    k = 1 + int(np.argmax(st[1:, cv2.CC_STAT_AREA]))
    ys, xs = np.nonzero(lab == k)
    px, py = xs.mean() + gx1 + 0.5, ys.mean() + gy1 + 0.5            # pixel centres: the continuous frame
    pw, ph = xs.max() - xs.min() + 1, ys.max() - ys.min() + 1
    pcx, pcy = (xs.min() + xs.max() + 1) / 2 + gx1, (ys.min() + ys.max() + 1) / 2 + gy1
    my, mx = np.nonzero(full)
    return {"mask_dx": mx.mean() + 0.5 - px, "mask_dy": my.mean() + 0.5 - py, "mask_size": len(mx) / len(xs),
            "box_dx": (x1 + x2) / 2 - pcx, "box_dy": (y1 + y2) / 2 - pcy, "box_w": (x2 - x1) / pw,
            "box_h": (y2 - y1) / ph}


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
    # off the fill and 3 px from it: a warp blends the fill's edge into a band of mixed pixels that a resize
    # leaves crisp, and that edge (not the photo's detail) would otherwise dominate the figure
    photo = ~cv2.dilate(grey.astype(np.uint8), np.ones((7, 7), np.uint8)).astype(bool)
    return {"sharpness": float(lap[photo].mean()) if photo.any() else np.nan, "grey": float(grey.mean())}


def _edge(x1, y1, x2, y2, w, h, tol=0.5) -> bool:
    return x1 <= tol or y1 <= tol or x2 >= w - tol or y2 >= h - tol


def overrides(imgsz: int, hsv: bool, mosaic: bool, flip: bool = True) -> dict:
    """Ultralytics' training arguments both sides take: its defaults, HSV off unless asked, mosaic and the
    left-right flip as asked (without the flip a signed x offset cannot cancel out)."""
    over = {"task": "segment", "imgsz": imgsz, "mask_ratio": 4, "overlap_mask": True} | ({} if flip else {"fliplr": 0.0})
    if not hsv:
        over |= {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0}
    return over | ({} if mosaic else {"mosaic": 0.0})


def ultralytics_side(data_yaml: Path, imgsz: int, samples: int, over: dict, seed: int,
                     split: str = "train") -> tuple[list, list, list]:
    """Ultralytics' dataset of `split` in that mode: train (augmented), or val (what its validator scores against:
    letterboxed, unaugmented, its masks; each image once)."""
    import torch
    import yaml
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.utils import DEFAULT_CFG

    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    y = yaml.safe_load(data_yaml.read_text())
    data = {"names": y["names"], "nc": len(y["names"]), "channels": 3}
    cfg = get_cfg(DEFAULT_CFG, overrides=over)
    ds = build_yolo_dataset(cfg, str(Path(y["path"]) / y[split]), 16, data, mode=split, rect=False)
    acc = ([], [], [])
    order = np.arange(len(ds)) if split == "val" else np.resize(np.arange(len(ds)), samples)
    for i in np.random.default_rng(seed).permutation(order):
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
    for k in STATS[1:] + ALIGN:
        v = np.array([r.get(k, np.nan) for r in (images if k in ("sharpness", "grey") else rows)], float)
        v = v[~np.isnan(v)]
        out[k] = (float(v.mean()), *(float(q) for q in np.percentile(v, [25, 50, 75])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--imgsz", type=int, default=128)
    ap.add_argument("--samples", type=int, default=800, help="training samples per side")
    ap.add_argument("--hsv", action="store_true", help="keep HSV augmentation on (purity and recall then mean less)")
    ap.add_argument("--no-mosaic", action="store_true", help="mosaic off (as in the last close_mosaic epochs)")
    ap.add_argument("--no-flip", action="store_true", help="no left-right flips (signed x offsets keep their sign)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ff-segt-") as tmp:
        tmp = Path(tmp)
        data = make_shapes_seg(tmp / "shapes-seg", default_source())
        store = tmp / "seg.ff"
        subprocess.run([sys.executable, "-m", "fastfeed", "pack", str(data), "--task", "segment", "-o", str(store),
                        "--quiet"], check=True, capture_output=True)
        over = overrides(args.imgsz, args.hsv, not args.no_mosaic, not args.no_flip)
        res = {"Ultralytics": summary(*ultralytics_side(data, args.imgsz, args.samples, over, args.seed)),
               "fastfeed cpu": summary(*fastfeed_side(store, args.imgsz, args.samples, over, args.seed)),
               "FastfeedSegmentationTrainer": summary(*trainer_side(data, args.imgsz, args.samples, over, args.seed)),
               "validation (Ultralytics' val set)": summary(*ultralytics_side(data, args.imgsz, 0, over, args.seed,
                                                                              "val"))}
    print(f"imgsz {args.imgsz}, {args.samples} training samples a side, HSV {'on' if args.hsv else 'off'}, "
          f"mosaic {'off' if args.no_mosaic else 'on'}; "
          "mean (quartiles)\n")
    print("| side | " + " | ".join(STATS) + " |\n|---|" + "---|" * len(STATS))
    for side, s in res.items():
        print(f"| {side} | " + " | ".join(f"{s[k][0]:.3f} ({s[k][1]:.2f}, {s[k][2]:.2f}, {s[k][3]:.2f})"
                                          for k in STATS) + " |")
    print("\n| side | " + " | ".join(ALIGN) + " |\n|---|" + "---|" * len(ALIGN))
    for side, s in res.items():
        print(f"| {side} | " + " | ".join(f"{s[k][0]:+.3f} ({s[k][1]:.2f}, {s[k][2]:.2f}, {s[k][3]:.2f})"
                                          for k in ALIGN) + " |")
    if args.json:
        args.json.write_text(json.dumps(res | {"config": {k: str(v) for k, v in vars(args).items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
