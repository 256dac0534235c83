"""The `device` loader against the cpu loader: augmentation statistics, the epoch order, and (pytest -m
gpu) its GPU batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from device_helpers import collect, painted, run, same, u8  # noqa: F401  (fixtures)
from loader_checks import NO_COLOUR
from store_helpers import run_pack

from fastfeed import Store
from fastfeed.loaders import LoaderConfig, create_loader
from fastfeed.loaders.sampler import epoch_batches

# --- statistics against the cpu loader -------------------------------------------------------------

def _stats(name: str, store, cfg: LoaderConfig, epochs: int) -> dict:
    """Boxes per image, box width/height quantiles, the share of fill (114 grey) pixels, over `epochs` epochs."""
    per_image, wh, fill = [], [], []
    with create_loader(name, store, cfg) as loader:
        for e in range(epochs):
            loader.set_epoch(e)
            for images, targets in loader:
                x = u8(images) if images.is_floating_point() else images
                fill.append((x == cfg.hyp.fill).all(1).float().mean((1, 2)))
                per_image.append(torch.bincount(targets[:, 0].long(), minlength=len(x)).float())
                wh.append(targets[:, 4:6])
    q = torch.quantile(torch.cat(wh), torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9]), dim=0)
    return {"images": len(torch.cat(per_image)), "boxes_per_image": torch.cat(per_image).mean().item(),
            "fill": torch.cat(fill).mean().item(), **{f"q{k}": v for k, v in enumerate(q.flatten().tolist())}}


@pytest.fixture(scope="module")
def coco128_store(coco128, tmp_path_factory):
    out = tmp_path_factory.mktemp("coco128") / "s.ff"
    run_pack(coco128, out, format="coco", workers=2)   # coco128 holds labels/ too: two layouts
    return Store(out)


def _assert_stats_close(store, imgsz: int, epochs: int, images: int) -> None:
    cfg = LoaderConfig(imgsz=imgsz, batch_size=16, workers=2, seed=5, hyp=NO_COLOUR)   # no HSV: fill stays 114
    cpu, dev = _stats("cpu", store, cfg, epochs), _stats("device", store, cfg, epochs)
    assert cpu["images"] == dev["images"] == images
    for k in cpu:
        assert abs(dev[k] - cpu[k]) <= 0.05 * abs(cpu[k]), f"{k}: device {dev[k]:.4f} vs cpu {cpu[k]:.4f}"


def test_augmentation_statistics_match_the_cpu_loaders(coco128_store):
    """256 coco128 mosaics at 192: boxes per image, box-size quantiles and fill within 5% of the cpu loader's."""
    _assert_stats_close(coco128_store, 192, 2, 256)


@pytest.mark.slow
def test_augmentation_statistics_match_the_cpu_loaders_over_1024_images(coco128_store):
    _assert_stats_close(coco128_store, 320, 8, 1024)


def test_epoch_order_is_the_samplers(painted):
    """Letterboxed, unshuffled batches hold the store's records in epoch_batches' order."""
    cfg = LoaderConfig(imgsz=160, batch_size=4, workers=2, augment=False, shuffle=True, seed=3)
    order = np.concatenate(epoch_batches(24, 4, epoch=1, seed=3))
    cpu = []
    with create_loader("cpu", painted, cfg) as loader:
        loader.set_epoch(1)
        cpu = [b.targets.clone() for b in loader]
    dev = [t for _, t in run(painted, cfg, epochs=(1,))]
    assert len(order) == 24 and all(torch.equal(a, b) for a, b in zip(cpu, dev))


# --- on a real GPU (pytest -m gpu; benchmarks/gpu_check_device.py checks the same on a bare GPU machine) ----

@pytest.fixture(scope="module")
def sample_store(tmp_path_factory, sample_dir):
    out = tmp_path_factory.mktemp("sample") / "s.ff"
    run_pack(sample_dir, out)
    return Store(out)


@pytest.mark.gpu
def test_gpu_batches_have_the_cpu_paths_targets_and_pixels(sample_store):
    """nvJPEG on the GPU against libjpeg-turbo on the host: the same plans, so the same targets; pixels within
    a few levels. Training batches too (the draws are the host's, whatever the device)."""
    for augment in (False, True):
        cfg = dict(imgsz=320, batch_size=8, workers=2, augment=augment, seed=2, hyp=NO_COLOUR)
        gpu = run(sample_store, LoaderConfig(device="cuda", **cfg))
        cpu = run(sample_store, LoaderConfig(device="cpu", **cfg))
        for (a, ta), (b, tb) in zip(gpu, cpu):
            assert a.device.type == "cuda" and torch.equal(ta.cpu(), tb)
            assert (a.cpu().float() - b.float()).abs().mean() < 4.0


@pytest.mark.gpu
def test_gpu_vram_cache_gives_the_jpeg_paths_batches(sample_store):
    cfg = LoaderConfig(imgsz=320, batch_size=8, workers=2, seed=3, device="cuda")
    want = run(sample_store, cfg, epochs=(0, 1))
    assert same(run(sample_store, cfg, epochs=(0, 1), cache="device", cache_reserve_gb=0), want)
