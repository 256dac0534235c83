"""The `cpu` loader: the Batch contract, boxes on their objects, determinism, ranks, failures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from loader_checks import (  # noqa: F401
    NO_COLOUR,
    assert_a_killed_worker_raises,
    assert_batch_contract,
    assert_boxes_frame_paint,
    collect_batches,
    make_painted_store,
)

from fastfeed import Store
from fastfeed.augment import AugmentHyp
from fastfeed.loaders import LoaderConfig, WorkerError, create_loader, list_loaders, loader_options
from fastfeed.loaders.sampler import batches_per_epoch, epoch_batches


@pytest.fixture(scope="module")
def painted_store(tmp_path_factory):
    return make_painted_store(tmp_path_factory.mktemp("painted"))




def test_registry_lists_cpu_and_rejects_unknown_names(painted_store):
    assert "cpu" in list_loaders()
    with pytest.raises(ValueError, match="unknown loader 'gpu'; valid loaders: .*cpu"):
        create_loader("gpu", painted_store)


def test_a_store_path_or_a_dict_config_is_refused_by_name(painted_store):
    path = str(painted_store.path)
    with pytest.raises(TypeError, match=f"create_loader reads a store, not str '{path}': pass fastfeed.Store"):
        create_loader("cpu", path, LoaderConfig(imgsz=64, batch_size=4, workers=0))   # was: len(path) records
    with pytest.raises(TypeError, match="create_loader's cfg must be a LoaderConfig, got dict"):
        create_loader("cpu", painted_store, {"imgsz": 64})


@pytest.mark.parametrize("field, value", [("imgsz", 100), ("batch_size", 0), ("workers", -1), ("batches_ahead", 0),
                                          ("rank", 2), ("world_size", 0), ("close_mosaic", -1), ("epochs", 0),
                                          ("hyp", {"mosaic": 1})])
def test_bad_config_values_name_the_field(field, value):
    kw = {field: value}
    if field == "rank":
        kw["world_size"] = 2
    with pytest.raises(ValueError, match=f"LoaderConfig.{field}"):
        LoaderConfig(**kw)


@pytest.mark.parametrize("field, value, says", [
    ("batch_size", True, "batch_size must be an integer, got True"), ("workers", 2.0, "workers must be an integer"),
    ("rank", True, "rank must be an integer or None"), ("timeout", "5", "timeout must be a number of seconds > 0"),
    ("augment", "False", "augment must be True or False"), ("drop_last", None, "drop_last must be True or False"),
    ("pin_memory", "yes", "pin_memory must be True or False")])
def test_config_values_of_the_wrong_type_are_named_not_taken_for_truthy_or_ints(field, value, says):
    with pytest.raises(ValueError, match=f"LoaderConfig.{says}"):
        LoaderConfig(**{field: value})


def test_numpy_integers_are_integers_in_the_config():
    cfg = LoaderConfig(imgsz=np.int64(64), batch_size=np.int64(4), workers=np.int32(0), world_size=np.int64(2),
                       rank=np.int64(1), epochs=np.int64(3), close_mosaic=np.int64(1))
    assert (cfg.batch_size, cfg.workers, cfg.rank, cfg.world_size) == (4, 0, 1, 2)
    assert all(type(getattr(cfg, k)) is int for k in ("imgsz", "batch_size", "workers", "rank", "world_size", "epochs"))


def test_the_old_name_prefetch_still_sets_batches_ahead_with_a_deprecation_warning():
    from dataclasses import replace

    with pytest.warns(DeprecationWarning, match=r"LoaderConfig\(prefetch=...\) is deprecated: use "
                                                r"LoaderConfig\(batches_ahead=...\)"):
        cfg = LoaderConfig(imgsz=64, prefetch=5)
    assert cfg.batches_ahead == 5 and replace(cfg, batch_size=2).batches_ahead == 5
    with pytest.warns(DeprecationWarning, match="use LoaderConfig.batches_ahead"):
        assert cfg.prefetch == 5
    with pytest.raises(TypeError, match="give batches_ahead only"):
        LoaderConfig(prefetch=2, batches_ahead=3)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="LoaderConfig.batches_ahead must be >= 1"):
        LoaderConfig(prefetch=0)
    with pytest.raises(ValueError, match="LoaderConfig.seed must be an integer >= 0, got -1"):
        LoaderConfig(seed=-1)


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_contract(painted_store, workers):
    cfg = LoaderConfig(imgsz=96, batch_size=5, workers=workers, drop_last=False)
    with create_loader("cpu", painted_store, cfg) as loader:
        batches = collect_batches(loader)
    assert len(batches) == len(loader) == 5
    assert_batch_contract(batches, 96, nc=3, total=24)


@pytest.mark.parametrize("hyp", [NO_COLOUR, AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, degrees=0, mosaic=0.0),
                                 AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, fliplr=1.0, flipud=0.5)])
def test_boxes_frame_the_painted_objects_after_augmentation(painted_store, hyp):
    cfg = LoaderConfig(imgsz=128, batch_size=8, workers=2, hyp=hyp, seed=3)
    with create_loader("cpu", painted_store, cfg) as loader:
        batches = collect_batches(loader) + collect_batches(loader, 1)
    assert_boxes_frame_paint(batches, 128)


def test_eval_batches_are_letterboxed_store_images(painted_store):
    cfg = LoaderConfig(imgsz=160, batch_size=4, workers=0, augment=False, shuffle=False, drop_last=False)
    with create_loader("cpu", painted_store, cfg) as loader:
        images, targets = next(iter(loader))
    s = painted_store[1]                      # 120x160: fits the width, padded top and bottom by 20
    expect = np.full((160, 160, 3), 114, np.uint8)
    expect[20:140] = s.image
    assert np.array_equal(images[1].permute(1, 2, 0).numpy(), expect)
    t = targets[targets[:, 0] == 1][0]
    x1, y1, x2, y2 = s.boxes[0] * [160, 120, 160, 120]
    np.testing.assert_allclose(t[2:].numpy(), [(x1 + x2) / 320, (y1 + y2 + 40) / 320, (x2 - x1) / 160, (y2 - y1) / 160],
                               atol=1e-5)


def test_same_seed_same_batches_other_seed_other_batches(painted_store):
    def run(seed, workers=2):
        with create_loader("cpu", painted_store, LoaderConfig(imgsz=96, batch_size=4, workers=workers, seed=seed)) as ld:
            return collect_batches(ld) + collect_batches(ld, 1)

    a, b, c = run(1), run(1), run(2)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a, c))


def test_set_epoch_reshuffles_and_ranks_partition_the_epoch():
    for n, ws, drop in ((24, 2, False), (23, 3, False), (24, 2, True), (25, 4, True)):
        for epoch in (0, 1):
            ranks = [np.concatenate(epoch_batches(n, 4, epoch=epoch, seed=0, rank=r, world_size=ws, drop_last=drop) or
                                    [np.zeros(0, int)]) for r in range(ws)]
            counts = {len(epoch_batches(n, 4, epoch=epoch, seed=0, rank=r, world_size=ws, drop_last=drop)) for r in range(ws)}
            assert counts == {batches_per_epoch(n, 4, ws, drop)}          # every rank runs the same steps
            union = np.concatenate(ranks)
            if not drop:
                assert set(union.tolist()) == set(range(n))                # together they cover the epoch
                assert len(union) - len(set(union.tolist())) < ws           # repeats only to pad the last rank
            if n % ws == 0:
                assert len(union) == len(set(union.tolist()))               # and are disjoint
    e0 = np.concatenate(epoch_batches(24, 4, epoch=0, seed=0))
    e1 = np.concatenate(epoch_batches(24, 4, epoch=1, seed=0))
    assert not np.array_equal(e0, e1) and sorted(e0) == sorted(e1)


def test_two_rank_loaders_see_disjoint_samples_covering_the_epoch(painted_store):
    """Identify samples by their one box: letterboxed eval batches keep each image's box exactly."""
    def boxes_of(rank):
        cfg = LoaderConfig(imgsz=160, batch_size=4, workers=0, augment=False, rank=rank, world_size=2, drop_last=False)
        with create_loader("cpu", painted_store, cfg) as loader:
            return {tuple(np.round(t[1:].numpy(), 4)) for _, targets in collect_batches(loader) for t in targets}

    r0, r1 = boxes_of(0), boxes_of(1)
    assert not r0 & r1 and len(r0 | r1) == 24


def test_close_mosaic_turns_mosaic_off_for_the_last_epochs(painted_store):
    cfg = LoaderConfig(imgsz=128, batch_size=8, workers=0, epochs=3, close_mosaic=1, hyp=NO_COLOUR)
    assert [cfg.mosaic_on(e) for e in range(3)] == [True, True, False]
    with create_loader("cpu", painted_store, cfg) as loader:
        def boxes_per_image(epoch):
            return max(np.bincount(t[:, 0].long().numpy()).max() for _, t in collect_batches(loader, epoch))
        assert boxes_per_image(0) > 1       # mosaic: several images' boxes in one sample
        assert boxes_per_image(2) == 1      # one image per sample, one box each


def test_early_stop_then_next_epoch_works(painted_store):
    with create_loader("cpu", painted_store, LoaderConfig(imgsz=64, batch_size=2, workers=2, batches_ahead=2)) as loader:
        for k, _ in enumerate(loader):
            if k == 1:
                break
        loader.set_epoch(1)
        assert len(list(loader)) == len(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_second_iteration_ends_the_first_instead_of_hanging(painted_store, workers):
    cfg = LoaderConfig(imgsz=64, batch_size=2, workers=workers, timeout=5, shuffle=False)
    with create_loader("cpu", painted_store, cfg) as loader:
        first = iter(loader)
        next(first)
        second = [b.indices.tolist() for b in loader]   # was: the two shared the workers' results, and one waited
        assert second == [b.tolist() for b in loader.order.batches(0)]   # until 'a worker is stuck'
        with pytest.raises(StopIteration):
            next(first)
        it = iter(loader)
        next(it)
        loader.set_epoch(3)   # was: `it` went on with epoch 0's batches, counted as epoch 3's (state_dict said so)
        with pytest.raises(StopIteration):
            next(it)
        assert loader.state_dict()["batches"] == 0 and loader.state_dict()["epoch"] == 3


@pytest.mark.parametrize("workers", [0, 1])
def test_pickling_a_loader_says_it_does_not_pickle_and_what_to_do(painted_store, workers):
    import pickle

    with create_loader("cpu", painted_store, LoaderConfig(imgsz=64, batch_size=2, workers=workers)) as loader:
        next(iter(loader))   # was: deep inside multiprocessing (SimpleQueue), or a weakref that cannot pickle
        with pytest.raises(TypeError, match=r"fastfeed loader \(PoolLoader\) does not pickle: create it in the "
                                            "process that iterates it, from its Store and LoaderConfig"):
            pickle.dumps(loader)
    assert pickle.loads(pickle.dumps(painted_store)).path == painted_store.path   # what to pass instead


def test_a_corrupt_record_raises_in_the_main_process(painted_store, tmp_path):
    import shutil

    from store_helpers import flip_byte_in_record
    bad = tmp_path / "bad.ff"
    shutil.copytree(painted_store.path, bad)
    flip_byte_in_record(bad, 5)
    loader = create_loader("cpu", Store(bad), LoaderConfig(imgsz=64, batch_size=4, workers=2, shuffle=False))
    with pytest.raises(WorkerError, match="record 5 in shard shard-00000.mdb: CRC32 mismatch"):
        list(loader)
    loader.close()


def test_a_killed_worker_raises_instead_of_hanging(painted_store):
    assert_a_killed_worker_raises(create_loader("cpu", painted_store, LoaderConfig(imgsz=64, batch_size=2, workers=2, timeout=30)))


def test_the_next_epoch_is_queued_ahead_and_dropped_when_another_is_asked(painted_store):
    """Eval batches identify their images (one box each): each epoch must hold exactly its own order."""
    def key(store_index):
        s = painted_store[int(store_index)]
        h, w = s.size
        r = 160 / max(h, w)
        x1, y1, x2, y2 = s.boxes[0] * [w * r, h * r, w * r, h * r] + [(160 - w * r) / 2, (160 - h * r) / 2] * 2
        return (x1 + x2) / 320, (y1 + y2) / 320

    cfg = LoaderConfig(imgsz=160, batch_size=4, workers=2, augment=False, batches_ahead=3)
    with create_loader("cpu", painted_store, cfg) as loader:
        for epoch in (0, 1, 5, 6):
            got = [t[2:4].tolist() for _, targets in collect_batches(loader, epoch)
                   for t in sorted(targets, key=lambda t: float(t[0]))]
            expect = [key(i) for b in epoch_batches(24, 4, epoch=epoch, seed=0) for i in b]
            np.testing.assert_allclose(got, expect, atol=2e-3, err_msg=f"epoch {epoch} mixed up")
            if epoch in (0, 5):
                assert loader.pool.outstanding > 0   # the following epoch is already being built


def test_device_augment_leaves_hsv_and_flip_out_of_the_workers(painted_store):
    hyp = AugmentHyp(fliplr=1.0, flipud=0.0, hsv_h=0.5, hsv_s=1.0, hsv_v=1.0, mosaic=0.0, scale=0.0, translate=0.0)
    cfg = LoaderConfig(imgsz=160, batch_size=4, workers=0, shuffle=False, hyp=hyp, device_augment=True)
    assert cfg.worker_hyp().fliplr == 0 and cfg.worker_hyp().hsv_v == 0 and cfg.worker_hyp().scale == 0
    with create_loader("cpu", painted_store, cfg) as loader:
        images, targets = next(iter(loader))
    plain = LoaderConfig(imgsz=160, batch_size=4, workers=0, shuffle=False, augment=False)
    with create_loader("cpu", painted_store, plain) as loader:
        expect, expect_targets = next(iter(loader))
    assert torch.equal(images, expect)   # no flip, no colour change: what a letterbox gives
    torch.testing.assert_close(targets, expect_targets)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_started_anywhere_gives_the_uninterrupted_batches(painted_store, workers):
    """Resuming (set_epoch(e, start)), a fresh loader on a later epoch, or an abandoned epoch: the
    batches are those of one uninterrupted run, mosaic partners included, and the skipped batches
    are not built (only the images the partner buffers held are loaded again)."""
    cfg = LoaderConfig(imgsz=96, batch_size=2, workers=workers, hyp=NO_COLOUR, seed=4)
    with create_loader("cpu", painted_store, cfg, partner_buffer=6) as loader:
        run = [collect_batches(loader, e) for e in range(3)]
    n = len(run[0])
    for epoch, start in ((1, 5), (1, 0), (0, 3), (2, n - 1)):
        with create_loader("cpu", painted_store, cfg, partner_buffer=6) as loader:
            loader.set_epoch(epoch, start)
            got = [(b.images.clone(), b.targets.clone()) for b in loader]
            built = loader.stage_times().samples
            assert _same(got, run[epoch][start:]), f"epoch {epoch} from batch {start}"
            ahead = 2 * workers * cfg.batches_ahead                 # the next epoch's first batches, queued early
            assert 2 * (n - start) <= built <= 2 * (n - start) + ahead   # the skipped batches were not built
            assert _same(collect_batches(loader, epoch + 1)[:3], run[epoch + 1][:3]) if epoch < 2 else True
    with create_loader("cpu", painted_store, cfg, partner_buffer=6) as loader:
        loader.set_epoch(0)
        for k, _ in enumerate(loader):                            # abandoned half-way
            if k == 4:
                break
        assert _same(collect_batches(loader, 1), run[1])
    with pytest.raises(ValueError, match=f"start must be a batch index in 0..{n}"):
        loader.set_epoch(0, n + 1)
    with pytest.raises(ValueError, match="epoch must be an integer >= 0, got -1"):
        loader.set_epoch(-1)
    loader.set_epoch(np.int64(1), np.int64(2))   # numpy integers, as a resume computed with numpy gives them
    assert (loader.epoch, loader.start) == (1, 2) and type(loader.start) is int


def test_a_batch_larger_than_the_epoch_is_a_clear_error(painted_store):
    with pytest.raises(ValueError, match="batch_size 16 x world_size 2 needs at least 32 images per epoch .* the "
                                         "store holds 24: use a smaller batch_size"):
        create_loader("cpu", painted_store, LoaderConfig(imgsz=64, batch_size=16, world_size=2, rank=0))
    cfg = LoaderConfig(imgsz=64, batch_size=30, workers=0, drop_last=False, augment=False)
    with create_loader("cpu", painted_store, cfg) as loader:   # drop_last=False: the one short batch
        assert [len(b.images) for b in loader] == [24]


def test_loader_info_says_what_runs_here_and_its_options():
    from fastfeed.loaders import loader_info

    info = {i.name: i for i in loader_info()}
    assert {"cpu", "shm", "dali"} <= set(info)
    assert info["cpu"].available and info["cpu"].options == {"partner_buffer": None}
    assert {"cache_dir", "cache_partial", "partner_buffer"} <= set(info["shm"].options)
    # a numpy integer is an integer (it was refused as not one)
    assert type(pb := loader_options("cpu", partner_buffer=np.int64(8)).partner_buffer) is int and pb == 8
    try:
        import nvidia.dali  # noqa: F401
        assert info["dali"].available
    except ImportError:
        assert "pip install -e '.[dali]'" in info["dali"].unavailable


def test_a_device_cache_reserve_without_the_device_cache_is_warned_not_ignored(painted_store, caplog):
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=0, device="cpu")
    for options in ({}, {"cache_reserve_gb": 8.0}, {"cache_reserve_gb": 2}):   # the default, given or not: no word
        with caplog.at_level("WARNING"), create_loader("device", painted_store, cfg, **options):
            pass
    assert caplog.text.count("cache_reserve_gb") == 1   # was: 2 GiB asked for, nothing said, nothing done
    assert "cache_reserve_gb=2 does nothing without cache='device'" in caplog.text


def test_the_partner_buffer_is_sized_like_ultralytics():
    from fastfeed.loaders.pool import CpuOptions

    assert CpuOptions().resolved(24, 2).partner_buffer == 16            # 8 x batch
    assert CpuOptions().resolved(10, 16).partner_buffer == 10           # the whole store
    assert CpuOptions().resolved(100_000, 256).partner_buffer == 1000   # capped
    assert CpuOptions(partner_buffer=9).resolved(100, 16).partner_buffer == 9
    with pytest.raises(ValueError, match="option partner_buffer must be an integer >= 4 or None"):
        CpuOptions(partner_buffer=3)


def test_mixup_blends_two_samples_and_keeps_both_boxes(painted_store):
    """hyp.mixup=1: every sample is a Beta(32,32) blend of two (single-image here) samples, with the
    boxes of both: each box frames half-strength paint; deterministic; off in the close_mosaic epochs."""
    hyp = AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, mosaic=0.0, mixup=1.0, translate=0.0, scale=0.0)
    cfg = LoaderConfig(imgsz=128, batch_size=4, workers=0, hyp=hyp, seed=1, epochs=3, close_mosaic=1)
    with create_loader("cpu", painted_store, cfg) as loader:
        mixed, again, closed = collect_batches(loader, 0), collect_batches(loader, 0), collect_batches(loader, 2)
    assert _same(mixed, again)
    for images, targets in mixed:
        counts = np.bincount(targets[:, 0].long().numpy(), minlength=len(images))
        assert (counts >= 1).all() and counts.mean() > 1.5           # two images' boxes per sample
        for j, _, cx, cy, w, h in targets.tolist():
            x1, y1, x2, y2 = (np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]) * 128).round().astype(int)
            red = images[int(j), 0, y1 + 1:y2 - 1, x1 + 1:x2 - 1].float().mean()
            assert 140 < red < 225, f"box {x1, y1, x2, y2}: red {red:.0f} is not a blend of red paint and grey"
    assert all((np.bincount(t[:, 0].long().numpy()) == 1).all() for _, t in closed)   # no mixup when closed
