"""Datasets and loader helpers for the Ultralytics integration tests (imported by them; not a conftest, so that the
suite's top-level `conftest` module stays the one other tests import): YOLO-layout datasets with a
data.yaml that Ultralytics' own trainer and validator read. Ultralytics runs offline, with its settings and
DDP files in a temporary folder."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

os.environ["YOLO_OFFLINE"] = "1"                     # no update checks, font or asset downloads
if "YOLO_CONFIG_DIR" not in os.environ:                  # Ultralytics' settings and DDP files: ours, then gone
    os.environ["YOLO_CONFIG_DIR"] = tempfile.mkdtemp(prefix="ff-yolo-cfg-")
    atexit.register(shutil.rmtree, os.environ["YOLO_CONFIG_DIR"], True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from sample_export import export, yolo_line  # noqa: E402  (tools/: the sample written as a downloaded dataset)

RED = (230, 20, 20)
# Ultralytics' arguments that keep the paint exactly red: no HSV, no Albumentations (ToGray, CLAHE, ...: on by default
# wherever albumentations is installed, on both sides)
NO_COLOUR = {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0, "augmentations": []}


def write_data_yaml(root: Path, names: list[str], split: str = "train2017") -> Path:
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/{split}\nval: images/{split}\nnames:\n"
                                    + "".join(f"  {i}: {n}\n" for i, n in enumerate(names)))
    return root / "data.yaml"


@pytest.fixture(scope="session")
def sample_yolo_master(tmp_path_factory) -> Path:
    """The bundled 16-image COCO sample in Ultralytics' YOLO layout (labels from the packed store's boxes)."""
    root = tmp_path_factory.mktemp("sample-yolo") / "coco16"
    export(root, "ultralytics")
    write_data_yaml(root, _names(root))
    return root


@pytest.fixture(scope="session")
def sample_roboflow(tmp_path_factory) -> Path:
    """The bundled sample as Roboflow exports a YOLO set: train/ and valid/ (images/, labels/), data.yaml at the top."""
    root = tmp_path_factory.mktemp("sample-roboflow") / "export"
    export(root, "roboflow")
    return root


@pytest.fixture
def sample_yolo(sample_yolo_master, tmp_path) -> Path:
    """A private copy (tests pack stores beside it and edit its labels)."""
    root = tmp_path / "coco16"
    shutil.copytree(sample_yolo_master, root)
    write_data_yaml(root, _names(sample_yolo_master))
    return root


def _names(root: Path) -> list[str]:
    import yaml

    names = yaml.safe_load((root / "data.yaml").read_text())["names"]
    return [names[k] for k in sorted(names)] if isinstance(names, dict) else list(names)


@pytest.fixture(scope="session")
def painted_yolo(tmp_path_factory) -> Path:
    """24 PNG images of grey noise (never red), each with red rectangles and their YOLO labels."""
    import cv2

    root = tmp_path_factory.mktemp("painted") / "painted"
    images, labels = root / "images" / "train", root / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    for k in range(24):
        rng = np.random.default_rng(k)
        h, w = (120, 160) if k % 2 else (160, 120)
        img = rng.integers(90, 160, (h, w, 3), dtype=np.uint8)
        lines = []
        for j in range(2):
            bw, bh = w // 4 + (k + j) % 9, h // 4 + (k * j) % 7
            x1 = 6 + (k * 7) % (w // 2 - bw // 2) if j == 0 else w - bw - 6
            y1 = 6 + (k * 5) % (h // 2) if j == 0 else 6
            img[y1:y1 + bh, x1:x1 + bw] = RED
            lines.append(yolo_line((k + j) % 3, (x1 / w, y1 / h, (x1 + bw) / w, (y1 + bh) / h)))
        cv2.imwrite(str(images / f"{k:02d}.png"), img[:, :, ::-1])   # PNG: exact paint, no JPEG ringing
        (labels / f"{k:02d}.txt").write_text("\n".join(lines) + "\n")
    write_data_yaml(root, ["a", "b", "c"], split="train")
    return root


# --- trainers' train loaders, built the way each trainer builds its own ------------------------------------

def train_loader_of(cls, data: Path, tmp: Path, imgsz: int = 128, batch: int = 4, **over):
    """(trainer, its train loader) as `cls` (DetectionTrainer, FastfeedTrainer) builds them for data.yaml in
    `data`: `trainer.get_dataloader(..., mode="train")` after the model, without training."""
    args = dict(model="yolov8n.yaml", data=str(data / "data.yaml"), imgsz=imgsz, batch=batch, epochs=3, device="cpu",
                workers=0, plots=False, project=str(tmp), name=cls.__name__, exist_ok=True, seed=1) | over
    trainer = cls(overrides=args)
    model = {"segment": "yolov8n-seg.yaml", "pose": "yolov8n-pose.yaml", "obb": "yolov8n-obb.yaml"}   # its task's
    trainer.model = trainer.get_model(cfg=model.get(trainer.args.task, "yolov8n.yaml"), verbose=False)
    return trainer, trainer.get_dataloader(trainer.data["train"], batch_size=batch, rank=-1, mode="train")


def first_batches(loader, n: int) -> list[dict]:
    """The first n batches, each copied (a host loader reuses its image buffer for the next one)."""
    import torch

    out = []
    for batch in loader:
        out.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()})
        if len(out) == n:
            break
    return out


def as_targets(b: dict):
    """A trainer batch as (images, targets [M,6]: img_idx, cls, cx, cy, w, h)."""
    import torch

    return b["img"], torch.cat([b["batch_idx"][:, None], b["cls"], b["bboxes"]], 1)
