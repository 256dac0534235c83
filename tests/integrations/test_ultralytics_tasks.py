"""Ultralytics' segment, pose and OBB trainers fed by fastfeed (FastfeedSegmentationTrainer, FastfeedPoseTrainer,
FastfeedOBBTrainer): each packs its task's store and refuses another task's, a pose store's keypoint layout must be
data.yaml's, the batch fields are what each task's loss reads (classes= filters them all), and one epoch of each
trains from scratch on CPU."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from ultra_task_data import (  # also sets Ultralytics offline (ultra_data), settings in a tmp folder
    KPT,
    make_set,
    on_paint,
)

pytest.importorskip("ultralytics")

from ultralytics import YOLO  # noqa: E402
from ultralytics.cfg import get_cfg  # noqa: E402
from ultralytics.nn.tasks import OBBModel, PoseModel, SegmentationModel  # noqa: E402
from ultralytics.utils.torch_utils import unwrap_model  # noqa: E402

from fastfeed.integrations.ultralytics import (  # noqa: E402
    FastfeedOBBTrainer,
    FastfeedPoseTrainer,
    FastfeedSegmentationTrainer,
    FastfeedTrainer,
    Preempted,
)
from fastfeed.integrations.ultralytics.batches import ClassFilter, collate, labels, read_records  # noqa: E402
from fastfeed.pack import PackConfig, pack  # noqa: E402

TRAINERS = {"segment": FastfeedSegmentationTrainer, "pose": FastfeedPoseTrainer, "obb": FastfeedOBBTrainer}
MODELS = {"segment": "yolov8n-seg.yaml", "pose": "yolov8n-pose.yaml", "obb": "yolov8n-obb.yaml"}


def trainer_for(task: str, data: Path, tmp: Path, **over):
    args = dict(model=MODELS[task], data=str(data), imgsz=64, batch=4, epochs=1, device="cpu", workers=0,
                plots=False, val=False, project=str(tmp), name=task, exist_ok=True, seed=0) | over
    return TRAINERS[task](overrides=args)


# --- the batch fields: hand-made fastfeed batches (contract: rows of every extra in the order of targets) ----------

def _targets(rows) -> torch.Tensor:
    return torch.tensor([[i, c, 0.5, 0.5, 0.2, 0.2] for i, c in rows], dtype=torch.float32)


class _Info:
    files, shapes = ["a.png", "b.png"], np.array([[96, 128], [128, 96]])


def test_classes_filter_renumbers_overlap_masks_and_keeps_the_same_rows_of_every_extra():
    rows = [(0, 0), (0, 1), (0, 0), (1, 1), (1, 0)]   # image 0: objects 0..2, image 1: objects 0..1
    masks = torch.zeros(2, 8, 8, dtype=torch.int16)
    for col, (i, _) in enumerate(rows):
        j = sum(1 for r in rows[:col] if r[0] == i)
        masks[i, :, col] = j + 1                       # object j of image i: column `col`, value j + 1
    kp = torch.arange(5, dtype=torch.float32)[:, None, None].expand(5, 3, 3).contiguous()
    rb = torch.arange(5, dtype=torch.float32)[:, None].expand(5, 5).contiguous()
    out = collate(torch.zeros(2, 3, 32, 32, dtype=torch.uint8), _targets(rows), [0, 1], _Info, ClassFilter([0]),
                  {"masks": masks, "keypoints": kp, "rboxes": rb}, overlap=True)
    assert out["cls"].view(-1).tolist() == [0, 0, 0] and out["batch_idx"].tolist() == [0, 0, 1]
    assert out["keypoints"][:, 0, 0].tolist() == [0, 2, 4] and out["bboxes"][:, 0].tolist() == [0, 2, 4]
    assert out["masks"][0, 0].tolist() == [1, 0, 2, 0, 0, 0, 0, 0]   # kept objects 0 and 2 are now 1 and 2
    assert out["masks"][1, 0].tolist() == [0, 0, 0, 0, 1, 0, 0, 0]   # image 1's object 1 (class 0) is now 1
    assert out["masks"].dtype == masks.dtype and out["sem_masks"].shape == (2, 8, 8)


def test_semantic_masks_give_each_pixels_class_and_separate_masks_keep_their_rows():
    rows = [(0, 1), (0, 0), (1, 1)]
    over = torch.zeros(2, 4, 4, dtype=torch.int16)
    over[0, 0], over[0, 1], over[1, 2] = 1, 2, 1
    out = collate(torch.zeros(2, 3, 16, 16, dtype=torch.uint8), _targets(rows), [0, 1], _Info, ClassFilter(),
                  {"masks": over}, overlap=True)
    assert out["sem_masks"][0, 0].tolist() == [1] * 4 and out["sem_masks"][0, 1].tolist() == [0] * 4
    assert out["sem_masks"][1, 2].tolist() == [1] * 4 and out["sem_masks"][1, 3].tolist() == [0] * 4
    sep = torch.zeros(3, 4, 4, dtype=torch.uint8)
    sep[0, :2], sep[1, 1:3], sep[2, 3] = 1, 1, 1       # rows 0 and 1 overlap on line 1: the smaller one (1) wins
    sep[1, 1:3, 2:] = 0
    out = collate(torch.zeros(2, 3, 16, 16, dtype=torch.uint8), _targets(rows), [0, 1], _Info, ClassFilter([1]),
                  {"masks": sep}, overlap=False)
    assert out["masks"].shape == (2, 4, 4) and torch.equal(out["masks"][1], sep[2])
    assert out["sem_masks"][0, 0].tolist() == [1] * 4 and out["sem_masks"][1, 3].tolist() == [1] * 4


def _hand_batch(task: str) -> dict:
    rows = [(0, 0), (0, 1), (1, 1)]
    extras = {}
    if task == "segment":
        m = torch.zeros(2, 16, 16, dtype=torch.int16)
        m[0, 2:8, 2:8], m[0, 9:14, 8:15], m[1, 4:12, 4:12] = 1, 2, 1
        extras["masks"] = m
    if task == "pose":
        extras["keypoints"] = torch.tensor([[[0.45, 0.5, 2], [0.55, 0.5, 2], [0.5, 0.45, 1]]] * 3)
    if task == "obb":
        extras["rboxes"] = torch.tensor([[0.5, 0.5, 0.3, 0.15, 0.4]] * 3)
    return collate(torch.randint(0, 255, (2, 3, 64, 64), dtype=torch.uint8), _targets(rows), [0, 1], _Info,
                   ClassFilter(), extras, overlap=True)


@pytest.mark.parametrize("task, model, terms", [
    ("segment", SegmentationModel, ("seg_loss",)), ("pose", PoseModel, ("pose_loss", "kobj_loss")),
    ("obb", OBBModel, ("angle_loss",))])
def test_each_tasks_loss_reads_the_batch_fastfeed_collates(task, model, terms):
    torch.manual_seed(0)
    net = model(MODELS[task], nc=2, verbose=False, **({"data_kpt_shape": (3, 3)} if task == "pose" else {}))
    net.args = get_cfg()
    batch = _hand_batch(task)
    batch["img"] = batch["img"].float() / 255
    loss, items = net.loss(batch)
    assert torch.isfinite(loss).all() and loss.sum() > 0
    assert all(float(items[t]) > 0 for t in terms), items
    if task == "obb":
        assert batch["bboxes"].shape == (3, 5)    # the rotated boxes replace the upright ones


@pytest.mark.parametrize("loader", ["cpu", "device"])
@pytest.mark.parametrize("task", list(TRAINERS))
def test_the_trainers_batches_put_masks_keypoints_and_rotated_boxes_on_the_painted_objects(tmp_path, monkeypatch,
                                                                                          task, loader):
    """Through the trainer's own train loader, cpu and device (mosaic, affine, flips; classes=[0] keeps the red objects' rows and
    renumbers their masks: a green object's geometry on a kept row fails)."""
    monkeypatch.setenv("FASTFEED_LOADER", loader)   # device: images float in [0, 1] on the trainer's device (CPU)
    data = make_set(tmp_path / task, task)
    trainer = trainer_for(task, data / "data.yaml", tmp_path / "runs", imgsz=96, classes=[0], close_mosaic=0,
                          epochs=3, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, augmentations=[])
    trainer.model = trainer.get_model(cfg=MODELS[task], verbose=False)
    feed = trainer.get_dataloader(trainer.data["train"], batch_size=4, rank=-1, mode="train")
    shares = []
    try:
        for b in feed:
            assert set(b["cls"].view(-1).tolist()) <= {0.0}
            img = b["img"].numpy() if loader == "cpu" else (b["img"].float() * 255).round().numpy()
            red = (img[:, 0] > 200) & (img[:, 1] < 60)   # RGB: the paint, kept exactly (no HSV, no Albumentations)
            for r in range(len(b["cls"])):
                shares += on_paint(task, b, r, red, 96)
    finally:
        feed.close()
    assert len(shares) >= 8 and min(shares) > (0.99 if task == "pose" else 0.9 if task == "segment" else 0.7), shares


def test_classes_with_overlap_masks_is_a_warning_that_names_what_differs():
    from fastfeed.integrations.ultralytics.args import unsupported

    said = unsupported(get_cfg(overrides={"classes": [0]}), "segment")
    assert any(m.startswith("classes=[...] with overlap_mask=True") and "overlap_mask=False" in m for m in said)
    assert not any("overlap_mask" in m for m in unsupported(get_cfg(overrides={"classes": [0], "overlap_mask": False}),
                                                                "segment"))
    assert not any("overlap_mask" in m for m in unsupported(get_cfg(overrides={"classes": [0]}), "obb"))


# --- stores: packed for the trainer's task, another task's refused, the keypoint layout checked ----------------

def test_each_task_trainer_packs_its_tasks_store_and_the_labels_hold_its_geometry(tmp_path):
    for task in TRAINERS:
        data = make_set(tmp_path / task, task)
        trainer = trainer_for(task, data / "data.yaml", tmp_path / "runs")
        store = trainer.train_store(trainer.data["train"])
        assert store.manifest.task == task and f"train-{task}-" in store.path.name
        lab = labels(read_records(store, None), ClassFilter())
        assert len(lab) == 8 and all(len(lb["cls"]) == 2 for lb in lab)
        if task == "pose":
            assert store.manifest.kpt_shape == [3, 3] and store.manifest.flip_idx == [1, 0, 2]
            assert lab[0]["keypoints"].shape == (2, 3, 3)
        else:
            assert [s.shape for s in lab[0]["segments"]] == [(6 if task == "segment" else 4, 2)] * 2


def test_a_detect_store_given_to_the_segment_trainer_is_refused_by_name(tmp_path, monkeypatch):
    data = make_set(tmp_path / "seg", "segment")
    pack(PackConfig(src=data / "data.yaml", split="train", out=tmp_path / "det.ff", progress=False, task="detect"))
    monkeypatch.setenv("FASTFEED_STORE", str(tmp_path / "det.ff"))
    trainer = trainer_for("segment", data / "data.yaml", tmp_path / "runs")
    with pytest.raises(ValueError, match="det.ff is a store of detect labels but FastfeedSegmentationTrainer trains segment"):
        trainer.train_store(trainer.data["train"])
    det = FastfeedTrainer(overrides=dict(model="yolov8n.yaml", data=str(data / "data.yaml"), device="cpu",
                                         project=str(tmp_path / "runs"), name="det"))
    assert det.train_store(det.data["train"]).manifest.task == "detect"   # a detect trainer takes any store's boxes


def test_a_model_of_another_task_than_the_trainers_is_refused_by_name(tmp_path):
    """Before, FastfeedTrainer trained a -seg model on boxes alone and failed in validation ('tuple' object has no
    attribute 'shape'), and the segment trainer given a pose model packed its keypoints as polygons (all rejected)."""
    data = make_set(tmp_path / "seg", "segment") / "data.yaml"
    det = FastfeedTrainer(overrides=dict(model="yolov8n-seg.yaml", data=str(data), device="cpu",
                                         project=str(tmp_path / "runs"), name="det"))
    with pytest.raises(ValueError, match="^FastfeedTrainer trains detect models, but yolov8n-seg.yaml is a model for "
                                         "segment: give trainer=FastfeedSegmentationTrainer$"):
        det.get_model(cfg="yolov8n-seg.yaml", verbose=False)
    seg = trainer_for("segment", data, tmp_path / "runs", model="yolov8n-pose.yaml")
    with pytest.raises(ValueError, match="yolov8n-pose.yaml is a model for pose: give trainer=FastfeedPoseTrainer"):
        seg.get_model(cfg="yolov8n-pose.yaml", verbose=False)
    assert seg.get_model(cfg="yolov8n-seg.yaml", verbose=False) is not None


def test_each_trainer_given_a_model_of_another_task_by_yolo_refuses_it_before_reading_data_yaml(tmp_path):
    """Before, the pose trainer given another task's model (and its data.yaml, without kpt_shape) ended in
    Ultralytics' "KeyError: 'No `kpt_shape` in ...'" from its constructor; now every pair is refused by name, from
    the task YOLO(model).train(...) gives the trainer."""
    data = str(make_set(tmp_path / "seg", "segment", n=1) / "data.yaml")
    with pytest.raises(ValueError, match="^FastfeedPoseTrainer trains pose models, but yolov8n-seg.yaml is a model "
                                         "for segment: give trainer=FastfeedSegmentationTrainer$"):
        YOLO(MODELS["segment"]).train(data=data, trainer=FastfeedPoseTrainer, device="cpu", plots=False,
                                      project=str(tmp_path / "runs"))
    trainers, models = {"detect": FastfeedTrainer, **TRAINERS}, {"detect": "yolov8n.yaml", **MODELS}
    for task, trainer in trainers.items():
        for other, model in models.items():
            if other != task:
                with pytest.raises(ValueError, match=f"^{trainer.__name__} trains {task} models, but {model} is a "
                                                     f"model for {other}: give trainer={trainers[other].__name__}$"):
                    trainer(overrides=dict(model=model, task=other, data=data))


def test_the_detect_trainer_reads_a_segment_stores_boxes_alone(tmp_path, monkeypatch):
    """FastfeedTrainer (detection) given a segment store: its batches are boxes, no masks drawn for a loss that
    reads none (the loader asked for task='detect')."""
    import fastfeed.loaders.pipeline as pipeline

    data = make_set(tmp_path / "seg", "segment")
    pack(PackConfig(src=data / "data.yaml", split="train", out=tmp_path / "seg.ff", progress=False, task="segment"))
    monkeypatch.setenv("FASTFEED_STORE", str(tmp_path / "seg.ff"))
    monkeypatch.setattr(pipeline, "rasterise", lambda *a, **k: pytest.fail("a mask was drawn for a detector"))
    det = FastfeedTrainer(overrides=dict(model="yolov8n.yaml", data=str(data / "data.yaml"), device="cpu", imgsz=64,
                                         batch=4, epochs=1, workers=0, plots=False, val=False,
                                         project=str(tmp_path / "runs"), name="det"))
    det.model = det.get_model(cfg="yolov8n.yaml", verbose=False)
    feed = det.get_dataloader(det.data["train"], batch_size=4, rank=-1, mode="train")
    try:
        assert feed.loader.task == "detect" and feed.store.manifest.task == "segment"
        b = next(iter(feed))
        assert "masks" not in b and len(b["cls"]) > 0 and b["bboxes"].shape == (len(b["cls"]), 4)
    finally:
        feed.close()


def test_a_pose_store_of_another_kpt_shape_than_data_yamls_is_refused_by_name(tmp_path, monkeypatch):
    data = make_set(tmp_path / "pose", "pose")
    pack(PackConfig(src=data / "data.yaml", split="train", out=tmp_path / "p.ff", progress=False, task="pose"))
    other = tmp_path / "other.yaml"
    other.write_text((data / "data.yaml").read_text().replace(KPT, "kpt_shape: [3, 2]\nflip_idx: [1, 0, 2]\n"))
    monkeypatch.setenv("FASTFEED_STORE", str(tmp_path / "p.ff"))
    trainer = trainer_for("pose", other, tmp_path / "runs")
    with pytest.raises(ValueError, match=r"p.ff holds keypoints with kpt_shape \[3, 3\], data.yaml gives \[3, 2\]"):
        trainer.train_store(trainer.data["train"])


def test_a_pose_data_yaml_without_kpt_shape_is_refused_by_name_with_the_stores_layout_when_it_has_one(tmp_path,
                                                                                                     monkeypatch):
    """Before, Ultralytics' PoseTrainer ended in "KeyError: 'No `kpt_shape` in ...'" from the trainer's constructor."""
    data = make_set(tmp_path / "pose", "pose", n=2)
    pack(PackConfig(src=data / "data.yaml", split="train", out=tmp_path / "p.ff", progress=False, task="pose"))
    bare = tmp_path / "bare.yaml"
    bare.write_text((data / "data.yaml").read_text().replace(KPT, ""))
    with pytest.raises(ValueError, match=r"^\S*bare.yaml has no kpt_shape, which a pose model is built from: add "
                                         r"`kpt_shape: \[K, 2 or 3\]` \(K keypoints .*\) to it$"):
        trainer_for("pose", bare, tmp_path / "runs")
    monkeypatch.setenv("FASTFEED_STORE", str(tmp_path / "p.ff"))
    with pytest.raises(ValueError, match=r"bare.yaml has no kpt_shape, .*: add `kpt_shape: \[3, 3\]` and "
                                         r"`flip_idx: \[1, 0, 2\]` \(the store's, FASTFEED_STORE\) to it$"):
        trainer_for("pose", bare, tmp_path / "runs")


def test_a_pose_set_whose_data_yaml_is_elsewhere_is_packed_with_its_keypoints_and_repacked_when_flip_idx_changes(
        tmp_path):
    data = make_set(tmp_path / "pose", "pose", yaml_extra="")      # the dataset's own data.yaml: no kpt_shape
    yaml = tmp_path / "pose.yaml"
    yaml.write_text((data / "data.yaml").read_text() + KPT)
    store = trainer_for("pose", yaml, tmp_path / "runs").train_store(str(data / "images" / "train"))
    assert store.manifest.kpt_shape == [3, 3] and store.manifest.flip_idx == [1, 0, 2]
    yaml.write_text((data / "data.yaml").read_text() + KPT.replace("[1, 0, 2]", "[0, 1, 2]"))
    again = trainer_for("pose", yaml, tmp_path / "runs").train_store(str(data / "images" / "train"))
    assert again.manifest.flip_idx == [0, 1, 2]


# --- training: one epoch of each task from scratch, fed by fastfeed ----------------------------------------------

@pytest.mark.parametrize("task, terms", [("segment", ("seg_loss",)), ("pose", ("pose_loss", "kobj_loss")),
                                         ("obb", ("angle_loss",))])
def test_one_epoch_of_each_task_trains_from_scratch_fed_by_fastfeed(tmp_path, monkeypatch, task, terms):
    monkeypatch.delenv("FASTFEED_LOADER", raising=False)
    data = make_set(tmp_path / task, task)
    model = YOLO(MODELS[task])
    model.train(data=str(data / "data.yaml"), trainer=TRAINERS[task], epochs=1, imgsz=64, batch=4, device="cpu",
                workers=0, plots=False, val=False, project=str(tmp_path / "runs"), name=task, seed=0, mosaic=1.0,
                close_mosaic=0)
    trainer = model.trainer
    assert trainer.train_loader.loader.stage_times().samples == 8   # the epoch came from fastfeed
    losses = {k: float(v) for k, v in trainer.tloss.items()}   # the epoch's mean loss terms
    assert all(math.isfinite(v) for v in losses.values()) and losses["box_loss"] > 0, losses
    assert all(losses[t] > 0 for t in terms), losses


class _StoppedSegmentation(FastfeedSegmentationTrainer):
    """Sends itself SIGTERM while it trains batch `stop_at` (epoch, batch), once."""

    stop_at: tuple | None = None

    def preprocess_batch(self, batch):
        if type(self).stop_at == (self.epoch, self.train_loader.position - 1):
            type(self).stop_at = None
            os.kill(os.getpid(), signal.SIGTERM)
        return super().preprocess_batch(batch)


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {f"model.{k}": v for k, v in unwrap_model(trainer.model).state_dict().items()} | {
        f"ema.{k}": v for k, v in trainer.ema.ema.state_dict().items()}


@pytest.mark.slow
def test_a_segment_run_stopped_mid_epoch_resumes_to_the_uninterrupted_runs_weights(tmp_path, monkeypatch):
    """The task trainers stop and resume through the same mixin as FastfeedTrainer (stopping.py, exact.py)."""
    data = str(make_set(tmp_path / "seg", "segment") / "data.yaml")
    run = dict(imgsz=64, batch=2, nbs=2, epochs=2, close_mosaic=0, device="cpu", plots=False, workers=0, seed=0,
               deterministic=True, val=False, amp=False, project=str(tmp_path / "runs"))
    whole = YOLO(MODELS["segment"])
    whole.train(data=data, trainer=FastfeedSegmentationTrainer, name="whole", **run)
    monkeypatch.setattr(_StoppedSegmentation, "stop_at", (0, 1))
    stopped = YOLO(MODELS["segment"])
    with pytest.raises(Preempted, match=r"stopped after 2 batches of epoch 1.*trainer=_StoppedSegmentation"):
        stopped.train(data=data, trainer=_StoppedSegmentation, name="stopped", **run)
    resumed = YOLO(str(tmp_path / "runs" / "stopped" / "weights" / "last.pt"))
    resumed.train(resume=True, trainer=_StoppedSegmentation)
    assert resumed.trainer.train_loader.dataset.labels[0]["segments"]   # a segment feed all along
    ours, theirs = _weights(resumed.trainer), _weights(whole.trainer)
    differ = [k for k in theirs if not torch.equal(ours[k], theirs[k])]
    assert ours.keys() == theirs.keys() and not differ, f"{len(differ)} of {len(theirs)} tensors differ: {differ[:3]}"
