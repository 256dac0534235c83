"""How a store gets into place: the pack lock beside OUT, the atomic swap of a finished store for the old one, and
`recover`, the clean-up of what an interrupted pack left (the files and steps: docs/format.md's opening section;
why: docs/design.md, "Publishing is one step").
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import time
from glob import escape as glob_escape
from pathlib import Path

from ..procs import alive, libc, parent_only
from . import format as fmt

log = logging.getLogger(__name__)

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_LEFTOVER_KINDS = ("incomplete", "old")
SETTLE_S = 5.0   # how long a lock held by no live pack (a reader tidying up) is waited for


class LockBusy(Exception):
    """The pack lock of a store is held; `pid` is what the holder wrote in it (None: nothing)."""

    def __init__(self, pid: int | None):
        super().__init__(pid)
        self.pid = pid


def temp_dir_for(out: Path) -> Path:
    """A sibling of OUT that can never be mistaken for a store (hidden, and no manifest until the end)."""
    return out.parent / f".{out.name}.incomplete-{os.getpid()}"


def leftovers(out: Path) -> list[Path]:
    """The hidden siblings of OUT that packs write (`.OUT.incomplete-*`, `.OUT.old-*`), oldest name first."""
    out = Path(out)
    return sorted(p for kind in _LEFTOVER_KINDS for p in out.parent.glob(f".{glob_escape(out.name)}.{kind}-*"))


def _is_store(path: Path) -> bool:
    return (path / fmt.MANIFEST).is_file()


def recover(out: Path) -> list[str]:
    """With the lock held: put back a store an interrupted replacement left aside, remove the rest.
    Returns what was done, one line each (for the log)."""
    out = Path(out)
    done = []
    if not os.path.lexists(out) and (olds := [p for p in leftovers(out) if ".old-" in p.name and _is_store(p)]):
        os.rename(olds[-1], out)
        done.append(f"restored {out} from {olds[-1].name}: a pack was killed while replacing it")
    keep_old = not _is_store(out)
    for p in leftovers(out):
        if ".old-" in p.name and keep_old and _is_store(p):   # the only copy of a store: never removed
            done.append(f"kept {p}: it is the store {out} held before an interrupted pack; {out} is not a store")
            continue
        shutil.rmtree(p, ignore_errors=True)
        if not os.path.lexists(p):
            done.append(f"removed {p}, left by an interrupted pack")
    return done


@contextlib.contextmanager
def locked(out: Path, settle_s: float = 0.0, owner: bool = True, wait: bool = False, path: Path | None = None):
    """Hold OUT's pack lock (an exclusive flock on `path`, default `format.pack_lock_path(out)`; a training run's
    `--out` takes OUT/.train.lock), or raise LockBusy: at once
    when the pid in the file is a live process (a pack), after up to `settle_s` otherwise (a reader tidying
    up holds it for a moment, writing no pid). `wait`: block until the holder lets go instead.

    `owner` (a pack): its pid goes into the file. Workers started meanwhile close their copy of the lock (it
    goes with this process, not with its children); the file is removed at the end. OSError when the lock
    file cannot be created."""
    path = path or fmt.pack_lock_path(out)
    deadline = time.monotonic() + settle_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            pid = int(text) if text.isdigit() else None
            if alive(pid) or time.monotonic() > deadline:
                raise LockBusy(pid) from None
            time.sleep(0.05)
            continue
        with contextlib.suppress(FileNotFoundError):   # a pack finishing meanwhile unlinks its lock file
            if os.path.samestat(os.fstat(fd), os.stat(path)):   # the file locked is still the lock file
                break
        os.close(fd)
    try:
        try:
            os.ftruncate(fd, 0)   # a reader leaves it empty: whoever comes meanwhile waits instead of failing
            if owner:   # a full disk refuses even the pid: the file is removed below, not left empty
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            with parent_only(fd):
                yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)  # now, not when a child holding a copy of fd exits
        os.close(fd)


def pack_in_progress(out: Path) -> int | None:
    """The pid of a `fastfeed pack` writing store `out` right now (it holds the lock; -1: pid unknown), else None."""
    try:
        fd = os.open(fmt.pack_lock_path(out), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(pid) if pid.isdigit() else -1
    finally:
        os.close(fd)   # closing drops a lock we got: nobody was packing
    return None


def tidy(out: Path) -> None:
    """For a reader opening OUT: recover what an interrupted pack left (the lock file included), unless a pack
    is running (those files are its own) or the folder cannot be written (then they stay, harmless)."""
    if not leftovers(out) and not fmt.pack_lock_path(out).exists():
        return
    with contextlib.suppress(LockBusy, OSError), locked(out, settle_s=SETTLE_S, owner=False):
        for line in recover(out):
            log.warning("%s", line)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where that does not exist."""
    fn = libc("renameat2")
    if fn is None:   # not Linux, or glibc < 2.28, musl without it
        return False
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):   # not on this file system
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Move the finished store `tmp` into place (the lock held); with `overwrite`, replace OUT in one step
    (see the module's doc) and remove the old store afterwards."""
    if not os.path.lexists(out):
        os.rename(tmp, out)
        return
    if not overwrite:
        raise FileExistsError(out)
    if _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)   # tmp now holds the old store; killed here, `recover` ends it
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
