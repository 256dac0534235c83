"""Each augmentation fastfeed renders beyond the base plan, against Ultralytics' own training loader on the same
images, built the way each trainer builds it: its statistic (the share of BGR samples for bgr, ...) inside
Ultralytics' run-to-run spread, and `fraction`'s choice of images. Run in the Ultralytics venv."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from ultra_data import NO_COLOUR, RED, painted_yolo, train_loader_of  # noqa: F401  (painted_yolo: a fixture)

pytest.importorskip("ultralytics")

from ultralytics.models.yolo.detect import DetectionTrainer  # noqa: E402

from fastfeed.integrations.ultralytics import FastfeedTrainer  # noqa: E402

SAMPLES = 240
SEEDS = (0, 1, 2)


def _ultralytics_samples(painted, tmp, seed: int, n: int = SAMPLES, **over) -> list[np.ndarray]:
    """`n` training samples (CHW uint8, as its trainer receives them) from Ultralytics' own dataset, seeded."""
    _, loader = train_loader_of(DetectionTrainer, painted, tmp, seed=seed, **over)
    random.seed(seed)
    np.random.seed(seed)
    return [loader.dataset[i % len(loader.dataset)]["img"].numpy() for i in range(n)]


def _fastfeed_samples(painted, tmp, seed: int, n: int = SAMPLES, **over) -> list[np.ndarray]:
    """`n` training samples from FastfeedTrainer's loader, epoch after epoch."""
    trainer, loader = train_loader_of(FastfeedTrainer, painted, tmp, seed=seed, **over)
    out = []
    try:
        for epoch in range(n):
            trainer.epoch = epoch
            for batch in loader:
                out += [x.numpy().copy() for x in batch["img"]]
            if len(out) >= n:
                return out[:n]
    finally:
        loader.close()
    return out


def _spread_holds(ours: float, theirs: list[float], n: int) -> None:
    """`ours` inside Ultralytics' run-to-run range, widened by 3 binomial standard deviations of an n-sample share."""
    p = float(np.mean(theirs))
    slack = 3 * np.sqrt(max(p * (1 - p), 1e-3) / n)
    assert min(theirs) - slack <= ours <= max(theirs) + slack, (ours, theirs)


def _bgr_share(samples) -> float:
    """The share of samples whose red paint came out blue: channel order BGR."""
    red, blue = np.array(RED).reshape(3, 1, 1), np.array(RED[::-1]).reshape(3, 1, 1)
    flips = [np.all(np.abs(x.astype(int) - blue) <= 40, 0).sum() > np.all(np.abs(x.astype(int) - red) <= 40, 0).sum()
             for x in samples]
    return float(np.mean(flips))


def test_bgr_share_inside_ultralytics_spread(painted_yolo, tmp_path):  # noqa: F811
    over = {**NO_COLOUR, "bgr": 0.3}
    theirs = [_bgr_share(_ultralytics_samples(painted_yolo, tmp_path, s, **over)) for s in SEEDS]
    ours = _bgr_share(_fastfeed_samples(painted_yolo, tmp_path, 0, **over))
    assert 0.15 < ours < 0.45
    _spread_holds(ours, theirs, SAMPLES)
    assert _bgr_share(_fastfeed_samples(painted_yolo, tmp_path, 0, n=48, **NO_COLOUR)) == 0.0


@pytest.mark.parametrize("fraction", [0.5, 7])
def test_fraction_trains_on_the_images_ultralytics_would(painted_yolo, tmp_path, fraction):  # noqa: F811
    _, theirs = train_loader_of(DetectionTrainer, painted_yolo, tmp_path, fraction=fraction)
    trainer, ours = train_loader_of(FastfeedTrainer, painted_yolo, tmp_path, fraction=fraction, batch=2)
    try:
        files = {Path(f).name for f in theirs.dataset.im_files}
        assert len(files) == (12 if fraction == 0.5 else 7)
        seen = set()
        for epoch in range(3):
            trainer.epoch = epoch
            for batch in ours:
                seen |= {Path(f).name for f in batch["im_file"]}
        assert seen == files
    finally:
        ours.close()
