"""A FastfeedTrainer batch against one from Ultralytics' own training dataloader, built the way each
trainer builds it (`trainer.get_dataloader(..., mode="train")`) on the same data: same keys, dtypes,
shapes and coordinate conventions, and in both every box frames its painted object."""

from __future__ import annotations

from pathlib import Path

import cv2
import pytest
import torch
from ultra_data import NO_COLOUR, as_targets, first_batches, painted_yolo, train_loader_of  # noqa: F401  (painted_yolo: a fixture)

pytest.importorskip("ultralytics")

from loader_checks import assert_boxes_frame_paint  # noqa: E402
from ultralytics.models.yolo.detect import DetectionTrainer  # noqa: E402

from fastfeed.integrations.ultralytics import FastfeedTrainer, FastfeedTrainLoader  # noqa: E402

SIZE = 128


@pytest.fixture(scope="module")
def both(painted_yolo, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("runs")
    ul_trainer, ul = train_loader_of(DetectionTrainer, painted_yolo, tmp, **NO_COLOUR)
    ff_trainer, ff = train_loader_of(FastfeedTrainer, painted_yolo, tmp, **NO_COLOUR)
    assert isinstance(ff, FastfeedTrainLoader) and not isinstance(ul, FastfeedTrainLoader)
    yield first_batches(ul, 6), first_batches(ff, 6), ul, ff
    ff.close()


def test_same_keys_dtypes_shapes_and_conventions(both):
    ul_batches, ff_batches, _, _ = both
    for ul, ff in zip(ul_batches, ff_batches):
        assert sorted(ff) == sorted(ul)
        b = len(ff["img"])
        for key in ("img", "cls", "bboxes", "batch_idx"):
            assert ff[key].dtype == ul[key].dtype, key
            assert ff[key].ndim == ul[key].ndim and ff[key].shape[1:] == ul[key].shape[1:], key
        assert ff["img"].dtype == torch.uint8 and ff["img"].shape == (b, 3, SIZE, SIZE) == ul["img"].shape
        m = len(ff["batch_idx"])
        assert ff["cls"].shape == (m, 1) and ff["bboxes"].shape == (m, 4)
        for key in ("im_file", "ori_shape", "resized_shape", "ratio_pad"):
            assert type(ff[key]) is type(ul[key]) and len(ff[key]) == b == len(ul[key]), key
        assert ff["resized_shape"] == ul["resized_shape"]
        for f, shape in zip(ff["im_file"], ff["ori_shape"]):   # the record's source file and its size
            assert cv2.imread(f).shape[:2] == shape
        for f, shape in zip(ul["im_file"], ul["ori_shape"]):
            assert cv2.imread(f).shape[:2] == shape
        for batch in (ul, ff):   # normalised cx, cy, w, h; batch_idx counts images of the batch
            assert ((batch["bboxes"] >= 0) & (batch["bboxes"] <= 1)).all()
            assert set(batch["batch_idx"].tolist()) <= set(range(b))


@pytest.mark.parametrize("which", ["ultralytics", "fastfeed"])
def test_boxes_frame_the_painted_objects(both, which):
    ul_batches, ff_batches, _, _ = both
    batches = ul_batches if which == "ultralytics" else ff_batches
    assert_boxes_frame_paint([as_targets(b) for b in batches], SIZE, min_boxes=20)


def test_what_the_trainer_reads_from_the_loader(both):
    _, _, ul, ff = both
    assert len(ff) == len(ul) == 6 and ff.batch_size == ul.batch_size == 4
    assert len(ff.sampler) == len(ul.sampler) == 24 and ff.drop_last == ul.drop_last
    assert len(ff.dataset) == len(ul.dataset) == 24
    ours = sorted((Path(lb["im_file"]).name, lb["shape"], lb["cls"].ravel().tolist()) for lb in ff.dataset.labels)
    theirs = sorted((Path(lb["im_file"]).name, lb["shape"], lb["cls"].ravel().tolist()) for lb in ul.dataset.labels)
    assert ours == theirs
    for a, b in zip(sorted(ff.dataset.labels, key=lambda x: x["im_file"]),
                    sorted(ul.dataset.labels, key=lambda x: x["im_file"])):
        assert torch.allclose(torch.from_numpy(a["bboxes"]), torch.from_numpy(b["bboxes"]), atol=1e-5)
