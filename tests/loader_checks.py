"""Checks every loader must pass, shared by the cpu, shm and dali loader tests."""

from __future__ import annotations

import numpy as np
import torch

from fastfeed.augment import AugmentHyp

RED = (230, 20, 20)


def painted(k: int, h: int, w: int):
    """Grey noise (never red) with one red rectangle whose place depends on k; returns (img, COCO box)."""
    rng = np.random.default_rng(k)
    img = rng.integers(90, 160, (h, w, 3), dtype=np.uint8)
    x1, y1 = 10 + (k * 7) % (w // 2), 8 + (k * 5) % (h // 2)
    bw, bh = w // 4 + k % 9, h // 4 + k % 7
    img[y1:y1 + bh, x1:x1 + bw] = RED
    return img, [x1, y1, bw, bh]


def make_painted_store(root, store: str = "raw", tag: str = ""):
    """24 painted images (160x120 / 120x160), one red box each, packed into root/s.ff. `raw` (the default):
    exact pixels, no JPEG ringing at the edges, for box checks; `original`: the JPEGs, for decoders. `tag`, added
    to the class names, gives the store a fingerprint of its own (and so its own shm cache segment)."""
    from conftest import CocoBuilder, jpeg_bytes
    from store_helpers import run_pack

    from fastfeed import Store

    b = CocoBuilder(root / "src", categories=((1, f"person{tag}"), (3, f"car{tag}"), (18, f"dog{tag}")))
    for k in range(24):
        h, w = (120, 160) if k % 2 else (160, 120)
        img, box = painted(k, h, w)
        b.add_image(f"{k:02d}.jpg", h, w, data=jpeg_bytes(img, 97), boxes=[((1, 3, 18)[k % 3], box)])
    run_pack(b.write(), root / "s.ff", store=store)
    return Store(root / "s.ff")


def red_mask(images: torch.Tensor) -> np.ndarray:
    """Pixels of the red paint the test stores put on each image (uint8 [B,3,S,S] -> bool [B,S,S])."""
    x = images.cpu().numpy().astype(int)
    return (x[:, 0] > 180) & (x[:, 1] < 80) & (x[:, 2] < 80)


def assert_batch_contract(batches, size: int, nc: int, total: int) -> None:
    """uint8 [B,3,S,S] contiguous images; float32 [M,6] targets with valid indices, classes and boxes."""
    for images, targets in batches:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, size, size) and images.is_contiguous()
        assert targets.dtype == torch.float32 and targets.shape[1] == 6
        b = len(images)
        assert ((targets[:, 0] >= 0) & (targets[:, 0] < b)).all() and (targets[:, 0] == targets[:, 0].round()).all()
        assert ((targets[:, 1] >= 0) & (targets[:, 1] < nc)).all()
        assert ((targets[:, 2:] >= 0) & (targets[:, 2:] <= 1)).all()
    assert sum(len(i) for i, _ in batches) == total


def assert_boxes_frame_paint(batches, size: int, min_boxes: int = 20) -> None:
    """Every target box frames red paint (inside its 1-px border, which a resize may blend), and
    almost no red is left outside the boxes.

    What is left unboxed are the slivers the box filter drops on purpose (less than 10% of an object
    left visible after a crop, or a side of <= 2 px).
    """
    seen = uncovered = total = 0
    for images, targets in batches:
        red = red_mask(images)
        covered = np.zeros_like(red)
        for j, _, cx, cy, w, h in targets.tolist():
            box = np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]) * size
            x1, y1, x2, y2 = box.round().astype(int)
            # the pixels wholly inside the box, less the 1-px rim a resize may blend (on boxes wider than 4 px)
            ix1, iy1, ix2, iy2 = np.ceil(box[:2] - 1e-3).astype(int).tolist() + np.floor(box[2:] + 1e-3).astype(int).tolist()
            mx, my = int(ix2 - ix1 > 4), int(iy2 - iy1 > 4)
            inner = red[int(j), iy1 + my:iy2 - my, ix1 + mx:ix2 - mx]
            assert inner.size and inner.mean() > 0.85, f"box {x1, y1, x2, y2} of image {int(j)} does not frame paint"
            covered[int(j), max(y1 - 1, 0):y2 + 1, max(x1 - 1, 0):x2 + 1] = True
            seen += 1
        uncovered += (red & ~covered).sum()
        total += red.sum()
    assert uncovered <= 0.04 * total and seen > min_boxes


def assert_a_killed_worker_raises(loader) -> None:
    """SIGKILL one of the loader's workers mid-epoch: the next batches raise WorkerError (never a hang), and
    close() is idempotent and leaves no worker."""
    import os
    import signal

    import pytest

    from fastfeed.loaders import WorkerError

    it = iter(loader)
    next(it)
    os.kill(loader.memory_pids()[0], signal.SIGKILL)
    with pytest.raises(WorkerError, match="exited unexpectedly with code -9"):
        for _ in range(40):
            next(it)
    loader.close()
    loader.close()
    assert loader.memory_pids() == []


def collect_batches(loader, epoch=0):
    loader.set_epoch(epoch)
    return [(b.images.clone(), b.targets.clone()) for b in loader]


NO_COLOUR = AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0)  # keeps the paint colour exact for box checks
