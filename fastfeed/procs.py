"""Starting worker processes: fork with OpenCV's thread pool parked (spawn where fork does not exist), children
that die with their parent, and lock fds kept out of them (docs/design.md, "Fork, with OpenCV's thread pool
parked" and "Workers die with their parent"). The parent gets its OpenCV threads back after the fork.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass

WATCH_S = 0.5          # how often a watchdog looks for its parent
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_ONLY: set[int] = set()
_PARENT_ONLY_LOCK = threading.Lock()


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask; a container's CPU set), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def alive(pid: int | None, started: float | None = None) -> bool:
    """Whether `pid` runs on this machine (not for None or a zombie) and, given `started` (its start time), is
    still the process that started then (not a reused pid)."""
    import psutil

    if pid is None or pid <= 0:
        return False
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and (started is None or abs(p.create_time() - started) < 0.5)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:   # someone else's process
        return True


@contextmanager
def parent_only(fd: int):
    """While inside, children started by `worker_context()` close their inherited copy of `fd` (a lock's)."""
    with _PARENT_ONLY_LOCK:
        _PARENT_ONLY.add(fd)
    try:
        yield fd
    finally:
        with _PARENT_ONLY_LOCK:
            _PARENT_ONLY.discard(fd)


@dataclass(frozen=True)
class _Guard:
    """What a child needs to die with its parent (picklable: spawn sends it)."""

    parent: int
    death_signal: bool      # the starter is its process's main thread: PR_SET_PDEATHSIG follows it
    close_fds: tuple = ()   # fork only: fds the child must not hold


def _guard_child(g: _Guard) -> None:
    """Run first in every child: drop the parent's locks, then arrange to die with the parent."""
    for fd in g.close_fds:
        with suppress(OSError):
            os.close(fd)
    armed = g.death_signal and _set_death_signal()
    if os.getppid() != g.parent:   # the parent died before the signal was armed
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch, args=(g.parent,), name="fastfeed-parent-watch", daemon=True).start()


def libc(name: str):
    """The C library's function `name` (errno kept for ctypes.get_errno) on Linux, else None (another system, or a
    libc without it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None


def _set_death_signal() -> bool:
    prctl = libc("prctl")
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    os._exit(1)   # the parent is gone: nobody will read what this process makes


def _run_guarded(g: _Guard, target, args, kwargs):
    _guard_child(g)
    return target(*args, **kwargs)


def _init_guarded(g: _Guard, initializer, initargs) -> None:
    _guard_child(g)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C (to the whole group) is the parent's: it ends the pool
    if initializer is not None:
        initializer(*initargs)


class GuardedContext:
    """A multiprocessing context whose `Process` and `Pool` children die with this process; everything
    else (queues, values, events) is the context's own."""

    def __init__(self, ctx, guard: _Guard):
        self._ctx, self._guard = ctx, guard

    def Process(self, target, args=(), kwargs=None, **kw):
        return self._ctx.Process(target=_run_guarded, args=(self._guard, target, tuple(args), dict(kwargs or {})), **kw)

    def Pool(self, processes=None, initializer=None, initargs=(), **kw):
        """The pool; a Ctrl-C while it forks its workers is handled once they are up: raised inside a fork's own
        handlers (logging's), it left logging's lock held and the process hung at its next log line."""
        got, main = [], threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, lambda *_: got.append(1)) if main else None
        try:
            pool = self._ctx.Pool(processes, _init_guarded, (self._guard, initializer, tuple(initargs)), **kw)
        finally:
            if main:
                signal.signal(signal.SIGINT, old)
        try:
            if got:   # to the handler restored (Python's own raises KeyboardInterrupt; one ignoring it, nothing)
                signal.raise_signal(signal.SIGINT)
        except BaseException:
            pool.terminate()
            raise
        return pool

    def __getattr__(self, name):
        return getattr(self._ctx, name)


@contextmanager
def worker_context(method: str | None = None):
    """Yield a multiprocessing context (a `GuardedContext`: fork where it exists, else spawn, or `method`);
    start every process inside the `with` block."""
    main = threading.current_thread() is threading.main_thread()
    if method is None:
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    if method != "fork":   # a fresh interpreter inherits no fds and no OpenCV pool
        yield GuardedContext(mp.get_context(method), _Guard(os.getpid(), main))
        return
    import cv2

    with _PARENT_ONLY_LOCK:
        close = tuple(sorted(_PARENT_ONLY))
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield GuardedContext(mp.get_context("fork"), _Guard(os.getpid(), main, close))
    finally:
        cv2.setNumThreads(threads)
