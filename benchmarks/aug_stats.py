"""Training-batch statistics of fastfeed's `cpu` loader against Ultralytics' own training dataset, on the
same images, in one process (run it in the Ultralytics venv, which has both):

    make venv-ultralytics
    YOLO_OFFLINE=1 .venv-ultralytics/bin/python benchmarks/aug_stats.py [--samples 2000] [--imgsz 640]

Both sides use their default augmentation (mosaic on, translate 0.1, scale 0.5, fliplr 0.5, HSV) on a
copy of coco128 (copied: Ultralytics writes a label cache beside the images), one process each (one
worker's partner buffer), batches of 16. Per side: boxes per image, the share of mosaics that repeat a
tile, box width/height quantiles (normalised), the share of grey fill, and the samples' time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import default_source, replicate_coco  # noqa: E402

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def summarise(boxes_per_image: list[int], wh: np.ndarray, fill: list[float], repeats: list[bool], seconds: float):
    return {"samples": len(boxes_per_image), "boxes_per_image": float(np.mean(boxes_per_image)),
            "mosaics": len(repeats), "mosaics_repeating_a_tile": float(np.mean(repeats)) if repeats else None,
            "box_w_quantiles": np.quantile(wh[:, 0], QUANTILES).round(4).tolist(),
            "box_h_quantiles": np.quantile(wh[:, 1], QUANTILES).round(4).tolist(),
            "fill_fraction": float(np.mean(fill)), "ms_per_sample": 1e3 * seconds / len(boxes_per_image)}


def ultralytics_side(root: Path, imgsz: int, samples: int, seed: int) -> dict:
    from ultralytics.cfg import get_cfg
    from ultralytics.data import augment
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.utils import DEFAULT_CFG

    repeats = []
    real_params = augment.Mosaic.get_params

    def get_params(self, labels):   # which files the 4 tiles came from
        params = real_params(self, labels)
        files = [labels["im_file"]] + [m["im_file"] for m in labels["mix_labels"]]
        repeats.append(len(set(files)) < len(files))
        return params

    augment.Mosaic.get_params = get_params
    cfg = get_cfg(DEFAULT_CFG, overrides={"imgsz": imgsz, "batch": 16, "workers": 0, "seed": seed})
    data = {"names": {i: str(i) for i in range(80)}, "nc": 80, "channels": 3}
    ds = build_yolo_dataset(cfg, str(root / "images" / "train2017"), 16, data, mode="train")
    order = np.random.default_rng(seed).permutation(np.tile(np.arange(len(ds)), samples // len(ds) + 1))[:samples]
    per_image, wh, fill = [], [], []
    t0 = time.perf_counter()
    for i in order:
        s = ds[int(i)]
        img = s["img"].numpy()
        per_image.append(len(s["cls"]))
        wh.append(s["bboxes"].numpy()[:, 2:4].reshape(-1, 2))
        fill.append(float((img == 114).all(0).mean()))
    seconds = time.perf_counter() - t0
    augment.Mosaic.get_params = real_params
    return summarise(per_image, np.concatenate(wh), fill, repeats, seconds)


def fastfeed_side(store_path: Path, imgsz: int, samples: int, seed: int) -> dict:
    import fastfeed.augment as aug
    from fastfeed import Store
    from fastfeed.loaders import LoaderConfig, create_loader

    repeats = []
    real_render = aug.render_labels

    def render(tiles, geometry, *a, **kw):   # the same image object in two tiles of a mosaic is a repeat
        if geometry.mosaic:
            ids = [id(t[0]) for t in tiles[:4]]
            repeats.append(len(set(ids)) < len(ids))
        return real_render(tiles, geometry, *a, **kw)

    aug.render_labels = render
    store = Store(store_path)
    cfg = LoaderConfig(imgsz=imgsz, batch_size=16, workers=0, seed=seed)   # in this process: one worker's buffer
    per_image, wh, fill = [], [], []
    t0 = time.perf_counter()
    with create_loader("cpu", store, cfg) as loader:
        epoch = 0
        while len(per_image) < samples:
            loader.set_epoch(epoch)
            for images, targets in loader:
                x = images.numpy()
                for j in range(len(x)):
                    t = targets[targets[:, 0] == j].numpy()
                    per_image.append(len(t))
                    wh.append(t[:, 4:6])
                    fill.append(float((x[j] == 114).all(0).mean()))
                if len(per_image) >= samples:
                    break
            epoch += 1
    seconds = time.perf_counter() - t0
    aug.render_labels = real_render
    return summarise(per_image[:samples], np.concatenate(wh), fill[:samples], repeats, seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from fastfeed.pack import PackConfig, pack

    with tempfile.TemporaryDirectory() as tmp:
        src = default_source()
        n = len(list((src / "images" / "train2017").glob("*.jpg")))
        root = replicate_coco(src, Path(tmp) / "src", n)
        pack(PackConfig(src=root, out=Path(tmp) / "s.ff", format="coco", progress=False))
        res = {"ultralytics": ultralytics_side(root, args.imgsz, args.samples, args.seed),
               "fastfeed_cpu": fastfeed_side(Path(tmp) / "s.ff", args.imgsz, args.samples, args.seed)}
    print(f"{'':32} {'ultralytics':>14} {'fastfeed cpu':>14}")
    u, f = res["ultralytics"], res["fastfeed_cpu"]
    for key in ("boxes_per_image", "mosaics_repeating_a_tile", "fill_fraction", "ms_per_sample"):
        print(f"{key:32} {u[key]:14.4f} {f[key]:14.4f}")
    for key in ("box_w_quantiles", "box_h_quantiles"):
        print(f"{key + ' ' + str(QUANTILES):32}\n  {u[key]}\n  {f[key]}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
