"""`fastfeed train` on the command line: a run, evaluation and fine-tuning, errors, --help, defaults and
choices from TrainConfig and the registries, --hyp files and --device-augment."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from train_helpers import TINY, packed_sample, rows

from fastfeed.augment.hyp import AugmentHyp
from fastfeed.cli import build_parser, main
from fastfeed.loaders import list_loaders
from fastfeed.train import MODELS, TrainConfig, train
from fastfeed.train.config import load_hyp


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return packed_sample(tmp_path_factory)


# --- training, evaluation, fine-tuning, errors ------------------------------------------------------------------------------------------------

def test_cli_trains_evaluates_and_reports(store, tmp_path, capsys):
    args = ["train", "--data", str(store), "--val", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--batch",
            "4", "--epochs", "1", "--max-steps", "2", "--workers", "0", "--accum", "1", "--out", str(tmp_path), "--quiet"]
    assert main(args + ["--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["step"] == 2 and s["model"] == "yolov3-tiny" and 0 <= s["data_wait_frac"] <= 1 and s["images"] == 8
    assert s["map50"] is not None and (tmp_path / "best.pt").is_file()
    row = rows(tmp_path)[0]
    assert {"loss", "box", "obj", "cls", "lr", "images_per_s", "data_ms", "compute_ms"} <= set(row)
    assert main(["train", "--val", str(store), "--eval-only", "--weights", str(tmp_path / "last.pt"), "--imgsz", "64",
                 "--workers", "0", "--quiet"]) == 0
    assert "yolov3-tiny" in (out := capsys.readouterr().out) and "mAP@0.5" in out and "16 images" in out
    # Fine-tuning from a checkpoint's weights: a new run (step 0), the weights (its EMA) loaded.
    ft = ["train", "--data", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--batch", "4", "--max-steps", "1",
          "--workers", "0", "--accum", "1", "--out", str(tmp_path / "ft"), "--quiet", "--json"]
    assert main(ft + ["--weights", str(tmp_path / "last.pt")]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 1
    assert main(ft + ["--model", "yolov3", "--force", "--weights", str(tmp_path / "last.pt")]) == 1
    assert "holds a yolov3-tiny with 80 classes; this run builds a yolov3" in capsys.readouterr().err


def test_cli_help_and_bad_input(store, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert e.value.code == 0
    for flag in ("--amp", "--grad-ckpt", "--accum", "--resume", "--eval-only", "torchrun", "--max-steps", "--hyp",
                 "--device-augment", "--multi-scale", "--sync-bn", "--freeze-bn", "--channels-last", "--micro-batch",
                 "'auto'", "bottleneck", "--save-every-min", "status 75", "SIGTERM"):
        assert flag in text
    base = ["train", "--data", str(store), "--model", "yolov3-tiny", "--workers", "0", "--out", str(tmp_path), "--quiet"]
    assert main(base + ["--imgsz", "100"]) == 2
    assert "--imgsz must be a positive multiple of 32" in capsys.readouterr().err
    assert main(["train", "--data", str(tmp_path / "nope")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["train", "--model", "yolov3-tiny"]) == 2
    assert "--data is required" in capsys.readouterr().err
    assert main(base + ["--resume"]) == 1
    assert "last.pt does not exist" in capsys.readouterr().err
    assert main(base + ["--batch", "32"]) == 1
    assert "more than the store's 16 images" in capsys.readouterr().err
    for flag, value, valid in (("--loader", "nope", "'cpu', 'dali', 'device', 'shm'"), ("--amp", "fp8", "'bf16', 'fp16'"),
                               ("--model", "yolov5", "'yolov3', 'yolov3-tiny'")):
        with pytest.raises(SystemExit) as e:
            main(base + [flag, value])
        assert e.value.code == 2
        assert f"{flag}: invalid choice: '{value}' (choose from {valid})" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--batch", "lots"])
    assert "expected a number of images or 'auto', got 'lots'" in capsys.readouterr().err



# --- one definition: defaults and choices --------------------------------------------------------------------

def _train_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["train"]


def test_defaults_and_choices_come_from_train_config_and_the_registries():
    p = _train_parser()
    args = p.parse_args(["--data", "x.ff"])
    defaults = TrainConfig(data="x.ff")
    checked = 0
    for f in fields(TrainConfig):
        v = getattr(args, f.name, None)
        if v is not None and f.name not in ("data", "progress"):   # progress: the CLI shows a bar unless --quiet
            assert v == getattr(defaults, f.name), f.name
            checked += 1
    assert checked >= 20
    choices = {a.dest: a.choices for a in p._actions if a.choices is not None}
    assert tuple(choices["model"]) == MODELS and list(choices["loader"]) == list_loaders()


# --- --hyp and --device-augment ------------------------------------------------------------------------------

def test_hyp_files_are_checked_and_reach_the_loader(store, tmp_path, capsys, monkeypatch):
    good = tmp_path / "hyp.yaml"
    good.write_text("mosaic: 0.0\nhsv_v: 0.2\nfliplr: 0.0\n")
    assert load_hyp(good) == AugmentHyp(mosaic=0.0, hsv_v=0.2, fliplr=0.0)
    (tmp_path / "typo.yaml").write_text("mosaic: 1.0\nlr0: 0.01\nmixupp: 0.1\n")
    with pytest.raises(ValueError, match=r"--hyp .*typo.yaml: unknown key\(s\) lr0, mixupp; valid keys: mosaic, mixup"):
        load_hyp(tmp_path / "typo.yaml")
    (tmp_path / "range.yaml").write_text("scale: 5\n")
    with pytest.raises(ValueError, match=r"AugmentHyp.scale=5 is out of range; valid: \[0.0, 1.0\)"):
        load_hyp(tmp_path / "range.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match="must be a mapping of augmentation gains"):
        load_hyp(tmp_path / "list.yaml")
    base = ["train", "--data", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--batch", "2", "--workers", "0",
            "--accum", "1", "--max-steps", "1", "--out", str(tmp_path / "run"), "--quiet"]
    assert main(base + ["--hyp", str(tmp_path / "typo.yaml")]) == 2
    assert "unknown key(s) lr0, mixupp" in capsys.readouterr().err
    assert main(base + ["--hyp", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read it" in capsys.readouterr().err

    import fastfeed.loaders as loaders

    seen, real = [], loaders.create_loader
    monkeypatch.setattr(loaders, "create_loader", lambda name, st, cfg, **kw: seen.append(cfg) or real(name, st, cfg, **kw))
    assert main(base + ["--hyp", str(good), "--device-augment"]) == 0
    assert seen[0].hyp == AugmentHyp(mosaic=0.0, hsv_v=0.2, fliplr=0.0) and seen[0].device_augment
    assert seen[0].worker_hyp().hsv_v == 0.0   # the workers leave HSV to the device
    start = rows(tmp_path / "run", "start")[0]
    assert start["config"]["hyp"]["hsv_v"] == 0.2 and start["config"]["device_augment"] is True


def test_device_augment_trains_and_its_draws_are_seeded(store, tmp_path):
    a = train(TrainConfig(data=store, out=tmp_path / "a", max_steps=2, device_augment=True, **TINY))
    b = train(TrainConfig(data=store, out=tmp_path / "b", max_steps=2, device_augment=True, **TINY))
    c = train(TrainConfig(data=store, out=tmp_path / "c", max_steps=2, **TINY))
    assert rows(tmp_path / "a")[-1]["loss"] == rows(tmp_path / "b")[-1]["loss"]     # seeded: the same run twice
    assert rows(tmp_path / "a")[-1]["loss"] != rows(tmp_path / "c")[-1]["loss"]     # and not the workers' draws
    assert a.summary["step"] == b.summary["step"] == c.summary["step"] == 2


def test_train_config_errors_name_the_flag():
    for kw, match in [({"imgsz": 100}, "--imgsz must be a positive multiple of 32"),
                      ({"model": "yolov5"}, "--model must be one of yolov3, yolov3-tiny"),
                      ({"accum": 0}, "--accum must be >= 1"),
                      ({"seed": -1}, "--seed must be an integer >= 0"),
                      ({"amp": "fp8"}, "--amp must be one of bf16, fp16"),
                      ({"device": "tpu"}, "--device must be cpu"),
                      ({"optimizer": "lion"}, "--optimizer must be one of sgd, adamw"),
                      ({"resume": True, "weights": "x.pt"}, "--resume and --weights exclude each other"),
                      ({"resume": "auto", "force": True}, "--resume continues the run in --out; --force"),
                      ({"resume": True, "eval_only": True, "weights": "x.pt", "val": "."}, "--eval-only \\(evaluate"),
                      ({"batch": "many"}, "--batch must be >= 1 or 'auto'"),
                      ({"batch": 4, "micro_batch": 8}, "--micro-batch must be <= --batch 4")]:
        with pytest.raises(ValueError, match=match):
            TrainConfig(data=".", **kw)
    with pytest.raises(ValueError, match="--data is required"):
        TrainConfig()
    with pytest.raises(ValueError, match="--eval-only evaluates --weights CKPT on --val STORE: give --weights CKPT$"):
        TrainConfig(eval_only=True, val=".")
    assert TrainConfig(data=".", batch=16).resolved_accum(1) == 4
    assert TrainConfig(data=".", batch=16).resolved_accum(4) == 1
    assert TrainConfig(data=".", optimizer="adamw").lr == 0.001
    assert TrainConfig(data=".").lr == 0.01 and TrainConfig(data=".", batch="auto").resolved_accum(1, 8) == 8


def test_a_segment_store_trains_and_evaluates_on_its_boxes_alone(tmp_path, capsys, monkeypatch):
    """The bundled models detect: a task store's polygons are neither drawn into masks nor refused with
    --device-augment (which flips boxes only); the run says it trains on the boxes."""
    from task_stores import make_task_store

    import fastfeed.loaders.pipeline as pipeline

    seg = make_task_store(tmp_path / "seg", "segment")
    monkeypatch.setattr(pipeline, "rasterise", lambda *a, **k: pytest.fail("a mask was drawn for a detector"))
    assert main(["train", "--data", str(seg.path), "--val", str(seg.path), "--model", "yolov3-tiny", "--imgsz", "64",
                 "--batch", "4", "--epochs", "1", "--max-steps", "1", "--workers", "0", "--device-augment",
                 "--out", str(tmp_path / "run"), "--json"]) == 0
    captured = capsys.readouterr()
    assert f"{seg.path} is a store of segment labels: training on its boxes alone" in captured.err
    summary = json.loads(captured.out)
    assert summary["step"] == 1 and summary["map50"] is not None


def test_train_and_evaluate_with_the_device_loader(store, tmp_path, capsys):
    """`fastfeed train --loader device`: batches made on the device (here the CPU) go straight to the step."""
    assert main(["train", "--data", str(store), "--val", str(store), "--loader", "device", "--model", "yolov3-tiny",
                 "--imgsz", "64", "--batch", "4", "--epochs", "1", "--max-steps", "1", "--workers", "1",
                 "--device", "cpu", "--out", str(tmp_path), "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step"] == 1 and summary["images"] == 16 and summary["map50"] >= 0.0
