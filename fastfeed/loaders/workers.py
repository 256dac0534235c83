"""A persistent pool of batch-building processes writing whole batches into shared output slots, batch k on
worker k % W, instead of torch's DataLoader (docs/design.md, "Whole batches into shared slots")."""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import queue
import signal
import traceback
from collections.abc import Callable
from time import monotonic

import numpy as np
import torch

from ..devices import has_cuda, pin_in_place, unpin
from ..preempt import leave_to_parent
from ..procs import worker_context

log = logging.getLogger(__name__)
_POLL = 0.5     # seconds between liveness checks while waiting for a batch
_CLOSE_S = 5.0  # close(): how long workers get to finish, and then to obey SIGTERM
_KILL_S = 2.0   # ... and to die of SIGKILL


class WorkerError(RuntimeError):
    """A loader worker raised or died. `summary`: one line, what failed and the worker's exception (or exit code);
    the message goes on with the worker's traceback, when it raised."""

    def __init__(self, message: str, traceback: str | None = None):
        lines = [x.strip() for x in (traceback or "").splitlines() if x.strip()]
        self.summary = f"{message}: {lines[-1]}" if lines else message
        super().__init__(f"{self.summary}\nthe worker's traceback:\n{traceback}" if lines else message)


def _worker_main(worker_id: int, make_builder: Callable, slots: torch.Tensor, tasks, results,
                 masks: torch.Tensor | None = None) -> None:
    import cv2

    leave_to_parent()             # a stop signal to the whole group is the trainer's to act on (preempt.py)
    cv2.setNumThreads(1)          # one process per core already; nested thread pools only thrash
    torch.set_num_threads(1)
    try:
        builder = make_builder()
    except BaseException:
        results.put(("error", -1, -1, -1, worker_id, traceback.format_exc()))
        return
    outs = (slots.numpy(),) if masks is None else (slots.numpy(), masks.numpy())   # overlap masks: a slot beside each
    while True:
        task = tasks.get()
        if task is None:
            return
        gen, epoch, k, slot, indices, mosaic_on = task
        try:
            if slot is None:   # a warm-up: load into the partner buffer only, nothing to report
                builder.warm(indices, reset=True)
                continue
            targets, times = builder.build(indices, epoch, k, mosaic_on, *(o[slot] for o in outs))
            results.put(("ok", gen, epoch, k, slot, targets, times, len(indices)))
        except BaseException:
            results.put(("error", gen, epoch, k, worker_id, traceback.format_exc()))


class WorkerPool:
    """Starts `n` workers, each running `make_builder()` once, then `builder.build(...)` per task."""

    def __init__(self, n: int, make_builder: Callable, slot_shape: tuple, batches_ahead: int, timeout: float,
                 pin: bool = False, mask_shape: tuple | None = None):
        self.n, self.timeout = n, timeout
        with worker_context() as ctx:
            forked = ctx.get_start_method() == "fork"
            self.slots = shared_zeros((n * batches_ahead, *slot_shape), torch.uint8, forked)
            # `mask_shape`: a second shared tensor, int16, one mask slot per image slot (a segment store's masks)
            self.masks = shared_zeros((n * batches_ahead, *mask_shape), torch.int16, forked) if mask_shape else None
            self.pinned = pin and _pin(self.slots)
            self.masks_pinned = self.pinned and self.masks is not None and _pin(self.masks)
            self.tasks = [ctx.SimpleQueue() for _ in range(n)]
            self.results = ctx.Queue()
            self.procs = [ctx.Process(target=_worker_main, daemon=True, name=f"fastfeed-worker-{i}",
                                      args=(i, make_builder, self.slots, self.tasks[i], self.results, self.masks))
                          for i in range(n)]
            for p in self.procs:
                p.start()
        self.free = list(range(len(self.slots)))[::-1]
        self.outstanding = self.gen = 0

    def submit(self, epoch: int, k: int, indices: np.ndarray, mosaic_on: bool) -> bool:
        """Queue batch k of `epoch` (to worker k % n) if a slot is free; False when all are busy."""
        if not self.free:
            return False
        slot = self.free.pop()
        self.tasks[k % self.n].put((self.gen, epoch, k, slot, indices, mosaic_on))
        self.outstanding += 1
        return True

    def warm(self, worker: int, epoch: int, indices) -> None:
        """Have `worker` reset its partner buffer and load `indices` into it before its next batch."""
        self.tasks[worker].put((self.gen, epoch, -1, None, np.asarray(indices, np.int64), False))

    def release(self, slot: int) -> None:
        self.free.append(slot)

    def next_result(self):
        """The next finished batch of the current generation: ((epoch, k), slot, targets, times, count)."""
        waited = 0.0
        while True:
            start = monotonic()
            try:
                msg = self.results.get(timeout=_POLL)
            except queue.Empty:
                waited += monotonic() - start
                self._check_alive()
                if waited > self.timeout:
                    raise WorkerError(f"no batch from the loader workers for {self.timeout:.0f} s (LoaderConfig.timeout); "
                                      "a worker is stuck") from None
                continue
            if msg[0] == "error":
                _, gen, epoch, k, worker_id, tb = msg
                where = (f" on batch {k} of epoch {epoch}" if k >= 0 else
                         f" replaying its partner buffer for epoch {epoch}" if epoch >= 0 else " while starting")
                raise WorkerError(f"loader worker {worker_id} failed{where}", tb)
            _, gen, epoch, k, slot, targets, times, count = msg
            self.outstanding -= 1
            if gen != self.gen:  # left over from an epoch the consumer abandoned
                self.release(slot)
                continue
            return (epoch, k), slot, targets, times, count

    def new_generation(self) -> None:
        """Discard whatever an abandoned iteration left in flight, then start afresh."""
        self.gen += 1
        deadline = monotonic() + self.timeout
        while self.outstanding:
            try:
                msg = self.results.get(timeout=_POLL)
            except queue.Empty:
                self._check_alive()
                if monotonic() > deadline:
                    raise WorkerError("loader workers did not finish their batches in time") from None
                continue
            if msg[0] == "error" and msg[2] < 0:
                raise WorkerError(f"loader worker {msg[4]} failed while starting", msg[5])
            self.outstanding -= 1
        self.free = list(range(len(self.slots)))[::-1]

    def _check_alive(self) -> None:
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                raise WorkerError(f"loader worker {i} (pid {p.pid}) exited unexpectedly with code {p.exitcode}"
                                  + exit_reason(p.exitcode))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.is_alive()]

    def close(self) -> None:
        """Stop every worker within a bounded time: asked to finish, then SIGTERM, then SIGKILL (which also
        ends a worker stopped with SIGSTOP, on which a SIGTERM stays pending)."""
        for q, p in zip(self.tasks, self.procs):
            if p.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    q.put(None)
        # Read what the workers still send: a worker blocked writing a large result into a full pipe cannot
        # exit, and would only be killed after the join's wait.
        deadline = monotonic() + _CLOSE_S
        while self.outstanding > 0 and monotonic() < deadline and any(p.is_alive() for p in self.procs):
            try:
                self.results.get(timeout=0.1)
            except (queue.Empty, OSError, ValueError, EOFError):   # nothing left in the pipe
                break
            self.outstanding -= 1
        for stop in (None, "terminate", "kill"):
            for p in self.procs:
                if stop is not None and p.is_alive():
                    getattr(p, stop)()
            for p in self.procs:
                p.join(timeout=max(0.0, deadline - monotonic()))
            deadline = monotonic() + _KILL_S
        for p in self.procs:
            if p.is_alive():    # unkillable (a disk wait in the kernel): left, named, never waited on forever
                log.warning("loader worker pid %d did not exit after SIGKILL; left running", p.pid)
        self.results.close()
        self.results.cancel_join_thread()   # the workers are gone: nothing of ours waits in the pipe
        if self.pinned:
            unpin(self.slots)
        if self.masks_pinned:
            unpin(self.masks)
        self.procs = []


def exit_reason(code: int | None) -> str:
    """What a worker's exit code says, for the error message (negative: killed by that signal)."""
    if code is None or code >= 0:
        return ""
    sig = -code
    name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
    if sig == signal.SIGKILL:
        return f" ({name}: out of memory, see `dmesg`, or killed by someone)"
    if sig == signal.SIGBUS:
        from ..store.changed import store_changed_reason  # here: the store package needs LMDB, which a bare
        return f" ({name}: {store_changed_reason()})"      # GPU machine running the prefetcher alone lacks
    if sig == signal.SIGSEGV:
        return f" ({name}: a crash in native code)"
    return f" (killed by {name})"


def shared_zeros(shape: tuple, dtype: torch.dtype, forked: bool) -> torch.Tensor:
    """A zeroed tensor the workers write and this process reads. Forked workers inherit an anonymous shared mapping
    whose pages appear as each worker first writes its own slots, in parallel: nothing is allocated and copied before
    the fork (`share_memory_()` copied a fresh tensor into /dev/shm first, about 1 ms a MB here: 44 ms of the first
    batch for one worker's two 640-pixel slots, 0.31 s for eight workers'). Spawned workers get torch's shared
    memory, which travels by handle."""
    if not forked:
        return torch.zeros(shape, dtype=dtype).share_memory_()
    count = math.prod(shape)
    return torch.frombuffer(mmap.mmap(-1, count * dtype.itemsize), dtype=dtype, count=count).view(shape)


def _pin(t: torch.Tensor) -> bool:
    """Page-lock shared memory in place so device copies can be asynchronous (CUDA only)."""
    if not has_cuda():
        return False
    if not pin_in_place(t):
        log.warning("could not pin the loader's shared buffers (cudaHostRegister failed); copies will be synchronous")
        return False
    return True
