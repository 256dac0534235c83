"""Helpers shared by the benchmarks: a replicated real dataset and the machine description."""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
COCO128 = Path(os.environ.get("FASTFEED_COCO128", REPO.parent / "shared" / "data" / "coco128"))


def default_source() -> Path:
    """coco128 when it is next to the repository, else the bundled 16-image sample."""
    if (COCO128 / "annotations" / "instances_train2017.json").is_file():
        return COCO128
    import fastfeed

    return fastfeed.sample_path()


def replicate_coco(src: Path, dst: Path, n_images: int, split: str = "train2017") -> Path:
    """A COCO + YOLO layout at `dst` with `n_images` files, cycling through the source's images.

    Copies are real files (not links) so reads hit distinct pages, as they would in a real dataset.
    Labels are written in both layouts so loose-file readers have their txt files; a pack of it names its
    layout (`format="coco"`, `--format coco`): a folder holding both stops the pack.
    """
    ann = json.loads((src / "annotations" / f"instances_{split}.json").read_text())
    images = sorted(ann["images"], key=lambda im: im["id"])
    by_image: dict[int, list] = {}
    for a in ann["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    cats = {c["id"]: k for k, c in enumerate(sorted(ann["categories"], key=lambda c: c["id"]))}
    if dst.exists():
        shutil.rmtree(dst)
    (dst / "images" / split).mkdir(parents=True)
    (dst / "labels" / split).mkdir(parents=True)
    (dst / "annotations").mkdir()
    out_images, out_anns = [], []
    for k in range(n_images):
        im = images[k % len(images)]
        name = f"{k:012d}.jpg"
        shutil.copyfile(src / "images" / split / im["file_name"], dst / "images" / split / name)
        out_images.append(im | {"id": k + 1, "file_name": name})
        lines = []
        for a in by_image.get(im["id"], ()):
            out_anns.append(a | {"id": len(out_anns) + 1, "image_id": k + 1})
            if not a.get("iscrowd"):
                x, y, w, h = a["bbox"]
                W, H = im["width"], im["height"]
                lines.append(f"{cats[a['category_id']]} {(x + w / 2) / W:.6f} {(y + h / 2) / H:.6f} {w / W:.6f} {h / H:.6f}")
        (dst / "labels" / split / f"{k:012d}.txt").write_text("\n".join(lines) + ("\n" if lines else ""))
    (dst / "annotations" / f"instances_{split}.json").write_text(
        json.dumps(ann | {"images": out_images, "annotations": out_anns}))
    return dst


def machine() -> dict:
    import cv2
    import numpy
    import simplejpeg

    return {"cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0)),
            "ram_gib": round(psutil.virtual_memory().total / 2**30, 1), "python": platform.python_version(),
            "numpy": numpy.__version__, "opencv": cv2.__version__, "simplejpeg": simplejpeg.__version__}


def write_painted_set(dst: Path, backgrounds: list[Path], paint, names: list[str], n_train: int, n_val: int,
                      seed: int) -> Path:
    """A YOLO-layout set of shapes painted on photos (320 px long side), `paint(img, rng)` painting an image and
    returning its label lines; train and val on different photos (val: the last quarter). Returns data.yaml."""
    import cv2
    import numpy as np

    cut = max(1, len(backgrounds) * 3 // 4)           # val backgrounds are photos train never shows
    rng = np.random.default_rng(seed)
    if dst.exists():
        shutil.rmtree(dst)
    for split, n, pool in (("train", n_train, backgrounds[:cut]), ("val", n_val, backgrounds[cut:] or backgrounds)):
        (dst / "images" / split).mkdir(parents=True)
        (dst / "labels" / split).mkdir(parents=True)
        for k in range(n):
            img = cv2.imread(str(pool[k % len(pool)]))
            r = 320 / max(img.shape[:2])
            img = cv2.resize(img, (round(img.shape[1] * r), round(img.shape[0] * r)), interpolation=cv2.INTER_AREA)
            lines = paint(img, rng)
            cv2.imwrite(str(dst / "images" / split / f"{k:05d}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 90])
            (dst / "labels" / split / f"{k:05d}.txt").write_text("".join(f"{ln}\n" for ln in lines))
    listed = "".join(f"  {i}: {n}\n" for i, n in enumerate(names))
    (dst / "data.yaml").write_text(f"path: {dst}\ntrain: images/train\nval: images/val\nnames:\n{listed}")
    return dst / "data.yaml"
