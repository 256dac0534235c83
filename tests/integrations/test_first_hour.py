"""tools/first_hour.sh, the walk-through of docs/first_hour.md, runs as a new user would run it: the bundled
sample, a Roboflow-style export packed from its data.yaml, and FastfeedTrainer printing the feed's data wait."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import ultra_data  # noqa: F401  (Ultralytics offline, its settings in a temporary folder)

pytest.importorskip("ultralytics")

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_first_hour_script_runs_to_the_feeds_data_wait(tmp_path):
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                        "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(REPO / "tools" / "first_hour.sh"), str(tmp_path / "fh")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    for expected in ("sample.ff: OK, 16 records checked, 16 images decoded",
                     "wrote batch.png: task detect, 4 images",
                     "plan: 16 images; per epoch 2 batches of 8",
                     "bottleneck: ",
                     "packed YOLO split train: 12 images, 80 classes",
                     "classes without boxes (56 of 80)",
                     "fastfeed: epoch 1/2: the cpu loader fed 12 images",
                     "fastfeed: epoch 2/2: the cpu loader fed 12 images"):
        assert expected in out, expected
    assert "data wait " in out and "% of the epoch" in out
    csv = (tmp_path / "fh" / "runs" / "export" / "fastfeed.csv").read_text().splitlines()
    assert csv[0] == "epoch,loader,images,seconds,images_per_s,data_wait_s,data_wait_frac" and len(csv) == 3
