"""A store changed on disk under its readers (a shard truncated or overwritten in place): naming the shard
(docs/design.md, "A store changed under its readers is named"). `under_reader` words `Store.record`'s error; the
SIGBUS handler here names a change in the middle of a read, and `store_changed_reason` a worker's SIGBUS death.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import weakref

from ..procs import libc

# Every Store of this process (opened here or unpickled into a worker), to name a shard that changed on disk
# when a read faults (the shard's map shrank: SIGBUS) in this process or in a worker it started.
_STORES: weakref.WeakSet = weakref.WeakSet()


def register(store) -> None:
    _STORES.add(store)


def changed_shards() -> list[str]:
    """Shards of this process's Stores whose file is not (or no longer) the size their manifest gives, and the
    shard files it maps (a local store's or a shard cache's) that are no longer the size they were mapped at."""
    found, seen = [], set()
    for store in list(_STORES):
        cache = getattr(store, "cache", None)   # a store at a URL: its shards are the copies in the shard cache
        for s in store.shards:
            file = str(store.path / s.file if cache is None else cache.file(s))
            if file in seen:
                continue
            seen.add(file)
            try:
                size = os.stat(file).st_size
            except OSError:
                if cache is None:   # a cached copy may be absent: not downloaded yet, or evicted
                    found.append(f"shard {file} is gone")
                continue
            if size != s.bytes:
                found.append(resized(file, size, s.bytes))
    handles = sys.modules.get(f"{__package__}.handles")   # no import in a signal handler
    return found + [resized(*c) for c in (handles.mapped_changes() if handles else ()) if c[0] not in seen]


def resized(file, size: int, packed: int) -> str:   # the one wording of a shard's size changed since its pack
    return f"shard {file} is now {size} bytes, {packed} when packed"


def store_changed_reason() -> str:
    """Why a read of memory-mapped data faulted (SIGBUS), naming the shards that changed when any did."""
    if changed := changed_shards():
        return under_reader(changed)
    return ("a memory-mapped file shrank under it: was a store shard or the shm cache truncated or overwritten "
            "while in use?")


def under_reader(changed: list[str]) -> str:
    return (f"the store changed under the reader: {'; '.join(changed)}. A store must not be modified while it is "
            "read (truncated, copied over, re-packed in place): restore it, or pack into a new folder, and restart")


_BUS_HANDLER = None   # the installed callback (kept alive)
_BUS_PREVIOUS: list = []   # the handler it chains to
_BUS_PID = None


def watch_for_bus_errors() -> None:
    """Once per process: on SIGBUS (a change that lands mid-read, see above), print which shard changed before
    dying as before. The handler only writes a line, puts the previous handler back (SIG_DFL, or faulthandler's
    traceback) and raises the signal again, so the process ends the way it would have.

    Checked in every process that maps a shard, not only once: a forked child inherits the handler, but what runs in it
    may have put its own in place since (a torch DataLoader worker installs one that blames shared memory, and
    faulthandler's), so a child whose handler is no longer ours installs it again, chaining to that one."""
    global _BUS_HANDLER, _BUS_PID
    if _BUS_PID == os.getpid():
        return
    _BUS_PID = os.getpid()
    if (set_handler := libc("signal")) is None:   # not Linux
        return
    set_handler.restype, set_handler.argtypes = ctypes.c_void_p, (ctypes.c_int, ctypes.c_void_p)
    if _BUS_HANDLER is None:
        def on_bus(signum):
            set_handler(signal.SIGBUS, _BUS_PREVIOUS[0] if _BUS_PREVIOUS else None)
            with contextlib.suppress(BaseException):   # nothing may escape a signal handler
                os.write(2, f"fastfeed: bus error in pid {os.getpid()} reading a memory map: "
                            f"{store_changed_reason()}\n".encode(errors="replace"))
            # Pending until this returns (a handled signal is blocked meanwhile), then the previous handler's: so a
            # SIGBUS sent with kill() ends the process too, not only a fault that repeats.
            signal.pthread_kill(threading.get_ident(), signal.SIGBUS)

        _BUS_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)(on_bus)
    ours = ctypes.cast(_BUS_HANDLER, ctypes.c_void_p).value
    prev = set_handler(signal.SIGBUS, ours)
    if prev == ctypes.c_void_p(-1).value:   # SIG_ERR
        return
    if prev != ours:   # inherited and still in place: keep chaining to what it chained to
        _BUS_PREVIOUS[:] = [prev]
