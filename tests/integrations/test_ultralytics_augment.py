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


def _ultralytics_samples(data, tmp, seed: int, n: int = SAMPLES, trainer=DetectionTrainer, **over) -> list:
    """`n` training samples from Ultralytics' own dataset, seeded: (CHW uint8 image, objects), as its trainer gets
    them."""
    _, loader = train_loader_of(trainer, data, tmp, seed=seed, **over)
    random.seed(seed)
    np.random.seed(seed)
    samples = (loader.dataset[i % len(loader.dataset)] for i in range(n))
    return [(s["img"].numpy(), len(s["cls"])) for s in samples]


def _fastfeed_samples(data, tmp, seed: int, n: int = SAMPLES, trainer=FastfeedTrainer, **over) -> list:
    """`n` training samples from a fastfeed trainer's loader, epoch after epoch (mosaic never closed: as Ultralytics'
    dataset indexed directly): (image, objects)."""
    owner, loader = train_loader_of(trainer, data, tmp, seed=seed, **{"close_mosaic": 0, **over})
    out = []
    try:
        for epoch in range(n):
            owner.epoch = epoch
            for batch in loader:
                idx = batch["batch_idx"].numpy()
                out += [(x.numpy().copy(), int((idx == j).sum())) for j, x in enumerate(batch["img"])]
            if len(out) >= n:
                return out[:n]
    finally:
        loader.close()
    return out


def _their_spread(data, tmp, seen: list, stat, **over) -> list[float]:
    """Ultralytics' `stat(seen, samples)` for each of SEEDS (`seen`: what the patched code records, emptied first)."""
    out = []
    for s in SEEDS:
        seen.clear()
        samples = _ultralytics_samples(data, tmp, s, **over)
        out.append(stat(seen, samples))
    return out


def _spy(monkeypatch, owner, name: str, note) -> None:
    """owner.name replaced by a wrapper that hands each call's result and arguments to `note`."""
    real = getattr(owner, name)

    def spy(*a, **kw):
        out = real(*a, **kw)
        note(out, *a)
        return out

    monkeypatch.setattr(owner, name, spy)


def _inside(per_sample: list, theirs: list[float], what: str) -> float:
    """Our mean of `per_sample` inside Ultralytics' run-to-run range, widened by 3 standard errors of that mean."""
    ours, sd = float(np.mean(per_sample)), float(np.std(per_sample)) / np.sqrt(len(per_sample))
    print(f"{what}: fastfeed {ours:.4f}, Ultralytics {[round(float(t), 4) for t in theirs]}")
    assert min(theirs) - 3 * sd <= ours <= max(theirs) + 3 * sd, (what, ours, theirs)
    return ours


def _bgr_flips(samples) -> list[bool]:
    """Per sample that shows paint: whether its red paint came out blue (channel order BGR)."""
    red, blue = np.array(RED).reshape(3, 1, 1), np.array(RED[::-1]).reshape(3, 1, 1)
    counts = [(np.all(np.abs(x.astype(int) - blue) <= 40, 0).sum(), np.all(np.abs(x.astype(int) - red) <= 40, 0).sum())
              for x, _ in samples]
    return [b > r for b, r in counts if b + r]


@pytest.mark.slow
def test_bgr_share_inside_ultralytics_spread(painted_yolo, tmp_path):  # noqa: F811
    over = {**NO_COLOUR, "bgr": 0.3}
    theirs = _their_spread(painted_yolo, tmp_path, [], lambda _, samples: np.mean(_bgr_flips(samples)), **over)
    ours = _inside(_bgr_flips(_fastfeed_samples(painted_yolo, tmp_path, 0, **over)), theirs, "bgr share")
    assert 0.15 < ours < 0.45
    assert not any(_bgr_flips(_fastfeed_samples(painted_yolo, tmp_path, 0, n=48, **NO_COLOUR)))


@pytest.mark.parametrize(("fraction", "loader"), [(0.5, "cpu"), (7, "cpu"), (0.5, "device")])
def test_fraction_trains_on_the_images_ultralytics_would(painted_yolo, tmp_path, fraction, loader,  # noqa: F811
                                                         monkeypatch):
    """Every loader: `fraction` picks records, it renders nothing."""
    monkeypatch.setenv("FASTFEED_LOADER", loader)
    _, theirs = train_loader_of(DetectionTrainer, painted_yolo, tmp_path, fraction=fraction)
    trainer, ours = train_loader_of(FastfeedTrainer, painted_yolo, tmp_path, fraction=fraction, batch=2)
    try:
        files = {Path(f).name for f in theirs.dataset.im_files}
        assert len(files) == (12 if fraction == 0.5 else 7) == len(ours.dataset) == len(theirs.dataset)
        assert {Path(x["im_file"]).name for x in ours.dataset.labels} == files
        seen = set()
        for epoch in range(3):
            trainer.epoch = epoch
            for batch in ours:
                seen |= {Path(f).name for f in batch["im_file"]}
        assert seen == files
    finally:
        ours.close()


def _corner_shift(m: np.ndarray, centre, half: float) -> float:
    """How far perspective moves the corners of the frame (centre +- half) that matrix `m` (T S R P C, flips on
    the left) maps: the largest distance, in output pixels, between m and its affine part (P taken out)."""
    c = np.array([[1, 0, -centre[0]], [0, 1, -centre[1]], [0, 0, 1.0]])
    # m = A' P C with A' affine (row 2 = 0 0 1): P's terms are m's last row through C's inverse
    row = m[2] @ np.linalg.inv(c)
    p = np.array([[1, 0, 0], [0, 1, 0], [row[0] / row[2], row[1] / row[2], 1.0]])
    affine = (m / row[2]) @ np.linalg.inv(c) @ np.linalg.inv(p) @ c
    pts = np.array([[centre[0] + sx * half, centre[1] + sy * half, 1.0] for sx in (-1, 1) for sy in (-1, 1)]).T
    a, b = affine @ pts, m @ pts
    return float(np.max(np.hypot(*(b[:2] / b[2] - a[:2] / a[2]))))


def test_perspective_corner_shift_inside_ultralytics_spread(painted_yolo, tmp_path, monkeypatch):  # noqa: F811
    """Mosaic on both sides (a 2S canvas about its centre): the corners of the canvas' inner square (S/2 from the
    centre) moved by the perspective term, mean over the samples."""
    from ultralytics.data import augment

    import fastfeed.augment.plan as plan

    size, shifts = 128, []
    _spy(monkeypatch, augment.RandomPerspective, "_compute_affine_matrix", lambda out, self, img, _: shifts.append(
        _corner_shift(np.asarray(out[0], np.float64), (img.shape[1] / 2, img.shape[0] / 2), size / 2)))
    over = {**NO_COLOUR, "perspective": 0.001, "imgsz": size}
    theirs = _their_spread(painted_yolo, tmp_path, shifts, lambda seen, _: np.mean(seen), **over)
    _spy(monkeypatch, plan, "affine_matrix", lambda m, d, centre, *_: shifts.append(_corner_shift(m, centre, size / 2)))
    shifts.clear()
    _fastfeed_samples(painted_yolo, tmp_path, 0, **over)
    assert _inside(shifts, theirs, "perspective corner shift, px") > 1.0   # the term does move the corners


def test_cutmix_mixed_area_share_inside_ultralytics_spread(painted_yolo, tmp_path, monkeypatch):  # noqa: F811
    """The share of each sample's area pasted from a second sample (0 where no cut was made), mean over samples,
    with cutmix=1.0 on both sides (the choices each side made, recorded where they are made)."""
    from ultralytics.data import augment

    import fastfeed.augment.cutmix as cutmix

    size, areas = 128, []

    def area(x1, y1, x2, y2):
        areas.append(float((x2 - x1) * (y2 - y1)) / size ** 2)

    _spy(monkeypatch, augment.CutMix, "get_params", lambda p, *_: p.get("skip") or area(*p["area"].astype(int)))
    over = {**NO_COLOUR, "cutmix": 1.0, "imgsz": size}
    theirs = _their_spread(painted_yolo, tmp_path, areas, lambda seen, _: np.sum(seen) / SAMPLES, **over)
    _spy(monkeypatch, cutmix, "cut_rect", lambda chosen, *_: chosen is None or area(*chosen[0]))
    areas.clear()
    samples = _fastfeed_samples(painted_yolo, tmp_path, 0, **over)   # one cut_rect call per sample: cutmix=1.0
    assert _inside(areas + [0.0] * (len(samples) - len(areas)), theirs, "cutmix mixed-area share") > 0.01


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "mixup"), [("flip", 0.0), ("mixup", 0.0), ("flip", 1.0), ("mixup", 1.0)])
def test_copy_paste_objects_and_pasted_pixels_inside_ultralytics_spread(tmp_path, monkeypatch, mode, mixup):
    """A painted segment set (segment trainers on both sides), copy_paste=0.5: objects per image, and (mode "mixup",
    where both paste into the finished sample) the share of its pixels pasted. With mixup=1 the second sample gets
    its own copy-paste on both sides (Ultralytics' MixUp makes it with the pre_transform that holds CopyPaste)."""
    from ultra_task_data import make_set
    from ultralytics.data import augment
    from ultralytics.models.yolo.segment import SegmentationTrainer

    import fastfeed.augment.copypaste as copypaste
    from fastfeed.integrations.ultralytics import FastfeedSegmentationTrainer

    data, size, shares = make_set(tmp_path / "seg", "segment", n=16), 128, []
    _spy(monkeypatch, augment.CopyPaste, "apply_image", lambda out, self, labels, params: shares.append(
        float(params["im_new"].mean())))   # the pasted objects' mask, drawn by apply_image
    over = {**NO_COLOUR, "copy_paste": 0.5, "copy_paste_mode": mode, "imgsz": size, "trainer": SegmentationTrainer,
            "mixup": mixup}
    both = _their_spread(data, tmp_path, shares, lambda seen, samples: (np.mean([k for _, k in samples]),
                                                                         np.sum(seen) / SAMPLES), **over)
    theirs, their_shares = [float(b[0]) for b in both], [float(b[1]) for b in both]
    _spy(monkeypatch, copypaste, "rasterise", lambda mask, *_: shares.append(float((mask > 0).mean())))
    shares.clear()
    over["trainer"] = FastfeedSegmentationTrainer
    ours = _inside([k for _, k in _fastfeed_samples(data, tmp_path, 0, **over)], theirs,
                   f"{mode}, mixup={mixup}: objects per image")
    plain = np.mean([k for _, k in _fastfeed_samples(data, tmp_path, 0, **{**over, "copy_paste": 0.0})])
    assert ours > plain + 0.1
    if mode == "mixup" and not mixup:   # (in mode flip Ultralytics pastes into its 2S mosaic canvas: another frame)
        _inside(shares + [0.0] * (SAMPLES - len(shares)), their_shares, "mixup: pasted-pixel share")


def test_albumentations_share_inside_ultralytics_spread(painted_yolo, tmp_path, monkeypatch):  # noqa: F811
    """A user's augmentations=[...] (Ultralytics' hyp key) through each trainer: how often each transform runs per
    sample, counted where Albumentations runs it (the same classes on both sides)."""
    A = pytest.importorskip("albumentations")
    fired = []
    for cls in (A.Blur, A.ToGray):
        _spy(monkeypatch, cls, "apply", lambda out, self, *_: fired.append(type(self).__name__))
    over = {**NO_COLOUR, "augmentations": [A.Blur(p=0.2), A.ToGray(p=0.1)]}

    def share(seen, samples, name):
        return seen.count(name) / len(samples)

    for name, p in (("Blur", 0.2), ("ToGray", 0.1)):
        theirs = _their_spread(painted_yolo, tmp_path, fired, lambda seen, samples, n=name: share(seen, samples, n), **over)
        fired.clear()
        samples = _fastfeed_samples(painted_yolo, tmp_path, 0, **over)
        ours = _inside([1.0] * fired.count(name) + [0.0] * (len(samples) - fired.count(name)), theirs,
                       f"Albumentations {name} share")
        assert abs(ours - p) < 0.07


def test_default_albumentations_are_ultralytics_list_on_the_cpu_loader_and_named_on_the_device_one(painted_yolo,  # noqa: F811
                                                                                                   tmp_path):
    pytest.importorskip("albumentations")
    from ultralytics.cfg import DEFAULT_CFG, get_cfg

    from fastfeed.augment.albu import names
    from fastfeed.integrations.ultralytics.args import augment_hyp, unsupported

    args = get_cfg(DEFAULT_CFG, {})
    assert names(augment_hyp(args).albumentations) == "Blur(p=0.01), MedianBlur(p=0.01), ToGray(p=0.01), CLAHE(p=0.01)"
    assert augment_hyp(args, "device").albumentations == () and not unsupported(args)
    assert ("Albumentations (Blur, MedianBlur, ToGray, CLAHE): the device loader does not apply them (the cpu and shm "
            "loaders do); training without them") in unsupported(args, loader="device")


def test_without_albumentations_it_says_so_once_and_trains_on(monkeypatch):
    import logging
    import sys

    from ultralytics.cfg import DEFAULT_CFG, get_cfg

    import fastfeed.integrations.ultralytics.args as args_module

    monkeypatch.setitem(sys.modules, "albumentations", None)   # `import albumentations` raises ImportError
    monkeypatch.setattr(args_module, "_built", {})
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    args_module.log.addHandler(handler)
    try:
        args = get_cfg(DEFAULT_CFG, {})
        assert args_module.augment_hyp(args).albumentations == () == args_module.augment_hyp(args).albumentations
        assert not args_module.unsupported(args) and not args_module.unsupported(args, loader="device")
    finally:
        args_module.log.removeHandler(handler)
    assert [m for m in seen if "albumentations is not installed" in m] == [
        "fastfeed: albumentations is not installed: training without Ultralytics' default Albumentations "
        "(`pip install -e '.[albumentations]'` applies them)"]
