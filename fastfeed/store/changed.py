"""A store changed on disk under its readers (a shard truncated or overwritten in place): naming the shard.

A shard is memory-mapped; once it shrinks, touching a lost page is a SIGBUS (a bus error, no message).
`Store.record` compares the mapped file's size before each read (`under_reader` words the error); a
change that lands in the middle of a read is named by the SIGBUS handler here, and a worker that dies of
SIGBUS by its parent (`store_changed_reason`, from the Stores this process knows).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import weakref

# Every Store of this process (opened here or unpickled into a worker), to name a shard that changed on disk
# when a read faults (the shard's map shrank: SIGBUS) in this process or in a worker it started.
_STORES: weakref.WeakSet = weakref.WeakSet()


def register(store) -> None:
    _STORES.add(store)


def changed_shards() -> list[str]:
    """Shards of this process's Stores whose file is not (or no longer) the size their manifest gives."""
    found, seen = [], set()
    for store in list(_STORES):
        for s in store.shards:
            file = store.path / s.file
            if file in seen:
                continue
            seen.add(file)
            try:
                size = os.stat(file).st_size
            except OSError:
                found.append(f"shard {file} is gone")
                continue
            if size != s.bytes:
                found.append(f"shard {file} is now {size} bytes, {s.bytes} when packed")
    return found


def store_changed_reason() -> str:
    """Why a read of memory-mapped data faulted (SIGBUS), naming the shards that changed when any did."""
    changed = changed_shards()
    if not changed:
        return ("a memory-mapped file shrank under it: was a store shard or the shm cache truncated or overwritten "
                "while in use?")
    return under_reader(changed)


def under_reader(changed: list[str]) -> str:
    return (f"the store changed under the reader: {'; '.join(changed)}. A store must not be modified while it is "
            "read (truncated, copied over, re-packed in place): restore it, or pack into a new folder, and restart")


_BUS_HANDLER = None   # the installed callback (kept alive) and the handler it chains to
_BUS_PID = None


def watch_for_bus_errors() -> None:
    """Once per process: on SIGBUS, print which shard changed before dying as before.

    A shard truncated under its map faults the reading thread (SIGBUS, a bus error with no message). Most
    changes are caught at the next `record()` (StoreChanged); this names the one that lands mid-read. The
    handler only writes a line, puts the previous handler back (SIG_DFL, or faulthandler's traceback) and
    raises the signal again, so the process ends the way it would have."""
    global _BUS_HANDLER, _BUS_PID
    if _BUS_PID is not None or not sys.platform.startswith("linux"):
        return
    _BUS_PID = os.getpid()   # inherited through fork: the handler stays installed in children
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    except (OSError, AttributeError):
        return
    previous = []

    def on_bus(signum):
        libc.signal(signal.SIGBUS, previous[0] if previous else None)
        try:
            os.write(2, f"fastfeed: bus error in pid {os.getpid()} reading a memory map: "
                        f"{store_changed_reason()}\n".encode(errors="replace"))
        except BaseException:  # noqa: BLE001 - nothing may escape a signal handler
            pass
        # Pending until this returns (a handled signal is blocked meanwhile), then the previous handler's: so a
        # SIGBUS sent with kill() ends the process too, not only a fault that repeats.
        signal.pthread_kill(threading.get_ident(), signal.SIGBUS)

    cb = ctypes.CFUNCTYPE(None, ctypes.c_int)(on_bus)
    prev = libc.signal(signal.SIGBUS, ctypes.cast(cb, ctypes.c_void_p))
    if prev == ctypes.c_void_p(-1).value:   # SIG_ERR
        return
    previous.append(prev)
    _BUS_HANDLER = cb
