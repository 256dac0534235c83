"""The shard cache's lock files: opening one (in a cache whose store folder was removed under it, or on a read-only
disk), whether one is held, the exclusive flock an evictor takes, and the download log."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from pathlib import Path

READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


@contextlib.contextmanager
def flocked(path: Path, how: int):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, how)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield fd
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def open_lock(path: Path, remake) -> int:
    """An fd of the lock file `path`, created if missing. When the store's folder is gone (`fastfeed cache clear
    --shards --force` ran while this process read), `remake()` makes it again first. Where the cache cannot be
    written (a read-only disk): the existing file opened read-only (an flock needs no write access), or -1 where
    there is none (nobody can evict from a read-only cache). Other errors are raised."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        remake()
        return os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno not in READ_ONLY:
            raise
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def held(path: Path, how: int, remake=lambda: None) -> bool:
    """Whether a process (this one included) holds a lock on the lock file `path` that taking `how` (LOCK_SH,
    LOCK_EX) would wait for: tried without waiting, let go at once (a taker in that instant finds it held). A lock
    file that cannot be opened (a read-only cache without it) is held by nobody."""
    try:
        fd = open_lock(path, remake)
    except OSError:
        return False
    if fd < 0:
        return False
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def evict(path: Path) -> bool:
    """Delete a complete shard nobody maps (its lock taken exclusively, without waiting)."""
    try:
        with flocked(path.with_name(path.name + ".lock"), fcntl.LOCK_EX | fcntl.LOCK_NB):
            path.unlink(missing_ok=True)
            return True
    except BlockingIOError:
        return False


def log_line(store_dir: Path, record: dict) -> None:
    """Append one line to the store's download log (nothing when the cache cannot be written)."""
    with contextlib.suppress(OSError):
        fd = os.open(store_dir / "fetched.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)


def fetched_in(store_dir: Path) -> list[dict]:
    """The downloads logged in one store's part of the cache, oldest first."""
    try:
        return [json.loads(line) for line in (store_dir / "fetched.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []
