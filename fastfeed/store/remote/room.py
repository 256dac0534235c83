"""The shard cache's limit: room for a download is made by evicting, least recently used first, complete shards no
process maps (their lock is free) and no live process pins; a read that needs a shard now may also evict a pinned
one nobody maps, a read-ahead never does. The room is reserved at the shard's full size (a full disk fails here,
named), under the cache-wide `.space.lock`."""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path

from .. import format as fmt
from ..publish import alive
from .errors import CacheFull
from .locks import evict, flocked
from .pins import pins_of
from .sizes import CACHE_ENV, DEFAULT_DISK_SHARE, LIMIT_ENV, STORE_PREFIX, existing, gib


def reserve(cache, info: fmt.ShardInfo, part: Path, urgent: bool) -> int | None:
    """Evict until the shard fits under the limit, then create `part` at its full size (an fd), or None
    (not urgent, no room now). Raises CacheFull when it never fits or no room comes within wait_s."""
    if info.bytes > cache.limit:
        raise CacheFull(f"shard {info.file} is {gib(info.bytes)}, more than the whole shard cache limit "
                        f"({gib(cache.limit)}, {cache.root}): raise the limit (--shard-cache-limit, {LIMIT_ENV} "
                        "or Store(url, shard_cache_limit=...)) or re-pack with a smaller --shard-mb")
    deadline = time.monotonic() + cache.wait_s
    while True:
        with flocked(cache.root / ".space.lock", fcntl.LOCK_EX):
            if _make_room(cache, info.bytes, urgent):
                fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                try:
                    os.posix_fallocate(fd, 0, max(info.bytes, 1))
                except OSError as e:
                    os.close(fd)
                    part.unlink(missing_ok=True)
                    free = shutil.disk_usage(cache.root).free
                    raise CacheFull(f"the shard cache's disk is full ({cache.root}: {gib(free)} free, shard "
                                    f"{info.file} needs {gib(info.bytes)}; {e.strerror}): free space there, "
                                    f"point {CACHE_ENV} at a larger local disk, or lower the shard cache limit "
                                    f"({LIMIT_ENV}) below what the disk holds") from None
                return fd
        if not urgent:
            return None
        if time.monotonic() > deadline:
            raise CacheFull(_full_message(cache, info))
        time.sleep(0.25)


def _make_room(cache, need: int, urgent: bool) -> bool:
    used, shards = scan(cache.root)
    if used + need <= cache.limit:
        return True
    pinned = {d: pins_of(d) for d in {s[2] for s in shards}}
    tiers = [[s for s in shards if s[3].name not in pinned[s[2]]]]
    if urgent:
        tiers.append([s for s in shards if s[3].name in pinned[s[2]]])
    for tier in tiers:
        for _, size, _, path in sorted(tier):   # least recently used first
            if evict(path):
                used -= size
                if used + need <= cache.limit:
                    return True
    return False


def scan(root: Path) -> tuple[int, list]:
    """(bytes held, [(mtime, size, store dir, path)] of complete shards); leftovers of dead downloads go."""
    used, shards = 0, []
    for d in root.glob(f"{STORE_PREFIX}*"):
        for f in d.iterdir():
            if not f.name.endswith(".mdb") and ".mdb.part-" not in f.name:
                continue   # a shard's .lock and .dl, the pins, the log: no stat (this runs once per download)
            try:
                st = f.stat()
            except FileNotFoundError:
                continue
            if ".mdb.part-" not in f.name:   # a shard
                shards.append((st.st_mtime_ns, st.st_size, d, f))
            elif (pid := f.name.rsplit(".part-", 1)[1].split(".")[0]).isdigit() and not alive(int(pid)):
                f.unlink(missing_ok=True)   # a dead download's part
                continue
            used += st.st_size
    return used, shards


def _full_message(cache, info: fmt.ShardInfo) -> str:
    used, _ = scan(cache.root)
    pids = sorted({f.name.split("-", 1)[0] for d in cache.root.glob(f"{STORE_PREFIX}*")
                   for f in (d / "pins").glob("*.json")})
    return (f"the shard cache {cache.root} has no room for shard {info.file} ({gib(info.bytes)}): {gib(used)} of "
            f"its {gib(cache.limit)} limit is held by shards in use or needed now or next"
            + (f" (pinned by pid {', '.join(pids)})" if pids else "")
            + f". Raise the limit (--shard-cache-limit, {LIMIT_ENV} or Store(url, shard_cache_limit=...)), run fewer ranks or workers "
              "per node, or re-pack with a smaller --shard-mb")


def default_limit(root: Path) -> int:
    """DEFAULT_DISK_SHARE of what the disk could give the cache (the limit when none is given)."""
    held = cache_bytes(root) if Path(root).is_dir() else 0
    return int((shutil.disk_usage(existing(root)).free + held) * DEFAULT_DISK_SHARE)


def cache_bytes(root: Path) -> int:
    """Bytes the cache at `root` holds on disk: complete shards and reserved downloads (room's one walk of it)."""
    return scan(Path(root))[0]
