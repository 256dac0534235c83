"""One sample plan for every loader: the draws (augment.plan), the partner buffer's history, the same plans
from the cpu, device and DALI paths for a seed, the order a loader is given and the record indices of its
batches."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch
from loader_checks import NO_COLOUR, make_painted_store

from fastfeed import augment
from fastfeed.augment import AugmentHyp, Geometry, batch_rng, draw_batch, draw_sample
from fastfeed.loaders import EpochOrder, LoaderConfig, ShuffledOrder, create_loader, register_loader, unregister_loader
from fastfeed.loaders import partners as partners_mod
from fastfeed.loaders.partners import PartnerBuffer, history
from fastfeed.loaders.pool import CpuOptions
from fastfeed.loaders.sampler import epoch_batches


@pytest.fixture(scope="module")
def painted(tmp_path_factory):
    return make_painted_store(tmp_path_factory.mktemp("plans"), "original")   # JPEGs: every path decodes


# --- the draws ----------------------------------------------------------------------------------------

def test_a_plan_holds_every_draw_in_the_documented_order():
    hyp = AugmentHyp(mosaic=1.0, mixup=1.0)
    plan = draw_sample(batch_rng(3, 0, 1, 2), hyp, 64, mosaic_on=True, mixup_on=True, candidates=10)
    assert plan.geometry.mosaic and all(0 <= p < 10 for p in plan.geometry.partners)
    assert plan.mix is not None and 0 <= plan.mix.other < 10 and 0.3 < plan.mix.weight < 0.7
    assert plan.hsv is not None
    # the same sequence by hand: mosaic?, 3 partners, centre, affine, mixup?, other, its geometry, weight, hsv
    rng = batch_rng(3, 0, 1, 2)
    assert rng.random() < 1.0
    picks = tuple(int(p) for p in rng.integers(10, size=3))
    centre = augment.draw_mosaic_centre(rng, 64)
    affine = augment.draw_affine(rng, hyp, 64)
    assert plan.geometry == Geometry(picks, centre, affine)
    assert rng.random() < 1.0 and int(rng.integers(10)) == plan.mix.other
    assert augment.draw_geometry(rng, hyp, 64, True, 10) == plan.mix.geometry
    assert augment.draw_mixup_weight(rng) == plan.mix.weight
    assert augment.draw_hsv(rng, hyp.hsv_h, hyp.hsv_s, hyp.hsv_v) == plan.hsv


def test_closed_epochs_and_zero_gains_draw_nothing_of_theirs():
    hyp = AugmentHyp(hsv_h=0, hsv_s=0, hsv_v=0, mixup=0.5)
    a = draw_sample(batch_rng(0, 0, 0, 0), hyp, 64, mosaic_on=False, mixup_on=False, candidates=8)
    assert not a.geometry.mosaic and a.mix is None and a.hsv is None
    rng = batch_rng(0, 0, 0, 0)   # nothing but the affine was drawn
    assert augment.draw_affine(rng, hyp, 64) == a.geometry.affine
    with pytest.raises(ValueError, match="at least one candidate"):
        draw_sample(batch_rng(0, 0, 0, 0), hyp, 64, mosaic_on=True, mixup_on=False, candidates=0)


def test_history_is_what_a_partner_buffer_holds():
    """history(order, epoch, before, worker, W, size) equals a worker's buffer after building its batches of every
    earlier epoch and of this one up to `before`, whatever the sizes (buffer smaller or larger than a batch)."""
    for n, b, w, size in [(23, 3, 2, 7), (40, 4, 3, 16), (12, 5, 1, 3), (30, 2, 4, 100)]:
        order = ShuffledOrder(n, b, seed=5, drop_last=False)
        bufs = [deque(maxlen=size) for _ in range(w)]
        for epoch in range(3):
            for k, batch in enumerate(order.batches(epoch)):
                assert list(history(order.batches, epoch, k, k % w, w, size)) == list(bufs[k % w])
                bufs[k % w].extend(int(i) for i in batch)
                assert list(history(order.batches, epoch, k + 1, k % w, w, size)) == list(bufs[k % w])


def test_plan_batch_loads_the_batch_then_draws_with_the_buffer_as_candidates():
    buf = PartnerBuffer(6, lambda i, times: i * 10, keep=True)
    buf.warm([1, 2, 3, 4], reset=True)
    loaded, plans = buf.plan_batch([7, 8, 9], {}, seed=1, rank=0, epoch=0, batch=0, hyp=AugmentHyp(mosaic=1.0), size=64,
                                   augment=True, mosaic_on=True, mixup_on=False)
    assert loaded == [70, 80, 90] and list(buf.items) == [20, 30, 40, 70, 80, 90]
    assert plans == draw_batch(batch_rng(1, 0, 0, 0), 3, AugmentHyp(mosaic=1.0), 64, mosaic_on=True, mixup_on=False,
                               candidates=6)
    assert buf.plan_batch([5], {}, seed=1, rank=0, epoch=0, batch=1, hyp=AugmentHyp(), size=64, augment=False,
                          mosaic_on=True, mixup_on=True)[1] is None   # evaluation batches draw nothing


def test_a_batch_loaded_in_another_order_is_kept_and_planned_in_its_own():
    """`order` (a store's `arrival`: records as their shards arrive) changes when each record loads, never the
    loaded list, the buffer or the plans."""
    calls = []

    def load(i, times):
        calls.append(i)
        return i * 10

    plain, turned = PartnerBuffer(6, load, keep=True), PartnerBuffer(6, load, keep=True, order=lambda ix: [2, 0, 1])
    got = [b.plan_batch([7, 8, 9], {}, seed=1, rank=0, epoch=0, batch=0, hyp=AugmentHyp(mosaic=1.0), size=64,
                        augment=True, mosaic_on=True, mixup_on=False) for b in (plain, turned)]
    assert calls == [7, 8, 9, 9, 7, 8]
    assert got[0] == got[1] and got[1][0] == [70, 80, 90] and list(turned.items) == [70, 80, 90]


# --- the same plans from every path ---------------------------------------------------------------------

def _spy_plans(monkeypatch, module):
    """Record (records each sample shows, plan) for every batch `module`'s draw_batch is called for; the candidate
    records come from the PartnerBuffer loads (cpu, device) or the DALI source's history."""
    seen, loads = [], []
    real_draw, real_load = module.draw_batch, PartnerBuffer.read

    def load(self, index, times):
        loads.append((id(self), int(index), self.items.maxlen))
        return real_load(self, index, times)

    def draw(rng, n, hyp, size, **kw):
        plans = real_draw(rng, n, hyp, size, **kw)
        seen.append((n, kw["candidates"], plans))
        return plans

    monkeypatch.setattr(module, "draw_batch", draw)
    monkeypatch.setattr(PartnerBuffer, "read", load)
    return seen, loads


def _records(seen, loads, batches):
    """Per sample: the records its tiles show (own, partners, mixup tiles), rebuilt from the logged loads."""
    out, pos = [], 0
    for (n, count, plans), batch in zip(seen, batches):
        while pos < len(loads) and [i for _, i, _ in loads[pos:pos + n]] != [int(i) for i in batch]:
            pos += 1          # warm-up loads before the batch
        pos += n
        cands = [i for _, i, _ in loads[:pos]][-count:] if count else []
        out += [p.records(int(own), cands) for p, own in zip(plans, batch)]
    return out


def _dali_records(src, epoch):
    out = []
    for k, batch in enumerate(src.order.batches(epoch)):
        cands, plans = src.plans(epoch, k, len(batch))
        out += [p.records(int(own), cands) for p, own in zip(plans, batch)]
    return out


def _run(name, store, cfg, epochs):
    with create_loader(name, store, cfg) as loader:
        for e in epochs:
            loader.set_epoch(e)
            for _ in loader:
                pass
        return loader.order


@pytest.mark.parametrize("mixup", [0.0, 0.5])
def test_same_seed_same_plans_from_the_cpu_device_and_dali_paths(painted, monkeypatch, mixup):
    hyp = AugmentHyp(mixup=mixup, degrees=5.0)
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=0, seed=11, hyp=hyp, epochs=3, close_mosaic=1, device="cpu")
    epochs = (0, 1, 2)
    cpu_seen, cpu_loads = _spy_plans(monkeypatch, partners_mod)
    order = _run("cpu", painted, cfg, epochs)
    batches = [b for e in epochs for b in order.batches(e)]
    cpu = [p for _, _, ps in cpu_seen for p in ps]
    cpu_records = _records(cpu_seen, cpu_loads, batches)
    assert len(cpu) == sum(len(b) for b in batches) and any(p.geometry.mosaic for p in cpu)
    assert (mixup > 0) == any(p.mix is not None for p in cpu)

    if not mixup:   # the device loader refuses mixup by name
        dev_seen, dev_loads = _spy_plans(monkeypatch, partners_mod)
        _run("device", painted, cfg, epochs)
        assert [p for _, _, ps in dev_seen for p in ps] == cpu
        assert _records(dev_seen, dev_loads, batches) == cpu_records

    # The DALI external source (plain Python, no DALI needed to plan): what its batches render, from its calls.
    from fastfeed.loaders.dali.source import DaliSource

    src = DaliSource(painted, cfg, order, CpuOptions().resolved(len(painted), 4).partner_buffer, "mosaic", raw=False)
    dali = [p for e in epochs for k, b in enumerate(src.order.batches(e)) for p in src.plans(e, k, len(b))[1]]
    assert dali == cpu
    assert [r for e in epochs for r in _dali_records(src, e)] == cpu_records


def test_dali_batches_frame_the_cpu_loaders_boxes(painted):
    """Same plans: the DALI batch's boxes are the cpu batch's (to interpolation: a box at a filter threshold may
    differ), for 2 workers too (worker k % 2's buffer)."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    cfg = LoaderConfig(imgsz=96, batch_size=4, workers=2, seed=4, hyp=NO_COLOUR, device="cpu")
    out = {}
    for name in ("cpu", "dali"):
        with create_loader(name, painted, cfg) as loader:
            out[name] = [(b.indices.clone(), b.targets.clone()) for b in loader]
    close = 0
    for (ia, ta), (ib, tb) in zip(out["cpu"], out["dali"]):
        assert torch.equal(ia, ib)
        close += len(ta) == len(tb) and bool(torch.allclose(ta, tb, atol=0.02))
    assert close >= len(out["cpu"]) - 1


# --- the order a loader is given, and the records its batches say they hold ----------------------------------

class Reversed(EpochOrder):
    """The global shuffle with every epoch's batches in reverse order and each batch reversed."""

    def __init__(self, base: ShuffledOrder):
        self.base, self.rank, self.world_size = base, base.rank, base.world_size

    def batches(self, epoch):
        return [b[::-1].copy() for b in self.base.batches(epoch)[::-1]]

    def __len__(self):
        return len(self.base)


@pytest.mark.parametrize("name", ["cpu", "device"])
def test_a_loader_follows_the_order_it_is_given_and_says_which_records(painted, name):
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=0, augment=False, device="cpu")
    order = Reversed(ShuffledOrder.for_loader(len(painted), cfg, 0, 1))
    with create_loader(name, painted, cfg, order=order) as loader:
        assert loader.order is order
        got = [b for b in loader]
        for b, want in zip(got, order.batches(0)):
            assert b.indices.tolist() == want.tolist()
            for j, i in enumerate(want):   # each sample shows its record: its box is the record's, letterboxed
                t = b.targets[b.targets[:, 0] == j]
                assert len(t) == len(painted.record(int(i)).boxes)
    images, targets = got[0]                      # still unpacks as the pair it always was
    assert images.shape[0] == len(got[0].indices) and targets.shape[1] == 6


def test_a_loader_registered_outside_the_package(painted):
    """register_loader from a test module: a plain loader over the cpu one with the order reversed."""
    name = "test-reversed-cpu"

    def factory(store, cfg, opts, order=None):
        return create_loader("cpu", store, cfg, order=order or Reversed(ShuffledOrder.for_loader(len(store), cfg, 0, 1)))

    register_loader(name, factory, summary="the cpu loader, order reversed (a test's)")
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_loader(name, factory)
        cfg = LoaderConfig(imgsz=64, batch_size=4, workers=0, augment=False, device="cpu")
        with create_loader(name, painted, cfg) as loader:
            first = next(iter(loader)).indices.tolist()
        assert first == epoch_batches(len(painted), 4, epoch=0, seed=0)[-1][::-1].tolist()
    finally:
        unregister_loader(name)
    with pytest.raises(ValueError, match="built-in"):
        unregister_loader("cpu")


def test_an_order_for_another_rank_is_refused(painted):
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=0, device="cpu")
    with pytest.raises(ValueError, match="rank 1 of 2"):
        create_loader("cpu", painted, cfg, order=ShuffledOrder(len(painted), 4, rank=1, world_size=2))


def test_batches_carry_their_indices_through_the_prefetcher(painted):
    from fastfeed.prefetch import DevicePrefetcher

    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=0, device="cpu")
    with create_loader("cpu", painted, cfg) as loader:
        got = [b.indices.tolist() for b in DevicePrefetcher(loader, "cpu")]
    assert got == [b.tolist() for b in loader.order.batches(0)]
    assert np.array_equal(np.sort(np.concatenate(got)), np.sort(np.concatenate(loader.order.batches(0))))
