"""The `dali` loader on DALI's CPU path: the Batch contract, boxes on their objects, determinism,
ranks, epochs, failures. (The GPU `mixed` path: benchmarks/gpu_check_dali.py.)"""

from __future__ import annotations

import builtins
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (pip install -e '.[dali]')")

from loader_checks import (  # noqa: E402
    NO_COLOUR,  # noqa: E402
    assert_batch_contract,
    assert_boxes_frame_paint,
    make_painted_store,
    red_mask,
)

from fastfeed import Store  # noqa: E402
from fastfeed.augment import AugmentHyp  # noqa: E402
from fastfeed.devices import DeviceError  # noqa: E402
from fastfeed.loaders import LoaderConfig, WorkerError, create_loader, list_loaders  # noqa: E402
from fastfeed.loaders.sampler import epoch_batches  # noqa: E402

N = 24


@pytest.fixture(scope="module")
def raw_store(tmp_path_factory):
    return make_painted_store(tmp_path_factory.mktemp("dali_raw"), "raw")      # exact pixels: box checks


@pytest.fixture(scope="module")
def jpeg_store(tmp_path_factory):
    return make_painted_store(tmp_path_factory.mktemp("dali_jpeg"), "original")  # the JPEGs: DALI decodes


def _cfg(**kw) -> LoaderConfig:
    """DALI's CPU operators whatever the machine has (the GPU path: benchmarks/gpu_check_dali.py)."""
    return LoaderConfig(**({"device": "cpu"} | kw))


def _collect(loader, epoch=0):
    loader.set_epoch(epoch)
    return [(b.images.clone(), b.targets.clone()) for b in loader]


def _dali(store, **kw):
    return create_loader("dali", store, _cfg(**kw))


# --- contract ------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_batch_contract(jpeg_store, workers):
    assert "dali" in list_loaders()
    with _dali(jpeg_store, imgsz=96, batch_size=5, workers=workers, drop_last=False) as loader:
        batches = _collect(loader)
        if workers:
            assert loader.memory_pids()          # the external source's worker process
        st = loader.stage_times()
    assert loader.memory_pids() == []
    assert len(batches) == len(loader) == 5
    assert_batch_contract(batches, 96, nc=3, total=N)
    # Honest stage times: what the external source measured; DALI's own ops are not split out.
    assert st.samples == N and st.seconds["read"] > 0 and "decode" not in st.seconds


@pytest.mark.parametrize("hyp", [NO_COLOUR, AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, mosaic=0.0),
                                 AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, fliplr=1.0, flipud=0.5)])
def test_boxes_frame_the_painted_objects_after_augmentation(raw_store, hyp):
    """The cpu loader's check: every box frames red paint, almost no red is left outside the boxes."""
    with _dali(raw_store, imgsz=128, batch_size=8, workers=2, hyp=hyp, seed=3) as loader:
        batches = _collect(loader) + _collect(loader, 1)
    assert_boxes_frame_paint(batches, 128)


def test_flips_move_pixels_and_boxes_alike(raw_store):
    """fn.flip and fn.bb_flip get the same per-sample flags: a flipped batch is the mirror image."""
    still = dict(mosaic=0.5, scale=0.3, translate=0.1, hsv_h=0, hsv_s=0, hsv_v=0, fliplr=0.0, flipud=0.0)

    def batch(**flips):
        cfg = _cfg(imgsz=96, batch_size=6, workers=0, seed=5, hyp=AugmentHyp(**(still | flips)))
        with create_loader("dali", raw_store, cfg) as loader:
            return next(iter(loader))

    (a, ta), (h, th), (v, tv) = batch(), batch(fliplr=1.0), batch(flipud=1.0)
    assert torch.equal(h, a.flip(-1)) and torch.equal(v, a.flip(-2))
    mirror = ta.clone()
    mirror[:, 2] = 1 - ta[:, 2]
    torch.testing.assert_close(th, mirror)
    mirror = ta.clone()
    mirror[:, 3] = 1 - ta[:, 3]
    torch.testing.assert_close(tv, mirror)


def test_rotation_and_shear_keep_objects_inside_their_boxes(raw_store):
    hyp = AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, degrees=15, shear=5, mosaic=0.5)
    with _dali(raw_store, imgsz=128, batch_size=8, workers=0, hyp=hyp, seed=1) as loader:
        batches = _collect(loader)
    uncovered = total = 0
    for images, targets in batches:
        red = red_mask(images)
        covered = np.zeros_like(red)
        for j, _, cx, cy, w, h in targets.tolist():
            x1, y1, x2, y2 = (np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]) * 128).round().astype(int)
            assert red[int(j), y1:y2, x1:x2].mean() > 0.4   # enclosing boxes of turned rectangles are loose
            covered[int(j), max(y1 - 1, 0):y2 + 1, max(x1 - 1, 0):x2 + 1] = True
        uncovered += (red & ~covered).sum()
        total += red.sum()
    assert uncovered <= 0.04 * total


def test_mosaic_partners_come_from_the_batch_or_are_read_for_their_slot(raw_store):
    """Batch 4, mosaic on every sample: each partner the plan picks (a record of the cpu loader's partner buffer)
    reaches DALI either as a batch mate (b1..b3 index it) or read for that sample's slot (p1..p3 hold its pixels);
    slots that take nothing hold a 1-pixel placeholder."""
    from fastfeed.loaders.dali.source import DaliSource

    cfg = _cfg(imgsz=128, batch_size=4, hyp=AugmentHyp(mosaic=1.0, hsv_h=0, hsv_s=0, hsv_v=0))
    loader = _dali(raw_store, **{k: getattr(cfg, k) for k in ("imgsz", "batch_size", "hyp")})
    src = DaliSource(raw_store, cfg, loader.order, 32, "mosaic", raw=True)
    loader.close()
    read = 0
    for k in (0, 3):   # the buffer holds only the batch, then earlier batches too
        idx = src.order.batches(0)[k]
        out = dict(zip(src.outputs, src.build(0, k, idx)))
        cands, plans = src.plans(0, k, len(idx))
        for j, plan in enumerate(plans):
            for s, pick in enumerate(plan.geometry.partners):
                rec = int(cands[pick])
                if out[f"p{s + 1}"][j].shape == (1, 1, 3):            # from the batch
                    assert int(idx[int(out[f"b{s + 1}"][j])]) == rec
                else:
                    assert np.array_equal(out[f"p{s + 1}"][j], raw_store.record(rec).decode())
                    read += 1
    assert read > 0


def test_eval_batches_are_letterboxed_store_images(raw_store, jpeg_store):
    cfg = _cfg(imgsz=160, batch_size=4, workers=0, augment=False, shuffle=False, drop_last=False)
    with create_loader("dali", raw_store, cfg) as loader:
        images, targets = next(iter(loader))
    s = raw_store[1]                        # 120x160: fits the width, padded top and bottom by 20
    expect = np.full((160, 160, 3), 114, np.uint8)
    expect[20:140] = s.image
    assert np.array_equal(images[1].permute(1, 2, 0).numpy(), expect)
    with create_loader("cpu", raw_store, cfg) as loader:
        _, cpu_targets = next(iter(loader))
    torch.testing.assert_close(targets, cpu_targets)
    # Decoded by DALI from the JPEGs and resized (96 px): close to the cpu loader's pixels.
    cfg = _cfg(imgsz=96, batch_size=4, workers=0, augment=False, shuffle=False)
    with create_loader("dali", jpeg_store, cfg) as loader:
        images, targets = next(iter(loader))
    with create_loader("cpu", jpeg_store, cfg) as loader:
        cpu_images, cpu_targets = next(iter(loader))
    torch.testing.assert_close(targets, cpu_targets)
    assert (images.float() - cpu_images.float()).abs().mean() < 6


# --- sampling ------------------------------------------------------------------------------------

def test_same_seed_same_batches_other_seed_other_batches_and_the_cpu_loaders_for_a_worker_count(jpeg_store):
    def run(name, seed, workers):
        with create_loader(name, jpeg_store, _cfg(imgsz=96, batch_size=4, workers=workers, seed=seed, hyp=NO_COLOUR)) as loader:
            return _collect(loader) + _collect(loader, 1)

    a, b, c = run("dali", 1, 2), run("dali", 1, 2), run("dali", 2, 2)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a, c))
    for workers in (0, 2):   # partners follow the worker count, as the cpu loader's buffers do
        dali, cpu = run("dali", 1, workers), run("cpu", 1, workers)
        same = sum(len(x[1]) == len(y[1]) and bool(torch.allclose(x[1], y[1], atol=0.02)) for x, y in zip(dali, cpu))
        assert same >= len(cpu) - 1


def _keys(batches):
    """One key per sample of letterboxed eval batches (each image has one box) in batch order."""
    return [tuple(np.round(t[2:4].tolist(), 3)) for _, targets in batches
            for t in sorted(targets, key=lambda t: float(t[0]))]


def test_two_ranks_see_disjoint_samples_covering_the_epoch(raw_store):
    def keys(rank):
        cfg = _cfg(imgsz=160, batch_size=4, workers=0, augment=False, rank=rank, world_size=2, drop_last=False)
        with create_loader("dali", raw_store, cfg) as loader:
            return set(_keys(_collect(loader)))

    r0, r1 = keys(0), keys(1)
    assert not r0 & r1 and len(r0 | r1) == N


def test_epochs_follow_the_shared_sampler_and_reshuffle(raw_store):
    """Each epoch holds exactly epoch_batches' order (the other loaders' order): sequential epochs
    reuse the running pipeline, an abandoned or out-of-order epoch rebuilds it."""
    cfg = _cfg(imgsz=160, batch_size=4, workers=2, augment=False)
    with create_loader("cpu", raw_store, _cfg(imgsz=160, batch_size=4, workers=0, augment=False,
                                                      shuffle=False, drop_last=False)) as plain:
        by_index = _keys(_collect(plain))
    with create_loader("dali", raw_store, cfg) as loader:
        orders = {}
        for epoch in (0, 1, 2, 7):
            orders[epoch] = _keys(_collect(loader, epoch))
            expect = [by_index[i] for b in epoch_batches(N, 4, epoch=epoch, seed=0) for i in b]
            assert orders[epoch] == expect, f"epoch {epoch} mixed up"
        loader.set_epoch(3)
        next(iter(loader))                     # abandoned after one batch
        assert _keys(_collect(loader, 3)) == [by_index[i] for b in epoch_batches(N, 4, epoch=3, seed=0) for i in b]
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])


def test_close_mosaic_turns_mosaic_off_for_the_last_epochs(raw_store):
    cfg = _cfg(imgsz=128, batch_size=8, workers=0, epochs=3, close_mosaic=1, hyp=NO_COLOUR)
    with create_loader("dali", raw_store, cfg) as loader:
        def boxes_per_image(epoch):
            return max(np.bincount(t[:, 0].long().numpy()).max() for _, t in _collect(loader, epoch))
        assert boxes_per_image(0) > 1       # mosaic: several images' boxes in one sample
        assert boxes_per_image(2) == 1      # one image per sample, one box each


# --- setup and failures --------------------------------------------------------------------------

def test_missing_dali_names_the_extra(raw_store, monkeypatch):
    real = builtins.__import__

    def no_dali(name, *args, **kw):
        if name.startswith("nvidia.dali") or name == "nvidia":
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_dali)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[dali\]' in the fastfeed checkout"):
        create_loader("dali", raw_store, _cfg(imgsz=64, batch_size=4))


def test_device_choice_is_checked(raw_store):
    with pytest.raises(ValueError, match="LoaderConfig.device: device 'tpu' is not a device; valid: 'auto', 'cpu'"):
        LoaderConfig(imgsz=64, batch_size=4, device="tpu")
    with pytest.raises(ValueError, match="the dali loader runs on NVIDIA GPUs or the CPU, not on 'npu'"):
        create_loader("dali", raw_store, LoaderConfig(imgsz=64, batch_size=4, device="npu"))
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: asking for cuda is fine here")
    with pytest.raises(DeviceError, match="device 'cuda': torch .* sees no CUDA device"):
        create_loader("dali", raw_store, LoaderConfig(imgsz=64, batch_size=4, device="cuda"))
    with create_loader("dali", raw_store, LoaderConfig(imgsz=64, batch_size=4)) as loader:   # auto: the CPU here
        assert loader.device.device_id is None


@pytest.mark.parametrize("workers", [0, 2])
def test_a_corrupt_record_raises_naming_it(jpeg_store, tmp_path, workers):
    from store_helpers import flip_byte_in_record
    bad = tmp_path / "bad.ff"
    shutil.copytree(jpeg_store.path, bad)
    flip_byte_in_record(bad, 5)
    loader = _dali(Store(bad), imgsz=64, batch_size=4, workers=workers, shuffle=False)
    with pytest.raises(WorkerError, match="record 5 in shard shard-00000.mdb: CRC32 mismatch"):
        list(loader)
    loader.close()


def test_a_record_dali_cannot_decode_raises_naming_it(jpeg_store, tmp_path):
    """CRC intact, payload not an image (what check_crc=False lets through, or a decoder mismatch)."""
    from store_helpers import replace_record
    bad = tmp_path / "bad.ff"
    shutil.copytree(jpeg_store.path, bad)
    replace_record(bad, 6, payload=b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8)
    loader = _dali(Store(bad), imgsz=64, batch_size=4, workers=2, shuffle=False, augment=False)
    with pytest.raises(WorkerError, match=r"DALI could not decode record 6 \(06.jpg\) in shard shard-00000.mdb"):
        list(loader)
    loader.close()


def test_early_stop_then_next_epoch_and_a_store_smaller_than_a_batch(raw_store):
    with _dali(raw_store, imgsz=64, batch_size=2, workers=2) as loader:
        for k, _ in enumerate(loader):
            if k == 1:
                break
        loader.set_epoch(1)
        assert len(list(loader)) == len(loader) == N // 2
    with pytest.raises(ValueError, match=f"batch_size {N + 1} x world_size 1 needs at least {N + 1} images"):
        _dali(raw_store, imgsz=64, batch_size=N + 1, workers=0)


def test_mixup_blends_two_augmented_samples_and_keeps_both_boxes(raw_store):
    """hyp.mixup=1: each sample is a Beta(32,32) blend with a second sample made from a partner-buffer image (as the
    cpu loader's), with the boxes of both (each frames half-strength paint); deterministic; off when closed."""
    hyp = AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, mosaic=0.0, mixup=1.0, translate=0.0, scale=0.0)
    with _dali(raw_store, imgsz=128, batch_size=4, workers=0, hyp=hyp, seed=1, epochs=3, close_mosaic=1) as loader:
        mixed, again, closed = _collect(loader, 0), _collect(loader, 0), _collect(loader, 2)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(mixed, again))
    for images, targets in mixed:
        counts = np.bincount(targets[:, 0].long().numpy(), minlength=len(images))
        assert (counts == 2).all()                                   # one box from each image
        for j, _, cx, cy, w, h in targets.tolist():
            x1, y1, x2, y2 = (np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]) * 128).round().astype(int)
            red = images[int(j), 0, y1 + 1:y2 - 1, x1 + 1:x2 - 1].float().mean()
            assert 140 < red < 225, f"box {x1, y1, x2, y2}: red {red:.0f} is not a blend of red paint and grey"
    assert all((np.bincount(t[:, 0].long().numpy()) == 1).all() for _, t in closed)   # no mixup when closed


def test_a_task_stores_boxes_alone_with_task_detect(tmp_path):
    """DALI moves boxes only: a segment store is refused (test_loader_tasks), but read with task='detect' it gives
    the batches of the same dataset packed for detection."""
    from store_helpers import run_pack
    from task_stores import make_task_store

    seg = make_task_store(tmp_path / "seg", "segment")
    run_pack(tmp_path / "seg" / "src", tmp_path / "d.ff", task="detect")
    cfg = dict(imgsz=64, batch_size=4, workers=0, seed=3)
    with _dali(seg, task="detect", **cfg) as a, _dali(Store(tmp_path / "d.ff"), **cfg) as b:
        assert a.task == "detect"
        got, twin = _collect(a, 1), _collect(b, 1)
    assert len(got) == len(twin) > 0
    for (x, t), (y, u) in zip(got, twin):
        assert torch.equal(x, y) and torch.equal(t, u)
