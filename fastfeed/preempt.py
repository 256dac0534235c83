"""Stopping a training run on a signal with at most the step in flight lost, and saving on a timer for the kills
that give no notice (`fastfeed train` and FastfeedTrainer). What each signal does and its exit status:
docs/training.md, 'Preemptible and spot instances'; why, and the collective decision under DDP: docs/design.md,
'A stop signal costs at most the step in flight'. Local to this module: the handlers are installed with
SA_RESTART, so a collective blocked in C++ (gloo, NCCL) carries on instead of failing with EINTR; repeats change
nothing (one notice may reach a rank several ways); loader workers ignore all three (`leave_to_parent()`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

EXIT_PREEMPTED = 75   # sysexits.h EX_TEMPFAIL: "a temporary failure; the user is invited to retry"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopSignals:
    """The stop request of this process: `requested` (the first stop signal's name, or None), `at` (when it
    arrived, time.monotonic()), `agreed` (a rank's request reached this one through a collective).
    A thread woken by `signal.set_wakeup_fd` acknowledges a signal when it arrives and notes the time; the handler,
    when it runs, decides (why: docs/design.md, 'A stop signal costs at most the step in flight')."""

    def __init__(self, signals=STOP_SIGNALS, *, what: str = "finishing the step in flight and saving a checkpoint"):
        self.signals, self.what = tuple(signals), what
        self.requested: str | None = None
        self.at: float | None = None
        self.agreed = False
        self._previous: dict = {}
        self._pipe = self._wakeup = self._thread = None
        self._step: tuple[float, float | None] | None = None   # (when the step in flight began, its expected seconds)

    def __enter__(self) -> StopSignals:
        """Install the handlers (only the main thread can; elsewhere nothing is installed)."""
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
                signal.siginterrupt(sig, False)
            self._watch()
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._wakeup)
            r, w = self._pipe
            os.close(w)            # the watcher's read returns empty: it ends
            self._thread.join(timeout=1.0)
            os.close(r)
            self._pipe = self._thread = None

    def _forget_in_child(self) -> None:
        """In a process forked while the handlers were installed: the handlers that were there before, and no
        shared wakeup pipe (a pack or cache worker must die of the SIGTERM its pool's terminate() sends, and its
        signals must not reach the parent's watcher)."""
        with contextlib.suppress(ValueError):   # forked from another thread: not its main thread, nothing to undo
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            if self._pipe is not None:
                signal.set_wakeup_fd(self._wakeup)
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
        self._previous, self._pipe, self._thread = {}, None, None

    def _watch(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self._wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):   # no wakeup fd here: the handler acknowledges instead
            os.close(r)
            os.close(w)
            return
        self._pipe = (r, w)
        self._thread = threading.Thread(target=self._acknowledge, args=(r,), daemon=True, name="fastfeed-signals")
        self._thread.start()

    def _acknowledge(self, r: int) -> None:
        """The watcher: says what will happen the moment a stop signal arrives, and when it did."""
        ours, first = {int(s) for s in self.signals}, None
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum not in ours:
                    continue
                if first is None:
                    first = signum
                    self.at = time.monotonic() if self.at is None else min(self.at, time.monotonic())
                    _say(self._first_words(signum))
                elif signum == signal.SIGINT:
                    _say(self._abort_words())

    def step_began(self, at: float, seconds: float | None) -> None:
        """The trainer starts a step at `at` (time.monotonic()) expected to take `seconds` (its measured steps;
        None before the first is measured): a signal's acknowledgement says when the step in flight should end."""
        self._step = (at, seconds)

    def _expectation(self) -> str:
        if self._step is None:
            return ""
        at, seconds = self._step
        ran = time.monotonic() - at
        if seconds is None:
            return f" (the first step, running for {ran:.0f} s, is not measured yet)"
        return (f" (steps take ~{seconds:.0f} s here: the one in flight, {ran:.0f} s in, should end in ~"
                f"{max(seconds - ran, 0.0):.0f} s)" if seconds >= 1 else f" (steps take ~{seconds:.2f} s here)")

    def _first_words(self, signum) -> str:
        again = "; Ctrl-C again aborts" if signum == signal.SIGINT else ""
        return f"{signal.Signals(signum).name}: {self.what}{self._expectation()}{again}\n"

    @staticmethod
    def _abort_words() -> str:
        return ("SIGINT again: aborting as soon as the running operation returns (a third Ctrl-C kills outright); "
                "the checkpoint on disk is the previous one\n")

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            if signum == signal.SIGINT:   # the second Ctrl-C: abort now; a third gets the default action
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                if self._pipe is None:
                    _say(self._abort_words())
                raise KeyboardInterrupt
            return
        now = time.monotonic()
        self.requested, self.at = signal.Signals(signum).name, now if self.at is None else min(self.at, now)
        if self._pipe is None:
            _say(self._first_words(signum))

    def flag(self) -> float:
        """This process's request as a number for a collective (1.0: stop)."""
        return 1.0 if self.requested is not None else 0.0

    def note(self, reduced: float) -> None:
        """The flag as a collective returned it (a sum, mean or max over ranks): non-zero means some rank
        was asked to stop. Every rank sees the same value, so every rank decides the same."""
        if reduced > 0:
            self.agreed = True

    def stop_now(self, world_size: int) -> bool:
        """Stop after this step? One process: its own request. Under DDP: only an agreed one (a request
        that has not reached the others yet waits for the next collective)."""
        return self.requested is not None if world_size <= 1 else self.agreed

    def reason(self) -> str | None:
        """What stopped the run, for its checkpoint and summary."""
        return self.requested or ("a signal to another rank" if self.agreed else None)

    def seconds_since(self) -> float | None:
        return None if self.at is None else time.monotonic() - self.at


_ACTIVE: list[StopSignals] = []   # installed in this process, innermost last


def _after_fork_in_child() -> None:
    while _ACTIVE:
        _ACTIVE.pop()._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _say(text: str) -> None:
    """Straight to stderr: a handler must not re-enter Python's buffered stream it may have interrupted."""
    with contextlib.suppress(OSError):
        os.write(2, f"fastfeed: {text}".encode())


def leave_to_parent() -> None:
    """In a worker process: ignore the stop signals; the process that started it decides and closes it."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


class SaveTimer:
    """`--save-every-min N`: `due()` once N minutes have passed since the last save (or the start)."""

    def __init__(self, minutes: float | None):
        self.every = None if not minutes else float(minutes) * 60.0
        self.last = time.monotonic()

    def due(self) -> bool:
        return self.every is not None and time.monotonic() - self.last >= self.every

    def saved(self) -> None:
        self.last = time.monotonic()
