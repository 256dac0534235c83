"""tools/show_batch.py draws each task's geometry where the batch puts it: masks tinted over their pixels only,
keypoints as dots (hidden ones not), rotated boxes along their rotated edges."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("show_batch", REPO / "tools" / "show_batch.py")
show_batch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(show_batch)

S = 64
GREY = 100


def _images(b: int) -> np.ndarray:
    return np.full((b, 3, S, S), GREY, np.uint8)


def _changed(grid: np.ndarray, i: int, cols: int) -> np.ndarray:
    """[S, S] bool: the pixels of tile i that are no longer the grey background."""
    r, c = divmod(i, cols)
    return (grid[r * S:(r + 1) * S, c * S:(c + 1) * S] != GREY).any(-1)


def test_overlap_masks_tint_each_objects_pixels_in_its_class_colour():
    # image 0: two objects (rows 0, 1); image 1: one (row 2). Masks at 1/4: 16 x 16.
    targets = np.float32([[0, 0, .9, .9, .01, .01], [0, 1, .9, .9, .01, .01], [1, 2, .9, .9, .01, .01]])
    masks = np.zeros((2, 16, 16), np.int16)
    masks[0, 0:4, 0:4] = 1          # image 0's first object: pixels 0..15
    masks[0, 8:12, 0:4] = 2         # its second: rows 32..47
    masks[1, 0:4, 8:12] = 1         # image 1's object: columns 32..47
    grid = show_batch.draw_batch(_images(2), targets, ["a", "b", "c"], cols=2, masks=masks)
    tile0, tile1 = grid[:S, :S], grid[:S, S:2 * S]
    for tile, (ys, xs), cls in ((tile0, (slice(2, 14), slice(2, 14)), 0), (tile0, (slice(34, 46), slice(2, 14)), 1),
                                (tile1, (slice(2, 14), slice(34, 46)), 2)):
        px = tile[ys, xs].reshape(-1, 3).astype(float)
        want = GREY * (1 - show_batch.MASK_ALPHA) + np.float32(show_batch._PALETTE[cls]) * show_batch.MASK_ALPHA
        np.testing.assert_allclose(px, np.broadcast_to(want, px.shape), atol=1)
    assert not _changed(grid, 0, 2)[16:30, 2:30].any()      # between and beside the masks: untouched
    assert not _changed(grid, 1, 2)[2:14, 2:30].any()        # image 0's masks are not drawn on image 1


def test_per_object_masks_are_indexed_by_target_row():
    targets = np.float32([[0, 0, .9, .9, .01, .01], [1, 1, .9, .9, .01, .01]])
    masks = np.zeros((2, 16, 16), np.uint8)
    masks[1, 0:4, 0:4] = 1          # row 1 belongs to image 1
    grid = show_batch.draw_batch(_images(2), targets, ["a", "b"], cols=2, masks=masks)
    assert _changed(grid, 1, 2)[2:14, 2:14].all()
    assert not _changed(grid, 0, 2)[2:30, 2:30].any()     # (the 2-pixel tile border aside)


def test_visible_keypoints_are_dots_and_hidden_ones_are_not_drawn():
    targets = np.float32([[0, 0, .5, .5, .02, .02]])
    kpts = np.float32([[[.25, .25, 2], [.75, .25, 0], [.25, .75, 1]]])
    grid = show_batch.draw_batch(_images(1), targets, ["p"], cols=1, keypoints=kpts)
    drawn = _changed(grid, 0, 1)
    assert drawn[16, 16] and drawn[48, 16]        # visible (2) and occluded-but-labelled (1)
    assert not drawn[12:20, 44:52].any()           # visibility 0: nothing there


def test_skeleton_joins_coco_keypoints_only_when_asked():
    targets = np.float32([[0, 0, .5, .5, .02, .02]])
    kpts = np.zeros((1, 17, 3), np.float32)
    kpts[0, 5] = [.2, .5, 2]                      # left shoulder -- right shoulder: a COCO skeleton edge
    kpts[0, 6] = [.8, .5, 2]
    with_lines = _changed(show_batch.draw_batch(_images(1), targets, ["p"], cols=1, keypoints=kpts), 0, 1)
    dots = _changed(show_batch.draw_batch(_images(1), targets, ["p"], cols=1, keypoints=kpts, skeleton=False), 0, 1)
    assert with_lines[32, 24:40].all() and not dots[32, 24:28].any()


@pytest.mark.parametrize("angle", [0.0, np.pi / 4])
def test_rotated_boxes_are_drawn_along_their_rotated_edges(angle):
    targets = np.float32([[0, 0, .5, .5, .6, .6]])
    rboxes = np.float32([[.5, .5, .5, .5, angle]])
    drawn = _changed(show_batch.draw_batch(_images(1), targets, ["x"], cols=1, rboxes=rboxes), 0, 1)
    if angle == 0:
        assert drawn[16, 20:44].all() and drawn[20:44, 16].all()
    else:                                          # a diamond: its corners on the axes through the centre
        r = round(0.5 * S / np.sqrt(2))             # 23: corners at 9 and 55 on each axis
        for y, x in ((32, 32 - r), (32 - r, 32), (32, 32 + r), (32 + r, 32)):
            assert drawn[y - 1:y + 2, x - 1:x + 2].any()
        assert not drawn[16, 16] and not drawn[47, 47]   # where the upright box's corners would be
    assert not drawn[28:36, 28:36].any()           # the inside stays clear


def test_show_batch_on_a_segment_store_tints_exactly_where_the_loaders_masks_are(tmp_path):
    import subprocess
    import sys

    import cv2
    from conftest import YoloBuilder
    from store_helpers import run_pack

    from fastfeed import Store
    from fastfeed.loaders import LoaderConfig, create_loader

    b = YoloBuilder(tmp_path / "y", names=["a"])
    for k in range(2):
        b.add(str(k), ["0 0.1 0.2 0.5 0.2 0.45 0.6 0.15 0.55"], seed=k)
    run_pack(tmp_path / "y", tmp_path / "seg.ff", task="segment")
    png = tmp_path / "b.png"
    run = subprocess.run([sys.executable, str(REPO / "tools" / "show_batch.py"), "--data", str(tmp_path / "seg.ff"),
                          "-o", str(png), "--imgsz", "64", "--batch", "2", "--no-augment"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "task segment, 2 images, 2 boxes, masks [2, 16, 16]" in run.stdout
    cfg = LoaderConfig(imgsz=64, batch_size=2, workers=0, augment=False, drop_last=False)
    with create_loader("cpu", Store(tmp_path / "seg.ff"), cfg) as loader:
        batch = next(iter(loader))
    masks = batch.masks.numpy()
    assert (masks > 0).sum() > 20                              # the polygon is there to be drawn
    plain = show_batch.draw_batch(batch.images.numpy(), batch.targets.numpy(), ["a"])
    drawn = cv2.cvtColor(cv2.imread(str(png)), cv2.COLOR_BGR2RGB)
    diff = (drawn != plain).any(-1)
    for i in range(2):
        on = cv2.resize((masks[i] > 0).astype(np.uint8), (S, S), interpolation=cv2.INTER_NEAREST).astype(bool)
        tile = diff[:S, i * S:(i + 1) * S]
        assert tile[on].mean() > 0.9 and not tile[~on].any()   # tinted inside the mask, nothing else changed
