"""The loader's position contract (fastfeed/loaders/position.py): state_dict / load_state_dict, the exact
continuation on the same topology, and the elastic resume on another (ranks, batch size, windowed order):
every record of the interrupted epoch is trained once, none twice, from the batches' `indices`."""

from __future__ import annotations

import numpy as np
import pytest

from fastfeed.batch import Batch
from fastfeed.loaders import Loader, LoaderConfig
from fastfeed.loaders.position import ResumeError
from fastfeed.loaders.windowed import WindowedOrder


class OrderLoader(Loader):
    """The Loader contract over a store of `n` records, batches holding only their `indices` (no decoding)."""

    def iter_batches(self):
        for idx in self.order.batches(self.epoch)[self.start:]:
            yield Batch(None, None, idx)

    def close(self):
        pass


def loaders(n, world, batch=4, order=None, **cfg):
    return [OrderLoader(range(n), LoaderConfig(**({"imgsz": 64, "batch_size": batch, "world_size": world, "rank": r, "workers": 0} | cfg)),
                        order(r, world) if order else None) for r in range(world)]


def trained(lds, epoch, start=None, stop=None) -> list[np.ndarray]:
    """Every rank's batches of `epoch` from its set start (or `start`) up to `stop`, as a trainer consumes them."""
    out = []
    for ld in lds:
        ld.set_epoch(epoch, ld.start if start is None else start)
        for k, b in enumerate(ld):
            if stop is not None and k >= stop:
                break
            out.append(np.asarray(b.indices))
    return out


def resumed(state, n, world, batch=4, order=None, **cfg):
    lds = loaders(n, world, batch, order, **cfg)
    lines = [ld.load_state_dict(state) for ld in lds]
    assert len(set(lines)) == 1    # every rank says the same
    return lds, lines[0]


def once(parts, expect) -> None:
    got = np.concatenate([p for p in parts if len(p)])
    assert len(got) == len(np.unique(got)), "a record trained twice"
    assert set(got.tolist()) == set(np.asarray(expect).tolist())


@pytest.mark.parametrize("new_world", [1, 3])
def test_two_ranks_stopped_mid_epoch_resume_on_one_and_three_each_record_once(new_world):
    n, epoch, done = 96, 2, 3                      # 2 ranks x batch 4: 12 batches per rank
    old = loaders(n, 2)
    first = trained(old, epoch, start=0, stop=done)
    state = old[0].state_dict(epoch, done)
    assert state["world_size"] == 2 and state["batches"] == done and state["order"]["kind"] == "shuffle"
    new, line = resumed(state, n, new_world)
    assert "world size 2 -> " + str(new_world) in line and "72 records" in line and "later epochs" in line
    steps = {len(ld) - ld.start for ld in new}
    assert len(steps) == 1                         # equal steps on every rank
    once(first + trained(new, epoch), range(n))    # the whole epoch, each record once
    # later epochs: the new topology's own order
    assert all(np.array_equal(a, b) for a, b in zip(trained(new, epoch + 1, 0), trained(loaders(n, new_world),
                                                                                          epoch + 1, 0)))


def test_the_same_topology_continues_exactly_and_other_workers_keep_the_batches():
    n = 80
    ref = trained(loaders(n, 2), 1, start=0)
    old = loaders(n, 2, workers=0)
    state = old[1].state_dict(1, 4)
    for workers in (0, 2):
        new, line = resumed(state, n, 2, workers=workers)
        assert all(ld.start == 4 for ld in new)
        got = trained(new, 1)
        assert all(np.array_equal(a, b) for a, b in zip(got, ref[4:10] + ref[14:]))   # rank 0's, then rank 1's
        assert ("workers 0 -> 2" in line) == bool(workers) and ("uninterrupted run" in line)


def test_a_resumed_remainder_interrupted_again_resumes_on_a_third_topology():
    n, epoch = 112, 0
    a = loaders(n, 2)
    first = trained(a, epoch, start=0, stop=2)
    b, _ = resumed(a[0].state_dict(epoch, 2), n, 3)
    second = trained(b, epoch, stop=2)            # two more batches per rank of the remainder
    state = b[0].state_dict(epoch, b[0].start + 2)
    assert state["order"]["kind"] == "remainder"
    c, line = resumed(state, n, 1, batch=6)
    assert "batch size 4 -> 6" in line
    once(first + second + trained(c, epoch), range(n))
    assert b[0].state_dict(epoch + 1, 0)["order"]["kind"] == "shuffle"   # after the epoch: the plain order again


def test_a_tail_that_fills_no_batch_on_every_rank_is_left_out_or_padded_as_an_epochs_tail():
    n = 64                                        # 2 x 4: 8 batches a rank; 2 done leave 48, which 5 ranks x 4 split as 2 each + 8
    old = loaders(n, 2)
    first = trained(old, 0, start=0, stop=2)
    new, line = resumed(old[0].state_dict(0, 2), n, 5)
    rest = trained(new, 0)
    assert "8 left out (drop_last" in line and sum(map(len, rest)) == 40
    once(first + rest, np.concatenate(first + rest))
    padded, line = resumed(old[0].state_dict(0, 2), n, 5, drop_last=False)
    got = np.concatenate(trained(padded, 0))
    assert len(got) == 50 and set(got.tolist()) | set(np.concatenate(first).tolist()) == set(range(n))


def test_at_an_epochs_start_the_new_topology_takes_the_epoch():
    old = loaders(64, 2)
    state = old[0].state_dict(0, len(old[0]))      # the epoch's end: the next epoch's start
    assert (state["epoch"], state["batches"]) == (1, 0)
    new, line = resumed(state, 64, 3)
    assert "epoch 2 from its start" in line and all(ld.start == 0 for ld in new)


SHARDS = [(37 * k, 37) for k in range(24)]


def windowed(window, local=1):
    return lambda r, w: WindowedOrder(SHARDS, 4, window=window, seed=5, rank=r, world_size=w, local_world=local)


@pytest.mark.parametrize("window,local", [(4, 1), (3, 3)])
def test_the_windowed_order_resumes_two_ranks_on_three(window, local):
    n = 24 * 37
    old = loaders(n, 2, order=windowed(4))
    first = trained(old, 1, start=0, stop=40)
    state = old[0].state_dict(1, 40)
    assert state["order"]["kind"] == "windowed" and state["order"]["window"] == 4
    new, line = resumed(state, n, 3, order=windowed(window, local))
    rest = trained(new, 1)
    kept = sum(map(len, rest))
    assert len({len(ld) - ld.start for ld in new}) == 1
    once(first + rest, np.concatenate(first + rest))
    assert n // 2 // 4 * 4 * 2 - 40 * 8 - kept < 3 * 4   # at most a tail that fills no batch on every rank left out
    assert "world size 2 -> 3" in line


def test_a_state_of_another_store_or_not_a_state_is_refused():
    state = loaders(64, 2)[0].state_dict(0, 2)
    with pytest.raises(ResumeError, match="64 records; this one holds 80"):
        loaders(80, 2)[0].load_state_dict(state)
    with pytest.raises(ResumeError, match="not a fastfeed loader state"):
        loaders(64, 2)[0].load_state_dict({"epoch": 0})


@pytest.mark.parametrize("key, value, says", [("epoch", None, "'epoch' is missing"), ("batches", "2", "'batches' is '2'"),
                                              ("records", 64.5, "'records' is 64.5"), ("order", "shuffle", "'order' is")])
def test_a_tampered_state_names_its_field_not_a_key_error(key, value, says):
    state = loaders(64, 2)[0].state_dict(0, 2)
    if value is None:
        del state[key]
    else:
        state[key] = value
    with pytest.raises(ResumeError, match=f"loader state's {says}"):
        loaders(64, 2)[0].load_state_dict(state)


def test_a_state_past_its_epochs_end_is_named():
    state = loaders(64, 2)[0].state_dict(0, 2)
    state["batches"] = 10**6   # was: "start must be a batch index in 0..N", a name the caller never gave
    with pytest.raises(ResumeError, match="loader state is 1000000 batches into epoch 1, which has .* in this order"):
        loaders(64, 2)[0].load_state_dict(state)


def test_the_cpu_loaders_workers_follow_a_remainder(tmp_path_factory):
    """A real pool loader (2 workers, mosaic) resumed from 2 ranks x 2 workers onto 1 rank x 1 worker: its
    batches are the remainder's records, each once, built by workers whose partner buffers were replayed."""
    from train_helpers import packed_sample

    from fastfeed import Store
    from fastfeed.loaders import create_loader

    store = Store(packed_sample(tmp_path_factory))
    cfg = dict(imgsz=64, batch_size=2, workers=2)
    old = [create_loader("cpu", store, LoaderConfig(**cfg, rank=r, world_size=2)) for r in range(2)]
    first = [np.asarray(b) for ld in old for b in ld.order.batches(0)[:1]]
    state = old[0].state_dict(0, 1)
    for ld in old:
        ld.close()
    with create_loader("cpu", store, LoaderConfig(**(cfg | {"workers": 1}), rank=0, world_size=1)) as new:
        line = new.load_state_dict(state)
        assert "world size 2 -> 1, workers 2 -> 1" in line and new.start == 2
        rest = []
        for b in new:
            assert tuple(b.images.shape) == (2, 3, 64, 64)
            rest.append(b.indices.numpy().copy())
        assert len(rest) == 6
    once(first + rest, range(16))


def test_a_shard_cache_follows_the_remainders_batches():
    """Under a FollowedOrder (a store in object storage) the remainder goes inside it: the shards the cache is
    told are needed now are those of the batches actually read."""
    from fastfeed.loaders.windowed import FollowedOrder

    n, starts, told = 24 * 37, [s for s, _ in SHARDS], []
    old = loaders(n, 2, order=windowed(4))
    state = old[0].state_dict(0, 30)
    follow = lambda now, ahead: told.append(now)   # noqa: E731
    new, _ = resumed(state, n, 1, order=lambda r, w: FollowedOrder(windowed(4)(r, w), starts, read_ahead=2, follow=follow))
    ld = new[0]
    assert isinstance(ld.order, FollowedOrder) and ld.order.identity()["kind"] == "remainder"
    batches = ld.order.batches(0)
    for k in range(ld.start, ld.start + 5):
        ld.order.reached(0, k)
        assert set((batches[k] // 37).tolist()) <= set(told[-1])


def _handed_out(feeds, k) -> list[np.ndarray]:
    """Each rank's first `k` batches of epoch 0, iterated as a user's own loop does (no count passed anywhere)."""
    out = []
    for feed in feeds:
        feed.set_epoch(0)
        for b in feed:
            out.append(b.indices.numpy().copy())
            if len(out) % k == 0:
                break
    return out


@pytest.mark.parametrize("through", ["loader", "prefetcher"])
def test_state_dict_is_what_the_iterator_handed_out_on_any_number_of_ranks(tmp_path_factory, through):
    """The issue's case: a cpu loader on 2 ranks (2 workers) iterated 5 batches per rank, `state_dict()` with no
    arguments, loaded on 1, 2 and 3 ranks (1 worker): every record of the epoch once. Through a DevicePrefetcher
    (lead 2) the state is the prefetcher's, not its loader's, which ran ahead."""
    from train_helpers import packed_sample

    from fastfeed import Store
    from fastfeed.loaders import create_loader
    from fastfeed.prefetch import DevicePrefetcher

    store = Store(packed_sample(tmp_path_factory))      # 16 records: 8 batches of 1 a rank on 2 ranks
    cfg = dict(imgsz=32, batch_size=1, augment=False)
    old = [create_loader("cpu", store, LoaderConfig(**cfg, workers=2, rank=r, world_size=2)) for r in range(2)]
    try:
        feeds = [DevicePrefetcher(ld, "cpu", depth=2, thread=False) for ld in old] if through == "prefetcher" else old
        first = _handed_out(feeds, 5)
        state = feeds[0].state_dict()
        assert (state["epoch"], state["batches"]) == (0, 5)
        if through == "prefetcher":
            assert old[0].state_dict()["batches"] == 7   # the loader's own count holds the prefetcher's lead
    finally:
        for ld in old:
            ld.close()
    for world in (1, 2, 3):
        new = [create_loader("cpu", store, LoaderConfig(**cfg, workers=1, rank=r, world_size=world)) for r in range(world)]
        try:
            feeds = [DevicePrefetcher(ld, "cpu", depth=2, thread=False) for ld in new] if through == "prefetcher" else new
            lines = {feed.load_state_dict(state) for feed in feeds}
            assert len(lines) == 1
            rest = [b.indices.numpy().copy() for feed in feeds for b in feed]
        finally:
            for ld in new:
                ld.close()
        once(first + rest, range(16))   # 6 records left: 6, 3 or 2 a rank, no drop_last tail


def test_a_prefetcher_over_a_plain_iterable_says_it_keeps_no_position():
    from fastfeed.prefetch import DevicePrefetcher

    pf = DevicePrefetcher([], "cpu")
    for call in (pf.state_dict, lambda: pf.load_state_dict({})):
        with pytest.raises(TypeError, match="keeps no position: only a fastfeed Loader"):
            call()


def test_other_gains_close_mosaic_or_task_are_named_in_the_resume_line_with_what_they_do():
    from fastfeed.augment.hyp import AugmentHyp

    n = 64
    state = loaders(n, 2, epochs=10, close_mosaic=2)[0].state_dict(1, 3)
    assert state["hyp"]["mosaic"] == 1.0 and (state["close_mosaic"], state["epochs"], state["task"]) == (2, 10, "detect")
    _, line = resumed(state, n, 2, epochs=10, close_mosaic=2)
    assert line == "resuming epoch 2 after 3 batches per rank: the batches an uninterrupted run trains next"
    new, line = resumed(state, n, 2, epochs=10, close_mosaic=2, hyp=AugmentHyp(mosaic=0.5))
    assert "gains mosaic 1.0 -> 0.5: the samples from here are augmented with the new gains" in line
    assert line.endswith("the same records in the same batches") and all(ld.start == 3 for ld in new)
    _, line = resumed(state, n, 2, epochs=10, close_mosaic=5)
    assert "close mosaic 2 -> 5: mosaic off from epoch 6 (the run had it off from epoch 9)" in line
    _, line = resumed(state | {"task": "segment"}, n, 2, epochs=10, close_mosaic=2)
    assert "task segment -> detect: the batches carry detect labels from here" in line
    _, line = resumed(state, n, 3, epochs=10, close_mosaic=0)   # another topology names them too
    assert "world size 2 -> 3" in line and "close mosaic 2 -> 0: mosaic off never (the run had it off from epoch 9)" in line


def test_a_state_saved_before_the_gains_were_kept_takes_them_as_unchanged():
    from fastfeed.augment.hyp import AugmentHyp

    state = loaders(64, 2)[0].state_dict(0, 2)
    old = {k: v for k, v in state.items() if k not in ("hyp", "close_mosaic", "epochs", "task")}
    _, line = resumed(old, 64, 2, hyp=AugmentHyp(mosaic=0.5), close_mosaic=3, epochs=5)
    assert line.endswith("the batches an uninterrupted run trains next")


def test_the_device_augmentation_takes_the_loaders_seed():
    from fastfeed.prefetch import DevicePrefetcher

    ld = loaders(64, 1, device_augment=True, seed=7)[0]
    assert DevicePrefetcher(ld, "cpu").augment.seed == 7
    assert DevicePrefetcher(ld, "cpu", seed=3).augment.seed == 3   # a seed given still wins


def test_a_position_saved_before_the_ramp_resumes_the_old_order_for_the_rest_of_its_epoch_and_says_so():
    n, shards = 24 * 37, [(37 * k, 37) for k in range(24)]

    def windowed(ramp):
        return lambda r, w: WindowedOrder(shards, 4, window=4, seed=5, rank=r, world_size=w, ramp=ramp)

    old = loaders(n, 2, order=windowed(0))
    first = trained(old, 1, start=0, stop=40)
    state = old[0].state_dict(1, 40)
    assert "ramp" not in state["order"]
    new, line = resumed(state, n, 2, order=windowed(2))
    assert "the windowed order's first window ramp none -> 2" in line and "records of the epoch not yet trained" in line
    once(first + trained(new, 1), np.concatenate([np.concatenate(o.order.batches(1)) for o in old]))   # exact
    assert all(np.array_equal(a, b) for a, b in zip(trained(new, 2, 0), trained(loaders(n, 2, order=windowed(2)), 2, 0)))
    shuffled = loaders(n, 2)[0].state_dict(1, 40)   # from the global shuffle: another order, no ramp to name
    assert "ramp" not in resumed(shuffled, n, 2, order=windowed(2))[1]
    state = new[0].state_dict(2, 10)   # saved under the ramp: the exact continuation
    again, line = resumed(state, n, 2, order=windowed(2))
    assert "uninterrupted run" in line and "ramp" not in line and all(ld.start == 10 for ld in again)
