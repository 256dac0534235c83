"""Slow proofs of the trainer: it can overfit a few real images (so loss, assignment, NMS and evaluation
agree with each other), and `torchrun ... -m fastfeed train` runs as documented."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from train_helpers import rows

import fastfeed
from fastfeed.pack import PackConfig, pack
from fastfeed.train import TrainConfig, load_checkpoint, train


def first_images(tmp_path, n):
    """A COCO-layout copy of the bundled sample's first n images, packed."""
    src, dst = fastfeed.sample_path(), tmp_path / f"coco{n}"
    (dst / "images" / "train2017").mkdir(parents=True)
    (dst / "annotations").mkdir()
    ann = json.loads((src / "annotations" / "instances_train2017.json").read_text())
    images = sorted(ann["images"], key=lambda im: im["id"])[:n]
    ids = {im["id"] for im in images}
    for im in images:
        shutil.copy(src / "images" / "train2017" / im["file_name"], dst / "images" / "train2017")
    ann.update(images=images, annotations=[a for a in ann["annotations"] if a["image_id"] in ids])
    (dst / "annotations" / "instances_train2017.json").write_text(json.dumps(ann))
    pack(PackConfig(src=dst, out=tmp_path / f"s{n}.ff", progress=False))
    return tmp_path / f"s{n}.ff"


@pytest.mark.slow
def test_yolov3_tiny_overfits_eight_images(tmp_path):
    """From scratch, on letterboxed (unaugmented) batches of the same 8 images (55 boxes, 20 classes, some
    under 16 px), evaluated on those images: mAP@0.5 >= 0.5 only if the targets, the loss, the decoding,
    NMS and the unletterboxing into COCO coordinates all agree. ~2-4 minutes on 2 cores."""
    store = first_images(tmp_path, 8)
    t0 = time.perf_counter()
    res = train(TrainConfig(data=store, val=store, model="yolov3-tiny", imgsz=256, batch=8, accum=1, epochs=200,
                            optimizer="adamw", warmup_epochs=5, augment=False, workers=0, eval_every=50,
                            log_every=50, out=tmp_path / "run"))
    took = time.perf_counter() - t0
    print(f"overfit: {took:.0f} s, evals {res.evals}")
    assert res.summary["map50"] >= 0.5, res.evals
    assert res.evals[0]["map50"] < res.summary["map50"]     # it learned; it did not start there
    assert res.summary["loss"] < 0.5 * rows(tmp_path / "run")[0]["loss"]   # the first log row, whatever events precede it


@pytest.mark.slow
def test_torchrun_two_processes_from_the_command_line(tmp_path):
    store = tmp_path / "sample.ff"
    pack(PackConfig(src=fastfeed.sample_path(), out=store, progress=False))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "fastfeed",
           "train", "--data", str(store), "--val", str(store), "--model", "yolov3-tiny", "--imgsz", "64", "--batch", "2",
           "--epochs", "1", "--workers", "0", "--accum", "1", "--out", str(tmp_path / "run"), "--quiet", "--json"]
    # Its own session, so a hang is cleaned up with the workers torchrun started, not just torchrun.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        out, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    assert p.returncode == 0, err[-3000:]
    s = json.loads(out[out.index("{"):])   # rank 0 alone prints the summary
    assert s["world_size"] == 2 and s["step"] == 4 and s["images_per_step"] == 4   # 16 images / (2 x 2)
    assert s["map50"] is not None
    ck = load_checkpoint(tmp_path / "run" / "last.pt")
    assert ck["epoch"] == 1 and ck["step"] == 4
    assert all(torch.isfinite(v).all() for v in ck["model"].values() if v.is_floating_point())
