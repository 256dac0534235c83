"""DevicePrefetcher: overlap, order and content (with a loader that reuses one buffer), errors, shutdown,
the stream protocol against a recording fake of torch.cuda / torch.npu, and (gpu) the real thing.

The `test_gpu_*` tests need only torch: `benchmarks/gpu_check.py` imports this module and calls them on a
bare GPU machine without pytest, so pytest is optional here and they take no fixtures.
"""

from __future__ import annotations

import threading
import time
import traceback

import numpy as np
import torch
from prefetch_helpers import ReusingLoader, both_drivers, expect_batch, prefetch_threads  # noqa: F401

from fastfeed.batch import Batch
from fastfeed.device_augment import DeviceAugment
from fastfeed.prefetch import DevicePrefetcher

try:
    import pytest
except ImportError:          # the bare GPU machine: only the test_gpu_* functions are called, by hand
    pytest = None

gpu = pytest.mark.gpu if pytest else (lambda f: f)


# --- fakes ----------------------------------------------------------------------------------------









# --- CPU: the thread (and inline) drivers -------------------------------------------------------------

@both_drivers
def test_order_and_content_survive_a_loader_that_reuses_its_buffer(thread):
    loader = ReusingLoader(n=7)
    with DevicePrefetcher(loader, "cpu", depth=3, thread=thread) as pf:
        got = list(pf)                       # all held at once: none may alias the loader's buffer
        assert len(pf) == 7
    assert len(got) == 7
    for k, b in enumerate(got):
        expect_batch(b, k)
    assert not prefetch_threads()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16]) if pytest else (lambda f: f)
def test_half_dtypes(dtype):
    for k, b in enumerate(DevicePrefetcher(ReusingLoader(n=3), "cpu", dtype=dtype)):
        expect_batch(b, k, dtype)


@both_drivers
def test_uint8_is_kept_but_still_copied_out_of_the_loader_buffer(thread):
    got = list(DevicePrefetcher(ReusingLoader(n=4), "cpu", dtype=torch.uint8, thread=thread))
    for k, b in enumerate(got):
        assert b.images.dtype == torch.uint8 and torch.all(b.images == k)


@both_drivers
def test_host_buffers_are_reused_only_once_the_consumer_lets_go(thread):
    from fastfeed.prefetch import prefetcher as host

    if host._use_count is None:
        pytest.skip("this torch has no storage use count: every batch gets fresh memory")
    ptrs, kept = set(), []
    for k, b in enumerate(DevicePrefetcher(ReusingLoader(n=16), "cpu", depth=2, thread=thread)):
        expect_batch(b, k)
        ptrs.add(b.images.data_ptr())
        if k % 5 == 0:
            kept.append((k, b.images[1]))        # a view of a batch keeps its buffer out of reuse
        del b
    # reused: at most depth + 3 live, plus the ones kept. With the copy thread, how many are live when it asks for
    # a buffer depends on the scheduling (a loaded machine gave 12 of 16): it must still have reused one
    assert len(ptrs) < (16 if thread else 12)
    for k, view in kept:
        assert torch.all(view == k / 255)


def test_host_buffer_pool():
    from fastfeed.prefetch.prefetcher import HostBuffers, _use_count

    pool = HostBuffers(keep=2)
    a = pool.get((2, 3), torch.float32)
    b = pool.get((2, 3), torch.float32)
    assert a.data_ptr() != b.data_ptr()          # `a` is still held
    ptr = a.data_ptr()
    del a
    c = pool.get((2, 3), torch.float32)
    assert (c.data_ptr() == ptr) == (_use_count is not None)
    assert pool.get((4, 3), torch.float32).shape == (4, 3) and pool.get((2, 3), torch.uint8).dtype == torch.uint8


def test_thread_overlaps_loading_with_the_step():
    """The thread asks the loader for the next batches while the step works on this one. Judged by the
    order of events, not by wall time, so a loaded machine cannot make it flaky."""
    log = []
    loader = ReusingLoader(n=8, delay=0.01, log=log)          # logs ("request", k) as batch k is asked for
    for k, _ in enumerate(DevicePrefetcher(loader, "cpu", depth=2)):
        log.append(("step", k))
        time.sleep(0.03)
        log.append(("done", k))
    ahead = [log.index(("request", k + 1)) < log.index(("done", k)) for k in range(7)]
    assert sum(ahead) >= 5, f"the next batch was requested during the step only {sum(ahead)} of 7 times: {log}"


@both_drivers
def test_loader_errors_reach_the_consumer_with_their_traceback(thread):
    loader = ReusingLoader(n=6, fail_at=3)
    seen = []
    with pytest.raises(RuntimeError, match="loader failed at batch 3") as info:
        for b in DevicePrefetcher(loader, "cpu", thread=thread):
            seen.append(round(b.images.flatten()[0].item() * 255))
    assert seen == [0, 1, 2]
    assert "_explode" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert not prefetch_threads()


def test_breaking_out_stops_the_thread_blocked_on_a_full_queue():
    loader = ReusingLoader(n=50)
    pf = DevicePrefetcher(loader, "cpu", depth=2)
    for _ in pf:
        time.sleep(0.1)                      # the producer fills the queue and blocks on put()
        assert prefetch_threads()
        break
    assert not prefetch_threads()          # the dropped iteration joined its thread at once
    assert loader.closed == 1 and loader.yielded < 10


def test_close_while_the_thread_is_inside_next_loader():
    loader = ReusingLoader(n=10, delay=0.4)
    pf = DevicePrefetcher(loader, "cpu", depth=2)
    it = iter(pf)
    expect_batch(next(it), 0)                     # the producer is now sleeping inside the loader
    t0 = time.perf_counter()
    pf.close()
    assert time.perf_counter() - t0 < 5.0
    assert not prefetch_threads() and loader.closed == 1
    with pytest.raises(StopIteration):
        next(it)
    pf.close()                               # idempotent


def test_the_first_batch_is_asked_for_from_the_callers_thread():
    """A loader that starts (forks) worker processes on its first batch does so from the caller's thread."""
    loader = ReusingLoader(n=4)
    list(DevicePrefetcher(loader, "cpu"))
    assert loader.threads == [threading.current_thread().name] + ["fastfeed-device-prefetch"] * 3


def test_a_new_epoch_ends_the_unfinished_one_and_set_epoch_passes_through():
    loader = ReusingLoader(n=5)
    pf = DevicePrefetcher(loader, "cpu")
    it = iter(pf)
    next(it)
    pf.set_epoch(1)
    assert loader.epochs == [1] and not prefetch_threads()
    for k, b in enumerate(pf):
        expect_batch(b, k)
    assert loader.closed == 2


def test_bad_arguments_say_what_is_valid():
    loader = ReusingLoader()
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        DevicePrefetcher(loader, "cpu", depth=0)
    with pytest.raises(ValueError, match="seed must be an integer or None"):
        DevicePrefetcher(loader, "cpu", seed=1.5)
    assert DevicePrefetcher(loader, "cpu", depth=np.int64(3)).depth == 3   # numpy integers are integers
    with pytest.raises(ValueError, match="dtype must be one of torch.float32"):
        DevicePrefetcher(loader, "cpu", dtype=torch.int32)
    with pytest.raises(ValueError, match="channels_last must be True or False, got 'no'"):   # was: taken as True
        DevicePrefetcher(loader, "cpu", channels_last="no")
    with pytest.raises(ValueError, match="thread must be True, False or None .*, got 'no'"):   # was: a thread
        DevicePrefetcher(loader, "cpu", thread="no")
    with pytest.raises(ValueError, match="is not a device; valid: 'auto', 'cpu'"):
        DevicePrefetcher(loader, "tpu")
    with pytest.raises(ValueError, match="takes its gains from a fastfeed Loader.s LoaderConfig.hyp"):
        DevicePrefetcher(loader, "cpu", device_augment=True)
    pf, must = DevicePrefetcher([], "cpu"), "the loader's batches must be \\(images uint8 \\[B,3,H,W\\], targets"
    with pytest.raises(ValueError, match=must + ".*; got images of torch.float32 \\[1, 3, 4, 4\\]$"):
        pf.transfer(Batch(torch.zeros(1, 3, 4, 4), torch.zeros(0, 6)))
    u8 = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)   # a pair and a Batch pass; a triple, a dict, one image do not
    assert pf.transfer((u8, torch.zeros(0, 6))).images.shape == pf.transfer(Batch(u8, torch.zeros(0, 6))).images.shape
    for bad, got in (((u8, torch.zeros(0, 6), ["a.jpg"]), "a tuple"), ({"img": u8, "cls": None}, "a dict"),
                     ((u8[0], torch.zeros(0, 6)), "images of torch.uint8 \\[3, 4, 4\\]")):
        with pytest.raises(ValueError, match=f"{must}.*; got {got}$"):
            pf.transfer(bad)


def test_cuda_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="sees no CUDA device"):
        DevicePrefetcher(ReusingLoader(), "cuda")


# --- gpu: the real CUDA path (torch only, no fixtures) ------------------------------------------------

def _gpu_load():
    """Keep the default stream busy, so a missing wait or a host buffer reused too early shows up."""
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(8):
        a = a @ a
        a = a / a.norm()
    return a


@gpu
def test_gpu_prefetch_equals_a_plain_copy():
    for thread in (False, True):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            loader = ReusingLoader(n=12, size=320, batch=8, pin=True)
            got = []
            for b in DevicePrefetcher(loader, "cuda", depth=3, dtype=dtype, thread=thread):
                _gpu_load()
                got.append(b)
            torch.cuda.synchronize()
            for k, b in enumerate(got):
                assert b.images.is_cuda and b.targets.is_cuda
                want = torch.full((8, 3, 320, 320), k, dtype=torch.uint8).to("cuda").to(dtype) / 255
                assert torch.equal(b.images, want), f"batch {k} ({dtype}, thread={thread}) differs from a plain copy"
                assert b.targets.shape == (k, 6) and torch.all(b.targets[:, 2] == k / 100)


@gpu
def test_gpu_pageable_loader_memory_is_still_correct():
    loader = ReusingLoader(n=6, size=256, batch=4, pin=False)
    got = [b for b in DevicePrefetcher(loader, "cuda")]
    torch.cuda.synchronize()
    for k, b in enumerate(got):
        assert torch.equal(b.images, torch.full_like(b.images, k / 255))


@gpu
def test_gpu_one_side_stream_and_the_consumer_waits():
    pf = DevicePrefetcher(ReusingLoader(n=4, pin=True), "cuda")
    side = pf.stream
    assert isinstance(side, torch.cuda.Stream) and side != torch.cuda.current_stream()
    for epoch in range(2):
        pf.set_epoch(epoch)
        for b in pf:
            b.images.mul_(2)                 # use on the consumer's stream
    assert pf.stream is side
    consumer = torch.cuda.Stream()
    with torch.cuda.stream(consumer):        # handed out to whichever stream is current
        sums = [b.images.sum().item() for b in pf]
    for k, s in enumerate(sums):
        assert abs(s - 2 * 3 * 8 * 8 * k / 255) < 1e-3


@gpu
def test_gpu_device_augment_is_seeded_and_flips_boxes():
    aug = DeviceAugment(seed=3)
    x = torch.rand(8, 3, 64, 64, device="cuda")
    t = torch.tensor([[i, 0, 0.25, 0.5, 0.1, 0.1] for i in range(8)], device="cuda")
    a, ta = aug(x, t)
    aug.reseed()
    b, tb = aug(x, t)
    assert torch.equal(a, b) and torch.equal(ta, tb) and a.dtype == x.dtype
    assert 0 <= a.min() and a.max() <= 1
    assert set(ta[:, 2].tolist()) <= {0.25, 0.75}
