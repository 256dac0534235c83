"""Painted segment, pose and OBB stores for the loader tests, and the checks that the batches' geometry lands on
the paint: each object is painted in its class's colour (segment and OBB: its polygon or rotated rectangle;
pose: its box, with a dot of each keypoint's own colour on top), on grey noise that is never one of them."""

from __future__ import annotations

import cv2
import numpy as np
from conftest import YoloBuilder
from device_helpers import u8
from store_helpers import run_pack

from fastfeed import Store
from fastfeed.augment import AugmentHyp
from fastfeed.augment.masks import rasterise
from fastfeed.loaders import LoaderConfig, create_loader

CLASS_RGB = np.array([(230, 20, 20), (20, 230, 20), (20, 20, 230)])   # an object's paint, by class
KPT_RGB = np.array([(250, 250, 0), (0, 250, 250), (250, 0, 250)])      # a keypoint's dot, by keypoint
FLIP_IDX = [0, 2, 1]
N_IMAGES = 12


def png_bytes(img: np.ndarray) -> bytes:
    return cv2.imencode(".png", np.ascontiguousarray(img[..., ::-1]))[1].tobytes()


def _fill(img, pts, rgb):
    cv2.fillPoly(img, [np.round((pts - 0.5) * 256).astype(np.int32).reshape(-1, 1, 2)], tuple(int(c) for c in rgb),
                 cv2.LINE_8, 8)


def _line(cls, vals) -> str:
    return " ".join([str(cls), *(f"{v:.6f}" for v in vals)])


def make_task_store(root, task: str, flip_idx=FLIP_IDX, kpt_dims: int = 3) -> Store:
    """N_IMAGES painted PNGs (128x96 / 96x128) with YOLO `task` labels, packed with `--task task` (pose: keypoints
    of `kpt_dims` values, x, y and with 3 a visibility)."""
    names = ["a", "b", "c"]
    b = YoloBuilder(root / "src", names=names)
    if task == "pose":
        (root / "src" / "data.yaml").write_text(f"names: [person]\nkpt_shape: [3, {kpt_dims}]\n"
                                                + (f"flip_idx: {flip_idx}\n" if flip_idx else ""))
    for k in range(N_IMAGES):
        rng = np.random.default_rng(k)
        h, w = (96, 128) if k % 2 else (128, 96)
        img = rng.integers(90, 160, (h, w, 3), dtype=np.uint8)
        lines = []
        for o in range(1 if task == "pose" else 2):
            cls = (k + o) % 3
            cx, cy = w * (0.28 + 0.44 * o) + rng.uniform(-4, 4), h * 0.5 + rng.uniform(-h / 5, h / 5)
            if task == "segment":
                n = int(rng.integers(3, 9))
                ang = np.sort(rng.uniform(0, 2 * np.pi, n)) + np.linspace(0, 0.3, n)
                r = rng.uniform(0.6, 1.0, n) * min(w, h) * 0.2
                pts = np.stack([cx + r * np.cos(ang), cy + r * np.sin(ang)], 1)
                _fill(img, pts, CLASS_RGB[cls])
                lines.append(_line(cls, (pts / [w, h]).ravel()))
            elif task == "obb":
                bw, bh, deg = rng.uniform(18, 30), rng.uniform(8, 14), rng.uniform(0, 180)
                pts = cv2.boxPoints(((cx, cy), (bw, bh), deg)).astype(np.float64)
                _fill(img, pts, CLASS_RGB[cls])
                lines.append(_line(cls, (pts / [w, h]).ravel()))
            else:   # pose: a red box with three dots, keypoint 1 on its left, 2 on its right
                bw, bh = w * 0.5, h * 0.5
                x1, y1 = int(cx - bw / 2), int(cy - bh / 2)
                img[y1:y1 + int(bh), x1:x1 + int(bw)] = CLASS_RGB[0]
                kp = [(x1 + bw / 2, y1 + bh * 0.25), (x1 + bw * 0.2, y1 + bh * 0.6), (x1 + bw * 0.8, y1 + bh * 0.6)]
                for (x, y), rgb in zip(kp, KPT_RGB):
                    img[int(y) - 3:int(y) + 3, int(x) - 3:int(x) + 3] = rgb
                box = [(x1 + bw / 2) / w, (y1 + bh / 2) / h, int(bw) / w, int(bh) / h]
                vals = [v for x, y in kp for v in (int(x) / w, int(y) / h, 2)[:kpt_dims]]
                lines.append(_line(0, box + vals))
        b.add(f"{k:02d}", lines, data=png_bytes(img), ext=".png")
    run_pack(root / "src", root / "s.ff", task=task)
    return Store(root / "s.ff")


def is_colour(images: np.ndarray, rgb, tol: int = 60) -> np.ndarray:
    """[B,3,S,S] uint8 -> bool [B,S,S]: pixels within `tol` of `rgb` on every channel."""
    x = images.astype(int)
    return np.all(np.abs(x - np.asarray(rgb).reshape(1, 3, 1, 1)) <= tol, axis=1)


def row_masks(batch, ratio: int = 1) -> list[np.ndarray]:
    """One bool mask per targets row, from the batch's overlap (int16 [B,h,w]) or per-object masks: [h,w], or
    enlarged to the images' size with the `ratio` they were made at."""
    t, m = batch.targets.numpy(), batch.masks.numpy()
    if m.dtype == np.uint8:
        out = [mi.astype(bool) for mi in m]
    else:
        out = []
        for i, j in enumerate(t[:, 0].astype(int)):
            first = int(np.flatnonzero(t[:, 0] == j)[0])
            out.append(m[j] == i - first + 1)
    if ratio > 1:
        up = np.ones((ratio, ratio), np.uint8)
        out = [np.kron(mi, up).astype(bool) for mi in out]
    return out


def check_masks_on_paint(batches, ratio: int, on_paint: float = 0.75) -> int:
    """Each row's mask lies on its class's paint (the paint's share of its pixels above `on_paint`) and inside its
    box; together they cover the paint. Returns the rows checked."""
    checked = uncovered = total = 0
    for batch in batches:
        images, t = batch.images.numpy(), batch.targets.numpy()
        S, n = images.shape[-1], images.shape[-1] // ratio
        # the share of each mask pixel's ratio x ratio block that is paint
        paint = [is_colour(images, rgb).reshape(-1, n, ratio, n, ratio).mean((2, 4)) for rgb in CLASS_RGB]
        covered = np.zeros((len(images), S // ratio, S // ratio), bool)
        for (j, c, cx, cy, w, h), m in zip(t, row_masks(batch)):
            j, c = int(j), int(c)
            if m.sum() * ratio ** 2 >= 160:   # (smaller ones are a few coarse pixels)
                assert paint[c][j][m].mean() > on_paint, f"the mask of a class {c} object is not on its paint"
                ys, xs = np.nonzero(m)
                xs, ys, r = xs * ratio, ys * ratio, ratio
                x1, y1, x2, y2 = (np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]) * S).tolist()
                assert xs.min() >= x1 - r and xs.max() + r <= x2 + r and ys.min() >= y1 - r and ys.max() + r <= y2 + r, \
                    "a mask reaches out of its box"
                if min(x2 - x1, y2 - y1) >= 12:   # (a sliver's sharp tips hold no pixel centre)
                    assert xs.min() <= x1 + 3 * r + 2 and xs.max() + r >= x2 - 3 * r - 2, "a box wider than its mask"
                checked += 1
            covered[j] |= m
        grown = np.stack([cv2.dilate(cv.astype(np.uint8), np.ones((3, 3), np.uint8)) for cv in covered]).astype(bool)
        for p in paint:
            uncovered += p[~grown].sum()
            total += p.sum()
    assert uncovered <= 0.05 * total, f"{uncovered} of {total} painted pixels under no mask"
    return checked


def check_keypoints_on_dots(batches) -> tuple[int, int]:
    """Every visible keypoint lands on its dot, or (the sample flipped) on the dot flip_idx names; an invisible
    one is 0, 0, 0. Returns (objects seen unflipped, flipped)."""
    plain = flipped = 0
    for batch in batches:
        images, t, kp = batch.images.numpy(), batch.targets.numpy(), batch.keypoints.numpy()
        S = images.shape[-1]
        dots = [is_colour(images, rgb, tol=70) for rgb in KPT_RGB]
        for (j, *_), pts in zip(t, kp):
            on = {}
            for k, (x, y, v) in enumerate(pts):
                if v == 0:
                    assert x == 0 and y == 0, "an invisible keypoint keeps coordinates"
                    continue
                px, py = int(x * S), int(y * S)
                near = slice(max(py - 1, 0), py + 2), slice(max(px - 1, 0), px + 2)
                on[k] = {d for d in range(3) if dots[d][int(j)][near].any()}
            as_is = all(k in dots_k for k, dots_k in on.items())
            swapped = all(FLIP_IDX[k] in dots_k for k, dots_k in on.items())
            assert as_is or swapped, f"keypoints on no dot of their own (or of their flip_idx partner): {on}"
            plain += as_is and not swapped
            flipped += swapped and not as_is
    return plain, flipped


def check_rboxes_on_paint(batches) -> int:
    """Each rotated box covers its class's painted rectangle (IoU-like: most of the box on the paint)."""
    checked = 0
    for batch in batches:
        images, t, rb = batch.images.numpy(), batch.targets.numpy(), batch.rboxes.numpy()
        S = images.shape[-1]
        assert ((rb[:, 4] >= 0) & (rb[:, 4] < np.pi / 2 + 1e-6)).all()
        for (j, c, *_), (cx, cy, w, h, a) in zip(t, rb):
            pts = cv2.boxPoints(((cx * S, cy * S), (w * S, h * S), np.degrees(a)))
            m = rasterise([pts], S, 1, overlap=False)[0].astype(bool)
            if m.sum() < 24:
                continue
            paint = is_colour(images, CLASS_RGB[int(c)])[int(j)]
            assert (m & paint).sum() > 0.7 * m.sum(), "a rotated box is not on its paint"
            checked += 1
    return checked


# --- the task loaders' batches (tests/test_loader_tasks.py, tests/test_augment_optional.py) -------------------

S = 128
HYP = AugmentHyp(mosaic=1.0, degrees=10.0, translate=0.1, scale=0.3, fliplr=0.5, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)


def make_task_stores(root) -> dict:
    """A painted segment, pose and OBB store under `root` (a module fixture's folder)."""
    return {task: make_task_store(root / task, task) for task in ("segment", "pose", "obb")}


def copy(b):
    """A Batch's copy (a batch lives until the next is asked for), images as uint8 (the device loader's are floats
    in [0,1])."""
    images = u8(b.images) if b.images.is_floating_point() else b.images.clone()
    return type(b)(images, b.targets.clone(), b.indices,
                   **{k: v.clone() for k, v in b.extras().items()})


def batches(store, name, tmp_path, epochs=2, **kw):
    """Kept copies of `epochs` epochs of loader `name` over `store` at imgsz S (HYP unless hyp= is given)."""
    opts = {"cache_dir": str(tmp_path)} if name == "shm" else {}
    cfg = LoaderConfig(**{"imgsz": S, "batch_size": 4, "workers": 0, "hyp": HYP, "device": "cpu", **kw})
    with create_loader(name, store, cfg, **opts) as loader:
        got = []
        for e in range(epochs):
            loader.set_epoch(e)
            got += [copy(b) for b in loader]
        return got
