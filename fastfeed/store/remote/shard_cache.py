"""The node-local shard cache: shards of stores in object storage, downloaded once per node and shared by every
rank and worker on it, within a size limit. Its files, the one-download-per-shard rule, the checks on a download and
the eviction rule are written once, in docs/format.md ("The shard cache"); room and eviction are `room.py`."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import format as fmt
from ..urls import shown
from . import room
from .errors import CacheFull, CacheReadOnly, ShardDamaged
from .locks import fetched_in, flocked, held, log_line, open_lock
from .pins import pins_of
from .sizes import CACHE_ENV, STORE_PREFIX

log = logging.getLogger(__name__)

WAIT_S = 600.0                # how long a read waits for room in a full cache before giving up


@dataclass
class ShardCache:
    """One store's part of the node's shard cache (picklable: it travels into worker processes)."""

    root: Path
    limit: int
    url: str
    wait_s: float = WAIT_S
    _pinned: tuple = field(default=(None, frozenset()), repr=False, compare=False)

    def __post_init__(self):
        self.root = Path(self.root)
        self.key = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.dir = self.root / f"{STORE_PREFIX}{self.key}"
        self.pins_dir = self.dir / "pins"

    def prepare(self) -> None:
        try:
            self.pins_dir.mkdir(parents=True, exist_ok=True)
            meta = self.dir / "store.json"
            if not meta.exists():
                tmp = meta.with_name(f"store.json.tmp-{os.getpid()}")
                tmp.write_text(json.dumps({"url": shown(self.url)}) + "\n")
                os.replace(tmp, meta)
        except OSError as e:
            raise CacheFull(f"cannot use the shard cache {self.root} ({e.strerror}): point {CACHE_ENV} (or "
                            "Store(url, shard_cache=...)) at a writable local disk") from None

    def file(self, info: fmt.ShardInfo) -> Path:
        return self.dir / info.file

    def present(self, info: fmt.ShardInfo) -> bool:
        try:
            return os.stat(self.file(info)).st_size == info.bytes
        except FileNotFoundError:
            return False

    # --- in use ---------------------------------------------------------------------------------------------
    def use(self, info: fmt.ShardInfo) -> int:
        """Mark the shard in use by this process (a shared flock, held until `unuse`); returns its fd."""
        fd = open_lock(self.dir / f"{info.file}.lock", self.prepare)
        if fd >= 0:   # -1: a read-only cache without the lock file (nobody can evict there)
            fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    def identity(self, info: fmt.ShardInfo) -> tuple[int, int] | None:
        """(device, inode) of the cached copy, None when absent: which copy a process maps."""
        try:
            st = os.stat(self.file(info))
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    @staticmethod
    def unuse(fd: int) -> None:
        if fd < 0:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def touch(self, info: fmt.ShardInfo) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.file(info))   # recently used: evicted last

    # --- pins -----------------------------------------------------------------------------------------------
    def pinned(self) -> frozenset:
        """Shard file names some live process's order needs now or next (re-read when a pin file changes)."""
        try:
            stamp = os.stat(self.pins_dir).st_mtime_ns
        except FileNotFoundError:
            return frozenset()
        if self._pinned[0] != stamp:
            self._pinned = (stamp, pins_of(self.dir))
        return self._pinned[1]

    # --- downloads ------------------------------------------------------------------------------------------
    def claim(self, info: fmt.ShardInfo, where: str, wait: bool = False) -> int | None:
        """The shard's download lock taken (an fd): waiting out another process's download with `wait`, else None
        when another holds it. A read-ahead claims what a read is about to wait for (`fetch(held=...)` downloads
        it), so that the read waits for that download instead of racing it with one of its own."""
        lock = open_lock(self.dir / f"{info.file}.dl", self.prepare)
        if lock < 0 or not os.access(self.dir, os.W_OK):
            if lock >= 0:
                os.close(lock)
            raise CacheReadOnly(f"the shard cache {self.root} is read-only (it cannot be written here) and lacks shard "
                                f"{where}: point {CACHE_ENV} (or --shard-cache, Store(url, shard_cache=...)) at a "
                                "writable local disk, or fill this cache where it is writable first")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(lock)
            return None
        return lock

    def downloading(self, info: fmt.ShardInfo) -> bool:
        """Whether a process (this one included) is downloading the shard (holds its download lock)."""
        return held(self.dir / f"{info.file}.dl", fcntl.LOCK_SH, self.prepare)

    def fetch(self, info: fmt.ShardInfo, get: Callable[[int], None], where: str, *, wait: bool,
              stale: tuple | None = None, held: int | None = None) -> bool:
        """Make the shard present: download it with `get(fd)` unless it is there. `wait` (a read that needs it
        now): wait for another process's download, for room, and evict pinned shards nobody maps if needed.
        Without (a read-ahead): False when another process is downloading it or there is no room now. `stale`: the
        identity (`identity()`) of a cached copy not to trust (damaged, or `verify` checking the bucket): it is
        downloaded again and replaced (processes mapping it keep their map), unless another process has
        replaced it already. `held`: the download lock, already taken (`claim`); released here."""
        def usable() -> bool:
            return self.present(info) and (stale is None or self.identity(info) != stale)

        if held is None and usable():
            return True
        lock = held if held is not None else self.claim(info, where, wait)
        if lock is None:
            return False
        try:
            for attempt in (1, 2):
                if usable():
                    return True
                part = self.dir / f"{info.file}.part-{os.getpid()}.{threading.get_native_id()}"   # per thread
                fd = room.reserve(self, info, part, urgent=wait)
                if fd is None:
                    return False
                t0 = time.monotonic()
                try:
                    try:
                        get(fd)
                    finally:
                        os.close(fd)
                    size = os.stat(part).st_size
                    digest = fmt.sha256_file(part) if info.sha256 else None
                    if size == info.bytes and digest == info.sha256:
                        # under the space lock, as room's scans run: a scan beside the rename could count the shard
                        # twice (one needless eviction) or not at all (one shard over the limit)
                        with flocked(self.root / ".space.lock", fcntl.LOCK_EX):
                            os.rename(part, self.file(info))   # over a stale copy: its mappers keep their map
                except FileNotFoundError:   # `fastfeed cache clear --force` removed the store's folder meanwhile
                    raise CacheFull(f"the shard cache {self.root} was cleared (fastfeed cache clear --force) while "
                                    f"shard {where} was downloading into it: read it again") from None
                except BaseException:
                    part.unlink(missing_ok=True)
                    raise
                if size == info.bytes and digest == info.sha256:
                    log_line(self.dir, {"shard": info.file, "bytes": info.bytes, "pid": os.getpid(), "attempt": attempt,
                                        "seconds": round(time.monotonic() - t0, 3), "time": round(time.time(), 3)})
                    return True
                part.unlink(missing_ok=True)
                why = (f"{size} bytes, the manifest says {info.bytes}" if size != info.bytes else
                       f"sha256 {digest[:16]}..., the manifest says {info.sha256[:16]}...")
                log.warning("shard %s downloaded damaged (%s); downloading it again", where, why)
            raise ShardDamaged(f"the bucket's copy of shard {where} is damaged: downloaded twice, both times {why}, "
                               "not what the manifest says. Restore the object, or re-pack the store (fastfeed pack "
                               "--force)")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)

    def fetched(self) -> list[dict]:
        """Every completed download into this store's cache, oldest first."""
        return fetched_in(self.dir)
