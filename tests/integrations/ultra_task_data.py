"""Painted YOLO-format datasets of each Ultralytics task for tests/integrations/test_ultralytics_tasks.py (class 0
objects red, class 1 green, on grey noise), and the check that a trainer batch's task geometry lies on its paint."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import ultra_data  # noqa: F401  (Ultralytics offline, its settings in a temporary folder)

NAMES = ["a", "b"]
PAINT = {0: (20, 20, 230), 1: (20, 230, 20)}   # BGR: class 0 red, class 1 green
KPT = "kpt_shape: [3, 3]\nflip_idx: [1, 0, 2]\n"


def _object(task: str, k: int, j: int, w: int, h: int) -> tuple[np.ndarray, str]:
    """(the painted outline in pixels, its label line) of object j of image k."""
    cx, cy, r = (0.3 + 0.4 * j) * w, (0.35 + 0.1 * ((k + j) % 3)) * h, 0.18 * min(w, h) + k % 4
    if task == "obb":
        a = 0.3 + 0.2 * k
        d = np.array([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]]) * [[r], [r * 0.5]]
        pts = np.array([[cx, cy]]) + np.array([d[0] + d[1], d[0] - d[1], -d[0] - d[1], -d[0] + d[1]])
    else:   # a hexagon
        t = np.arange(6) * math.pi / 3 + 0.1 * k
        pts = np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], 1)
    norm = pts / [w, h]
    c = (k + j) % 2
    if task == "pose":
        x1, y1, x2, y2 = (*norm.min(0), *norm.max(0))
        kp = [f"{x1 + 0.02:.5f} {cy / h:.5f} 2", f"{x2 - 0.02:.5f} {cy / h:.5f} 2", f"{cx / w:.5f} {y1 + 0.02:.5f} 1"]
        line = f"{c} {(x1 + x2) / 2:.5f} {(y1 + y2) / 2:.5f} {x2 - x1:.5f} {y2 - y1:.5f} " + " ".join(kp)
    else:
        line = f"{c} " + " ".join(f"{v:.5f}" for v in norm.reshape(-1))
    return pts, line


def make_set(root: Path, task: str, n: int = 8, yaml_extra: str | None = None) -> Path:
    """n painted images (class 0 red, class 1 green shapes on grey noise) with YOLO-`task` labels under root, and root/data.yaml."""
    import cv2

    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    for k in range(n):
        w, h = (128, 96) if k % 2 else (96, 128)
        img = np.random.default_rng(k).integers(90, 160, (h, w, 3), dtype=np.uint8)
        lines = []
        for j in range(2):
            pts, line = _object(task, k, j, w, h)
            cv2.fillPoly(img, [np.round(pts).astype(np.int32)], PAINT[int(line[0])])
            lines.append(line)
        cv2.imwrite(str(root / "images" / "train" / f"{k:02d}.png"), img)
        (root / "labels" / "train" / f"{k:02d}.txt").write_text("\n".join(lines) + "\n")
    extra = yaml_extra if yaml_extra is not None else (KPT if task == "pose" else "")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/train\nnames:\n"
                                    + "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES)) + extra)
    return root


def on_paint(task: str, b: dict, r: int, red: np.ndarray, size: int) -> list[float]:
    """The share of row r's mask (on the paint grown by one mask pixel) / rotated box that is painted red and inside the
    row's own box, or per visible
    keypoint 1 when red lies within a pixel of it (they sit just inside the shapes' edges) and it is in the box."""
    import cv2
    from ultralytics.utils.ops import xywhr2xyxyxyxy

    i = int(b["batch_idx"][r])
    own = np.ones((size, size), bool)
    if task != "obb":   # obb: `bboxes` are the rotated boxes themselves
        cx, cy, w, h = (b["bboxes"][r] * size).tolist()
        own[:] = False
        own[max(int(cy - h / 2) - 1, 0):int(cy + h / 2) + 2, max(int(cx - w / 2) - 1, 0):int(cx + w / 2) + 2] = True
    if task == "pose":
        near = [(int(y * size), int(x * size)) for x, y, v in b["keypoints"][r].tolist() if v > 0]
        return [float(own[y, x] and red[i, max(y - 1, 0):y + 2, max(x - 1, 0):x + 2].any()) for y, x in near]
    if task == "obb":
        area = np.zeros((size, size), np.uint8)
        corners = xywhr2xyxyxyxy(b["bboxes"][r:r + 1] * torch.tensor([size] * 4 + [1.0]))[0].numpy()
        cv2.fillPoly(area, [np.round(corners).astype(np.int32)], 1)
    else:
        j = int((b["batch_idx"][:r] == i).sum())   # the row's place among its image's rows: mask value j + 1
        small = (b["masks"][i] == j + 1).numpy().astype(np.uint8)
        area = cv2.resize(small, (size, size), interpolation=cv2.INTER_NEAREST)
        # the trainer draws masks by Ultralytics' rule, which takes mask pixels (ratio x ratio blocks) that only
        # touch the object: judged against the paint and the box grown by one mask pixel; a misplaced mask
        # still falls off them
        ratio = size // small.shape[-1]
        grown = cv2.dilate(red[i].astype(np.uint8), np.ones((2 * ratio + 1,) * 2, np.uint8)) > 0
        shown = area > 0
        box = cv2.dilate(own.astype(np.uint8), np.ones((2 * ratio + 1,) * 2, np.uint8)) > 0
        return [float(min(grown[shown].mean(), box[shown].mean()))] if area.sum() > 20 else []
    shown = area > 0
    return [float(min(red[i][shown].mean(), own[shown].mean()))] if area.sum() > 20 else []
