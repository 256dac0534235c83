"""The masks FastfeedSegmentationTrainer trains on are the ones Ultralytics' validator scores against: the same
polygons give, pixel for pixel, what Ultralytics' own dataset code draws from them (resampled to 1,000 points as
its datasets do, then drawn; overlap and per object)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ultralytics")

from ultralytics.cfg import get_cfg  # noqa: E402
from ultralytics.data.utils import polygons2masks, polygons2masks_overlap  # noqa: E402
from ultralytics.utils.ops import resample_segments  # noqa: E402

from fastfeed.augment.masks import rasterise  # noqa: E402
from fastfeed.integrations.ultralytics.args import task_fields  # noqa: E402


def _polygons(seed: int, size: int, n: int = 10):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        c, r = rng.uniform(0, size, 2), rng.uniform(3, size / 4)
        t = np.linspace(0, 2 * np.pi, int(rng.integers(3, 40)), endpoint=False)
        rad = r * rng.uniform(0.5, 1.0, len(t))
        out.append(np.clip(np.stack([c[0] + rad * np.cos(t), c[1] + rad * np.sin(t)], 1), 0, size).astype(np.float32))
    return out


@pytest.mark.parametrize("ratio", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_segment_trainers_masks_are_ultralytics_own_for_the_same_polygons(seed, ratio):
    size = 128
    polygons = _polygons(seed, size)
    dense = resample_segments([p.copy() for p in polygons])                  # what its datasets hold
    theirs = polygons2masks((size, size), [p.reshape(-1) for p in dense], 1, ratio)
    np.testing.assert_array_equal(rasterise(polygons, size, ratio, False, rule="ultralytics"), theirs)
    over, order = polygons2masks_overlap((size, size), np.stack(dense), ratio)
    ours = rasterise(polygons, size, ratio, True, rule="ultralytics")
    # Ultralytics reorders the objects (largest first) and numbers them in that order; fastfeed keeps the targets'
    # order and numbers by it: the same pixels, renamed
    renamed = np.zeros_like(ours)
    for k, j in enumerate(order):
        renamed[over == k + 1] = j + 1
    np.testing.assert_array_equal(ours, renamed)
    # the exact (centre) rule differs: it is what the trainer must not use
    assert not np.array_equal(rasterise(polygons, size, ratio, False), theirs)


def test_the_segment_trainer_asks_for_ultralytics_mask_rule():
    args = get_cfg(overrides={"mask_ratio": 4, "overlap_mask": True})
    assert task_fields(args, "segment") == {"task": "segment", "mask_ratio": 4, "overlap_mask": True,
                                            "mask_rule": "ultralytics"}
    assert task_fields(args, "pose") == {"task": "pose"} and task_fields(args, "detect") == {"task": "detect"}


@pytest.mark.parametrize(("imgsz", "fliplr"), [(128, 0.0), (128, 1.0), (64, 1.0), (160, 0.0)])
def test_with_augmentation_off_the_segment_feed_is_ultralytics_own_dataset(tmp_path, imgsz, fliplr):
    """Pack, decode, letterbox, (flip) and mask, end to end: with the random geometry off (mosaic, scale,
    translate, HSV; fliplr 0 or always), fastfeed's segment training samples are what Ultralytics' own training
    dataset makes of the same files: the same image pixels (PNG files, resized down, not at all, and up; a JPEG
    decodes at a DCT scale here and differs by resampling), the same boxes, and each object's mask the same pixels.
    (Under augmentation the two draw different random numbers; benchmarks/seg_targets.py compares their statistics.)"""
    from ultra_task_data import make_set
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.utils import DEFAULT_CFG

    from fastfeed import Store
    from fastfeed.integrations.ultralytics.args import augment_hyp
    from fastfeed.loaders import LoaderConfig, create_loader
    from fastfeed.pack import PackConfig, pack

    root = make_set(tmp_path / "seg", "segment")
    pack(PackConfig(src=root / "data.yaml", split="train", out=tmp_path / "seg.ff", progress=False, task="segment"))
    args = get_cfg(DEFAULT_CFG, overrides={"task": "segment", "imgsz": imgsz, "mosaic": 0.0, "scale": 0.0,
                                           "translate": 0.0, "fliplr": fliplr, "hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0,
                                           "augmentations": []})   # no Albumentations either side
    theirs = build_yolo_dataset(args, str(root / "images" / "train"), 4, {"names": ["a", "b"], "nc": 2, "channels": 3},
                                mode="train")
    by_name = {p.rsplit("/", 1)[-1]: k for k, p in enumerate(theirs.im_files)}
    store = Store(tmp_path / "seg.ff")
    cfg = LoaderConfig(imgsz=imgsz, batch_size=4, workers=0, shuffle=False, hyp=augment_hyp(args),
                       **task_fields(args, "segment"))
    compared = 0
    with create_loader("cpu", store, cfg) as loader:
        loader.set_epoch(0)
        for b in loader:
            for k, i in enumerate(b.indices.tolist()):
                u = theirs[by_name[store.record(i, check_crc=False).file_name.rsplit("/", 1)[-1]]]
                np.testing.assert_array_equal(b.images[k].numpy(), u["img"].numpy())
                rows = b.targets[b.targets[:, 0] == k, 2:].numpy()
                ub = u["bboxes"].numpy()
                assert len(rows) == len(ub) == 2
                for j, row in enumerate(rows):
                    (m,) = np.flatnonzero(np.abs(ub - row).max(1) < 1e-4)     # the same box, in their order
                    np.testing.assert_array_equal(b.masks[k].numpy() == j + 1, u["masks"][0].numpy() == m + 1)
                    assert (b.masks[k].numpy() == j + 1).sum() >= 8                   # a real object, not two empties
                compared += 1
    assert compared == len(store) == 8
