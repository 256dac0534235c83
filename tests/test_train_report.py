"""What `fastfeed train` tells a user: the plan at the start (images per step, images drop_last leaves out,
mosaic epochs), the log and mAP lines by default (pycocotools' tables with -v), a summary whose figures are
the ones the run used, and a verdict whose advice runs where it is given."""

from __future__ import annotations

import json

import pytest
from train_helpers import packed_sample, rows

from fastfeed.cli import main
from fastfeed.train.verdict import verdict


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


def _train(store, out, *extra):
    return main(["train", "--data", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--workers", "0",
                 "--out", str(out), *map(str, extra)])


def test_a_small_store_says_what_the_run_really_does(store, tmp_path, capsys):
    # 16 images, --batch 6: 2 whole batches per epoch, 4 images left out; the default accumulation (64 images)
    # cannot reach past the epoch's 2 batches; --close-mosaic 10 (the default) covers all 3 epochs.
    assert _train(store, tmp_path, "--batch", "6", "--epochs", "3", "--json") == 0
    cap = capsys.readouterr()
    assert ("plan: 16 images; per epoch 2 batches of 6, 4 images left out (whole batches only; other ones each "
            "epoch); 1 optimizer step(s) per epoch of 12 images (2 batch(es) each); 3 epochs, none with mosaic "
            "(--close-mosaic 10 covers them all)") in cap.err
    assert "warning: 4 of the store's 16 images are left out of every epoch" in cap.err
    assert "warning: mosaic is never used: --close-mosaic 10 covers all 3 epochs" in cap.err
    s = json.loads(cap.out)
    assert s["images_per_step"] == 12 and s["accum"] == 2 and s["step"] == 3 and s["images"] == 36
    start = rows(tmp_path, "start")[0]
    assert start["images_per_step"] == 12 and start["plan"]["left_out"] == 4 and start["plan"]["mosaic_epochs"] == 0
    assert all(r["images_per_s"] > 0 for r in rows(tmp_path))


def test_the_plan_with_mosaic_and_a_short_last_step(store, tmp_path, capsys):
    assert _train(store, tmp_path, "--batch", "4", "--accum", "3", "--epochs", "3", "--close-mosaic", "1",
                  "--max-steps", "1", "--json") == 0
    cap = capsys.readouterr()
    assert ("per epoch 4 batches of 4; 2 optimizer step(s) per epoch of 12 images (3 batch(es) each, the epoch's "
            "last 4); 3 epochs, mosaic in epochs 1-2, without it in the last 1 (--close-mosaic)") in cap.err
    assert "left out" not in cap.err and "warning" not in cap.err


def test_log_and_map_lines_show_by_default_and_the_tables_with_v(store, tmp_path, capsys):
    base = ["--val", store, "--batch", "4", "--accum", "1", "--epochs", "1", "--max-steps", "2", "--log-every", "1"]
    assert _train(store, tmp_path / "a", *base) == 0
    err = capsys.readouterr().err
    assert "epoch 1/1 step 1 loss" in err and "epoch 1/1 step 2 loss" in err and "img/s; per batch: data" in err
    assert "mAP@0.5" in err and "Average Precision" not in err and "INFO" not in err
    assert "\r" not in err and "step/s" not in err and "s/step" not in err     # a log file: plain lines, no bar
    assert main(["-v", "train", "--data", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--workers", "0",
                 "--out", str(tmp_path / "b"), *map(str, base)]) == 0
    err = capsys.readouterr().err
    assert "epoch 1/1 step 1 loss" in err and "fastfeed: debug: " in err


def test_pycocotools_tables_are_debug_lines(store, caplog):
    from fastfeed import Store
    from fastfeed.train.evaluate import coco_ground_truth, coco_map

    gt, _ = coco_ground_truth(Store(store), 64)
    dets = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.9}
            for a in gt.dataset["annotations"] if not a["iscrowd"]]
    with caplog.at_level("DEBUG", logger="fastfeed"):
        assert coco_map(gt, dets)["map50"] > 0.9
    tables = [r for r in caplog.records if "Average Precision" in r.getMessage()]
    assert tables and all(r.levelname == "DEBUG" for r in tables)


def test_the_verdict_on_a_cpu_never_advises_batch_auto_and_calls_compute_healthy(store, tmp_path, capsys):
    ctx = dict(loader="cpu", workers=2, cores=2, device="cpu", amp=None, channels_last=False, device_augment=False,
               batch_auto=False)
    v = verdict({"data_ms": 1.0, "compute_ms": 99.0}, 4, ctx)
    assert v["bottleneck"] == "compute" and "--batch auto" not in v["text"] and "--amp" not in v["text"]
    assert "the healthy state, the feed keeps up; to go faster: an accelerator (--device cuda or npu)" in v["text"]
    v = verdict({"data_ms": 1.0, "compute_ms": 99.0}, 4, ctx | {"device": "cuda"})
    assert "the healthy state" in v["text"] and "--batch auto" in v["text"]
    assert "healthy" not in verdict({"data_ms": 60.0, "compute_ms": 40.0}, 4, ctx)["text"]
    assert _train(store, tmp_path, "--batch", "4", "--accum", "1", "--max-steps", "2") == 0
    out = capsys.readouterr().out
    assert "bottleneck:" in out and "--batch auto" not in out


def test_on_a_terminal_a_progress_bar_runs_below_the_lines(store, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert _train(store, tmp_path, "--batch", "4", "--accum", "1", "--max-steps", "2", "--log-every", "1") == 0
    err = capsys.readouterr().err
    assert "train: " in err and "\r" in err and "epoch 1/300 step 2 loss" in err
