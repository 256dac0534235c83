"""Device augmentation (fastfeed.device_augment): boxes follow the flip, HSV keeps range and dtype,
seeded, and it matches the workers' CPU jitter (fastfeed.augment.hsv_planes) for the same gains."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from augment_helpers import hsv_jitter_to_planes

from fastfeed import codec
from fastfeed.augment import AugmentHyp, hue_rotation
from fastfeed.device_augment import DeviceAugment, hflip, hsv_jitter, hue_rotations

GAINS = (0.015, 0.7, 0.4)   # the YOLO defaults: hsv_h, hsv_s, hsv_v


@pytest.fixture(scope="module")
def photos(sample_dir):
    files = sorted((sample_dir / "images" / "train2017").glob("*.jpg"))[:6]
    return [cv2.resize(codec.decode_jpeg(f.read_bytes()), (256, 256)) for f in files]


def _float(img: np.ndarray) -> torch.Tensor:
    """HWC uint8 -> [1,3,H,W] float in [0,1], as the prefetcher hands it to the augmentation."""
    return torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255


def _cpu_jitter(img: np.ndarray, seed: int, gains=GAINS) -> np.ndarray:
    planes = [np.empty(img.shape[:2], np.uint8) for _ in range(3)]
    hsv_jitter_to_planes(img.copy(), planes, np.random.default_rng(seed), *gains, np.empty(img.shape[:2], np.uint8))
    return np.stack(planes)                      # CHW uint8


def _painted(n=8, size=64):
    """Grey images, each with one red rectangle at its own place, and the box of that rectangle."""
    images = torch.full((n, 3, size, size), 0.45)
    targets = []
    for i in range(n):
        x1, y1, w, h = 3 + 3 * i, 10 + 2 * i, 9 + i % 5, 12
        images[i, :, y1:y1 + h, x1:x1 + w] = torch.tensor([0.9, 0.1, 0.1])[:, None, None]
        targets.append([i, i % 3, (x1 + w / 2) / size, (y1 + h / 2) / size, w / size, h / size])
    return images, torch.tensor(targets)


def _red_box(img: torch.Tensor) -> list[float]:
    """cx, cy, w, h (normalised) of the red pixels."""
    ys, xs = torch.nonzero((img[0] > 0.7) & (img[1] < 0.3), as_tuple=True)
    s = img.shape[-1]
    x1, x2, y1, y2 = xs.min().item(), xs.max().item() + 1, ys.min().item(), ys.max().item() + 1
    return [(x1 + x2) / 2 / s, (y1 + y2) / 2 / s, (x2 - x1) / s, (y2 - y1) / s]


# --- flip ---------------------------------------------------------------------------------------------

def test_boxes_follow_the_flip_image_by_image():
    images, targets = _painted(16)
    aug = DeviceAugment(hsv_h=0, hsv_s=0, hsv_v=0, fliplr=0.5, seed=1)
    out, t = aug(images, targets)
    flipped = [not torch.equal(out[i], images[i]) for i in range(16)]
    assert 3 <= sum(flipped) <= 13                    # both outcomes occur (p = 0.5)
    for i in range(16):
        assert torch.equal(out[i], images[i].flip(-1) if flipped[i] else images[i])
        assert _red_box(out[i]) == pytest.approx(t[i, 2:].tolist(), abs=1e-6)   # the box frames the rectangle
        assert t[i, 2].item() == pytest.approx(1 - targets[i, 2].item() if flipped[i] else targets[i, 2].item())
    assert torch.equal(t[:, [0, 1, 3, 4, 5]], targets[:, [0, 1, 3, 4, 5]])


def test_flip_with_several_boxes_per_image_and_with_none():
    images = torch.rand(3, 3, 8, 8)
    targets = torch.tensor([[0, 1, 0.2, 0.5, 0.1, 0.1], [0, 2, 0.7, 0.5, 0.1, 0.1], [2, 0, 0.4, 0.4, 0.2, 0.2]])
    out, t = hflip(images, targets, torch.tensor([True, False, True]))
    assert torch.allclose(t[:, 2], torch.tensor([0.8, 0.3, 0.6]))
    assert torch.equal(out[1], images[1]) and torch.equal(out[2], images[2].flip(-1))
    empty = torch.zeros(0, 6)
    out, t = DeviceAugment(fliplr=1.0)(images, empty)
    assert t.shape == (0, 6) and out.shape == images.shape


# --- HSV ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_hsv_keeps_range_dtype_and_inputs(dtype):
    images = torch.rand(6, 3, 32, 32).to(dtype)
    before = images.clone()
    targets = torch.tensor([[0, 0, 0.5, 0.5, 0.2, 0.2]])
    out, t = DeviceAugment(hsv_h=0.5, hsv_s=1.0, hsv_v=1.0, fliplr=0.5)(images, targets)
    assert out.dtype == dtype and out.shape == images.shape
    assert 0 <= out.min().item() and out.max().item() <= 1
    assert not torch.equal(out, images) and torch.equal(images, before) and t is not targets


def test_same_seed_same_output_and_reseed_per_epoch():
    images, targets = _painted(8)
    a, b, c = DeviceAugment(seed=7), DeviceAugment(seed=7), DeviceAugment(seed=8)
    assert torch.equal(a(images, targets)[0], b(images, targets)[0])
    assert not torch.equal(a(images, targets)[0], c(images, targets)[0])
    a.reseed(3, 0)
    first = a(images, targets)
    a(images, targets)
    a.reseed(3, 0)
    again = a(images, targets)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    a.reseed(4, 0)
    assert not torch.equal(a(images, targets)[0], first[0])


def test_hue_rotations_are_the_cpu_matrices():
    turns = torch.tensor([-0.5, -0.015, 0.0, 0.01, 0.25])
    got = hue_rotations(turns)
    for k, turn in enumerate(turns.tolist()):
        assert np.allclose(got[k].numpy(), hue_rotation(turn), atol=1e-6)


def test_matches_the_cpu_jitter_for_the_same_draws(photos):
    """Same (dh, fs, fv) as hsv_jitter_to_planes draws for a seed: nearly the same pixels."""
    diffs, biases, spreads = [], [], []
    for img in photos:
        for seed in range(4):
            dh, ds, dv = np.random.default_rng(seed).uniform(-1.0, 1.0, 3) * GAINS
            cpu = _cpu_jitter(img, seed).astype(np.float64)
            dev = hsv_jitter(_float(img), torch.tensor([dh]), torch.tensor([1 + ds]), torch.tensor([1 + dv]))
            dev = dev[0].double().numpy() * 255
            diffs.append(np.abs(cpu - dev).mean())
            biases.append(np.abs(cpu.mean((1, 2)) - dev.mean((1, 2))).max())
            spreads.append(np.abs(cpu.std((1, 2)) - dev.std((1, 2))).max())
    assert np.mean(diffs) < 0.6 and max(diffs) < 1.0      # levels of 255 (measured: 0.27 and 0.32; the CPU rounds)
    assert max(biases) < 0.5 and max(spreads) < 0.5        # per-channel mean and std (measured: < 0.1)


def test_statistically_matches_the_cpu_jitter(photos):
    """Over many random draws (each side its own generator) the per-channel mean and std agree."""
    n = 256                                     # the two averages over draws differ by ~0.01 by chance alone
    img = cv2.resize(photos[0], (96, 96))
    cpu = np.stack([_cpu_jitter(img, 1000 + s) for s in range(n)]).astype(np.float64) / 255
    aug = DeviceAugment(*GAINS, fliplr=0.0, seed=0)
    dev = aug(_float(img).expand(n, -1, -1, -1).contiguous(), torch.zeros(0, 6))[0].double().numpy()
    for stat in (lambda x: x.mean((2, 3)), lambda x: x.std((2, 3))):
        c, d = stat(cpu), stat(dev)                                   # [n, 3] per image and channel
        assert np.abs(c.mean(0) - d.mean(0)).max() < 0.03            # the average over draws
        assert np.abs(c.std(0) - d.std(0)).max() < 0.03              # how much the draws spread it


def test_draws_cover_the_gains_uniformly():
    aug = DeviceAugment(hsv_h=0.1, hsv_s=0.7, hsv_v=0.4, fliplr=0.3, seed=2)
    dh, fs, fv, flip = aug.draw(20000, torch.device("cpu"))
    for x, lo, hi in ((dh, -0.1, 0.1), (fs, 0.3, 1.7), (fv, 0.6, 1.4)):
        assert lo <= x.min() and x.max() <= hi
        assert x.mean().item() == pytest.approx((lo + hi) / 2, abs=0.02 * (hi - lo))
        assert x.std().item() == pytest.approx((hi - lo) / 12 ** 0.5, rel=0.03)
    assert flip.float().mean().item() == pytest.approx(0.3, abs=0.02)


def test_gains_come_from_a_hyp_and_are_validated():
    aug = DeviceAugment.from_hyp(AugmentHyp(hsv_h=0.02, fliplr=0.0), seed=4)
    assert (aug.hsv_h, aug.hsv_s, aug.hsv_v, aug.fliplr, aug.seed) == (0.02, 0.7, 0.4, 0.0, 4)
    assert not DeviceAugment(0, 0, 0, 0).active
    with pytest.raises(ValueError, match=r"hsv_s=1.5 is out of range; valid: \[0.0, 1.0\]"):
        DeviceAugment(hsv_s=1.5)
    with pytest.raises(ValueError, match="images must be float"):
        DeviceAugment()(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), torch.zeros(0, 6))
