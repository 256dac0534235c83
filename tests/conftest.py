"""Shared fixtures: small synthetic datasets made on the fly, and the real sample data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg

import fastfeed

REPO = Path(__file__).resolve().parents[1]
COCO128 = Path(os.environ.get("FASTFEED_COCO128", REPO.parent / "shared" / "data" / "coco128"))


def pytest_collection_modifyitems(config, items):
    """gpu/npu tests need the device; skip them, with the reason, where there is none."""
    import torch

    has_npu = hasattr(torch, "npu") and getattr(torch.npu, "is_available", lambda: False)()
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))
        if "npu" in item.keywords and not has_npu:
            item.add_marker(pytest.mark.skip(reason="needs an Ascend NPU with torch_npu"))


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    return fastfeed.sample_path()


@pytest.fixture(scope="session")
def coco128() -> Path:
    if not (COCO128 / "annotations" / "instances_train2017.json").is_file():
        pytest.skip(f"coco128 not found at {COCO128} (set FASTFEED_COCO128)")
    return COCO128


def paint_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth random RGB image (compresses like a photo, decodes to recognisable pixels)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)


def jpeg_bytes(img: np.ndarray, quality: int = 92) -> bytes:
    return simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=quality, colorspace="RGB")


class CocoBuilder:
    """Write a COCO-layout dataset: root/annotations/instances_<split>.json + root/images/<split>/."""

    def __init__(self, root: Path, split: str = "train2017", categories=((1, "person"), (3, "car"), (18, "dog"))):
        self.root, self.split = root, split
        self.images_dir = root / "images" / split
        self.images_dir.mkdir(parents=True, exist_ok=True)
        (root / "annotations").mkdir(exist_ok=True)
        self.data = {"info": {}, "licenses": [], "images": [], "annotations": [],
                     "categories": [{"id": i, "name": n} for i, n in categories]}
        self._ann_id = 1

    def add_image(self, name: str, h: int = 120, w: int = 160, data: bytes | None = None, seed: int = 0,
                  boxes=(), write: bool = True, ann_size=None) -> int:
        """boxes: (category_id, [x, y, w, h]) or (category_id, bbox, iscrowd)."""
        image_id = len(self.data["images"]) + 1
        if write:
            (self.images_dir / name).write_bytes(data if data is not None else jpeg_bytes(paint_image(h, w, seed)))
        ah, aw = ann_size or (h, w)
        self.data["images"].append({"id": image_id, "file_name": name, "width": aw, "height": ah})
        for b in boxes:
            cat, bbox, crowd = (b + (0,))[:3]
            self.data["annotations"].append({"id": self._ann_id, "image_id": image_id, "category_id": cat,
                                             "bbox": list(bbox), "iscrowd": crowd, "area": 1.0})
            self._ann_id += 1
        return image_id

    def write(self) -> Path:
        (self.root / "annotations" / f"instances_{self.split}.json").write_text(json.dumps(self.data))
        return self.root


class YoloBuilder:
    """Write a YOLO-layout dataset: root/images/<split>/ + root/labels/<split>/ (+ data.yaml)."""

    def __init__(self, root: Path, split: str | None = "train", names=None):
        self.root = root
        self.images_dir = root / "images" / split if split else root / "images"
        self.labels_dir = root / "labels" / split if split else root / "labels"
        self.images_dir.mkdir(parents=True, exist_ok=True)
        self.labels_dir.mkdir(parents=True, exist_ok=True)
        if names is not None:
            (root / "data.yaml").write_text("names:\n" + "".join(f"  {i}: {n}\n" for i, n in enumerate(names)))

    def add(self, stem: str, lines=None, h: int = 100, w: int = 140, seed: int = 0, image: bool = True,
            ext: str = ".jpg", data: bytes | None = None):
        if image:
            (self.images_dir / f"{stem}{ext}").write_bytes(data if data is not None else jpeg_bytes(paint_image(h, w, seed)))
        if lines is not None:
            (self.labels_dir / f"{stem}.txt").write_text("\n".join(lines) + "\n")
        return self


@pytest.fixture
def coco_builder(tmp_path):
    return CocoBuilder(tmp_path / "coco")


@pytest.fixture
def yolo_builder(tmp_path):
    return lambda **kw: YoloBuilder(tmp_path / "yolo", **kw)
