"""Who may touch a slab: an flock on a small file next to it, which also lists its users.

`<slab>.users` is both the lock (`fcntl.flock`, released by the kernel when its holder dies, so a
crash never leaves it held) and the reference count: one line per attach, `pid start_time`, plus
`keep` when some user asked to leave the slab for the next run. Pids are checked together with
their start time, so a dead user is pruned even when its pid was reused.

The file is deleted (under the lock) together with the slab. A waiter may then hold a lock on the
deleted file; `locked()` therefore checks, after locking, that the path still names the file it
locked, and starts again otherwise.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..procs import alive, parent_only

_POLL = 0.05


class CacheError(RuntimeError):
    """The shared cache cannot be used as asked; the message says why and what to do."""


def start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


@dataclass
class Users:
    entries: list[tuple[int, float]] = field(default_factory=list)   # (pid, start time), one per attach
    keep: bool = False

    @property
    def pids(self) -> list[int]:
        return sorted({pid for pid, _ in self.entries})

    def add(self, pid: int) -> None:
        self.entries.append((pid, start_time(pid) or 0.0))

    def remove(self, pid: int) -> None:
        """Drop one attach of `pid`."""
        pids = [p for p, _ in self.entries]
        if pid in pids:
            del self.entries[pids.index(pid)]

    def prune(self) -> None:
        """Drop the users that are no longer running."""
        dead = {p for p, t in self.entries if not alive(p, t or None)}
        self.entries = [(p, t) for p, t in self.entries if p not in dead]


def parse(text: str) -> Users:
    users = Users()
    for line in text.splitlines():
        parts = line.split()
        if parts == ["keep"]:
            users.keep = True
        elif len(parts) == 2 and parts[0].isdigit():
            with suppress(ValueError):
                users.entries.append((int(parts[0]), float(parts[1])))
    return users


def read(fd: int) -> Users:
    """The users recorded in the (locked) file, dead ones pruned."""
    size = os.fstat(fd).st_size
    users = parse(os.pread(fd, size, 0).decode("ascii", "replace")) if size else Users()
    users.prune()
    return users


def read_path(path: Path) -> Users:
    """A lock-free snapshot (for `fastfeed cache ls`), dead users pruned."""
    try:
        users = parse(path.read_text("ascii", "replace"))
    except FileNotFoundError:
        return Users()
    users.prune()
    return users


def write(fd: int, users: Users) -> None:
    text = "# fastfeed shm cache users: pid start_time\n" + ("keep\n" if users.keep else "")
    text += "".join(f"{p} {t:.3f}\n" for p, t in users.entries)
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode("ascii"), 0)


def lock_holder(fd: int) -> int | None:
    """The pid holding an flock on the file of `fd`, from /proc/locks (Linux), else None."""
    st = os.fstat(fd)
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and "->" not in parts:
            dev_ino = parts[5].split(":")
            if len(dev_ino) == 3 and dev_ino[2].isdigit() and int(dev_ino[2]) == st.st_ino:
                try:
                    return int(parts[4])
                except ValueError:
                    return None
    return None


@contextmanager
def locked(path: Path, timeout: float, busy: Callable[[int | None], str] | None = None,
           on_wait: Callable[[int | None], None] | None = None) -> Iterator[int]:
    """Hold the exclusive lock on `path` (created if missing); yields its fd.

    Waits up to `timeout` seconds; then raises CacheError with `busy(holder pid)` as the reason.
    `on_wait(holder pid)` is called once when the lock is found busy.
    """
    deadline = time.monotonic() + timeout
    waited = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            expired = time.monotonic() > deadline
            holder = lock_holder(fd) if expired or not waited else None
            os.close(fd)
            if not waited and on_wait is not None:
                on_wait(holder)
            waited = True
            if expired:
                raise CacheError(busy(holder) if busy else f"pid {holder} holds the lock {path}") from None
            time.sleep(_POLL)
            continue
        with suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)   # the file was removed (with its slab) while we waited: lock the new one
    try:
        with parent_only(fd):   # workers started meanwhile (the build's) never keep the lock
            yield fd
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
