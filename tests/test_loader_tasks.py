"""The cpu and shm loaders carry a segment, pose or OBB store's geometry into the Batch (issue 28): after mosaic,
affine and flip, masks cover their objects' paint, keypoints land on their dots (left and right swapped by flip_idx
when flipped), rotated boxes on their painted rectangles; the batch contract; what the other loaders refuse; task='detect': any store's boxes alone."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
import torch
from loader_checks import make_painted_store
from store_helpers import run_pack
from task_stores import (
    HYP,
    N_IMAGES,
    S,
    batches,
    check_keypoints_on_dots,
    check_masks_on_paint,
    check_rboxes_on_paint,
    make_task_store,
    make_task_stores,
)

from fastfeed import Store
from fastfeed.loaders import LoaderConfig, UnsupportedTask, create_loader
from fastfeed.prefetch import DevicePrefetcher

LOADERS = ["cpu", "shm"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    return make_task_stores(tmp_path_factory.mktemp("tasks"))


def rows_of(b):
    return np.bincount(b.targets[:, 0].long().numpy(), minlength=len(b.images))


@pytest.mark.parametrize("name", LOADERS)
@pytest.mark.parametrize("overlap,ratio", [(True, 1), (False, 2), (True, 4)])
def test_segment_masks_cover_their_objects_paint(stores, tmp_path, name, overlap, ratio):
    got = batches(stores["segment"], name, tmp_path, overlap_mask=overlap, mask_ratio=ratio)
    for b in got:
        assert set(b.extras()) == {"masks"}
        if overlap:
            assert b.masks.dtype == torch.int16 and b.masks.shape == (len(b.images), S // ratio, S // ratio)
            for j, n in enumerate(rows_of(b)):
                assert int(b.masks[j].max()) <= n        # value v: the image's v-th row of targets
        else:
            assert b.masks.dtype == torch.uint8 and b.masks.shape == (len(b.targets), S // ratio, S // ratio)
    assert check_masks_on_paint(got, ratio) > 20


@pytest.mark.parametrize("name", LOADERS)
def test_pose_keypoints_land_on_their_dots_and_a_flip_swaps_left_and_right(stores, tmp_path, name):
    got = batches(stores["pose"], name, tmp_path, epochs=3)
    for b in got:
        assert set(b.extras()) == {"keypoints"}
        assert b.keypoints.dtype == torch.float32 and b.keypoints.shape == (len(b.targets), 3, 3)
    plain, flipped = check_keypoints_on_dots(got)
    assert plain >= 3 and flipped >= 3           # fliplr 0.5: both seen, each with its keypoints on the right dots


def test_pose_without_flip_idx_is_not_flipped_and_says_so(tmp_path, caplog):
    store = make_task_store(tmp_path, "pose", flip_idx=None)
    with caplog.at_level(logging.WARNING, logger="fastfeed.loaders.base"):
        got = batches(store, "cpu", tmp_path, epochs=2)
    assert "has no flip_idx: hyp.fliplr=0.5 set to 0" in caplog.text and str(store.path) in caplog.text
    plain, flipped = check_keypoints_on_dots(got)
    assert plain >= 6 and flipped == 0



def test_two_value_keypoints_hidden_by_the_augmentation_read_as_hidden(tmp_path):
    """kpt_shape [K, 2]: the batch gives them a visibility, as Ultralytics' dataset does (its loss counts every
    two-value keypoint): before, one the mosaic moved off the image was a labelled keypoint at 0, 0."""
    got = batches(make_task_store(tmp_path, "pose", kpt_dims=2), "cpu", tmp_path, epochs=2)
    kp = torch.cat([b.keypoints for b in got])
    assert kp.shape[1:] == (3, 3) and (kp[..., 2] == 0).any() and (kp[..., 2] == 1).any()
    plain, flipped = check_keypoints_on_dots(got)
    assert plain >= 3 and flipped >= 3

@pytest.mark.parametrize("task, read", [("segment", "detect"), ("pose", None), ("obb", None)])
def test_copy_paste_of_batches_without_polygons_is_off_and_says_so(stores, tmp_path, caplog, task, read):
    """copy_paste pastes objects by their polygons: before, batches without any (a store read as detect, a pose or
    OBB store) pasted nothing without a word."""
    hyp = replace(HYP, copy_paste=0.5)
    with caplog.at_level(logging.WARNING, logger="fastfeed.loaders.base"):
        cfg = LoaderConfig(imgsz=S, batch_size=4, workers=0, hyp=hyp, task=read).for_store(stores[task])
    assert cfg.hyp.copy_paste == 0 and cfg.hyp.mosaic == HYP.mosaic
    assert "carry no polygons: hyp.copy_paste=0.5 set to 0" in caplog.text and str(stores[task].path) in caplog.text
    assert LoaderConfig(hyp=hyp).for_store(stores["segment"]).hyp.copy_paste == 0.5


@pytest.mark.parametrize("name", LOADERS)
def test_obb_rotated_boxes_lie_on_their_painted_rectangles(stores, tmp_path, name):
    got = batches(stores["obb"], name, tmp_path)
    for b in got:
        assert set(b.extras()) == {"rboxes"}
        assert b.rboxes.dtype == torch.float32 and b.rboxes.shape == (len(b.targets), 5)
    assert check_rboxes_on_paint(got) > 20


@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_worker_processes_and_evaluation_batches_carry_the_same_contract(stores, tmp_path, task):
    """Through the worker pool (results over the queue, overlap masks in the shared slot) and letterboxed."""
    got = batches(stores[task], "cpu", tmp_path, epochs=1, workers=2)
    evals = batches(stores[task], "cpu", tmp_path, epochs=1, workers=0, augment=False, overlap_mask=False)
    assert sum(len(b.images) for b in got) == sum(len(b.images) for b in evals) == N_IMAGES
    if task == "segment":
        assert check_masks_on_paint(got, 4) > 5 and check_masks_on_paint(evals, 4) > N_IMAGES
        assert sum(len(b.targets) for b in evals) == sum(len(b.masks) for b in evals) == 2 * N_IMAGES
    elif task == "pose":
        assert sum(check_keypoints_on_dots(evals)) == N_IMAGES and sum(check_keypoints_on_dots(got)) > 5
        assert check_keypoints_on_dots(evals)[1] == 0
    else:
        assert check_rboxes_on_paint(got) > 5 and check_rboxes_on_paint(evals) == 2 * N_IMAGES


def test_the_prefetcher_hands_out_the_geometry_and_a_detect_batch_has_none(stores, tmp_path):
    cfg = LoaderConfig(imgsz=S, batch_size=4, workers=0, hyp=HYP, device="cpu")
    with create_loader("cpu", stores["pose"], cfg) as loader:
        b = next(iter(DevicePrefetcher(loader, "cpu")))
        assert b.images.dtype == torch.float32 and b.keypoints.shape == (len(b.targets), 3, 3)
    with create_loader("cpu", make_painted_store(tmp_path), cfg) as loader:
        b = next(iter(loader))
        assert b.extras() == {} and "masks" not in repr(b)


def test_loaders_that_cannot_carry_the_geometry_refuse_by_name(stores):
    cfg = LoaderConfig(imgsz=S, batch_size=4, workers=0, device="cpu")
    where = stores["segment"].path
    with pytest.raises(UnsupportedTask, match=f"the dali loader cannot carry the polygons of segment store {where}; "
                                              "use the cpu, shm or device loader, or task='detect' for its boxes alone"):
        create_loader("dali", stores["segment"], cfg)
    with pytest.raises(UnsupportedTask, match="device_augment cannot flip the keypoints of a store of pose labels: leave it "
                                              r"False \(the workers flip them\), or read its boxes alone \(task='detect'\)"):
        create_loader("cpu", stores["pose"], LoaderConfig(imgsz=S, batch_size=4, device_augment=True))


@pytest.fixture(scope="module")
def detect_twins(stores):
    """Each task store's source packed again as a detect store (boxes alone)."""
    out = {}
    for task, store in stores.items():
        src = store.path.parent / "src"
        run_pack(src, store.path.parent / "d.ff", task="detect")
        out[task] = Store(store.path.parent / "d.ff")
    return out


@pytest.mark.parametrize("name", ["cpu", "shm", "device"])
@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_task_detect_reads_a_task_store_as_its_detect_twin(stores, detect_twins, tmp_path, name, task):
    """task='detect': a task store's batches are boxes alone, pixel for pixel and row for row those of the same
    dataset packed for detection; nothing else drawn."""
    got = batches(stores[task], name, tmp_path, task="detect")
    twin = batches(detect_twins[task], name, tmp_path)
    assert len(got) == len(twin) == 2 * (N_IMAGES // 4)
    for a, b in zip(got, twin):
        assert a.extras() == {} and torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets)
        assert np.array_equal(a.indices, b.indices)
    assert sum(len(b.targets) for b in got) > N_IMAGES


def test_task_detect_lets_the_device_flip_a_task_stores_boxes(stores):
    cfg = LoaderConfig(imgsz=S, batch_size=4, workers=0, hyp=HYP, device="cpu", device_augment=True, task="detect")
    with create_loader("cpu", stores["pose"], cfg) as loader:
        assert loader.task == "detect" and loader.cfg.task == "detect"
        b = next(iter(DevicePrefetcher(loader, "cpu")))
        assert b.extras() == {} and len(b.targets) > 0


def test_a_task_the_store_does_not_hold_is_refused_by_name(stores, detect_twins):
    cfg = LoaderConfig(imgsz=S, batch_size=4, workers=0, device="cpu", task="segment")
    with pytest.raises(ValueError, match=f"LoaderConfig.task 'segment': {detect_twins['segment'].path} is a store of "
                                         "detect labels; .* pack the dataset with --task segment for polygons"):
        create_loader("cpu", detect_twins["segment"], cfg)
    with pytest.raises(ValueError, match="LoaderConfig.task 'segment': .* is a store of pose labels"):
        create_loader("shm", stores["pose"], cfg)
    with pytest.raises(ValueError, match="LoaderConfig.task must be None .* or one of detect, segment, pose, obb, "
                                         "got 'seg'"):
        LoaderConfig(task="seg")
    with create_loader("cpu", stores["obb"], LoaderConfig(imgsz=S, batch_size=4, workers=0, task="obb")) as loader:
        assert loader.task == "obb" and set(next(iter(loader)).extras()) == {"rboxes"}


@pytest.mark.parametrize("field,value,rule", [("mask_ratio", 3, "must be an integer >= 1 dividing imgsz 128"),
                                              ("mask_ratio", 0, "must be an integer >= 1"),
                                              ("overlap_mask", 1, "must be True or False")])
def test_mask_settings_are_checked_by_name(field, value, rule):
    with pytest.raises(ValueError, match=f"LoaderConfig.{field} {rule}"):
        LoaderConfig(imgsz=S, **{field: value})

