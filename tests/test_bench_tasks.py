"""fastfeed bench says which task a store holds (issue 28): in the table's header, and the task's line as
`fastfeed pack` / `inspect` word it; a detect store says detect and nothing more."""

from __future__ import annotations

import json

import pytest
from bench_helpers import FAST
from conftest import YoloBuilder
from store_helpers import run_pack

from fastfeed.cli import main

POLY = "0 0.1 0.2 0.5 0.2 0.45 0.6 0.15 0.55"


@pytest.fixture(scope="module")
def segment_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-seg")
    b = YoloBuilder(root / "y", names=["a"])
    for k in range(4):
        b.add(str(k), [POLY], seed=k)
    run_pack(root / "y", root / "seg.ff", task="segment")
    return root / "seg.ff"


def _bench(store, tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = main(["bench", "--data", str(store), "--loader", "cpu", "--workers", "0", "--batches", "2", "--warmup", "1",
               "--json", str(out), *FAST])
    return rc, capsys.readouterr().out, json.loads(out.read_text())


def test_bench_names_a_segment_stores_task_and_what_it_holds(segment_store, tmp_path, capsys):
    rc, text, d = _bench(segment_store, tmp_path, capsys)
    assert rc == 0
    header = text.splitlines()[0]
    assert header.startswith("fastfeed bench") and "(4 images, original, task segment)" in header
    assert "task segment: 4 objects with a polygon, 4.0 points each on average" in text.splitlines()
    assert d["store"]["task"]["name"] == "segment" and d["store"]["task"]["polygons"] == 4


def test_bench_of_a_detect_store_says_detect_and_no_task_line(tmp_path, capsys):
    b = YoloBuilder(tmp_path / "y", names=["a"])
    for k in range(2):
        b.add(str(k), ["0 0.5 0.5 0.2 0.2"], seed=k)
    run_pack(tmp_path / "y", tmp_path / "det.ff")
    rc, text, d = _bench(tmp_path / "det.ff", tmp_path, capsys)
    assert rc == 0 and "(2 images, original, task detect)" in text.splitlines()[0]
    assert not any(line.startswith("task ") for line in text.splitlines())
    assert d["store"]["task"] == {"name": "detect"}


def test_bench_task_detect_reads_a_segment_store_as_boxes_alone_and_says_so(segment_store, tmp_path, capsys,
                                                                            monkeypatch):
    import fastfeed.loaders.pipeline as pipeline

    monkeypatch.setattr(pipeline, "rasterise", lambda *a, **k: pytest.fail("a mask was drawn for --task detect"))
    out = tmp_path / "b.json"
    rc = main(["bench", "--data", str(segment_store), "--loader", "cpu", "--workers", "0", "--batches", "2",
               "--warmup", "1", "--task", "detect", "--json", str(out), *FAST])
    text, d = capsys.readouterr().out, json.loads(out.read_text())
    assert rc == 0 and "task segment store read as detection: boxes alone" in text.splitlines()
    assert not any(line.startswith("task segment:") for line in text.splitlines())
    assert d["store"]["batches"] == "detect" and d["config"]["task"] == "detect"


def test_bench_task_rules_name_the_flag(segment_store, tmp_path, capsys):
    args = ["bench", "--data", str(segment_store), "--loader", "cpu", "--workers", "0", "--batches", "1", *FAST]
    assert main(args + ["--model", "yolov3-tiny", "--task", "segment"]) == 2
    assert "--task must be detect with --model (the bundled models detect), got 'segment'" in capsys.readouterr().err
    assert main(args + ["--task", "pose"]) == 2      # before any loader is measured
    assert f"--task 'pose': {segment_store} is a store of segment labels; its batches can carry its own task (segment) or boxes " \
           "alone ('detect'); pack the dataset with --task pose for keypoints" in capsys.readouterr().err


def test_bench_with_the_bundled_model_reads_boxes_alone(segment_store, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "--data", str(segment_store), "--loader", "cpu", "--workers", "0", "--batches", "1",
                 "--warmup", "1", "--model", "yolov3-tiny", "--json", str(out), *FAST]) == 0
    text = capsys.readouterr().out
    assert "task segment store read as detection: boxes alone (--model: the bundled models detect)" in text
    assert json.loads(out.read_text())["store"]["batches"] == "detect"
