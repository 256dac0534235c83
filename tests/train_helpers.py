"""What the trainer's test files share: tiny settings, the packed bundled sample, metrics.jsonl rows."""

from __future__ import annotations

import json

import torch

import fastfeed
from fastfeed.pack import PackConfig, pack
from fastfeed.train import coco_ground_truth
from fastfeed.train.evaluate import to_coco_detections

TINY = dict(model="yolov3-tiny", imgsz=64, batch=2, epochs=2, workers=0, accum=1, log_every=1)


def packed_sample(tmp_path_factory):
    """The bundled 16-image sample, packed (each test file's module-scoped `store` fixture)."""
    out = tmp_path_factory.mktemp("train") / "sample.ff"
    pack(PackConfig(src=fastfeed.sample_path(), out=out, progress=False))
    return out


def rows(run_dir, event=None):
    """metrics.jsonl rows with this `event` (None: the log rows)."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r.get("event") == event]


def fixed_batch(store, n, imgsz=64):
    """The store's first n images, letterboxed, float in [0,1], with their targets."""
    from fastfeed import Store
    from fastfeed.loaders import LoaderConfig, create_loader

    ld = create_loader("cpu", Store(store), LoaderConfig(imgsz=imgsz, batch_size=n, workers=0, augment=False,
                                                         shuffle=False))
    images, targets = next(iter(ld))
    images, targets = images.float() / 255, targets.clone()
    ld.close()
    return images, targets


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def same_weights(a: torch.nn.Module, b: torch.nn.Module, rtol=1e-5, atol=1e-6) -> None:
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(va.float(), vb.float(), rtol=rtol, atol=atol), k


def gt_as_detections(store, imgsz):
    """The val loader's own targets, as the model would have predicted them (letterboxed pixels)."""
    from fastfeed.loaders import LoaderConfig, create_loader
    from fastfeed.train.boxes import cxcywh_to_xyxy

    gt, frames = coco_ground_truth(store, imgsz)
    ld = create_loader("cpu", store, LoaderConfig(imgsz=imgsz, batch_size=5, workers=0, augment=False, shuffle=False,
                                                  drop_last=False))
    dets, seen = [], 0
    for images, targets in ld:
        for j in range(len(images)):
            t = targets[targets[:, 0] == j]
            d = torch.cat((cxcywh_to_xyxy(t[:, 2:6] * imgsz), torch.ones(len(t), 1), t[:, 1:2]), 1)
            dets += to_coco_detections(d, frames[seen], store.category_ids)
            seen += 1
    ld.close()
    assert seen == len(store)
    return gt, dets
