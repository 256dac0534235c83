"""`fastfeed train` as a new user meets it: the cost said before the first step (the measured time injected, so
the test asserts the lines and their arithmetic, never a clock), flags taken only as spelled, a finished run
resumed, and the summary's and stop message's words."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace as NS

import pytest
from train_helpers import packed_sample

from fastfeed.cli import main
from fastfeed.train import guards
from fastfeed.train.verdict import advice


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


def _run(model="yolov3", imgsz=640, epochs=3, step=0, world=1):
    recorded = []
    cfg = NS(model=model, imgsz=imgsz, epochs=epochs, max_steps=None)
    run = NS(cfg=cfg, total_steps=epochs * 7, step=step, steps_per_epoch=7, images_per_step=64 * world,
             dd=NS(world_size=world, main=True), device=NS(type="cpu"), report=NS(record=recorded.append))
    return run, recorded


def test_the_cost_before_the_first_step_is_one_images_time_times_a_step_epoch_and_run(caplog):
    run, recorded = _run()
    with caplog.at_level(logging.INFO, logger="fastfeed"):
        guards.estimate(run, seconds=lambda r: 3.0)     # one image's forward and backward: 3 s, injected
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("cost, before the first step: one image's forward and backward took 3.00 s here, so a step of "
                        "64 images takes about 3 min; at that pace an epoch (7 steps) takes ~22 min and the 21 steps "
                        "left ~67 min")   # 3 x 64 = 192 s; x 7 = 1344 s; x 21 = 4032 s
    assert lines[1] == ("on a CPU this run takes ~67 min; to finish sooner: --model yolov3-tiny (about 12x less "
                        "compute), --imgsz 320 (about 4x fewer pixels), fewer --epochs (now 3) or --max-steps N, or an "
                        "accelerator (--device cuda or npu)")
    assert recorded[0]["step_s"] == 192.0 and recorded[0]["run_s"] == 192.0 * 21 and recorded[0]["steps_left"] == 21


def test_the_cost_counts_the_images_of_this_process_and_names_no_setting_the_run_has(caplog):
    run, _ = _run(model="yolov3-tiny", imgsz=320, epochs=300, step=14, world=2)   # resumed at step 14, 2 processes
    with caplog.at_level(logging.INFO, logger="fastfeed"):
        guards.estimate(run, seconds=lambda r: 0.5)
    lines = [r.getMessage() for r in caplog.records]
    assert "so a step of 64 images takes about 32 s" in lines[0] and "the 2086 steps left ~18.5 h" in lines[0]
    assert lines[1] == ("on a CPU this run takes ~18.5 h; to finish sooner: fewer --epochs (now 300) or --max-steps N, "
                        "or an accelerator (--device cuda or npu)")
    caplog.clear()
    run, _ = _run(model="yolov3-tiny", imgsz=320, epochs=1)
    with caplog.at_level(logging.INFO, logger="fastfeed"):
        guards.estimate(run, seconds=lambda r: 0.01)     # minutes, not hours: no advice
    assert len(caplog.records) == 1 and "the 7 steps left ~4.5 s" in caplog.records[0].getMessage()


def test_the_verdicts_advice_on_a_cpu_names_no_setting_the_run_already_has():
    assert advice("compute", {"device": "cpu", "model": "yolov3-tiny", "imgsz": 320}) == [
        "an accelerator (--device cuda or npu)"]
    assert advice("compute", {"device": "cpu", "model": "yolov3", "imgsz": 640})[1:] == [
        "--model yolov3-tiny (about 12x less compute)", "--imgsz 320 (about 4x fewer pixels)"]


def test_a_cpu_run_says_its_cost_before_the_first_step(store, tmp_path, capsys, monkeypatch):
    measured = []
    monkeypatch.setattr(guards, "image_seconds", lambda run: measured.append(run.step) or 40.0)
    args = ["train", "--data", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--batch", "4", "--epochs", "2",
            "--workers", "0", "--accum", "1", "--max-steps", "1", "--out", str(tmp_path), "--quiet"]
    assert main(args) == 0
    err = capsys.readouterr().err
    cost = err.index("cost, before the first step: one image's forward and backward took 40.00 s here, so a step of "
                     "4 images takes about 3 min; at that pace an epoch (4 steps) takes ~11 min and the 1 steps left ~3 min")
    assert measured == [0] and cost < err.index("the first step took") < err.index("epoch 1/2 step 1 loss")
    assert "to finish sooner" not in err   # 3 min is no hours


def test_flags_are_taken_only_as_spelled(store, tmp_path, capsys):
    for argv in (["train", "--data", str(store), "--epoch", "1"], ["pack", "-o", str(tmp_path / "x"), "--max-drop", "1"],
                 ["cache", "ls", "--shard"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and f"unrecognized arguments: {argv[-2] if argv[-1].isdigit() else argv[-1]}" in (
            capsys.readouterr().err)


def test_a_finished_run_resumed_says_so_and_where_its_weights_are(store, tmp_path, capsys):
    args = ["train", "--data", str(store), "--val", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--batch",
            "8", "--epochs", "1", "--workers", "0", "--accum", "1", "--out", str(tmp_path), "--quiet"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "step 2, epochs done 1/1 (steps of up to 8 images); 16 images trained in" in first
    rows = len((tmp_path / "metrics.jsonl").read_text().splitlines())
    assert main(args + ["--resume"]) == 0
    out = capsys.readouterr().out
    best = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["best_map"]
    assert out.startswith(f"{tmp_path} is a finished run: all 1 epochs done, step 2; best mAP@0.5:0.95 {best:.4f} "
                          f"({tmp_path / 'best.pt'}); last weights {tmp_path / 'last.pt'}.")
    assert "Nothing to train" in out and "images trained" not in out and "bottleneck" not in out
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == rows   # nothing appended
    assert main(args + ["--resume", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "finished"
    assert main([a for a in args if a != "--quiet"] + ["--resume"]) == 0   # its log lines shown: none says it
    said = capsys.readouterr()                                            # resumes an epoch past the last
    assert "is a finished run" in said.out and "resumed at step" not in said.out + said.err


def test_eval_only_without_its_checkpoint_names_the_flag_not_a_python_value(store, capsys):
    assert main(["train", "--val", str(store), "--eval-only"]) == 2
    err = capsys.readouterr().err
    assert "--eval-only evaluates --weights CKPT on --val STORE: give --weights CKPT" in err and "PosixPath" not in err


def test_the_image_measured_for_the_cost_leaves_the_run_as_it_was(store, tmp_path, monkeypatch):
    import torch

    args = ["train", "--data", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--batch", "4", "--epochs", "1",
            "--workers", "0", "--accum", "1", "--max-steps", "2", "--quiet", "--no-ema"]
    assert main(args + ["--out", str(tmp_path / "measured")]) == 0
    monkeypatch.setattr(guards, "image_seconds", lambda run: 1.0)
    assert main(args + ["--out", str(tmp_path / "not")]) == 0
    a, b = (torch.load(tmp_path / d / "last.pt", weights_only=True)["model"] for d in ("measured", "not"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)   # weights and BatchNorm statistics


def test_the_stop_message_counts_epochs_from_1_as_the_log_lines_do(tmp_path, caplog):
    from fastfeed.train.loop import stopped

    run = NS(stopped_by="SIGTERM", signals=NS(seconds_since=lambda: None), dd=NS(main=True), step=2, epoch=0,
             cfg=NS(epochs=3), skip=2, nb=8, out=tmp_path)
    with caplog.at_level(logging.WARNING, logger="fastfeed"):
        assert stopped(run) == {"stopped_by": "SIGTERM", "stop_seconds": None}
    assert f"SIGTERM: stopped after step 2 (epoch 1/3, 2 of 8 batches); {tmp_path / 'last.pt'} holds it" in caplog.text
