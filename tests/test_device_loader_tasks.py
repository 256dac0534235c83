"""The device loader on segment, pose and OBB stores (on the CPU, as every device-loader test): each task's
boxes by the cpu loader's rule (a segmented object's box rebuilt from its moved polygon), overlap masks,
keypoints and rotated boxes on the paint, the letterbox path equal to the cpu loader's, and what it refuses."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
import torch
from device_helpers import u8
from task_stores import CLASS_RGB, check_keypoints_on_dots, check_rboxes_on_paint, is_colour, make_task_store, row_masks
from task_stores import HYP as PAINT_HYP

from fastfeed.augment import AugmentHyp
from fastfeed.batch import Batch
from fastfeed.loaders import LoaderConfig, UnsupportedTask, create_loader

HYP = AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, degrees=15, shear=3, fliplr=0.5, flipud=0.3)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    out = {}
    for task in ("segment", "pose", "obb"):
        (root / task).mkdir()
        out[task] = make_task_store(root / task, task)
    return out


def batches(name, store, cfg, epochs=(0, 1), **options):
    """Every batch of `epochs`, images as uint8 (the device loader's are floats in [0,1]), tensors cloned."""
    out = []
    with create_loader(name, store, cfg, **options) as loader:
        for e in epochs:
            loader.set_epoch(e)
            for b in loader:
                images = u8(b.images) if name == "device" else b.images.clone()
                out.append(Batch(images, b.targets.clone(), b.indices,
                                 **{k: v.clone() for k, v in b.extras().items()}))
    return out


def matched(a: torch.Tensor, b: torch.Tensor, tol: float) -> int:
    """Rows of targets `a` with a row of `b` of the same image and class within `tol` on every coordinate."""
    if not len(a) or not len(b):
        return 0
    near = (a[:, None, 2:] - b[None, :, 2:]).abs().amax(-1) <= tol
    return int((near & (a[:, None, :2] == b[None, :, :2]).all(-1)).any(1).sum())


def on_paint(batches, ratio: int) -> float:
    """The share of all mask pixels (at full size) that lie on their object's class paint."""
    on = total = 0
    for b in batches:
        paint = [is_colour(b.images.numpy(), rgb) for rgb in CLASS_RGB]
        for (j, c, *_), m in zip(b.targets.numpy(), row_masks(b, ratio)):
            on, total = on + (m & paint[int(c)][int(j)]).sum(), total + m.sum()
    return on / max(total, 1)


def test_segment_boxes_and_masks_are_the_cpu_loaders_and_lie_on_the_paint(stores):
    """Same seed: the cpu loader's boxes (rebuilt from the moved polygons) within a pixel (it snaps each tile's
    crop to whole pixels, this one samples the exact map) and its overlap masks."""
    cfg = LoaderConfig(imgsz=128, batch_size=4, workers=2, hyp=HYP, seed=5)
    dev = batches("device", stores["segment"], cfg, partner_buffer=8)
    cpu = batches("cpu", stores["segment"], cfg, partner_buffer=8)
    n_dev, n_cpu = sum(len(b.targets) for b in dev), sum(len(b.targets) for b in cpu)
    both = sum(matched(a.targets, b.targets, 1.5 / 128) for a, b in zip(dev, cpu))
    assert n_dev > 20 and both >= 0.9 * max(n_dev, n_cpu), (n_dev, n_cpu, both)
    assert all(b.masks.dtype == torch.int16 and b.masks.shape == (len(b.images), 32, 32) for b in dev)
    same = sum((a.masks == b.masks).sum().item() for a, b in zip(dev, cpu)) / sum(a.masks.numel() for a in dev)
    assert same > 0.99
    assert on_paint(dev, 4) > 0.8


@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_perspective_and_bgr_are_the_cpu_loaders(stores, task):
    """perspective (the sampling map divided by its last row) and bgr (the channels of the samples drawn, after
    HSV) rendered on the device: the cpu loader's targets, masks, keypoints and corners for the same seed, its
    pixels within a few levels (the two bilinear samplers differ by rounding), and the objects on their paint."""
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=0, seed=6, hyp=replace(PAINT_HYP, perspective=0.001),
                       mask_ratio=4)
    dev, cpu = batches("device", stores[task], cfg), batches("cpu", stores[task], cfg)
    both = sum(matched(a.targets, b.targets, 1.5 / 96) for a, b in zip(dev, cpu))
    n = sum(len(b.targets) for b in cpu)
    assert n > 20 and both >= 0.9 * n, (n, both)
    if task == "segment":
        assert on_paint(dev, 4) > 0.8
    elif task == "pose":
        assert min(check_keypoints_on_dots(dev)) > 1
    else:
        assert check_rboxes_on_paint(dev) > 10
    cfg = replace(cfg, hyp=replace(cfg.hyp, bgr=0.5))
    dev, cpu = batches("device", stores[task], cfg), batches("cpu", stores[task], cfg)
    assert all(torch.equal(a.targets, b.targets) for a, b in zip(dev, cpu))   # bgr moves no label

    def off(x, y):
        return (x.int() - y.int()).abs().float().mean((1, 2, 3))

    for a, b in zip(dev, cpu):   # each sample in the cpu loader's channel order, not the other
        tell = off(b.images, b.images.flip(1)) > 2
        assert (off(a.images, b.images)[tell] < 2).all() and (off(a.images, b.images.flip(1))[tell] > 2).all()


def test_pose_keypoints_land_on_their_dots_and_flip_by_flip_idx(stores):
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=2, hyp=HYP, seed=2)
    dev = batches("device", stores["pose"], cfg)
    assert all(b.keypoints.shape == (len(b.targets), 3, 3) for b in dev)
    plain, flipped = check_keypoints_on_dots(dev)
    assert plain > 3 and flipped > 3


def test_obb_rotated_boxes_lie_on_the_paint(stores):
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=2, hyp=HYP, seed=4)
    dev = batches("device", stores["obb"], cfg)
    assert all(b.rboxes.shape == (len(b.targets), 5) for b in dev)
    assert check_rboxes_on_paint(dev) > 10


@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_letterbox_batches_are_the_cpu_loaders(stores, task):
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=0, augment=False, shuffle=False, drop_last=False)
    dev, cpu = batches("device", stores[task], cfg, epochs=(0,)), batches("cpu", stores[task], cfg, epochs=(0,))
    assert len(dev) == len(cpu) == 3
    for a, b in zip(dev, cpu):
        assert torch.equal(a.targets, b.targets)
        assert a.extras().keys() == b.extras().keys() and len(a.extras()) == 1
        for k, v in a.extras().items():
            assert torch.allclose(v.float(), b.extras()[k].float(), atol=1e-6), k


def test_per_object_masks_are_refused_by_name(stores):
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=0, overlap_mask=False)
    with pytest.raises(UnsupportedTask, match="overlap_mask=True.*cpu or shm loader.*s.ff"):
        create_loader("device", stores["segment"], cfg)
    with create_loader("device", stores["segment"], replace(cfg, task="detect")) as loader:   # no masks: no refusal
        assert next(iter(loader)).extras() == {}


def test_a_pose_store_without_flip_idx_is_not_flipped(tmp_path, caplog):
    store = make_task_store(tmp_path, "pose", flip_idx=None)
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=0, hyp=AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, fliplr=1.0),
                       seed=1)
    with caplog.at_level(logging.WARNING):
        dev = batches("device", store, cfg, epochs=(0,))
    assert "no flip_idx" in caplog.text
    plain, flipped = check_keypoints_on_dots(dev)
    assert plain > 3 and flipped == 0
    assert np.isfinite(torch.cat([b.keypoints for b in dev]).numpy()).all()
