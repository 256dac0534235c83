"""Worker processes never outlive the process that started them: a parent killed (SIGKILL or SIGTERM) while it
iterates the cpu, shm and device loaders, one that started its workers from a thread (the watchdog), a spawned
child, `fastfeed train` stopped with SIGTERM; and a worker stopped with SIGSTOP does not hang `close()`."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

import numpy as np
import psutil
import pytest
from loader_checks import make_painted_store
from proc_checks import descendants, kill_all, read_line, running, start_script, wait_gone
from train_helpers import packed_sample

from fastfeed.loaders import LoaderConfig, WorkerError, create_loader

GONE_S = 5.0   # "promptly": PR_SET_PDEATHSIG is immediate, the watchdog polls twice a second

# Iterates one loader of each pool kind (cpu, shm, device: 2 workers each), round robin, until killed; prints
# "started" once every pool runs. argv: store, cache dir, "main" | "thread" (start the loaders from a thread).
ITERATE = """
import itertools, sys, threading
from fastfeed import Store
from fastfeed.loaders import LoaderConfig, create_loader
store, cache_dir, where, names = Store(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4].split(",")
cfg = LoaderConfig(imgsz=64, batch_size=4, workers=2)
opts = {"shm": {"cache_dir": cache_dir}}
loaders = [create_loader(n, store, cfg, **opts.get(n, {})) for n in names]
def endless(loader):
    for epoch in itertools.count():
        loader.set_epoch(epoch)
        yield from loader
def run():
    its = [endless(x) for x in loaders]
    for it in its:
        next(it)
    print("started", flush=True)
    for it in itertools.cycle(its):
        next(it)
if where == "thread":
    threading.Thread(target=run, daemon=True).start()
    threading.Event().wait()
else:
    run()
"""


@pytest.fixture(scope="module")
def painted_store(tmp_path_factory):
    return make_painted_store(tmp_path_factory.mktemp("painted"), store="original")


def _kill_while_iterating(store, cache_dir, sig, where="main", names="cpu,shm,device"):
    proc = start_script(ITERATE, store.path, cache_dir, where, names)
    workers = []
    try:
        assert read_line(proc) == "started"
        workers = descendants(proc.pid)
        assert len(workers) >= 2 * len(names.split(","))
        os.kill(proc.pid, sig)
        assert proc.wait(30) == -sig
        left = wait_gone(workers, GONE_S)
        assert not left, f"workers {[p.pid for p in left]} outlived their parent (killed with {sig.name})"
    finally:
        kill_all([proc, *running(workers)])
        proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_every_pool_loaders_workers_exit_when_their_parent_is_killed(painted_store, tmp_path, sig):
    _kill_while_iterating(painted_store, tmp_path, sig)


def test_workers_started_from_a_thread_are_ended_by_the_watchdog(painted_store, tmp_path):
    """PR_SET_PDEATHSIG follows the thread that started a child; from another thread the watchdog does it."""
    _kill_while_iterating(painted_store, tmp_path, signal.SIGKILL, where="thread", names="cpu")


SPAWNED = """
import sys, time
from fastfeed.procs import worker_context
with worker_context(sys.argv[1]) as ctx:
    p = ctx.Process(target=time.sleep, args=(600,), daemon=True)
    p.start()
print(p.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_child_of_either_start_method_dies_with_its_parent(method):
    proc = start_script(SPAWNED, method)
    child = None
    try:
        child = psutil.Process(int(read_line(proc)))
        time.sleep(0.5)   # a spawned child arms its guard once its interpreter is up
        assert running([child])
        proc.kill()
        proc.wait(30)
        assert not wait_gone([child], GONE_S + 10)
    finally:
        kill_all([proc] + ([child] if child else []))
        proc.wait()


def _leaves_sigint(_) -> bool:
    return signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_a_pools_workers_leave_a_ctrl_c_to_the_parent():
    """A Ctrl-C reaches the terminal's whole process group: a pool's worker (pack, cache build, verify) ignores it, so
    that only the parent reacts (one line, the pool ended) instead of every worker printing a traceback."""
    from fastfeed.procs import worker_context

    with worker_context() as ctx:   # spawn's children run the same initializer
        pool = ctx.Pool(2)
    with pool:
        assert pool.map(_leaves_sigint, range(4)) == [True] * 4
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # the parent's own is untouched


def test_a_ctrl_c_while_a_pool_forks_is_raised_once_its_workers_are_up(monkeypatch):
    """A Ctrl-C raised inside a fork's own handlers left logging's lock held: the pack hung at its next log line (a
    Ctrl-C test of the pack timed out beside a CPU hog). It is raised after the pool has started, and ends it."""
    import multiprocessing.pool as mpp

    from fastfeed.procs import worker_context

    started, repopulate = [], mpp.Pool._repopulate_pool

    def interrupted_while_forking(pool):
        os.kill(os.getpid(), signal.SIGINT)   # the terminal's Ctrl-C, while the workers fork
        time.sleep(0.05)
        started.extend(repopulate(pool) or [p.pid for p in pool._pool])

    monkeypatch.setattr(mpp.Pool, "_repopulate_pool", interrupted_while_forking)
    with pytest.raises(KeyboardInterrupt), worker_context() as ctx:
        ctx.Pool(2)
    assert len(started) == 2 and not wait_gone([psutil.Process(p) for p in started if psutil.pid_exists(p)], 5.0)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.slow
def test_a_stopped_worker_is_a_worker_error_and_close_still_returns(painted_store):
    cfg = LoaderConfig(imgsz=64, batch_size=4, workers=2, timeout=3)
    loader = create_loader("cpu", painted_store, cfg)
    pids = []
    try:
        it = iter(loader)
        next(it)
        pids = loader.memory_pids()
        os.kill(pids[0], signal.SIGSTOP)
        with pytest.raises(WorkerError, match="no batch from the loader workers"):
            for _ in range(100):
                next(it)
        t0 = time.monotonic()
        loader.close()
        assert time.monotonic() - t0 < 20      # a bounded wait: SIGTERM stays pending on a stopped process
        assert loader.memory_pids() == [] and not running([psutil.Process(p) for p in pids if psutil.pid_exists(p)])
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        loader.close()


@pytest.mark.slow
def test_fastfeed_train_stopped_with_sigterm_leaves_no_worker(tmp_path_factory, tmp_path):
    store = packed_sample(tmp_path_factory)
    proc = start_script("import sys; from fastfeed.cli import main; sys.exit(main(sys.argv[1:]))",
                        "train", "--data", store, "--model", "yolov3-tiny", "--imgsz", "64", "--batch", "4",
                        "--epochs", "1000", "--workers", "2", "--accum", "1", "--out", tmp_path, "--quiet",
                        stdout=None)
    workers = []
    try:
        deadline = time.monotonic() + 180
        while len(workers := descendants(proc.pid)) < 2:
            assert proc.poll() is None, f"train exited with {proc.returncode}"
            assert time.monotonic() < deadline, "train started no loader workers"
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)    # it may stop at once, or save a checkpoint first
        left = wait_gone(workers, GONE_S)
        assert not left, f"workers {[p.pid for p in left]} outlived `fastfeed train`"
    finally:
        kill_all([proc, *running(workers)])
        proc.wait()


if sys.platform != "linux":   # pragma: no cover
    pytestmark = pytest.mark.skip(reason="process lifetimes are checked on Linux")


def _write_slot(slots, k: int) -> None:
    slots[k] = k + 1


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_pools_shared_slots_start_zeroed_and_carry_a_childs_writes_to_the_parent(method):
    """Under fork the slots are an anonymous shared mapping the children inherit (no copy into /dev/shm before the
    fork); under spawn torch's shared memory, passed by handle. Either way the parent reads what a child wrote."""
    import multiprocessing as mp

    import torch

    from fastfeed.loaders.workers import shared_zeros

    slots = shared_zeros((3, 2, 5), torch.int16, method == "fork")
    assert slots.shape == (3, 2, 5) and slots.dtype == torch.int16 and not slots.any()
    child = mp.get_context(method).Process(target=_write_slot, args=(slots, 1))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert slots[1].eq(2).all() and not slots[0].any() and not slots[2].any()


class _TorchOpBuilder:
    """A pool builder whose batches run a torch op large enough to go parallel (1M elements: 30 grains)."""

    def build(self, indices, epoch, k, mosaic_on, out):
        import torch

        out[:] = k + 1
        return int(torch.ones(1_000_000).add_(1).sum()), {}


def test_a_worker_runs_torch_ops_when_its_parent_used_two_openmp_threads():
    """GNU OpenMP is not fork-safe: a child forked after the parent ran a 2-thread region hangs in its first parallel
    torch op unless it asks for one thread first (the worker's `torch.set_num_threads(1)`). Today's builders run no
    torch op, so only this builder that does shows the line is kept; the pool's 3 s timeout catches a hang."""
    import torch

    from fastfeed.loaders.workers import WorkerPool

    threads = torch.get_num_threads()
    torch.set_num_threads(2)   # OMP_NUM_THREADS=1 is only the default: this sets the OpenMP pool to 2 threads
    pool, workers = None, []
    try:
        assert torch.get_num_threads() == 2
        torch.randn(2_000_000).add_(1).sum()   # an OpenMP parallel region in this process, before the fork
        pool = WorkerPool(1, _TorchOpBuilder, (4,), batches_ahead=2, timeout=3)
        workers = [psutil.Process(p) for p in pool.pids()]
        for k in range(2):
            assert pool.submit(0, k, np.arange(2), False)
        try:
            got = sorted((key, targets, count) for key, _, targets, _, count in (pool.next_result() for _ in range(2)))
        except WorkerError as e:
            kill_all(workers)   # at once: close() would first give the hung worker 5 s to finish
            pytest.fail(f"a torch op in a loader worker hung (it asks torch for one thread as it starts): {e.summary}")
        assert got == [((0, 0), 2_000_000, 2), ((0, 1), 2_000_000, 2)]
        assert sorted(pool.slots[:, 0].tolist()) == [1, 2]
    finally:
        torch.set_num_threads(threads)
        if pool is not None:
            pool.close()
            assert not running(workers)


SMALL_SHM = """
import sys
from fastfeed import Store
from fastfeed.loaders import LoaderConfig, create_loader
with create_loader("cpu", Store(sys.argv[1]), LoaderConfig(imgsz=320, batch_size=4, workers=2)) as loader:
    print("records", sum(len(b.indices) for b in loader))
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare(1) to give one process a small /dev/shm")
def test_the_cpu_loader_runs_with_a_4mb_dev_shm(tmp_path_factory, tmp_path):
    """A container's small /dev/shm (Docker gives 64 MB) holds none of the workers' slots: two workers' 320-pixel
    slots (2.5 MB each) beside a 4 MB /dev/shm, in a mount namespace of the test's own. Before the slots were a shared
    mapping, `share_memory_()` failed there ('unable to allocate shared memory ... No space left on device')."""
    import subprocess

    store = packed_sample(tmp_path_factory)
    script = tmp_path / "small_shm.py"
    script.write_text(SMALL_SHM)
    mount = "mount -t tmpfs -o size=4m tmpfs /dev/shm"
    if subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True).returncode != 0:
        pytest.skip("this machine does not let a mount namespace mount a tmpfs")
    done = subprocess.run(["unshare", "-m", "sh", "-c", f'{mount} && exec "$0" "$1" "$2"', sys.executable, str(script),
                           str(store)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["records", "16"]
