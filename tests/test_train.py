"""The bundled trainer's parts: models, loss and assignment, NMS, COCO evaluation, schedule, EMA."""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import gt_as_detections  # noqa: F401

import fastfeed
from fastfeed.pack import PackConfig, pack
from fastfeed.train import build_model, coco_ground_truth, coco_map, count_flops, count_parameters
from fastfeed.train.boxes import batched_nms, box_iou, ciou, nms, postprocess
from fastfeed.train.config import TrainConfig
from fastfeed.train.evaluate import letterbox_frame
from fastfeed.train.loss import YoloLoss
from fastfeed.train.optim import ModelEMA, build_optimizer, lr_factor, set_lr


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory):
    from fastfeed import Store

    out = tmp_path_factory.mktemp("train") / "sample.ff"
    pack(PackConfig(src=fastfeed.sample_path(), out=out, progress=False))
    return Store(out)


def letterboxed_batch(store, imgsz, n):
    from fastfeed.loaders import LoaderConfig, create_loader

    ld = create_loader("cpu", store, LoaderConfig(imgsz=imgsz, batch_size=n, workers=0, augment=False, shuffle=False))
    images, targets = next(iter(ld))
    images, targets = images.float() / 255, targets.clone()
    ld.close()
    return images, targets


# --- models -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, strides", [("yolov3", (8, 16, 32)), ("yolov3-tiny", (16, 32))])
def test_forward_shapes_per_scale(name, strides):
    torch.manual_seed(0)
    model = build_model(name, nc=3)
    out = model(torch.rand(2, 3, 64, 64))
    assert [tuple(o.shape) for o in out] == [(2, 3, 64 // s, 64 // s, 8) for s in strides]
    model.eval()
    with torch.no_grad():
        pred = model.predict(torch.rand(1, 3, 96, 64 + 32))
    assert pred.shape == (1, 3 * sum((96 // s) ** 2 for s in strides), 8)
    assert (pred[..., 4:] >= 0).all() and (pred[..., 4:] <= 1).all()


def test_yolov3_size_matches_darknet():
    # Darknet's yolov3.cfg: 61,949,149 parameters and 65.9 BFLOPs (2 x MACs) at 416 with 80 classes.
    with torch.device("meta"):
        assert count_parameters(build_model("yolov3", 80)) == 61_949_149
        assert count_parameters(build_model("yolov3-tiny", 80)) == 8_852_366
    assert count_flops("yolov3", 80, 416) == pytest.approx(65.86, abs=0.05)
    assert count_flops("yolov3-tiny", 80, 416) == pytest.approx(5.56, abs=0.02)


def test_bad_model_and_nc():
    with pytest.raises(ValueError, match="unknown model 'yolov5'; valid models: yolov3, yolov3-tiny"):
        build_model("yolov5", 80)
    with pytest.raises(ValueError, match="nc .* must be an integer >= 1"):
        build_model("yolov3-tiny", 0)


# --- loss ---------------------------------------------------------------------------------------------

def test_assignment_uses_matching_anchors_and_neighbour_cells():
    model = build_model("yolov3", 2)
    loss = YoloLoss(model, 256)
    preds = [torch.zeros(1, 3, 256 // s, 256 // s, 7) for s in (8, 16, 32)]
    # One 32x61-pixel box centred at (100, 70) pixels: at stride 16 that is cell (6.25, 4.375), whose
    # left and upper halves pick the left and upper neighbours.
    t = torch.tensor([[0, 1, 100 / 256, 70 / 256, 32 / 256, 61 / 256]])
    out = loss.assign(preds, t)
    b, a, gj, gi, tbox, tcls, anchor = out[1]
    assert set(a.tolist()) == {0, 1, 2}                      # 30x61, 62x45, 59x119 are all within 4x
    cells = {(int(j), int(i)) for j, i in zip(gj, gi)}
    assert cells == {(4, 6), (4, 5), (3, 6)}
    assert len(b) == 9 and (tcls == 1).all()
    assert ((tbox[:, :2] > -0.5) & (tbox[:, :2] < 1.5)).all()
    assert torch.allclose(tbox[:, 2:], torch.tensor([[2.0, 61 / 16]]).expand(9, 2))
    b, a, *_ = out[2]   # stride 32: 116x90 is 3.6x wider (kept), 156x198 4.9x (not), 373x326 neither
    assert set(a.tolist()) == {0}
    # Stride 8: 16x30 and 33x23 match (10x13 is 4.7x shorter); the centre (12.5, 8.75) sits on a cell's
    # vertical midline (no left/right neighbour) in its lower half: the lower neighbour joins.
    b, a, gj, gi, *_ = out[0]
    assert set(a.tolist()) == {1, 2} and {(int(j), int(i)) for j, i in zip(gj, gi)} == {(8, 12), (9, 12)}


def test_loss_is_finite_and_decreases_on_the_sample(sample_store):
    torch.manual_seed(0)
    images, targets = letterboxed_batch(sample_store, 96, 4)
    model = build_model("yolov3-tiny", len(sample_store.class_names))
    loss_fn = YoloLoss(model, 96)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for _ in range(8):
        loss, items = loss_fn(model(images), targets)
        assert torch.isfinite(loss) and torch.isfinite(items).all() and loss.item() > 0
        assert loss.item() == pytest.approx(items.sum().item() * 4, rel=1e-5)   # x batch size
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses


def test_loss_without_targets_is_objectness_only():
    model = build_model("yolov3-tiny", 5)
    loss, items = YoloLoss(model, 64)(model(torch.rand(2, 3, 64, 64)), torch.zeros(0, 6))
    assert torch.isfinite(loss) and items[0] == 0 and items[2] == 0 and items[1] > 0


def test_ciou_is_iou_for_same_centre_and_shape_and_penalises_distance():
    a = torch.tensor([[5.0, 5.0, 2.0, 2.0]])
    assert ciou(a, a).item() == pytest.approx(1.0, abs=1e-5)
    half = torch.tensor([[5.0, 5.0, 1.0, 2.0]])
    assert ciou(a, half).item() < 0.5
    far = torch.tensor([[50.0, 50.0, 2.0, 2.0]])
    assert ciou(a, far).item() < 0 < 1 - ciou(a, far).item() < 2


# --- NMS ----------------------------------------------------------------------------------------------

def _reference_nms(boxes, scores, thr):
    order = scores.argsort(descending=True).tolist()
    keep = []
    for i in order:
        if all(box_iou(boxes[i:i + 1], boxes[j:j + 1]).item() <= thr for j in keep):
            keep.append(i)
    return keep


def test_nms_keeps_the_best_of_each_overlapping_group():
    # IoU(0, 3) = 0.9, IoU(0, 1) = 0.47, IoU(1, 3) = 0.42, box 2 overlaps nothing.
    boxes = torch.tensor([[0, 0, 10, 10], [2, 2, 12, 12], [20, 20, 30, 30], [0, 0, 10, 9.]])
    scores = torch.tensor([0.8, 0.9, 0.7, 0.95])
    assert nms(boxes, scores, 0.5).tolist() == [3, 1, 2]
    assert nms(boxes, scores, 0.4).tolist() == [3, 2]
    assert nms(boxes, scores, 0.95).tolist() == [3, 1, 0, 2]
    assert nms(torch.zeros(0, 4), torch.zeros(0), 0.5).numel() == 0
    # Classes apart: 0 and 3 overlap but differ in class, so both stay.
    assert batched_nms(boxes, scores, torch.tensor([0, 1, 0, 1]), 0.5).tolist() == [3, 1, 0, 2]
    assert batched_nms(boxes, scores, torch.tensor([1, 0, 0, 1]), 0.5).tolist() == [3, 1, 2]


def test_nms_matches_a_brute_force_reference():
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(120, 2, generator=g) * 100
    boxes = torch.cat((xy, xy + 5 + torch.rand(120, 2, generator=g) * 30), 1)
    scores = torch.rand(120, generator=g)
    for thr in (0.3, 0.5, 0.7):
        assert nms(boxes, scores, thr).tolist() == _reference_nms(boxes, scores, thr)


def test_postprocess_multilabel_thresholds_and_format():
    # Two boxes on one spot with two confident classes: both classes survive, the weaker box does not.
    p = torch.zeros(1, 3, 5 + 3)
    p[0, :, :4] = torch.tensor([[50, 50, 20, 20], [51, 50, 20, 20], [10, 10, 4, 4.]])
    p[0, :, 4] = torch.tensor([0.9, 0.8, 0.0005])
    p[0, :, 5:] = torch.tensor([[0.9, 0.8, 0.0], [0.9, 0.8, 0.0], [1.0, 0, 0]])
    (out,) = postprocess(p, conf_thres=0.01, iou_thres=0.5)
    assert out.shape == (2, 6)
    assert out[:, 5].tolist() == [0, 1] and out[0, 4].item() == pytest.approx(0.81)
    assert out[0, :4].tolist() == [40, 40, 60, 60]


# --- evaluation -----------------------------------------------------------------------------------------



@pytest.mark.parametrize("imgsz", [96, 320])
def test_map_of_ground_truth_as_predictions_is_one(sample_store, imgsz):
    gt, dets = gt_as_detections(sample_store, imgsz)
    assert len(dets) == 109   # every training box; the one crowd region is ignored by COCOeval, not a miss
    cats = sample_store.category_ids
    assert {d["category_id"] for d in dets} <= set(cats)
    assert 1 in {d["category_id"] for d in dets}   # person: COCO id 1, contiguous class 0
    res = coco_map(gt, dets)
    assert res["map50"] == pytest.approx(1.0) and res["map"] == pytest.approx(1.0)
    # Half the boxes missing, or every box shifted, must cost mAP.
    assert coco_map(gt, dets[::2])["map50"] < 0.9
    shifted = [d | {"bbox": [d["bbox"][0] + d["bbox"][2] * 0.3, *d["bbox"][1:]]} for d in dets]
    res = coco_map(gt, shifted)
    assert res["map50"] > 0.9 and res["map"] < 0.7
    assert coco_map(gt, [])["map"] == 0.0


def test_ground_truth_is_in_original_pixels_with_source_ids(sample_store):
    gt, frames = coco_ground_truth(sample_store, 640)
    s = sample_store.get(0, decode=False)
    anns = gt.imgToAnns[s.image_id]
    h, w = s.orig_size
    assert gt.imgs[s.image_id]["height"] == h and len(anns) == len(s.boxes)
    x1, y1, x2, y2 = s.boxes[0] * [w, h, w, h]
    assert anns[0]["bbox"] == pytest.approx([x1, y1, x2 - x1, y2 - y1], rel=1e-5)
    assert anns[0]["category_id"] == sample_store.category_ids[s.classes[0]]
    assert sum(a["iscrowd"] for a in gt.dataset["annotations"]) == 1
    assert [f.image_id for f in frames] == [sample_store.get(i, decode=False).image_id for i in range(len(sample_store))]


def test_letterbox_frame_matches_the_loader(sample_store):
    """The frame evaluate.py computes from the header is the one the loader draws (pad rows = 114)."""
    for imgsz in (64, 160, 416):
        images, _ = letterboxed_batch(sample_store, imgsz, 16)
        for i in range(16):
            left, top, nw, nh = letterbox_frame(sample_store.record(i), imgsz)
            img = (images[i] * 255).round().to(torch.uint8)
            if top > 0:
                assert (img[:, top - 1] == 114).all() and not (img[:, top] == 114).all()
            if left > 0:
                assert (img[:, :, left - 1] == 114).all() and not (img[:, :, left] == 114).all()
            assert nw == imgsz or nh == imgsz


# --- optimisation -----------------------------------------------------------------------------------------

def test_param_groups_decay_only_conv_weights():
    model = build_model("yolov3-tiny", 3)
    opt = build_optimizer(model, "sgd", 0.01, 0.937, 5e-4)
    decay, norms, biases = opt.param_groups
    assert decay["weight_decay"] == 5e-4 and norms["weight_decay"] == biases["weight_decay"] == 0
    assert all(p.dim() == 4 for p in decay["params"]) and all(p.dim() == 1 for p in norms["params"] + biases["params"])
    # Conv weights: one per Conv plus the 2 output convs; BatchNorm scales; every bias (BatchNorm's + output convs').
    n_bn = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert (len(decay["params"]), len(norms["params"]), len(biases["params"])) == (n_bn + 2, n_bn, n_bn + 2)
    assert opt.defaults["nesterov"]
    assert isinstance(build_optimizer(model, "adamw", 1e-3, 0.9, 5e-4), torch.optim.AdamW)
    with pytest.raises(ValueError, match="valid optimizers: sgd, adamw"):
        build_optimizer(model, "lion", 1e-3, 0.9, 0)


def test_warmup_and_cosine_schedule():
    cfg = TrainConfig(data=".", lr=0.01)
    opt = build_optimizer(build_model("yolov3-tiny", 1), "sgd", 0.01, 0.937, 0)
    set_lr(opt, 0, 100, 10, 0.01, cfg)
    assert [g["lr"] for g in opt.param_groups] == [0, 0, pytest.approx(0.1)]
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.8)
    set_lr(opt, 5, 100, 10, 0.01, cfg)
    target = 0.01 * lr_factor(5, 100, "cosine", 0.01)
    assert opt.param_groups[0]["lr"] == pytest.approx(target / 2)
    assert opt.param_groups[2]["lr"] == pytest.approx(0.1 + (target - 0.1) / 2)
    set_lr(opt, 50, 100, 10, 0.01, cfg)
    assert all(g["lr"] == pytest.approx(0.01 * (0.01 + 0.99 / 2)) for g in opt.param_groups)
    assert opt.param_groups[0]["momentum"] == 0.937
    assert lr_factor(100, 100, "cosine", 0.01) == pytest.approx(0.01)
    assert lr_factor(50, 100, "linear", 0.01) == pytest.approx(0.505)


def test_ema_follows_with_a_ramp():
    model = build_model("yolov3-tiny", 1)
    ema = ModelEMA(model)
    assert ema.current_decay() == 0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(model)       # decay after 1 update ~ 0.9999 * (1 - e^-1/2000) ~ 5e-4: nearly a copy
    w, e = model.stem[0].weight, ema.ema.stem[0].weight
    assert torch.allclose(e, w, atol=1e-3) and not e.requires_grad
    ema.updates = 100_000
    assert ema.current_decay() == pytest.approx(0.9999, abs=1e-6)
    assert math.isclose(ModelEMA(model, updates=2000).current_decay(), 0.9999 * (1 - math.exp(-1)))
