"""FastfeedTrainer under Ultralytics' DDP launcher (2 CPU ranks): a data source lost for good on rank 1 only stops
both ranks at the same optimizer step (mid-epoch, in the batches after an epoch's last step, before the first step),
with one last.pt at the last step applied, the same DataSourceFailed on both and in the launching process, and no
process left; resume=True continues there with the uninterrupted run's batches, multi_scale sizes and weights. One
process stops as before: the loader's error, never a blank batch."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from proc_checks import descendants, kill_all, wait_gone
from ultra_data import _names, sample_yolo, sample_yolo_master, write_data_yaml  # noqa: F401  (fixtures)
from ultra_task_data import make_set

pytest.importorskip("ultralytics")
pytest.importorskip("cloudpickle")

from ddp_trainer import CpuDdpTrainer, RecordingTrainer, lose_at  # noqa: E402
from ultralytics import YOLO  # noqa: E402
from ultralytics.nn.tasks import load_checkpoint  # noqa: E402

from fastfeed.integrations.ultralytics import (  # noqa: E402
    FastfeedOBBTrainer,
    FastfeedPoseTrainer,
    FastfeedSegmentationTrainer,
    FastfeedTrainer,
    FastfeedTrainLoader,
)
from fastfeed.integrations.ultralytics.exact import STATE_KEY  # noqa: E402
from fastfeed.integrations.ultralytics.resume import KEY  # noqa: E402
from fastfeed.train.guards import DataSourceFailed  # noqa: E402

# 16 images, batch 2 over 2 ranks: 8 batches of 1 image per rank. nbs 2: a step after every batch; nbs 6: accumulate 3,
# steps after batches 2 and 5, and 6 and 7 after the epoch's last step. multi_scale: each rank draws its sizes from
# its own Python generator, so a resumed rank draws the uninterrupted run's only with its generator as the step left it.
RUN = dict(imgsz=96, batch=2, epochs=1, close_mosaic=0, device="cpu", plots=False, workers=0, seed=0, val=False,
           warmup_epochs=0, multi_scale=0.3)
TRAINERS = {"detect": (FastfeedTrainer, "yolov8n.yaml"), "segment": (FastfeedSegmentationTrainer, "yolov8n-seg.yaml"),
            "pose": (FastfeedPoseTrainer, "yolov8n-pose.yaml"), "obb": (FastfeedOBBTrainer, "yolov8n-obb.yaml")}
LOST = "DataSourceFailed: rank 1: s3://bucket/train.ff: unreachable (test) (the other ranks stopped at the same step)"


@pytest.fixture(scope="module")
def data(sample_yolo_master, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("lost") / "coco16"
    shutil.copytree(sample_yolo_master, root)
    write_data_yaml(root, _names(sample_yolo_master))
    return root


def _launch(data, out, monkeypatch, name, lose=None, **over):
    """One DDP run through Ultralytics' launcher (`lose`: FF_LOSE); (each rank's report, rank 0's final weights).
    Every process it started has ended by then."""
    monkeypatch.setenv("FF_DDP_OUT", str(out))
    monkeypatch.delenv("FASTFEED_LOADER", raising=False)
    monkeypatch.delenv("FF_SIGNAL", raising=False)
    if lose:
        monkeypatch.setenv("FF_LOSE", lose)
    else:
        monkeypatch.delenv("FF_LOSE", raising=False)
    for r in (0, 1):
        (out / f"rank{r}.json").unlink(missing_ok=True)
    before = {p.pid for p in descendants(os.getpid())}
    try:
        if name == "resume":
            YOLO(str(over.pop("last"))).train(resume=True, trainer=CpuDdpTrainer)
        else:
            YOLO("yolov8n.yaml").train(data=str(data / "data.yaml"), trainer=CpuDdpTrainer, project=str(out),
                                       name=name, **(RUN | over))
    finally:
        left = wait_gone([p for p in descendants(os.getpid()) if p.pid not in before], timeout=10)
        kill_all(left)
        assert not left, f"processes left behind: {left}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)], torch.load(out / "weights.pt")


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    """nbs -> (each rank's batches, each rank's sizes, rank 0's final weights) of the run without a loss."""
    runs = {}

    def get(nbs):
        if nbs not in runs:
            with pytest.MonkeyPatch.context() as mp:
                out = tmp_path_factory.mktemp(f"whole{nbs}")
                ranks, weights = _launch(data, out, mp, "u", nbs=nbs)
            runs[nbs] = [r["seen"] for r in ranks], [r["img_sizes"] for r in ranks], weights
        return runs[nbs]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(("nbs", "lose", "kept", "steps"), [
    (2, "1:4", 3, 3),   # mid-epoch: rank 1's 4th batch; the step after it (rank 0 trained its 4th) is not applied
    (6, "1:8", 6, 2),   # rank 1's last batch, after the epoch's last step (5): every rank stops at the epoch's end
    (6, "1:1", 0, 0),   # rank 1's first batch, before the first step (2): last.pt at the start of the epoch
], ids=["mid-epoch", "epoch-tail", "before-first-step"])
def test_a_source_lost_on_rank_1_stops_both_ranks_at_one_step_and_resume_continues_there(
        data, tmp_path, monkeypatch, uninterrupted, nbs, lose, kept, steps):
    whole, whole_sizes, whole_weights = uninterrupted(nbs)
    with pytest.raises(DataSourceFailed) as lost:   # in the launching process too: the ranks' error
        _launch(data, tmp_path, monkeypatch, "d", lose=lose, nbs=nbs)
    last = tmp_path / "d" / "weights" / "last.pt"
    said = f"training stopped after {kept} batches of epoch 1: {last} holds them: continue with YOLO('{last}')"
    assert str(lost.value).startswith(LOST.removeprefix("DataSourceFailed: ")) and said in str(lost.value)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["error"] == ranks[1]["error"] == f"DataSourceFailed: {lost.value}"   # the same on both
    assert not any(r["ddp_left"] or r["group_left"] for r in ranks)   # let go before the exit, stopped as they are
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.pt"]                  # one checkpoint
    _, ckpt = load_checkpoint(last)
    assert (ckpt[KEY]["epoch"], ckpt[KEY]["batches"], ckpt[KEY]["why"]) == (0, kept, "data source failed")
    assert ckpt[STATE_KEY]["grads"] is None and ckpt[STATE_KEY]["updates"] == steps
    seen = [r["seen"] for r in ranks]
    for r in (0, 1):   # the same batches as the uninterrupted run up to the last step, and as many after it
        assert seen[r][:kept] == whole[r][:kept] and len(seen[r]) == len(seen[1 - r])
    assert all(files == ["blank"] for _, files, _ in seen[1][int(lose[2:]) - 1:])   # rank 1 trained blanks since
    assert not any(files == ["blank"] for _, files, _ in seen[0])

    after, weights = _launch(data, tmp_path, monkeypatch, "resume", last=last)
    for r in (0, 1):
        assert after[r]["seen"] == whole[r][kept:], f"rank {r}: other batches after the resume"
        assert ranks[r]["img_sizes"][:kept] + after[r]["img_sizes"] == whole_sizes[r], f"rank {r}: other sizes"
    differ = [k for k, v in whole_weights.items() if not torch.equal(v, weights[k])]
    assert not differ, f"{len(differ)} of {len(whole_weights)} tensors differ from the uninterrupted run's: {differ[:3]}"


def test_one_process_still_raises_the_loaders_error_with_last_pt_and_trains_no_blank_batch(
        sample_yolo, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FF_LOSE", "0:3")
    monkeypatch.delenv("FF_SIGNAL", raising=False)
    model = YOLO("yolov8n.yaml")
    with pytest.raises(DataSourceFailed) as lost:
        model.train(data=str(sample_yolo / "data.yaml"), trainer=RecordingTrainer, project=str(tmp_path), name="s",
                    **(RUN | dict(multi_scale=0.0, imgsz=64, nbs=2)))
    last = tmp_path / "s" / "weights" / "last.pt"
    assert str(lost.value) == ("s3://bucket/train.ff: unreachable (test); training stopped after 2 batches of epoch 1: "
                               f"{last} holds them: continue with YOLO('{last}').train(resume=True, "
                               "trainer=RecordingTrainer) once it is reachable")
    assert len(model.trainer._seen) == 2 and model.trainer.train_loader.lost is None   # raised, no blank batch
    _, ckpt = load_checkpoint(last)
    assert (ckpt[KEY]["batches"], ckpt[KEY]["why"], ckpt[STATE_KEY]["updates"]) == (2, "data source failed", 2)


@pytest.mark.parametrize(("task", "loader", "over"), [
    ("detect", "cpu", {}), ("detect", "device", {}), ("segment", "cpu", {}), ("segment", "cpu", {"overlap_mask": False}),
    ("pose", "cpu", {}), ("obb", "cpu", {})], ids=["detect", "detect-device", "segment", "segment-separate", "pose", "obb"])
def test_under_ddp_a_lost_source_gives_blank_batches_the_tasks_loss_takes(tmp_path, monkeypatch, task, loader, over):
    """As rank 1 of 2 (no process group needed: the feed's own rank): the loader's error on its 3rd batch becomes the
    rest of the epoch in blank batches (a real batch's keys, dtypes and shapes, no object), counted in `position`,
    and the next epoch is blank too; the task's loss takes them."""
    from dataclasses import replace

    monkeypatch.setenv("FASTFEED_LOADER", loader)
    monkeypatch.setenv("FF_LOSE", "0:3")   # (this process is Ultralytics' RANK -1: FF_LOSE's rank 0)
    data = make_set(tmp_path / "set", "segment" if task == "detect" else task, n=16)   # 4 batches of 2 a rank
    cls, model = TRAINERS[task]
    trainer = cls(overrides=dict(model=model, data=str(data / "data.yaml"), imgsz=64, batch=2, epochs=2, device="cpu",
                                 workers=0, plots=False, project=str(tmp_path), name="t", seed=0, close_mosaic=0, **over))
    trainer.model = trainer.get_model(cfg=model, verbose=False)
    one = trainer.get_dataloader(trainer.data["train"], batch_size=2, rank=-1, mode="train")
    one.close()
    feed = FastfeedTrainLoader(one.name, one.store, replace(one.cfg, rank=1, world_size=2), options=one.options,
                               class_filter=one.class_filter)
    lose_at(feed)
    try:
        batches, positions = [], []
        for b in feed:
            batches.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()})
            positions.append(feed.position)
        assert feed.lost == "s3://bucket/train.ff: unreachable (test)"
        assert len(batches) == len(feed) == 4 and positions == [1, 2, 3, 4]
        real, blank = batches[0], batches[2]
        assert sorted(blank) == sorted(real) and blank["img"].shape == (2, 3, 64, 64) and not blank["img"].any()
        per_image = {"img", "sem_masks"} | ({"masks"} if feed.cfg.overlap_mask else set())
        for k, v in real.items():
            if isinstance(v, torch.Tensor):
                assert blank[k].dtype == v.dtype and blank[k].shape[1:] == v.shape[1:], k
                assert len(blank[k]) == 2 and not blank[k].any() if k in per_image else len(blank[k]) == 0 < len(v), k
        assert [feed.position for _ in feed] == [1, 2, 3, 4]   # the next epoch: blank batches only
        net = trainer.model
        net.args = trainer.args
        loss, _ = net.loss(trainer.preprocess_batch(blank))
        assert torch.isfinite(loss).all()
    finally:
        feed.close()


@pytest.fixture
def rank_1_feed(sample_yolo, tmp_path, monkeypatch):  # noqa: F811
    """A FastfeedTrainer's feed as rank 1 of 2 (16 images, batch 2: 4 batches an epoch)."""
    from dataclasses import replace

    from ultra_data import train_loader_of

    monkeypatch.delenv("FASTFEED_LOADER", raising=False)
    _, one = train_loader_of(FastfeedTrainer, sample_yolo, tmp_path, imgsz=64, batch=2)
    one.close()
    feed = FastfeedTrainLoader(one.name, one.store, replace(one.cfg, rank=1, world_size=2), options=one.options)
    yield feed
    feed.close()


def test_under_ddp_an_error_that_is_not_the_sources_still_raises(rank_1_feed):
    def broken():
        raise ValueError("a bug, not an outage")
        yield

    rank_1_feed.loader.iter_batches = broken
    with pytest.raises(ValueError, match="a bug, not an outage"):
        next(iter(rank_1_feed))
    assert rank_1_feed.lost is None


def test_under_ddp_a_source_lost_as_the_epoch_is_set_gives_the_whole_epoch_blank(rank_1_feed):
    from fastfeed.store.objstore import RemoteError

    def lost(epoch, start=0):
        raise RemoteError("s3://bucket/train.ff: unreachable (test)")

    rank_1_feed.loader.set_epoch = lost
    got = [(b["cls"].shape[0], rank_1_feed.position) for b in rank_1_feed]
    assert got == [(0, 1), (0, 2), (0, 3), (0, 4)] and rank_1_feed.lost.startswith("s3://bucket/train.ff")
