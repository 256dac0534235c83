"""Clocks for the step's split: device-side marks for what the host cannot see (a copy the device waited
for, the all-reduce backward did not hide), and DDP's all-reduce through a timing comm hook."""

from __future__ import annotations

import time

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..devices import accelerator_module


class DeviceClock:
    """`mark()`: an event recorded on the device's current stream (an accelerator), or the host clock
    (the CPU, where work is synchronous). `seconds(a, b)` between two marks, once the device passed both
    (after a sync)."""

    def __init__(self, device):
        self.mod = accelerator_module(device)

    @property
    def accelerated(self) -> bool:
        return self.mod is not None

    def mark(self):
        if self.mod is None:
            return time.perf_counter()
        event = self.mod.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, a, b) -> float:
        if a is None or b is None:
            return 0.0
        if self.mod is None:
            return b - a
        return a.elapsed_time(b) / 1e3


class CommTimer:
    """A DDP comm hook that all-reduces each gradient bucket exactly as DDP's default hook does, and marks
    when the last bucket of a backward was handed over (every gradient is computed by then). From that mark
    to backward()'s return (DDP waits there for every all-reduce) is the communication the backward did not
    hide: what the step pays for DDP.

        timer = CommTimer(clock); ddp.register_comm_hook(None, timer.hook)
        timer.arm(); loss.backward(); timer.stop(); ...sync...; seconds = timer.take()
    """

    def __init__(self, clock: DeviceClock):
        self.clock, self.last, self.end = clock, None, None

    def hook(self, process_group, bucket):
        self.last = self.clock.mark()
        return default_hooks.allreduce_hook(process_group, bucket)

    def arm(self) -> None:
        self.last = self.end = None

    def stop(self) -> None:
        if self.last is not None:
            self.end = self.clock.mark()

    def take(self) -> float:
        """Seconds of exposed all-reduce in the last backward (0 when it did not all-reduce: DDP no_sync)."""
        s = self.clock.seconds(self.last, self.end)
        self.arm()
        return s
