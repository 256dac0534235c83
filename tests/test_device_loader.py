"""The `device` loader on CPU torch (the path every machine has): the Batch contract, boxes on their
painted objects, the cpu loader's draws for the same seed, ranks, resuming, failures, the VRAM cache,
the decoders, the side-stream protocol against a fake CUDA module, the trainer's and the bench's use,
and the augmentation statistics against the cpu loader's."""

from __future__ import annotations

import shutil
import types

import numpy as np
import pytest
import torch
from conftest import CocoBuilder, jpeg_bytes
from device_helpers import collect, painted, run, same, u8  # noqa: F401
from loader_checks import (
    NO_COLOUR,
    assert_a_killed_worker_raises,
    assert_batch_contract,
    assert_boxes_frame_paint,
)
from loader_checks import painted as _painted
from store_helpers import run_pack

from fastfeed import Store
from fastfeed.augment import AugmentHyp
from fastfeed.loaders import (
    LoaderConfig,
    UnsupportedAugmentation,
    WorkerError,
    create_loader,
    list_loaders,
    loader_options,
)
from fastfeed.loaders.device.decode import make_decoder

# --- the contract ----------------------------------------------------------------------------------

def test_registered_with_its_options_and_checks_them():
    assert "device" in list_loaders()
    from fastfeed.loaders import loader_info

    info = {i.name: i for i in loader_info()}["device"]
    assert info.available and info.options == {"partner_buffer": None, "cache": None, "dtype": "float32",
                                               "decoder": "auto", "cache_reserve_gb": 8.0}
    assert loader_options("device", dtype=torch.bfloat16).dtype == "bfloat16"
    assert loader_options("device", cache_reserve_gb=np.int64(2)).cache_reserve_gb == 2   # numpy numbers are numbers
    for bad, match in (({"cache": "ram"}, "device option cache must be None or 'device'"),
                       ({"dtype": "uint8"}, "device option dtype must be one of float32"),
                       ({"decoder": "pillow"}, "device option decoder must be one of auto, torchvision"),
                       ({"cache_reserve_gb": -1}, "cache_reserve_gb must be a number of GiB >= 0"),
                       ({"partner_buffer": 2}, "partner_buffer must be an integer >= 4")):
        with pytest.raises(ValueError, match=match):
            loader_options("device", **bad)


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_contract_on_the_device(painted, workers):
    cfg = LoaderConfig(imgsz=96, batch_size=5, workers=workers, drop_last=False)
    with create_loader("device", painted, cfg, dtype="bfloat16") as loader:
        assert loader.on_device and loader.device == torch.device("cpu")   # auto: no GPU/NPU here
        loader.set_epoch(0)
        batches = list(loader)
        assert len(batches) == len(loader) == 5
        for images, _ in batches:
            assert images.dtype == torch.bfloat16 and images.device.type == "cpu"
            assert float(images.min()) >= 0 and float(images.max()) <= 1
    assert_batch_contract([(u8(i), t) for i, t in batches], 96, nc=3, total=24)


@pytest.mark.parametrize("hyp", [NO_COLOUR, AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, degrees=0, mosaic=0.0),
                                 AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, fliplr=1.0, flipud=0.5)])
def test_boxes_frame_the_painted_objects_after_augmentation(painted, hyp):
    """The cpu loader's check (tests/test_loaders.py), on the device loader's batches."""
    cfg = LoaderConfig(imgsz=128, batch_size=8, workers=2, hyp=hyp, seed=3)
    assert_boxes_frame_paint(run(painted, cfg, epochs=(0, 1)), 128)


def test_eval_batches_are_the_cpu_loaders_letterbox(painted):
    """Letterboxed evaluation batches: the cpu loader's targets exactly, its pixels within one level
    (bilinear in float here, OpenCV's fixed point there; a copy at scale 1)."""
    for size, tol in ((160, 0), (128, 1)):
        cfg = LoaderConfig(imgsz=size, batch_size=8, workers=0, augment=False, shuffle=False, drop_last=False)
        dev = run(painted, cfg)
        with create_loader("cpu", painted, cfg) as loader:
            loader.set_epoch(0)
            cpu = [(b.images.clone(), b.targets.clone()) for b in loader]
        for (a, ta), (b, tb) in zip(dev, cpu):
            assert (a.int() - b.int()).abs().max() <= tol
            assert torch.equal(ta, tb)


@pytest.mark.slow   # ~6 s: three loaders
def test_same_seed_same_batches_other_seed_other_batches(painted):
    def go(seed):
        return run(painted, LoaderConfig(imgsz=96, batch_size=4, workers=2, seed=seed), epochs=(0, 1))

    a, b, c = go(1), go(1), go(2)
    assert same(a, b)
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a, c))


def _matched(a: torch.Tensor, b: torch.Tensor, tol: float) -> int:
    """Rows of targets `a` with a row of `b` of the same image and class within `tol` on every coordinate."""
    if not len(a) or not len(b):
        return 0
    near = (a[:, None, 2:] - b[None, :, 2:]).abs().amax(-1) <= tol
    same_ids = (a[:, None, :2] == b[None, :, :2]).all(-1)
    return int((near & same_ids).any(1).sum())


@pytest.mark.parametrize("hyp", [NO_COLOUR, AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, degrees=20, shear=5, flipud=0.5)])
def test_the_cpu_loaders_draws_for_the_same_seed(painted, hyp):
    """Same seed, workers and partner buffer: the same mosaics, partners, centres, affines and flips as the cpu
    loader. Boxes agree within a pixel: the cpu loader snaps each tile's source crop to whole pixels, this one
    samples the exact map, so a box on the edge of the filter's thresholds may go one way here, the other
    there (a few in a hundred). Where both warp (rotation: the cpu loader's exact path) the pixels agree too."""
    cfg = LoaderConfig(imgsz=128, batch_size=8, workers=2, hyp=hyp, seed=7)
    dev = run(painted, cfg, epochs=(0, 1), partner_buffer=8)
    cpu = []
    with create_loader("cpu", painted, cfg, partner_buffer=8) as loader:
        for e in (0, 1):
            loader.set_epoch(e)
            cpu += [(b.images.clone(), b.targets.clone()) for b in loader]
    assert len(dev) == len(cpu) == 6
    n_dev, n_cpu = sum(len(t) for _, t in dev), sum(len(t) for _, t in cpu)
    both = sum(_matched(ta, tb, 1.5 / 128) for (_, ta), (_, tb) in zip(dev, cpu))
    assert n_dev > 50 and both >= 0.96 * max(n_dev, n_cpu)
    if not hyp.axis_aligned:
        assert all((a.float() - b.float()).abs().mean() < 1.0 for (a, _), (b, _) in zip(dev, cpu))


def test_ranks_cover_the_epoch_once(painted):
    """Two ranks' letterboxed batches (each image identified by its one box): disjoint, all 24 images."""
    def boxes_of(rank):
        cfg = LoaderConfig(imgsz=160, batch_size=4, workers=0, augment=False, rank=rank, world_size=2, drop_last=False)
        return [tuple(np.round(t[1:].numpy(), 4)) for _, targets in run(painted, cfg) for t in targets]

    r0, r1 = boxes_of(0), boxes_of(1)
    assert len(r0) == len(set(r0)) == len(r1) == 12 and not set(r0) & set(r1) and len(set(r0) | set(r1)) == 24


def test_close_mosaic_turns_mosaic_off_for_the_last_epochs(painted):
    cfg = LoaderConfig(imgsz=128, batch_size=8, workers=0, epochs=3, close_mosaic=1, hyp=NO_COLOUR)
    with create_loader("device", painted, cfg) as loader:
        def most_boxes(epoch):
            return max(np.bincount(t[:, 0].long().numpy()).max() for _, t in collect(loader, epoch))
        assert most_boxes(0) > 1 and most_boxes(2) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_started_anywhere_gives_the_uninterrupted_batches(painted, workers):
    """set_epoch(e, start): the batches of an uninterrupted run, without building the skipped ones; partners
    from the replayed buffers that the device never saw are read and decoded in this process."""
    cfg = LoaderConfig(imgsz=96, batch_size=2, workers=workers, hyp=NO_COLOUR, seed=4)
    with create_loader("device", painted, cfg, partner_buffer=6) as loader:
        full = [collect(loader, e) for e in range(2)]
    n = len(full[0])
    for epoch, start in ((1, 5), (0, n - 1)):
        with create_loader("device", painted, cfg, partner_buffer=6) as loader:
            got = collect(loader, epoch, start)
            assert same(got, full[epoch][start:]), f"epoch {epoch} from batch {start}"
            assert loader.stage_times().samples <= 2 * (n - start) + 2 * workers * cfg.batches_ahead
            assert loader.feed.reread > 0
    with create_loader("device", painted, cfg, partner_buffer=6) as loader:
        loader.set_epoch(0)
        for k, _ in enumerate(loader):          # abandoned half-way
            if k == 4:
                break
        assert same(collect(loader, 1), full[1])


def test_decoded_images_are_kept_only_while_a_partner_buffer_lists_them(painted):
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=2, hyp=NO_COLOUR)
    with create_loader("device", painted, cfg, partner_buffer=4) as loader:
        collect(loader, 0)
        assert loader.feed.reread == 0 and loader.feed.decoded == 24          # each record decoded once
        assert 0 < len(loader.feed.images) <= 2 * 4                            # 2 workers x 4 buffered
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=0, augment=False)
    with create_loader("device", painted, cfg) as loader:
        collect(loader, 0)
        assert not loader.feed.images                                          # no partners: nothing kept


# --- failures --------------------------------------------------------------------------------------

def test_a_corrupt_record_raises_worker_error_naming_it(painted, tmp_path):
    from store_helpers import flip_byte_in_record
    bad = tmp_path / "bad.ff"
    shutil.copytree(painted.path, bad)
    flip_byte_in_record(bad, 5)
    with create_loader("device", Store(bad), LoaderConfig(imgsz=64, batch_size=4, workers=2, shuffle=False)) as ld:
        ld.set_epoch(0)
        with pytest.raises(WorkerError, match="record 5 in shard shard-00000.mdb: CRC32 mismatch"):
            list(ld)


def test_a_killed_worker_raises_instead_of_hanging(painted):
    assert_a_killed_worker_raises(create_loader("device", painted, LoaderConfig(imgsz=64, batch_size=2, workers=2, timeout=30)))


def test_decoders_that_cannot_run_here_are_errors_not_fallbacks():
    cpu = torch.device("cpu")
    assert make_decoder("auto", cpu).name == "host"
    npu = types.SimpleNamespace(type="npu", index=0)   # torch.device("npu") needs torch_npu; only .type is read
    assert make_decoder("auto", npu).name == "host"
    for name in ("torchvision", "nvimgcodec"):
        with pytest.raises(ValueError, match=f"decoder='{name}' decodes on NVIDIA GPUs .* use decoder='host'"):
            make_decoder(name, npu)
    try:
        import torchvision.io  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed here, or built for another torch
        with pytest.raises(ImportError, match="decoder='torchvision' needs torchvision, which does not import"):
            make_decoder("torchvision", types.SimpleNamespace(type="cuda", index=0))


class StoredFrameDecoder:
    """A stand-in for nvJPEG: decodes JPEG bytes on the CPU in the *stored* frame (no EXIF turn, full size),
    so the device path's orientation, fit and slot handling run here."""

    name, on_host = "stored-frame", False

    def decode(self, jpegs, stream=None):
        import simplejpeg

        from fastfeed.loaders.device.decode import orient

        return [orient(torch.from_numpy(simplejpeg.decode_jpeg(t.numpy().tobytes())), o) for t, o in jpegs]


def test_the_device_decode_path_turns_by_exif_and_fits_to_the_cpu_loaders_size(tmp_path, monkeypatch):
    """JPEG bytes shipped to a (stand-in) device decoder: records with EXIF orientations 1, 6, 3, 8 come out
    as the host decode gives them: the same letterboxed pixels (scale 1) and boxes; larger than imgsz, fitted
    to the size the cpu loader decodes at (the boxes still exactly the same)."""
    from store_helpers import replace_record
    b = CocoBuilder(tmp_path / "src")
    for k in range(8):
        img, box = _painted(k, 96, 128)
        b.add_image(f"{k}.jpg", 96, 128, data=jpeg_bytes(img, 95), boxes=[(1, box)])
    run_pack(b.write(), tmp_path / "s.ff")
    with Store(tmp_path / "s.ff") as s:
        sizes = [s.record(k).size for k in range(8)]
    for k, o in ((1, 6), (2, 3), (3, 8)):      # the stored pixels stay; the upright frame turns
        h, w = sizes[k]
        replace_record(tmp_path / "s.ff", k, orientation=o, height=w if o >= 5 else h, width=h if o >= 5 else w)
    store = Store(tmp_path / "s.ff")
    for size in (128, 64):                      # 64: the decode is larger than the cpu loader's: fitted
        cfg = LoaderConfig(imgsz=size, batch_size=4, workers=0, augment=False, shuffle=False)
        host = run(store, cfg)
        import fastfeed.loaders.device.loader as loader_mod

        monkeypatch.setattr(loader_mod, "make_decoder", lambda name, device: StoredFrameDecoder())
        with create_loader("device", store, cfg) as loader:
            assert loader.host.ship == "encoded"
            dev = collect(loader)
        monkeypatch.undo()
        for (a, ta), (h, th) in zip(dev, host):
            assert torch.equal(ta, th)
            diff = (a.int() - h.int()).abs()
            # 64: a full decode + antialiased resize against libjpeg-turbo's DCT half scale: close, not equal
            assert (diff.max() == 0) if size == 128 else (diff.float().mean() < 6)


def test_payloads_that_do_not_fit_the_slot_travel_through_the_queue(painted, monkeypatch):
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=2, hyp=NO_COLOUR, seed=2)
    want = run(painted, cfg)
    import fastfeed.loaders.device.plan as host_mod

    monkeypatch.setattr(host_mod, "slot_bytes", lambda store, cfg, ship: 30_000)   # about one image of four
    with create_loader("device", painted, cfg) as loader:
        assert loader.host.slot_bytes == 30_000
        assert same(collect(loader), want)


def test_mixup_is_refused_not_ignored(painted):
    from fastfeed.augment import AugmentHyp

    with pytest.raises(UnsupportedAugmentation, match=r"the device loader does not render mixup=0.2: set it to 0, or "
                                                      r"use the cpu, shm or dali loader"):
        create_loader("device", painted, LoaderConfig(imgsz=64, batch_size=4, device="cpu", hyp=AugmentHyp(mixup=0.2)))
