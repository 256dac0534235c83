"""The Ultralytics feed names each image from the batch's own record indices: with a loader that deliberately
reverses the order (registered from this test module), every batch's `im_file` / `ori_shape` are those of the
records it holds, and its boxes are those files' labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ultra_data import sample_yolo_master  # noqa: F401  (fixture)

pytest.importorskip("ultralytics")

from fastfeed.integrations.ultralytics import FastfeedTrainLoader  # noqa: E402
from fastfeed.integrations.ultralytics.store import prepare_store  # noqa: E402
from fastfeed.loaders import EpochOrder, LoaderConfig, ShuffledOrder, create_loader, register_loader, unregister_loader  # noqa: E402  # noqa: E402


class Reversed(EpochOrder):
    def __init__(self, base):
        self.base, self.rank, self.world_size = base, base.rank, base.world_size

    def batches(self, epoch):
        return [b[::-1].copy() for b in self.base.batches(epoch)[::-1]]

    def __len__(self):
        return len(self.base)


@pytest.fixture
def reversed_cpu():
    name = "test-reversed-ultralytics"
    register_loader(name, lambda store, cfg, opts: create_loader(
        "cpu", store, cfg, order=Reversed(ShuffledOrder.for_loader(len(store), cfg, *cfg.resolved_rank()))))
    yield name
    unregister_loader(name)


def _labels(im_file: str) -> np.ndarray:
    p = Path(im_file.replace("/images/", "/labels/")).with_suffix(".txt")
    rows = [line.split() for line in p.read_text().splitlines() if line.strip()]
    return np.array([[float(v) for v in r[1:]] for r in rows], np.float32).reshape(-1, 4)


def test_im_file_is_the_records_the_batch_holds(sample_yolo_master, reversed_cpu, tmp_path):  # noqa: F811
    train = sample_yolo_master / "images" / "train2017"
    store = prepare_store(str(train), progress=False)
    cfg = LoaderConfig(imgsz=128, batch_size=4, workers=0, augment=False, device="cpu")
    feed = FastfeedTrainLoader(reversed_cpu, store, cfg, image_dir=train)
    try:
        expect = feed.loader.order.batches(0)
        plain = ShuffledOrder.for_loader(len(store), cfg, 0, 1).batches(0)
        assert [b.tolist() for b in expect] != [b.tolist() for b in plain]   # the order really differs
        checked = 0
        for batch, records in zip(feed, expect, strict=True):
            assert batch["im_file"] == tuple(str(train / store.record(int(i)).file_name) for i in records)
            for j, f in enumerate(batch["im_file"]):
                assert batch["ori_shape"][j] == tuple(store.record(int(records[j])).orig_size)
                # letterboxed boxes, mapped back to the image, are that file's own labels
                h, w = batch["ori_shape"][j]
                r = 128 / max(h, w)
                got = batch["bboxes"][batch["batch_idx"] == j].numpy().copy()
                got[:, 0] = (got[:, 0] * 128 - (128 - w * r) / 2) / (w * r)
                got[:, 1] = (got[:, 1] * 128 - (128 - h * r) / 2) / (h * r)
                got[:, 2] *= 128 / (w * r)
                got[:, 3] *= 128 / (h * r)
                want = _labels(f)
                assert len(got) == len(want)
                np.testing.assert_allclose(got[np.lexsort(got.T)], want[np.lexsort(want.T)], atol=0.02)
                checked += 1
        assert checked == len(store) // 4 * 4
    finally:
        feed.close()
